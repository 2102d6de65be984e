"""Where the executor's calls run and its time passes: a :class:`World`; :class:`ThreadWorld` is the real one.

The executor (:mod:`runner.execution.executor`) starts each call in its world and
waits on it for the next call that ended; a simulation puts a seeded world
of its own in its place (:mod:`runner.proof.simworld`), so the same executor
runs in simulated time.
"""

import _thread
import queue
import threading
from typing import Any, Callable, Optional, Tuple

__all__ = ["World", "ThreadWorld"]


class World:
    """Where calls run and time passes. The real one is :class:`ThreadWorld`; a simulation stands in."""

    def start(self, tag: Any, work: Callable[[], Any]) -> None:
        """Run ``work()`` apart from the loop; its result (or exception) comes back from :meth:`wait` with ``tag``."""
        raise NotImplementedError

    def wait(self, timeout: float) -> Optional[Tuple[Any, Any]]:
        """The next finished call as ``(tag, result)``, or None once ``timeout`` seconds passed without one."""
        raise NotImplementedError

    def interrupt(self) -> None:
        """Wake a :meth:`wait` now (from a signal handler): it returns None."""


class ThreadWorld(World):
    """Each call in a daemon thread; completions and :meth:`interrupt` through one queue.

    A wait with no call running (a backoff, a settle time, a ``Retry-After``)
    is a wait on that queue too, so a signal's :meth:`interrupt` ends it at
    once; a test passes ``sleep`` to let its clock pass instead. A process
    may exit with calls still running: their records stay in the registry
    and whoever takes over waits for them.
    """

    def __init__(self, sleep: Optional[Callable[[float], None]] = None) -> None:
        self.sleep = sleep
        # Not SimpleQueue: before Python 3.13 its get(timeout) can wait for ever once a signal lands in it.
        self._done: "queue.Queue[Tuple[Any, Any]]" = queue.Queue()
        self._running = 0

    def start(self, tag: Any, work: Callable[[], Any]) -> None:
        def body() -> None:
            try:
                result = work()
            except BaseException as exc:  # delivered to the loop, which decides what it means
                result = exc
            self._done.put((tag, result))

        self._running += 1
        threading.Thread(target=body, name="runner-call", daemon=True).start()

    def wait(self, timeout: float) -> Optional[Tuple[Any, Any]]:
        if self.sleep is not None and self._running == 0 and self._done.empty():
            if timeout > 0:
                self.sleep(timeout)
            return None
        try:
            got = self._done.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if got[0] is _INTERRUPT:
            return None
        self._running -= 1
        return got

    def interrupt(self) -> None:
        # From a signal handler, which may run while this thread holds the queue's lock (inside get):
        # a put from here could wait on that lock for ever, so a thread of its own puts.
        try:
            _thread.start_new_thread(self._done.put, ((_INTERRUPT, None),))
        except RuntimeError:  # no thread to be had: the loop sees the stop when its wait ends
            pass


_INTERRUPT = object()
