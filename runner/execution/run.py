"""The library API a harness uses: one object per run, holding (or not) its lease.

Every mutating method runs as one store transaction. Fenced methods first
check, under the store's lock and against the latest durable state, that
this object's owner and epoch still hold the lease; a stale or expired
holder gets :class:`~runner.base.errors.Fenced` and nothing is written. Control
methods (``cancel``, ``approval_grant``, ``approval_deny``) come from
outside the run, from a person or a supervisor, and need no lease.

A spent limit raised inside a transition is recorded (the run becomes
``blocked`` with the limit named) before the error reaches the caller, so a
restart sees the same outcome instead of trying again.
"""

import random as _random
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..ledger import approvals, effects, lease, retry, steps
from ..ledger import batch
from . import jobs
from ..ledger.envelope import Ops, apply_ops, undo_ops
from ..base.values import MAX_DURATION_SECONDS, check_duration, one_line
from ..base.times import format_time
from ..base.canonical import check_document, content_digest
from .evidence import observe_step, observed_ops
from ..base.errors import InvalidInput, LimitExhausted, RunnerError
from ..calls.target import Adapter
from ..stores import backend_of, open_store
from ..stores.base import CommitThenRaise, Store
from ..base.windows import NO_OBSERVER, Observer

__all__ = ["Run", "submit_job"]



class Run:
    """A run opened by a worker (``owner``/``epoch`` set) or an observer (both None).

    :param store: the run's store (:func:`runner.stores.open_store`).
    :param owner: the lease holder this object writes as; None for an observer.
    :param epoch: the fencing epoch of ``owner``'s lease.
    :param rand: draws the jitter of retry delays (a seeded one makes them replayable).
    :param observer: receives the step, lease, effect and job windows
        (:mod:`runner.base.windows`); by default the store's own observer.

    Every fenced method raises :class:`~runner.base.errors.Fenced` when this
    object's owner and epoch no longer hold a live lease, and writes nothing
    then; every method that writes may raise :class:`OSError` when the store
    cannot commit, and :class:`~runner.base.errors.StateUnrecoverable` when it finds
    the run damaged (the damage is quarantined, never replaced).
    """

    def __init__(self, store: Store, owner: Optional[str] = None, epoch: Optional[int] = None,
                 rand: Callable[[], float] = _random.random, observer: Optional[Observer] = None) -> None:
        self.store = store
        self.owner = owner
        self.epoch = epoch
        self.rand = rand
        self.observer = observer if observer is not None else getattr(store, "observer", NO_OBSERVER)

    @classmethod
    def open(cls, path: str, owner: Optional[str] = None, epoch: Optional[int] = None, *, task_id: Optional[str] = None,
             clock: Optional[Callable[[], float]] = None, rand: Callable[[], float] = _random.random,
             **store_options: Any) -> "Run":
        """Open the run kept at ``path``: a store URL, or a plain path meaning a file store's run folder.

        :param path: ``file:DIR``, ``sqlite:PATH``, ``postgresql://...`` (see
            :mod:`runner.stores`) or the folder of a file store's run.
        :param owner: the lease holder this object writes as (None: an observer).
        :param epoch: the fencing epoch of ``owner``'s lease.
        :param task_id: which run of a database (required there); for a folder,
            the run it must hold when given.
        :param clock: wall clock (seconds since the epoch) of the store and the run.
        :param rand: draws the jitter of retry delays.
        :param store_options: the backend's own keywords (see its class).
        :returns: the run, its store loaded.
        :raises InvalidInput: no such run, or a database URL without ``task_id``.
        :raises StateUnrecoverable: the run's state is damaged beyond an exact rebuild.
        """
        url = path if backend_of(path) is not None else "file:" + path
        return cls(open_store(url, task_id, clock=clock or time.time, **store_options), owner, epoch, rand)

    @property
    def state(self) -> Dict[str, Any]:
        """The run's state as of this object's last transaction or :meth:`refresh` (do not modify it)."""
        return self.store.state

    @property
    def clock(self) -> Callable[[], float]:
        """The store's wall clock, seconds since the epoch: every time the run records comes from it."""
        return self.store.clock

    def refresh(self) -> Dict[str, Any]:
        """Catch up with every transition other processes committed; return the state.

        :raises StateUnrecoverable: the run's files are damaged beyond an exact rebuild.
        """
        return self.store.refresh()

    # -- the transaction template ------------------------------------------------------
    def _mutate(self, decide: Callable[[Dict[str, Any], float], Ops], fenced: bool = True,
                person: bool = False) -> Dict[str, Any]:
        """Commit what ``decide`` makes of the state. ``fenced``: the writer must hold the live lease; ``person``: a
        person's record, which needs the lease only while someone holds it live (a drive at work)."""
        def guarded(state: Dict[str, Any]) -> Ops:
            now = self.clock()
            if fenced and not (person and not lease.lease_view(state, now)["live"]):
                lease.check_fence(state, self.owner, self.epoch, now)
            try:
                return decide(state, now)
            except LimitExhausted as exc:
                if state["status"] == "blocked":
                    raise
                raise CommitThenRaise(steps.blocked_ops(exc.message, exc.context.get("limit"), now), exc) from None

        return self.store.transact(guarded, epoch=self.epoch or 0)

    # -- lease ---------------------------------------------------------------------------
    def acquire(self, owner: str, ttl: float) -> Dict[str, Any]:
        """Take the lease at a higher epoch; this object then writes as ``owner`` at that epoch.

        :param owner: the worker taking it (an id: letters, digits, ``._:@+=-``).
        :param ttl: seconds it lives unless renewed (at most a week).
        :returns: the lease record (``owner``, ``epoch``, ``acquired_at``, ``expires_at``, ``ttl_seconds``).
        :raises AlreadyRunning: another owner's lease is live.
        :raises InvalidInput: a bad owner id or time to live.
        """
        state = self.store.transact(lambda s: lease.acquire_ops(s, owner, ttl, self.clock()))
        self.owner, self.epoch = owner, int(state["lease"]["epoch"])
        self.observer.reached("lease:after-acquire", owner=owner, epoch=self.epoch)
        return dict(state["lease"])

    def renew(self, ttl: float) -> Dict[str, Any]:
        """Extend this object's lease to ``ttl`` seconds from now; return the lease record.

        :raises Fenced: this object's owner and epoch do not hold the lease.
        :raises InvalidInput: a bad time to live.
        """
        state = self._mutate(
            lambda s, now: lease.renew_ops(s, self.owner, self.epoch, ttl, now),  # type: ignore[arg-type]
            fenced=False)
        return dict(state["lease"])

    def break_lease(self, by: str, reason: str) -> Dict[str, Any]:
        """A supervisor ends a dead holder's lease now (see :func:`runner.ledger.lease.break_ops`); needs no lease.

        :param by: the supervisor that saw the holder's process end.
        :param reason: the evidence that it ended (one line).
        :returns: the lease record, expired now, its epoch kept so the old holder stays fenced.
        :raises InvalidInput: ``by`` or ``reason`` is missing or not one line.
        """
        return dict(self._mutate(lambda s, now: lease.break_ops(s, by, reason, now), fenced=False)["lease"])

    def release(self) -> None:
        """Give up this object's lease, so another owner may take it at once.

        :raises Fenced: this object's owner and epoch do not hold the lease.
        """
        self._mutate(lambda s, now: lease.release_ops(s, self.owner, self.epoch, now), fenced=False)

    # -- steps ---------------------------------------------------------------------------
    def step_start(self, step: str) -> Dict[str, Any]:
        """Start ``step``, in plan order; a batch step's items are frozen with it (see :mod:`runner.ledger.batch`).
        Fenced.

        :returns: the step's record (``state`` running, ``attempts``).
        :raises InvalidInput: no such step, another step is running, the step is done, or its items cannot be listed.
        :raises Cancelled: the run is cancelled. :raises RunComplete: the run is complete.
        :raises LimitExhausted: a limit of the contract is spent (the run is recorded as blocked).
        :raises RetryLater: the step's backoff after a transient failure has not passed.
        """
        frozen = batch.freeze(self.refresh(), step)
        out = self._mutate(lambda s, now: steps.start_ops(s, step, now)
                           + batch.freeze_ops(s, step, frozen, now))["steps"][step]
        self.observer.reached("step:after-start", step=step)
        return out

    def step_done(self, step: str, evidence: Dict[str, Any]) -> Dict[str, Any]:
        """Finish the running ``step``; its declared checks and artifacts are observed first
        (:mod:`runner.execution.evidence`). Fenced.

        :param evidence: the evidence the contract names for the step (a JSON object; ``{}`` when the runner observes
            it).
        :returns: the step's record (``state`` done, the evidence and what was observed).
        :raises InvalidInput: the step is not running, evidence is missing, a check failed, an artifact is missing,
            or a gated step has no verified effect.
        :raises NeedsReconciliation: an effect begun in the step is unresolved.
        """
        observed = observe_step(self.refresh(), step, self.clock)

        def decide(s: Dict[str, Any], now: float) -> Ops:
            ops = steps.done_ops(s, step, evidence, now)
            return ops + observed_ops(s, step, observed, ops)

        out = self._mutate(decide)["steps"][step]
        self.observer.reached("step:after-done", step=step)
        return out

    def effect_skip(self, key: str, reason: str) -> Dict[str, Any]:
        """Settle a batch item without its effect, with the reason recorded (counted in ``report``). Fenced.

        :returns: the skip (``key``, ``step``, ``reason``, ``at``, ``state`` skipped).
        :raises InvalidInput: ``key`` is not an item of a running batch step, or the reason is empty or too long.
        :raises NeedsReconciliation: the item's effect is unresolved (observe it first).
        """
        self._mutate(lambda s, now: batch.skip_ops(s, key, reason, now))
        step = batch.owner_of(self.state, key)[0]  # type: ignore[index]
        return dict(self.state["steps"][step]["batch"]["skipped"][key], key=key, step=step, state="skipped")

    def skip_items(self, step: str, reason: str, states: Optional[Sequence[str]] = None) -> List[str]:
        """Skip every item of ``step`` in one of ``states`` (None: every item not yet verified or skipped), with one
        reason, in one transition: all of them or none. Fenced.

        :returns: the keys skipped, in item order.
        :raises InvalidInput: a bad step, state or reason, or no item to skip.
        :raises NeedsReconciliation: a chosen item may have happened (its effect is unresolved); nothing is skipped.
        """
        chosen = tuple(states) if states is not None else None
        box: Dict[str, List[str]] = {}

        def decide(s: Dict[str, Any], now: float) -> Ops:
            ops = batch.skip_many_ops(s, step, reason, now, chosen)
            box["keys"] = [op[1][-1] for op in ops]
            return ops

        self._mutate(decide)
        return box["keys"]

    def effect_reopen(self, key: str, by: str, reason: str) -> Dict[str, Any]:
        """A person gives the failed ``key`` a new budget of attempts (:func:`runner.ledger.effects.reopen_ops`); needs
        no lease, and is refused to the lease's live holder: an agent does not reopen what failed under its own lease.

        :returns: the effect's record (``state`` absent, ``reopened`` with who and why).
        :raises InvalidInput: the effect is not failed or holds a receipt, a bad ``by`` or reason, or ``by`` (or this
            object's owner) holds the run's lease live.
        """
        def decide(s: Dict[str, Any], now: float) -> Ops:
            view = lease.lease_view(s, now)
            if view["live"] and view["owner"] in (by, self.owner):
                raise InvalidInput(f"effect {key!r}: {view['owner']} holds the run's lease; a failed effect is "
                                   "reopened by a person (`effect reopen KEY --by NAME --reason TEXT`), not by the "
                                   "worker whose run it is", key=key)
            return effects.reopen_ops(s, key, by, reason, now)

        return self._mutate(decide, fenced=False)["effects"][key]

    def step_fail(self, step: str, error_class: str, error: str) -> Dict[str, Any]:
        """Record a failed attempt of the running ``step``. Fenced.

        :param error_class: ``transient`` (retried after a persisted backoff, within the attempt limit) or
            ``permanent`` (the step, and the run, are failed for good).
        :param error: what went wrong (one line).
        :returns: the step's record.
        :raises InvalidInput: the step is not running, or a bad class or error.
        :raises LimitExhausted: a transient failure spent the step's attempts (the run is recorded as blocked).
        """
        return self._mutate(lambda s, now: steps.fail_ops(s, step, error_class, error, now, self.rand))["steps"][step]

    # -- effects -------------------------------------------------------------------------
    def effect_begin(self, key: str, payload: Dict[str, Any], step: Optional[str] = None, resend: bool = False,
                     source: Optional[str] = None) -> Dict[str, Any]:
        """Record ``started`` for ``key`` before the target is called (see :func:`runner.ledger.effects.begin_ops`).
        Fenced.

        The record keeps the payload (up to 64 KiB; above, ``source``, the file it came from).

        :param payload: exactly what will be sent (a JSON object of at most 256 KiB); its digest is recorded.
        :param step: the step it belongs to (default and only choice: the running step).
        :param resend: begin again after an observed absence (the executor's retry).
        :returns: the effect's record.
        :raises AlreadyVerified: the effect is verified: do not call the target again.
        :raises NeedsReconciliation: an earlier attempt is unresolved (observe it first).
        :raises AwaitingApproval: the contract gates the key and no grant matches this payload.
        :raises InvalidInput: a bad key or payload, another payload under the key, or no running step.
        :raises Cancelled: the run is cancelled. :raises Failed: the key failed for good.
        :raises LimitExhausted: its attempts or a limit of the run are spent (the run is recorded as blocked).
        :raises RetryLater: the backoff after an observed absence has not passed.
        """
        digest = content_digest(check_document(payload, "payload"))
        kept = effects.kept_payload(payload, source)
        return self._mutate(lambda s, now: effects.begin_ops(s, key, digest, now, step, resend, kept))["effects"][key]

    def effect_ack(self, key: str, receipt: Dict[str, Any]) -> Dict[str, Any]:
        """Record the target's receipt for a started ``key``: proof it was applied, not yet that it is there. Fenced.

        :returns: the effect's record (``state`` acknowledged).
        :raises InvalidInput: no such effect, a bad receipt, or another receipt already recorded.
        """
        return self._mutate(lambda s, now: effects.ack_ops(s, key, receipt, now))["effects"][key]

    def effect_verify(self, key: str, evidence: Dict[str, Any], reconciled: bool = False,
                      person: bool = False) -> Dict[str, Any]:
        """Record that the target was observed to hold ``key``'s effect: the only way an effect is done. Fenced (a
        ``person``'s record only while someone holds the lease live).

        :param evidence: what the observation found (a JSON object).
        :param reconciled: the outcome was unknown to this worker and is settled by this observation (counted in
            ``report``).
        :returns: the effect's record (``state`` verified).
        :raises InvalidInput: no such effect, or bad evidence.
        """
        return self._mutate(lambda s, now: effects.verify_ops(s, key, evidence, now, reconciled),
                            person=person)["effects"][key]

    def effect_absent(self, key: str, evidence: Dict[str, Any], reconciled: bool = False,
                      person: bool = False) -> Dict[str, Any]:
        """Record that the target was observed not to hold ``key``: another attempt may begin after the contract's
        backoff. Fenced (a ``person``'s record only while someone holds the lease live).

        :param evidence: what the observation found; record it only when no earlier call can still land.
        :param reconciled: the outcome was unknown to this worker and is settled by this observation.
        :returns: the effect's record (``state`` absent, ``next_attempt_at``).
        :raises NeedsReconciliation: the effect holds a receipt (an absence contradicts it).
        :raises InvalidInput: no such effect, or bad evidence.
        """
        return self._mutate(lambda s, now: effects.absent_ops(
            s, key, evidence, now, reconciled,
            backoff=lambda attempts: retry.next_attempt_at(s, attempts, now, self.rand)), person=person)["effects"][key]

    def effect_uncertain(self, key: str, reason: str) -> Dict[str, Any]:
        """Record that ``key``'s outcome is unknown; nothing is retried until it is observed. Fenced.

        :returns: the effect's record (``state`` uncertain). :raises InvalidInput: no such effect, or a bad reason.
        """
        return self._mutate(lambda s, now: effects.uncertain_ops(s, key, reason, now))["effects"][key]

    def effect_failed(self, key: str, reason: str) -> Dict[str, Any]:
        """Record that the target refused ``key`` for good; it is never sent again. Fenced.

        :returns: the effect's record (``state`` failed). :raises InvalidInput: no such effect, or a bad reason.
        """
        return self._mutate(lambda s, now: effects.failed_ops(s, key, reason, now))["effects"][key]

    def drive_effect(self, key: str, payload: Dict[str, Any], adapter: Adapter, step: Optional[str] = None,
                     sleep: Optional[Callable[[float], None]] = None) -> Dict[str, Any]:
        """Take ``key`` to verified through ``adapter``, from whatever the ledger holds; return its record.

        The lifecycle of :mod:`runner.execution.lifecycle`, carried out by :class:`runner.execution.executor.Executor`:
        an earlier call of the key still in flight is waited for, the target is observed before
        any retry, and is called again only after an observed absence. ``sleep`` waits out
        backoffs and settle times while no call runs (a test's clock may pass it).

        :raises NeedsReconciliation: the outcome cannot be established by observing.
        :raises Failed: the target refused it for good.
        :raises LimitExhausted: its attempts are spent (the run is recorded as blocked).
        :raises Fenced: this object no longer holds the lease, or the target refused its epoch.
        """
        from .executor import Executor, ThreadWorld

        return Executor(self, world=ThreadWorld(sleep)).perform(key, payload, adapter, step)

    def transact_many(self, changes: Sequence[Callable[[Dict[str, Any], float], Ops]]) -> List[Optional[RunnerError]]:
        """Commit several fenced changes as one transition; return each one's refusal, or None.

        Each change is a function of the state (as the changes before it left
        it) and the time, returning its operations. The fence is checked once:
        if this object no longer holds the lease, :class:`~runner.base.errors.Fenced`
        is raised and nothing is written. A change that raises a runner error
        is left out and its error returned in its place; a spent limit is
        still recorded (the run becomes ``blocked``), as a single change would.
        """
        errors: List[Optional[RunnerError]] = [None] * len(changes)

        def decide(state: Dict[str, Any]) -> Ops:
            now = self.clock()
            lease.check_fence(state, self.owner, self.epoch, now)
            undo: List[Any] = []
            out: Ops = []
            try:
                for index, change in enumerate(changes):
                    errors[index] = None
                    try:
                        ops = change(state, now)
                    except LimitExhausted as exc:
                        errors[index] = exc
                        if state["status"] == "blocked":
                            continue
                        ops = steps.blocked_ops(exc.message, exc.context.get("limit"), now)
                    except RunnerError as exc:
                        errors[index] = exc
                        continue
                    apply_ops(state, ops, undo)
                    out += ops
            finally:
                undo_ops(undo)
            return out

        self.store.transact(decide, epoch=self.epoch or 0)
        return errors

    # -- control: cancellation, approvals, costs, plan --------------------------------------
    def cancel(self, by: str, reason: str) -> Dict[str, Any]:
        """A person cancels the run: no new step or effect begins; effects in flight are still reconciled. Needs no
        lease.

        :returns: the state after (``cancelled``, or ``cancelling`` while effects are unresolved).
        :raises RunComplete: the run is already complete. :raises InvalidInput: ``by`` or ``reason`` is missing.
        """
        return self._mutate(lambda s, now: steps.cancel_ops(s, by, reason, now), fenced=False)

    def approval_request(self, step: str, action: str, payload: Dict[str, Any], ttl: float,
                         source: Optional[Dict[str, Any]] = None) -> str:
        """Ask for a grant bound to ``payload``'s digest; it expires after ``ttl`` seconds (at most ten years).

        :param step: the step the action belongs to.
        :param action: ``effect:KEY``, the action to approve.
        :param payload: the exact payload the grant is bound to (by digest).
        :param source: where the payload came from (:func:`runner.ledger.approvals.payload_source`), shown by ``approval
            list``.
        :returns: the request id. Fenced.
        :raises InvalidInput: a bad step, action, payload or time to live.
        """
        ttl = check_duration(ttl, "ttl", MAX_DURATION_SECONDS)
        digest = content_digest(check_document(payload, "payload"))
        box: Dict[str, str] = {}

        def decide(s: Dict[str, Any], now: float) -> Ops:
            box["id"], ops = approvals.request_ops(s, step, action, digest, ttl, now, source)
            return ops

        self._mutate(decide)
        return box["id"]

    def approval_grant(self, request_id: str, by: str) -> Dict[str, Any]:
        """A person grants a pending request; needs no lease. :returns: the request's record.

        :raises InvalidInput: no such request, it is not pending, it expired, or it was made under another plan.
        """
        state = self._mutate(lambda s, now: approvals.answer_ops(s, request_id, by, True, now), fenced=False)
        return state["observations"]["approvals"][request_id]

    def approval_deny(self, request_id: str, by: str) -> Dict[str, Any]:
        """A person denies a pending request; needs no lease. :returns: the request's record.

        :raises InvalidInput: no such request, it is not pending, it expired, or it was made under another plan.
        """
        state = self._mutate(lambda s, now: approvals.answer_ops(s, request_id, by, False, now), fenced=False)
        return state["observations"]["approvals"][request_id]

    def add_cost(self, cost: Dict[str, float]) -> Dict[str, Any]:
        """Attribute one attempt's costs (e.g. ``{"tokens": 1200, "money": 0.03}``) to the run. Fenced.

        :returns: the run's cost totals (a spent budget stops the next step or effect to begin).
        :raises InvalidInput: a bad name, or an amount that is not a non-negative number.
        """
        return self._mutate(lambda s, now: retry.cost_ops(s, cost))["counters"]["cost"]

    def migrate(self, contract_text: str, reason: str) -> Dict[str, Any]:
        """Record a change of plan, as a new attempt of the same run. Fenced.

        :param contract_text: the edited contract file's text (same task id).
        :param reason: why the plan changes (one line).
        :returns: the state after (``plan_digest`` the new plan's).
        :raises InvalidInput: the contract is invalid, names another task, or drops the running step.
        """
        one_line(reason, "a migration's reason")
        return self._mutate(lambda s, now: steps.migrate_ops(s, contract_text, reason, now))

    # -- jobs ------------------------------------------------------------------------------
    def job_submit(self, key: str, command: List[str]) -> Dict[str, Any]:
        """Start a re-attachable job under ``key``, or return the one already recorded (see :func:`submit_job`). Fenced.

        :param command: the job's command line (its first word a program).
        :returns: the job's record (``state``, ``pid``, ``attempt``).
        :raises InvalidInput: a bad key or command, or another command under the key.
        :raises NeedsReconciliation: the key's job is unsettled.
        :raises Cancelled: the run is cancelled.
        """
        return submit_job(self, key, command)

    def _job(self, key: str) -> Dict[str, Any]:
        job = self.state["jobs"].get(key)
        if job is None:
            raise InvalidInput(f"no job {key!r}")
        return job

    def job_observe(self, key: str) -> Dict[str, Any]:
        """Observe the job's process and files and commit what changed; return the record with ``observed``.

        ``observed`` is what was seen (``status``, and ``damage`` if a job file
        was not believed). Needs no lease: an observation only records facts.

        :raises InvalidInput: no job ``key``.
        """
        seen = jobs.observe_job(self.store.path, self._job(key))
        job = dict(self._mutate(lambda s, now: jobs.observation_ops(s, key, seen, now), fenced=False)["jobs"][key])
        job["observed"] = seen
        return job

    def job_shard(self, key: str, shard: int) -> Dict[str, Any]:
        """Advance the job's committed-shard cursor to ``shard`` (it never moves back). Fenced.

        :returns: the job's record. :raises InvalidInput: no job ``key``, or ``shard`` is not a non-negative whole
            number.
        """
        self._job(key)
        return dict(self._mutate(lambda s, now: jobs.shard_ops(s, key, shard))["jobs"][key])

    def job_cancel(self, key: str) -> Dict[str, Any]:
        """Record "cancel requested", then signal the job's process group.

        A control method (no lease). "Stopped" is recorded only by a later
        observation that sees the process gone.

        :returns: the job's record. :raises InvalidInput: no job ``key``.
        """
        self._job(key)
        job = dict(self._mutate(lambda s, now: jobs.cancel_ops(s, key, now), fenced=False)["jobs"][key])
        jobs.signal_job(job)
        return job

    def now(self) -> str:
        """The clock's time as the run records it (ISO 8601, UTC, milliseconds)."""
        return format_time(self.clock())


def submit_job(run: Run, key: str, command: List[str]) -> Dict[str, Any]:
    """Start a re-attachable job under ``key``, or return the one already recorded.

    The intent is committed before the process starts and its pid after, so
    a crash in between leaves the job's pid file for recovery to find.
    """
    box: Dict[str, str] = {}

    def intent(state: Dict[str, Any], now: float) -> Ops:
        from ..ledger.effects import check_open

        existing = state["jobs"].get(key)
        if existing is None or existing["state"] in ("vanished",):
            check_open(state)
        box["what"], ops = jobs.submit_intent_ops(state, run.store.path, key, command, now)
        return ops

    state = run._mutate(intent)
    job = state["jobs"][key]
    if box["what"] == "start":
        run.observer.reached("job:after-intent", key=key)
        pid, start = jobs.spawn(run.store.path, key, job)
        run.observer.reached("job:after-spawn", key=key, pid=pid)
        job = run._mutate(lambda s, now: jobs.started_ops(key, pid, start))["jobs"][key]
    return dict(job)
