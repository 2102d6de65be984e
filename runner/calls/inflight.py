"""Calls in flight: every call the runner starts, registered before it starts, findable by any later process here.

Before the executor observes or invokes a key, it registers the call: the
key, the attempt, the kind of call, the calling process (pid and start
time), a random token and a deadline. A command the call starts
(:func:`runner.calls.commands.run_command`) adds its own process, the leader of
a process group of its own, as soon as it exists, and carries the token
in its environment (``RUNNER_CALL``), so that even a command started in the
instant before its caller died can be found. A call that runs several
commands one after another (a git release) is its caller's again between
them (:meth:`Registry.command_ended`). Before a later process observes
or invokes the same key it reads these records (:meth:`Registry.calls`):

* a call whose processes still run is in flight: the reader waits for it
  until its deadline; after the deadline, a command's process group is
  killed and waited for; an in-process call is the process that made it, and
  counts as ended once that process is gone or its deadline passed. A
  command's call lives while any process of its group runs, not only its
  leader: a helper the leader left behind may still be sending;
* a call whose processes are gone ended when that was first seen; the time is
  written back, so every later reader agrees when the target's settle time
  began (:func:`runner.execution.lifecycle.quiet_since`).

**A record is untrusted input.** It may have come with a copied run folder,
from another machine or from another user. The runner waits for a record's
processes, or kills them, only when :mod:`runner.calls.processes` believes them to
be the call's: this user's, at a known start time that matches, carrying the
call's token. What cannot be a record this runner wrote is moved aside into
the folder's ``set-aside/`` by a rename (never opened in a way that can block,
never followed through a link), with a note saying what it was, and reported
by ``doctor`` and ``brief`` until a person removes it (:func:`findings`):
anything that is not a regular file of this user's, a name the runner does
not give, unreadable JSON (but the empty record of a live writer, see
:meth:`Registry.sweep`), a key that does not match its name, a missing token,
a missing start time where start times can be read, another machine's name, a deadline later than
its registration plus :data:`MAX_CALL_SECONDS` and :data:`GRACE_SECONDS`, or a
registration more than :data:`CLOCK_SKEW_SECONDS` in the future.

Storage: one small JSON file per call, replaced whole by a rename and never
fsync'd (no call outlives a power loss of the machine, and a SIGKILL leaves
every written file in place). A file store keeps them in the run folder's
``calls/``. A SQLite run keeps them in a folder per run beside its database
file (``runs.db.calls/``), named from the file's real path, so that every
process finds the same records however it spelled that path. A PostgreSQL
run keeps them in a folder per run under ``/tmp/runner-calls-UID/``, a root of
this user's own, so that every process of the machine finds them whatever
its working folder or ``TMPDIR``; the folder is named from the run's identity
in the database (:meth:`runner.stores.postgres.PostgresStore.identity`), not
from the URL as typed, so ``localhost`` and ``127.0.0.1`` find the same calls.
A database run's folder exists only while a call is in it: the last record
removed takes it with it (a SQLite run's root too; the PostgreSQL root stays,
so that no other user can take its name meanwhile).

**The folders are this user's own.** The registry makes its folders with
mode 0700, and on every use checks, without following links, that its folder
(and a database run's root) is a folder owned by this user that neither group
nor others may write, and refuses otherwise (:class:`~runner.base.errors.InvalidInput`,
naming the folder, its owner and its mode), so that no other user can remove
or replace a record while its call is in flight. Workers of two users on one run therefore never miss each other's
calls: a shared folder is refused to the second user, and a PostgreSQL run,
whose roots are per user, refuses to observe or invoke an effect ``started``
by another user of this machine (the ``begun_by`` of its record).

A call's payload file lives beside its record and goes with it, and so do the
answer files of an invoke command (its stdout, its stderr, and its exit
status, written by what runs the command in the call's own process group:
:func:`runner.calls.commands.run_command`), so that a process that takes over
from a caller that died can read what the command answered
(:func:`runner.calls.commands.left_answer`). A record is
removed when its outcome is recorded in the ledger (or, for a call whose
caller died, when an outcome recorded after its end supersedes it);
:meth:`Registry.sweep` removes what killed processes left behind for effects
that are no longer unresolved.
"""

import contextlib
import contextvars
import json
import math
import os
import re
import stat
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Literal, NamedTuple, Optional, Tuple, cast

from ..base.times import format_time
from ..base.canonical import canonical_json, sha256_hex
from ..base.errors import InvalidInput
from .processes import GONE, OS_PROCESSES, VERIFIED, Processes
from ..base.host import local_maker

__all__ = ["Call", "CallKind", "Registry", "Registered", "AnswerFiles", "SetAside", "registry_for", "findings",
           "current", "calling", "payload_file", "TOKEN_VARIABLE", "GRACE_SECONDS", "MAX_CALL_SECONDS",
           "CLOCK_SKEW_SECONDS", "CALLS", "SET_ASIDE"]

#: The environment variable that carries a call's token into the processes it starts.
TOKEN_VARIABLE = "RUNNER_CALL"

#: Seconds after a call's own timeout before its deadline: time to record what it answered.
GRACE_SECONDS = 2.0

#: The longest time one call may take: the contract's bound for ``effects.timeout_seconds`` (a day). A record whose
#: deadline lies further from its registration is none of the runner's, whatever plan the run had when it was made.
MAX_CALL_SECONDS = 86400.0

#: How far in the future a record's registration may lie (the clock stepped back since it was written).
CLOCK_SKEW_SECONDS = 300.0

#: A run folder's registry folder.
CALLS = "calls"
#: The folder, inside the registry's, where what cannot be a call is moved.
SET_ASIDE = "set-aside"

_SUFFIX = ".json"
_PAYLOAD = ".payload"
#: An invoke command's answer files (:meth:`Registry.answer_files`): its stdout, its stderr, its exit status.
_ANSWER = (".out", ".err", ".exit")
_TEMPORARY = ".new"
#: The largest record read; a record the runner writes is a few hundred bytes.
_MAX_RECORD_BYTES = 1 << 16
#: The names the runner gives a call's files: ``PREFIX.PID-COUNT-RANDOM`` and a suffix.
_NAME = re.compile(r"^[0-9a-f]{20}\.([0-9]{1,10})-[0-9]{1,12}-[0-9a-f]{6}"
                   r"(\.json|\.json\.new|\.payload|\.out|\.err|\.exit)$")
_TOKEN = re.compile(r"^[0-9a-f]{24}$")
#: This machine's name, written into each record: a record written elsewhere (a run folder copied with its
#: ``calls/``) names processes of that machine, never of this one.
_HOST = local_maker()["host"]
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: What :meth:`Registry._read` says of an empty record (its writer is writing it, or died after creating it).
_EMPTY = "empty"


#: The two kinds of call the registry records (its records' ``kind``).
CallKind = Literal["invoke", "observe"]


class Call(NamedTuple):
    """An earlier call of the key, as the in-flight registry sees it now.

    ``killable``: the call is a command whose process group holds a process
    verified to be the call's (:mod:`runner.calls.processes`), which may be killed
    once its deadline passed; an in-process call is the process that made it,
    and a command none of whose processes could be verified is waited for
    until its deadline, never killed. ``command``: the call started a
    process group of its own (``pid`` leads it). ``ended_at``: when it was
    seen to end (None while alive).
    """

    alive: bool
    deadline: float
    killable: bool
    ended_at: Optional[float]
    pid: int = 0
    kind: CallKind = "invoke"
    command: bool = False


class Registered:
    """One registered call: its record as stored, and its file's name.

    ``payload``: a payload file was written beside the record; ``answer``: answer files may have been (see
    :meth:`Registry.answer_files`). ``returned`` and
    ``abandoned`` meet under a lock: whichever of "the call returned" and "its
    loop gave up on it" comes second writes the call's end (see :meth:`Registry.returned`).
    """

    __slots__ = ("name", "record", "payload", "answer", "returned", "abandoned", "lock")

    def __init__(self, name: str, record: Dict[str, Any]) -> None:
        self.name, self.record = name, record
        self.payload = self.answer = False
        self.returned = self.abandoned = False
        self.lock = threading.Lock()

    @property
    def key(self) -> str:
        return str(self.record["key"])

    @property
    def marker(self) -> str:
        """The environment entry the call's processes carry."""
        return f"{TOKEN_VARIABLE}={self.record['token']}"

    def view(self, alive: bool, killable: bool) -> Call:
        """The call as :func:`runner.execution.lifecycle.next_move` weighs it (``killable``: a process of it was
        verified)."""
        child = self.record.get("child")
        return Call(alive, float(self.record["deadline"]), killable, self.record.get("ended_at"),
                    int((child or self.record["caller"])[0]), cast(CallKind, str(self.record.get("kind", "invoke"))),
                    child is not None)


class AnswerFiles(NamedTuple):
    """Where a call's command leaves its answer, beside the call's record and removed with it: its stdout, its
    stderr, and its exit status, written when it ends (:func:`runner.calls.commands.run_command`)."""

    stdout: str
    stderr: str
    status: str


class SetAside(NamedTuple):
    """One item moved aside: its name there, the name it had, why, and when (None where no note says)."""

    item: str
    name: Optional[str]
    why: Optional[str]
    at: Optional[str]


class Registry:
    """The calls in flight of one run, in ``folder``.

    :param processes: the operating system's processes (a simulation may stand in).
    :param clock: seconds since the epoch (the run's clock).
    :param transient: ``folder`` is removed whenever the last record in it is, and ``root`` with it
        unless ``keep_root`` (a database run's registry, which lives outside any run folder).
    :param root: the folder that holds ``folder``, made by the registry and held to the same checks
        (a database run's; None for a run folder's ``calls/``).
    :param effects: the run's effects, for a registry that only this user can read (a PostgreSQL
        run's): an effect another user of this machine began is refused (see :meth:`calls`).
    """

    def __init__(self, folder: str, processes: Processes = OS_PROCESSES, clock: Callable[[], float] = time.time,
                 transient: bool = False, root: Optional[str] = None, keep_root: bool = False,
                 effects: Optional[Callable[[], Dict[str, Any]]] = None) -> None:
        self.folder, self.processes, self.clock = folder, processes, clock
        self.transient, self.root, self.keep_root = transient, root, keep_root
        self.effects = effects
        self._made = False
        self._count = 0

    # -- the folders ------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse folders that are not this user's own, and effects begun by another user this registry cannot see.

        :raises InvalidInput: the folder or its root exists and is a link, not a folder, another user's,
            or writable by group or others; or (a per-user registry) a started effect was begun by another user here.
        """
        self._verify()
        if self.effects is not None:
            me = local_maker()
            for key, effect in sorted(self.effects().items()):
                _refuse_another_users(key, effect, me)

    def _verify(self) -> bool:
        """Check the root and the folder as they are now; return whether the folder exists.

        :raises InvalidInput: see :meth:`check`.
        """
        if self.root is not None:
            _check_folder(self.root)
        return _check_folder(self.folder)

    def _ensure(self) -> None:
        """Make the root and the folder where missing (mode 0700), checking each before anything goes into it
        (another user may have made it first).

        :raises InvalidInput: see :meth:`check`.
        """
        if not self._made:
            top = self.root if self.root is not None else self.folder
            parent = os.path.dirname(top)
            if parent and not os.path.isdir(parent):
                os.makedirs(parent, mode=0o700, exist_ok=True)
            for folder in (self.root, self.folder):
                if folder is not None:
                    _make_folder(folder)
                    _check_folder(folder)
        self._verify()
        self._made = True

    # -- storage --------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _write(self, call: Registered, new: bool = False) -> None:
        """Write ``call``'s record: a ``new`` one in place (a reader that finds it empty ignores it, which is
        safe while nothing of the call is begun), a changed one through a new file renamed over it."""
        data = json.dumps(call.record, sort_keys=True).encode()
        path = self._path(call.name)
        temporary = path if new else path + _TEMPORARY
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if new else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
        for tries_left in range(100, 0, -1):
            try:
                self._ensure()
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

    def _read(self, name: str) -> Tuple[Optional[Registered], str]:
        """Read one entry without ever blocking or following a link.

        :returns: ``(call, "")`` for a record that may be a call; ``(None, "")`` for an entry gone meanwhile;
            ``(None, "empty")`` for an empty record; ``(None, why)`` for anything that cannot be a call.
        """
        path = self._path(name)
        try:
            before = os.lstat(path)
        except FileNotFoundError:
            return None, ""
        if not stat.S_ISREG(before.st_mode):
            return None, f"it is {_kind(before.st_mode)}, not a file"
        if hasattr(os, "getuid") and before.st_uid != os.getuid():
            return None, f"it is a file of uid {before.st_uid}, not of this user"
        if before.st_size > _MAX_RECORD_BYTES:
            return None, f"it holds {before.st_size} bytes, more than any call record"
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            return None, f"it cannot be opened ({exc.strerror or exc})"
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(now.st_mode):
                return None, ""  # replaced meanwhile (by a writer's rename): the next look reads what is there
            data = os.read(fd, _MAX_RECORD_BYTES + 1)
        finally:
            os.close(fd)
        if not data:
            return None, _EMPTY
        try:
            record = json.loads(data.decode())
        except ValueError:
            return None, "it is not a JSON call record"
        why = self._problem(name, record)
        return (None, why) if why else (Registered(name, record), "")

    def _problem(self, name: str, record: Any) -> Optional[str]:
        """Why ``record``, read from ``name``, cannot be a call this runner registered (None when it may be)."""
        if not isinstance(record, dict):
            return "it is not a JSON object"
        key = record.get("key")
        named = _NAME.match(name)
        if not isinstance(key, str) or named is None or named.group(2) != _SUFFIX:
            return "its key does not match its name"
        if not name.startswith(self._prefix(key)):
            return "its key does not match its name"
        if record.get("kind") not in ("invoke", "observe"):
            return "it names no kind of call"
        caller, child = _identity(record.get("caller")), _identity(record.get("child"))
        if caller is None or (record.get("child") is not None and child is None):
            return "it names no process as a pid and a start time"
        if self.processes.can_find() and (caller[1] is None or (child is not None and child[1] is None)):
            return "a start time is missing, which this machine knows for every process"
        if not isinstance(record.get("token"), str) or not _TOKEN.match(record["token"]):
            return "it carries no call token"
        # JSON values, numbers once the line below has checked them
        registered: Any = record.get("registered_at")
        deadline: Any = record.get("deadline")
        ended: Any = record.get("ended_at")
        if not (_finite(registered) and _finite(deadline) and (ended is None or _finite(ended))):
            return "its times are not numbers"
        if registered > self.clock() + CLOCK_SKEW_SECONDS:
            return "it was registered in the future"
        if not registered < deadline <= registered + MAX_CALL_SECONDS + GRACE_SECONDS:
            return f"its deadline is more than {MAX_CALL_SECONDS + GRACE_SECONDS:g} s after its registration"
        if caller[0] != int(named.group(1)):
            return "its caller is not the process its name gives"
        if "host" in record and record["host"] != _HOST:
            return f"it was written on another machine ({str(record['host'])[:60]!r}), whose processes these are not"
        return None

    def _entries(self) -> List[str]:
        """Every name in the folder, the set-aside folder's but for."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n != SET_ASIDE)

    def _names(self, prefix: str = "") -> List[str]:
        return [n for n in self._entries() if n.startswith(prefix) and n.endswith(_SUFFIX)]

    def _remove(self, call: Registered, payload: bool = True, answer: bool = True) -> None:
        """Remove the call's files, its record last: a record left by a kill in between still names the rest."""
        paths = ([self.payload_path(call)] if payload else []) + (list(self.answer_files(call)) if answer else [])
        for path in paths + [self._path(call.name)]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._tidy()

    def _unlink(self, name: str) -> bool:
        try:
            os.unlink(self._path(name))
        except OSError:
            return False
        return True

    def _tidy(self) -> None:
        """A transient registry's folder, then its root (unless kept), removed if empty (a writer that loses the race
        makes them again)."""
        if not self.transient:
            return
        for folder in (self.folder, None if self.keep_root else self.root):
            if folder is None:
                return
            try:
                os.rmdir(folder)
            except OSError:  # not empty (or already gone): nothing more to remove
                return
            self._made = False

    def _set_aside(self, name: str, why: str) -> None:
        """Move the entry ``name`` into ``set-aside/`` by a rename (which opens nothing), with a note of why."""
        aside = os.path.join(self.folder, SET_ASIDE)
        try:
            os.mkdir(aside, 0o700)
        except FileExistsError:
            pass
        _check_folder(aside)
        item = f"{int(self.clock() * 1000)}-{os.urandom(4).hex()}"
        try:
            os.rename(self._path(name), os.path.join(aside, item + ".item"))
        except FileNotFoundError:
            return  # another reader moved it first
        note = json.dumps({"name": name, "why": why, "at": format_time(self.clock())}, sort_keys=True).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(aside, item + ".note"), flags, 0o600)
            try:
                os.write(fd, note)
            finally:
                os.close(fd)

    def set_aside(self) -> List[SetAside]:
        """What was moved aside, oldest first: each item with what its note says."""
        aside = os.path.join(self.folder, SET_ASIDE)
        try:
            if not _check_folder(aside):
                return []
            names = sorted(os.listdir(aside))
        except (InvalidInput, OSError):
            return [SetAside(SET_ASIDE, None, "the set-aside folder is not this user's own folder", None)]
        out = []
        for name in names:
            if name.endswith(".note"):
                continue
            stem = name[: -len(".item")] if name.endswith(".item") else name
            note = _read_note(os.path.join(aside, stem + ".note")) if stem != name else {}
            out.append(SetAside(name, note.get("name"), note.get("why"), note.get("at")))
        return out

    def findings(self) -> List[Any]:
        """What ``doctor`` and ``brief`` report, each a :class:`runner.stores.base.Finding` of level ``foreign``: a
        refused folder, entries that cannot be calls (still in place, or moved aside). Changes nothing, and never
        raises for what it finds."""
        from ..stores.base import Finding

        try:
            self.check()
            if not self._verify():
                return []
        except InvalidInput as exc:
            return [Finding("foreign", "calls-refused", exc.message)]
        out = []
        for name in self._entries():
            named = _NAME.match(name)
            if named is None:
                why = "the runner gives no file of a call such a name"
            elif named.group(2) != _SUFFIX:
                continue
            else:
                why = self._read(name)[1]
            if why and why != _EMPTY:
                where = os.path.join(self.folder, _shown(name))
                out.append(Finding("foreign", "call-record-foreign", f"{where}: {why}; it is no call of this runner's, "
                                                                     f"and the next drive moves it into {SET_ASIDE}/"))
        for item in self.set_aside():
            said = f"{_shown(item.name)}: {item.why}" if item.name else (item.why or "no note says what it was")
            when = f" at {item.at}" if item.at else ""
            where = os.path.join(self.folder, SET_ASIDE, item.item)
            out.append(Finding("foreign", "call-record-set-aside", f"{where} ({said}) was set aside{when}; look at it, "
                                                                   "then remove it"))
        return out

    def _take(self, name: str, tidy: bool) -> Tuple[Optional[Registered], bool]:
        """``(the call recorded at name, False)``, or ``(None, removed)``: what cannot be a call is moved aside;
        with ``tidy``, an empty record whose writer has ended is removed (``removed``)."""
        call, why = self._read(name)
        if call is not None:
            return call, False
        if why == _EMPTY:
            return None, tidy and not self._writer_runs(name) and self._unlink(name)
        if why:
            self._set_aside(name, why)
        return None, False

    def _writer_runs(self, name: str) -> bool:
        """Whether the process that created ``name`` (its pid is in the name) may still be writing it."""
        named = _NAME.match(name)
        return named is not None and self.processes.ours(int(named.group(1)))

    @staticmethod
    def _prefix(key: str) -> str:
        return sha256_hex(key.encode("utf-8"))[:20] + "."

    # -- the calls of this process ----------------------------------------------------------------
    def register(self, key: str, kind: str, attempt: int, timeout: float, owner: Optional[str] = None,
                 epoch: Optional[int] = None) -> Registered:
        """Record a call of ``key`` about to start (before anything of it is done); return its handle.

        :raises InvalidInput: ``timeout`` is not a number of seconds up to :data:`MAX_CALL_SECONDS`, or the
            folder is refused (see :meth:`check`).
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_CALL_SECONDS:
            raise InvalidInput(f"a call's time must be a positive number of seconds up to {MAX_CALL_SECONDS:g} "
                               f"(a day), not {timeout!r}")
        pid, start = self.processes.me()
        self._count += 1
        name = f"{self._prefix(key)}{pid}-{self._count}-{os.urandom(3).hex()}{_SUFFIX}"
        now = self.clock()
        call = Registered(name, {
            "key": key, "kind": kind, "attempt": attempt, "owner": owner, "epoch": epoch,
            "caller": [pid, start], "child": None, "token": os.urandom(12).hex(),
            "registered_at": now, "deadline": now + float(timeout) + GRACE_SECONDS, "ended_at": None,
            "host": _HOST,
        })
        self._write(call, new=True)
        return call

    def spawned(self, call: Registered, pid: int) -> None:
        """The call started a process, the leader of its own group: it is now what must end."""
        call.record["child"] = list(self.processes.identity(pid))
        self._write(call)

    def command_ended(self, call: Registered) -> None:
        """The process the call started ended, and its caller goes on (a call of several commands): the call lives
        again while its caller does, until its deadline, as before it started that process."""
        if call.record.get("child") is not None:
            call.record["child"] = None
            self._write(call)

    def payload_path(self, call: Registered) -> str:
        """Where the call's payload file goes: beside its record, removed with it."""
        call.payload = True
        return self._path(call.name[: -len(_SUFFIX)] + _PAYLOAD)

    def answer_files(self, call: Registered) -> AnswerFiles:
        """Where the call's command leaves its answer: beside its record, removed with it."""
        call.answer = True
        stem = self._path(call.name[: -len(_SUFFIX)])
        return AnswerFiles(*(stem + suffix for suffix in _ANSWER))

    def read_kept(self, path: str, limit: int) -> Optional[bytes]:
        """The first ``limit`` bytes of the answer file ``path``, read without blocking or following a link; None
        unless it is a regular file of this user's."""
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError:
            return None
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or (hasattr(os, "getuid") and found.st_uid != os.getuid()):
                return None
            kept = bytearray()
            while len(kept) < limit:
                data = os.read(fd, min(limit - len(kept), 1 << 16))
                if not data:
                    break
                kept += data
            return bytes(kept)
        finally:
            os.close(fd)

    def finish(self, call: Registered) -> None:
        """The call's outcome is recorded in the ledger: forget it."""
        self._remove(call, payload=call.payload, answer=call.answer)

    def ended(self, call: Registered) -> None:
        """The call ended but its outcome could not be recorded: keep it, with its end, for whoever comes next."""
        call.record["ended_at"] = self.clock()
        try:
            self._write(call)
        except OSError:
            pass

    def returned(self, call: Registered) -> None:
        """The call's own thread: it returned. If its loop gave up on it meanwhile, write its end for whoever comes
        next."""
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
        """Every recorded call of ``key`` and its state now; a call first seen ended gets its end written.

        What cannot be a call is moved aside on the way (see the module).

        :raises InvalidInput: the folder is refused (see :meth:`check`), or this registry cannot see the calls
            of the user who began ``key``'s effect.
        """
        if self.effects is not None:
            _refuse_another_users(key, self.effects().get(key), local_maker())
        if not self._verify():
            return []
        out = []
        for name in self._names(self._prefix(key)):
            call = self._take(name, tidy=False)[0]
            if call is not None:
                out.append((call, call.view(*self._alive(call))))
        return out

    def _alive(self, call: Registered) -> Tuple[bool, bool]:
        """``(alive, killable)`` of a call now: its processes as :mod:`runner.calls.processes` believes them."""
        record = call.record
        if record.get("ended_at") is not None:
            return False, False
        alive = killable = False
        child = record.get("child")
        if child:
            found = self.processes.command(int(child[0]), child[1], call.marker)
            alive, killable = found != GONE, found == VERIFIED
        elif self.processes.alive(int(record["caller"][0]), record["caller"][1]):
            alive = True
        else:
            # The caller is gone: a command it started in its last instant carries the token.
            found_child = self.processes.find_by_environment(call.marker)
            if found_child is not None:
                record["child"] = list(found_child)
                self._write(call)
                found = self.processes.command(found_child[0], found_child[1], call.marker)
                alive, killable = found != GONE, found == VERIFIED
            elif not self.processes.can_find() and self.clock() < float(record["deadline"]):
                alive = True  # nothing here can tell: count it in flight until its deadline
        if not alive:
            record["ended_at"] = self.clock()
            try:
                self._write(call)
            except OSError:
                pass
        return alive, killable

    def kill(self, call: Registered) -> None:
        """End a call past its deadline: SIGKILL its process group, once a member was verified to be the call's."""
        child = call.record.get("child")
        if child:
            self.processes.kill_command(int(child[0]), child[1], call.marker)

    def forget_ended(self, key: str) -> None:
        """An outcome recorded after these calls ended supersedes them: remove the ended calls of ``key``."""
        for call, view in self.calls(key):
            if not view.alive:
                self._remove(call)

    def sweep(self, unresolved: Callable[[str], bool]) -> int:
        """Remove the ended calls of keys that are not unresolved, with their payload files, the records dead writers
        left empty, and the temporary files of writers that died mid-write; move aside what cannot be a call's file.
        Return how many records were removed.

        :raises InvalidInput: the folder is refused (see :meth:`check`).
        """
        if not self._verify():
            return 0
        removed = 0
        for name in self._entries():
            named = _NAME.match(name)
            if named is None:
                self._set_aside(name, "the runner gives no file of a call such a name")
            elif named.group(2) == _SUFFIX + _TEMPORARY:
                self._unlink(name)
            elif named.group(2) == _SUFFIX:
                call, abandoned = self._take(name, tidy=True)
                if call is None:
                    removed += abandoned
                elif not unresolved(call.key) and not self._alive(call)[0]:
                    self._remove(call)
                    removed += 1
        self._tidy()
        return removed


def _refuse_another_users(key: str, effect: Optional[Dict[str, Any]], me: Dict[str, Any]) -> None:
    """Refuse a ``started`` effect begun by another user of this machine (``me``: its host and this user), whose
    calls in flight this user cannot see.

    :raises InvalidInput: it is one.
    """
    if not isinstance(effect, dict) or effect.get("state") != "started" or not isinstance(effect.get("begun_by"), dict):
        return  # settled, or begun before the ledger said who began it
    by = effect["begun_by"]
    if by.get("host") == me["host"] and by.get("uid") != me["uid"]:
        raise InvalidInput(f"effect {key!r} was begun by uid {by.get('uid')} on this machine, and its call may still "
                           f"be on its way: this user (uid {me['uid']}) cannot see that user's calls in flight; "
                           f"resolve it as uid {by.get('uid')}", key=key, begun_by=by)


def _identity(value: Any) -> Optional[Tuple[int, Optional[str]]]:
    """A recorded ``[pid, start]`` (start: decimal clock ticks, or None), or None if it is not one."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    pid, start = value
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 1 << 31:
        return None
    if start is not None and (not isinstance(start, str) or not start.isdigit() or len(start) > 20):
        return None
    return pid, start


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    for test, what in kinds:
        if test(mode):
            return what
    return "not a regular file"


def _make_folder(path: str) -> None:
    """Make ``path`` with mode 0700 unless something is there (what is there is checked next, never changed)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # the umask may have narrowed it


def _check_folder(path: str) -> bool:
    """Whether ``path`` exists; it must then be a folder (not a link) of this user's that no one else can write.

    Read access for others is let be (a run folder copied or cloned has mode 0755): what must be kept from
    anyone else is the power to remove or replace a record while its call is in flight.

    :raises InvalidInput: it is not, naming the folder, its owner and its mode.
    """
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    if not hasattr(os, "getuid"):
        return True
    me = os.getuid()
    if stat.S_ISLNK(found.st_mode):
        problem = "it is a symbolic link"
    elif not stat.S_ISDIR(found.st_mode):
        problem = f"it is {_kind(found.st_mode)}, not a folder"
    elif found.st_uid != me or found.st_mode & 0o022:
        problem = f"it is owned by uid {found.st_uid} with mode {stat.S_IMODE(found.st_mode):04o}"
    else:
        return True
    raise InvalidInput(f"refusing the calls-in-flight folder {path}: {problem}; calls in flight are kept only in "
                       f"a folder of this user's own (uid {me}) that no one else can write (mode 0700): remove it "
                       "(or, if it is this user's, chmod 700 it) and run again", folder=path)


def _read_note(path: str) -> Dict[str, Any]:
    """A set-aside note's fields (``name``, ``why``, ``at``), read as carefully as a record; empty if unreadable."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        note = json.loads(data.decode())
    except ValueError:
        return {}
    return {k: str(note[k])[:300] for k in ("name", "why", "at") if isinstance(note, dict) and note.get(k) is not None}


def registry_for(store: Any, clock: Optional[Callable[[], float]] = None) -> Registry:
    """The registry of the run ``store`` holds: the run folder's ``calls/``, or a folder per database run (see above).

    :raises InvalidInput: its folder is refused, or it cannot see calls another user began (see :meth:`Registry.check`).
    """
    registry = _locate(store, clock)
    if registry is None:
        kind = getattr(store, "kind", type(store).__name__)
        raise InvalidInput(f"a {kind} store keeps no calls in flight on this machine")
    registry.check()
    return registry


def _locate(store: Any, clock: Optional[Callable[[], float]]) -> Optional[Registry]:
    """The registry of ``store``'s run, unchecked; None for a kind of store that keeps no calls on this machine.

    :raises InvalidInput: a PostgreSQL run is gone from its database.
    """
    from ..stores.file import RunStore

    clock = clock or store.clock
    if isinstance(store, RunStore):
        return Registry(os.path.join(store.path, CALLS), clock=clock)
    kind = getattr(store, "kind", None)
    if kind == "sqlite":
        root = os.path.realpath(store.file) + ".calls"
        folder = os.path.join(root, sha256_hex(store.state["task_id"].encode())[:24])
        return Registry(folder, clock=clock, transient=True, root=root)
    if kind == "postgresql":
        # A root of this user's own on this machine, a folder named from what the database says the run is.
        base = "/tmp" if os.path.isdir("/tmp") else os.path.dirname(os.path.abspath(store.path))
        root = os.path.join(base, f"runner-calls-{os.getuid()}")
        folder = os.path.join(root, sha256_hex(store.identity().encode())[:24])
        return Registry(folder, clock=clock, transient=True, root=root, keep_root=True,
                        effects=lambda: store.state["effects"])
    return None


def findings(store: Any) -> List[Any]:
    """What ``doctor`` and ``brief`` report of the calls in flight of the run ``store`` holds (see
    :meth:`Registry.findings`); nothing for a store that keeps no calls here."""
    from ..stores.base import Finding

    try:
        registry = _locate(store, None)
    except InvalidInput as exc:
        return [Finding("foreign", "calls-refused", exc.message)]
    return registry.findings() if registry is not None else []


def _shown(name: str) -> str:
    """A file name as one line of a message: printable, quoted when it needs to be, at most 100 characters."""
    text = name if name.isprintable() and " " not in name else json.dumps(name)
    return text if len(text) <= 100 else text[:99] + "…"


_CURRENT: "contextvars.ContextVar[Optional[Tuple[Registry, Registered]]]" = contextvars.ContextVar(
    "runner_call", default=None)


def current() -> Optional[Tuple[Registry, Registered]]:
    """The call this thread is making, if any: a process it starts belongs to it."""
    return _CURRENT.get()


@contextlib.contextmanager
def calling(registry: Registry, call: Registered) -> Iterator[None]:
    """Within this block, processes started by :func:`runner.calls.commands.run_command` register as ``call``."""
    token = _CURRENT.set((registry, call))
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def payload_file(payload: Dict[str, Any]) -> Iterator[str]:
    """``payload`` as canonical JSON in a private file (0600, never through a link) for a command, removed after it.

    Within :func:`calling` the file sits beside the call's record, so it is removed with the record even after a
    kill; otherwise in a temporary folder of its own.
    """
    import shutil  # here: status and the views import this module and must not load shutil's compressors
    import tempfile

    making = current()
    folder = None if making is not None else tempfile.mkdtemp(prefix="runner-payload-")
    path = making[0].payload_path(making[1]) if making is not None else os.path.join(folder or "", "payload.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, canonical_json(payload))
        finally:
            os.close(fd)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
