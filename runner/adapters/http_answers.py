"""What an HTTP target's answers mean, for the HTTP adapter (:mod:`runner.adapters.http`).

Each request's ``statuses`` (the defaults of its kind, then the contract's)
map a status, ``"409"``, or a class, ``"5xx"``, to an outcome word:

* invoke: 2xx, the receipt (the JSON object the target answered, else its
  status and the ``receipt_headers``, ``Location`` by default); 429, and 503
  with a valid ``Retry-After`` (seconds or an HTTP date, at most a day),
  nothing created, called again after it; 401, 403 and 407, nothing created
  (credentials), called again after the backoff; 412, a stale fencing epoch;
  408, unknown; any other 4xx, refused for good; anything else (1xx, 3xx, a
  503 without ``Retry-After``, 502, 504, any other 5xx), unknown: settled by a
  lookup, never by sending again. A 408, 502, 503 or 504 may come from a proxy
  after the service was sent the request (Envoy answers 503 when the service's
  connection breaks before its answer, 408 when the service stays silent past
  its stream idle timeout). A connection that could not be made (refused, no
  route, a failed TLS handshake or proxy tunnel) or a request that cannot be
  written (a header value outside Latin-1) sent nothing: nothing created. A
  timeout or a reset once the request was being sent is unknown.
* observe: 200, present (with a ``pointer``, present only when the RFC 6901
  JSON pointer leads to a value that is not null, ``""``, ``[]`` or ``{}``,
  else absent); 404, absent; anything else, unknown. A lookup answered 408,
  429, 502, 503 or 504 (:data:`LOOK_AGAIN`), or that could not connect, is
  asked again within the call's time (a lookup changes nothing), after the
  ``Retry-After`` it named.
* observe.many: 200 with a list, each key with a match present (whatever the
  paging); a key without one absent only when the answer is whole
  (:func:`partial` finds no mark of a page): no ``Link`` with
  ``rel="next"``, and the contract declares how a page is marked
  (``page_size``: fewer entries than it; ``next``: null, false or nothing at
  that pointer) and the answer bears no mark. Otherwise the key is unseen,
  and looked up with its own request before anything else. 408, 429 and 503
  (:data:`MANY_NOT_NOW`), "not now"; any other 4xx, the target refuses
  lookups of many keys (the runner looks key by key for the rest of its
  pass); anything else, all keys unseen.

Every function here is pure but :func:`retry_after_seconds`, which reads the
clock for an HTTP date unless given ``now``.
"""

import re
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..base.canonical import MAX_DOCUMENT_BYTES, canonical_json, check_nesting, loads_strict, sha256_hex
from ..base.pointer import MISSING, resolve_pointer, shown
from ..calls.commands import MAX_RETRY_AFTER
from ..calls.target import Observation
from .http_client import Reply

__all__ = [
    "LOOK_AGAIN",
    "MANY_NOT_NOW",
    "outcome_of",
    "invoke_outcome",
    "retry_after_seconds",
    "document_of",
    "empty",
    "observed",
    "partial",
]

#: Answers of a lookup that said "not now" or that a proxy gave: asked again within the call's time (a lookup
#: creates nothing).
LOOK_AGAIN = (408, 429, 502, 503, 504)
#: Answers of a lookup of many keys that said "not now": the lookup is made again later, as a whole.
MANY_NOT_NOW = (408, 429, 503)
#: ``rel="next"`` in a ``Link`` header (RFC 8288), as loosely as it may be written: a false match only costs lookups.
_LINK_NEXT = re.compile(r'\brel\s*=\s*(?:"[^"]*\bnext\b[^"]*"|next\b)', re.IGNORECASE)


def outcome_of(statuses: Mapping[str, str], status: int, default: str = "unknown") -> str:
    """The word ``statuses`` gives ``status``: its exact entry, else its class's (``"4xx"``), else ``default``."""
    return statuses.get(str(status)) or statuses.get(f"{status // 100}xx") or default


def invoke_outcome(statuses: Mapping[str, str], status: int, retry_after: Optional[float]) -> str:
    """What an invoke's answer means: the word ``statuses`` gives ``status``; a status it names neither exactly nor by
    class is unknown, but a 503 with a valid ``Retry-After`` (``retry_after`` not None), which created nothing.

    A 503 without one may come from a proxy after the service was sent the request (Envoy's "upstream connect
    error or disconnect/reset before headers"), so it is settled by a lookup; a service that is busy says when
    to come back.
    """
    return outcome_of(statuses, status, "not-applied" if status == 503 and retry_after is not None else "unknown")


def retry_after_seconds(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds a ``Retry-After`` header asks to wait: a number of seconds, or an HTTP date (RFC 9110).

    None when it is missing, malformed or longer than a day (the contract's backoff applies then).
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(int(value))
    else:
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None or when.tzinfo is None:
            return None
        seconds = max(0.0, when.timestamp() - (time.time() if now is None else now))
    return seconds if seconds <= MAX_RETRY_AFTER else None


def empty(value: Any) -> bool:
    """True for nothing found at a pointer: missing, null, ``""``, ``[]`` or ``{}``."""
    return value is MISSING or value is None or value in ("", [], {})


def document_of(body: bytes) -> Any:
    """The JSON document ``body`` holds, or :data:`~runner.base.pointer.MISSING`: not strict JSON, nested too deep,
    or larger than a document the runner keeps."""
    try:
        found = loads_strict(body)
        check_nesting(found)
    except (ValueError, UnicodeDecodeError):
        return MISSING
    if len(canonical_json(found)) > MAX_DOCUMENT_BYTES:
        return MISSING
    return found


def observed(statuses: Mapping[str, str], pointer: Optional[Sequence[str]], reply: Reply,
             evidence: Dict[str, Any]) -> Observation:
    """What one lookup's answer says of its key: the word ``statuses`` gives its status and, for "present" with a
    ``pointer``, present only when the answer holds a value there.

    :param evidence: what the evidence holds of the request; the answer's status, digest and size are added.
    """
    word = outcome_of(statuses, reply.status)
    evidence = dict(evidence, status=reply.status, body_sha256=sha256_hex(reply.body), body_bytes=len(reply.body))
    if word != "present" or pointer is None:
        return Observation(word, evidence)
    document = document_of(reply.body) if reply.whole else MISSING
    if document is MISSING:
        return Observation("unknown", dict(evidence, reason="the answer is not JSON (or longer than 1 MiB): the "
                                                            "pointer cannot be read"))
    if isinstance(document, list):
        # A list of several: worth a person's look if the effect was called more than once.
        evidence["matches"] = len(document)
    value = resolve_pointer(document, pointer)
    if empty(value):
        return Observation("absent", dict(evidence, at_pointer=None))
    evidence["at_pointer"] = shown(value)
    return Observation("present", evidence)


def partial(reply: Reply, document: Any, listed: List[Any], page_size: Optional[int],
            next_page: Optional[Sequence[str]]) -> Optional[str]:
    """Why the answer may be one page of several (so a key missing from it may be on another), or None: it is whole.

    Whole only when the contract says how the target marks a page and this answer bears no mark: no ``Link``
    with ``rel="next"``, fewer entries than ``page_size`` if declared, nothing at the pointer ``next_page`` if
    declared.

    :param document: the answer's JSON document; ``listed``, the list in it that was matched to the keys.
    """
    if any(_LINK_NEXT.search(value) for value in reply.headers.get_all("Link") or []):
        return 'the answer links to a next page (Link rel="next")'
    if page_size is None and next_page is None:
        return "observe.many declares neither page_size nor next: the answer may be one page of several"
    if page_size is not None and len(listed) >= page_size:
        return f"the answer holds {len(listed)} entries, as many as a page (page_size {page_size})"
    more = resolve_pointer(document, next_page) if next_page is not None else MISSING
    if more is not False and not empty(more):  # a cursor, a link, or a "has_more": true
        return "the answer names a next page (at the pointer next)"
    return None
