"""Calls in flight: every call the runner starts, registered before it starts, findable by any later process here.

Before the executor observes or invokes a key, it registers the call: the
key, the attempt, the kind of call, the calling process (pid and start
time), a random token and a deadline. A command the call starts
(:func:`runner.commands.run_command`) adds its own process, the leader of
a process group of its own, as soon as it exists, and carries the token
in its environment (``RUNNER_CALL``), so that even a command started in the
instant before its caller died can be found. Before a later process observes
or invokes the same key it reads these records (:meth:`Registry.calls`):

* a call whose process still runs is in flight: the reader waits for it
  until its deadline; after the deadline, a command's process group is
  killed and waited for; an in-process call is the process that made it, and
  counts as ended once that process is gone or its deadline passed;
* a call whose process is gone ended when that was first seen; the time is
  written back, so every later reader agrees when the target's settle time
  began (:func:`runner.lifecycle.quiet_since`).

Storage: one small JSON file per call, replaced whole by a rename and never
fsync'd (no call outlives a power loss of the machine, and a SIGKILL leaves
every written file in place). A file store keeps them in the run folder's
``calls/``. A SQLite run keeps them in a folder per run beside its database
file (``runs.db.calls/``), named from the file's real path, so that every
process finds the same records however it spelled that path; a PostgreSQL
run in a folder per run under ``/tmp/runner-calls-UID/``, so that every
process of the machine finds them whatever its working folder or ``TMPDIR``.
A database run's folders exist only while a call is in them: the last record
removed takes them with it. A call's payload file lives beside
its record and goes with it. A record is removed when its outcome is
recorded in the ledger (or, for a call whose caller died, when an outcome
recorded after its end supersedes it); :meth:`Registry.sweep` removes what
killed processes left behind for effects that are no longer unresolved.
"""

import contextlib
import contextvars
import json
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .envelope import sha256_hex
from .lifecycle import Call
from .processes import OS_PROCESSES, Processes

__all__ = ["Registry", "Registered", "registry_for", "current", "calling", "TOKEN_VARIABLE", "GRACE_SECONDS"]

#: The environment variable that carries a call's token into the processes it starts.
TOKEN_VARIABLE = "RUNNER_CALL"

#: Seconds after a call's own timeout before its deadline: time to record what it answered.
GRACE_SECONDS = 2.0

_SUFFIX = ".json"
_PAYLOAD = ".payload"


class Registered:
    """One registered call: its record as stored, and its file's name.

    ``payload``: a payload file was written beside the record. ``returned`` and
    ``abandoned`` meet under a lock: whichever of "the call returned" and "its
    loop gave up on it" comes second writes the call's end (see :meth:`Registry.returned`).
    """

    __slots__ = ("name", "record", "payload", "returned", "abandoned", "lock")

    def __init__(self, name: str, record: Dict[str, Any]) -> None:
        self.name, self.record = name, record
        self.payload = False
        self.returned = self.abandoned = False
        self.lock = threading.Lock()

    @property
    def key(self) -> str:
        return str(self.record["key"])

    def view(self, alive: bool) -> Call:
        """The call as :func:`runner.lifecycle.next_move` weighs it."""
        child = self.record.get("child")
        return Call(alive, float(self.record["deadline"]), child is not None, self.record.get("ended_at"),
                    int((child or self.record["caller"])[0]), str(self.record.get("kind", "invoke")))


class Registry:
    """The calls in flight of one run, in ``folder``.

    :param processes: the operating system's processes (a simulation may stand in).
    :param clock: seconds since the epoch (the run's clock).
    :param transient: ``folder`` and its parent are removed whenever the last record in them is
        (a database run's registry, which lives outside any run folder).
    """

    def __init__(self, folder: str, processes: Processes = OS_PROCESSES, clock: Callable[[], float] = time.time,
                 transient: bool = False) -> None:
        self.folder, self.processes, self.clock = folder, processes, clock
        self.transient = transient
        self._made = False
        self._count = 0

    # -- storage --------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _write(self, call: Registered, new: bool = False) -> None:
        """Write ``call``'s record: a ``new`` one in place (a reader that finds it empty or torn ignores it, which is
        safe while nothing of the call is begun), a changed one through a new file renamed over it."""
        data = json.dumps(call.record, sort_keys=True).encode()
        path = self._path(call.name)
        temporary = path if new else path + ".new"
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if new else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
        for tries_left in range(100, 0, -1):
            try:
                if not self._made:
                    os.makedirs(self.folder, mode=0o700, exist_ok=True)
                    self._made = True
                fd = os.open(temporary, flags, 0o600)
                break
            except FileNotFoundError:
                # A transient folder, emptied and removed by another process since it was made: make it again.
                self._made = False
                if tries_left == 1:
                    raise
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        if not new:
            os.replace(temporary, path)

    def _read(self, name: str) -> Optional[Registered]:
        try:
            fd = os.open(self._path(name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        try:
            record = json.loads(data.decode())
        except ValueError:
            return None  # not ours, or torn by a power loss that ended every call anyway
        if not isinstance(record, dict) or not isinstance(record.get("key"), str) or not isinstance(record.get("caller"), list):
            return None
        return Registered(name, record)

    def _names(self, prefix: str = "") -> List[str]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.startswith(prefix) and n.endswith(_SUFFIX))

    def _remove(self, call: Registered, payload: bool = True) -> None:
        for path in (self._path(call.name), self.payload_path(call)) if payload else (self._path(call.name),):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._tidy()

    def _tidy(self) -> None:
        """A transient registry's folder, then its parent, removed if empty (a writer that loses the race makes them again)."""
        if not self.transient:
            return
        for folder in (self.folder, os.path.dirname(self.folder)):
            try:
                os.rmdir(folder)
            except OSError:  # not empty (or already gone): nothing more to remove
                return
            self._made = False

    def _remove_abandoned(self, name: str) -> int:
        """Remove a record its writer left empty or torn (it died between creating and writing it); return 1 if removed.

        Only once that writer, whose pid the name holds, has ended: a live one
        may still be writing it, and its call must stay known. Nothing of such
        a call was begun, since registration precedes the ``started`` commit.
        """
        writer = name.partition(".")[2].partition("-")[0]
        if not writer.isdigit() or self.processes.alive(int(writer), None):
            return 0
        try:
            os.unlink(self._path(name))
        except OSError:
            return 0
        return 1

    @staticmethod
    def _prefix(key: str) -> str:
        return sha256_hex(key.encode("utf-8"))[:20] + "."

    # -- the calls of this process ----------------------------------------------------------------
    def register(self, key: str, kind: str, attempt: int, timeout: float, owner: Optional[str] = None,
                 epoch: Optional[int] = None) -> Registered:
        """Record a call of ``key`` about to start (before anything of it is done); return its handle."""
        pid, start = self.processes.me()
        self._count += 1
        name = f"{self._prefix(key)}{pid}-{self._count}-{os.urandom(3).hex()}{_SUFFIX}"
        now = self.clock()
        call = Registered(name, {
            "key": key, "kind": kind, "attempt": attempt, "owner": owner, "epoch": epoch,
            "caller": [pid, start], "child": None, "token": os.urandom(12).hex(),
            "registered_at": now, "deadline": now + float(timeout) + GRACE_SECONDS, "ended_at": None,
        })
        self._write(call, new=True)
        return call

    def spawned(self, call: Registered, pid: int) -> None:
        """The call started a process, the leader of its own group: it is now what must end."""
        call.record["child"] = list(self.processes.identity(pid))
        self._write(call)

    def payload_path(self, call: Registered) -> str:
        """Where the call's payload file goes: beside its record, removed with it."""
        call.payload = True
        return self._path(call.name[: -len(_SUFFIX)] + _PAYLOAD)

    def finish(self, call: Registered) -> None:
        """The call's outcome is recorded in the ledger: forget it."""
        self._remove(call, payload=call.payload)

    def ended(self, call: Registered) -> None:
        """The call ended but its outcome could not be recorded: keep it, with its end, for whoever comes next."""
        call.record["ended_at"] = self.clock()
        try:
            self._write(call)
        except OSError:
            pass

    def returned(self, call: Registered) -> None:
        """The call's own thread: it returned. If its loop gave up on it meanwhile, write its end for whoever comes next."""
        with call.lock:
            call.returned = True
            write = call.abandoned
        if write:
            self.ended(call)

    def abandon(self, call: Registered) -> None:
        """The loop gives up on a call (it was fenced): its end is written when it returns, or now if it has."""
        with call.lock:
            call.abandoned = True
            write = call.returned
        if write:
            self.ended(call)

    # -- the calls of every process ----------------------------------------------------------------
    def calls(self, key: str) -> List[Tuple[Registered, Call]]:
        """Every recorded call of ``key`` and its state now; a call first seen ended gets its end written."""
        out = []
        for name in self._names(self._prefix(key)):
            call = self._read(name)
            if call is None or call.key != key:
                continue
            out.append((call, call.view(self._alive(call))))
        return out

    def _alive(self, call: Registered) -> bool:
        record = call.record
        if record.get("ended_at") is not None:
            return False
        alive = False
        child = record.get("child")
        if child:
            alive = self.processes.alive(int(child[0]), child[1])
        elif self.processes.alive(int(record["caller"][0]), record["caller"][1]):
            alive = True
        else:
            # The caller is gone: a command it started in its last instant carries the token.
            found = self.processes.find_by_environment(f"{TOKEN_VARIABLE}={record['token']}")
            if found is not None:
                record["child"] = list(found)
                self._write(call)
                alive = True
            elif not self.processes.can_find() and self.clock() < float(record["deadline"]):
                alive = True  # nothing here can tell: count it in flight until its deadline
        if not alive:
            record["ended_at"] = self.clock()
            try:
                self._write(call)
            except OSError:
                pass
        return alive

    def kill(self, call: Registered) -> None:
        """End a call past its deadline: SIGKILL its process group."""
        child = call.record.get("child")
        if child:
            self.processes.kill_group(int(child[0]))

    def forget_ended(self, key: str) -> None:
        """An outcome recorded after these calls ended supersedes them: remove the ended calls of ``key``."""
        for call, view in self.calls(key):
            if not view.alive:
                self._remove(call)

    def sweep(self, unresolved: Callable[[str], bool]) -> int:
        """Remove the ended calls of keys that are not unresolved, with their payload files, and the records dead writers
        left empty or torn; return how many."""
        removed = 0
        for name in self._names():
            call = self._read(name)
            if call is None:
                removed += self._remove_abandoned(name)
                continue
            if not unresolved(call.key) and not self._alive(call):
                self._remove(call)
                removed += 1
        # Leftover temporary files of writers that died mid-write.
        try:
            for name in os.listdir(self.folder):
                if name.endswith(".new"):
                    with contextlib.suppress(OSError):
                        os.unlink(self._path(name))
        except FileNotFoundError:
            pass
        self._tidy()
        return removed


def registry_for(store: Any, clock: Optional[Callable[[], float]] = None) -> Registry:
    """The registry of the run ``store`` holds: the run folder's ``calls/``, or a folder per database run (see the module)."""
    from .stores.file import RunStore

    if isinstance(store, RunStore):
        return Registry(os.path.join(store.path, "calls"), clock=clock or store.clock)
    task = store.state["task_id"]
    if store.kind == "sqlite":
        root, where = os.path.realpath(store.file) + ".calls", task
    else:
        root = os.path.join("/tmp" if os.path.isdir("/tmp") else os.path.dirname(os.path.abspath(store.path)), f"runner-calls-{os.getuid()}")
        where = f"{store.url}\n{task}"
    return Registry(os.path.join(root, sha256_hex(where.encode())[:24]), clock=clock or store.clock, transient=True)


_CURRENT: "contextvars.ContextVar[Optional[Tuple[Registry, Registered]]]" = contextvars.ContextVar("runner_call", default=None)


def current() -> Optional[Tuple[Registry, Registered]]:
    """The call this thread is making, if any: a process it starts belongs to it."""
    return _CURRENT.get()


@contextlib.contextmanager
def calling(registry: Registry, call: Registered) -> Iterator[None]:
    """Within this block, processes started by :func:`runner.commands.run_command` register as ``call``."""
    token = _CURRENT.set((registry, call))
    try:
        yield
    finally:
        _CURRENT.reset(token)
