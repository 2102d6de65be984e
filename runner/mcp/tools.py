"""The tool table: what an MCP client may call, with its schemas, annotations and authority.

Each :class:`Tool` names the library call it makes, a JSON Schema for its
arguments (checked by :func:`check_arguments` before anything runs, so bad
arguments change nothing), the properties of its structured result, and the
authority it needs:

* ``view``: reads only; the only kind a ``--read-only`` server lists.
* ``write``: a fenced write under the lease the server holds for its owner
  (``recover`` takes it; ``lease_renew`` and ``lease_release`` manage it).
* ``control``: what belongs to a person or a supervisor (granting or denying
  an approval, cancelling, breaking a lease); listed only with ``--allow-control``.

Annotations: ``readOnlyHint`` exactly for the views (which are also the idempotent
ones: a write always appends a transition); ``destructiveHint`` for a call that
ends something for good (a permanent step failure, a denial, a cancellation, a
broken lease). The journal itself is append-only, so no tool erases history.

Every structured result has ``ok``, ``reason`` and ``exit_code``: the reason
names and codes of :data:`runner.errors.EXIT_CODES`, as the command line
reports them (``reason`` is null on success; for ``recover`` and ``next`` it is
the decision's stop reason). A refusal is a tool error carrying that reason.

The structured result is exact, for a harness. :func:`text_form` is what a
model that reads only text gets instead of its JSON: the same fields as an
outline, with every value the runner did not write (ids, reasons, receipts,
notes, error messages) quoted by :mod:`runner.quoting`. Only the prose a
decision was built with (``detail``, an action's ``why`` and ``approval``,
the observations, inferences and unknowns of ``recover`` and ``next``) and
the brief are shown as they are: :func:`runner.recovery.decide` and
:func:`runner.views.brief` write them with the same quoting.
"""

import json
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ..approvals import approval_view
from ..errors import EXIT_CODES, InvalidInput
from ..jobs import observe_job
from ..lease import MAX_TTL_SECONDS, lease_view
from .. import quoting
from ..quoting import APPROVAL, CONTRACT, EVIDENCE, ITEMS, MESSAGE, NOTICE, PATH, RECORD, TARGET, WORKER, WORKER_OR_TARGET, WORDS
from ..recovery import decide, decision_exit_code, recover
from ..views import brief, events_after, status_view

__all__ = ["Tool", "TOOLS", "REASONS", "check_arguments", "tool_listing", "summary", "text_form", "outline"]

#: Every reason a result may carry: the command line's, and ``error`` for a failure it cannot classify.
REASONS = sorted(EXIT_CODES) + ["error"]

_ACTIVE_JOBS = ("submitting", "running", "cancel-requested", "vanished")


class Tool(NamedTuple):
    name: str
    title: str
    description: str
    authority: str  # "view", "write" or "control"
    arguments: Dict[str, Any]  # property name -> JSON Schema
    required: List[str]
    results: Dict[str, Any]  # the tool's own result properties -> JSON Schema
    read_only: bool
    destructive: bool
    idempotent: bool
    handler: Callable[[Any, Dict[str, Any]], Dict[str, Any]]


# -- schemas -----------------------------------------------------------------


def _text(description: str, max_length: int = 10_000) -> Dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_length, "description": description}


def _key(description: str) -> Dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$", "description": description}


def _doc(description: str) -> Dict[str, Any]:
    return {"type": "object", "description": description + " (a JSON object of at most 256 KiB)"}


_TTL = {
    "type": "number",
    "exclusiveMinimum": 0,
    "maximum": MAX_TTL_SECONDS,
    "description": "seconds the lease lives (default: the contract's lease ttl)",
}
_OBJ = {"type": "object"}
_NULLABLE_OBJ = {"type": ["object", "null"]}
_STR = {"type": "string"}
_NULLABLE_STR = {"type": ["string", "null"]}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_LIST = {"type": "array"}
_EFFECT = {"effect": {"type": "object", "description": "the effect's ledger record"}, "key": _STR}
_STEP = {"step": _STR, "record": {"type": "object", "description": "the step's record"}, "status": _STR, "next_action": _NULLABLE_OBJ}
_DECISION = {
    "decision": {"type": "string", "enum": ["act", "stop"]},
    "action": _NULLABLE_OBJ,
    "detail": _STR,
    "observations": _LIST,
    "inferences": _LIST,
    "unknowns": _LIST,
    "lease": _OBJ,
}

#: Properties every result has, and those of a refusal.
COMMON = {
    "ok": {"type": "boolean", "description": "true when the call did what it was asked"},
    "reason": {"type": ["string", "null"], "enum": REASONS + [None], "description": "the command line's reason name; null when ok"},
    "exit_code": {"type": "integer", "description": "the command line's exit code for the same outcome"},
    "message": {"type": "string", "description": "why the call was refused"},
    "context": {"type": "object", "description": "machine-readable facts about a refusal"},
    "quarantine": {"type": ["string", "null"], "description": "state-unrecoverable: where the damaged files were moved"},
}


def check_arguments(tool: Tool, arguments: Any) -> Dict[str, Any]:
    """``arguments`` if they match the tool's input schema, else :class:`InvalidInput` naming the first mismatch."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidInput(f"{tool.name}: arguments must be a JSON object")
    unknown = sorted(set(arguments) - set(tool.arguments))
    if unknown:
        raise InvalidInput(f"{tool.name}: unknown argument {unknown[0]!r} (takes {', '.join(sorted(tool.arguments)) or 'none'})")
    for name in tool.required:
        if name not in arguments:
            raise InvalidInput(f"{tool.name}: missing argument {name!r}")
    for name, value in arguments.items():
        problem = _mismatch(tool.arguments[name], value)
        if problem:
            raise InvalidInput(f"{tool.name}: argument {name!r} {problem}")
    return arguments


def _mismatch(schema: Dict[str, Any], value: Any) -> Optional[str]:
    """What is wrong with ``value`` under the subset of JSON Schema the table uses, or None."""
    import re

    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"),
        "boolean": lambda v: isinstance(v, bool),
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "null": lambda v: v is None,
    }
    if kind is not None and not any(checks[k](value) for k in kinds):
        return f"must be {' or '.join(kinds)}, not {type(value).__name__ if value is not None else 'null'}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {', '.join(map(str, schema['enum']))}"
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            return "must not be empty"
        if len(value) > schema.get("maxLength", len(value)):
            return f"is longer than {schema['maxLength']} characters"
        if "pattern" in schema and not re.match(schema["pattern"], value):
            return f"must match {schema['pattern']}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"must be at least {schema['minimum']}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"must be greater than {schema['exclusiveMinimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"must be at most {schema['maximum']}"
    return None


def tool_listing(tool: Tool) -> Dict[str, Any]:
    """The tool as ``tools/list`` shows it: schemas and truthful annotations."""
    return {
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": {"type": "object", "properties": tool.arguments, "required": tool.required, "additionalProperties": False},
        "outputSchema": {"type": "object", "properties": {**COMMON, **tool.results}, "required": ["ok", "reason", "exit_code"]},
        "annotations": {
            "title": tool.title,
            "readOnlyHint": tool.read_only,
            "destructiveHint": tool.destructive,
            "idempotentHint": tool.idempotent,
            # Every tool acts on the run's own store, never on the world outside it.
            "openWorldHint": False,
        },
    }


# -- handlers: each gets the session (see runner.mcp.server.Session) and checked arguments ----------


def summary(run: Any) -> Dict[str, Any]:
    """The run at a glance, as ``status --json`` reports it, with what ``next`` decides now from the holder's side."""
    lease = run.state["lease"]
    return status_view(run.state, decide(run.state, run.clock(), lease.get("owner"), lease.get("epoch"), _observed_jobs(run)))


def _observed_jobs(run: Any) -> Dict[str, Dict[str, Any]]:
    return {k: observe_job(run.store.path, j) for k, j in run.state["jobs"].items() if j["state"] in _ACTIVE_JOBS}


def _decision(decision: Dict[str, Any], run: Any) -> Dict[str, Any]:
    # A decision is an answer, not a refusal: a stop is reported with its reason, and ok stays true.
    out = dict(decision)
    out["lease"] = dict(run.state["lease"])
    out["exit_code"] = decision_exit_code(decision)
    return out


def _recover(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.open_run()
    decision = recover(run, session.owner, args.get("ttl") or session.default_ttl(run))
    session.took_lease(run, args.get("ttl"))
    return _decision(decision, run)


def _next(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.open_run()
    decision = decide(run.state, run.clock(), session.owner, session.epoch, _observed_jobs(run))
    if decision["reason"] == "fenced" and session.epoch is None:
        decision["detail"] += "; this server has taken no lease yet: call recover"
    return _decision(decision, run)


def _brief(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.open_run()
    lease = run.state["lease"]
    decision = decide(run.state, run.clock(), lease["owner"], lease["epoch"], _observed_jobs(run))
    text = brief(run.state, decision, args.get("max_chars", 2000))
    return {"brief": text, "chars": len(text)}


def _status(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return summary(session.open_run())


def _step(name: str) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        run = session.writer()
        step = args["step"]
        if name == "start":
            record = run.step_start(step)
        elif name == "done":
            record = run.step_done(step, args["evidence"])
        else:
            record = run.step_fail(step, args["class"], args["error"])
        return {"step": step, "record": record, "status": run.state["status"], "next_action": run.state["next_action"]}

    return handler


def _effect(name: str) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        key = args["key"]
        if name == "show":
            effect = session.open_run().state["effects"].get(key)
            if effect is None:
                raise InvalidInput(f"no effect {key!r} in the ledger")
            return {"key": key, "effect": effect}
        run = session.writer()
        if name == "begin":
            effect = run.effect_begin(key, args["payload"], step=args.get("step"))
        elif name == "ack":
            effect = run.effect_ack(key, args["receipt"])
        elif name == "verify":
            effect = run.effect_verify(key, args["evidence"], reconciled=args.get("reconciled", False))
        elif name == "absent":
            effect = run.effect_absent(key, args["evidence"], reconciled=args.get("reconciled", False))
        else:
            effect = run.effect_uncertain(key, args["reason"])
        return {"key": key, "effect": effect}

    return handler


def _effect_list(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    wanted = args.get("state")
    limit = args.get("limit", 200)
    items = [(k, e) for k, e in sorted(session.open_run().state["effects"].items()) if wanted in (None, e.get("state"))]
    return {"count": len(items), "effects": dict(items[:limit]), "more": len(items) > limit}


def _approval_request(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.writer()
    rid = run.approval_request(args["step"], args["action"], args["payload"], args["ttl"])
    return {"request_id": rid, "request": run.state["observations"]["approvals"][rid]}


def _approval_list(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.open_run()
    return {"approvals": approval_view(run.state, run.clock())}


def _lease_renew(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return {"lease": session.renew(args.get("ttl"))}


def _lease_release(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return {"lease": session.release()}


def _events(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    batch = events_after(session.open_run().store, args.get("after", 0))
    limit = args.get("limit", 200)
    events = batch["events"]
    batch["events"], batch["more"] = events[:limit], len(events) > limit
    if batch["more"]:
        batch["last"] = events[limit - 1]["seq"]
    return batch


def _approval_answer(grant: bool) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        run = session.open_run()
        answer = run.approval_grant(args["request_id"], args["by"]) if grant else run.approval_deny(args["request_id"], args["by"])
        return {"request_id": args["request_id"], "request": answer}

    return handler


def _cancel(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    state = session.open_run().cancel(args["by"], args["reason"])
    return {"status": state["status"], "cancellation": state["observations"]["cancellation"], "next_action": state["next_action"]}


def _lease_break(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.open_run()
    return {"lease": run.break_lease(args["by"], args["reason"]), "view": lease_view(run.state, run.clock())}


# -- the text a model reads ------------------------------------------------------------

#: Where a field's free text comes from, by the field's name.
_SOURCES = {
    "receipt": TARGET, "evidence": EVIDENCE, "claimed": WORKER, "reason": WORKER_OR_TARGET, "error": WORKER_OR_TARGET,
    "goal": CONTRACT, "action": APPROVAL, "payload_head": APPROVAL, "payload": APPROVAL, "payload_file": PATH,
    "message": MESSAGE, "what": RECORD, "detail": RECORD, "why": RECORD,
}
#: Fields whose value is a document someone else wrote: shown as one quotation, however it is nested.
_DOCUMENTS = ("receipt", "evidence", "claimed", "payload", "observed", "result")
#: Fields holding a word of the runner's vocabulary.
_WORD_FIELDS = ("state", "status", "kind", "decision", "class", "reason")
#: A field name the runner writes: shown plain. Any other key (an id, or a key someone else chose) is shown by quoting.name().
_FIELD = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")
#: Fields that map ids (steps, effect keys, request ids, ...) to records: their keys are always shown by quoting.name().
_MAPS = ("steps", "effects", "jobs", "approvals", "items", "authorization", "cost", "budgets", "counters", "checks", "artifacts")
#: The text form's bound; the structured content always has everything.
TEXT_CHARS = 20_000


def _scalar(key: str, value: Any, source: Optional[str] = None) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if key in _WORD_FIELDS and isinstance(value, str) and value in WORDS:
        return value
    if isinstance(value, str) and source is None and key not in _SOURCES:
        return quoting.name(value, RECORD)
    return quoting.quote(value, source or _SOURCES.get(key, RECORD), 300)


def outline(value: Any, lines: List[str], indent: str = "", key: str = "", rules: Optional[Dict[str, Any]] = None) -> None:
    """Append ``value`` (an object or a list) to ``lines`` as a Markdown outline: fields by name, recorded text quoted.

    Field names the runner writes are shown plain; keys of an id map
    (:data:`_MAPS`) and any unusual key by :func:`runner.quoting.name`. A
    document someone else wrote (a receipt, evidence) is one quotation.

    :param rules: per field name (``"*"`` for a list's items and an id map's values): ``True`` for prose the runner
        wrote with quoting, shown as is; a source label to quote the value with; or the rules of a nested object.
    """
    rules = rules or {}
    items = sorted(value.items(), key=lambda kv: str(kv[0])) if isinstance(value, dict) else list(enumerate(value))
    for k, v in items:
        if isinstance(value, dict):
            plain = bool(isinstance(k, str) and _FIELD.match(k)) and key not in _MAPS
            label = f"- {k if plain else quoting.name(k, RECORD)}: "
            field, rule = (k, rules.get(k)) if plain else ("", rules.get("*"))
        else:
            label, field, rule = "- ", key, rules.get("*")
        if rule is True and isinstance(v, str):
            lines.append(indent + label + v)
        elif isinstance(rule, str):
            simple = v is None or isinstance(v, (bool, int, float)) or v in ([], {})
            lines.append(indent + label + (json.dumps(v) if simple else quoting.quote(v, rule, 300)))
        elif isinstance(v, (dict, list)) and v and field not in _DOCUMENTS and len(indent) < 16:
            lines.append(indent + label.rstrip())
            outline(v, lines, indent + "  ", field, rule if isinstance(rule, dict) else None)
        elif isinstance(v, (dict, list)):
            lines.append(indent + label + (json.dumps(v) if not v else quoting.quote(v, _SOURCES.get(field, RECORD), 300)))
        else:
            lines.append(indent + label + _scalar(field, v))


#: The prose of a decision (``recover``, ``next``) that the runner writes quoted.
_DECISION_PROSE: Dict[str, Any] = {
    "detail": True,
    "action": {"why": True, "approval": True, "artifact": CONTRACT, "check": CONTRACT, "evidence": CONTRACT, "item": ITEMS, "command": CONTRACT},
    "check": {"why": True},
    "inferences": {"*": True},
    "unknowns": {"*": True},
    "observations": {"*": {"source": True, "what": True}},
}


def text_form(tool: str, structured: Dict[str, Any]) -> str:
    """The tool result as a model reads it: a header, the notice, and the fields, recorded text quoted (at most :data:`TEXT_CHARS`)."""
    if structured.get("ok"):
        head = f"Result of {quoting.name(tool)}: ok" + (f", {structured['reason']}" if structured.get("reason") in WORDS else "")
    else:
        head = f"Result of {quoting.name(tool)}: refused, {_scalar('reason', structured.get('reason'))} (exit {_scalar('exit_code', structured.get('exit_code'))})"
    lines = [head, "(The exact result is the structured content; below, the same fields.)", NOTICE]
    rest = dict(structured)
    if tool == "brief" and isinstance(rest.get("brief"), str):
        lines = [head, "", rest.pop("brief"), ""]  # the brief carries the notice itself
    outline(rest, lines, rules=_DECISION_PROSE if tool in ("recover", "next") else None)
    return _bounded(lines)


def _bounded(lines: List[str]) -> str:
    kept, used = [], 0
    for line in lines:
        if used + len(line) + 1 > TEXT_CHARS - 80:
            kept.append("… (cut to fit; the structured content has the whole result)")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)


def status_text(state: Dict[str, Any]) -> str:
    """The ``runner://status`` resource: the status view as an outline, recorded text quoted."""
    lines = [f"# Status of run {quoting.name(state['task_id'])}", "(The exact JSON is the structured result of the `status` tool.)", NOTICE, ""]
    outline(status_view(state), lines)
    return _bounded(lines)


# -- the table ------------------------------------------------------------------------

_KEY = _key("the effect's idempotency key, e.g. doc-000613:ticket")
_STEP_ID = _key("a step id of the run's plan")
_WHO = _key("who answers: the person or supervisor, by name")


def _t(
    name: str,
    title: str,
    description: str,
    authority: str,
    arguments: Dict[str, Any],
    required: List[str],
    results: Dict[str, Any],
    handler: Callable[[Any, Dict[str, Any]], Dict[str, Any]],
    destructive: bool = False,
    idempotent: bool = False,
) -> Tool:
    read_only = authority == "view"
    return Tool(
        name,
        title,
        description,
        authority,
        arguments,
        required,
        results,
        read_only,
        destructive and not read_only,
        idempotent or read_only,
        handler,
    )


TOOLS: List[Tool] = [
    _t(
        "recover",
        "Recover the run",
        "Take the lease for this server's owner (a higher fencing epoch), reconcile, refresh jobs, decide the one safe next action "
        "and persist it. Call it first, and again after any stop. Each call fences the previous epoch.",
        "write",
        {"ttl": _TTL},
        [],
        _DECISION,
        _recover,
    ),
    _t(
        "next",
        "Next safe action",
        "Name exactly one safe next action, or one stop with its reason (awaiting-approval, needs-reconciliation, fenced, complete, ...). Reads only.",
        "view",
        {},
        [],
        _DECISION,
        _next,
    ),
    _t(
        "brief",
        "Brief of the run",
        "A bounded Markdown summary of durable facts, for a fresh model context.",
        "view",
        {"max_chars": {"type": "integer", "minimum": 200, "maximum": 20000, "description": "at most this many characters (default 2000)"}},
        [],
        {"brief": _STR, "chars": _INT},
        _brief,
    ),
    _t(
        "status",
        "Run status",
        "The run's current state: status, steps, effect counts, lease, next action.",
        "view",
        {},
        [],
        {
            "task_id": _STR,
            "status": _STR,
            "revision": _INT,
            "current_step": _NULLABLE_STR,
            "completed_steps": _LIST,
            "steps": _OBJ,
            "effects": _OBJ,
            "lease": _OBJ,
            "next_action": _NULLABLE_OBJ,
            "next": _NULLABLE_OBJ,
        },
        _status,
    ),
    _t("step_start", "Start a step", "Start a step of the plan, in plan order.", "write", {"step": _STEP_ID}, ["step"], _STEP, _step("start")),
    _t(
        "step_done",
        "Finish a step",
        "Finish the running step with the evidence its contract asks for; gated steps need a verified effect.",
        "write",
        {"step": _STEP_ID, "evidence": _doc("the evidence the contract names")},
        ["step", "evidence"],
        _STEP,
        _step("done"),
    ),
    _t(
        "step_fail",
        "Fail a step",
        "Record a failed attempt: transient (retried after a persisted backoff) or permanent (the step is failed for good).",
        "write",
        {"step": _STEP_ID, "class": {"type": "string", "enum": ["transient", "permanent"]}, "error": _text("what went wrong")},
        ["step", "class", "error"],
        _STEP,
        _step("fail"),
        destructive=True,
    ),
    _t(
        "effect_begin",
        "Begin an effect",
        "Record the intent to call the target for KEY with this exact payload, before calling it. Refused when approval, "
        "cancellation, limits or an unresolved earlier attempt forbid it.",
        "write",
        {"key": _KEY, "payload": _doc("the exact payload that will be sent"), "step": _key("the step it belongs to (default: the current step)")},
        ["key", "payload"],
        _EFFECT,
        _effect("begin"),
    ),
    _t(
        "effect_ack",
        "Acknowledge an effect",
        "Record the target's receipt for KEY after the call returned.",
        "write",
        {"key": _KEY, "receipt": _doc("the target's receipt")},
        ["key", "receipt"],
        _EFFECT,
        _effect("ack"),
    ),
    _t(
        "effect_verify",
        "Verify an effect",
        "Record that the target was observed to hold KEY's effect.",
        "write",
        {
            "key": _KEY,
            "evidence": _doc("what the observation found"),
            "reconciled": {"type": "boolean", "description": "the outcome was unknown and settled by observation"},
        },
        ["key", "evidence"],
        _EFFECT,
        _effect("verify"),
    ),
    _t(
        "effect_absent",
        "Record an effect absent",
        "Record that the target was observed not to hold KEY's effect, so it may be sent again.",
        "write",
        {
            "key": _KEY,
            "evidence": _doc("what the observation found"),
            "reconciled": {"type": "boolean", "description": "the outcome was unknown and settled by observation"},
        },
        ["key", "evidence"],
        _EFFECT,
        _effect("absent"),
    ),
    _t(
        "effect_uncertain",
        "Mark an effect uncertain",
        "Record that KEY's outcome is unknown; nothing is retried until it is observed.",
        "write",
        {"key": _KEY, "reason": _text("why the outcome is unknown")},
        ["key", "reason"],
        _EFFECT,
        _effect("uncertain"),
    ),
    _t("effect_show", "Show an effect", "KEY's ledger record.", "view", {"key": _KEY}, ["key"], _EFFECT, _effect("show")),
    _t(
        "effect_list",
        "List effects",
        "The ledger's effects, by key, optionally only those in one state.",
        "view",
        {
            "state": {"type": "string", "enum": ["planned", "started", "acknowledged", "verified", "uncertain", "absent", "failed"]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "description": "at most this many (default 200)"},
        },
        [],
        {"count": _INT, "effects": _OBJ, "more": _BOOL},
        _effect_list,
    ),
    _t(
        "approval_request",
        "Request an approval",
        "Ask a person to approve ACTION (effect:KEY) in STEP for this exact payload; the run then stops at "
        "awaiting-approval until someone outside the run answers.",
        "write",
        {
            "step": _STEP_ID,
            "action": _text("the action to approve, effect:KEY", 300),
            "payload": _doc("the exact payload that will be sent"),
            "ttl": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": MAX_TTL_SECONDS,
                "description": "seconds until the request and its grant expire",
            },
        },
        ["step", "action", "payload", "ttl"],
        {"request_id": _STR, "request": _OBJ},
        _approval_request,
    ),
    _t(
        "approval_list",
        "List approvals",
        "Every approval request with its state (pending, granted, used, denied, expired).",
        "view",
        {},
        [],
        {"approvals": _LIST},
        _approval_list,
    ),
    _t(
        "lease_renew",
        "Renew the lease",
        "Extend the lease this server holds (it also renews while calls arrive).",
        "write",
        {"ttl": _TTL},
        [],
        {"lease": _OBJ},
        _lease_renew,
    ),
    _t(
        "lease_release",
        "Release the lease",
        "Give up the lease this server took; writes need recover again afterwards.",
        "write",
        {},
        [],
        {"lease": _OBJ},
        _lease_release,
    ),
    _t(
        "events",
        "Events",
        "Journal transitions after sequence number AFTER, so an observer resumes where it left off.",
        "view",
        {
            "after": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "at most this many (default 200)"},
        },
        [],
        {"after": _INT, "last": _INT, "oldest": _INT, "truncated": _BOOL, "more": _BOOL, "events": _LIST},
        _events,
    ),
    _t(
        "approval_grant",
        "Grant an approval",
        "Control (a person's authority): grant a pending request, bound to its exact payload.",
        "control",
        {"request_id": _key("the request to answer"), "by": _WHO},
        ["request_id", "by"],
        {"request_id": _STR, "request": _OBJ},
        _approval_answer(True),
    ),
    _t(
        "approval_deny",
        "Deny an approval",
        "Control (a person's authority): deny a pending request.",
        "control",
        {"request_id": _key("the request to answer"), "by": _WHO},
        ["request_id", "by"],
        {"request_id": _STR, "request": _OBJ},
        _approval_answer(False),
        destructive=True,
    ),
    _t(
        "cancel",
        "Cancel the run",
        "Control (a person's authority): no new step or effect begins; in-flight effects are still reconciled.",
        "control",
        {"by": _WHO, "reason": _text("why")},
        ["by", "reason"],
        {"status": _STR, "cancellation": _OBJ, "next_action": _NULLABLE_OBJ},
        _cancel,
        destructive=True,
    ),
    _t(
        "lease_break",
        "Break the lease",
        "Control (a supervisor's authority): end a dead holder's lease now, with the evidence that it ended.",
        "control",
        {"by": _WHO, "reason": _text("the evidence that the holder ended")},
        ["by", "reason"],
        {"lease": _OBJ, "view": _OBJ},
        _lease_break,
        destructive=True,
    ),
]
