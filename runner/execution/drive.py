"""``effect run`` and ``drive``: the runner performs the actions it can establish alone.

:func:`perform_effect` is one effect's whole lifecycle through the contract's
invoke and observe commands (or commands given inline): intent, started,
invoke, acknowledged, observe, verified. It is the executor
(:class:`runner.execution.executor.Executor`) over a
:class:`runner.adapters.commands.CommandAdapter`, so a rerun in any intermediate state
waits for a call of the key still in flight, observes first, invokes again
only after an observed absence and within the attempt bound, and a timeout
is an unknown outcome, never a failure.

A :class:`Driver` loops: decide (the same pure :func:`runner.execution.recovery.decide`
that ``next`` prints), perform the action if it is one the runner can
establish alone (a batch item's effect, reconciling an item, starting a
step whose evidence the runner observes, finishing a batch or checked step),
renew the lease, repeat; it returns at the first stop, or at an action that
needs judgement (handed over with exit 0, as ``next`` would), and releases
the lease whenever it returns. What it is given (:class:`DriveOptions`, its
executor) cannot disagree: it refuses an executor of another run or one
that renews the lease for another time. Inside a batch step it walks
the frozen items with a cursor instead of deciding afresh for each item, so
the cost of one item does not grow with the batch: the store stays open in
this process and every transition still checks cancellation, approvals,
limits and the fence under the store's lock.
"""

import time
from typing import IO, Any, Callable, Dict, Iterator, NamedTuple, Optional, Sequence

from ..ledger import batch as _batch
from ..adapters.factory import adapter_for
from ..contract.spec import contract_of
from .payloads import begin_payload, item_payload
from ..base.times import parse_time
from ..base.canonical import content_digest
from ..base.errors import EXIT_CODES, InvalidInput, RunnerError, Stopped
from .executor import Executor, Job, ThreadWorld
from .flow import flow_for
from ..ledger.states import UNRESOLVED
from ..ledger.costs import spend_line
from ..base.quoting import name, number
from .recovery import decide, decision_exit_code, recover, refresh_jobs
from ..calls.target import Adapter

__all__ = ["perform_effect", "Driver", "DriveOptions", "AdapterFactory"]


def perform_effect(run: Any, key: str, payload: Optional[Dict[str, Any]] = None, invoke: Optional[Sequence[str]] = None,
                   observe: Optional[Sequence[str]] = None, sleep: Optional[Callable[[float], None]] = None,
                   runner: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """Take ``key`` to verified with commands; a batch item's payload comes from its step's template.

    :raises NeedsReconciliation: the outcome cannot be established by observing.
    :raises InvalidInput: no payload, no commands, another payload under the key, or (for a
        batch item) another payload than its template makes.
    """
    state = run.state
    found = _batch.owner_of(state, key)
    step = found[0] if found else None
    payload = begin_payload(state, key, payload)
    adapter = adapter_for(state, key, invoke, observe, runner)
    return dict(Executor(run, world=ThreadWorld(sleep)).perform(key, payload, adapter, step))


class _Progress:
    """One line on stderr now and then: items done of total, calls in flight (those that may create; lookups apart),
    rate, waits for the target, time left."""

    def __init__(self, stream: Optional[IO[str]], clock: Callable[[], float], every: float = 2.0) -> None:
        self.stream, self.clock, self.every = stream, clock, every
        self.began = clock()
        self.last = self.began

    def due(self) -> bool:
        """Whether the next line is due (its figures need only be made then)."""
        return self.stream is not None and self.clock() - self.last >= self.every

    def show(self, step: str, done: int, total: int, performed: int, reconciled: int, figures: Dict[str, int],
             final: bool = False, spent: str = "") -> None:
        if self.stream is None:
            return
        now = self.clock()
        if not final and now - self.last < self.every:
            return
        self.last = now
        rate = performed / max(now - self.began, 1e-9)
        left = f" | {(total - done) / rate:.0f} s left" if rate > 0 and done < total and not final else ""
        waits = f" | {figures['not_now']} 'not now'" if figures.get("not_now") else ""
        looking = f", {figures['looking']} lookups" if figures.get("looking") else ""
        spent = f" | {spent}" if spent else ""
        self.stream.write(f"drive: {step} {done}/{total} items | {figures.get('in_flight', 0)} calls in flight{looking}"
                          f" | {rate:.1f} items/s | {reconciled} reconciled{waits}{spent}{left}\n")
        self.stream.flush()


class DriveOptions(NamedTuple):
    """How a :class:`Driver` drives. Each field is used: none is overridden by anything else it is given."""

    ttl: float  # the lease's time to live: recovery takes the lease for it, and the executor renews it for as long
    max_actions: Optional[int] = None  # return (exit 0) after this many actions; None: no bound
    until_stop: bool = False  # also wait out persisted backoffs instead of returning at them
    progress: Optional[IO[str]] = None  # where the progress line goes; None: nowhere
    clock: Callable[[], float] = time.monotonic  # monotonic seconds, for the progress line


#: What makes the adapter of an effect: ``adapters(state, key)``, as :func:`adapter_for` does.
AdapterFactory = Callable[[Dict[str, Any], str], Adapter]


class Driver:
    """``drive``: perform actions until a stop, an action that needs judgement, or ``max_actions``.

    :meth:`drive` takes the lease as ``owner`` (the recovery procedure), then
    loops; ``executor`` performs every effect, as many at once as its flow
    allows, and keeps the lease alive while calls run. After a crash, the
    items that were in flight are reconciled together, within the same
    bounds. With ``until_stop`` it also waits out persisted backoffs. Once
    ``executor.stop_requested`` is set (a signal), nothing new begins: the
    call or check in hand is recorded and the drive ends with exit 15. It
    releases the lease whenever it returns. A driver drives once.

    The executor is the driver's own, of the same run, renewing the lease for
    ``options.ttl``; :meth:`with_new_executor` makes one so. ``adapters``
    makes each effect's adapter (default :func:`adapter_for`).

    :raises ValueError: the executor is of another run, or renews the lease for another time than ``options.ttl``.
    """

    def __init__(self, run: Any, owner: str, executor: Executor, options: DriveOptions,
                 adapters: AdapterFactory = adapter_for) -> None:
        if executor.run is not run:
            raise ValueError("the executor performs the effects of another run than the one driven")
        if executor.ttl != options.ttl:
            raise ValueError(f"the executor renews the lease for {executor.ttl} s, "
                             f"and the drive would take it for {options.ttl} s: give both the same")
        self.run: Any = run  # a Run: the executor needs less of it (RunLike) than the drive does
        self.owner, self.executor, self.options, self.adapters = owner, executor, options, adapters
        self.tally: Dict[str, Any] = {"actions": 0, "effects": 0, "reconciled": 0, "found_first": 0, "steps_started": 0,
                                      "steps_done": 0}
        self.shown = _Progress(options.progress, options.clock)

    @classmethod
    def with_new_executor(cls, run: Any, owner: str, options: DriveOptions, *, parallel: Optional[int] = None,
                          sleep: Optional[Callable[[float], None]] = None,
                          adapters: AdapterFactory = adapter_for) -> "Driver":
        """A driver with an executor of its own, which renews the lease for ``options.ttl``.

        :param parallel: effects in flight at once (default: the contract's ``effects.concurrency``, else 1).
        :param sleep: how waits with no call running pass (default: on the executor's queue, which a signal wakes).
        """
        flow = flow_for(run.state, parallel, run.clock())
        return cls(run, owner, Executor(run, world=ThreadWorld(sleep), ttl=options.ttl, flow=flow), options, adapters)

    def drive(self) -> Dict[str, Any]:
        """Drive until a stop, an action that needs judgement, or ``max_actions``; the lease is given back.

        Returns the last decision with ``exit_code`` (that of the stop, 0 for
        an action handed over or left unfinished), ``handed_over`` and the
        ``tally``.

        :raises RunnerError: what the recovery procedure raises before the lease is taken.
        """
        run, executor = self.run, self.executor
        decision = recover(run, self.owner, self.options.ttl)
        try:
            while True:
                if executor.stop_requested:
                    raise Stopped("asked to stop: nothing begins after the action in hand, which was recorded")
                ended = self._stopped(decision) if decision["decision"] == "stop" else self._act(decision)
                if ended is not None:
                    return ended
                executor.keep_lease()
                seen_jobs = refresh_jobs(run) if run.state["jobs"] else {}
                decision = decide(run.state, run.clock(), run.owner, run.epoch, seen_jobs)
        except RunnerError as exc:
            # What stopped it is known: the error, observed here; nothing is left unsettled by it.
            failed: Dict[str, Any] = {"decision": "stop", "action": None, "reason": exc.reason, "error": exc.reason,
                                      "detail": exc.message, "observations": [{"source": "drive", "what": exc.message}],
                                      "inferences": [], "unknowns": []}
            if exc.context:
                failed["context"] = exc.context
            return self._out(failed, EXIT_CODES.get(exc.reason, exc.exit_code))
        finally:
            self._last_progress()

    def _budget_left(self) -> bool:
        return self.options.max_actions is None or self.tally["actions"] < self.options.max_actions

    def _stopped(self, decision: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """A stop ends the drive, but for a batch item's unknown outcome that this drive may settle by observing."""
        run = self.run
        check = decision.get("check") or {}
        ours = (contract_of(run.state).effects.performs_effects and bool(check.get("key"))
                and _batch.owner_of(run.state, check["key"]))
        if decision["reason"] == "needs-reconciliation" and ours and self._budget_left():
            # Observed first (raises if still unknown), with the rest of what was in flight, together.
            self._walk_items(ours[0], _first_unresolved(run.state, ours[0]))
            return None
        return self._out(decision)

    def _act(self, decision: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Perform an action the runner can establish alone (None: go on), or end the drive handing it over."""
        run, tally = self.run, self.tally
        if not self._budget_left():
            return self._out(decision, 0)
        action = decision["action"]
        kind = action["kind"]
        found = _batch.owner_of(run.state, action["key"]) if kind == "reconcile" else None
        if found and contract_of(run.state).effects.performs_effects:
            # What was in flight when the last holder stopped: reconciled together, from the first of it on.
            self._walk_items(found[0], _first_unresolved(run.state, found[0]))
        elif kind == "effect" and contract_of(run.state).effects.performs_effects:
            self._walk_items(action["step"], action["index"])
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
                return self._out(dict(decision, detail=exc.message), 0, handed_over=True)
            tally["actions"] += 1
            tally["steps_done"] += 1
        elif kind == "wait" and self.options.until_stop:
            self.executor.world.wait(max(0.0, parse_time(action["until"]) - run.clock()))  # a signal ends it early
        else:
            return self._out(decision, 0, handed_over=True)
        return None

    def _out(self, decision: Dict[str, Any], code: Optional[int] = None, handed_over: bool = False) -> Dict[str, Any]:
        """What the drive returns, the lease given back first."""
        run = self.run
        if _give_back(run):  # what the decision observed of the lease no longer holds: say what does
            said = {"source": "lease",
                    "what": f"released by {name(run.owner)} at epoch {number(run.epoch)} as drive returned",
                    "digest": content_digest(run.state["lease"])}
            observations = [said if o.get("source") == "lease" else o for o in decision.get("observations", [])]
            decision = dict(decision, observations=observations)
        code = decision_exit_code(decision) if code is None else code
        return dict(decision, exit_code=code, handed_over=handed_over, tally=self.tally)

    def _last_progress(self) -> None:
        """The final progress line of the step in hand, when it is a batch step."""
        run, tally = self.run, self.tally
        try:
            step = run.state.get("current_step")
            info = _batch.progress(run.state, step) if step else None
        except RunnerError:  # the store lost its state (an I/O error): the error itself is what matters
            info = None
        if info:
            self.shown.show(step, info["verified"] + info["skipped"], info["total"], tally["effects"],
                            tally["reconciled"], self.executor.figures, final=True,
                            spent=spend_line(run.state, limited_only=False, per_call=False))

    def _walk_items(self, step: str, start: int) -> None:
        """Perform the frozen items of ``step`` from ``start`` on, in order, each in O(1) bookkeeping."""
        run, tally, shown, executor = self.run, self.tally, self.shown, self.executor
        batch = run.state["steps"][step]["batch"]
        keys = _batch.keys_of(batch)[0]
        skipped = batch.get("skipped", {})
        total = len(keys)
        done = [total - ((_batch.progress(run.state, step) or {}).get("remaining") or 0)]
        before: Dict[str, Optional[str]] = {}

        def jobs() -> Iterator[Job]:
            for index in range(start, total):
                key = keys[index]
                effect = run.state["effects"].get(key) or {}
                if key in skipped or effect.get("state") == "verified":
                    continue
                if not self._budget_left():
                    return
                tally["actions"] += 1
                before[key] = effect.get("state")
                adapter = self.adapters(run.state, key)

                # The payload is made when the item's turn comes, from the state then.
                def payload(index: int = index) -> Dict[str, Any]:
                    return item_payload(run.state, step, index)

                yield Job(key, payload, adapter, step, _batch.item_values_of(run.state, step, index))

        def settled(job: Job, record: Dict[str, Any]) -> None:
            tally["effects"] += 1
            was = before.pop(job.key, None)
            if was is not None and was != "absent":
                tally["reconciled"] += 1
            elif was is None and record.get("attempts") == 0 and record.get("state") == "verified":
                tally["found_first"] += 1  # found at the target before any call (effects.observe_first)
            done[0] += 1
            shown.show(step, done[0], total, tally["effects"], tally["reconciled"], executor.figures,
                       spent=spend_line(run.state, limited_only=False, per_call=False) if shown.due() else "")

        executor.perform_all(jobs(), settled)


def _give_back(run: Any) -> bool:
    """Release the lease ``drive`` took, whatever ends it but a crash.

    No part of this process acts on the run once ``drive`` returns, so a lease
    left live would only keep other owners out until it expires, and make the
    next taker (this owner's next ``drive`` too) count as a recovery from a
    holder that never came back. Whoever acts next (on an action handed over,
    after a stop) takes the lease again. Returns whether it released.
    """
    try:
        lease = run.state["lease"]
        if lease.get("owner") == run.owner and lease.get("epoch") == run.epoch:
            run.release()
            return True
    except RunnerError:
        pass  # fenced or unreadable: the lease is not ours to give back
    return False


def _first_unresolved(state: Dict[str, Any], step: str) -> int:
    """The index of the first item of ``step`` whose effect is unresolved (0 if none is)."""
    keys = _batch.keys_of(state["steps"][step]["batch"])[0]
    effects = state["effects"]
    return next((i for i, key in enumerate(keys) if (effects.get(key) or {}).get("state") in UNRESOLVED), 0)


def _observes_itself(state: Dict[str, Any], step: str) -> bool:
    spec = contract_of(state).step(step)
    return spec is not None and spec.observes_itself
