"""JSON pointers (RFC 6901): where a lookup's answer holds what it found.

Lookups of the target, through HTTP (:mod:`runner.adapters.http`) or a
command (:mod:`runner.calls.commands`), name the part of the answer that matters by
a pointer such as ``"/0/id"``: :func:`parse_pointer` turns it into tokens
once, :func:`resolve_pointer` follows them, and :func:`pointer_problem` is the
contract check's word on one. :func:`matched` sorts a lookup of many keys'
answer by the value each element holds at a pointer, and :func:`shown` is
what evidence keeps of a value found.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .canonical import canonical_json, sha256_hex

__all__ = ["MISSING", "VALUE_LIMIT", "parse_pointer", "resolve_pointer", "pointer_problem", "matched", "shown"]

#: What :func:`resolve_pointer` gives when nothing is at the pointer (None is a JSON value).
MISSING: Any = object()

#: The largest value found (as canonical JSON) that evidence keeps whole; a larger one is kept as its digest and size.
VALUE_LIMIT = 1024

_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")


def parse_pointer(pointer: str) -> Tuple[str, ...]:
    """The reference tokens of ``pointer`` (``"/0/id"`` gives ``("0", "id")``; ``""`` the whole document)."""
    if pointer == "":
        return ()
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/"))


def resolve_pointer(document: Any, tokens: Sequence[str]) -> Any:
    """What ``tokens`` lead to in ``document``, or :data:`MISSING` when nothing is there.

    An array index is a decimal number without leading zeros; ``-`` (the
    element past the end) leads nowhere.
    """
    here = document
    for token in tokens:
        if isinstance(here, dict):
            if token not in here:
                return MISSING
            here = here[token]
        elif isinstance(here, list):
            if not _INDEX.match(token) or int(token) >= len(here):
                return MISSING
            here = here[int(token)]
        else:
            return MISSING
    return here


def pointer_problem(pointer: Any, field: str) -> Optional[str]:
    """Why ``pointer`` (the contract's ``field``) is not a JSON pointer, or None."""
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        return f"{field} must be a JSON pointer (RFC 6901): \"\" or a path such as \"/0/id\""
    if re.search(r"~(?![01])", pointer):
        return f"{field}: '~' is written ~0 and '/' inside a name ~1 (RFC 6901)"
    return None


def matched(elements: List[Any], match: Sequence[str]) -> Dict[str, List[Any]]:
    """The ``elements`` of a lookup of many keys by the text of the string or whole number each holds at ``match``."""
    found: Dict[str, List[Any]] = {}
    for element in elements:
        value = resolve_pointer(element, match)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            found.setdefault(str(value), []).append(element)
    return found


def shown(value: Any) -> Any:
    """``value`` as evidence keeps it: whole up to :data:`VALUE_LIMIT` bytes of canonical JSON, else its digest and
    size."""
    kept = canonical_json(value)
    return value if len(kept) <= VALUE_LIMIT else {"sha256": sha256_hex(kept), "bytes": len(kept)}
