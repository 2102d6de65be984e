"""The verbs the command line, the MCP server and the harness hooks share.

Each verb is a plain function from a :class:`~runner.execution.run.Run` (or a run's
state) and its arguments to a result object. A surface parses its own input
(argv, a tool call's JSON, a hook's event), calls the verb, and renders the
result in its own words; no surface calls ``Run`` for a verb's work itself,
so the defaults (the lease's time to live, which jobs are observed, what a
batch item's payload is) are decided once, here.

:data:`VERBS` is the table of what each verb accepts, by the name of its MCP
tool and its command-line words: the command line refuses an option the
table does not list for that verb, the MCP tools' input schemas have exactly
the table's arguments, and ``tests/test_verbs.py`` fails when one surface
gains a verb or an argument the other lacks. What only one surface has is
listed, with why, in :data:`COMMAND_LINE_ONLY`.

The library's prose names command-line verbs in backticks (`` `effect verify
KEY --evidence JSON` ``); :func:`command_mentions` finds them, so that the MCP
server can name its tools instead.
"""

import re
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ..execution import jobs as _jobs
from ..ledger.approvals import approval_view
from ..contract.spec import contract_of
from ..execution.payloads import begin_payload
from ..base.values import one_line, validate_id
from ..base.canonical import read_document
from ..base.errors import InvalidInput
from ..calls.inflight import findings as calls_findings
from ..ledger.lease import DEFAULT_TTL_SECONDS, default_ttl, lease_view
from ..execution.recovery import decide, decision_exit_code, recover as _recover
from ..execution.run import Run
from ..ledger.steps import require_plan
from ..ledger.effects import attempt_counts, effect_caps
from .stops import with_stop
from .views import brief as _brief, decision_view, events_after, items as _items, report as _report, status_view

__all__ = [
    "Verb", "VERBS", "COMMAND_LINE_ONLY", "verb_named", "command_mentions",
    "DEFAULT_TTL_SECONDS", "default_ttl", "observed_jobs", "decision", "holder_decision", "answer",
    "status", "brief", "next_decision", "recover", "events", "report",
    "effect_show", "effect_list", "effect_begin", "effect_ack", "effect_verify", "effect_absent", "effect_uncertain",
    "effect_skip", "effect_reopen", "items", "skip",
    "effect_run", "step", "cancel", "approval_request", "approval_answer", "approval_list",
    "lease_show", "lease_acquire", "lease_renew", "lease_release", "lease_break", "cost", "job", "migrate",
]

#: Where the list views stop unless asked for more.
DEFAULT_LIMIT = 200


class Verb(NamedTuple):
    """One verb as both surfaces spell it.

    :param tool: the MCP tool's name.
    :param words: the command line's words (``"effect verify"``).
    :param arguments: each argument's MCP name -> its command-line spelling: an upper-case
        positional (``KEY``) or an option (``--evidence``).
    :param required: the arguments a call must give.
    """

    tool: str
    words: str
    arguments: Dict[str, str]
    required: Tuple[str, ...]


def _v(tool: str, words: str, *required: str, **arguments: str) -> Verb:
    return Verb(tool, words, arguments, required)


VERBS: List[Verb] = [
    _v("status", "status"),
    _v("next", "next", contract="--contract"),
    _v("brief", "brief", max_chars="--max-chars"),
    _v("recover", "recover", ttl="--ttl", contract="--contract"),
    _v("events", "events", after="--after", limit="--limit"),
    _v("report", "report"),
    _v("effect_show", "effect show", "key", key="KEY"),
    _v("effect_list", "effect list", state="--state", limit="--limit"),
    _v("effect_begin", "effect begin", "key", key="KEY", payload="--payload", step="--step"),
    _v("effect_ack", "effect ack", "key", "receipt", key="KEY", receipt="--receipt"),
    _v("effect_verify", "effect verify", "key", "evidence", key="KEY", evidence="--evidence", reconciled="--reconciled",
       by="--by"),
    _v("effect_absent", "effect absent", "key", "evidence", key="KEY", evidence="--evidence", reconciled="--reconciled",
       by="--by"),
    _v("effect_uncertain", "effect uncertain", "key", "reason", key="KEY", reason="--reason"),
    _v("effect_skip", "effect skip", "key", "reason", key="KEY", reason="--reason"),
    _v("effect_reopen", "effect reopen", "key", "by", "reason", key="KEY", by="--by", reason="--reason"),
    _v("items", "items", "step", step="STEP", state="--state"),
    _v("skip", "skip", "step", "reason", step="STEP", state="--state", all_remaining="--all-remaining",
       reason="--reason"),
    _v("effect_run", "effect run", "key", key="KEY", payload="--payload"),
    _v("step_start", "step start", "step", step="STEP"),
    _v("step_done", "step done", "step", step="STEP", evidence="--evidence"),
    _v("step_fail", "step fail", "step", "class", "error", step="STEP", **{"class": "--class", "error": "--error"}),
    _v("approval_request", "approval request", "step", "action", "payload", "ttl", step="STEP", action="--action",
       payload="--payload", ttl="--ttl"),
    _v("approval_list", "approval list"),
    _v("approval_grant", "approval grant", "request_id", "by", request_id="REQUEST_ID", by="--by"),
    _v("approval_deny", "approval deny", "request_id", "by", request_id="REQUEST_ID", by="--by"),
    _v("cancel", "cancel", "by", "reason", by="--by", reason="--reason"),
    _v("lease_show", "lease show"),
    _v("lease_renew", "lease renew", ttl="--ttl"),
    _v("lease_release", "lease release"),
    _v("lease_break", "lease break", "by", "reason", by="--by", reason="--reason"),
    _v("cost", "cost", "add", add="--add"),
    _v("migrate", "migrate", "contract", "reason", contract="--contract", reason="--reason"),
]

#: What the command line has and the MCP server deliberately does not, with why.
COMMAND_LINE_ONLY: Dict[str, str] = {
    "init": "starts a run from a contract file; a server serves a run that exists",
    "doctor": "checks and repairs the run's files, a person's tool",
    "contract": "checks a contract file before any run exists",
    "lease acquire": "the server's lease is taken by its recover tool, for the owner the server was started as",
    "drive": "runs until the run stops, longer than a tool call should take",
    "work": "a pool of worker processes",
    "job": "starts and signals processes from a command line",
    "mcp": "is the server",
    "effect run -- INVOKE --observe -- OBSERVE": "commands given inline; the server runs only the contract's",
    "events --follow": "a stream on stdout",
    "events --timeout": "ends the stream of --follow",
    "events --otlp": "writes a file",
    "events --with-content": "goes with --otlp",
    "report --html": "writes a file",
}


def verb_named(words: str) -> Optional[Verb]:
    """The verb whose command-line words are ``words``, or None."""
    return next((v for v in VERBS if v.words == words), None)


_MENTION = re.compile(r"`([a-z][a-z-]*(?: [^`\n]*)?)`")


def command_mentions(text: str) -> Iterator[Tuple[re.Match, Verb, Dict[str, str]]]:
    """Each backticked command-line verb in ``text``: the match, its :class:`Verb`, and the arguments it names.

    The arguments map an MCP argument name to what the mention gives for it
    (a value, or a placeholder such as ``JSON``); options the verb does not
    take (``--owner``, which an MCP server carries itself) are left out.
    """
    for match in _MENTION.finditer(text):
        words = match.group(1).split(" ")
        for size in (2, 1):
            verb = verb_named(" ".join(words[:size]))
            if verb is not None:
                yield match, verb, _mentioned_arguments(verb, words[size:])
                break


def _mentioned_arguments(verb: Verb, rest: List[str]) -> Dict[str, str]:
    by_spelling = {spelling: name for name, spelling in verb.arguments.items()}
    positionals = [name for name, spelling in verb.arguments.items() if not spelling.startswith("--")]
    out: Dict[str, str] = {}
    index = 0
    while index < len(rest):
        word = rest[index]
        if word.startswith("--"):
            value = rest[index + 1] if index + 1 < len(rest) and not rest[index + 1].startswith("--") else ""
            index += 2 if value else 1
            if word in by_spelling:
                out[by_spelling[word]] = value
        else:
            index += 1
            if positionals:
                out[positionals.pop(0)] = word
    return out


# -- defaults and decisions --------------------------------------------------------------


def observed_jobs(path: str, state: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """What each unsettled job's process and files show now, by key; nothing is committed.

    An observation with ``damage`` names a job file that was not believed.
    """
    return {key: _jobs.observe_job(path, job) for key, job in state["jobs"].items() if job["state"] in _jobs.UNSETTLED}


def decision(state: Dict[str, Any], path: str, now: float, owner: Optional[str],
             epoch: Optional[int]) -> Dict[str, Any]:
    """:func:`runner.execution.recovery.decide` for ``owner`` at ``epoch``, with the jobs observed now."""
    return decide(state, now, owner, epoch, observed_jobs(path, state))


def holder_decision(run: Run) -> Dict[str, Any]:
    """What ``next`` decides now from the lease holder's side: the one decision status, brief and step show."""
    lease = run.state["lease"]
    return decision(run.state, run.store.path, run.clock(), lease.get("owner"), lease.get("epoch"))


def answer(found: Dict[str, Any], run: Run) -> Dict[str, Any]:
    """A decision as a result: the decision, the lease now, and the exit code the command line gives it.

    A decision is an answer, not a refusal: a stop is reported with its reason, and with its code and
    sentence (:mod:`runner.surfaces.stops`).
    """
    return dict(with_stop(found, run.state), lease=dict(run.state["lease"]), exit_code=decision_exit_code(found))


def _contract_matches(run: Run, contract: Optional[str]) -> None:
    if contract:
        require_plan(run.state, read_document(contract, "contract"))


# -- views ----------------------------------------------------------------------------------


def status(run: Run) -> Dict[str, Any]:
    """The run at a glance (:func:`runner.surfaces.views.status_view`) with the holder's decision as ``next``."""
    return status_view(run.state, holder_decision(run))


def brief(run: Run, max_chars: int = 2000) -> Dict[str, Any]:
    """``{"brief", "chars"}``: the bounded Markdown brief, with the holder's decision and what the calls folder holds
    that the runner does not act on (:func:`runner.calls.inflight.findings`)."""
    text = _brief(run.state, holder_decision(run), max_chars, calls_findings(run.store))
    return {"brief": text, "chars": len(text)}


def next_decision(run: Run, owner: Optional[str], epoch: Optional[int],
                  contract: Optional[str] = None) -> Dict[str, Any]:
    """The one safe next action for ``owner`` at ``epoch``, as :func:`answer` gives it; reads only.

    :param contract: a contract file whose plan must be the run's.
    :raises InvalidInput: the contract's plan differs from the run's.
    """
    _contract_matches(run, contract)
    return answer(decision(run.state, run.store.path, run.clock(), owner, epoch), run)


def recover(run: Run, owner: str, ttl: Optional[float] = None, contract: Optional[str] = None) -> Dict[str, Any]:
    """Take the lease for ``owner``, reconcile, refresh the jobs, decide and persist the intent
    (:func:`runner.execution.recovery.recover`).

    :raises InvalidInput: no owner, or the contract's plan differs from the run's.
    :raises AlreadyRunning: another owner's lease is live.
    """
    if not owner:
        raise InvalidInput("recover needs an owner (the worker taking over)")
    _contract_matches(run, contract)
    return answer(_recover(run, owner, default_ttl(run.state, ttl)), run)


def events(store: Any, after: int = 0, limit: Optional[int] = None) -> Dict[str, Any]:
    """Journal transitions after sequence ``after``, at most ``limit``; ``more`` when there are others after them."""
    batch = events_after(store, after)
    found = batch["events"]
    limit = limit or len(found) or 1
    batch["events"], batch["more"] = found[:limit], len(found) > limit
    if batch["more"]:
        batch["last"] = found[limit - 1]["seq"]
    return batch


def report(run: Run, history: Any = None) -> Dict[str, Any]:
    """Recovery metrics of the whole run (:func:`runner.surfaces.views.report`) and the figures of its whole history.

    :param history: the run's :class:`runner.surfaces.history.History`, when the caller has read it already.
    """
    from .history import figures, load  # the journal's replay is loaded by the verbs that read it, not by every verb

    found = _report(run.state)
    history = history if history is not None else load(run.store)
    found.update(figures(history))
    dropped = history.dropped
    found["history_dropped_range"] = [dropped.get("first"), dropped.get("through")] if dropped else None
    found["history_damage"] = list(history.damage)
    return found


def effect_show(run: Run, key: str) -> Dict[str, Any]:
    """``{"key", "effect", "counts"}``: the record, and its attempts and deferrals apart with their limits
    (:func:`runner.ledger.effects.attempt_counts`; ``max_deferrals`` is ``effects.max_rate_limited``).

    :raises InvalidInput: no effect ``key`` in the ledger."""
    effect = run.state["effects"].get(key)
    if effect is None:
        raise InvalidInput(f"no effect {key!r} in the ledger")
    caps = effect_caps(run.state)
    counts = dict(attempt_counts(effect), max_attempts=int(caps["max_attempts"]),
                  max_deferrals=int(caps["max_rate_limited"]))
    return {"key": key, "effect": effect, "counts": counts}


def items(run: Run, step: str, state: Optional[str] = None) -> Dict[str, Any]:
    """Every item of the batch ``step`` with its key, state, attempts, deferrals and cost
    (:func:`runner.surfaces.views.items`); only those in ``state`` when given.

    :raises InvalidInput: no such step, not a batch step, not started, or no such item state.
    """
    return _items(run.state, step, state)


def effect_list(run: Run, state: Optional[str] = None, limit: Optional[int] = None) -> Dict[str, Any]:
    """``{"count", "effects", "more"}``: the effects by key (those in ``state`` only, when given), the first
    ``limit``."""
    items = [(k, e) for k, e in sorted(run.state["effects"].items()) if state in (None, e.get("state"))]
    limit = limit or DEFAULT_LIMIT
    return {"count": len(items), "effects": dict(items[:limit]), "more": len(items) > limit}


def approval_list(run: Run) -> Dict[str, Any]:
    """``{"approvals"}``: every request with its state, its payload's source, and whether it expired."""
    return {"approvals": approval_view(run.state, run.clock())}


def lease_show(run: Run) -> Dict[str, Any]:
    """``{"lease"}``: the lease as stored, with ``live``."""
    return {"lease": lease_view(run.state, run.clock())}


# -- writes ---------------------------------------------------------------------------------


def _effect(key: str, effect: Dict[str, Any]) -> Dict[str, Any]:
    return {"key": key, "effect": dict(effect)}


def effect_begin(run: Run, key: str, payload: Optional[Dict[str, Any]] = None, step: Optional[str] = None,
                 source: Optional[str] = None) -> Dict[str, Any]:
    """Record the intent to call the target for ``key``; ``{"key", "effect", "payload"}`` with the payload to send.

    A batch item's payload is the one its step's template makes (another one
    is refused with both digests); a key begun before keeps the payload it
    was begun with.

    :param source: the file the payload came from, kept when it is too large to keep itself.
    :raises InvalidInput: no payload for a key that needs one, or another payload than the item's.
    """
    payload = begin_payload(run.state, key, payload)
    return dict(_effect(key, run.effect_begin(key, payload, step=step, source=source)), payload=payload)


def effect_ack(run: Run, key: str, receipt: Dict[str, Any]) -> Dict[str, Any]:
    """Record the target's receipt for ``key``."""
    return _effect(key, run.effect_ack(key, receipt))


def _seen_by(evidence: Dict[str, Any], reconciled: bool, by: Optional[str]) -> Tuple[Dict[str, Any], bool]:
    """A person's observation: the evidence names who made it (``observed_by``), and it settles an unknown outcome; it
    needs the lease only while someone holds it live."""
    if by is None:
        return evidence, reconciled
    return {**evidence, "observed_by": {"source": "person", "by": one_line(by, "--by")}}, True


def effect_verify(run: Run, key: str, evidence: Dict[str, Any], reconciled: bool = False,
                  by: Optional[str] = None) -> Dict[str, Any]:
    """Record that the target was observed to hold ``key``'s effect (``by``: the person who looked)."""
    evidence, reconciled = _seen_by(evidence, reconciled, by)
    return _effect(key, run.effect_verify(key, evidence, reconciled=reconciled, person=by is not None))


def effect_absent(run: Run, key: str, evidence: Dict[str, Any], reconciled: bool = False,
                  by: Optional[str] = None) -> Dict[str, Any]:
    """Record that the target was observed not to hold ``key``'s effect (``by``: the person who looked)."""
    evidence, reconciled = _seen_by(evidence, reconciled, by)
    return _effect(key, run.effect_absent(key, evidence, reconciled=reconciled, person=by is not None))


def effect_uncertain(run: Run, key: str, reason: str) -> Dict[str, Any]:
    """Record that ``key``'s outcome is unknown."""
    return _effect(key, run.effect_uncertain(key, reason))


def effect_skip(run: Run, key: str, reason: str) -> Dict[str, Any]:
    """Settle a batch item without its effect; ``{"key", "effect"}`` with the skip (step, reason, at)."""
    return _effect(key, run.effect_skip(key, reason))


def effect_reopen(run: Run, key: str, by: str, reason: str) -> Dict[str, Any]:
    """A person gives the failed ``key`` a new budget of attempts, with who and why; ``{"key", "effect"}``.

    :raises InvalidInput: not failed, a receipt held, or ``by`` (or the writer) holds the run's lease live.
    """
    return _effect(key, run.effect_reopen(key, by, reason))


def skip(run: Run, step: str, reason: str, state: Optional[str] = None, all_remaining: bool = False) -> Dict[str, Any]:
    """Skip many items of the batch ``step`` with one reason, in one transition; ``{"step", "skipped", "keys",
    "reason"}``.

    :param state: skip the items in this state (``pending``: never begun).
    :param all_remaining: skip every item neither verified nor skipped.
    :raises InvalidInput: neither or both of ``state`` and ``all_remaining``, a bad step or state, nothing to skip.
    :raises NeedsReconciliation: a chosen item may have happened (a call in flight, an unknown outcome): nothing is
        skipped, and each such item is named.
    """
    if (state is None) == (not all_remaining):
        raise InvalidInput("skip STEP needs one of --state STATE and --all-remaining")
    keys = run.skip_items(step, reason, None if all_remaining else [state])  # type: ignore[list-item]
    return {"step": step, "skipped": len(keys), "keys": keys, "reason": reason}


def effect_run(run: Run, key: str, payload: Optional[Dict[str, Any]] = None, invoke: Optional[Sequence[str]] = None,
               observe: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Take ``key`` to verified through the contract's adapter (or the commands given); ``{"key", "effect"}``.

    :raises NeedsReconciliation: the outcome cannot be established by observing.
    :raises InvalidInput: nothing says how to call the target, or no payload.
    """
    # the executor and the adapters load only for a verb that calls a target
    from ..execution.drive import perform_effect

    return _effect(key, perform_effect(run, key, payload, invoke, observe))


def step(run: Run, action: str, step_id: str, evidence: Optional[Dict[str, Any]] = None,
         error_class: Optional[str] = None, error: Optional[str] = None) -> Dict[str, Any]:
    """Start, finish (``done``) or fail a step; ``{"step", "record", "status", "recorded_intent", "next"}``.

    ``next`` is what ``next`` decides now; ``recorded_intent`` the intent the state keeps (see
    :func:`runner.surfaces.views.status_view`).

    ``done`` with no evidence is accepted for a step whose evidence the runner observes itself.

    :raises InvalidInput: ``done`` without the evidence the step needs, ``fail`` without a class and an error.
    """
    if action == "start":
        record = run.step_start(step_id)
    elif action == "done":
        if evidence is None:
            if not any(s.id == step_id and s.observes_itself for s in contract_of(run.state).steps):
                raise InvalidInput(f"step done {step_id} needs the evidence its contract asks for")
            evidence = {}
        record = run.step_done(step_id, evidence)
    elif action == "fail":
        if error_class not in ("transient", "permanent") or not error:
            raise InvalidInput("step fail needs a class (transient or permanent) and an error")
        record = run.step_fail(step_id, error_class, error)
    else:
        raise InvalidInput(f"no step action {action!r}")
    state = run.state
    return {"step": step_id, "record": dict(record), "status": state["status"], "recorded_intent": state["next_action"],
            "next": decision_view(holder_decision(run))}


def cancel(run: Run, by: str, reason: str) -> Dict[str, Any]:
    """A person's cancellation: ``{"status", "cancellation", "recorded_intent"}``."""
    state = run.cancel(by, reason)
    return {"status": state["status"], "cancellation": state["observations"]["cancellation"],
            "recorded_intent": state["next_action"]}


def approval_request(run: Run, step_id: str, action: str, payload: Dict[str, Any], ttl: float,
                     source: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Ask a person to approve ``action`` in ``step_id`` for exactly ``payload``; ``{"request_id", "request"}``."""
    rid = run.approval_request(step_id, action, payload, ttl, source)
    return {"request_id": rid, "request": run.state["observations"]["approvals"][rid]}


def approval_answer(run: Run, request_id: str, by: str, grant: bool) -> Dict[str, Any]:
    """A person's grant or denial of a pending request; ``{"request_id", "request"}``."""
    found = run.approval_grant(request_id, by) if grant else run.approval_deny(request_id, by)
    return {"request_id": request_id, "request": found}


def lease_acquire(run: Run, owner: str, ttl: Optional[float] = None) -> Dict[str, Any]:
    """Take the lease at a higher epoch; ``{"lease"}``. :raises AlreadyRunning: another owner's lease is live."""
    return {"lease": run.acquire(owner, default_ttl(run.state, ttl))}


def lease_renew(run: Run, ttl: Optional[float] = None) -> Dict[str, Any]:
    """Extend the lease this run object holds; ``{"lease"}``. :raises Fenced: it no longer holds it."""
    return {"lease": run.renew(default_ttl(run.state, ttl))}


def lease_release(run: Run) -> Dict[str, Any]:
    """Give the lease up; ``{"lease"}``. :raises Fenced: it is not this object's to give."""
    run.release()
    return {"lease": dict(run.state["lease"])}


def lease_break(run: Run, by: str, reason: str) -> Dict[str, Any]:
    """A supervisor ends a dead holder's lease; ``{"lease"}`` with ``live``."""
    run.break_lease(by, reason)
    return lease_show(run)


def cost(run: Run, add: Sequence[str]) -> Dict[str, Any]:
    """Attribute costs given as ``NAME=AMOUNT`` to the run; ``{"cost"}``: the run's totals.

    :raises InvalidInput: none given, or one not of that form.
    """
    amounts: Dict[str, float] = {}
    for item in add:
        name, _, amount = str(item).partition("=")
        try:
            amounts[validate_id(name, "cost name")] = float(amount)
        except ValueError:
            raise InvalidInput(f"a cost is NAME=AMOUNT, not {item!r}") from None
    if not amounts:
        raise InvalidInput("cost needs at least one NAME=AMOUNT")
    return {"cost": run.add_cost(amounts)}


def job(run: Run, action: str, key: str, command: Optional[Sequence[str]] = None,
        done: Optional[int] = None) -> Dict[str, Any]:
    """A re-attachable job: ``submit`` it, or observe it after ``status``, ``result``, ``cancel`` or ``shard``.

    Every action but ``submit`` commits what the observation saw; the result
    has the job's record with ``key``, ``observed`` (what the process and files
    showed) and ``damage`` when a job file was not believed; ``result`` adds
    its exit record and the log's tail.

    :raises InvalidInput: no job ``key``; ``shard`` without ``done``; ``result`` of a job still running.
    """
    if action == "submit":
        if not command:
            raise InvalidInput("job submit needs a command")
        return dict(run.job_submit(key, list(command)), key=key)
    if action == "shard":
        if done is None:
            raise InvalidInput("job shard needs the last committed shard")
        run.job_shard(key, done)
    elif action == "cancel":
        run.job_cancel(key)
    found = run.job_observe(key)
    seen = found.pop("observed")
    out = dict(found, key=key, observed=seen["status"], **({"damage": seen["damage"]} if seen.get("damage") else {}))
    if action == "result":
        if found["state"] not in ("finished", "stopped"):
            raise InvalidInput(f"job {key!r} is {found['state']}; it has no result yet")
        out.update(_jobs.read_result(run.store.path, found))
    return out


def migrate(run: Run, contract: str, reason: str) -> Dict[str, Any]:
    """Record a change of plan from the contract file ``contract``; ``{"plan_digest", "revision"}``."""
    state = run.migrate(read_document(contract, "contract"), reason)
    return {"plan_digest": state["plan_digest"], "revision": state["revision"]}
