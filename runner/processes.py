"""Processes of this machine: is a recorded process still the one recorded, and how to end one.

A pid alone can be reused; a pid with its start time names one process. On
Linux the start time is the 22nd field of ``/proc/PID/stat`` (clock ticks
since boot). Where ``/proc`` is missing (macOS), start times are unknown: a
pid that exists is taken as alive, and :func:`find_by_environment` finds
nothing, so callers fall back to waiting out a deadline.

:class:`Processes` bundles these behind one object, so that a simulation can
stand in for the operating system (``runner/proof/simulation.py``).
"""

import os
import signal
from typing import Optional, Tuple

__all__ = ["Processes", "OS_PROCESSES", "proc_stat", "start_time"]

Identity = Tuple[int, Optional[str]]


def proc_stat(pid: int) -> Tuple[Optional[bytes], Optional[str]]:
    """The process's state letter and start time (Linux); Nones where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0], fields[19].decode()
    except (OSError, IndexError):
        return None, None


def start_time(pid: int) -> Optional[str]:
    """The start time of a live process (not a zombie), or None where unknown."""
    state, start = proc_stat(pid)
    return None if state == b"Z" else start


class Processes:
    """The operating system's processes, as the in-flight registry needs them."""

    _me: Optional[Identity] = None

    def me(self) -> Identity:
        """This process: its pid and start time (read once per process; a forked child reads its own)."""
        pid = os.getpid()
        if self._me is None or self._me[0] != pid:
            self._me = (pid, start_time(pid))
        return self._me

    def identity(self, pid: int) -> Identity:
        """``pid`` and its start time, read now (while it is known to run)."""
        return pid, start_time(pid)

    def alive(self, pid: int, start: Optional[str]) -> bool:
        """True while the process recorded as ``(pid, start)`` runs (a zombie has ended). Never reaps."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        if os.path.isdir("/proc"):
            current = start_time(pid)
            return current is not None and (start is None or current == start)
        return True

    def find_by_environment(self, marker: str) -> Optional[Identity]:
        """A live process whose environment holds ``marker`` (``NAME=value``), or None (also where unknowable)."""
        if not os.path.isdir("/proc"):
            return None
        needle = marker.encode() + b"\0"
        me = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as handle:
                    data = handle.read(1 << 20)
            except OSError:
                continue
            if data.startswith(needle) or (b"\0" + needle) in data:
                start = start_time(int(name))
                if start is not None:
                    return int(name), start
        return None

    def can_find(self) -> bool:
        """Whether :meth:`find_by_environment` can see other processes' environments here."""
        return os.path.isdir("/proc")

    def kill_group(self, pid: int) -> None:
        """SIGKILL the process group ``pid`` leads (or, failing that, the process itself)."""
        try:
            group = os.getpgid(pid)
            if group == os.getpgrp():
                raise OSError("the group is this process's own")  # never kill ourselves with it
            os.killpg(group, signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


#: The real operating system.
OS_PROCESSES = Processes()
