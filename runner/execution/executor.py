"""The executor: carries out the lifecycle's moves for one effect or many, as the one writer of their transitions.

:func:`runner.execution.lifecycle.next_move` decides; this module acts. For each
effect it is given (a :class:`Job`), the executor asks for the next move
and carries it out: it registers a call in flight
(:mod:`runner.calls.inflight`) before anything of the call happens, records
``started`` durably before the target is called, runs the call, records
what it answered, observes, waits out backoffs and settle times, waits for
(and, past their deadline, kills) earlier calls of the same key, and asks
again, until the effect is verified or a stop is named.

Invariants it keeps:

* **One writer.** Calls run concurrently, in threads (the :class:`World`);
  every transition is made by the thread that runs the loop. Records of
  several effects that are ready together are committed as one transition
  (:meth:`runner.execution.run.Run.transact_many`), so a transition is still one
  fsync, shared.
* **Register, then begin, then call.** A call's record in the registry
  exists before its ``started`` is durable, and ``started`` is durable
  before the target is called; a call's record is removed only after what it
  answered is recorded (a writer that cannot record it leaves the record, with
  the call's end, for whoever takes over).
* **A lease that lives through a call.** While calls run or waits last, the
  lease is renewed when a third of its time has passed; a renewal that fails
  (fenced) ends the loop at once, writing nothing more.
* **An absence only from an answer that could have shown the key.** A
  lookup of many keys (``observe_many``) that could not have shown a key
  (its answer may be one page of several, it failed, the target refused it)
  says nothing of that key: the key's own lookup (``observe``) comes next,
  before anything else is decided for it, and the key is never again put in
  a lookup of many keys in this pass. Until the target has answered one
  lookup of many keys, they go one at a time; after it refused one
  (:class:`~runner.target.Rejected`, an HTTP 4xx), keys are looked up one by
  one for the rest of this executor's work.
* **One listing at a time.** An adapter whose lookups read one listing of
  the target (``lists``, ``observe.list``) is asked for every key that waits
  for a lookup in one call, made in this process like any lookup of many
  keys, even for one key; while it is read, the keys that become ready wait
  for the next, so the pages are read once per sweep, never once per key.
* **Stops let calls in flight settle.** At the first stop (needs-reconciliation,
  a failure, a limit, a cancellation, an approval), no new call begins;
  calls in flight finish or reach their deadline and are recorded and
  reconciled (observed, never called again); then the stop is raised.

The world (threads and their completions), the decision function, the
registry and the commit windows' observer are passed in, so a simulation can
run this same code in a seeded world (``runner/proof/simulation.py``). The
world (:mod:`runner.execution.world`), the tasks it carries
(:mod:`runner.execution.task`) and the call slots the flow allows
(:mod:`runner.execution.slots`) are modules of their own; :class:`RunLike`
says what the executor needs of a run.
"""

import random as _random
from typing import Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Protocol, Sequence, Set, Tuple

from ..ledger import costs as _costs
from ..ledger import effects as _effects
from ..calls import commands, inflight
from ..calls.answers import MAX_DETAIL_CHARS, Answer, Seen, adopted_answer, call_target, look_at_many, look_at_target
from ..calls.inflight import Call, CallKind
from ..ledger import retry
from ..base.times import format_time, parse_time
from ..base.errors import Fenced, RunnerError, Stopped
from ..contract.spec import contract_of
from .flow import Flow
from ..ledger.lease import default_ttl
from .lifecycle import Caps, Facts, ManyLookupState, Move, MoveKind, next_move
from ..ledger.states import UNRESOLVED
from ..calls.target import Adapter
from ..base.windows import NO_OBSERVER, Observer
from .slots import CallSlots
from .task import CallInFlight, EffectTask, Job, KnownCall
from .world import ThreadWorld, World

__all__ = ["Executor", "Job", "World", "ThreadWorld", "RunLike", "caps_for"]

#: Seconds between two looks at an earlier call that is still in flight.
POLL_SECONDS = 0.1
#: Jobs held back, at most, while their group is full (the rest of the list waits its turn).
MAX_HELD = 1000

#: A change of the ledger as a function of the state and the time at commit
#: (:meth:`runner.execution.run.Run.transact_many`).
LedgerChange = Callable[[Dict[str, Any], float], List[Any]]


class RunLike(Protocol):
    """What the executor needs of a run: a :class:`runner.execution.run.Run` holding the lease is one.

    Besides these, the run's ``observer`` (the commit windows' :class:`~runner.base.windows.Observer`) and ``rand``
    (the random source of backoffs) are used when it has them and the executor is given none.
    """

    owner: Optional[str]
    epoch: Optional[int]

    @property
    def state(self) -> Dict[str, Any]:
        """The run's state as of its last transaction."""

    @property
    def clock(self) -> Callable[[], float]:
        """The run's wall clock, seconds since the epoch."""

    @property
    def store(self) -> Any:
        """Where the run is kept: the default registry of calls in flight is found from it."""

    def renew(self, ttl: float) -> Dict[str, Any]:
        """Renew the lease for ``ttl`` seconds.

        :raises Fenced: the lease was lost.
        """

    def transact_many(self, changes: Sequence[LedgerChange]) -> List[Optional[RunnerError]]:
        """Commit ``changes`` as one transition: for each, None, or the error that kept it out."""


class HeldJob(NamedTuple):
    """A job taken from the list whose flow group is full: held, in order, until its group has room."""

    job: Job
    payload: Dict[str, Any]
    group: Optional[str]


def caps_for(state: Dict[str, Any], adapter: Adapter, invoke: bool = True) -> Caps:
    """The caps of one effect: the adapter's timeout and facts (whether it can be read back), the contract's settle
    time and whether an effect is looked up before its first call (``observe_first``).

    With ``effects.rate`` every call spends a token, so no lookup is made before the settle time
    only to see a presence sooner: the tokens go to the calls that must be made.
    """
    effects = contract_of(state).effects
    return Caps(timeout=effects.timeout_for(adapter), settle=effects.settle_seconds,
                deduplicates=bool(getattr(adapter, "deduplicates", False)),
                retention=getattr(adapter, "retention_seconds", None),
                invoke=invoke, max_later=effects.max_rate_limited, look_early=effects.rate is None,
                readable=bool(getattr(adapter, "readable", True)), observe_first=effects.observe_first)


class Executor:
    """Carries out effects' lifecycles for ``run`` (a :class:`runner.execution.run.Run` holding the lease).

    :param registry: the run's calls in flight (default: :func:`runner.calls.inflight.registry_for` the run's store).
    :param world: where calls run (default: threads).
    :param decide: the lifecycle (default :func:`runner.execution.lifecycle.next_move`).
    :param ttl: the lease's time to live for renewals (default: the contract's, else 300 s).
    :param flow: how many effects are in flight, how fast calls start (default: one at a time).
    :param observer: the commit windows' observer (default: the run's).
    :param rand: the random source of backoffs (default: the run's).

    ``stop_requested`` (set by a signal handler, then :meth:`World.interrupt`)
    ends the loop as a stop does: no new call begins, calls in flight settle,
    then :class:`~runner.base.errors.Stopped` is raised.
    """

    def __init__(self, run: RunLike, *, registry: Optional[inflight.Registry] = None, world: Optional[World] = None,
                 decide: Callable[[Facts], Move] = next_move, ttl: Optional[float] = None, flow: Optional[Flow] = None,
                 observer: Optional[Observer] = None, rand: Optional[Callable[[], float]] = None) -> None:
        self.run = run
        self.registry = registry if registry is not None else inflight.registry_for(run.store)
        self.world = world or ThreadWorld()
        self.decide = decide
        self._ttl = ttl
        self.flow = flow or Flow()
        self.observer = observer if observer is not None else getattr(run, "observer", NO_OBSERVER)
        self.rand: Callable[[], float] = rand if rand else getattr(run, "rand", _random.random)
        self.stop_requested = False
        self._swept = False
        self.slots = CallSlots(self.flow)
        #: What each ``batch_key``'s lookups of many keys came to: "trying" (one is out, none answered yet), "works",
        #: "refused" (the target refuses them: key by key for the rest of this executor's work).
        self._many_lookups: Dict[Any, ManyLookupState] = {}
        #: The ``batch_key`` of each listing being read now: one at a time per target.
        self._listings: Set[Any] = set()
        #: Figures of this executor's work: calls started, transitions committed, effects in flight now.
        self.figures: Dict[str, int] = {"calls": 0, "commits": 0, "records": 0, "in_flight": 0, "looking": 0,
                                        "not_now": 0}

    # -- the public verbs ---------------------------------------------------------------------------
    def perform(self, key: str, payload: Dict[str, Any], adapter: Adapter,
                step: Optional[str] = None) -> Dict[str, Any]:
        """Take ``key`` to verified through ``adapter``; return its ledger record.

        :raises NeedsReconciliation: the outcome cannot be established by observing (or a receipt is contradicted).
        :raises Failed: the target refused it for good, or it failed before.
        :raises LimitExhausted: its attempts are spent (the run is recorded as blocked).
        :raises Fenced: the lease was lost, or the target refused the epoch.
        """
        return self._one(Job(key, payload, adapter, step), invoke=True)

    def reconcile(self, key: str, payload: Dict[str, Any], adapter: Adapter) -> Dict[str, Any]:
        """Observe an unresolved effect and record what is seen; never call the target to make it."""
        return self._one(Job(key, payload, adapter, None), invoke=False)

    def perform_all(self, jobs: Iterable[Job],
                    on_settled: Optional[Callable[[Job, Dict[str, Any]], None]] = None) -> None:
        """Perform ``jobs`` in order, as many at once as the flow allows; ``on_settled(job, record)`` after each.

        At the first stop no new job starts; those in flight settle; then the stop is raised.
        """
        self._loop(iter(jobs), True, on_settled)

    def _one(self, job: Job, invoke: bool) -> Dict[str, Any]:
        done: List[Dict[str, Any]] = []
        self._loop(iter([job]), invoke, lambda _job, record: done.append(record))
        return done[0]

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self, jobs: Iterator[Job], invoke: bool,
              on_settled: Optional[Callable[[Job, Dict[str, Any]], None]]) -> None:
        """Take ``jobs`` on as the flow allows, decide and act for each until it settles, and wait in between.

        At the first stop no job is taken on and no call begins; the calls in flight settle; then it is raised.
        """
        self._sweep_once()
        active: List[EffectTask] = []
        held: List[HeldJob] = []
        stop: Optional[BaseException] = None
        try:
            while True:
                if stop is None and self.stop_requested:
                    stop = Stopped("asked to stop: no new call begins; the calls in flight were recorded")
                if stop is None:
                    stop = self._take_on_jobs(active, held, jobs, invoke)
                if not active:
                    break
                self._advance(active, stopping=stop is not None)
                finished = [t for t in active if t.done]
                for task in finished:
                    active.remove(task)
                    self.slots.earlier_done(task.job.key)
                    self.flow.take_group(task.flow_group, -1)
                    if task.stop_error is not None:
                        stop = stop or task.stop_error
                    elif on_settled is not None and task.settled_record is not None:
                        on_settled(task.job, task.settled_record)
                # Calls on their way, not items in hand: the calls that may create apart from the lookups.
                self.figures["in_flight"] = sum(1 for t in active if t.in_flight is not None
                                                and t.in_flight.kind == "invoke")
                self.figures["looking"] = sum(1 for t in active if t.in_flight is not None
                                              and t.in_flight.kind != "invoke")
                if stop is not None and not any(t.in_flight for t in active):
                    break  # nothing in flight: what waits (a backoff, an earlier call) is left for the next run
                self.keep_lease()
                if not finished:  # a finished job made room: admit the next before waiting
                    self._wait(active)
        except Fenced:
            self._leave_calls(active)
            raise
        finally:
            self.slots.forget_earlier()  # the tasks that waited on earlier calls are gone with this pass
            # A lookup of many keys left out says nothing of whether the target answers them.
            self._many_lookups = {key: found for key, found in self._many_lookups.items() if found != "trying"}
            self._listings.clear()
        if stop is not None:
            raise stop

    def _sweep_once(self) -> None:
        """Once per executor: remove what killed runners left (records of ended calls, their payload files) for
        effects that are settled now."""
        if not self._swept:
            effects = self.run.state["effects"]
            self.registry.sweep(lambda key: (effects.get(key) or {}).get("state") in UNRESOLVED)
            self._swept = True

    def _leave_calls(self, active: List[EffectTask]) -> None:
        """The lease is lost: nothing more is written. Calls in flight are left to whoever holds the lease now:
        their records stay, each marked ended when it returns (or now, if it has)."""
        for task in active:
            if task.in_flight is not None and task.in_flight.record is not None:
                self.registry.abandon(task.in_flight.record)
            elif task.own_invoke is not None:
                self.registry.ended(task.own_invoke)

    def _take_on_jobs(self, active: List[EffectTask], held: List[HeldJob], jobs: Iterator[Job],
                      invoke: bool) -> Optional[RunnerError]:
        """Take on jobs while the flow has room: first those held for their group, then new ones in order."""
        while self.flow.room(len(active)):
            ready = next((h for h in held if self.flow.group_room(h.group)), None)
            if ready is not None:
                held.remove(ready)
                job, payload, group = ready
            else:
                if len(held) >= MAX_HELD:
                    return None
                job_or_none = next(jobs, None)
                if job_or_none is None:
                    return None
                job = job_or_none
                try:
                    payload = job.payload() if callable(job.payload) else job.payload
                except RunnerError as exc:
                    return exc
                group = self.flow.group_of(dict(job.values or {}, key=job.key, payload=payload))
                if not self.flow.group_room(group):
                    held.append(HeldJob(job, payload, group))
                    continue
            try:
                task = EffectTask(job, payload, caps_for(self.run.state, job.adapter, invoke))
            except RunnerError as exc:
                return exc
            task.flow_group = group
            self.flow.take_group(group, +1)
            active.append(task)
        return None

    @property
    def ttl(self) -> float:
        """The lease's time to live for renewals: as given, else as last acquired or renewed, else the contract's."""
        if self._ttl:
            return float(self._ttl)
        return float(self.run.state["lease"].get("ttl_seconds") or default_ttl(self.run.state))

    def _renew_due(self) -> Optional[float]:
        """When this writer's lease is next renewed (a third of its time after the last renewal), or None if it holds
        none."""
        lease = self.run.state["lease"]
        if (self.run.owner is None or lease.get("owner") != self.run.owner or lease.get("epoch") != self.run.epoch or
            not lease.get("expires_at")):
            return None
        return parse_time(lease["expires_at"]) - self.ttl * 2 / 3

    def keep_lease(self) -> None:
        """Renew this writer's lease if a third of its time has passed since the last renewal.

        :raises Fenced: the lease was lost.
        """
        due = self._renew_due()
        if due is not None and self.run.clock() >= due:
            self.run.renew(self.ttl)

    def _wait(self, active: List[EffectTask]) -> None:
        """Block until a call ends, a wait is over, or the lease is due; then take in every call that ended."""
        now = self.run.clock()
        if any(t.ready(now) for t in active):
            return
        until = [t.wait_until for t in active if t.wait_until is not None and t.in_flight is None]
        due = self._renew_due()
        if due is not None:
            until.append(due)
        timeout = max(0.0, min(until) - now) if until else POLL_SECONDS * 10
        got = self.world.wait(timeout)
        while got is not None:
            self._call_ended(*got)
            got = self.world.wait(0.0)
        for task in active:
            task.waits_for_slot = False  # a slot may be free now: decide again

    # -- deciding and acting --------------------------------------------------------------------------
    def _facts_of(self, task: EffectTask, now: float) -> Facts:
        key = task.job.key
        if task.earlier_calls is None or task.watched_call is not None:
            task.earlier_calls = [KnownCall(*known) for known in self.registry.calls(key)]
            task.registry_knew_a_call = task.registry_knew_a_call or bool(task.earlier_calls)
            task.watched_call = None
            if task.last_answer is None and task.earlier_calls:
                task.last_answer = self._left_answer(task, now)
        return Facts(key, self.run.state["effects"].get(key), tuple(known.view for known in task.earlier_calls),
                     task.last_lookup, task.last_answer, task.caps, now)

    def _left_answer(self, task: EffectTask, now: float) -> Optional[Answer]:
        """The answer an earlier invoke of the effect's current attempt left, once no call of its key runs: its
        command's exit status and output (:func:`runner.calls.commands.left_answer`), read by the adapter as the
        caller that died would have read them, so :func:`next_move` weighs it as this pass's answer. None where
        there is none, the effect is not ``started``, or the adapter cannot read one (``adopt``)."""
        adopt = getattr(task.job.adapter, "adopt", None)
        effect = self.run.state["effects"].get(task.job.key) or {}
        if adopt is None or effect.get("state") != "started" or any(k.view.alive for k in task.earlier_calls or []):
            return None
        for known in task.earlier_calls or []:
            record = known.record.record
            if record.get("kind") != "invoke" or record.get("attempt") != effect.get("attempts"):
                continue
            left = commands.left_answer(self.registry, known.record)
            if left is not None:
                answer = adopted_answer(task.job.adapter, task.job.key, left, record.get("epoch"))
                return answer._replace(ended_at=known.view.ended_at or now)
        return None

    def _advance(self, active: List[EffectTask], stopping: bool) -> None:
        """Decide and act for every task that is not waiting, until each waits, has a call in flight, or is finished.

        Calls go out while the flow has call slots: lookups first (they finish effects), those of one
        adapter that can look many keys up at once (``observe_many``) together as one call, which
        waits to be full while invokes want slots; then invokes, each after its ``started`` is
        durable. A task that finds no slot waits for a call to end.
        """
        while True:
            now = self.run.clock()
            batch: List[Tuple[EffectTask, Move]] = []
            lookups: List[EffectTask] = []
            for task in active:
                if not task.ready(now):
                    continue
                task.wait_until = None
                move = self.decide(self._facts_of(task, now))
                if move.kind in ("wait-call", "kill-call"):
                    self.slots.waits_on_earlier(task.job.key)
                else:
                    self.slots.earlier_done(task.job.key)
                if stopping and move.kind in ("invoke", "wait", "wait-call", "kill-call"):
                    task.done = True  # no new call once stopping; what waits is left for the next run
                    continue
                if move.kind == "observe":
                    lookups.append(task)
                elif move.kind in _RECORDS:
                    batch.append((task, move))
                else:
                    self._carry_out(task, move, now)
            self._start_lookups(lookups, now, fill=any(move.kind == "invoke" for _, move in batch))
            pending: Dict[str, float] = {}  # the reservations of the invokes of this batch, not yet committed
            batch = [(task, move) for task, move in batch
                     if move.kind != "invoke" or (self._cost_room(task, active, pending) and self._take_slot(task, now)
                                                  and self._reserved(pending))]
            if not batch:
                return
            self._commit(batch)

    def _cost_room(self, task: EffectTask, active: List[EffectTask], pending: Dict[str, float]) -> bool:
        """Whether ``task``'s call may go on to begin under the run's cost limits, or waits (False).

        Its reservation must fit beside what is spent and reserved, this batch's reservations included
        (:func:`runner.ledger.costs.first_short`). One that does not fit waits while any other task has a call
        in flight or holds a reservation (an outcome still to be recorded gives it back or charges it); with
        none, it goes on, and its ``started`` is refused with the limit named: the run stops.
        """
        state = self.run.state
        if not _costs.cost_limits(state):
            return True
        if _costs.first_short(state, _costs.reservation(state), pending) is None:
            return True
        effects = state["effects"]
        if pending or any(t is not task and (t.in_flight is not None or (effects.get(t.job.key) or {}).get("reserved"))
                          for t in active):
            task.waits_for_slot = True
            return False
        return True

    def _reserved(self, pending: Dict[str, float]) -> bool:
        """Count one more call's reservation in ``pending`` (the batch about to begin); always True."""
        pending.update(_costs.summed(pending, _costs.reservation(self.run.state)))
        return True

    def _take_slot(self, task: EffectTask, now: float) -> bool:
        """A call slot for ``task``'s next call, or False (it waits: for a call to end, or for the rate).

        The calls at the target are this executor's and those an earlier holder left there (a
        double signal, a crash), which the tasks of their keys wait for.
        """
        if not self.slots.room():
            task.waits_for_slot = True
            return False
        later = self.flow.ready(now)
        if later is not None:  # the rate, or a pause a "not now" answer asked for
            task.wait_until = later
            return False
        self.slots.reserve()
        return True

    def _start_lookups(self, tasks: List[EffectTask], now: float, fill: bool = False) -> None:
        """Start the lookups ``tasks`` want: together where their adapter can, one call each otherwise, while slots
        last.

        With ``fill`` (invokes want slots), a lookup of many keys goes out only once it is full: the
        slot serves an invoke meanwhile, and one call later verifies many effects at once. A listing
        (an adapter that ``lists``) is never full: it waits for the invokes, then takes every key.
        """
        groups: Dict[Any, List[EffectTask]] = {}
        for task in tasks:
            adapter = task.job.adapter
            many = getattr(adapter, "observe_many", None) and getattr(adapter, "batch_key", None)
            if task.lookup_alone:
                many = None
            if many is not None and self._many_lookups.get(many) == "refused":
                many = None
            groups.setdefault(("many", many) if many else ("one", id(task)), []).append(task)
        for (kind, batch_key), members in groups.items():
            size = max(1, int(getattr(members[0].job.adapter, "observe_batch", 1))) if kind == "many" else 1
            lists = kind == "many" and bool(getattr(members[0].job.adapter, "lists", False))
            for start in range(0, len(members), size):
                chunk = members[start:start + size]
                if kind == "many" and (self._many_lookups.get(batch_key) == "trying" or batch_key in self._listings):
                    # One at a time until the target answers one: one that refuses them is asked once, not per chunk.
                    # A listing is one at a time always: the keys that became ready while it is read go in the next.
                    for task in members[start:]:
                        task.waits_for_slot = True
                    break
                if fill and 1 < size and len(chunk) < size:
                    break  # decided again on the next pass, with the keys that became ready meanwhile
                if not self._take_slot(chunk[0], now):
                    for task in chunk[1:]:
                        task.waits_for_slot, task.wait_until = chunk[0].waits_for_slot, chunk[0].wait_until
                    continue
                self.slots.unreserve()
                if len(chunk) == 1 and not lists:
                    self._start(chunk[0], "observe", now)
                else:
                    self._start_many(chunk, now, batch_key)

    def _carry_out(self, task: EffectTask, move: Move, now: float) -> None:
        """Carry out a move that records nothing: it finishes ``task``, starts its lookup, or makes it wait."""
        act = _ACTS.get(move.kind)
        if act is None:
            raise ValueError(f"unknown move {move.kind!r}")
        act(self, task, move, now)

    def _finish(self, task: EffectTask, move: Move, now: float) -> None:
        task.settled_record = self.run.state["effects"].get(task.job.key) or {"key": task.job.key, "state": None}
        task.done = True

    def _stop(self, task: EffectTask, move: Move, now: float) -> None:
        task.stop_error, task.done = move.error, True

    def _observe_one(self, task: EffectTask, move: Move, now: float) -> None:
        self._start(task, "observe", now)

    def _wait_for_time(self, task: EffectTask, move: Move, now: float) -> None:
        task.wait_until = move.until

    def _wait_for_call(self, task: EffectTask, move: Move, now: float) -> None:
        task.wait_until = min(float(move.until or now), now + POLL_SECONDS)
        task.watched_call = self._registered(task, move.call)

    def _kill_call(self, task: EffectTask, move: Move, now: float) -> None:
        found = self._registered(task, move.call)
        if found is not None:
            self.registry.kill(found)
        task.watched_call, task.wait_until = found, now + POLL_SECONDS / 5

    @staticmethod
    def _registered(task: EffectTask, call: Optional[Call]) -> Optional[inflight.Registered]:
        return next((known.record for known in (task.earlier_calls or []) if known.view == call), None)

    def _ledger_change(self, task: EffectTask, move: Move) -> LedgerChange:
        """The ledger change that records ``move`` for ``task``, as a function of the state at commit time."""
        return _RECORDS[move.kind](self, task, move)

    def _begin(self, task: EffectTask, move: Move) -> LedgerChange:
        key, kept = task.job.key, _effects.kept_payload(task.payload)
        return lambda s, now: _effects.begin_ops(s, key, task.digest, now, task.job.step, move.resend, kept)

    def _ack(self, task: EffectTask, move: Move) -> LedgerChange:
        key = task.job.key
        return lambda s, now: _effects.ack_ops(s, key, move.receipt, now)  # type: ignore[arg-type]

    def _verify(self, task: EffectTask, move: Move) -> LedgerChange:
        key = task.job.key
        evidence = dict(move.evidence or {})
        receipt = (self.run.state["effects"].get(key) or {}).get("receipt")
        if receipt is not None and not move.reconciled and "receipt" not in evidence:
            evidence["receipt"] = receipt
        return lambda s, now: _effects.verify_ops(s, key, evidence, now, move.reconciled)

    def _found(self, task: EffectTask, move: Move) -> LedgerChange:
        key, kept, evidence = task.job.key, _effects.kept_payload(task.payload), dict(move.evidence or {})
        return lambda s, now: _effects.found_ops(s, key, task.digest, evidence, now, task.job.step, kept)

    def _absent(self, task: EffectTask, move: Move) -> LedgerChange:
        key = task.job.key

        def absent(s: Dict[str, Any], now: float) -> List[Any]:
            return _effects.absent_ops(s, key, move.evidence or {}, now, move.reconciled,
                                       backoff=lambda attempts: retry.next_attempt_at(s, attempts, now, self.rand),
                                       flag=(None if task.registry_knew_a_call
                                             else _soon_after_takeover(s, key, task.caps, now)))
        return absent

    def _defer(self, task: EffectTask, move: Move) -> LedgerChange:
        key = task.job.key

        def defer(s: Dict[str, Any], now: float) -> List[Any]:
            when = (format_time(move.until) if move.until is not None
                    else retry.next_attempt_at(s, s["effects"][key]["attempts"], now, self.rand))
            return _effects.deferred_ops(s, key, move.evidence or {}, now, when)
        return defer

    def _uncertain(self, task: EffectTask, move: Move) -> LedgerChange:
        key = task.job.key
        return lambda s, now: _effects.uncertain_ops(s, key, move.reason or "outcome unknown", now)

    def _fail(self, task: EffectTask, move: Move) -> LedgerChange:
        key = task.job.key
        return lambda s, now: _effects.failed_ops(s, key, move.reason or "refused", now)

    def _commit(self, batch: List[Tuple[EffectTask, Move]]) -> None:
        """Record the moves of ``batch`` as one transition; then start the calls whose ``started`` is now durable."""
        for task, move in batch:
            if move.kind == "invoke":
                task.own_invoke = self.registry.register(task.job.key, "invoke", self._attempt(task) + 1,
                                                         task.caps.timeout, self.run.owner, self.run.epoch)
                self.observer.reached("effect:before-started", key=task.job.key)
            elif move.kind in ("verify", "found"):
                self.observer.reached("effect:before-verify", key=task.job.key)
        errors = self.run.transact_many([self._ledger_change(task, move) for task, move in batch])
        self.figures["commits"] += 1
        self.figures["records"] += len(batch)
        now = self.run.clock()
        for (task, move), error in zip(batch, errors):
            key = task.job.key
            if error is not None:
                if move.kind == "invoke" and task.own_invoke is not None:
                    self.slots.unreserve()
                    self.registry.finish(task.own_invoke)  # nothing was begun: the call never started
                    task.own_invoke = None
                task.stop_error, task.done = error, True
                continue
            if move.kind == "invoke":
                self.slots.unreserve()
                self.observer.reached("effect:after-started", key=key)
                task.last_lookup, task.last_answer = None, None
                self._start(task, "invoke", now, task.own_invoke)
                continue
            if task.own_invoke is not None and move.kind in ("ack", "uncertain", "fail", "defer"):
                self.registry.finish(task.own_invoke)  # what the call answered is recorded
                task.own_invoke = None
            if task.earlier_calls:
                self.registry.forget_ended(key)  # earlier calls that ended are superseded by this record
                task.earlier_calls = [known for known in task.earlier_calls if known.view.alive]
            if move.kind == "ack":
                self.observer.reached("effect:after-ack", key=key)
            if move.error is not None:
                task.stop_error, task.done = move.error, True

    def _attempt(self, task: EffectTask) -> int:
        return int((self.run.state["effects"].get(task.job.key) or {}).get("attempts", 0))

    def _start(self, task: EffectTask, kind: CallKind, now: float, call: Optional[inflight.Registered] = None) -> None:
        """Start one call in the world (registered first); its result arrives through :meth:`_call_ended`."""
        job = task.job
        if call is None:
            call = self.registry.register(job.key, kind, self._attempt(task), task.caps.timeout, self.run.owner,
                                          self.run.epoch)
        task.in_flight = CallInFlight(call, kind, now)
        self.figures["calls"] += 1
        self.slots.start()
        epoch = self.run.epoch
        registry = self.registry

        def work() -> Any:
            with inflight.calling(registry, call):
                try:
                    if kind == "observe":
                        return look_at_target(job.adapter, job.key, task.payload)
                    return call_target(job.adapter, job.key, task.payload, epoch)
                finally:
                    # If the loop gave up on this call (fenced), its end is written for whoever looks next, so
                    # they need not wait for this process (which may live on) until the deadline.
                    registry.returned(call)

        self.world.start(task, work)

    def _call_ended(self, task: Any, result: Any) -> None:
        """A call of ``task`` ended: keep what it found or answered for the next decision."""
        self.slots.release()
        if isinstance(task, _Many):
            self._many_lookup_ended(task, result)
            return
        call, kind, began = task.in_flight
        task.in_flight = None
        now = self.run.clock()
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        if kind == "observe":
            self.registry.finish(call)
            if not isinstance(result, Seen):
                result = Seen("unknown", {"error": f"{type(result).__name__}: {result}"}, began)
            self._keep_lookup_result(task, result, began, now)
            return
        self.observer.reached("effect:after-call", key=task.job.key)
        answer = result if isinstance(result, Answer) else Answer("unknown", f"{type(result).__name__}: {result}")
        task.last_answer = answer._replace(ended_at=now)
        self.flow.answered(answer.kind, now, answer.retry_after)
        if answer.kind == "not-applied":
            self.figures["not_now"] += 1


    def _keep_lookup_result(self, task: EffectTask, seen: Seen, began: float, now: float) -> None:
        """Keep a lookup's result for ``task``'s next decision; a lookup refused for now too often says nothing."""
        if seen.status == "later":
            self.flow.answered("not-applied", now, seen.evidence.get("retry_after"))
            task.not_now_lookups += 1
            if task.not_now_lookups > task.caps.max_later:
                reason = f"the lookup was answered 'not now' {task.not_now_lookups} times"
                seen = Seen("unknown", dict(seen.evidence, reason=reason), began)
        else:
            task.not_now_lookups = 0
        task.last_lookup = seen._replace(at=began)

    def _start_many(self, tasks: List[EffectTask], now: float, batch_key: Any) -> None:
        """One lookup of several keys through the first task's adapter (``observe_many``).

        Not registered in flight: a lookup creates nothing, so whoever takes over has nothing to wait
        for (a lookup command left by a killed runner runs on to its own end, harmlessly), and a record
        for each of its keys would cost more than the lookup saves.
        """
        for task in tasks:
            task.in_flight = CallInFlight(None, "observe", now)
        if self._many_lookups.get(batch_key) != "works":
            self._many_lookups[batch_key] = "trying"
        adapter = tasks[0].job.adapter
        if getattr(adapter, "lists", False):
            self._listings.add(batch_key)
        self.figures["calls"] += 1
        self.slots.start()
        items = [(t.job.key, t.payload, t.job.adapter) for t in tasks]
        self.world.start(_Many(tasks, batch_key, now), lambda: look_at_many(adapter, items))

    def _many_lookup_ended(self, many: "_Many", result: Any) -> None:
        """A lookup of several keys ended: what it saw of each key counts; a key it could not have seen is looked up
        alone next (no observation yet), and never again with others in this pass."""
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result
        now = self.run.clock()
        if isinstance(result, tuple):
            seens, refused = result
        else:
            failed = Seen("unseen", {"error": f"{type(result).__name__}: {result}"[:MAX_DETAIL_CHARS]}, 0.0)
            seens, refused = [failed] * len(many.tasks), False
        self._listings.discard(many.batch_key)
        if refused:
            self._many_lookups[many.batch_key] = "refused"
        elif all(seen.status == "later" for seen in seens):
            self._many_lookups.pop(many.batch_key, None)
        else:
            self._many_lookups[many.batch_key] = "works"
        for task, seen in zip(many.tasks, seens):
            task.in_flight = None
            if seen.status == "unseen":
                task.last_lookup, task.lookup_alone = None, True
            else:
                self._keep_lookup_result(task, seen, many.began, now)


#: The moves that record nothing, each carried out at once by its method (lookups start together: ``_start_lookups``).
_ACTS: Dict[MoveKind, Callable[[Executor, EffectTask, Move, float], None]] = {
    "done": Executor._finish, "settled": Executor._finish, "stop": Executor._stop, "observe": Executor._observe_one,
    "wait": Executor._wait_for_time, "wait-call": Executor._wait_for_call, "kill-call": Executor._kill_call,
}
#: The moves recorded in the ledger, each by the change its method makes; those of several effects that are ready
#: together share one transition. Every kind of move is in one of the two tables.
_RECORDS: Dict[MoveKind, Callable[[Executor, EffectTask, Move], LedgerChange]] = {
    "invoke": Executor._begin, "ack": Executor._ack, "verify": Executor._verify, "found": Executor._found,
    "absent": Executor._absent,
    "defer": Executor._defer, "uncertain": Executor._uncertain, "fail": Executor._fail,
}


class _Many:
    """The tag of one lookup of several keys: its tasks, in the order of its answer, their ``batch_key``, and when it
    began (each task's call in flight began then too)."""

    __slots__ = ("tasks", "batch_key", "began")

    def __init__(self, tasks: List[EffectTask], batch_key: Any, began: float) -> None:
        self.tasks, self.batch_key, self.began = tasks, batch_key, began


def _soon_after_takeover(state: Dict[str, Any], key: str, caps: Caps, now: float) -> Optional[str]:
    """``absent-soon-after-takeover`` when the attempt just seen absent was begun by an earlier holder of which the
    registry knew no call (another machine, a lost ``calls/``, an agent's own call), and this holder took the lease
    less than a call's time and the settle time ago: worth a person's look, if it is called again."""
    effect, lease = state["effects"][key], state["lease"]
    acquired = lease.get("acquired_at")
    if not acquired:
        return None
    begun = (effect.get("begun_by") or {}).get("epoch")
    if begun is not None:
        if int(begun) >= int(lease.get("epoch") or 0):
            return None  # this holder began it (an epoch, not a time: a takeover in the same millisecond is later)
    elif effect["updated_at"] >= acquired:
        return None  # a record of an older runner, which kept no epoch
    return "absent-soon-after-takeover" if now - parse_time(acquired) < caps.timeout + caps.settle else None
