"""The simulated world of the executor simulation: one clock, one process table, calls and a ledger in memory, one
worker running at a time.

:mod:`runner.proof.simulation` runs the real executor, lifecycle, registry
and :class:`runner.execution.run.Run` here; this module holds what stands in for the
machine:

* :class:`Scheduler`: simulated time and a baton. Each worker is a Python
  thread, but only the thread holding the baton runs; a worker gives it up
  at fixed points (:meth:`Scheduler.pause`: every ``World.wait``, every
  transaction, every commit window) and the scheduler picks the next one
  with its own seeded random source. When no worker can run, time jumps to
  the next event. The schedule is therefore a function of the seed alone,
  whatever the threads' timing.
* :class:`ProcessTable` and :class:`SimProcesses`: pids, start times, alive,
  stopped or dead, users, environments and process groups (a command's
  helper is a process of its group), behind the
  :class:`runner.calls.processes.Processes` seam. :class:`LeaderOnlyProcesses` and
  :class:`TrustingProcesses` stand in for it as the runner's did before it
  counted every process of a call's group, and before it believed a record
  only of processes carrying the call's token.
* :class:`MemoryRegistry`: the in-flight registry's storage in a dict shared
  by every worker that names the run alike (its logic is
  :class:`runner.calls.inflight.Registry`'s own); the dict may also hold what the
  runner never wrote (a record naming another process, a deadline days away,
  a FIFO). :func:`registry_room` names a worker's dict as the runner names a
  database run's registry folder.
* :class:`Ledger` and :class:`MemoryStore`: the run's committed records,
  shared, surviving any worker; each worker's store holds its own view and
  catches up by replaying records (:mod:`runner.stores.codec`), one
  transaction at a time. The ledger keeps its own copy of the committed state
  and reports every commit to an observer, which checks invariants.
* :class:`SimWorld`: the executor's :class:`runner.execution.executor.World` for one
  worker. A call's body (the executor's ``work``) runs twice: once when the
  call starts, where the simulated adapter raises :class:`CallIntroduced` to
  say which call it is (key, kind, registry record), and once when its answer
  reaches the worker, where the adapter returns or raises what the target
  answered. Between the two, the call's phases (a command's spawn, the
  instant a request is sent, the answer) are events of the scheduler.

A worker that is killed stops at once: the scheduler marks its process dead
and the thread, when it next holds the baton, raises :class:`WorkerKilled`
(a ``BaseException`` the runner never catches) and unwinds; the stores and
registries of a dead worker refuse any write, so nothing it does while
unwinding reaches shared state.
"""

import heapq
import json
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ..base.times import format_time
from ..base.canonical import canonical_json, loads_trusted, sha256_hex
from ..execution.executor import World
from ..calls.inflight import Registered, Registry
from ..calls.processes import GONE, UNVERIFIED, VERIFIED, Processes
from ..stores.base import Store
from ..stores.codec import Ops, finish_transition, genesis, new_identity, prepare_transition, replay
from ..base.windows import NO_OBSERVER, Observer

__all__ = ["WorkerKilled", "CallIntroduced", "Worker", "Scheduler", "ProcessTable", "SimProcesses",
           "LeaderOnlyProcesses", "TrustingProcesses", "MemoryRegistry", "FIFO", "registry_room", "Ledger",
           "MemoryStore", "SimWorld"]

#: Picks at one simulated instant after which the schedule is taken to be stuck (no worker lets time pass).
MAX_PICKS_AT_ONE_INSTANT = 20000


class WorkerKilled(BaseException):
    """Raised in a killed worker's thread: it unwinds, writing nothing (the runner catches only ``Exception``)."""


class CallIntroduced(BaseException):
    """Raised by a simulated adapter when a call's body first runs: which call this is.

    ``items``: a lookup of many keys' ``(key, payload)`` pairs (its ``key`` and ``payload`` are the first's).
    """

    def __init__(self, kind: str, key: str, payload: Dict[str, Any], epoch: Optional[int],
                 current: Optional[Tuple[Registry, Registered]],
                 adapter: Any, items: Optional[List[Tuple[str, Dict[str, Any]]]] = None) -> None:
        super().__init__(kind)
        self.kind, self.key, self.payload, self.epoch, self.current, self.adapter = (
            kind, key, payload, epoch, current, adapter)
        self.items = items if items is not None else [(key, payload)]


class Worker:
    """One simulated worker process: its thread, its process, and what it waits for."""

    def __init__(self, name: str, owner: str, program: Callable[["Worker"], str]) -> None:
        self.name, self.owner, self.program = name, owner, program
        self.pid = 0
        self.start: Optional[str] = None
        self.thread: Optional[threading.Thread] = None
        self.go = threading.Lock()
        self.wake_at: Optional[float] = None  # None: ready now
        self.on_completion = False  # also ready once a call's answer is here
        self.dead = False  # its process is gone
        self.unwinding = False  # its thread must raise WorkerKilled when it next runs
        self.stopped = False  # SIGSTOP: it neither runs nor sends
        self.results: Deque[Any] = deque()  # calls whose answer reached it, in order
        self.postponed: List[Tuple[Callable[..., None], tuple]] = []  # its events that fell while it was stopped
        self.outcome: Optional[str] = None
        self.world: Optional["SimWorld"] = None
        self.began_at = 0.0


class Scheduler:
    """Simulated time, events, and the baton that lets one worker thread run at a time.

    Every decision (which ready worker runs next) is drawn from ``rng``;
    events run in the order of their time, then of their scheduling.
    ``on_exit(worker)`` is told when a worker's program returned or its
    thread finished unwinding after a kill.
    """

    def __init__(self, rng: Any, start: float, max_time: float, on_exit: Callable[[Worker], None]) -> None:
        self.rng, self.now, self.max_time, self.on_exit = rng, start, start + max_time, on_exit
        self._heap: List[Tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self.live: List[Worker] = []  # workers whose thread has not ended
        self.threads: List[threading.Thread] = []
        self._main = threading.Lock()
        self._main.acquire()
        self.errors: List[str] = []
        self.timed_out = False
        self.stuck = False
        self._instant = start
        self._picks = 0

    def clock(self) -> float:
        return self.now

    # -- events ----------------------------------------------------------------------------------
    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at simulated time ``when`` (never earlier than now)."""
        heapq.heappush(self._heap, (max(when, self.now), self._seq, fn, args))
        self._seq += 1

    def bound(self, worker: Worker, when: float, fn: Callable[..., None], *args: Any) -> None:
        """An event of ``worker``'s own process: dropped if it is dead, held while it is stopped."""
        self.at(when, self._bound, worker, fn, args)

    def _bound(self, worker: Worker, fn: Callable[..., None], args: tuple) -> None:
        if worker.dead:
            return
        if worker.stopped:
            worker.postponed.append((fn, args))
            return
        fn(*args)

    def stop(self, worker: Worker) -> None:
        """SIGSTOP: the worker neither runs nor acts until :meth:`cont`."""
        worker.stopped = True

    def cont(self, worker: Worker) -> None:
        """SIGCONT: what fell due while it was stopped happens now, in its order."""
        if not worker.stopped:
            return
        worker.stopped = False
        held, worker.postponed = worker.postponed, []
        for fn, args in held:
            self.bound(worker, self.now, fn, *args)

    # -- workers ---------------------------------------------------------------------------------
    def spawn(self, worker: Worker) -> None:
        """Start ``worker``'s thread; it runs when the scheduler first picks it."""
        worker.go.acquire()
        worker.began_at = self.now
        thread = threading.Thread(target=self._body, args=(worker,), name=f"sim-{worker.name}", daemon=True)
        worker.thread = thread
        self.live.append(worker)
        self.threads.append(thread)
        thread.start()

    def _body(self, worker: Worker) -> None:
        worker.go.acquire()
        try:
            if worker.unwinding:
                raise WorkerKilled()
            outcome = worker.program(worker)
        except WorkerKilled:
            outcome = "killed"
        except BaseException as exc:  # a crash of the code under test: the simulation reports it
            outcome = f"crashed: {type(exc).__name__}: {exc}"
        worker.outcome = "killed" if worker.dead else outcome
        self.live.remove(worker)
        try:
            self.on_exit(worker)
        except Exception as exc:
            self.errors.append(f"on_exit: {type(exc).__name__}: {exc}")
        self._release(self._pick())

    def kill(self, worker: Worker) -> None:
        """SIGKILL: the process is dead now; its thread unwinds when it next runs."""
        worker.dead = True
        worker.stopped = False
        worker.unwinding = True
        worker.postponed.clear()
        worker.results.clear()

    def pause(self, worker: Worker, until: Optional[float] = None, on_completion: bool = False) -> None:
        """Give up the baton until ``until`` (None: at once, if picked) or, with ``on_completion``, an answer arrives.

        :raises WorkerKilled: the worker was killed meanwhile.
        """
        if worker.unwinding:
            raise WorkerKilled()
        worker.wake_at, worker.on_completion = until, on_completion
        following = self._pick()
        if following is not worker:
            self._release(following)
            worker.go.acquire()
        worker.wake_at, worker.on_completion = None, False
        if worker.unwinding:
            raise WorkerKilled()

    def run(self) -> None:
        """Run the schedule until no worker is left and no event is due; then join the threads."""
        following = self._pick()
        if following is not None:
            self._release(following)
            self._main.acquire()
        for thread in self.threads:
            thread.join()

    def _release(self, worker: Optional[Worker]) -> None:
        if worker is None:
            self._main.release()
        else:
            worker.go.release()

    @staticmethod
    def _ready(worker: Worker, now: float) -> bool:
        if worker.unwinding:
            return True
        if worker.stopped:
            return False
        if worker.on_completion and worker.results:
            return True
        return worker.wake_at is None or worker.wake_at <= now

    def _pick(self) -> Optional[Worker]:
        """The next worker to run (advancing time and running events while none can), or None at the end."""
        while True:
            for worker in self.live:
                if worker.unwinding:
                    return worker
            ready = [w for w in self.live if self._ready(w, self.now)]
            if ready:
                if self.now != self._instant:
                    self._instant, self._picks = self.now, 0
                self._picks += 1
                if self._picks > MAX_PICKS_AT_ONE_INSTANT:
                    self.stuck = True
                    self.abort()
                    continue
                return ready[0] if len(ready) == 1 else ready[self.rng.randrange(len(ready))]
            times = [w.wake_at for w in self.live if not w.stopped and w.wake_at is not None]
            if self._heap:
                times.append(self._heap[0][0])
            if not times:
                if self.live:
                    self.errors.append("no worker can run and nothing is scheduled: "
                                       + ", ".join(w.name for w in self.live))
                    self.abort()
                    continue
                return None
            when = min(times)
            if when > self.max_time:
                self.timed_out = True
                self.abort()
                continue
            self.now = max(self.now, when)
            while self._heap and self._heap[0][0] <= self.now:
                _, _, fn, args = heapq.heappop(self._heap)
                try:
                    fn(*args)
                except Exception as exc:  # a fault of the simulation itself, reported as such
                    self.errors.append(f"event {getattr(fn, '__name__', fn)}: {type(exc).__name__}: {exc}")

    def abort(self) -> None:
        """End the schedule: every worker is killed and no event runs."""
        self._heap.clear()
        for worker in self.live:
            if not worker.dead:
                self.kill(worker)


# -- processes ------------------------------------------------------------------------------------

class Proc:
    """One process of the table: ``kind`` worker, command, helper (a process a command started in its group) or
    foreign (none of the run's); ``mine``: it runs as this user."""

    __slots__ = ("pid", "start", "state", "env", "group", "kind", "mine")

    def __init__(self, pid: int, start: str, env: str, group: int, kind: str, mine: bool = True) -> None:
        self.pid, self.start, self.env, self.group, self.kind, self.mine = pid, start, env, group, kind, mine
        self.state = "running"

    @property
    def alive(self) -> bool:
        return self.state != "dead"


class ProcessTable:
    """Every process of the simulated machine.

    Workers get pids of their own that are never reused within a schedule;
    commands and their helpers get pids from a small range that wraps, so a
    dead command's pid comes back with another start time (the start-time
    check of :meth:`runner.calls.processes.Processes.alive` is what tells them
    apart). Foreign processes (this user's shell, another user's program)
    have pids of their own too. ``can_find``: whether processes'
    environments can be searched (Linux's ``/proc``); without it, start times
    are unknown too. ``on_kill(group, marker, victims)`` is told of every
    group a runner kills, with the call's token it acted for.
    """

    COMMAND_PIDS = (300, 364)
    FOREIGN_PIDS = 5000

    def __init__(self, clock: Callable[[], float], can_find: bool,
                 on_kill: Optional[Callable[[int, str, List[Proc]], None]] = None) -> None:
        self.clock, self.can_find, self.on_kill = clock, can_find, on_kill
        self.procs: Dict[int, Proc] = {}
        self._next_worker = 1000
        self._next_command = self.COMMAND_PIDS[0]
        self._next_foreign = self.FOREIGN_PIDS

    def _start_time(self) -> str:
        return str(int(self.clock() * 100))  # clock ticks, as /proc/PID/stat counts them

    def new_worker(self) -> Proc:
        pid = self._next_worker
        self._next_worker += 1
        proc = self.procs[pid] = Proc(pid, self._start_time(), "", pid, "worker")
        return proc

    def new_command(self, env: str) -> Proc:
        """A command, the leader of a process group of its own."""
        pid = self._free_command_pid()
        proc = self.procs[pid] = Proc(pid, self._start_time(), env, pid, "command")
        return proc

    def new_helper(self, leader: Proc) -> Proc:
        """A process ``leader`` starts in its group, its environment inherited (the call's token with it)."""
        pid = self._free_command_pid()
        proc = self.procs[pid] = Proc(pid, self._start_time(), leader.env, leader.group, "helper")
        return proc

    def new_foreign(self, mine: bool) -> Proc:
        """A process that is none of the run's, the leader of its own group: this user's (``mine``) or another's."""
        pid = self._next_foreign
        self._next_foreign += 1
        proc = self.procs[pid] = Proc(pid, self._start_time(), "", pid, "foreign", mine)
        return proc

    def _free_command_pid(self) -> int:
        low, high = self.COMMAND_PIDS
        for _ in range(high - low):
            pid = self._next_command
            self._next_command = low if pid + 1 >= high else pid + 1
            old = self.procs.get(pid)
            if old is None or not old.alive:
                return pid
        raise RuntimeError("the simulated machine ran out of command pids")

    def members(self, group: int) -> List[Proc]:
        """The live processes of ``group``."""
        return [proc for proc in self.procs.values() if proc.group == group and proc.alive]

    def kill_group(self, group: int, marker: Optional[str] = None) -> None:
        """SIGKILL every process of ``group``; ``marker``: a runner kills it for the call with that token."""
        victims = self.members(group)
        for proc in victims:
            proc.state = "dead"
        if marker is not None and self.on_kill is not None:
            self.on_kill(group, marker, victims)


class SimProcesses(Processes):
    """:class:`runner.calls.processes.Processes` for one process of the simulated machine (``me``), as the runner reads
    ``/proc``: a caller is believed alive only as this user's process at its recorded start time; a command's call
    lives while any process of its group is this user's, started no earlier than the leader and carrying the token.
    """

    def __init__(self, table: ProcessTable, me: Proc) -> None:
        self.table, self.mine = table, me

    def _start(self, proc: Proc) -> Optional[str]:
        return proc.start if self.table.can_find else None

    def me(self) -> Tuple[int, Optional[str]]:
        return self.mine.pid, self._start(self.mine)

    def identity(self, pid: int) -> Tuple[int, Optional[str]]:
        proc = self.table.procs.get(pid)
        return pid, (self._start(proc) if proc is not None and proc.alive else None)

    def can_find(self) -> bool:
        return self.table.can_find

    def ours(self, pid: int) -> bool:
        proc = self.table.procs.get(pid)
        return proc is not None and proc.alive and proc.mine

    def alive(self, pid: int, start: Optional[str]) -> bool:
        proc = self.table.procs.get(pid)
        if proc is None or not proc.alive or not proc.mine:
            return False
        return proc.start == start if self.table.can_find else True

    def command(self, leader: int, start: Optional[str], marker: str) -> str:
        if not self.table.can_find:
            # As the real one: the leader, or a process of its group, of this user's.
            return UNVERIFIED if self.ours(leader) or any(p.mine for p in self.table.members(leader)) else GONE
        return VERIFIED if self._member(leader, start, marker) is not None else GONE

    def _member(self, leader: int, start: Optional[str], marker: str) -> Optional[Proc]:
        """The leader itself (whatever its group now) or a process of its group, believed to be the call's."""
        if start is None:
            return None
        named = self.table.procs.get(leader)
        for proc in ([named] if named is not None and named.alive else []) + self.table.members(leader):
            if proc.mine and proc.env == marker and int(proc.start) >= int(start) \
                    and (proc.pid != leader or proc.start == start):
                return proc
        return None

    def kill_command(self, leader: int, start: Optional[str], marker: str) -> bool:
        if not self.table.can_find or self._member(leader, start, marker) is None or leader == self.mine.group:
            return False  # never its own group, as the real one
        self.table.kill_group(leader, marker)
        return True

    def find_by_environment(self, marker: str) -> Optional[Tuple[int, Optional[str]]]:
        if not self.table.can_find:
            return None
        for pid in sorted(self.table.procs):
            proc = self.table.procs[pid]
            if proc.alive and proc.mine and proc.env == marker and pid != self.mine.pid:
                return pid, proc.start
        return None


class LeaderOnlyProcesses(SimProcesses):
    """Broken, as the runner was before it counted a call's whole group: a command's call lives only while its
    leader runs at its recorded start time, so a helper the leader left behind is not seen."""

    def _member(self, leader: int, start: Optional[str], marker: str) -> Optional[Proc]:
        proc = self.table.procs.get(leader)
        if start is None or proc is None or not proc.alive or not proc.mine:
            return None
        if proc.start != start or proc.env != marker:
            return None
        return proc


class TrustingProcesses(SimProcesses):
    """Broken, as the runner was before it treated a call record as untrusted: a recorded process is the call's
    whenever a process with its pid runs (at the recorded start time, or at any if none is recorded), whoever's
    it is and whatever it carries, and its group is killed past the call's deadline (another user's group only
    refuses the signal: the runner does not run as root)."""

    def ours(self, pid: int) -> bool:
        proc = self.table.procs.get(pid)
        return proc is not None and proc.alive

    def alive(self, pid: int, start: Optional[str]) -> bool:
        proc = self.table.procs.get(pid)
        if proc is None or not proc.alive:
            return False
        return start is None or proc.start == start or not self.table.can_find

    def command(self, leader: int, start: Optional[str], marker: str) -> str:
        return VERIFIED if self.alive(leader, start) else GONE

    def kill_command(self, leader: int, start: Optional[str], marker: str) -> bool:
        if not self.alive(leader, start) or leader == self.mine.group or not self.table.procs[leader].mine:
            return False
        self.table.kill_group(leader, marker)
        return True


# -- the in-flight registry ------------------------------------------------------------------------

#: What a registry's dict holds in place of a file's text for an entry that is a FIFO.
FIFO = "\0fifo"


def registry_room(location: str, run: str) -> str:
    """The registry a worker uses that reached the run ``run`` (its identity in the database, as
    :meth:`runner.stores.postgres.PostgresStore.identity` says it) at ``location``: named from the run's identity
    alone, as :mod:`runner.calls.inflight` names a PostgreSQL run's folder of calls, so that workers that spell the
    location differently find the same one. ``location`` is what a worker was given; nothing here reads it."""
    return sha256_hex(run.encode())[:24]


class MemoryRegistry(Registry):
    """The in-flight registry with its records in a dict shared by the machine's workers.

    Records are stored as JSON text, so each reader gets its own copy, as
    from a file. ``writable()`` is False once the writing process is dead.
    What the registry moves aside goes to ``aside`` (name: why), which the
    machine's workers may share: the runner's own records never belong there.
    An entry whose text is :data:`FIFO` is a FIFO, which the runner reads as
    no file at all.
    """

    def __init__(self, shared: Dict[str, str], processes: Processes, clock: Callable[[], float],
                 writable: Callable[[], bool], aside: Optional[Dict[str, str]] = None) -> None:
        super().__init__("/nonexistent/simulated-calls", processes, clock)
        self.shared, self.writable = shared, writable
        self.aside: Dict[str, str] = {} if aside is None else aside

    def _check(self) -> None:
        if not self.writable():
            raise WorkerKilled()

    def _verify(self) -> bool:
        return True

    def _write(self, call: Registered, new: bool = False) -> None:
        self._check()
        self.shared[call.name] = json.dumps(call.record, sort_keys=True)

    def _read(self, name: str) -> Tuple[Optional[Registered], str]:
        data = self.shared.get(name)
        if data is None:
            return None, ""
        if data == FIFO:
            return None, "it is a FIFO, not a file"  # as Registry._read finds it, without opening it
        try:
            record = json.loads(data)
        except ValueError:
            return None, "it is not a JSON call record"
        why = self._problem(name, record)
        return (None, why) if why else (Registered(name, record), "")

    def _entries(self) -> List[str]:
        return sorted(self.shared)

    def _remove(self, call: Registered, payload: bool = True, answer: bool = True) -> None:
        self._check()
        self.shared.pop(call.name, None)

    def _unlink(self, name: str) -> bool:
        self._check()
        return self.shared.pop(name, None) is not None

    def _set_aside(self, name: str, why: str) -> None:
        self._check()
        data = self.shared.pop(name, None)
        if data is not None:
            self.aside[name] = why

    def payload_path(self, call: Registered) -> str:
        call.payload = True
        return "/nonexistent/simulated-calls/" + call.name


# -- the run's ledger ------------------------------------------------------------------------------

class Ledger:
    """The committed records of one run, shared by every worker and outliving each.

    ``records`` holds each transition as ``(hash, canonical body)``, as a
    database store's rows do. ``truth`` is the committed state as the ledger
    itself replays it. ``observer(before, after, ops, writer, epoch)`` is told
    of every commit (``before``: copies of the touched effects and of the
    lease as they were).
    """

    def __init__(self, task_id: str, plan: Dict[str, Any], clock: Callable[[], float],
                 observer: Optional[Callable[..., None]] = None) -> None:
        self.identity_bytes = new_identity(task_id, plan, format_time(clock()))[1]
        self.head0 = sha256_hex(self.identity_bytes)
        self.records: List[Tuple[str, bytes]] = []
        self.truth = genesis(json.loads(self.identity_bytes), self.head0)
        self.observer = observer
        self._snapshot: Optional[Tuple[int, bytes]] = None

    def snapshot(self) -> Dict[str, Any]:
        """The committed state as a fresh object (a new worker loads this, as a store loads its snapshot)."""
        revision = int(self.truth["revision"])
        if self._snapshot is None or self._snapshot[0] != revision:
            self._snapshot = (revision, canonical_json(self.truth))
        return loads_trusted(self._snapshot[1])  # type: ignore[no-any-return]

    def after(self, revision: int) -> List[Tuple[str, Dict[str, Any]]]:
        """The records after ``revision``, each decoded afresh for its reader."""
        return [(digest, loads_trusted(body)) for digest, body in self.records[revision:]]

    def append(self, digest: str, body: Dict[str, Any], raw: bytes, writer: Optional[str], epoch: int) -> None:
        touched = sorted({op[1][1] for op in body["ops"] if len(op[1]) >= 2 and op[1][0] == "effects"})
        before = {"effects": {k: dict(self.truth["effects"].get(k) or {}) for k in touched},
                  "lease": dict(self.truth["lease"])}
        replay(self.truth, [(digest, loads_trusted(raw))])
        self.records.append((digest, raw))
        if self.observer is not None:
            self.observer(before, self.truth, body["ops"], writer, epoch)


class MemoryStore(Store):
    """A :class:`runner.stores.base.Store` over a shared :class:`Ledger`: one worker's view of the run.

    ``pause(window)`` is called before each transaction takes the run's lock
    (a scheduling point); inside a transaction nothing yields, so each is
    atomic as under a database's lock. The commit windows of the database
    stores (``store:before-db-commit``, ``store:after-db-commit``) reach
    ``observer``. ``writer`` names the process for the ledger's observer;
    ``writable()`` is False once that process is dead.
    """

    def __init__(self, ledger: Ledger, clock: Callable[[], float], *, observer: Optional[Observer] = None,
                 writer: Optional[str] = None,
                 pause: Optional[Callable[[str], None]] = None, writable: Callable[[], bool] = lambda: True) -> None:
        self.ledger, self.clock = ledger, clock
        self.observer = observer if observer is not None else NO_OBSERVER
        self.writer, self.pause, self.writable = writer, pause, writable
        self.path = "/nonexistent/simulated-run"
        self.findings = []
        self._state = ledger.snapshot()

    @classmethod
    def create(cls, location: str, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None,
               **options: Any) -> "MemoryStore":
        clock = options.pop("clock")
        return cls(Ledger(task_id, plan, clock), clock, **options)

    @classmethod
    def open(cls, location: str, task_id: Optional[str] = None, **options: Any) -> "MemoryStore":
        """A simulated run lives only in its :class:`Ledger`: each worker's view is made with the ledger, never opened
        by URL."""
        raise NotImplementedError("a simulated run is not opened by location; make a MemoryStore over its Ledger")

    @classmethod
    def list_runs(cls, location: str, **options: Any) -> List[str]:
        """A simulation holds one run, not a collection."""
        raise NotImplementedError("a simulation holds one run, not a collection")

    def _in_transaction(self, work: Callable[[], Any]) -> Any:
        if self.pause is not None:
            self.pause("sim:lock")
        if not self.writable():
            raise WorkerKilled()
        return work()

    def _catch_up(self) -> None:
        if len(self.ledger.records) > self.revision:
            replay(self.state, self.ledger.after(self.revision))

    def _commit_locked(self, ops: Ops, epoch: int) -> None:
        self.observer.reached("store:before-db-commit")
        if not self.writable():
            raise WorkerKilled()
        prepared = prepare_transition(self.state, ops, epoch, self.now())
        self.ledger.append(prepared.digest, prepared.body, canonical_json(prepared.body), self.writer, epoch)
        finish_transition(self.state, prepared)
        self.observer.reached("store:after-db-commit")

    def records_after(self, after: int) -> Tuple[List[Dict[str, Any]], int]:
        return [dict(body, hash=digest) for digest, body in self.ledger.after(max(0, after))], 1


# -- the executor's world ---------------------------------------------------------------------------

class SimWorld(World):
    """The executor's :class:`runner.execution.executor.World` for one simulated worker.

    ``begin(worker, introduced, tag, work)`` is told of each call that starts
    (it schedules the call's phases); a call whose answer has arrived is
    appended to ``worker.results`` and handed to the executor by :meth:`wait`,
    which runs its ``work`` a second time with :attr:`delivering` set.
    """

    def __init__(self, scheduler: Scheduler, worker: Worker, begin: Callable[..., None],
                 window: Callable[[Worker, str], None]) -> None:
        self.scheduler, self.worker, self.begin, self.window = scheduler, worker, begin, window
        self.delivering: Any = None
        self._probing = False
        self._idle_polls = 0
        self._idle_at: Optional[float] = None

    @property
    def probing(self) -> bool:
        return self._probing

    def start(self, tag: Any, work: Callable[[], Any]) -> None:
        if self.worker.dead:
            raise WorkerKilled()
        self._probing = True
        try:
            work()
        except CallIntroduced as introduced:
            self._probing = False
            if introduced.current is not None:
                # The probe ran the call's body to where it starts, not to its return: the executor's
                # "it returned" (written on the way out) stands only when the body runs again to its end.
                registered = introduced.current[1]
                with registered.lock:
                    registered.returned = False
            self.begin(self.worker, introduced, tag, work)
            return
        finally:
            self._probing = False
        raise RuntimeError("a call's work returned without reaching a simulated adapter")

    def wait(self, timeout: float) -> Optional[Tuple[Any, Any]]:
        worker = self.worker
        if timeout > 0:
            self._idle_polls = 0
            self.window(worker, "sim:wait")
            if not worker.results:
                self.scheduler.pause(worker, until=self.scheduler.now + timeout, on_completion=True)
        elif not worker.results:
            # A poll that finds nothing, again and again at one instant, would never let time pass.
            if self._idle_at != self.scheduler.now:
                self._idle_at, self._idle_polls = self.scheduler.now, 0
            self._idle_polls += 1
            if self._idle_polls > MAX_PICKS_AT_ONE_INSTANT:
                raise RuntimeError("the executor polls its world without ever waiting")
        if not worker.results:
            return None
        call = worker.results.popleft()
        self.delivering = call
        try:
            result = call.work()
        finally:
            self.delivering = None
        return call.tag, result
