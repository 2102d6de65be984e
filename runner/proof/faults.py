"""Fault injection through the core's observers: die at a named commit window, or record the windows passed.

Every crash proof of the project (the campaign, the demo and its worker
pool, the crash children of the test suite) kills its process through the
objects here, handed to the core as ``observer=`` (see :mod:`runner.base.windows`).
Nothing here knows a file name or a private method: a window is chosen by
name, a pass by its number and, when needed, by the facts the core reports
with it (``key`` of an effect, for instance).
"""

import json
import os
import signal
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..base.windows import Observer, check_window

__all__ = ["die", "KillAt", "KillAfterSeconds", "LoseAnswerThenKill", "Recorder", "Chain", "kill_point",
           "lose_next_answer"]


def die() -> None:
    """SIGKILL this process now, after flushing what it printed (so the parent sees every line before the death)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


class _Passes:
    """Counts passes through one window whose facts include every item of ``where``."""

    def __init__(self, window: str, where: Optional[Dict[str, Any]] = None) -> None:
        self.window = check_window(window)
        self.where = dict(where or {})
        self.seen = 0

    def matches(self, window: str, facts: Dict[str, Any]) -> bool:
        return window == self.window and all(facts.get(name) == value for name, value in self.where.items())


class KillAt(Observer):
    """SIGKILL this process at the ``nth`` pass through ``window``.

    :param where: count only passes whose facts hold these values (``{"key": K}``).
    :param after: ``(window, n)`` or ``(window, n, where)``: start counting only
        once that window was passed n times (the first folder fsync after the
        second backup rename, the first append after one effect's start).
    :param tear: at ``store:before-append``, write the first half of the record
        to the journal before dying: an append cut short by the crash.
    :param on_kill: called with the window just before the kill (a line for the supervisor).
    """

    def __init__(self, window: str, nth: int = 1, *, where: Optional[Dict[str, Any]] = None,
                 after: Optional[Tuple[Any, ...]] = None, tear: bool = False,
                 on_kill: Optional[Callable[[str], None]] = None) -> None:
        if nth < 1:
            raise ValueError("nth counts passes from 1")
        if tear and window != "store:before-append":
            raise ValueError("only an append can be torn (window store:before-append)")
        self.target = _Passes(window, where)
        self.nth = nth
        self.after = _Passes(after[0], after[2] if len(after) > 2 else None) if after else None
        self.after_nth = int(after[1]) if after else 0
        self.tear = tear
        self.on_kill = on_kill

    @property
    def window(self) -> str:
        return self.target.window

    def _armed(self) -> bool:
        return self.after is None or self.after.seen >= self.after_nth

    def fatal_next(self, **facts: Any) -> bool:
        """True when the next pass through this object's window with ``facts`` would be the fatal one."""
        return (self._armed() and self.target.seen + 1 == self.nth and
                all(facts.get(k) == v for k, v in self.target.where.items()))

    def reached(self, window: str, **facts: Any) -> None:
        if self.after is not None and not self._armed() and self.after.matches(window, facts):
            self.after.seen += 1
            return
        if not self._armed() or not self.target.matches(window, facts):
            return
        self.target.seen += 1
        if self.target.seen != self.nth:
            return
        if self.tear:
            data = facts["data"]
            facts["fs"].append(facts["path"], data[: max(1, len(data) // 2)])
        if self.on_kill is not None:
            self.on_kill(window)
        die()


class KillAfterSeconds(Observer):
    """SIGKILL this process ``seconds`` after it was created, wherever it is then: a kill at a random moment.

    A daemon timer thread sends the signal, so the moment is unrelated to
    any window; the windows themselves are ignored.
    """

    def __init__(self, seconds: float, on_kill: Optional[Callable[[str], None]] = None) -> None:
        self.on_kill = on_kill
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        if self.on_kill is not None:
            self.on_kill("timer")
        die()


class LoseAnswerThenKill(Observer):
    """At the fatal pass of ``kill`` (an ``effect:after-call`` kill), the target commits and its answer is lost.

    Just before that call is made (``effect:after-started`` of the same
    effect), ``lose_answer()`` arms the target to commit the next request and
    drop the connection; the call then raises, and the process dies at
    ``effect:after-call`` with the effect committed at the target and only
    ``started`` in the ledger.
    """

    def __init__(self, kill: KillAt, lose_answer: Callable[[], None]) -> None:
        if kill.window != "effect:after-call":
            raise ValueError("an answer is lost at effect:after-call")
        self.kill = kill
        self.lose_answer = lose_answer

    def reached(self, window: str, **facts: Any) -> None:
        if window == "effect:after-started" and self.kill.fatal_next(**facts):
            self.lose_answer()
        self.kill.reached(window, **facts)


class Recorder(Observer):
    """Keeps ``(window, facts)`` of every pass, in order, without the objects a fact may carry (``fs``, ``data``)."""

    def __init__(self) -> None:
        self.passes: List[Tuple[str, Dict[str, Any]]] = []

    def reached(self, window: str, **facts: Any) -> None:
        self.passes.append((window, {k: v for k, v in facts.items() if k not in ("fs", "data")}))

    @property
    def windows(self) -> List[str]:
        return [window for window, _ in self.passes]


class Chain(Observer):
    """Passes every window to each of ``observer`` in turn (a recorder, then a kill)."""

    def __init__(self, *observer: Observer) -> None:
        self.observer = observer

    def reached(self, window: str, **facts: Any) -> None:
        for observer in self.observer:
            observer.reached(window, **facts)


def kill_point(point: str, nth: int, *, lose_answer: Optional[Callable[[], None]] = None,
               on_kill: Optional[Callable[[str], None]] = None) -> Observer:
    """The observer that die at the ``nth`` pass of ``point``: a window name, or ``WINDOW/torn`` or
    ``WINDOW/answer-lost``.

    ``/torn`` tears the append (``store:before-append/torn``); ``/answer-lost``
    (``effect:after-call/answer-lost``) calls ``lose_answer`` first, so the
    target commits and its answer never arrives.
    """
    window, _, fault = point.partition("/")
    if fault not in ("", "torn", "answer-lost"):
        raise ValueError(f"unknown fault {fault!r} in kill point {point!r}")
    kill = KillAt(window, nth, tear=fault == "torn", on_kill=on_kill and (lambda _window: on_kill(point)))
    if fault == "answer-lost":
        if lose_answer is None:
            raise ValueError(f"{point}: the kill point needs a way to lose the target's answer")
        return LoseAnswerThenKill(kill, lose_answer)
    return kill


def lose_next_answer(url: str, timeout: float = 5.0) -> None:
    """Arm the loopback ticket service at ``url``: commit the next ticket, then close the connection unanswered."""
    import urllib.request  # here, not at the top: the killed children that import this module for KillAt start faster
                           # without it

    request = urllib.request.Request(url + "/faults", data=json.dumps({"drop_after_commit": 1}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=timeout) as response:
        response.read()
