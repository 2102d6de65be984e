"""``simulate``: the executor run against a simulated world, seeded and replayable.

In the manner of FoundationDB's simulation tests and TigerBeetle's VOPR: the
real lifecycle (:func:`runner.lifecycle.next_move`), executor
(:class:`runner.executor.Executor`), in-flight registry logic
(:class:`runner.inflight.Registry`), :class:`runner.run.Run` and ledger rules
(:mod:`runner.effects`, :mod:`runner.lease`), unchanged, with a simulated
clock, process table, registry storage, store and target around them
(:mod:`runner.proof.simworld`). Everything a schedule does is drawn from its
seed, so a schedule that breaks an invariant is replayed exactly by
``python3 -m runner simulate --seed SEED --schedules 1 --trace``.

One schedule:

* **the run**: 1 to 6 keys, each one effect, performed by workers that take
  the lease and call :meth:`~runner.executor.Executor.perform_all` with 1 to 8
  calls in flight; a contract with a lease time to live, a call timeout
  (often longer than the lease), a settle time, attempt and "not now" bounds;
* **the target**: deduplicates (for a retention time, or for ever) or
  (mostly) not; a lookup shows a call up to
  the contract's ``settle_seconds`` after it was applied (in one schedule of
  ten, longer: a target lagging past what its contract declares, where the
  runner promises no more than that a receipt is never contradicted by a
  second call); answers dropped after the target applied the call; "not now"
  answers (429/503) with or without a delay, and storms of them; unknown
  outcomes where nothing was applied; lookups that fail; keys rejected for
  good; calls slower than the lease; in some schedules, a refusal of stale
  fencing epochs;
* **calls**: in-process (they die with their worker, are not sent while it
  is stopped, and are not sent past the registered deadline, which the
  adapter checks right before sending as a real HTTP adapter does) or
  command-like (a process of their own, with the call's token in its
  environment, registered as the call's child an instant after it starts; it
  survives its worker and sends unless a process-group kill ends it first);
* **faults**: a kill at one window per schedule (the windows taken in turn
  by seed, the pass through it drawn), more kills at random passes and at
  random times, a stall (SIGSTOP) of up to three lease times, then SIGCONT;
  two or three workers contending; restarts as ``work``'s supervisor does
  them (the dead worker's lease broken, a new owner started at once), by the
  same owner id re-acquiring, or by a new owner waiting out the lease; a
  second worker started with the owner id of a live one.

Checked during and at the end of every schedule (:data:`INVARIANTS`):

* ``duplicate``: the target holds at most one effect per key (a
  deduplicating one too: it forgets a key after its retention, and the runner
  resends only within it), in the schedules whose target keeps its declared
  settle time;
* ``call-after-receipt``: no call of a key reaches the target after a receipt
  for that key was recorded in the ledger (all schedules);
* ``receipt-lost``: a receipt once recorded stays in the ledger, unchanged;
* ``absence-over-receipt``: the ledger never records ``absent`` for an
  effect that holds a receipt;
* ``lost-acknowledgement``: at the end, every key the target holds is
  verified in the ledger, or still unresolved (started, acknowledged,
  uncertain: the ledger says it may have happened); never absent, failed or
  missing;
* ``phantom``: a verified key is held by the target;
* ``unfenced-write``: every effect transition is committed by the writer that
  holds the unexpired lease at that epoch;
* ``contradiction``: a receipt is never contradicted by an observed absence
  where the target keeps its settle time;
* ``unsettled``: every schedule ends with every key verified, or with a stop
  the runner names whose cause the schedule injected: a limit spent (some
  key had an attempt without a recorded receipt, and no key recorded absent
  is held by a target that keeps its settle time), a key the target
  rejected, a lookup that could not tell, or a receipt contradicted by a
  target lagging past its declared settle time;
* ``record-set-aside``: the in-flight registry never takes a record of its
  own for one it cannot believe and moves it aside;
* ``crash``: no exception other than the runner's own errors leaves the
  executor; ``simulation``: the simulated world itself ran into no error.

Each schedule also records *signs*, moments that known flaws of the runner
need (a call reaching the target after its registered deadline; a "not now"
answer to a resend; a decision taken while a live call sits behind an expired
one in the registry's list; a resend reaching a deduplicating target after its
retention), so that a campaign can say which failing schedules none of them
explains.

Two broken variants show that the checks bite: ``no-wait`` hides the calls
in flight from the lifecycle; ``receipt-blind-ledger`` hides recorded
receipts from the lifecycle and from the ledger's rules. ``receipt-blind``
hides them from the lifecycle only: the ledger's own rules
(:func:`runner.effects.absent_ops`, :func:`runner.effects.begin_ops`) refuse
the second call, and the simulation counts those refusals.
"""

import random
import time
from typing import IO, Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple

from .. import inflight
from ..envelope import parse_time, sha256_hex
from ..errors import AlreadyRunning, RunnerError
from ..executor import Executor, Job
from ..lifecycle import UNRESOLVED, Facts, Move, next_move
from ..run import Run
from ..target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..flow import Flow
from ..windows import Observer
from .simworld import (CallIntroduced, Ledger, MemoryRegistry, MemoryStore, ProcessTable, Scheduler, SimProcesses, SimWorld, Worker,
                       WorkerKilled)

__all__ = ["KILL_WINDOWS", "INVARIANTS", "VARIANTS", "Params", "draw_params", "Schedule", "run_schedule", "simulate", "format_report",
           "replay_command"]

#: Where a worker may be killed: the executor's and the lease's windows (:mod:`runner.windows`), the store's commit
#: windows, and the simulation's own points: before a transaction takes the lock, at every ``World.wait``, between a
#: command's spawn and its registration as the call's child, and at a random instant while a call is on its way.
KILL_WINDOWS = (
    "lease:after-acquire",
    "effect:before-started",
    "effect:after-started",
    "effect:after-call",
    "effect:after-ack",
    "effect:before-verify",
    "store:before-db-commit",
    "store:after-db-commit",
    "sim:lock",
    "sim:wait",
    "sim:spawned",
    "sim:in-flight",
)

#: Windows inside a transaction: a worker may die there, but does not give up the baton (the lock is held).
_INSIDE = ("store:before-db-commit", "store:after-db-commit")

#: How many passes of each window the per-schedule kill may fall on.
_PASSES = {"lease:after-acquire": 2, "store:before-db-commit": 12, "store:after-db-commit": 12, "sim:lock": 12, "sim:wait": 8}

INVARIANTS = ("duplicate", "call-after-receipt", "receipt-lost", "absence-over-receipt", "lost-acknowledgement", "phantom",
              "unfenced-write", "contradiction", "unsettled", "record-set-aside", "crash", "simulation")

T0 = 1_790_000_000.0
MAX_SIM_SECONDS = 6 * 3600.0
MAX_WORKERS = 30
#: Consecutive needs-reconciliation exits after which the run is left for a person.
MAX_RECONCILIATION_EXITS = 6


# -- the broken variants ----------------------------------------------------------------------------

def _no_wait(facts: Facts) -> Move:
    """Broken: the lifecycle never sees an earlier call of the key in flight."""
    return next_move(facts._replace(calls=()))


def _receipt_blind(facts: Facts) -> Move:
    """Broken: the lifecycle never sees a recorded receipt, so an absence after an acknowledgement reads as an absence."""
    if facts.effect is not None and facts.effect.get("receipt") is not None:
        facts = facts._replace(effect=dict(facts.effect, receipt=None))
    return next_move(facts)


class _ReceiptBlindRun(Run):
    """Broken: every ledger change is computed as if no receipt had been recorded."""

    def transact_many(self, changes: Any) -> Any:
        def blind(change: Callable[[Dict[str, Any], float], Any]) -> Callable[[Dict[str, Any], float], Any]:
            def hidden(state: Dict[str, Any], now: float) -> Any:
                kept = [(effect, effect["receipt"]) for effect in state["effects"].values() if effect.get("receipt") is not None]
                for effect, _ in kept:
                    effect["receipt"] = None
                try:
                    return change(state, now)
                finally:
                    for effect, receipt in kept:
                        effect["receipt"] = receipt
            return hidden

        return super().transact_many([blind(change) for change in changes])


#: name -> (the lifecycle, the Run class).
VARIANTS: Dict[str, Tuple[Callable[[Facts], Move], type]] = {
    "real": (next_move, Run),
    "no-wait": (_no_wait, Run),
    "receipt-blind": (_receipt_blind, Run),
    "receipt-blind-ledger": (_receipt_blind, _ReceiptBlindRun),
}


# -- a schedule's parameters --------------------------------------------------------------------------

class Params(NamedTuple):
    """Everything a schedule's world is made of, drawn from its seed (see :func:`draw_params`)."""

    keys: int
    parallel: int
    workers: int
    ttl: float
    timeout: float
    settle: float
    over_lag: bool
    deduplicates: bool
    retention: Optional[float]  # how long a deduplicating target remembers a key (None: forever)
    fences: bool
    commands: float  # the share of keys whose calls are commands
    can_find: bool
    slow: float  # the chance that a call is slow (before sending, or in answering)
    slow_commands: float  # the chance that a command takes long before it sends (a CLI that authenticates first)
    drop: float
    not_now: float
    retry_after: bool
    storms: Tuple[Tuple[float, float], ...]
    unknown: float
    lookup_fail: float
    rejected: Tuple[str, ...]
    max_attempts: int
    max_rate_limited: int
    backoff: Tuple[float, float]
    restart: str  # break | same-owner | expire
    restart_delay: float
    kill_window: Optional[str]
    kill_pass: int
    kill_chance: float  # at each pass through a window
    kill_in_flight: float  # at a random instant while a call is on its way, for each call
    kill_slow: float  # the same, for a call that will take longer than its timeout to send (the "CLI that authenticates first")
    timed_kills: Tuple[float, ...]
    stall: Optional[Tuple[str, int, float]]  # (window or "time", pass or second, seconds stopped)
    same_owner_at: Optional[float]
    preempt: float
    rate: Optional[Dict[str, float]] = None  # the contract's effects.rate: calls a second and a burst (None: no bound)


def draw_params(seed: int) -> Params:
    """The world of schedule ``seed``: the same seed gives the same world, in any process."""
    rng = random.Random(f"params:{seed}")
    keys = rng.choice((1, 2, 3, 3, 4, 6))
    ttl = round(rng.uniform(2.0, 20.0), 3)
    timeout = round(rng.uniform(0.5, 2.0) * ttl if rng.random() < 0.5 else rng.uniform(0.2, 0.9) * ttl, 3)
    settle = rng.choice((0.0, 0.0, round(rng.uniform(0.2, 8.0), 3)))
    window = KILL_WINDOWS[seed % len(KILL_WINDOWS)] if rng.random() < 0.8 else None
    storms = tuple(sorted((round(rng.uniform(0, 20), 3), round(rng.uniform(2, 25), 3)) for _ in range(rng.choice((0, 0, 0, 1, 2)))))
    stall: Optional[Tuple[str, int, float]] = None
    if rng.random() < 0.3:
        where = rng.choice(("effect:before-started", "effect:after-started", "effect:after-call", "effect:after-ack", "sim:wait", "sim:lock",
                            "sim:spawned", "time"))
        stall = (where, rng.randint(1, 4) if where != "time" else rng.randint(0, 20), round(rng.uniform(0.2, 3.0) * ttl, 3))
    return Params(
        keys=keys,
        parallel=rng.choice((1, 1, 2, 3, 4, 8)),
        workers=rng.choice((1, 1, 2, 3)),
        ttl=ttl,
        timeout=timeout,
        settle=settle,
        over_lag=rng.random() < 0.1,
        deduplicates=rng.random() < 0.2,
        retention=round(rng.uniform(5.0, 90.0), 3) if rng.random() < 0.5 else None,
        fences=rng.random() < 0.3,
        commands=rng.choice((0.0, 0.5, 1.0)),
        can_find=rng.random() < 0.9,
        slow=rng.choice((0.0, 0.1, 0.25)),
        slow_commands=rng.choice((0.1, 0.3, 0.5)),
        drop=rng.choice((0.0, 0.1, 0.3)),
        not_now=rng.choice((0.0, 0.0, 0.1, 0.3)),
        retry_after=rng.random() < 0.5,
        storms=storms,
        unknown=rng.choice((0.0, 0.05)),
        lookup_fail=rng.choice((0.0, 0.05, 0.2)),
        rejected=tuple(f"k{i + 1}" for i in range(keys) if rng.random() < 0.03),
        max_attempts=rng.choice((2, 3, 3, 5)),
        max_rate_limited=rng.choice((3, 10, 10)),
        backoff=(round(rng.uniform(0.05, 2.0), 3), round(rng.uniform(1.0, 30.0), 3)),
        restart=rng.choice(("break", "break", "same-owner", "expire")),
        restart_delay=rng.choice((0.0, round(rng.uniform(0.0, 2.0), 3))),
        kill_window=window,
        kill_pass=rng.randint(1, _PASSES.get(window or "", 4)),
        kill_chance=rng.choice((0.0, 0.0, 0.01, 0.03)),
        kill_in_flight=rng.choice((0.0, 0.02, 0.05)),
        kill_slow=rng.choice((0.0, 0.3, 0.6)),
        timed_kills=tuple(round(rng.uniform(0, 30), 3) for _ in range(rng.choice((0, 0, 1, 2)))),
        stall=stall,
        same_owner_at=round(rng.uniform(0, 10), 3) if rng.random() < 0.1 else None,
        preempt=rng.choice((0.1, 0.5)),
        rate=_draw_rate(seed),
    )


def _draw_rate(seed: int) -> Optional[Dict[str, float]]:
    """The contract's ``effects.rate`` of schedule ``seed``, from a stream of its own (the other draws stay as they were)."""
    rng = random.Random(f"rate:{seed}")
    if rng.random() < 0.7:
        return None
    return {"per_second": rng.choice((0.5, 2.0, 10.0)), "burst": float(rng.choice((1, 2, 8)))}


def replay_command(seed: int, variant: str = "real") -> str:
    """The one line that replays schedule ``seed`` with its trace."""
    extra = f" --variant {variant}" if variant != "real" else ""
    return f"python3 -m runner simulate --seed {seed} --schedules 1 --trace{extra}"


# -- the target and its calls ---------------------------------------------------------------------------

class SimCall:
    """One call the executor started, as the world carries it out."""

    __slots__ = ("id", "worker", "kind", "key", "epoch", "registry", "registered", "adapter", "tag", "work", "began", "outcome", "delivered", "proc",
                 "gate_open")

    def __init__(self, number: int, worker: Worker, introduced: CallIntroduced, tag: Any, work: Callable[[], Any], began: float) -> None:
        current = introduced.current
        if current is None:
            raise RuntimeError("a call started outside inflight.calling")
        self.id = f"c{number}"
        self.worker, self.kind, self.key, self.epoch = worker, introduced.kind, introduced.key, introduced.epoch
        self.registry, self.registered = current
        self.adapter, self.tag, self.work, self.began = introduced.adapter, tag, work, began
        self.outcome: Optional[Tuple[Any, ...]] = None
        self.delivered = False
        self.proc: Any = None
        self.gate_open = False

    def answer(self) -> Any:
        """What the adapter returns (or raises) for this call, now that its answer reached the worker."""
        kind, detail = self.outcome  # type: ignore[misc]
        if kind == "receipt":
            return detail
        if kind in ("present", "absent"):
            return Observation(kind, detail)
        if kind == "not-applied":
            raise NotApplied("429 Too Many Requests", retry_after=detail)
        if kind == "stale":
            raise StaleEpoch(detail)
        if kind == "rejected":
            raise Rejected(detail)
        if kind == "lookup-failed":
            raise RuntimeError(detail)
        raise UnknownOutcome(detail)


class SimAdapter:
    """A target adapter whose calls are the simulation's: the first run of a call introduces it, the second answers."""

    name = "simulated target"
    key_scope = "the simulated target"
    retention_seconds: Optional[float] = None
    conflicting_payload = "refused"
    verification = "lookup by key"

    def __init__(self, world: SimWorld, deduplicates: bool, retention: Optional[float], timeout: float, command: bool) -> None:
        self.world, self.deduplicates, self.retention_seconds, self.timeout, self.command = world, deduplicates, retention, timeout, command

    def _call(self, kind: str, key: str, payload: Dict[str, Any], epoch: Optional[int]) -> Any:
        call = self.world.delivering
        if call is None:
            raise CallIntroduced(kind, key, payload, epoch, inflight.current(), self)
        return call.answer()

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        return self._call("invoke", key, payload, epoch)  # type: ignore[no-any-return]

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        return self._call("observe", key, payload, None)  # type: ignore[no-any-return]


class _Observer(Observer):
    """The commit windows of one worker, reported to its schedule."""

    def __init__(self, schedule: "Schedule", worker: Worker) -> None:
        self.schedule, self.worker = schedule, worker

    def reached(self, window: str, **facts: Any) -> None:
        self.schedule.window(self.worker, window, facts.get("key"))


class SimWorker(Worker):
    """A worker of the simulation: its process, random source and what it saw."""

    def __init__(self, name: str, owner: str, program: Callable[[Worker], str], rand: random.Random) -> None:
        super().__init__(name, owner, program)
        self.rand = rand
        self.proc: Any = None
        self.stalled = False
        self.detail = ""
        self.calls: List["SimCall"] = []  # its calls not yet answered: its process lives until they are


# -- one schedule ---------------------------------------------------------------------------------------

class Schedule:
    """One seeded schedule: its world, its workers and faults, and the invariants checked over it."""

    def __init__(self, seed: int, variant: str = "real", trace: bool = False, params: Optional[Params] = None) -> None:
        self.seed, self.variant = seed, variant
        self.p = params if params is not None else draw_params(seed)
        self.decide_fn, self.run_class = VARIANTS[variant]
        self.trace: Optional[List[str]] = [] if trace else None
        self.world_rng = random.Random(f"world:{seed}")
        self.fault_rng = random.Random(f"faults:{seed}")
        self.keys = [f"k{i + 1}" for i in range(self.p.keys)]
        key_rng = random.Random(f"keys:{seed}")
        self.command_keys = {k for k in self.keys if key_rng.random() < self.p.commands}
        self.violations: List[Tuple[str, str]] = []
        self.counts: Dict[str, int] = {}
        self.kills: Dict[str, int] = {}
        self.exits: Dict[str, int] = {}
        self.moves: Dict[str, int] = {}
        self.workers: List[SimWorker] = []
        self.passes: Dict[str, int] = {}
        self.effects: Dict[str, List[Tuple[float, float, int, str]]] = {}  # key -> (applied, visible, ticket, call)
        self.receipted: Dict[str, Any] = {}  # key -> the first receipt the ledger recorded for it
        self.last_lookup: Dict[str, str] = {}  # key -> what its last lookup told a worker
        self.final: Optional[str] = None
        self.final_detail = ""
        self.final_lookups: Dict[str, Any] = {}  # each key's last lookup when the run was left for a person
        self.reconciliation_exits = 0
        self.verified_seen = 0
        self.calls = 0
        self.tickets = 0
        self.max_epoch = 0
        self.shared_calls: Dict[str, str] = {}
        self.set_aside: Dict[str, str] = {}  # records the registry refused to believe (name: why): never one of its own
        self.resent: Set[str] = set()  # keys whose latest attempt is a resend (uncertain -> started)
        self.signs: Set[str] = set()  # what this schedule did that the known findings need

    # -- bookkeeping --------------------------------------------------------------------------------
    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.sched.now - T0:10.3f} {text}")

    def violation(self, kind: str, detail: str) -> None:
        self.violations.append((kind, detail))
        self.log(f"VIOLATION {kind}: {detail}")

    # -- running ------------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        p = self.p
        self.sched = Scheduler(random.Random(f"scheduler:{self.seed}"), T0, MAX_SIM_SECONDS, self._exited)
        clock = self.sched.clock
        self.table = ProcessTable(clock, p.can_find)
        plan = {
            "effects": {"settle_seconds": p.settle, "timeout_seconds": p.timeout, "max_attempts": p.max_attempts,
                        "max_rate_limited": p.max_rate_limited, **({"rate": p.rate} if p.rate else {})},
            "retry": {"base_seconds": p.backoff[0], "cap_seconds": p.backoff[1]},
            "lease": {"ttl_seconds": p.ttl},
        }
        self.ledger = Ledger(f"sim-{self.seed}", plan, clock, observer=self._committed)
        self.supervisor = Run(MemoryStore(self.ledger, clock, writer="supervisor"))
        self.log(f"params {p._asdict()} commands {sorted(self.command_keys)}")
        for index in range(p.workers):
            self.sched.at(T0 + (0.0 if index == 0 else self.fault_rng.uniform(0, 3)), self._start_worker, None, "start")
        for at in p.timed_kills:
            self.sched.at(T0 + at, self._timed_kill)
        if p.stall is not None and p.stall[0] == "time":
            self.sched.at(T0 + p.stall[1], self._timed_stall, p.stall[2])
        if p.same_owner_at is not None:
            self.sched.at(T0 + p.same_owner_at, self._same_owner)
        began = time.perf_counter()
        self.sched.run()
        self.count("cpu_ms", int((time.perf_counter() - began) * 1000))
        for error in self.sched.errors:
            self.violation("simulation", error)
        return self._finish()

    def _start_worker(self, owner: Optional[str], why: str) -> None:
        if self.final is not None or self._all_verified(self.ledger.truth) or len(self.workers) >= MAX_WORKERS:
            return
        index = len(self.workers) + 1
        worker = SimWorker(f"w{index}", owner or f"worker-{index}", self._program, random.Random(f"worker:{self.seed}:{index}"))
        worker.proc = self.table.new_worker()
        worker.pid, worker.start = worker.proc.pid, worker.proc.start
        self.workers.append(worker)
        self.count("workers")
        self.log(f"{worker.name} starts as {worker.owner} (pid {worker.pid}; {why})")
        self.sched.spawn(worker)

    def _all_verified(self, state: Dict[str, Any]) -> bool:
        return all((state["effects"].get(k) or {}).get("state") == "verified" for k in self.keys)

    # -- a worker's program ---------------------------------------------------------------------------
    def _program(self, worker: Worker) -> str:
        assert isinstance(worker, SimWorker)
        p = self.p
        observer = _Observer(self, worker)

        def alive() -> bool:
            return not worker.dead

        store = MemoryStore(self.ledger, self.sched.clock, observer=observer, writer=worker.owner,
                            pause=lambda window: self.window(worker, window), writable=alive)
        run = self.run_class(store, rand=worker.rand.random, observer=observer)
        registry = MemoryRegistry(self.shared_calls, SimProcesses(self.table, worker.proc), self.sched.clock, alive,
                                  self.set_aside)
        world = SimWorld(self.sched, worker, self._begin_call, lambda w, window: self.window(w, window))
        worker.world = world
        while True:
            run.refresh()
            if self._all_verified(run.state):
                return "nothing-left"
            try:
                run.acquire(worker.owner, p.ttl)
                break
            except AlreadyRunning:
                expires = parse_time(run.state["lease"]["expires_at"])
                self.sched.pause(worker, until=min(expires, self.sched.now + worker.rand.uniform(0.5, 3.0)))
        self.log(f"{worker.name} holds the lease at epoch {run.epoch}")

        def decide(facts: Facts) -> Move:
            move = self.decide_fn(facts)
            self.moves[move.kind] = self.moves.get(move.kind, 0) + 1
            live = [c for c in facts.calls if c.alive]
            if len(live) > 1 and move.kind in ("observe", "invoke", "absent", "verify") and \
                    any(facts.now < c.deadline or c.killable for c in live[1:]):
                self.count("decisions_past_a_live_call")
                self.signs.add("a-live-call-behind-an-expired-one")
            if self.trace is not None:
                state = (facts.effect or {}).get("state")
                calls = ",".join(f"{'alive' if c.alive else 'ended'}/{c.kind}" for c in facts.calls)
                self.log(f"{worker.name} {facts.key} {state} calls[{calls}] seen={facts.seen.status if facts.seen else None} "
                         f"answer={facts.answer.kind if facts.answer else None} -> {move.kind}"
                         + (f" until {move.until - T0:.3f}" if move.until is not None else ""))
            return move

        executor = Executor(run, registry=registry, world=world, decide=decide, ttl=p.ttl, flow=Flow(p.parallel, p.rate, now=self.sched.clock()),
                            observer=observer,
                            rand=worker.rand.random)
        jobs = [Job(key, {"title": f"ticket for {key}"}, SimAdapter(world, p.deduplicates, p.retention, p.timeout, key in self.command_keys))
                for key in self.keys if (run.state["effects"].get(key) or {}).get("state") != "verified"]
        try:
            executor.perform_all(jobs)
        except RunnerError as exc:
            worker.detail = exc.message
            if exc.reason == "needs-reconciliation":
                kind = "receipt-contradiction" if "observed" in exc.context else "ledger-refusal" if "state" in exc.context else "unknown-outcome"
                self.count(f"needs-reconciliation:{kind}")
                if kind == "receipt-contradiction" and not p.over_lag:
                    self.violation("contradiction", f"{worker.name}: {exc.message[:300]}")
                return f"needs-reconciliation:{kind}"
            return exc.reason
        if self._all_verified(run.state):
            try:
                run.release()
            except RunnerError:
                pass
        return "done"

    # -- windows and faults ----------------------------------------------------------------------------
    def window(self, worker: Worker, window: str, key: Optional[str] = None) -> None:
        """``worker`` reached ``window``: count the pass; kill, stall or let another worker run there, as the schedule says."""
        if worker.unwinding:
            raise WorkerKilled()
        p = self.p
        passes = self.passes[window] = self.passes.get(window, 0) + 1
        planned = window == p.kill_window and passes == p.kill_pass
        if planned or (p.kill_chance and self.count_kills() < 3 and self.fault_rng.random() < p.kill_chance):
            self.kill(worker, window, key)
            raise WorkerKilled()
        if window in _INSIDE:
            return
        stall = p.stall
        if stall is not None and stall[0] == window and passes == stall[1] and isinstance(worker, SimWorker):
            self.stall(worker, stall[2], window, in_its_thread=True)
        if self.fault_rng.random() < p.preempt:
            self.sched.pause(worker)

    def count_kills(self) -> int:
        return sum(self.kills.values())

    def kill(self, worker: Worker, where: str, key: Optional[str] = None) -> None:
        """SIGKILL ``worker`` (at ``where``); the supervisor reacts as the schedule's policy says."""
        if worker.dead:
            return
        assert isinstance(worker, SimWorker)
        self.sched.kill(worker)
        worker.proc.state = "dead"
        self.kills[where] = self.kills.get(where, 0) + 1
        self.log(f"KILL {worker.name} at {where}" + (f" ({key})" if key else ""))
        p = self.p
        if p.restart == "same-owner":
            self.sched.at(self.sched.now + p.restart_delay, self._start_worker, worker.owner, f"restart of {worker.name}, same owner")
        elif p.restart == "break":
            self.sched.at(self.sched.now + p.restart_delay, self._break_and_start, worker)
        else:
            self.sched.at(self.sched.now + p.restart_delay, self._start_worker, None, f"restart of {worker.name}")

    def _break_and_start(self, dead: Worker) -> None:
        """What ``work``'s supervisor does when a worker dies: break the leases it held, start another."""
        state = self.supervisor.refresh()
        if state["lease"].get("owner") == dead.owner:
            self.supervisor.break_lease("supervisor", f"{dead.owner} was killed")
            self.count("lease_breaks")
            self.log(f"supervisor breaks {dead.owner}'s lease")
        self._start_worker(None, f"restart of {dead.name}")

    def stall(self, worker: SimWorker, seconds: float, where: str, in_its_thread: bool = False) -> None:
        """SIGSTOP ``worker`` for ``seconds``, then SIGCONT (``in_its_thread``: it stops here, at a window it reached)."""
        if worker.dead or worker.stopped:
            return
        self.sched.stop(worker)
        worker.proc.state = "stopped"
        worker.stalled = True
        self.count("stalls")
        self.log(f"STOP {worker.name} at {where} for {seconds:.3f}s")
        self.sched.at(self.sched.now + seconds, self._continue, worker)
        if in_its_thread:
            self.sched.pause(worker)

    def _continue(self, worker: SimWorker) -> None:
        if worker.dead:
            return
        worker.proc.state = "running"
        self.sched.cont(worker)
        self.log(f"CONT {worker.name}")

    def _live(self) -> List[SimWorker]:
        return [w for w in self.workers if not w.dead and w.outcome is None]

    def _timed_kill(self) -> None:
        live = self._live()
        if live and self.count_kills() < 4:
            self.kill(live[self.fault_rng.randrange(len(live))], "sim:time")

    def _timed_stall(self, seconds: float) -> None:
        live = [w for w in self._live() if not w.stopped]
        if live:
            self.stall(live[self.fault_rng.randrange(len(live))], seconds, "time")

    def _same_owner(self) -> None:
        live = self._live()
        if live:
            twin = live[self.fault_rng.randrange(len(live))]
            self.count("same_owner_twins")
            self._start_worker(twin.owner, f"a second process with {twin.name}'s owner id")

    def _exited(self, worker: Worker) -> None:
        """A worker's thread ended: record why; the supervisor starts another unless the run is settled or stopped for good."""
        assert isinstance(worker, SimWorker)
        outcome = worker.outcome or "?"
        named = "crashed" if outcome.startswith("crashed") else outcome
        self.exits[named] = self.exits.get(named, 0) + 1
        self.log(f"{worker.name} exits: {outcome}" + (f" ({worker.detail[:200]})" if worker.detail else ""))
        if outcome == "killed":
            return
        if not worker.calls:
            worker.proc.state = "dead"  # its program returned; the threads of calls still on their way keep it alive
        if outcome.startswith("crashed"):
            self.violation("crash", f"{worker.name}: {outcome}")
        if outcome == "fenced" and worker.stalled:
            self.count("stalled_workers_fenced")
        if outcome.startswith("needs-reconciliation"):
            self.reconciliation_exits += 1
            if self.reconciliation_exits >= MAX_RECONCILIATION_EXITS:
                self.final, self.final_detail = outcome, worker.detail
                self.final_lookups = dict(self.last_lookup)  # a worker still running may look again; the stop was decided on these
                return
        if outcome in ("limit-exhausted", "failed"):
            self.final, self.final_detail = outcome, worker.detail
            return
        if outcome in ("done", "nothing-left"):
            return
        if not self._live():
            self.sched.at(self.sched.now + self.fault_rng.uniform(0.1, 3.0), self._start_worker, None, f"after {worker.name}: {outcome}")

    # -- calls -----------------------------------------------------------------------------------------
    def _begin_call(self, worker: Worker, introduced: CallIntroduced, tag: Any, work: Callable[[], Any]) -> None:
        self.calls += 1
        call = SimCall(self.calls, worker, introduced, tag, work, self.sched.now)
        self.count(f"calls_{call.kind}")
        worker.calls.append(call)  # type: ignore[attr-defined]
        if self.sched.now >= float(call.registered.record["deadline"]):
            self.count("calls_started_past_deadline")
        command = bool(call.adapter.command)
        self.log(f"{worker.name} {call.id} {call.kind} {call.key} starts ({'command' if command else 'in-process'}, "
                 f"deadline +{call.registered.record['deadline'] - self.sched.now:.3f})")
        sched, rng = self.sched, self.world_rng
        if command and rng.random() < self.p.slow_commands:
            before = rng.uniform(0, 3 * self.p.timeout)
        else:
            before = self._delay()
        passes = self.passes["sim:in-flight"] = self.passes.get("sim:in-flight", 0) + 1
        planned = self.p.kill_window == "sim:in-flight" and passes == self.p.kill_pass
        chance = self.p.kill_slow if before > call.adapter.timeout else self.p.kill_in_flight
        if planned or (chance and self.count_kills() < 3 and self.fault_rng.random() < chance):
            sched.at(sched.now + rng.uniform(0, before), self._kill_in_flight, worker)
        if command:
            sched.bound(worker, sched.now + rng.uniform(0, 0.02), self._spawn, call, before)
        else:
            sched.bound(worker, sched.now + before, self._send, call)
        sched.bound(worker, sched.now + call.adapter.timeout, self._timed_out, call)

    def _kill_in_flight(self, worker: Worker) -> None:
        if not worker.dead:
            self.kill(worker, "sim:in-flight")

    def _delay(self) -> float:
        """How long a phase of a call takes: mostly short, sometimes longer than the call may take."""
        rng = self.world_rng
        if rng.random() < self.p.slow:
            return rng.uniform(0, 2.5 * self.p.timeout)
        return rng.uniform(0, min(0.5, self.p.timeout / 2))

    def _deliver(self, call: SimCall, outcome: Tuple[Any, ...]) -> None:
        """The call's answer reaches its worker (a bound event: not if it is dead; later if it is stopped)."""
        if call.delivered:
            return
        call.delivered, call.outcome = True, outcome
        if call.kind == "observe":
            self.last_lookup[call.key] = outcome[0]
        worker = call.worker
        worker.results.append(call)
        self.log(f"{worker.name} {call.id} answered: {outcome[0]}")
        if call in worker.calls:
            worker.calls.remove(call)
        if worker.outcome is not None and not worker.dead:
            # Its program returned while this call was on its way: the call's thread ends now, as the
            # executor's ``finally`` would, and the process with its last such thread.
            call.registry.returned(call.registered)
            if not worker.calls:
                worker.proc.state = "dead"

    def _timed_out(self, call: SimCall) -> None:
        """The call's own timeout: the client gives up (and a command's process group is killed)."""
        if call.delivered:
            return
        if call.proc is not None and call.proc.alive:
            self.table.kill_group(call.proc.group)
            self.log(f"{call.id} command killed at its timeout")
        self._deliver(call, ("unknown", f"timed out after {call.adapter.timeout:.3f}s"))

    def _send(self, call: SimCall) -> None:
        """An in-process call reaches the moment it sends (its worker is alive and running)."""
        if call.delivered:
            return  # the client gave up before sending
        if self.sched.now >= float(call.registered.record["deadline"]):
            self.count("sends_past_deadline_refused")
            self._deliver(call, ("unknown", "the call's deadline passed before it was sent"))
            return
        outcome = self._act(call)
        if outcome is None:
            return  # the answer was dropped: the client times out
        self.sched.bound(call.worker, self.sched.now + self._delay(), self._deliver, call, outcome)

    def _spawn(self, call: SimCall, before: float) -> None:
        """A command-like call's process starts, the call's token in its environment; an instant later it is registered."""
        if call.delivered:
            return  # its worker was stopped past the call's timeout: the call ended before its process began
        if call.kind == "invoke" and self.sched.now >= float(call.registered.record["deadline"]):
            # runner.commands.CommandAdapter.invoke checks the deadline before it starts the command.
            self.count("sends_past_deadline_refused")
            self._deliver(call, ("not-applied", None))
            return
        token = call.registered.record["token"]
        call.proc = self.table.new_command(f"{inflight.TOKEN_VARIABLE}={token}")
        self.log(f"{call.worker.name} {call.id} spawned pid {call.proc.pid}")
        if self.p.kill_window == "sim:spawned":
            passes = self.passes["sim:spawned"] = self.passes.get("sim:spawned", 0) + 1
            if passes == self.p.kill_pass:
                self.kill(call.worker, "sim:spawned", call.key)
        stall = self.p.stall
        if stall is not None and stall[0] == "sim:spawned" and not call.worker.dead:
            passes = self.passes["stall:sim:spawned"] = self.passes.get("stall:sim:spawned", 0) + 1
            if passes == stall[1]:
                self.stall(call.worker, stall[2], "sim:spawned")  # type: ignore[arg-type]
        self.sched.bound(call.worker, self.sched.now + self.world_rng.uniform(0, 0.01), self._record_child, call)
        self.sched.at(self.sched.now + before, self._command_acts, call)

    def _record_child(self, call: SimCall) -> None:
        if call.proc.alive:
            call.registry.spawned(call.registered, call.proc.pid)
            call.gate_open = True  # runner.commands writes "go" to the gate right after registering

    def _command_acts(self, call: SimCall) -> None:
        """The command sends (or looks), unless its process was killed first; it exits a moment later.

        It starts only through its gate: while its runner has not registered it, it waits; once that
        runner is dead, the gate's pipe is closed and the command exits without starting.
        """
        if not call.proc.alive:
            self.log(f"{call.id} never sent: its process was killed")
            self.count(f"{call.kind}_commands_killed_before_sending")
            return
        if not call.gate_open:
            if call.worker.dead:
                call.proc.state = "dead"
                self.log(f"{call.id} never started: its runner died before registering it")
                self.count("commands_closed_at_the_gate")
                return
            self.sched.at(self.sched.now + 0.1, self._command_acts, call)
            return
        outcome = self._act(call) or ("unknown", "the connection dropped after the request was sent")
        self.sched.at(self.sched.now + self._delay(), self._command_exits, call, outcome)

    def _command_exits(self, call: SimCall, outcome: Tuple[Any, ...]) -> None:
        if not call.proc.alive:
            return
        call.proc.state = "dead"
        self.sched.bound(call.worker, self.sched.now, self._deliver, call, outcome)

    def _act(self, call: SimCall) -> Optional[Tuple[Any, ...]]:
        """The target receives the call now; its answer, or None if the answer is lost on the way back."""
        if call.kind == "observe":
            if self.world_rng.random() < self.p.lookup_fail:
                return ("lookup-failed", "the lookup failed: 503 from the search index")
            held = [e for e in self.effects.get(call.key, []) if e[1] <= self.sched.now]
            if held:
                return ("present", {"ticket": held[0][2]})
            return ("absent", {"searched": call.key})
        return self._invoke(call)

    def _storm(self) -> bool:
        offset = self.sched.now - T0
        return any(start <= offset < start + length for start, length in self.p.storms)

    def _invoke(self, call: SimCall) -> Optional[Tuple[Any, ...]]:
        p, rng, key, now = self.p, self.world_rng, call.key, self.sched.now
        if now >= float(call.registered.record["deadline"]):
            self.count("calls_sent_past_deadline")
            self.signs.add("call-sent-past-its-deadline")
        if self._storm() or rng.random() < p.not_now:
            self.count("answers_not_now")
            if key in self.resent:
                self.count("not_now_to_resends")
                self.signs.add("not-now-to-a-resend")
            return ("not-applied", round(rng.uniform(0.1, 10.0), 3) if p.retry_after else None)
        epoch = int(call.epoch or 0)
        if p.fences:
            if epoch < self.max_epoch:
                self.count("stale_epochs_refused")
                self.log(f"{call.id} refused: epoch {epoch} < {self.max_epoch}")
                return ("stale", f"epoch {epoch} is older than {self.max_epoch}")
            self.max_epoch = epoch
        if key in p.rejected:
            return ("rejected", "422: the target refuses this ticket")
        if rng.random() < p.unknown:
            self.count("unknown_not_applied")
            return ("unknown", "502 from a proxy; the request did not reach the target")
        held = self.effects.setdefault(key, [])
        if key in self.receipted:
            self.violation("call-after-receipt", f"{call.id} of {key} by {call.worker.name} reached the target after the receipt "
                           f"{self.receipted[key]} was recorded")
        remembered = [e for e in held if p.retention is None or e[0] > now - p.retention]
        if p.deduplicates and held and not remembered and key in self.resent:
            self.signs.add("a-resend-past-the-retention")
        if p.deduplicates and remembered:
            self.count("deduplicated")
            receipt = {"ticket": remembered[0][2], "key": key}
        else:
            self.tickets += 1
            lag = (p.settle if rng.random() < 0.2 else rng.uniform(0, p.settle)) if not p.over_lag else rng.uniform(0, 3 * p.settle + 3)
            held.append((now, now + lag, self.tickets, call.id))
            receipt = {"ticket": self.tickets, "key": key}
            self.count("effects")
            self.log(f"{call.worker.name} {call.id} APPLIED {key} ticket {self.tickets} (visible +{lag:.3f})")
            if len(held) > 1:
                if p.over_lag:
                    self.count("duplicates_beyond_contract")
                else:
                    self.violation("duplicate", f"{key} holds {len(held)} effects, from calls {', '.join(e[3] for e in held)}")
        if rng.random() < p.drop:
            self.count("answers_dropped")
            return None
        return ("receipt", receipt)

    # -- the ledger's observer ------------------------------------------------------------------------
    def _committed(self, before: Dict[str, Any], after: Dict[str, Any], ops: List[Any], writer: Optional[str], epoch: int) -> None:
        now = self.sched.now
        self.count("commits")
        touched = before["effects"]
        lease = before["lease"]
        if any(op[1] == ["lease"] for op in ops) and lease.get("owner") is not None and after["lease"].get("owner") is not None:
            self.count("takeovers")
        if touched:
            holds = (lease.get("owner") == writer and lease.get("epoch") == epoch and lease.get("expires_at") is not None
                     and parse_time(lease["expires_at"]) > now)
            if not holds:
                self.violation("unfenced-write", f"{writer} at epoch {epoch} changed {sorted(touched)} while the lease was {lease}")
        for key, was in touched.items():
            now_record = after["effects"].get(key) or {}
            if was.get("receipt") is not None:
                if now_record.get("receipt") != was["receipt"]:
                    self.violation("receipt-lost", f"{key}: the receipt {was['receipt']} became {now_record.get('receipt')}")
                if now_record.get("state") == "absent":
                    self.violation("absence-over-receipt", f"{key} recorded absent over the receipt {was['receipt']}")
            if now_record.get("state") == "started":
                if was.get("state") == "uncertain":
                    self.resent.add(key)
                else:
                    self.resent.discard(key)
            if now_record.get("receipt") is not None and key not in self.receipted:
                self.receipted[key] = now_record["receipt"]
            if now_record.get("state") == "verified" and was.get("state") != "verified":
                self.verified_seen += 1
                self.reconciliation_exits = 0
                if self.final is not None and self.final.startswith("needs-reconciliation"):
                    self.final = None  # a worker still alive made progress after the run was left for a person
                if not any(e[1] <= now for e in self.effects.get(key, [])):
                    self.violation("phantom", f"{key} verified by {writer} while the target shows none of it")
            if self.trace is not None and now_record.get("state") != was.get("state"):
                self.log(f"{writer} commits {key}: {was.get('state')} -> {now_record.get('state')}")

    # -- the end ----------------------------------------------------------------------------------------
    def _finish(self) -> Dict[str, Any]:
        truth = self.ledger.truth
        for name, why in sorted(self.set_aside.items()):
            self.violation("record-set-aside", f"the registry set its own record {name} aside: {why}")
        for key in self.keys:
            record = truth["effects"].get(key) or {}
            state = record.get("state")
            held = len(self.effects.get(key, []))
            if held and state not in ("verified",) + UNRESOLVED and not self.p.over_lag:
                self.violation("lost-acknowledgement", f"the target holds {held} effect(s) of {key}; the ledger says {state}")
            if state == "verified" and not held:
                self.violation("phantom", f"{key} is verified; the target holds none of it")
        if self._all_verified(truth):
            ending = "settled"
        elif self.sched.timed_out or self.sched.stuck:
            ending = "time-limit" if self.sched.timed_out else "stuck"
            self.violation("unsettled", f"the schedule did not end ({ending}); ledger {self._states(truth)}")
        elif self.final is None:
            ending = "unsettled"
            self.violation("unsettled", f"no worker is left and the run is not settled; ledger {self._states(truth)}")
        else:
            ending = self.final
            why = self._unexplained(ending, truth)
            if why:
                self.violation("unsettled", f"stopped with {ending} ({self.final_detail[:200]}), {why}")
        self.log(f"END {ending}; ledger {self._states(truth)}; target {[(k, len(v)) for k, v in sorted(self.effects.items())]}")
        self.count(f"ending:{ending}")
        return {"seed": self.seed, "ending": ending, "violations": list(self.violations), "counts": dict(self.counts), "signs": sorted(self.signs),
                "kills": dict(self.kills), "exits": dict(self.exits), "moves": dict(self.moves), "params": self.p,
                "trace": self.trace, "trace_digest": sha256_hex("\n".join(self.trace).encode()) if self.trace is not None else None}

    def _states(self, truth: Dict[str, Any]) -> Dict[str, Any]:
        return {k: (truth["effects"].get(k) or {}).get("state") for k in self.keys}

    def _unexplained(self, ending: str, truth: Dict[str, Any]) -> str:
        """Why the schedule's faults do not explain a stop ("" when they do)."""
        open_keys = [k for k in self.keys if (truth["effects"].get(k) or {}).get("state") != "verified"]
        if ending == "failed":
            return "" if any(k in self.p.rejected for k in open_keys) else "no key was rejected by the target"
        if ending == "limit-exhausted":
            if not self.p.over_lag and any(self.effects.get(k) and (truth["effects"].get(k) or {}).get("state") == "absent" for k in open_keys):
                return "a key recorded absent is held by the target"
            lost = [k for k in self.keys if int((truth["effects"].get(k) or {}).get("attempts", 0)) > (1 if k in self.receipted else 0)]
            return "" if lost else "no attempt went without its receipt recorded"
        if ending == "needs-reconciliation:unknown-outcome":
            return "" if any(self.final_lookups.get(k) in ("lookup-failed", "unknown") for k in open_keys) else \
                "the last lookup of every open key answered"
        if ending == "needs-reconciliation:receipt-contradiction":
            return "" if self.p.over_lag else "the target kept its settle time, yet an absence contradicted a receipt"
        if ending == "needs-reconciliation:ledger-refusal":
            return "the ledger refused what the lifecycle proposed"
        return f"no fault explains {ending}"


def run_schedule(seed: int, variant: str = "real", trace: bool = False, params: Optional[Params] = None) -> Dict[str, Any]:
    """Run schedule ``seed`` and return what it did and found (``trace``: the event lines too).

    ``params``: the world to use instead of the seed's own (a hand-made scenario; the seed still drives every choice).
    """
    return Schedule(seed, variant, trace, params).run()


# -- a campaign ---------------------------------------------------------------------------------------------

def simulate(seed: int, schedules: int, variant: str = "real", trace: bool = False, progress: Optional[IO[str]] = None,
             stop_at_first: bool = False) -> Dict[str, Any]:
    """Run schedules ``seed`` .. ``seed + schedules - 1``; add up what they did; name the first failing seed.

    :param stop_at_first: end at the first schedule with a violation (a broken variant's search).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    began = time.perf_counter()
    totals: Dict[str, int] = {}
    kills: Dict[str, int] = {}
    exits: Dict[str, int] = {}
    endings: Dict[str, int] = {}
    moves: Dict[str, int] = {}
    violations: Dict[str, int] = {}
    examples: List[str] = []
    traces: List[Dict[str, Any]] = []
    first: Optional[int] = None
    failing: List[int] = []
    signs: Dict[str, int] = {}
    parallel: Dict[int, int] = {}
    done = 0
    for seed_i in range(seed, seed + schedules):
        result = run_schedule(seed_i, variant, trace)
        done += 1
        for into, table in ((totals, result["counts"]), (kills, result["kills"]), (exits, result["exits"]), (moves, result["moves"])):
            for key, value in table.items():
                into[key] = into.get(key, 0) + value
        endings[result["ending"]] = endings.get(result["ending"], 0) + 1
        parallel[result["params"].parallel] = parallel.get(result["params"].parallel, 0) + 1
        if result["trace"] is not None:
            traces.append({"seed": seed_i, "digest": result["trace_digest"], "lines": result["trace"]})
        if result["violations"]:
            failing.append(seed_i)
            sign = " and ".join(result["signs"]) or "neither"
            signs[sign] = signs.get(sign, 0) + 1
            for kind, detail in result["violations"]:
                violations[kind] = violations.get(kind, 0) + 1
                if len(examples) < 10:
                    examples.append(f"seed {seed_i}: {kind}: {detail[:300]}")
            if first is None:
                first = seed_i
                if stop_at_first:
                    break
        if progress is not None and done % 1000 == 0:
            progress.write(f"simulate: {done}/{schedules} schedules, {sum(violations.values())} violations, "
                           f"{time.perf_counter() - began:.0f}s\n")
            progress.flush()
    seconds = time.perf_counter() - began
    return {
        "variant": variant,
        "seed": seed,
        "schedules": done,
        "seconds": round(seconds, 2),
        "schedules_per_second": round(done / seconds, 1) if seconds else None,
        "workers": totals.get("workers", 0),
        "kills": sum(kills.values()),
        "kills_by_window": dict(sorted(kills.items())),
        "stalls": totals.get("stalls", 0),
        "stalled_workers_fenced": totals.get("stalled_workers_fenced", 0),
        "takeovers": totals.get("takeovers", 0),
        "lease_breaks": totals.get("lease_breaks", 0),
        "same_owner_twins": totals.get("same_owner_twins", 0),
        "calls": totals.get("calls_invoke", 0) + totals.get("calls_observe", 0),
        "invokes": totals.get("calls_invoke", 0),
        "observes": totals.get("calls_observe", 0),
        "effects_at_target": totals.get("effects", 0),
        "commits": totals.get("commits", 0),
        "faults_at_target": {k: totals.get(k, 0) for k in ("answers_dropped", "answers_not_now", "unknown_not_applied", "stale_epochs_refused",
                                                           "deduplicated")},
        "commands_killed_before_sending": totals.get("invoke_commands_killed_before_sending", 0),
        "commands_closed_at_the_gate": totals.get("commands_closed_at_the_gate", 0),
        "sends_past_deadline_refused": totals.get("sends_past_deadline_refused", 0),
        "waits_for_calls_in_flight": moves.get("wait-call", 0),
        "kills_of_calls_past_deadline": moves.get("kill-call", 0),
        "duplicates_beyond_contract": totals.get("duplicates_beyond_contract", 0),
        "calls_started_past_deadline": totals.get("calls_started_past_deadline", 0),
        "calls_sent_past_deadline": totals.get("calls_sent_past_deadline", 0),
        "not_now_to_resends": totals.get("not_now_to_resends", 0),
        "violations": sum(violations.values()),
        "violations_by_invariant": {k: violations.get(k, 0) for k in INVARIANTS},
        "failing_schedules": len(failing),
        "failing_schedules_by_sign": dict(sorted(signs.items())),
        "failing_seeds": failing[:100],
        "endings": dict(sorted(endings.items())),
        "worker_exits": dict(sorted(exits.items())),
        "parallel": dict(sorted(parallel.items())),
        "first_failing_seed": first,
        "replay": replay_command(first, variant) if first is not None else None,
        "examples": examples,
        "traces": traces if trace else None,
    }


def format_report(result: Dict[str, Any]) -> str:
    """The campaign's figures as lines of text."""
    skip = ("traces", "examples", "kills_by_window", "violations_by_invariant", "endings", "worker_exits", "faults_at_target", "parallel",
            "failing_schedules_by_sign", "failing_seeds")
    lines = [f"{key:32} {value}" for key, value in result.items() if key not in skip]
    for title in ("kills_by_window", "endings", "worker_exits", "faults_at_target", "violations_by_invariant", "failing_schedules_by_sign",
                  "parallel"):
        lines.append(f"{title}:")
        lines += [f"  {name!s:38} {count}" for name, count in result[title].items()]
    if result["failing_seeds"]:
        lines.append("failing seeds: " + " ".join(map(str, result["failing_seeds"])) + (" ..." if result["failing_schedules"] > 100 else ""))
    lines += [f"violation: {example}" for example in result["examples"]]
    for trace in result.get("traces") or []:
        lines.append(f"trace of seed {trace['seed']} (sha256 {trace['digest']}):")
        lines += ["  " + line for line in trace["lines"]]
    if result["first_failing_seed"] is not None:
        lines.append(f"first failing seed: {result['first_failing_seed']}; replay: {result['replay']}")
    lines.append("RESULT: " + ("ok" if result["violations"] == 0 else "FAILED"))
    return "\n".join(lines)
