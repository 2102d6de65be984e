"""The times a run writes: UTC with milliseconds, of any year, and read back exactly as written."""

import math
import re
from typing import Callable, Optional, Tuple

__all__ = ["Clock", "format_time", "parse_time"]

Clock = Callable[[], float]


def _days_to_civil(days: int) -> Tuple[int, int, int]:
    """Year, month and day of the proleptic Gregorian calendar, ``days`` after 1970-01-01 (any integer)."""
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, doy - (153 * mp + 2) // 5 + 1


def _civil_to_days(year: int, month: int, day: int) -> int:
    """The inverse of :func:`_days_to_civil`."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


_TIME_RE = re.compile(r"(-?[0-9]{4,})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{3})Z\Z")


def format_time(seconds: float) -> str:
    """UTC time with milliseconds, e.g. ``2026-11-29T07:14:34.123Z``.

    Total over finite numbers: a year past 9999 is written with more digits
    (inputs are bounded so that a run never writes one, but a view can show
    one written by an older runner). :raises ValueError: ``seconds`` is not finite.
    """
    if not math.isfinite(seconds):
        raise ValueError("time must be finite")
    # Truncated, never rounded up: a time written now is never later than now.
    whole, milli = divmod(int(math.floor(seconds * 1000)), 1000)
    days, rest = divmod(whole, 86400)
    year, month, day = _days_to_civil(days)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (year, month, day, rest // 3600, rest // 60 % 60, rest % 60, milli)


def parse_time(text: Optional[str]) -> float:
    """Seconds since the epoch of any time :func:`format_time` writes (of any year).

    :raises ValueError: ``text`` is not such a time (None, or any value that is not a string, included).
    """
    match = _TIME_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{str(text)[:40]!r} is not a time written as YYYY-MM-DDTHH:MM:SS.mmmZ")
    year, month, day, hour, minute, second, milli = (int(part) for part in match.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 60):
        raise ValueError(f"{match.string[:40]!r} is not a valid time")
    return float(_civil_to_days(year, month, day) * 86400 + hour * 3600 + minute * 60 + second) + milli / 1000.0
