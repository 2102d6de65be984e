"""``effect run`` and ``drive``: the runner performs the actions it can establish alone.

:func:`perform_effect` is one effect's whole lifecycle through the contract's
invoke and observe commands (or commands given inline): intent, started,
invoke, acknowledged, observe, verified. It is
:func:`runner.effects.drive_effect` over a
:class:`runner.commands.CommandAdapter`, so a rerun in any intermediate state
observes first and invokes again only after an observed absence and within
the attempt bound, and a timeout is an unknown outcome, never a failure.

:func:`drive` loops: decide (the same pure :func:`runner.recovery.decide`
that ``next`` prints), perform the action if it is one the runner can
establish alone (a batch item's effect, reconciling an item, starting a
step whose evidence the runner observes, finishing a batch or checked step),
renew the lease, repeat; it returns at the first stop, or at an action that
needs judgement (handed over with exit 0, as ``next`` would). Inside a batch
step it walks the frozen items with a cursor instead of deciding afresh for
each item, so the cost of one item does not grow with the batch: the store
stays open in this process and every transition still checks cancellation,
approvals, limits and the fence under the store's lock.
"""

import time
from typing import IO, Any, Callable, Dict, Optional, Sequence

from . import batch as _batch
from .commands import DEFAULT_TIMEOUT, CommandAdapter
from .errors import EXIT_CODES, InvalidInput, RunnerError
from .recovery import decide, decision_exit_code, recover, refresh_jobs

__all__ = ["perform_effect", "adapter_for", "drive"]


def adapter_for(state: Dict[str, Any], key: str, invoke: Optional[Sequence[str]] = None,
                observe: Optional[Sequence[str]] = None, runner: Optional[Callable[..., Any]] = None) -> CommandAdapter:
    """The command adapter for ``key``: inline commands, else the contract's; item placeholders filled."""
    effects = state["plan"].get("effects", {})
    invoke = list(invoke) if invoke else effects.get("invoke")
    observe = list(observe) if observe else effects.get("observe")
    if not invoke or not observe:
        raise InvalidInput("effect run needs an invoke and an observe command: the contract's effects.invoke and effects.observe, "
                           "or '-- COMMAND ... --observe -- COMMAND ...'")
    values: Dict[str, Any] = {"run_id": state["task_id"]}
    root = _batch.workspace_root(state["plan"])
    found = _batch.owner_of(state, key)
    if found is not None:
        step, index = found
        record = state["steps"][step]
        root = record.get("workspace") or root
        values.update(_batch.item_values(record["batch"]["items"][index], index))
    values["workspace"] = root
    return CommandAdapter(invoke, observe, values=values, cwd=root, timeout=float(effects.get("timeout_seconds", DEFAULT_TIMEOUT)), runner=runner)


def perform_effect(run: Any, key: str, payload: Optional[Dict[str, Any]] = None, invoke: Optional[Sequence[str]] = None,
                   observe: Optional[Sequence[str]] = None, sleep: Callable[[float], None] = time.sleep,
                   runner: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Take ``key`` to verified with commands; a batch item's payload comes from its step's template.

    :raises NeedsReconciliation: the outcome cannot be established by observing.
    :raises InvalidInput: no payload, no commands, or another payload under the key.
    """
    state = run.state
    found = _batch.owner_of(state, key)
    step = found[0] if found else None
    if payload is None:
        if found is None:
            raise InvalidInput(f"effect run {key}: pass --payload FILE (the key is not an item of a started batch step)")
        payload = _batch.item_payload(state, found[0], found[1])
    adapter = adapter_for(state, key, invoke, observe, runner)
    return dict(run.drive_effect(key, payload, adapter, step=step, sleep=sleep))


class _Progress:
    """One line on stderr now and then: items done of total, rate, effects reconciled."""

    def __init__(self, stream: Optional[IO[str]], clock: Callable[[], float], every: float = 2.0) -> None:
        self.stream, self.clock, self.every = stream, clock, every
        self.began = clock()
        self.last = self.began

    def show(self, step: str, done: int, total: int, performed: int, reconciled: int, final: bool = False) -> None:
        if self.stream is None:
            return
        now = self.clock()
        if not final and now - self.last < self.every:
            return
        self.last = now
        rate = performed / max(now - self.began, 1e-9)
        self.stream.write(f"drive: {step} {done}/{total} items | {rate:.1f} items/s | {reconciled} reconciled\n")
        self.stream.flush()


def drive(run: Any, owner: str, *, ttl: float, max_actions: Optional[int] = None, until_stop: bool = False,
          progress: Optional[IO[str]] = None, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep, runner: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Perform actions until a stop, an action that needs judgement, or ``max_actions``.

    Takes the lease as ``owner`` (the recovery procedure), then loops. With
    ``until_stop`` it also waits out persisted backoffs. Returns the last
    decision with ``exit_code`` (that of the stop, 0 for a handed-over or
    unfinished action) and the tally.

    :param clock: monotonic seconds, for lease renewal and the progress line.
    :param runner: runs one command (default :func:`runner.commands.run_command`).
    """
    tally: Dict[str, Any] = {"actions": 0, "effects": 0, "reconciled": 0, "steps_started": 0, "steps_done": 0}
    shown = _Progress(progress, clock)
    decision = recover(run, owner, ttl)
    renew_at = clock() + ttl / 3

    def renew() -> None:
        nonlocal renew_at
        if clock() >= renew_at:
            run.renew(ttl)
            renew_at = clock() + ttl / 3

    def out(decision: Dict[str, Any], code: Optional[int] = None, handed_over: bool = False) -> Dict[str, Any]:
        code = decision_exit_code(decision) if code is None else code
        return dict(decision, exit_code=code, handed_over=handed_over, tally=tally)

    def budget_left() -> bool:
        return max_actions is None or tally["actions"] < max_actions

    try:
        while True:
            if decision["decision"] == "stop":
                check = decision.get("check") or {}
                ours = "invoke" in run.state["plan"].get("effects", {}) and bool(check.get("key")) and _batch.owner_of(run.state, check["key"])
                if decision["reason"] == "needs-reconciliation" and ours and budget_left():
                    key = check["key"]
                    perform_effect(run, key, sleep=sleep, runner=runner)  # observes first; raises if still unknown
                    tally["actions"] += 1
                    tally["reconciled"] += 1
                else:
                    return out(decision)
            else:
                if not budget_left():
                    return out(decision, 0)
                action = decision["action"]
                kind = action["kind"]
                if kind == "reconcile" and _batch.owner_of(run.state, action["key"]) and "invoke" in run.state["plan"].get("effects", {}):
                    perform_effect(run, action["key"], sleep=sleep, runner=runner)
                    tally["actions"] += 1
                    tally["reconciled"] += 1
                elif kind == "effect" and "invoke" in run.state["plan"].get("effects", {}):
                    _walk_items(run, action["step"], action["index"], tally, budget_left, renew, shown, sleep, runner)
                elif kind == "start-step" and _observes_itself(run.state, action["step"]):
                    run.step_start(action["step"])
                    tally["actions"] += 1
                    tally["steps_started"] += 1
                elif kind in ("finish-step", "resume-step") and _observes_itself(run.state, action["step"]):
                    try:
                        run.step_done(action["step"], {})
                    except InvalidInput as exc:
                        if not (exc.context.get("check") or exc.context.get("artifact")):
                            raise
                        # The artifact is not there yet or its check fails: whoever makes it acts next.
                        return out(dict(decision, detail=exc.message), 0, handed_over=True)
                    tally["actions"] += 1
                    tally["steps_done"] += 1
                elif kind == "wait" and until_stop:
                    from .envelope import parse_time

                    sleep(max(0.0, parse_time(action["until"]) - run.clock()))
                else:
                    return out(decision, 0, handed_over=True)
            renew()
            decision = decide(run.state, run.clock(), run.owner, run.epoch, refresh_jobs(run) if run.state["jobs"] else {})
    except RunnerError as exc:
        failed = {"decision": "stop", "action": None, "reason": exc.reason, "error": exc.reason, "detail": exc.message,
                  "observations": [], "inferences": [], "unknowns": [exc.message]}
        if exc.context:
            failed["context"] = exc.context
        return out(failed, EXIT_CODES.get(exc.reason, exc.exit_code))
    finally:
        try:
            step = run.state.get("current_step")
            info = _batch.progress(run.state, step) if step else None
        except RunnerError:  # the store lost its state (an I/O error): the error itself is what matters
            info = None
        if info:
            shown.show(step, info["verified"] + info["skipped"], info["total"], tally["effects"], tally["reconciled"], final=True)


def _observes_itself(state: Dict[str, Any], step: str) -> bool:
    spec = next((s for s in state["plan"].get("steps", []) if s["id"] == step), {})
    return _batch.observes_itself(spec)


def _walk_items(run: Any, step: str, start: int, tally: Dict[str, Any], budget_left: Callable[[], bool], renew: Callable[[], None],
                shown: _Progress, sleep: Callable[[float], None], runner: Optional[Callable[..., Any]]) -> None:
    """Perform the frozen items of ``step`` from ``start`` on, in order, each in O(1) bookkeeping."""
    state = run.state
    record = state["steps"][step]
    batch = record["batch"]
    keys = _batch.keys_of(batch)[0]
    skipped = batch.get("skipped", {})
    effects = state["effects"]
    total = len(keys)
    done = total - ((_batch.progress(state, step) or {}).get("remaining") or 0)
    for index in range(start, total):
        key = keys[index]
        if key in skipped or (effects.get(key) or {}).get("state") == "verified":
            continue
        if not budget_left():
            return
        was = (effects.get(key) or {}).get("state")
        perform_effect(run, key, sleep=sleep, runner=runner)
        tally["actions"] += 1
        tally["effects"] += 1
        if was is not None and was != "absent":
            tally["reconciled"] += 1
        done += 1
        shown.show(step, done, total, tally["effects"], tally["reconciled"])
        renew()
        effects = run.state["effects"]
    return None
