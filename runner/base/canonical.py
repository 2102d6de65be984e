"""Canonical JSON, the digests made of it, and the bounds every JSON document the runner reads is held to.

Canonical JSON here means: keys sorted, no insignificant white space, UTF-8,
no NaN or infinities, no duplicate keys on input. Every digest in the project
is SHA-256 over canonical JSON, written ``sha256:<hex>`` when it names content
(a plan, a payload) and bare hex when it links journal records.
"""

import json
import math
import re
from typing import Any, Dict, List, Union

from .errors import InvalidInput

try:  # CPython's own SHA-256 (see sha256)
    from _sha256 import sha256 as _short_sha256
except ImportError:  # renamed in 3.12
    try:
        from _sha2 import sha256 as _short_sha256
    except ImportError:  # a build without it: OpenSSL's for every input
        _short_sha256 = None

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_JSON_DEPTH",
    "canonical_json",
    "sha256",
    "sha256_stream",
    "sha256_hex",
    "content_digest",
    "loads_strict",
    "loads_trusted",
    "check_depth",
    "check_nesting",
    "read_document",
    "check_document",
]

#: Upper bound on any one payload, receipt, evidence or contract document.
MAX_DOCUMENT_BYTES = 256 * 1024

#: Upper bound on the nesting of arrays and objects in any JSON input. Far
#: below the interpreter's recursion limit, so that parsing, encoding and
#: digesting an accepted document can never exhaust the stack.
MAX_JSON_DEPTH = 64

Json = Union[None, bool, int, float, str, List[Any], Dict[str, Any]]


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


def check_document(value: Any, what: str) -> Dict[str, Any]:
    """A receipt, evidence or payload: a JSON object within the size limit."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    try:
        check_nesting(value)
        size = len(canonical_json(value))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if size > MAX_DOCUMENT_BYTES:
        raise InvalidInput(f"{what} is {size} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    return value
