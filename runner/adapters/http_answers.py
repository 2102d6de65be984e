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
  else absent); 404, absent; anything else, unknown. A lookup answered "not
  now" (429; a 403 or 503 with a ``Retry-After``; a 403 that says no request
  is left) waits as an invoke does, through the executor, after the delay it
  named. A lookup answered 408, 502, 503 or 504 (:data:`LOOK_AGAIN`), or that
  could not connect, is asked again within the call's time (a lookup changes
  nothing).
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

A status's word may depend on the answer's body: ``statuses`` may map a
status or class to conditions tried in order (the value at a JSON pointer is
there, or equals a value), then a word (:func:`answer_word`); an answer whose
body cannot be read as JSON then means ``unknown``, as no condition can be told.

Rate limits as APIs announce them (:func:`rate_limit_wait`): GitHub's and
many others' ``X-RateLimit-Remaining`` with ``X-RateLimit-Reset`` (seconds
since the epoch, or seconds from now for a smaller number), and the IETF
fields (``RateLimit`` as a list of items with ``r`` and ``t`` or as the
dictionary ``remaining``/``reset``, ``RateLimit-Remaining`` with
``RateLimit-Reset``, and ``RateLimit-Policy``'s window ``w`` where no reset is
named). An answer that says no request is left holds every request to its
origin until the reset (:class:`Pacing`), before any refusal; a 403 or 429
that says so, or names a ``Retry-After``, is "not now" (:func:`refused_for_now`).

Every function here is pure but :func:`retry_after_seconds` and
:func:`rate_limit_wait`, which read the clock unless given ``now``;
:class:`Pacing` is the one thing that keeps state.
"""

import re
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

from ..base.canonical import MAX_DOCUMENT_BYTES, canonical_json, check_nesting, loads_strict, sha256_hex
from ..contract.spec import BodyCondition
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
    "answer_word",
    "rate_limit_wait",
    "refused_for_now",
    "Pacing",
    "PACING",
    "next_link",
    "listed_document",
    "text_matches",
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


def answer_word(statuses: Mapping[str, str], conditions: Mapping[str, Sequence[BodyCondition]], reply: Reply,
                default: str = "unknown") -> str:
    """The word ``statuses`` gives the answer, its body's conditions first: the status's exact entry, else its
    class's; if that entry has ``conditions``, the first the body meets gives the word (a body that is not JSON, or
    was cut, meets none and means ``unknown``); else the entry's word; ``default`` where no entry names the status.
    """
    code = str(reply.status)
    if code not in statuses:
        code = f"{reply.status // 100}xx"
        if code not in statuses:
            return default
    tried = conditions.get(code)
    if tried:
        document = _body_document(reply)
        if document is MISSING:
            return "unknown"
        for condition in tried:
            value = resolve_pointer(document, condition.pointer)
            if condition.equals is None:
                if not empty(value):
                    return condition.then
            elif value is not MISSING and canonical_json(value).decode("utf-8") == condition.equals:
                return condition.then
    return statuses[code]


def _body_document(reply: Reply) -> Any:
    """The answer's JSON document for its conditions, or MISSING: cut, not strict JSON, or nested too deep."""
    if not reply.whole:
        return MISSING
    try:
        found = loads_strict(reply.body)
        check_nesting(found)
    except (ValueError, UnicodeDecodeError):
        return MISSING
    return found


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
             evidence: Dict[str, Any],
             conditions: Optional[Mapping[str, Sequence[BodyCondition]]] = None) -> Observation:
    """What one lookup's answer says of its key: the word ``statuses`` gives its status (its body's ``conditions``
    first, :func:`answer_word`) and, for "present" with a ``pointer``, present only when the answer holds a value
    there.

    :param evidence: what the evidence holds of the request; the answer's status, digest and size are added.
    """
    word = answer_word(statuses, conditions or {}, reply)
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


# -- rate limits --------------------------------------------------------------------------------------

#: A reset above this is a moment (seconds since the epoch, as GitHub's ``X-RateLimit-Reset``); below it, seconds.
EPOCH_FLOOR = 1e9
_NUMBER = re.compile(r"^[0-9]+(?:\.[0-9]+)?$")


def _number(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    value = value.strip().strip('"')
    return float(value) if _NUMBER.match(value) else None


def _all(headers: Any, name: str) -> List[str]:
    found = headers.get_all(name) if hasattr(headers, "get_all") else [headers.get(name)]
    return [value for value in (found or []) if value is not None]


def _items(value: str) -> List[Tuple[str, Dict[str, str]]]:
    """The members of a structured field (RFC 8941), loosely: each ``NAME;k=v;...`` or ``k=v`` with its parameters."""
    out = []
    for member in value.split(","):
        head, *params = [part.strip() for part in member.split(";")]
        named = {}
        for param in params:
            key, _, found = param.partition("=")
            named[key.strip().lower()] = found.strip()
        out.append((head, named))
    return out


def rate_limit_wait(headers: Any, now: Optional[float] = None) -> Optional[float]:
    """Seconds until the target takes a request again when its answer says none is left now, else None.

    Read from ``X-RateLimit-Remaining`` and ``X-RateLimit-Reset`` (a reset above :data:`EPOCH_FLOOR` is a moment,
    else seconds), the IETF ``RateLimit`` field (items with ``r`` remaining and ``t`` seconds to reset, or the
    older dictionary ``remaining``, ``reset``), ``RateLimit-Remaining`` with ``RateLimit-Reset``, and, where no
    reset is named, the window ``w`` of ``RateLimit-Policy`` (the policy of the item's name, else the longest).
    None too when the wait would be longer than a day: the contract's backoff applies then.
    """
    now = time.time() if now is None else now
    windows: Dict[str, float] = {}
    for value in _all(headers, "RateLimit-Policy"):
        for head, params in _items(value):
            window = _number(params.get("w"))
            if window is not None:
                windows[head.strip('"')] = window
    longest = max(windows.values()) if windows else None
    waits: List[Optional[float]] = []
    remaining = _number(_first(headers, "X-RateLimit-Remaining"))
    if remaining is not None and remaining < 1:
        reset = _number(_first(headers, "X-RateLimit-Reset"))
        waits.append(None if reset is None else reset - now if reset >= EPOCH_FLOOR else reset)
    remaining = _number(_first(headers, "RateLimit-Remaining"))
    if remaining is not None and remaining < 1:
        reset = _number(_first(headers, "RateLimit-Reset"))
        waits.append(reset if reset is not None else longest)
    for value in _all(headers, "RateLimit"):
        members = _items(value)
        dictionary = {head.partition("=")[0].strip().lower(): head.partition("=")[2] for head, _ in members
                      if "=" in head}
        if dictionary:  # the older form: limit=10, remaining=0, reset=7
            left, reset = _number(dictionary.get("remaining")), _number(dictionary.get("reset"))
            if left is not None and left < 1:
                waits.append(reset if reset is not None else longest)
            continue
        for head, params in members:
            left = _number(params.get("r"))
            if left is not None and left < 1:
                reset = _number(params.get("t"))
                waits.append(reset if reset is not None else windows.get(head.strip('"'), longest))
    known = [wait for wait in waits if wait is not None]
    if not known:
        return None
    wait = max(0.0, max(known))
    return wait if wait <= MAX_RETRY_AFTER else None


def _first(headers: Any, name: str) -> Optional[str]:
    found = _all(headers, name)
    return found[0] if found else None


def refused_for_now(reply: Reply, now: Optional[float] = None) -> Tuple[bool, Optional[float]]:
    """Whether the answer says "not now" (nothing done; ask again later), and the seconds it asks to wait if it says.

    A 429; a 403 with a valid ``Retry-After`` (a secondary rate limit) or that says no request is left
    (:func:`rate_limit_wait`, or a remaining count of 0 without a reset); a 503 with a valid ``Retry-After``.
    """
    asked = retry_after_seconds(reply.headers.get("Retry-After"), now)
    if reply.status not in (403, 429, 503):
        return False, None
    if asked is not None:
        return True, asked
    if reply.status == 503:
        return False, None
    announced = rate_limit_wait(reply.headers, now)
    if announced is not None or reply.status == 429:
        return True, announced
    spent = [_number(_first(reply.headers, name)) for name in ("X-RateLimit-Remaining", "RateLimit-Remaining")]
    return any(left is not None and left < 1 for left in spent), None


class Pacing:
    """When each origin takes a request again, as its answers announced it: a rate limit with nothing left holds
    every request to that origin until its reset, so none is sent only to be refused (thread-safe).

    :param clock: monotonic seconds (injectable).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: Dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def heard(self, origin: Hashable, headers: Any) -> None:
        """Keep what an answer from ``origin`` announced (nothing when it says requests are left)."""
        wait = rate_limit_wait(headers)
        if wait:
            with self._lock:
                self._until[origin] = max(self._until.get(origin, 0.0), self.clock() + wait)

    def left(self, origin: Hashable) -> Optional[float]:
        """Seconds before ``origin`` takes a request again, or None: it may be sent one now."""
        with self._lock:
            until = self._until.get(origin)
            if until is None:
                return None
            left = until - self.clock()
            if left <= 0:
                del self._until[origin]
                return None
            return left


#: The pacing of this process's origins, shared by every adapter (``drive`` makes one adapter per item).
PACING = Pacing()


# -- listings -----------------------------------------------------------------------------------------

#: One link of a ``Link`` header (RFC 8288): its target and its parameters.
_LINK = re.compile(r"<([^>]*)>\s*((?:;[^,<]*)*)")


def next_link(headers: Any) -> Optional[str]:
    """The target of the answer's ``Link`` with ``rel="next"`` (as written: absolute or relative), or None."""
    for value in _all(headers, "Link"):
        for target, params in _LINK.findall(value):
            if _LINK_NEXT.search(params):
                return target.strip()
    return None


def listed_document(reply: Reply) -> Any:
    """A page of a listing as JSON, or MISSING (cut, not strict JSON, nested too deep); no size bound but the
    answer's own, as a page is read and matched, never kept."""
    return _body_document(reply)


def text_matches(found: Any, wanted: str, how: str) -> bool:
    """Whether the value a listing's entry holds at ``match`` matches an item's ``wanted`` text.

    ``equals``: its text (a string, or a whole number written out) is ``wanted``; ``first_line``: its first line,
    without the white space around it, is ``wanted`` without its own; ``contains``: ``wanted`` is part of it.
    """
    if isinstance(found, bool) or not isinstance(found, (str, int)):
        return False
    text = str(found)
    if how == "first_line":
        lines = text.splitlines()
        return bool(lines) and lines[0].strip() == wanted.strip()
    if how == "contains":
        return bool(wanted) and wanted in text
    return text == wanted
