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
names and codes of :data:`runner.base.errors.EXIT_CODES`, as the command line
reports them (``reason`` is null on success; for ``recover`` and ``next`` it is
the decision's stop reason). A refusal is a tool error carrying that reason.

The structured result is exact, for a harness. :func:`text_form` is what a
model that reads only text gets instead of its JSON: the same fields as an
outline, with every value the runner did not write (ids, reasons, receipts,
notes, error messages) quoted by :mod:`runner.base.quoting`. Only the prose a
decision was built with (``detail``, an action's ``why`` and ``approval``,
the observations, inferences and unknowns of ``recover`` and ``next``) and
the brief are shown as they are: :func:`runner.execution.recovery.decide` and
:func:`runner.surfaces.views.brief` write them with the same quoting.
"""

import json
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ...base import quoting
from .. import verbs
from ...ledger.batch import ITEM_STATES
from ...ledger.states import EFFECT_STATES
from ...base.errors import EXIT_CODES, InvalidInput
from ...contract.text import MAX_TTL_SECONDS
from ...base.quoting import (APPROVAL, CONTRACT, EVIDENCE, ITEMS, MESSAGE, NOTICE, PATH, RECORD, TARGET, WORKER,
                             WORKER_OR_TARGET, WORDS)
from ..views import status_view

__all__ = ["Tool", "TOOLS", "REASONS", "check_arguments", "tool_listing", "summary", "text_form", "outline",
           "in_tool_words"]

#: Every reason a result may carry: the command line's, and ``error`` for a failure it cannot classify.
REASONS = sorted(EXIT_CODES) + ["error"]


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
    return {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$",
            "description": description}


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
_STEP = {"step": _STR, "record": {"type": "object", "description": "the step's record"}, "status": _STR,
         "recorded_intent": _NULLABLE_OBJ,
         "next": {"type": "object", "description": "what next decides now, from the lease holder's side"}}
_DECISION = {
    "decision": {"type": "string", "enum": ["act", "stop"]},
    "action": _NULLABLE_OBJ,
    "stop_code": {"type": "string", "description": "a stop's code: its reason, and its case where it has several"},
    "sentence": {"type": "string", "description": "a stop's sentence: what it means, what says so, what moves it on"},
    "detail": _STR,
    "observations": _LIST,
    "inferences": _LIST,
    "unknowns": _LIST,
    "lease": _OBJ,
}

#: Properties every result has, and those of a refusal.
COMMON = {
    "ok": {"type": "boolean", "description": "true when the call did what it was asked"},
    "reason": {"type": ["string", "null"], "enum": REASONS + [None],
               "description": "the command line's reason name; null when ok"},
    "exit_code": {"type": "integer", "description": "the command line's exit code for the same outcome"},
    "message": {"type": "string", "description": "why the call was refused"},
    "context": {"type": "object", "description": "machine-readable facts about a refusal"},
    "quarantine": {"type": ["string", "null"],
                   "description": "state-unrecoverable: where the damaged files were moved"},
}


def check_arguments(tool: Tool, arguments: Any) -> Dict[str, Any]:
    """``arguments`` if they match the tool's input schema, else :class:`InvalidInput` naming the first mismatch."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidInput(f"{tool.name}: arguments must be a JSON object")
    unknown = sorted(set(arguments) - set(tool.arguments))
    if unknown:
        raise InvalidInput(f"{tool.name}: unknown argument {unknown[0]!r} (takes "
                           f"{', '.join(sorted(tool.arguments)) or 'none'})")
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
    kinds: List[Any] = kind if isinstance(kind, list) else [kind]
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and
                             abs(v) != float("inf")),
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
        "inputSchema": {"type": "object", "properties": tool.arguments, "required": tool.required,
                        "additionalProperties": False},
        "outputSchema": {"type": "object", "properties": {**COMMON, **tool.results},
                         "required": ["ok", "reason", "exit_code"]},
        "annotations": {
            "title": tool.title,
            "readOnlyHint": tool.read_only,
            "destructiveHint": tool.destructive,
            "idempotentHint": tool.idempotent,
            # Every tool acts on the run's own store, never on the world outside it.
            "openWorldHint": False,
        },
    }


# -- handlers: each gets the session (see runner.surfaces.mcp.server.Session) and checked arguments ----------
# Each is a verb of runner.surfaces.verbs; the session supplies the run, opened as a reader or as the lease's writer.


def summary(run: Any) -> Dict[str, Any]:
    """The run at a glance, as ``status --json`` reports it, with what ``next`` decides now from the holder's side."""
    return verbs.status(run)


def _recover(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    run = session.open_run()
    decision = verbs.recover(run, session.owner, args.get("ttl") or session.ttl, args.get("contract"))
    session.took_lease(run, args.get("ttl"))
    return decision


def _next(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    decision = verbs.next_decision(session.open_run(), session.owner, session.epoch, args.get("contract"))
    if decision["reason"] == "fenced" and session.epoch is None:
        decision["detail"] += "; this server has taken no lease yet: call recover"
    return decision


def _view(verb: Callable[..., Dict[str, Any]], **rename: str) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    """A tool that reads: ``verb(run, **arguments)``, an argument renamed where the verb's parameter differs."""
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        return verb(session.open_run(), **{rename.get(k, k): v for k, v in args.items()})

    return handler


def _write(verb: Callable[..., Dict[str, Any]], **rename: str) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    """A fenced write: ``verb(run, **arguments)`` as this server's owner at its epoch."""
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        return verb(session.writer(), **{rename.get(k, k): v for k, v in args.items()})

    return handler


def _control(verb: Callable[..., Dict[str, Any]], **fixed: Any) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    """A person's or a supervisor's act: no lease is needed."""
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        return verb(session.open_run(), **args, **fixed)

    return handler


def _step(action: str) -> Callable[[Any, Dict[str, Any]], Dict[str, Any]]:
    def handler(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
        return verbs.step(session.writer(), action, args["step"], args.get("evidence"), args.get("class"),
                          args.get("error"))

    return handler


def _brief(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return verbs.brief(session.open_run(), args.get("max_chars", 2000))


def _events(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return verbs.events(session.open_run().store, args.get("after", 0), args.get("limit", verbs.DEFAULT_LIMIT))


def _lease_renew(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return {"lease": session.renew(args.get("ttl"))}


def _lease_release(session: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    return {"lease": session.release()}


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
#: A field name the runner writes: shown plain. Any other key (an id, or a key someone else chose) is shown by
#: quoting.name().
_FIELD = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")
#: Fields that map ids (steps, effect keys, request ids, ...) to records: their keys are always shown by quoting.name().
_MAPS = ("steps", "effects", "jobs", "approvals", "items", "authorization", "cost", "budgets", "counters", "checks",
         "artifacts")
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


def outline(value: Any, lines: List[str], indent: str = "", key: str = "",
            rules: Optional[Dict[str, Any]] = None) -> None:
    """Append ``value`` (an object or a list) to ``lines`` as a Markdown outline: fields by name, recorded text quoted.

    Field names the runner writes are shown plain; keys of an id map
    (:data:`_MAPS`) and any unusual key by :func:`runner.base.quoting.name`. A
    document someone else wrote (a receipt, evidence) is one quotation.

    :param rules: per field name (``"*"`` for a list's items and an id map's values): ``True`` for prose the runner
        wrote with quoting, shown as is; a source label to quote the value with; or the rules of a nested object.
    """
    rules = rules or {}
    items: List[Tuple[Any, Any]] = (sorted(value.items(), key=lambda kv: str(kv[0])) if isinstance(value, dict)
                                    else list(enumerate(value)))
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
            lines.append(indent + label
                         + (json.dumps(v) if not v else quoting.quote(v, _SOURCES.get(field, RECORD), 300)))
        else:
            lines.append(indent + label + _scalar(field, v))


#: Fields of a result that hold the runner's prose, which names command-line verbs.
_PROSE = ("detail", "sentence", "why", "approval", "message", "text", "brief", "hint", "what")
#: Fields that hold lists of the runner's prose.
_PROSE_LISTS = ("inferences", "unknowns")
_QUOTATION = re.compile(r"<quote\b.*?</quote>", re.S)
_PLACEHOLDER = re.compile(r"[A-Z_]+\Z|\.\.\.\Z")


def in_tool_words(value: Any, field: str = "") -> Any:
    """``value`` with each command-line verb its prose names written as the MCP tool that does it.

    `` `effect verify KEY --evidence JSON` `` becomes `` `effect_verify` (key KEY, evidence JSON) ``.
    Only mentions of two words or more are taken (a single backticked word is
    an id); text inside a quotation is recorded data and stays as it is; a verb
    only the command line has stays as the command it is.
    """
    if isinstance(value, dict):
        return {k: in_tool_words(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [in_tool_words(v, field if field in _PROSE_LISTS else "") for v in value]
    if isinstance(value, str) and (field in _PROSE or field in _PROSE_LISTS):
        kept = _QUOTATION.split(value)
        quotes = _QUOTATION.findall(value)
        out = [_tool_mentions(part) for part in kept]
        return "".join(part + (quotes[i] if i < len(quotes) else "") for i, part in enumerate(out))
    return value


def _tool_mentions(text: str) -> str:
    pieces, at = [], 0
    for match, verb, named in verbs.command_mentions(text):
        if " " not in match.group(1):
            continue
        # A value the mention names is an id (backticked as quoting.name shows it); a placeholder is the runner's word.
        given = ", ".join(f"{arg} {value if _PLACEHOLDER.match(value) else '`' + value + '`'}"
                          for arg, value in named.items() if value)
        pieces += [text[at:match.start()], f"`{verb.tool}`" + (f" ({given})" if given else "")]
        at = match.end()
    return "".join(pieces) + text[at:]


#: The prose of a decision (``recover``, ``next``) that the runner writes quoted.
_DECISION_PROSE: Dict[str, Any] = {
    "detail": True,
    "sentence": True,
    "action": {"why": True, "approval": True, "artifact": CONTRACT, "check": CONTRACT, "evidence": CONTRACT,
               "item": ITEMS, "command": CONTRACT},
    "check": {"why": True},
    "inferences": {"*": True},
    "unknowns": {"*": True},
    "observations": {"*": {"source": True, "what": True}},
}


def text_form(tool: str, structured: Dict[str, Any]) -> str:
    """The tool result as a model reads it: a header, the notice, and the fields, recorded text quoted (at most
    :data:`TEXT_CHARS`)."""
    if structured.get("ok"):
        head = f"Result of {quoting.name(tool)}: ok" + (f", {structured['reason']}"
                                                        if structured.get("reason") in WORDS else "")
    else:
        head = (f"Result of {quoting.name(tool)}: refused, {_scalar('reason', structured.get('reason'))} (exit "
                f"{_scalar('exit_code', structured.get('exit_code'))})")
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
    lines = [f"# Status of run {quoting.name(state['task_id'])}",
             "(The exact JSON is the structured result of the `status` tool.)", NOTICE, ""]
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
    results: Dict[str, Any],
    handler: Callable[[Any, Dict[str, Any]], Dict[str, Any]],
    destructive: bool = False,
    idempotent: bool = False,
) -> Tool:
    """A row of the table; what the tool requires is what :data:`runner.surfaces.verbs.VERBS` says its verb requires."""
    read_only = authority == "view"
    verb = next(v for v in verbs.VERBS if v.tool == name)
    return Tool(name, title, description, authority, arguments, list(verb.required), results, read_only,
                destructive and not read_only, idempotent or read_only, handler)


_EVIDENCE = _doc("what the observation found")
_RECONCILED = {"type": "boolean", "description": "the outcome was unknown and is settled by this observation"}
_LOOKED = {"type": "string", "description": "the person who looked at the target (kept in the evidence; it settles an "
                                            "unknown outcome)"}
_CONTRACT_FILE = _text("a contract file (a path on the server's machine) whose plan must be the run's; "
                       "refused if it differs", 4096)
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 10000,
          "description": f"at most this many (default {verbs.DEFAULT_LIMIT})"}
_LEASE = {"lease": _OBJ}
_ITEM_STATE = {"type": "string", "enum": list(ITEM_STATES),
               "description": "an item's state: pending (never begun), an effect's state, or skipped"}
_APPROVAL = {"request_id": _STR, "request": _OBJ}

TOOLS: List[Tool] = [
    _t("recover", "Recover the run",
       "Take the lease for this server's owner (a higher fencing epoch), reconcile, refresh jobs, decide the one safe "
       "next action and persist it. Call it first, and again after any stop. Each call fences the previous epoch.",
       "write", {"ttl": _TTL, "contract": _CONTRACT_FILE}, _DECISION, _recover),
    _t("next", "Next safe action",
       "Name exactly one safe next action, or one stop with its reason (awaiting-approval, needs-reconciliation, "
       "fenced, complete, ...). Reads only.",
       "view", {"contract": _CONTRACT_FILE}, _DECISION, _next),
    _t("brief", "Brief of the run", "A bounded Markdown summary of durable facts, for a fresh model context.", "view",
       {"max_chars": {"type": "integer", "minimum": 200, "maximum": 20000,
                      "description": "at most this many characters (default 2000)"}},
       {"brief": _STR, "chars": _INT}, _brief),
    _t("status", "Run status", "The run's current state: status, steps, effect counts, lease, next action.", "view", {},
       {"task_id": _STR, "status": _STR, "revision": _INT, "current_step": _NULLABLE_STR, "completed_steps": _LIST,
        "steps": _OBJ, "effects": _OBJ, "lease": _OBJ, "recorded_intent": _NULLABLE_OBJ, "next": _NULLABLE_OBJ},
       _view(verbs.status)),
    _t("report", "Run report",
       "Recovery metrics of the whole run, across all workers and attempts: recoveries, retries, "
       "reconciled and unresolved effects, possible duplicates, items, costs.", "view", {},
       {"recoveries": _INT, "effects_verified": _INT, "unresolved_effects": _INT, "possible_duplicates": _INT,
        "cost": _OBJ},
       _view(verbs.report)),
    _t("step_start", "Start a step", "Start a step of the plan, in plan order.", "write", {"step": _STEP_ID}, _STEP,
       _step("start")),
    _t("step_done", "Finish a step",
       "Finish the running step with the evidence its contract asks for (none for a step whose evidence the runner "
       "observes); gated steps need a verified effect.",
       "write", {"step": _STEP_ID, "evidence": _doc("the evidence the contract names")}, _STEP, _step("done")),
    _t("step_fail", "Fail a step",
       "Record a failed attempt: transient (retried after a persisted backoff) or permanent "
       "(the step is failed for good).",
       "write", {"step": _STEP_ID, "class": {"type": "string", "enum": ["transient", "permanent"]},
                 "error": _text("what went wrong")},
       _STEP, _step("fail"), destructive=True),
    _t("effect_begin", "Begin an effect",
       "Record the intent to call the target for KEY with this exact payload, before calling it; the result has the "
       "payload to send (a batch item's comes from its step's template). Refused when approval, cancellation, "
       "limits or an unresolved earlier attempt forbid it.",
       "write",
       {"key": _KEY,
        "payload": _doc("the exact payload that will be sent (default: a batch item's template, or the one kept)"),
        "step": _key("the step it belongs to (default: the current step)")},
       dict(_EFFECT, payload=_OBJ), _write(verbs.effect_begin)),
    _t("effect_ack", "Acknowledge an effect", "Record the target's receipt for KEY after the call returned.", "write",
       {"key": _KEY, "receipt": _doc("the target's receipt")}, _EFFECT, _write(verbs.effect_ack)),
    _t("effect_verify", "Verify an effect", "Record that the target was observed to hold KEY's effect.", "write",
       {"key": _KEY, "evidence": _EVIDENCE, "reconciled": _RECONCILED, "by": _LOOKED}, _EFFECT,
       _write(verbs.effect_verify)),
    _t("effect_absent", "Record an effect absent",
       "Record that the target was observed not to hold KEY's effect, so it may be sent again "
       "(after the contract's backoff).", "write",
       {"key": _KEY, "evidence": _EVIDENCE, "reconciled": _RECONCILED, "by": _LOOKED}, _EFFECT,
       _write(verbs.effect_absent)),
    _t("effect_uncertain", "Mark an effect uncertain",
       "Record that KEY's outcome is unknown; nothing is retried until it is observed.",
       "write", {"key": _KEY, "reason": _text("why the outcome is unknown")}, _EFFECT, _write(verbs.effect_uncertain)),
    _t("effect_skip", "Skip a batch item",
       "Settle the batch item KEY without its effect, with the reason recorded (counted in the report).",
       "write", {"key": _KEY, "reason": _text("why the item is left out")}, _EFFECT, _write(verbs.effect_skip),
       destructive=True),
    _t("skip", "Skip many batch items",
       "Settle every item of the batch STEP in STATE (pending: never begun), or with all_remaining every item neither "
       "verified nor skipped, without its effect, with one reason, in one transition; refused, nothing skipped, when a "
       "chosen item may have happened (a call in flight or an unknown outcome), each such item named.",
       "write", {"step": _STEP_ID, "state": _ITEM_STATE, "all_remaining": {"type": "boolean", "description":
                 "skip every item neither verified nor skipped"}, "reason": _text("why the items are left out")},
       {"step": _STR, "skipped": _INT, "keys": _LIST, "reason": _STR}, _write(verbs.skip), destructive=True),
    _t("effect_run", "Run an effect",
       "Take KEY to verified through the contract's effects.http or effects.invoke/observe: wait for a call of KEY "
       "still in flight, observe first, call the target only after an observed absence, record each transition. "
       "Returns when KEY is settled.",
       "write", {"key": _KEY, "payload": _doc("the payload (default: a batch item's template, or the one kept)")},
       _EFFECT, _write(verbs.effect_run)),
    _t("effect_show", "Show an effect", "KEY's ledger record, and its attempts and deferrals ('not now' answers) "
       "apart, with their limits.", "view", {"key": _KEY}, dict(_EFFECT, counts=_OBJ), _view(verbs.effect_show)),
    _t("items", "List a batch step's items",
       "Every item of the batch STEP in order, with its key, state (pending, an effect's state, or skipped), attempts, "
       "deferrals and cost; only those in STATE when given.", "view", {"step": _STEP_ID, "state": _ITEM_STATE},
       {"step": _STR, "count": _INT, "total": _INT, "states": _OBJ, "items": _LIST}, _view(verbs.items)),
    _t("effect_list", "List effects", "The ledger's effects, by key, optionally only those in one state.", "view",
       {"state": {"type": "string", "enum": list(EFFECT_STATES)}, "limit": _LIMIT},
       {"count": _INT, "effects": _OBJ, "more": _BOOL}, _view(verbs.effect_list)),
    _t("approval_request", "Request an approval",
       "Ask a person to approve ACTION (effect:KEY) in STEP for this exact payload; the run then stops at "
       "awaiting-approval until someone outside the run answers.",
       "write",
       {"step": _STEP_ID, "action": _text("the action to approve, effect:KEY", 300),
        "payload": _doc("the exact payload that will be sent"),
        "ttl": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TTL_SECONDS,
                "description": "seconds until the request and its grant expire"}},
       _APPROVAL, _write(verbs.approval_request, step="step_id")),
    _t("approval_list", "List approvals",
       "Every approval request with its state (pending, granted, used, denied, expired).", "view", {},
       {"approvals": _LIST}, _view(verbs.approval_list)),
    _t("lease_show", "Show the lease", "The run's lease: owner, epoch, expiry, and whether it is live.", "view", {},
       _LEASE, _view(verbs.lease_show)),
    _t("lease_renew", "Renew the lease", "Extend the lease this server holds (it also renews while calls arrive).",
       "write", {"ttl": _TTL}, _LEASE, _lease_renew),
    _t("lease_release", "Release the lease",
       "Give up the lease this server took; writes need recover again afterwards.", "write", {},
       _LEASE, _lease_release),
    _t("cost", "Add costs",
       "Attribute an attempt's costs to the run, each NAME=AMOUNT (tokens=1200, money=0.03); returns the run's totals.",
       "write", {"add": {"type": "array", "items": {"type": "string", "maxLength": 300}, "minItems": 1,
                         "description": "NAME=AMOUNT, one per cost"}},
       {"cost": _OBJ}, _write(verbs.cost)),
    _t("migrate", "Change the plan",
       "Record a change of plan as a new attempt of the same run, from an edited contract file that says why.", "write",
       {"contract": _text("the edited contract file (a path on the server's machine)", 4096),
        "reason": _text("why the plan changes")},
       {"plan_digest": _STR, "revision": _INT}, _write(verbs.migrate)),
    _t("events", "Events", "Journal transitions after sequence number AFTER, so an observer resumes where it left off.",
       "view", {"after": {"type": "integer", "minimum": 0}, "limit": _LIMIT},
       {"after": _INT, "last": _INT, "oldest": _INT, "truncated": _BOOL, "more": _BOOL, "events": _LIST}, _events),
    _t("approval_grant", "Grant an approval",
       "Control (a person's authority): grant a pending request, bound to its exact payload.",
       "control", {"request_id": _key("the request to answer"), "by": _WHO}, _APPROVAL,
       _control(verbs.approval_answer, grant=True)),
    _t("approval_deny", "Deny an approval", "Control (a person's authority): deny a pending request.", "control",
       {"request_id": _key("the request to answer"), "by": _WHO}, _APPROVAL,
       _control(verbs.approval_answer, grant=False), destructive=True),
    _t("effect_reopen", "Reopen a failed effect",
       "Control (a person's authority): give the failed effect KEY a new budget of attempts once the cause of its "
       "failure is fixed, recorded with who and why; the next drive calls it again. Refused to the lease's holder.",
       "control", {"key": _KEY, "by": _WHO, "reason": _text("why it may be called again")}, _EFFECT,
       _control(verbs.effect_reopen)),
    _t("cancel", "Cancel the run",
       "Control (a person's authority): no new step or effect begins; in-flight effects are still reconciled.",
       "control",
       {"by": _WHO, "reason": _text("why")}, {"status": _STR, "cancellation": _OBJ, "recorded_intent": _NULLABLE_OBJ},
       _control(verbs.cancel), destructive=True),
    _t("lease_break", "Break the lease",
       "Control (a supervisor's authority): end a dead holder's lease now, with the evidence that it ended.", "control",
       {"by": _WHO, "reason": _text("the evidence that the holder ended")}, _LEASE, _control(verbs.lease_break),
       destructive=True),
]
