"""Output that can never stop work: the command line's stdout and stderr, written best effort.

A verb's durable write is what matters; what it prints about it is a
courtesy. A reader that went away (``drive ... 2>&1 | head -2``, a harness
that closed its pipe) or a stream that cannot take more (``/dev/full``)
must not end a verb before its durable write, nor turn a finished one into
exit 1. :func:`best_effort` wraps a text stream so that a failed write or
flush is swallowed, and the stream's file descriptor is pointed at
``/dev/null``: what is still buffered then drains there, so neither a
later write nor the interpreter's flush at exit fails again (the remedy
Python's documentation of ``SIGPIPE`` gives). The verb's exit code is
unchanged: it is the outcome of the work, and a caller that reads the code
learns it even when nobody reads the text.
"""

import os
from typing import IO, Any, Optional

__all__ = ["BestEffort", "best_effort"]


class BestEffort:
    """A text stream whose writes and flushes never raise; after the first failure it writes nothing more.

    :param stream: the stream written to (``sys.stdout`` or ``sys.stderr``).
    ``failed`` says whether a write or flush has failed.
    """

    def __init__(self, stream: Optional[IO[str]]) -> None:
        self.stream = stream
        self.failed = stream is None  # the process was started with the descriptor closed

    def write(self, text: str) -> int:
        if not self.failed and self.stream is not None:  # never None unless failed
            try:
                self.stream.write(text)
            except (OSError, ValueError):
                self._give_up()
        return len(text)

    def flush(self) -> None:
        if not self.failed and self.stream is not None:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._give_up()

    def _give_up(self) -> None:
        self.failed = True
        if self.stream is None:
            return
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # a stream without a descriptor of its own: nothing more is written to it anyway

    def __getattr__(self, name: str) -> Any:
        # isatty, fileno, encoding and the rest are the wrapped stream's.
        return getattr(self.stream, name)


def best_effort(stream: Optional[IO[str]]) -> IO[str]:
    """``stream`` wrapped in :class:`BestEffort` (once: a wrapped stream is returned as it is)."""
    return stream if isinstance(stream, BestEffort) else BestEffort(stream)  # type: ignore[return-value]
