"""The versioned envelope of one run, and the canonical JSON it is written in.

Canonical JSON here means: keys sorted, no insignificant white space, UTF-8,
no NaN or infinities, no duplicate keys on input. Every digest in the project
is SHA-256 over canonical JSON, written ``sha256:<hex>`` when it names content
(a plan, a payload) and bare hex when it links journal records.

The envelope is a plain ``dict``; :data:`ENVELOPE_KEYS` lists its fields and
``references/state-envelope.md`` documents each one. A transition never edits
it in place: it is a list of operations (``["set", path, value]`` or
``["del", path]``) that :func:`apply_ops` applies, so the same record can be
replayed from the journal on any machine and give the same state.
"""

import json
import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .base.errors import InvalidInput

try:  # CPython's own SHA-256 (see sha256)
    from _sha256 import sha256 as _short_sha256
except ImportError:  # renamed in 3.12
    try:
        from _sha2 import sha256 as _short_sha256
    except ImportError:  # a build without it: OpenSSL's for every input
        _short_sha256 = None

__all__ = [
    "SCHEMA_VERSION",
    "ENVELOPE_KEYS",
    "MAX_ID_LENGTH",
    "MAX_DOCUMENT_BYTES",
    "canonical_json",
    "sha256",
    "sha256_stream",
    "sha256_hex",
    "content_digest",
    "loads_strict",
    "loads_trusted",
    "check_depth",
    "check_nesting",
    "validate_id",
    "one_line",
    "check_duration",
    "read_document",
    "format_time",
    "parse_time",
    "new_envelope",
    "validate_envelope",
    "check_shape",
    "apply_ops",
    "undo_ops",
    "Clock",
]

#: Version of the envelope layout. A file of any other version is refused with
#: a clear error (there is no older layout to migrate from yet).
SCHEMA_VERSION = 1

#: Ids and keys: a letter or digit, then letters, digits and ``. _ - : @ + =``.
#: No path separators, no white space, no control characters.
MAX_ID_LENGTH = 200
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]*\Z")

#: Upper bound on any one payload, receipt, evidence or contract document.
MAX_DOCUMENT_BYTES = 256 * 1024

#: Upper bound on the nesting of arrays and objects in any JSON input. Far
#: below the interpreter's recursion limit, so that parsing, encoding and
#: digesting an accepted document can never exhaust the stack.
MAX_JSON_DEPTH = 64

#: Upper bound on any duration given as input (a time to live, a backoff, a
#: time limit): ten years. Every time a run writes is then within a few
#: decades of its clock, far inside what :func:`format_time` writes in four digits.
MAX_DURATION_SECONDS = 10 * 366 * 24 * 3600

#: Upper bound on a free-text reason or error message.
MAX_LINE_CHARS = 2000

Clock = Callable[[], float]
Json = Union[None, bool, int, float, str, List[Any], Dict[str, Any]]
#: One operation of a transition: ``["set", path, value]`` or ``["del", path]``.
Op = List[Any]
#: The operations of one transition, applied in order by :func:`apply_ops`.
Ops = List[Op]


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> bytes:
    """Canonical UTF-8 JSON of ``value``; raises ``ValueError`` on NaN or infinity."""
    return _ENCODER.encode(value).encode("utf-8")


#: Inputs shorter than this are hashed by CPython's own SHA-256 (see :func:`sha256`).
SHORT_INPUT_BYTES = 1 << 16


def sha256(data: bytes) -> Any:
    """A SHA-256 hash object over ``data``: CPython's own for a short input, OpenSSL's (loaded then) for a longer one.

    OpenSSL's hashes several times faster per byte but takes milliseconds to
    load, more than a short command spends on all of its hashing (a record,
    a plan, a key: a few kilobytes). Both give the same digest.
    """
    if _short_sha256 is not None and len(data) < SHORT_INPUT_BYTES:
        return _short_sha256(data)
    import hashlib

    return hashlib.sha256(data)


def sha256_stream() -> Any:
    """An empty SHA-256 hash object for input of unknown length (a file, a log), fed with ``update``: OpenSSL's."""
    import hashlib

    return hashlib.sha256()


def sha256_hex(data: bytes) -> str:
    return sha256(data).hexdigest()


def content_digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return "sha256:" + sha256_hex(canonical_json(value))


def _no_duplicates(pairs: List[Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON here")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


#: A JSON string (escapes included), and any one bracket outside strings.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def check_depth(text: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise ``ValueError`` if the arrays and objects of JSON ``text`` nest more than ``limit`` deep.

    A linear scan done before parsing, so that no parser recursion ever sees
    a deeper document. Brackets inside strings do not count; malformed text
    is left for the parser to refuse.
    """
    depth = 0
    for match in _BRACKETS.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"nested too deeply (more than {limit} levels of arrays and objects)")
        else:
            depth -= 1


def check_nesting(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise ``ValueError`` if the lists and dicts of ``value`` nest more than ``limit`` deep.

    The same bound as :func:`check_depth`, for a document handed over by the
    library rather than as text; walked without recursion.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        if depth > limit:
            raise ValueError(f"nested too deeply (more than {limit} levels of arrays and objects)")
        stack.extend((child, depth + 1) for child in children)


def loads_strict(data: Union[bytes, str]) -> Any:
    """Parse JSON, refusing NaN, infinities (also as out-of-range numbers such as ``1e309``),
    duplicate keys and nesting deeper than :data:`MAX_JSON_DEPTH`. Raises ``ValueError``."""
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    check_depth(data)
    return json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite)


def loads_trusted(data: Union[bytes, str]) -> Any:
    """Parse JSON whose bytes a digest has already verified as written by this runner.

    Duplicate keys cannot occur there, so the C parser's fast path is kept;
    NaN and infinities are still refused.
    """
    return json.loads(data, parse_constant=_no_constant)


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


def read_document(path: str, what: str) -> str:
    """The UTF-8 text of a file given on the command line, within the size limit.

    :raises InvalidInput: the file cannot be read, is too large or is not UTF-8.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InvalidInput(f"{what} {path} is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} {path} is not UTF-8") from None


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


#: Every field of the envelope, in the order the documentation lists them.
ENVELOPE_KEYS = (
    "schema_version",
    "task_id",
    "plan_digest",
    "plan",
    "revision",
    "head",
    "created_at",
    "updated_at",
    "status",
    "current_step",
    "steps",
    "completed_steps",
    "next_action",
    "observations",
    "effects",
    "jobs",
    "budgets",
    "counters",
    "lease",
)

STATUSES = ("active", "complete", "cancelled", "blocked", "failed")

_FIELD_TYPES = {
    "schema_version": int,
    "task_id": str,
    "plan_digest": str,
    "plan": dict,
    "revision": int,
    "head": str,
    "created_at": str,
    "updated_at": str,
    "status": str,
    "steps": dict,
    "completed_steps": list,
    "observations": dict,
    "effects": dict,
    "jobs": dict,
    "budgets": dict,
    "counters": dict,
    "lease": dict,
}


def new_envelope(task_id: str, plan: Dict[str, Any], head: str, now: str) -> Dict[str, Any]:
    """The envelope of a run at revision 0, before any transition."""
    limits = plan.get("limits", {}) if isinstance(plan, dict) else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "task_id": task_id,
        "plan_digest": content_digest(plan),
        "plan": plan,
        "revision": 0,
        "head": head,
        "created_at": now,
        "updated_at": now,
        "status": "active",
        "current_step": None,
        "steps": {},
        "completed_steps": [],
        "next_action": None,
        "observations": {"authorization": {}, "cancellation": None, "approvals": {}, "store": {}},
        "effects": {},
        "jobs": {},
        "budgets": dict(limits),
        "counters": {"step_attempts": 0, "effect_attempts": 0, "cost": {}, "recoveries": 0},
        "lease": {"owner": None, "epoch": 0, "expires_at": None, "acquired_at": None},
    }


def check_shape(state: Dict[str, Any]) -> None:
    """The cheap part of :func:`validate_envelope`, run after every transition:
    every field present with its type, a known status. Raises ``ValueError``."""
    for key, kind in _FIELD_TYPES.items():
        value = state.get(key, _MISSING)
        if value is _MISSING:
            raise ValueError(f"the envelope would lack {key}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"envelope field {key} would not be a {kind.__name__}")
    if state["status"] not in STATUSES:
        raise ValueError(f"envelope status {state['status']!r} is not one of {', '.join(STATUSES)}")
    for key in ("current_step", "next_action"):
        if key not in state:
            raise ValueError(f"the envelope would lack {key}")


def validate_envelope(state: Any) -> Dict[str, Any]:
    """Check the envelope's shape; raise ``ValueError`` naming the first bad field."""
    if not isinstance(state, dict):
        raise ValueError("envelope is not an object")
    version = state.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaMismatch(version)
    missing = [key for key in ENVELOPE_KEYS if key not in state]
    if missing:
        raise ValueError(f"envelope lacks {', '.join(missing)}")
    check_shape(state)
    if state["revision"] < 0:
        raise ValueError("envelope revision is negative")
    if state["plan_digest"] != content_digest(state["plan"]):
        raise ValueError("envelope plan_digest does not match its plan")
    validate_id(state["task_id"], "task id")
    return state


class SchemaMismatch(ValueError):
    """The envelope was written under another schema version."""

    def __init__(self, version: Any) -> None:
        super().__init__(
            f"state is schema version {version!r}; this runner reads version {SCHEMA_VERSION} only"
            " (use the runner that wrote it, or migrate it explicitly)"
        )
        self.version = version


_MISSING = object()


def apply_ops(state: Dict[str, Any], ops: Sequence[Op], undo: Optional[List[Any]] = None) -> None:
    """Apply ``["set", path, value]`` / ``["del", path]`` operations in place.

    A path is a list of object keys; every key but the last must name an
    existing object. Raises ``ValueError`` on a malformed operation. When
    ``undo`` is a list, each change appends what :func:`undo_ops` needs to
    take it back, so a caller can apply first and roll back on failure.
    """
    for op in ops:
        if not isinstance(op, list) or len(op) not in (2, 3) or op[0] not in ("set", "del"):
            raise ValueError(f"malformed operation {op!r:.80}")
        path = op[1]
        if not isinstance(path, list) or not path or not all(isinstance(part, str) for part in path):
            raise ValueError(f"malformed path {path!r:.80}")
        if (op[0] == "set") != (len(op) == 3):
            raise ValueError(f"{op[0]} takes {'a value' if op[0] == 'set' else 'no value'}")
        target = state
        for part in path[:-1]:
            child = target.get(part) if isinstance(target, dict) else None
            if not isinstance(child, dict):
                raise ValueError(f"path {path!r:.80} does not lead to an object")
            target = child
        key = path[-1]
        if undo is not None:
            undo.append((target, key, target.get(key, _MISSING)))
        if op[0] == "set":
            target[key] = op[2]
        else:
            target.pop(key, None)


def undo_ops(undo: List[Any]) -> None:
    """Take back the changes :func:`apply_ops` recorded, newest first."""
    for target, key, old in reversed(undo):
        if old is _MISSING:
            target.pop(key, None)
        else:
            target[key] = old
    undo.clear()
