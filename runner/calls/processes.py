"""Processes of this machine: whether a recorded process is still the call's, and how to end a call's command.

A call record (:mod:`runner.calls.inflight`) is untrusted input: it may have come
with a copied run folder, from another machine, or from anyone who could
write it. This module is the one place that decides whether a live process
is the one a record names. On Linux, from ``/proc``:

* **The caller** (the process that made an in-process call) is believed
  alive when a process with its pid runs (not a zombie), its real uid is
  this process's, and its start time (field 22 of ``/proc/PID/stat``, clock
  ticks since boot) is known and equals the recorded one. It is never killed.
* **A command** (a call that started a process group of its own) lives while
  any process of that group is believed to be the call's: a process whose
  process group (field 5 of ``/proc/PID/stat``) is the recorded leader's pid,
  whose real uid is this process's, which started no earlier than the leader
  (the leader itself: at the recorded start time), and whose environment
  (``/proc/PID/environ``) holds the call's token, ``RUNNER_CALL=...``. So a
  call lives on in a helper its leader left behind, and a record naming an
  unrelated process, however its start time was forged, names no call.
* **Killing** a command's group happens only right after one of its members
  was verified so, with ``killpg``: a process group id is not reused while the
  group has members, so the signal reaches that group and no other.

A process of this user at the recorded start time whose environment cannot
be read (a set-user-id program the command ran) is *unverified*: counted in
flight until the call's deadline, never killed.

Where ``/proc`` is missing (macOS), start times, group members and environments
are unknown: a command's call is counted as alive while its leader, or a
process of its group, exists and may be signalled by this user; nothing is
killed; and a command that still runs past its deadline stops the run for a
person (:func:`runner.execution.lifecycle.next_move`), since it can be neither verified
nor ended.

:class:`Processes` bundles these behind one object, so that a simulation can
stand in for the operating system (``runner/proof/simworld.py``).
"""

import os
import signal
from typing import Iterator, Optional, Tuple

__all__ = ["Processes", "OS_PROCESSES", "proc_stat", "start_time", "VERIFIED", "UNVERIFIED", "GONE"]

Identity = Tuple[int, Optional[str]]

#: What :meth:`Processes.command` finds of a call's command.
VERIFIED, UNVERIFIED, GONE = "verified", "unverified", "gone"


def proc_stat(pid: int) -> Tuple[Optional[bytes], Optional[str]]:
    """The process's state letter and start time (Linux); Nones where unknown."""
    fields = _stat_fields(pid)
    if fields is None:
        return None, None
    return fields[0], fields[19].decode()


def start_time(pid: int) -> Optional[str]:
    """The start time of a live process (not a zombie), or None where unknown."""
    state, start = proc_stat(pid)
    return None if state == b"Z" else start


def _stat_fields(pid: int) -> Optional[list]:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _real_uid(pid: int) -> Optional[int]:
    """The real uid of ``pid`` (the first number of the ``Uid:`` line of ``/proc/PID/status``), or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _holds(pid: int, needle: bytes) -> Optional[bool]:
    """Whether the environment of ``pid`` holds ``needle`` (``NAME=value``); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except PermissionError:
        return None
    except OSError:
        return False  # gone meanwhile
    return data.startswith(needle + b"\0") or (b"\0" + needle + b"\0") in data


def _pids() -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


class Processes:
    """The operating system's processes, as the in-flight registry needs them (see the module)."""

    _me: Optional[Identity] = None

    def me(self) -> Identity:
        """This process: its pid and start time (read once per process; a forked child reads its own)."""
        pid = os.getpid()
        if self._me is None or self._me[0] != pid:
            self._me = (pid, start_time(pid))
        return self._me

    def identity(self, pid: int) -> Identity:
        """``pid`` and its start time, read now: a child of this process, not reaped yet (a zombie keeps it)."""
        return pid, proc_stat(pid)[1]

    def can_find(self) -> bool:
        """Whether start times, process groups and environments can be read here (Linux's ``/proc``)."""
        return os.path.isdir("/proc/self")

    def ours(self, pid: int) -> bool:
        """True while a process of this user with ``pid`` runs (not a zombie), whatever its start time."""
        if not self.can_find():
            return _signalable(pid)
        fields = _stat_fields(pid)
        return fields is not None and fields[0] != b"Z" and _real_uid(pid) == os.getuid()

    def alive(self, pid: int, start: Optional[str]) -> bool:
        """True while the caller recorded as ``(pid, start)`` runs: this user's, at a known and equal start time.

        Where start times cannot be read, a pid this user may signal counts (bounded by the caller's deadline).
        """
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return False
        if not self.can_find():
            return _signalable(pid)
        if start is None:
            return False
        fields = _stat_fields(pid)
        if fields is None or fields[0] == b"Z" or fields[19].decode() != start:
            return False
        return _real_uid(pid) == os.getuid()

    def command(self, leader: int, start: Optional[str], marker: str) -> str:
        """What runs of the command a call started as the leader ``(leader, start)`` of its own process group,
        carrying ``marker`` (``RUNNER_CALL=TOKEN``) in its environment.

        :returns: :data:`VERIFIED` (a member of the group is believed to be the call's, see the module),
            :data:`UNVERIFIED` (no member is, but the leader runs as this user at the recorded start time and
            its environment cannot be read; or start times cannot be read here and the leader, or a process
            of its group, runs as this user's), or :data:`GONE`.
        """
        if not self.can_find():
            # A group id is not given to another group while this one has a member: a helper the leader left
            # behind keeps it, and with it the call, alive.
            return UNVERIFIED if _signalable(leader) or _group_signalable(leader) else GONE
        return GONE if start is None else self._member(leader, start, marker)[0]

    def _member(self, leader: int, start: str, marker: str) -> Tuple[str, Optional[int]]:
        """``(what runs, a verified member's pid)`` of the group ``leader`` led from ``start``, holding ``marker``."""
        needle = marker.encode()
        uid = os.getuid()
        found = GONE
        fields = _stat_fields(leader)
        if fields is not None and fields[0] != b"Z" and fields[19].decode() == start and _real_uid(leader) == uid:
            holds = _holds(leader, needle)
            if holds:
                return VERIFIED, leader
            if holds is None:
                found = UNVERIFIED
        try:
            since = int(start)
        except ValueError:
            return found, None
        me = os.getpid()
        for pid in _pids():
            if pid == leader or pid == me:
                continue
            fields = _stat_fields(pid)
            # The group's members: in the leader's group, alive, started no earlier than the leader.
            if fields is None or fields[0] == b"Z" or fields[2] != str(leader).encode() or int(fields[19]) < since:
                continue
            if _real_uid(pid) == uid and _holds(pid, needle):
                return VERIFIED, pid
        return found, None

    def kill_command(self, leader: int, start: Optional[str], marker: str) -> bool:
        """SIGKILL the process group ``leader`` led, right after verifying one of its members; return whether it was.

        Never this process's own group; never where start times cannot be read.
        """
        if not self.can_find() or start is None:
            return False
        state, member = self._member(leader, start, marker)
        if state != VERIFIED or member is None:
            return False
        try:
            if leader == os.getpgrp():
                return False  # never kill ourselves with it
            os.killpg(leader, signal.SIGKILL)
        except OSError:
            return False
        return True

    def find_by_environment(self, marker: str) -> Optional[Identity]:
        """A live process of this user whose environment holds ``marker`` (``NAME=value``), or None (also where
        unknowable)."""
        if not self.can_find():
            return None
        needle = marker.encode()
        me, uid = os.getpid(), os.getuid()
        for pid in _pids():
            if pid == me:
                continue
            if _holds(pid, needle) and _real_uid(pid) == uid:
                start = start_time(pid)
                if start is not None:
                    return pid, start
        return None


def _signalable(pid: int) -> bool:
    """Whether a process ``pid`` exists that this user may signal (where nothing else can be read)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # gone, or another user's
        return False
    return True


def _group_signalable(group: int) -> bool:
    """Whether a process group ``group`` exists with a member this user may signal (where nothing else can be read)."""
    if not isinstance(group, int) or isinstance(group, bool) or group <= 1:
        return False
    try:
        os.killpg(group, 0)
    except OSError:  # no such group, or none of its members is this user's
        return False
    return True


#: The real operating system.
OS_PROCESSES = Processes()
