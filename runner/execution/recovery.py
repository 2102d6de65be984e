"""Recovery: from durable facts alone, name exactly one safe next action.

:func:`decide` is the recovery procedure, in order, as a pure function of the
state, the time and what was observed of the world:

1. ownership: another live holder means ``already-running``; a caller whose
   epoch is stale means ``fenced``;
2. integrity: the store already refused damaged state (``state-unrecoverable``);
3. effects: an unresolved effect is reconciled before anything else (an
   ``uncertain`` one stops with ``needs-reconciliation`` and names exactly
   what must be observed);
4. jobs: a running job is waited for, a finished one read, a vanished one
   rerun only if the contract allows (otherwise ``needs-reconciliation``);
5. authority: cancellation, then pending approvals and denials
   (``awaiting-approval``), where only the newest request for a step and
   action counts: a grant made after a denial is the current answer;
6. limits: a step failed for good (``failed``), run-wide limits and a blocked
   outcome (``limit-exhausted``);
7. the plan: resume the running step (verify its artifact, never trust a
   claim), wait out a persisted backoff, or start the next step in order;
   with every step done and every effect verified, ``complete``.

Each check but the second is a function of its own over the same facts
(``_1_ownership`` to ``_7_next_step``, in :data:`_CHECKS`), which returns the
decision or None to pass it on; the second is the store's, made before there
is a state.

The decision separates ``observations`` (what was read, with its source and
digest), ``inferences`` (what follows from them) and ``unknowns`` (what no
observation settled). Those strings, ``detail`` and an action's ``why`` are
prose for a model: every value in them that the runner did not write (ids,
reasons, notes, times read from the run) goes through :mod:`runner.base.quoting`,
and every command in them is built from structured fields, in backticks.

:func:`recover` takes the lease, reconciles through adapters where given,
refreshes jobs, decides, and persists the chosen action as the run's
``next_action`` before returning it. Its record of the refreshed authority
names the host and user id it ran as: a ``recover`` on this machine by this
user is what adopts a run that someone else made (see :mod:`runner.surfaces.hooks`).
"""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import jobs as _jobs
from ..ledger.approvals import find_grant, newest_requests, request_order
from ..ledger.effects import attempt_counts
from ..ledger.states import UNRESOLVED
from ..calls.target import Adapter
from ..base.times import format_time, parse_time
from ..base.canonical import content_digest
from ..base.errors import EXIT_CODES, LimitExhausted, NeedsReconciliation, RunnerError
from ..ledger.lease import lease_view
from ..base.quoting import (ITEMS, MESSAGE, PERSON, RECORD, WORKER_OR_TARGET, digest, joined, moment, name, number,
                            quote, word)
from ..ledger.retry import check_limits
from ..ledger.steps import plan_steps, started_by_holder
from ..base.host import local_maker
from ..ledger import batch as _batch
from ..contract.spec import StepSpec, contract_of
from .evidence import evidence_observations

__all__ = ["decide", "recover", "decision_exit_code"]


def decision_exit_code(decision: Dict[str, Any]) -> int:
    return 0 if decision["decision"] == "act" else EXIT_CODES[decision["reason"]]


def _stop(reason: str, detail: str, evidence: Dict[str, List[Any]], **extra: Any) -> Dict[str, Any]:
    return {"decision": "stop", "action": None, "reason": reason, "detail": detail, **evidence, **extra}


def _act(action: Dict[str, Any], evidence: Dict[str, List[Any]]) -> Dict[str, Any]:
    return {"decision": "act", "action": action, "reason": None, "detail": action.get("why", ""), **evidence}


def stop_for_error(error: RunnerError) -> Dict[str, Any]:
    """The decision for a failure that happened before a state could be read (e.g. damage)."""
    said = quote(error.message, MESSAGE, 600)
    seen = {"source": "store", "what": said, "digest": None}  # what the store found: observed, not left unsettled
    return _stop(error.reason, said, {"observations": [seen], "inferences": [], "unknowns": []})


def _cmd(value: Any, placeholder: str) -> str:
    """An id as it goes into a command the runner names, or ``placeholder`` when it lacks the id form."""
    shown = name(value)
    return shown[1:-1] if shown.startswith("`") else placeholder


def _holder(view: Dict[str, Any]) -> str:
    return name(view["owner"]) if view.get("owner") is not None else "nobody"


def _item_context(state: Dict[str, Any], key: str) -> Dict[str, Any]:
    """The batch item an effect belongs to, with the ``why`` of settling it written here, from its fields."""
    context = _batch.item_context(state, key)
    if context and contract_of(state).effects.performs_effects:
        context["why"] = (f"`effect run {_cmd(key, 'KEY')}` (or `drive`) observes the target first and records what it "
                          "sees; it calls the target again only after an observed absence")
    return context


def _batch_why(state: Dict[str, Any], action: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """A batch step's action with its ``why`` written from the action's fields: item names and reasons quoted."""
    if action is None:
        return None
    step = action.get("step")
    if action.get("kind") == "finish-step":
        why = (f"every item of step {name(step)} is verified or skipped: `step done {_cmd(step, 'STEP')}` (the runner "
               "observes the evidence)")
    else:
        key = _cmd(action.get("key"), "KEY")
        item = f"item {number(action.get('index'))} of step {name(step)} ({quote(action.get('item'), ITEMS, 120)})"
        if action.get("state") == "failed":
            reason = (state["effects"].get(action.get("key")) or {}).get("reason")
            why = (f"{item} failed for good ({quote(reason, WORKER_OR_TARGET)}): decide whether to "
                   f"`effect skip {key} --reason TEXT`, or, once its cause is fixed, ask a person to run "
                   f"`effect reopen {key} --by NAME --reason TEXT`")
        elif contract_of(state).effects.performs_effects:
            why = f"perform {item}: `effect run {key}`"
        else:
            why = (f"perform {item}: `effect begin {key}` (its payload comes from the step's template; it prints it), "
                   "the call, `effect ack`, `effect verify`")
    return dict(action, why=why)


class _Facts(NamedTuple):
    """What one decision reads, and the evidence it gathers.

    ``ev`` holds the lists ``observations``, ``inferences`` and ``unknowns``:
    each check may append to them, and the decision returned carries those
    same lists. Every other field is only read.
    """

    state: Dict[str, Any]
    now: float
    owner: Optional[str]  # the worker asking; None for an observer, which is never fenced
    epoch: Optional[int]
    jobs: Dict[str, Dict[str, Any]]  # what was observed of each unsettled job, by key
    view: Dict[str, Any]  # the lease as seen at ``now`` (:func:`runner.ledger.lease.lease_view`)
    ev: Dict[str, List[Any]]


def _finished(facts: _Facts) -> Optional[Dict[str, Any]]:
    """A finished run is finished for whoever asks: no lease is needed to learn it."""
    status = facts.state["status"]
    if status not in ("complete", "cancelled"):
        return None
    said = "every step is done and every effect verified" if status == "complete" else "the run was cancelled"
    return _stop(status, said, facts.ev)


def _1_ownership(facts: _Facts) -> Optional[Dict[str, Any]]:
    """Check 1: the caller may act on the run.

    Another live holder stops it (``already-running``). A worker without the
    live lease at its epoch is ``fenced``; an observer (no owner) passes once
    no one else holds a live lease.
    """
    view, owner, epoch, ev = facts.view, facts.owner, facts.epoch, facts.ev
    if view["live"] and view["owner"] != owner:
        return _stop("already-running", f"{_holder(view)} holds the lease until {moment(view['expires_at'])}", ev)
    if owner is not None and epoch is None:
        held = (f"{name(owner)} holds the live lease at epoch {number(view['epoch'])}: "
                f"pass `--epoch {number(view['epoch'])}`"
                if view["live"] and view["owner"] == owner else "no live lease: `recover --owner OWNER` takes it")
        return _stop("fenced", f"{name(owner)} gave no epoch; {held} (or set RUNNER_EPOCH)", ev)
    if owner is not None and view["owner"] == owner and view["epoch"] == epoch and not view["live"]:
        return _stop("fenced", f"the lease of {name(owner)} at epoch {number(epoch)} "
                               f"expired at {moment(view['expires_at'])}; "
                               "`recover --owner OWNER` takes it at a new epoch", ev)
    if owner is not None and (view["owner"] != owner or view["epoch"] != epoch or not view["live"]):
        return _stop("fenced", f"{name(owner)} at epoch {number(epoch)} does not hold the live lease "
                               f"(epoch {number(view['epoch'])}, {_holder(view)}); "
                               "`recover --owner OWNER` takes it at a new epoch", ev)
    return None


def _3_effects_in_flight(facts: _Facts) -> Optional[Dict[str, Any]]:
    """Check 3: an unresolved effect is settled before anything else.

    The first uncertain one stops with ``needs-reconciliation`` and names
    what must be observed (at a target that cannot be read back, what a person
    looks at and the two commands, with ``--by``, that record what they saw);
    else the first unresolved one is reconciled.
    """
    state, ev = facts.state, facts.ev
    obs, inf, unk = ev["observations"], ev["inferences"], ev["unknowns"]
    unresolved = sorted((k, e) for k, e in state["effects"].items() if e.get("state") in UNRESOLVED)
    if not unresolved:
        return None
    obs.append({"source": "effects", "what": f"{len(unresolved)} unresolved effect(s)",
                "digest": content_digest({k: e["state"] for k, e in unresolved})})
    uncertain = [(k, e) for k, e in unresolved if e["state"] == "uncertain"]
    for key, effect in uncertain[:10]:
        unk.append(f"effect {name(key)} ({digest(effect.get('payload_digest'))}): outcome unknown since "
                   f"{moment(effect.get('updated_at'))}: {quote(effect.get('reason'), WORKER_OR_TARGET)}")
    if uncertain and not contract_of(state).effects.readable:
        key, effect = uncertain[0]
        return _stop(
            "needs-reconciliation",
            f"the target of effect {name(key)} (payload {digest(effect.get('payload_digest'))}) cannot be read back, "
            "so the runner never calls it again on its own: a person looks where its calls land (the channel, the "
            "recipients' mailboxes) for this item; then runs "
            f"`effect verify {_cmd(key, 'KEY')} --by NAME --evidence JSON` if it is there, or "
            f"`effect absent {_cmd(key, 'KEY')} --by NAME --evidence JSON` if it is not; then `drive` goes on",
            ev,
            check={"key": key, "payload_digest": effect["payload_digest"], "step": effect.get("step"),
                   "attempts": attempt_counts(effect)["attempts"], "readable": False, **_item_context(state, key)},
        )
    if uncertain:
        key, effect = uncertain[0]
        return _stop(
            "needs-reconciliation",
            f"observe the target for effect {name(key)} (payload {digest(effect.get('payload_digest'))}); then run "
            f"`effect verify {_cmd(key, 'KEY')} --evidence JSON` if it is there, "
            f"or `effect absent {_cmd(key, 'KEY')} --evidence JSON` if it is not",
            ev,
            check={"key": key, "payload_digest": effect["payload_digest"], "step": effect.get("step"),
                   "attempts": effect["attempts"], **_item_context(state, key)},
        )
    for key, effect in unresolved[:10]:
        if effect["state"] != "uncertain":
            unk.append(f"effect {name(key)} ({digest(effect.get('payload_digest'))}) is {word(effect['state'])}: "
                       "whether the target holds it is not known until it is observed")
    key, effect = unresolved[0]
    inf.append(f"effect {name(key)} was {word(effect['state'])} when its writer stopped: "
               "it may or may not have reached the target")
    action = {"kind": "reconcile", "key": key, "state": effect["state"], "payload_digest": effect["payload_digest"],
              "receipt": effect.get("receipt"),
              "why": f"observe the target for effect {name(key)} before anything else; "
                     "record what you see with `effect verify` or `effect absent`",
              **_item_context(state, key)}
    return _act(action, ev)


def _4_jobs(facts: _Facts) -> Optional[Dict[str, Any]]:
    """Check 4: the first unsettled job decides.

    Unobserved, it is checked; running, waited for; finished, read;
    vanished, rerun where the contract allows it and the run is not
    cancelled, else ``needs-reconciliation``.
    """
    state, ev = facts.state, facts.ev
    obs, inf, unk = ev["observations"], ev["inferences"], ev["unknowns"]
    for key, job in sorted(state["jobs"].items()):
        if job["state"] not in _jobs.UNSETTLED:
            continue
        seen = facts.jobs.get(key)
        if seen is None:
            unk.append(f"job {name(key)} ({word(job['state'])}) was not observed")
            return _act({"kind": "check-job", "key": key,
                         "why": f"observe job {name(key)} (`job status {_cmd(key, 'KEY')}`) before deciding"}, ev)
        obs.append({"source": f"job {name(key)}", "what": word(seen["status"]),
                    "digest": seen.get("log_sha256") or content_digest(seen)})
        if seen["status"] == "running":
            inf.append(f"job {name(key)} is still running (pid {number(seen.get('pid'))}, start time matches): "
                       "re-attach and wait")
            return _act({"kind": "wait-job", "key": key, "pid": seen.get("pid"),
                         "why": "the job is still running; wait for it, then read its result"}, ev)
        if seen["status"] == "finished":
            inf.append(f"job {name(key)} finished with exit code {number(seen['exit_code'])}: "
                       "read its result, do not rerun it")
            return _act({"kind": "read-job", "key": key, "exit_code": seen["exit_code"],
                         "why": "record the finished job's result (`job status`, `job result`)"}, ev)
        if job["state"] == "cancel-requested":
            return _act({"kind": "check-job", "key": key,
                         "why": "the cancelled job is gone: record that it stopped (`job status`)"}, ev)
        if contract_of(state).jobs.rerun_vanished and not state["observations"].get("cancellation"):
            inf.append(f"job {name(key)} vanished without an exit code; "
                       f"the contract allows a rerun from shard {number(job.get('cursor', 0))}")
            return _act({"kind": "rerun-job", "key": key, "cursor": job.get("cursor", 0), "command": job["command"],
                         "why": "rerun the vanished job (`job submit` with the same key and command)"}, ev)
        unk.append(f"job {name(key)} vanished without an exit code")
        return _stop("needs-reconciliation",
                     f"job {name(key)} vanished and the contract does not allow a rerun: check what it left behind", ev)
    return None


def _5_authority(facts: _Facts) -> Optional[Dict[str, Any]]:
    """Check 5: the run's authority holds.

    A cancellation stops the run; then the oldest pending request of this
    plan awaits a person; then a denied request stops, when it is the newest
    for its step and action and the step is not done (a grant made after a
    denial is the current answer).
    """
    state, now, ev = facts.state, facts.now, facts.ev
    cancellation = state["observations"].get("cancellation")
    if cancellation or state["status"] == "cancelled":
        what = (f"by {name(cancellation.get('by'))} at {moment(cancellation.get('at'))}: "
                f"{quote(cancellation.get('reason'), PERSON)}"
                if isinstance(cancellation, dict) else "status cancelled")
        ev["observations"].append({"source": "cancellation", "what": what, "digest": content_digest(cancellation)})
        return _stop("cancelled", "the run was cancelled; no new step or effect may begin", ev)
    if state["status"] == "complete":
        return _stop("complete", "every step is done and every effect verified", ev)
    approvals = state["observations"]["approvals"]
    pending = sorted((rid for rid, a in approvals.items()
                      if a["state"] == "pending" and a["plan_digest"] == state["plan_digest"]
                      and parse_time(a["expires_at"]) > now),
                     key=request_order)
    if pending:
        rid = pending[0]
        req = approvals[rid]
        ev["observations"].append({"source": f"approval {name(rid)}",
                                   "what": f"pending for {name(req['action'])} in step {name(req['step'])}",
                                   "digest": req["payload_digest"]})
        return _stop("awaiting-approval", f"request {name(rid)} ({name(req['action'])}) awaits a person: "
                                          f"`approval grant {_cmd(rid, 'REQUEST_ID')} --by NAME`",
                     ev, request_id=rid)
    for rid in sorted(newest_requests(state).values(), key=request_order):
        req = approvals[rid]
        if req["state"] == "denied" and (state["steps"].get(req["step"]) or {}).get("state") != "done":
            ev["inferences"].append(f"request {name(rid)} for {name(req['action'])} was denied by {name(req['by'])}")
            return _stop("awaiting-approval", f"{name(req['action'])} was denied by {name(req['by'])}; "
                                              "a new request, a plan change or a cancellation is needed",
                         ev, request_id=rid)
    return None


def _6_limits(facts: _Facts) -> Optional[Dict[str, Any]]:
    """Check 6: no limit is spent.

    A blocked run stops as its stop was recorded (``failed`` or
    ``limit-exhausted``); so does a run whose run-wide limit is spent at
    ``now``.
    """
    state, ev = facts.state, facts.ev
    if state["status"] == "blocked":
        stop = state.get("next_action") or {}
        recorded = f"; recorded: {quote(stop['detail'], RECORD, 160)}" if stop.get("detail") else ""
        if stop.get("reason") == "failed":
            step = stop.get("step")
            return _stop("failed", f"step {name(step)} failed for good{recorded}", ev, step=step)
        limit = stop.get("limit")
        return _stop("limit-exhausted", f"limit {name(limit)} is spent{recorded}", ev, limit=limit)
    try:
        check_limits(state, facts.now)
    except LimitExhausted as exc:
        spent = exc.context.get("limit")
        return _stop("limit-exhausted", f"limit {name(spent)} is spent: {quote(exc.message, MESSAGE, 300)}", ev,
                     limit=spent)
    return None


def _7_running_step(facts: _Facts) -> Optional[Dict[str, Any]]:
    """Check 7, first half: the running step goes on.

    It is finished by the holder that started it and resumed by any other,
    its artifact checked, never assumed. Inside a batch step the action is
    its next item, or finishing the step.
    """
    state, ev = facts.state, facts.ev
    current = state.get("current_step")
    if not current:
        return None
    spec = contract_of(state).step(current) or StepSpec(current)
    record = state["steps"].get(current) or {}
    same_holder = started_by_holder(state, record)
    step_arg = _cmd(current, "STEP")
    evidence = joined(spec.evidence, RECORD, "the evidence")
    action = {"kind": "finish-step" if same_holder else "resume-step", "step": current,
              "artifact": spec.artifact, "check": spec.check, "evidence": list(spec.evidence),
              "why": f"{'produce and check' if same_holder else 'check'} the artifact of step {name(current)}; "
                     f"then `step done {step_arg} --evidence JSON` with {evidence}, "
                     f"or `step fail {step_arg} --class ... --error ...`"}
    if spec.approval:
        _step_approval(facts, current, action)
    if not same_holder:
        ev["inferences"].append(f"step {name(current)} was running when its worker stopped; "
                                "its artifact must be checked, not assumed")
    if record.get("batch"):
        changed = _batch.items_changed(state, current)
        if changed:
            # The listing's own words may name files of the project: they are quoted.
            what = changed["what"] if "added" in changed else quote(changed["what"], ITEMS, 300)
            changed = dict(changed, source=f"items of step {name(current)}", what=what)
            ev["observations"].append(changed)
            ev["unknowns"].append(f"step {name(current)}: {what}")
        action = _batch_why(state, _batch.next_action(state, current)) or action
    return _act(action, ev)


def _step_approval(facts: _Facts, current: str, action: Dict[str, Any]) -> None:
    """Say in ``action`` how the effect of ``current``, a step that needs approval, is approved.

    With the grant it may use, else by asking for one; nothing is added once
    an effect of the step is verified.
    """
    state, now = facts.state, facts.now
    if any(e.get("step") == current and e.get("state") == "verified" for e in state["effects"].values()):
        return
    approvals = state["observations"]["approvals"]
    # Usable as the gate of `effect begin` judges it: granted and unexpired, or used by an effect it may send again.
    granted = [rid for rid in sorted(newest_requests(state).values(), key=request_order)
               if approvals[rid]["step"] == current
               and find_grant(state, current, approvals[rid]["action"], approvals[rid]["payload_digest"], now,
                              approvals[rid].get("used_by"))[0] == rid]
    if not granted:
        action["approval"] = (f"this step's effect needs a grant bound to its exact payload: "
                              f"`approval request {_cmd(current, 'STEP')} "
                              "--action effect:KEY --payload FILE --ttl SECONDS`, "
                              "a person's `approval grant`, then `effect begin KEY --payload FILE`, the call, "
                              "`effect ack`, `effect verify`")
        return
    rid = granted[-1]
    req = approvals[rid]
    facts.ev["observations"].append({"source": f"approval {name(rid)}",
                                     "what": f"granted by {name(req['by'])} for {name(req['action'])} "
                                             f"in step {name(current)}",
                                     "digest": req["payload_digest"]})
    action["grant"] = {"request_id": rid, "action": req["action"], "payload_digest": req["payload_digest"],
                       "payload_file": req.get("payload_file")}
    granted_key = req["action"][len("effect:"):] if str(req["action"]).startswith("effect:") else None
    action["approval"] = (f"request {name(rid)} grants {name(req['action'])} "
                          f"for payload {digest(req['payload_digest'])}: "
                          f"`effect begin {_cmd(granted_key, 'KEY')} --payload FILE` "
                          "with exactly that payload, the call, "
                          "`effect ack`, `effect verify`")


def _7_next_step(facts: _Facts) -> Dict[str, Any]:
    """Check 7, second half: the first step not done is started, or its persisted backoff waited out.

    With every step done, the action is ``complete``. It always decides.
    """
    state, ev = facts.state, facts.ev
    for spec in plan_steps(state):
        record = state["steps"].get(spec.id) or {}
        if record.get("state") == "done":
            continue
        when = record.get("next_attempt_at")
        if when and parse_time(when) > facts.now:
            ev["inferences"].append(f"step {name(spec.id)} failed transiently; "
                                    f"its persisted backoff ends at {moment(when)}")
            return _act({"kind": "wait", "until": when, "then": {"kind": "start-step", "step": spec.id},
                         "why": "wait out the backoff, then start the step again"}, ev)
        action = {"kind": "start-step", "step": spec.id, "artifact": spec.artifact, "check": spec.check,
                  "evidence": list(spec.evidence),
                  "why": f"start step {name(spec.id)} (`step start {_cmd(spec.id, 'STEP')}`)"}
        if spec.approval:
            action["approval"] = "effects of this step need a grant bound to their exact payload"
        return _act(action, ev)
    return _act({"kind": "complete", "why": "every step is done; record completion"}, ev)


#: The checks :func:`decide` makes, in the order of the module docstring; the first that decides ends it, and
#: :func:`_7_next_step`, which always decides, comes after them. Check 2, integrity, is none of them: the store
#: refuses damaged state before there is a state to decide over, and :func:`stop_for_error` is that decision.
_CHECKS: Tuple[Callable[[_Facts], Optional[Dict[str, Any]]], ...] = (
    _finished, _1_ownership, _3_effects_in_flight, _4_jobs, _5_authority, _6_limits, _7_running_step)


def decide(state: Dict[str, Any], now: float, owner: Optional[str] = None, epoch: Optional[int] = None,
           job_observations: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The one next action (or stop) the durable facts allow. Pure: reads, never writes.

    The checks of :data:`_CHECKS` are made in order over the facts
    :func:`_observed` gathers; the first that decides ends it.

    :param owner: the worker asking, with its fencing ``epoch``; None for an observer.
    :param job_observations: what was observed of each unsettled job, by key (:func:`refresh_jobs`).
    """
    facts = _observed(state, now, owner, epoch, job_observations or {})
    for check in _CHECKS:
        decision = check(facts)
        if decision is not None:
            return decision
    return _7_next_step(facts)


def _observed(state: Dict[str, Any], now: float, owner: Optional[str], epoch: Optional[int],
              jobs: Dict[str, Dict[str, Any]]) -> _Facts:
    """The facts of one decision, with what it observes first: the state, the plan, steps' evidence, the lease."""
    ev: Dict[str, List[Any]] = {"observations": [], "inferences": [], "unknowns": []}
    obs = ev["observations"]
    obs.append({"source": "state", "what": f"revision {number(state['revision'])}, status {word(state['status'])}",
                "digest": state["head"], "at": state["updated_at"]})
    obs.append({"source": "plan", "what": f"plan of task {name(state['task_id'])}", "digest": state["plan_digest"]})
    obs.extend(evidence_observations(state))
    view = lease_view(state, now)
    obs.append({"source": "lease", "what": f"held by {_holder(view)} at epoch {number(view['epoch'])}, "
                                           f"{'live' if view['live'] else 'not live'}",
                "digest": content_digest(state["lease"])})
    return _Facts(state, now, owner, epoch, jobs, view, ev)


def recover(run: Any, owner: str, ttl: float, adapters: Optional[Dict[str, Adapter]] = None,
            adapter_for: Optional[Callable[[str, Dict[str, Any]], Optional[Adapter]]] = None,
            payloads: Optional[Callable[[str], Optional[Dict[str, Any]]]] = None) -> Dict[str, Any]:
    """Run the recovery procedure on ``run`` (a :class:`runner.execution.run.Run`) and persist the intent.

    Takes the lease (or returns ``already-running``), reconciles every
    unresolved effect through an adapter where one is given (``adapter_for(key,
    effect)`` and ``payloads(key)`` supply it and the original payload) with
    :meth:`runner.execution.executor.Executor.reconcile`, which waits for a call of the
    key still in flight and never calls the target to make the effect;
    observes jobs, decides, and commits the decision as ``next_action``.
    """
    from ..base.errors import AlreadyRunning

    try:
        run.acquire(owner, ttl)
    except AlreadyRunning as exc:
        view = lease_view(run.state, run.clock())
        said = (f"{_holder(view)} holds the lease until {moment(view['expires_at'])}" if view["live"]
                else quote(exc.message, MESSAGE, 300))
        return _stop("already-running", said, {"observations": [{"source": "lease", "what": said, "digest": None}],
                                               "inferences": [], "unknowns": []})
    reconciled: List[str] = []
    executor = None
    for key, effect in sorted(run.state["effects"].items()):
        if effect.get("state") not in UNRESOLVED:
            continue
        adapter = adapter_for(key, effect) if adapter_for else (adapters or {}).get(key)
        payload = payloads(key) if payloads else None
        if adapter is None or payload is None:
            continue
        from .executor import Executor

        executor = executor or Executor(run)
        try:
            record = executor.reconcile(key, payload, adapter)
        except NeedsReconciliation:
            continue  # recorded as uncertain; decide() names it
        reconciled.append(f"{name(key)}: {record.get('state')}")
    observed = refresh_jobs(run)
    decision = decide(run.state, run.clock(), run.owner, run.epoch, observed)
    if reconciled:
        decision["observations"].append({"source": "adapters", "what": "; ".join(reconciled[:20]), "digest": None})
    maker = local_maker()
    run._mutate(lambda s, now: _intent_ops(s, decision, now, maker))
    return decision


def refresh_jobs(run: Any) -> Dict[str, Dict[str, Any]]:
    """Observe every job that is not settled and commit what changed."""
    seen: Dict[str, Dict[str, Any]] = {}
    for key, job in sorted(run.state["jobs"].items()):
        if job["state"] in _jobs.UNSETTLED:
            seen[key] = _jobs.observe_job(run.store.path, job)
            run._mutate(lambda s, now, k=key, o=seen[key]: _jobs.observation_ops(s, k, o, now))
    return seen


def _intent_ops(state: Dict[str, Any], decision: Dict[str, Any], now: float,
                maker: Optional[Dict[str, Any]] = None) -> List[List[Any]]:
    """Persist the chosen action (or stop) before anything runs, and the authority that was refreshed, with who
    refreshed it."""
    intent = decision["action"] if decision["decision"] == "act" else {"kind": "stop", "reason": decision["reason"],
                                                                       "detail": decision["detail"]}
    if state["status"] == "blocked":
        intent = state["next_action"]
    ops: List[List[Any]] = []
    if intent != state.get("next_action"):
        ops.append(["set", ["next_action"], intent])
    ops.append(["set", ["observations", "authorization", f"r{state['revision'] + 1}"], {
        "source": "recover",
        "at": format_time(now),
        "owner": state["lease"]["owner"],
        "epoch": state["lease"]["epoch"],
        "cancelled": bool(state["observations"].get("cancellation")),
        "decision": decision["decision"],
        "reason": decision["reason"],
        **({"host": maker.get("host"), "uid": maker.get("uid")} if maker else {}),
    }])
    return ops
