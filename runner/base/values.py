"""Values given as input, checked before they are used: ids and keys, one-line texts, durations."""

import re
from typing import Any

from .errors import InvalidInput

__all__ = ["MAX_ID_LENGTH", "MAX_DURATION_SECONDS", "MAX_LINE_CHARS", "validate_id", "one_line", "check_duration"]

#: Ids and keys: a letter or digit, then letters, digits and ``. _ - : @ + =``.
#: No path separators, no white space, no control characters.
MAX_ID_LENGTH = 200
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]*\Z")

#: Upper bound on any duration given as input (a time to live, a backoff, a
#: time limit): ten years. Every time a run writes is then within a few
#: decades of its clock, far inside what :func:`~runner.base.times.format_time` writes in four digits.
MAX_DURATION_SECONDS = 10 * 366 * 24 * 3600

#: Upper bound on a free-text reason or error message.
MAX_LINE_CHARS = 2000


def validate_id(value: Any, what: str = "id") -> str:
    """Return ``value`` if it is a safe id or key, else raise :class:`InvalidInput`.

    Safe means: a string of 1 to 200 characters from ``[A-Za-z0-9._:@+=-]``
    starting with a letter or digit. Ids are still never used raw as file names.
    """
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInput(f"{what} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
    if not _ID_RE.match(value):
        raise InvalidInput(
            f"{what} {value[:60]!r} may hold only letters, digits and . _ - : @ + ="
            " and must start with a letter or digit"
        )
    return value


def one_line(text: Any, what: str, limit: int = MAX_LINE_CHARS) -> str:
    """Return ``text`` if it is a string, not only white space, of at most ``limit`` characters.

    The check every free-text reason and error message passes (it is shown
    on one line: the command line escapes any line break in it).

    :raises InvalidInput: naming ``what``.
    """
    if not isinstance(text, str) or not text.strip() or len(text) > limit:
        raise InvalidInput(f"{what} must be a non-empty line of at most {limit:,} characters")
    return text


def check_duration(value: Any, what: str, limit: float = MAX_DURATION_SECONDS) -> float:
    """Return ``value`` as seconds if it is a number with ``0 < value <= limit``, else raise :class:`InvalidInput`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
        raise InvalidInput(f"{what} must be a number of seconds above 0 and at most {limit:,.0f}")
    return float(value)
