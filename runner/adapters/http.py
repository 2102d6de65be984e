"""An HTTP target declared in the contract (``effects.http``), called in this process with the standard library.

The contract names two requests instead of two commands::

    "http": {
      "invoke":  {"method": "POST", "url": "https://desk.example/api/issues",
                  "headers": {"Authorization": "Bearer {file:.secrets/desk-token}"}},
      "observe": {"url": "https://desk.example/api/issues?external_ref={slug}",
                  "headers": {"Authorization": "Bearer {file:.secrets/desk-token}"}, "pointer": "/0/id"},
      "idempotency_header": "Idempotency-Key", "epoch_header": "X-Fencing-Epoch"
    }

:func:`~runner.contract.http.http_problems` checks that section for
``contract check``; :class:`HttpAdapter` is the :class:`runner.target.Adapter`
that makes the calls. What the answers mean (each overridable per request by ``statuses``,
a map from a status, ``"409"``, or a class, ``"5xx"``, to an outcome word):

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
  429, 502, 503 or 504, or that could not connect, is asked again within the
  call's time (a lookup changes nothing), after the ``Retry-After`` it named.
* observe.many: 200 with a list, each key with a match present (whatever the
  paging); a key without one absent only when the answer is whole: no ``Link``
  with ``rel="next"``, and the contract declares how a page is marked
  (``page_size``: fewer entries than it; ``next``: null, false or nothing at
  that pointer) and the answer bears no mark. Otherwise the key is unseen,
  and looked up with its own request before anything else. 408, 429 and 503,
  "not now"; any other 4xx, the target refuses lookups of many keys (the
  runner looks key by key for the rest of its pass); anything else, all keys
  unseen.

Invariants kept here:

* **Secrets never reach the run.** A header value may hold ``{env:NAME}`` or
  ``{file:PATH}`` (PATH relative to the workspace, one trailing newline
  dropped), read at each call. Receipts, evidence and reasons name the
  headers sent, never their values, and any text of the target's answer that
  holds a secret value has it replaced by ``[secret]`` before it is returned.
* **No effect begins with a request that cannot be sent.** The constructor
  makes the item's header values, secrets read, and raises InvalidInput (naming
  the header, never its value) when one cannot be read or sent (a character
  outside Latin-1). Whatever else cannot be encoded fails before a byte is
  written: nothing was sent, never an unknown outcome.
* **Nothing is sent past the call's deadline.** Right before the request is
  written, the registered call's deadline (:mod:`runner.inflight`) and the
  call's own time are checked; past either, nothing is sent and the call
  raises :class:`~runner.target.NotApplied`. So a process stopped and
  continued late never sends what another worker has since decided about.
* **One time limit per call.** ``timeout_seconds`` bounds connecting, sending
  and receiving together: each phase gets what is left, and a watchdog thread
  shuts the socket down at the deadline, so a target that answers one byte at
  a time cannot stretch it. Answers are read up to :data:`BODY_LIMIT` bytes.
* **Connections are reused only when they are seen open.** Idle connections
  are kept per origin (scheme, host, port, proxy, CA file) in a thread-safe
  pool; before one is reused, its socket is polled: one the server closed (or
  that holds unexpected bytes) is thrown away and a new one made, so a closed
  keep-alive connection never turns a POST into an unknown outcome. No process
  is started for a call.
* Proxies come from the environment as :func:`urllib.request.getproxies` and
  :func:`urllib.request.proxy_bypass` read it (``https_proxy``, ``http_proxy``,
  ``no_proxy``); https goes through a CONNECT tunnel. TLS is
  :func:`ssl.create_default_context`, with the contract's ``ca_file`` (relative
  to the workspace) for a private CA.
"""

import base64
import heapq
import json
import os
import re
import select
import stat
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..calls import inflight
from ..calls.commands import MAX_RETRY_AFTER
from ..contract.lookups import MANY_DEFAULT
from ..contract.templates import expand
from ..base.canonical import MAX_DOCUMENT_BYTES, canonical_json, check_nesting, loads_strict, sha256_hex
from ..base.errors import InvalidInput
from ..base.pointer import MISSING, matched, parse_pointer, resolve_pointer, shown
from ..calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..contract.http import (EACH, SECRET, INVOKE_DEFAULTS, INVOKE_METHODS, OBSERVE_DEFAULTS, OBSERVE_METHODS, FieldProblem,
                           split_url, http_problems, sensitive, unsendable)

# http.client, ssl, socket, urllib.request and email.utils are imported where a call needs them: a driver imports
# this module whatever its target, and those modules would add tens of milliseconds to each start.
if TYPE_CHECKING:
    import http.client
    import socket
    import ssl

__all__ = [
    "HttpAdapter",
    "http_problems",
    "FieldProblem",
    "ConnectionPool",
    "POOL",
    "INVOKE_DEFAULTS",
    "OBSERVE_DEFAULTS",
    "invoke_outcome",
    "BODY_LIMIT",
    "resolve_pointer",
    "retry_after_seconds",
]

#: Bytes of an answer read at most; a longer answer is cut there and its connection closed.
BODY_LIMIT = 1024 * 1024
#: The largest JSON object answer kept whole as a receipt; a larger one is kept as its digest.
RECEIPT_BODY_LIMIT = 64 * 1024
#: The largest file a ``{file:PATH}`` header value reads.
SECRET_FILE_LIMIT = 16 * 1024
#: Idle connections kept per origin.
IDLE_PER_ORIGIN = 16

#: Answers of a lookup that said "not now" or that a proxy gave: asked again within the call's time (a lookup
#: creates nothing).
_LOOK_AGAIN = (408, 429, 502, 503, 504)
#: Answers of a lookup of many keys that said "not now": the lookup is made again later, as a whole.
_MANY_NOT_NOW = (408, 429, 503)
#: ``rel="next"`` in a ``Link`` header (RFC 8288), as loosely as it may be written: a false match only costs lookups.
_LINK_NEXT = re.compile(r'\brel\s*=\s*(?:"[^"]*\bnext\b[^"]*"|next\b)', re.IGNORECASE)

_REDACTED = "[secret]"


# -- the compiled section ----------------------------------------------------------------------

class _Request(NamedTuple):
    kind: str
    method: str
    scheme: str
    host: str
    port: int
    rest: str
    url: str
    headers: Tuple[Tuple[str, str], ...]
    statuses: Dict[str, str]
    pointer: Optional[Tuple[str, ...]]
    receipt_headers: Tuple[str, ...]


class _Many(NamedTuple):
    """A lookup of many keys: the request (its URL's ``{each:...}`` left in), how its list is matched back to keys,
    and how an answer says it is the last page (``page_size``, ``next``; neither: it never says)."""

    request: _Request
    each: str
    list: Tuple[str, ...]
    match: Tuple[str, ...]
    value: str
    most: int
    page_size: Optional[int]
    next: Optional[Tuple[str, ...]]


class _Spec(NamedTuple):
    invoke: _Request
    observe: _Request
    idempotency_header: Optional[str]
    epoch_header: Optional[str]
    deduplicates: bool
    retention: Optional[float]
    ca_file: Optional[str]
    many: Optional[_Many]


def _compile_request(kind: str, spec: Dict[str, Any]) -> _Request:
    scheme, host, port, rest = split_url(spec["url"])
    method = spec.get("method", INVOKE_METHODS[0] if kind == "invoke" else OBSERVE_METHODS[0])
    statuses = dict(INVOKE_DEFAULTS if kind == "invoke" else OBSERVE_DEFAULTS)
    pointer = spec.get("pointer")
    return _Request(kind, method, scheme, host, port, rest, spec["url"], tuple((spec.get("headers") or {}).items()),
                    {**statuses, **(spec.get("statuses") or {})}, parse_pointer(pointer) if pointer is not None else None,
                    tuple(spec.get("receipt_headers", ["Location"])))


_COMPILED: Dict[str, _Spec] = {}
_COMPILED_LOCK = threading.Lock()


def _compile(spec: Dict[str, Any]) -> _Spec:
    """The section made ready for calls, cached by its text (``drive`` makes one adapter per item)."""
    text = json.dumps(spec, sort_keys=True)
    with _COMPILED_LOCK:
        found = _COMPILED.get(text)
    if found is not None:
        return found
    problems = http_problems({"http": spec})
    if problems:
        raise InvalidInput(f"{problems[0]} (run 'contract check')")
    many = None
    if "many" in spec["observe"]:
        found = spec["observe"]["many"]
        each = EACH.search(found["url"]).group(1)  # type: ignore[union-attr]
        request = _compile_request("observe", {"url": EACH.sub("{each}", found["url"]), "headers": spec["observe"].get("headers") or {}})
        many = _Many(request, each, parse_pointer(found.get("list", "")), parse_pointer(found["match"]), found["value"],
                     int(found.get("max", MANY_DEFAULT)), found.get("page_size"),
                     parse_pointer(found["next"]) if "next" in found else None)
    made = _Spec(_compile_request("invoke", spec["invoke"]), _compile_request("observe", spec["observe"]),
                 spec.get("idempotency_header"), spec.get("epoch_header"), bool(spec.get("deduplicates", False)),
                 spec.get("retention_seconds"), spec.get("ca_file"), many)
    with _COMPILED_LOCK:
        if len(_COMPILED) > 16:
            _COMPILED.clear()
        _COMPILED[text] = made
    return made


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


# -- Retry-After ------------------------------------------------------------------------------

def _empty(value: Any) -> bool:
    return value is MISSING or value is None or value in ("", [], {})


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


# -- secrets -------------------------------------------------------------------------------------

def _read_secret(kind: str, name: str, workspace: str, environ: Mapping[str, str]) -> str:
    """The value of ``{env:NAME}`` or ``{file:PATH}``; raises ValueError with a message that holds no value."""
    if kind == "env":
        value = environ.get(name)
        if value is None:
            raise ValueError(f"the environment variable {name} is not set")
    else:
        path = os.path.join(workspace, name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise ValueError(f"cannot open {name}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{name} is not a regular file")
            data = os.read(fd, SECRET_FILE_LIMIT + 1)
        finally:
            os.close(fd)
        if len(data) > SECRET_FILE_LIMIT:
            raise ValueError(f"{name} is larger than {SECRET_FILE_LIMIT} bytes")
        try:
            value = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8 text") from None
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise ValueError(f"{'$' + name if kind == 'env' else name} is empty")
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"{'$' + name if kind == 'env' else name} holds a line break or a NUL")
    return value


#: Secret values shorter than this are not searched for in answers (replacing them would garble receipts).
_SCRUB_MIN = 6


def _scrub_text(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if len(secret) >= _SCRUB_MIN and secret in text:
            text = text.replace(secret, _REDACTED)
    return text


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with every secret value in its strings (keys included) replaced by ``[secret]``."""
    if not secrets:
        return value
    if isinstance(value, str):
        return _scrub_text(value, secrets)
    if isinstance(value, dict):
        return {_scrub_text(k, secrets): _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    return value


# -- connections -----------------------------------------------------------------------------------

class _Origin(NamedTuple):
    """Where a connection leads: a pooled connection is only reused for the same origin."""

    scheme: str
    host: str
    port: int
    proxy: Optional[Tuple[str, int]]
    proxy_auth: Optional[str]
    ca_file: Optional[str]


_CONTEXTS: Dict[Optional[str], "ssl.SSLContext"] = {}
_CONTEXTS_LOCK = threading.Lock()


def _tls_context(ca_file: Optional[str]) -> "ssl.SSLContext":
    """The TLS context for ``ca_file`` (None: the system's CAs), made once per process: loading CAs is slow."""
    import ssl

    with _CONTEXTS_LOCK:
        context = _CONTEXTS.get(ca_file)
        if context is None:
            context = _CONTEXTS[ca_file] = ssl.create_default_context(cafile=ca_file)
        return context


def _dropped(conn: "http.client.HTTPConnection") -> bool:
    """True when an idle connection cannot carry a request: no socket, or the peer closed it or sent bytes unasked.

    An idle HTTP/1.1 connection has nothing to read; a readable socket means
    the server's FIN (or stray bytes) arrived, so reusing it would send a
    request the server will never read.
    """
    sock = conn.sock
    if sock is None:
        return True
    try:
        pending = getattr(sock, "pending", None)  # a TLS socket: bytes already decrypted are unasked bytes too
        if pending is not None and pending():
            return True
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class ConnectionPool:
    """Idle keep-alive connections per origin, handed out one caller at a time (thread-safe).

    :meth:`take` never returns a connection seen closed; a caller gives a
    connection back (:meth:`give`) only after reading its answer whole.
    """

    def __init__(self, per_origin: int = IDLE_PER_ORIGIN) -> None:
        self.per_origin = per_origin
        self._idle: Dict[_Origin, List["http.client.HTTPConnection"]] = {}
        self._lock = threading.Lock()
        self.made = 0
        self.reused = 0
        self.discarded = 0

    def take(self, origin: _Origin) -> Optional["http.client.HTTPConnection"]:
        """An idle connection to ``origin`` that is still open, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            if conn is None:
                return None
            if _dropped(conn):
                conn.close()
                with self._lock:
                    self.discarded += 1
                continue
            with self._lock:
                self.reused += 1
            return conn

    def give(self, origin: _Origin, conn: "http.client.HTTPConnection") -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.per_origin:
                idle.append(conn)
                return
        conn.close()

    def counted_new(self) -> None:
        with self._lock:
            self.made += 1

    def clear(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


#: The connections of this process, shared by every adapter (``drive`` makes one per item).
POOL = ConnectionPool()


class _Watchdog:
    """One daemon thread that shuts sockets down at their deadlines: a call's time bounds its reads, however slow."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: List[Tuple[float, int]] = []
        self._armed: Dict[int, "socket.socket"] = {}
        self._count = 0
        self._thread: Optional[threading.Thread] = None

    def arm(self, sock: "socket.socket", deadline: float) -> int:
        """Shut ``sock`` down at ``deadline`` (monotonic seconds) unless disarmed first; return the handle."""
        with self._cond:
            self._count += 1
            handle = self._count
            self._armed[handle] = sock
            heapq.heappush(self._heap, (deadline, handle))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="runner-http-watchdog", daemon=True)
                self._thread.start()
            if self._heap[0][1] == handle:
                self._cond.notify()  # a new earliest deadline; otherwise the thread wakes at the earlier one anyway
            return handle

    def disarm(self, handle: int) -> None:
        with self._cond:
            self._armed.pop(handle, None)

    def _loop(self) -> None:
        import socket

        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait(30.0)
                    continue
                deadline, handle = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                sock = self._armed.pop(handle, None)
                if sock is not None:
                    try:
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
                    except OSError:
                        pass


_WATCHDOG = _Watchdog()


class _NotSent(Exception):
    """Nothing of the request left this process: no connection, a secret that cannot be read, a deadline passed.

    ``final``: asking again within this call cannot help (a secret, the deadline).
    """

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


class _Lost(Exception):
    """The request was (perhaps partly) sent and no whole answer came back."""


class _Reply(NamedTuple):
    status: int
    reason: str
    headers: Any  # http.client.HTTPMessage
    body: bytes
    whole: bool


# -- the adapter -----------------------------------------------------------------------------------

class HttpAdapter:
    """The contract's ``effects.http`` as a :class:`runner.target.Adapter` (see the module docstring).

    :param spec: the ``effects.http`` section (checked by :func:`http_problems`).
    :param values: the item's placeholders (``item``, ``stem``, ``slug``, ``index``) and ``run_id``.
    :param workspace: the folder ``{file:PATH}`` and ``ca_file`` are relative to.
    :param timeout: seconds one call may take, connecting, sending and receiving together.
    :param environ: where ``{env:NAME}`` is read (default ``os.environ``; proxies are the process's, as urllib reads them).
    :param sleep: how a lookup waits before asking again (injectable).
    :raises InvalidInput: the section is invalid, or a header's secret cannot be read now.
    """

    name = "http"
    conflicting_payload = "not the target's to decide: the ledger binds a key to one payload, and the runner refuses another before any call"

    def __init__(self, spec: Dict[str, Any], *, values: Optional[Mapping[str, Any]] = None, workspace: str = ".",
                 timeout: float = 60.0, pool: ConnectionPool = POOL, environ: Optional[Mapping[str, str]] = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = _compile(spec)
        self.values = dict(values or {})
        self.workspace = os.path.abspath(workspace)
        self.timeout = float(timeout)
        self.pool = pool
        self.environ = os.environ if environ is None else environ
        self.sleep = sleep
        self.deduplicates = self.spec.deduplicates
        self.retention_seconds: Optional[float] = self.spec.retention if self.deduplicates else None
        header = self.spec.idempotency_header
        self.key_scope = (f"the target's, on the {header} header" if header else
                          "none: the key is not sent to the target (it is found by the observe request)")
        observe = self.spec.observe
        pointer = spec["observe"].get("pointer")
        self.verification = f"{observe.method} {observe.url}" + (f" holding a value at {pointer}" if pointer is not None else "")
        self._origins = {kind: self._origin(request) for kind, request in (("invoke", self.spec.invoke), ("observe", observe))}
        for request in (self.spec.invoke, observe):
            # The item's own header values, secrets read now: one that cannot be made or sent stops the item before it
            # begins. Any key and epoch will do: a key is an id and an epoch a number, both ASCII.
            try:
                self._headers(request, "k", 1, [])
            except ValueError as exc:
                raise InvalidInput(f"effects.http.{request.kind}: {exc}") from None

    # -- the two calls -----------------------------------------------------------------------------
    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Send the payload as JSON; the answer's status says what happened (see the module docstring)."""
        request = self.spec.invoke
        secrets: List[str] = []
        try:
            reply = self._exchange(request, key, epoch, canonical_json(payload), secrets, self._end())
        except _NotSent as exc:
            raise NotApplied(_scrub_text(f"{request.method} {self._shown_url(request, key, epoch)}: {exc}", secrets)) from None
        except _Lost as exc:
            raise UnknownOutcome(_scrub_text(f"{request.method} {self._shown_url(request, key, epoch)}: {exc}", secrets)) from None
        retry_after = retry_after_seconds(reply.headers.get("Retry-After"))
        word = invoke_outcome(request.statuses, reply.status, retry_after)
        if word == "receipt":
            return _scrub(self._receipt(request, reply, key, epoch), secrets)
        detail = _scrub_text(self._answered(request, reply, key, epoch), secrets)
        if word == "not-applied":
            raise NotApplied(detail, retry_after)
        if word == "rejected":
            raise Rejected(detail)
        if word == "stale-epoch":
            raise StaleEpoch(detail)
        raise UnknownOutcome(detail)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Look the effect up; never changes anything at the target. Asks again after "not now" within the call's time."""
        request = self.spec.observe
        secrets: List[str] = []
        end = self._end()
        evidence: Dict[str, Any] = {"source": "http", "request": self._shown(request, key, None)}
        while True:
            try:
                reply = self._exchange(request, key, None, None, secrets, end)
            except _NotSent as exc:
                if exc.final:
                    return Observation("unknown", _scrub(dict(evidence, reason=str(exc)[:500]), secrets))
                reason, wait = str(exc), 0.5
            except _Lost as exc:
                return Observation("unknown", _scrub(dict(evidence, reason=str(exc)[:500]), secrets))
            else:
                if reply.status not in _LOOK_AGAIN or outcome_of(request.statuses, reply.status) != "unknown":
                    seen = self._seen(request, reply, evidence)
                    return Observation(seen.status, _scrub(seen.evidence, secrets))
                reason = self._answered(request, reply, key, None)
                asked = retry_after_seconds(reply.headers.get("Retry-After"))
                wait = 0.5 if asked is None else asked
            if time.monotonic() + wait >= end:
                return Observation("unknown", _scrub(dict(evidence, reason=reason[:500]), secrets))
            self.sleep(wait)

    @property
    def batch_key(self) -> Optional[Tuple[Any, ...]]:
        """Adapters with one ``batch_key`` may be looked up together by :meth:`observe_many` (None: no ``observe.many``)."""
        return None if self.spec.many is None else ("http", id(self.spec), self.workspace)

    @property
    def observe_batch(self) -> int:
        """The most keys one :meth:`observe_many` asks for."""
        return self.spec.many.most if self.spec.many is not None else 1

    def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        """Look several keys up with one request (``observe.many``), in the order given.

        Each item is ``(key, payload, adapter)``: its adapter holds the key's
        placeholders. The URL's ``{each:...}`` is filled for every key and the
        parts joined with ``&``; the answer's list (at ``list``) is matched back
        to each key by the value at ``match`` equal to the key's ``value``. A
        key with a match is present (``matches`` says how many), whatever the
        paging. A key with none is absent only when the answer is whole
        (:meth:`_partial`); otherwise it is ``unseen``: this answer could not
        have shown it, and the key's own lookup must. Any status but 200, an
        answer that is not a list, or a lost connection says nothing of any key:
        all unseen.

        :raises NotApplied: the lookup was refused for now (408, 429, 503, or no connection).
        :raises Rejected: the target refuses this lookup (any other 4xx, such as 414 or 400): ask key by key.
        """
        many = self.spec.many
        if many is None:
            raise InvalidInput("this contract's observe request names no 'many': keys are looked up one by one")
        parts, wanted = [], []
        for key, _payload, adapter in items:
            values = dict(getattr(adapter, "values", self.values), key=key)
            encoded = {n: v if isinstance(v, int) and not isinstance(v, bool) else urllib.parse.quote(str(v), safe="") for n, v in values.items()}
            parts.append(expand([many.each], encoded)[0])
            wanted.append(expand([many.value], values)[0])
        request = many.request._replace(rest=many.request.rest.replace("{each}", "&".join(parts)))
        first = items[0][0]
        secrets: List[str] = []
        evidence: Dict[str, Any] = {"source": "http", "request": self._shown(request, first, None), "keys": len(items)}

        def unseen(reason: str) -> List[Observation]:
            return [Observation("unseen", _scrub(dict(evidence, reason=reason[:500]), secrets)) for _ in items]

        try:
            reply = self._exchange(request, first, None, None, secrets, self._end())
        except _NotSent as exc:
            if exc.final:
                return unseen(str(exc))
            raise NotApplied(str(exc)) from None
        except _Lost as exc:
            return unseen(str(exc))
        if reply.status in _MANY_NOT_NOW:
            raise NotApplied(self._answered(request, reply, first, None), retry_after_seconds(reply.headers.get("Retry-After")))
        if 400 <= reply.status < 500:
            raise Rejected(_scrub_text(self._answered(request, reply, first, None), secrets))
        document = _json(reply.body) if reply.whole and reply.status == 200 else MISSING
        listed = resolve_pointer(document, many.list) if document is not MISSING else MISSING
        if not isinstance(listed, list):
            return unseen(self._answered(request, reply, first, None) + " (not a list to match the keys against)")
        cut = self._partial(many, reply, document, listed)
        found = matched(listed, many.match)
        out = []
        for want in wanted:
            matches = found.get(want, [])
            seen = dict(evidence, status=reply.status, matches=len(matches))
            if matches:
                seen["found"] = shown(matches[0])
            elif cut:
                seen["reason"] = cut
            out.append(Observation("present" if matches else "unseen" if cut else "absent", _scrub(seen, secrets)))
        return out

    @staticmethod
    def _partial(many: _Many, reply: _Reply, document: Any, listed: List[Any]) -> Optional[str]:
        """Why the answer may be one page of several (so a key missing from it may be on another), or None: it is whole.

        Whole only when the contract says how the target marks a page and this answer bears no mark: no ``Link``
        with ``rel="next"``, fewer entries than ``page_size`` if declared, nothing at ``next`` if declared.
        """
        if any(_LINK_NEXT.search(value) for value in reply.headers.get_all("Link") or []):
            return 'the answer links to a next page (Link rel="next")'
        if many.page_size is None and many.next is None:
            return "observe.many declares neither page_size nor next: the answer may be one page of several"
        if many.page_size is not None and len(listed) >= many.page_size:
            return f"the answer holds {len(listed)} entries, as many as a page (page_size {many.page_size})"
        more = resolve_pointer(document, many.next) if many.next is not None else MISSING
        if more is not False and not _empty(more):  # a cursor, a link, or a "has_more": true
            return "the answer names a next page (at the pointer next)"
        return None

    # -- answers ---------------------------------------------------------------------------------------
    def _receipt(self, request: _Request, reply: _Reply, key: str, epoch: Optional[int]) -> Dict[str, Any]:
        """The JSON object answered, when there is one of a sane size; else the status, chosen headers and the body's digest."""
        if reply.whole and len(reply.body) <= RECEIPT_BODY_LIMIT:
            found = _json(reply.body)
            if isinstance(found, dict):
                return found
        kept = {name: reply.headers.get(name) for name in request.receipt_headers if reply.headers.get(name) is not None}
        return {"status": reply.status, "headers": kept, "body_sha256": sha256_hex(reply.body), "body_bytes": len(reply.body),
                "request": self._shown(request, key, epoch)}

    def _seen(self, request: _Request, reply: _Reply, evidence: Dict[str, Any]) -> Observation:
        word = outcome_of(request.statuses, reply.status)
        evidence = dict(evidence, status=reply.status, body_sha256=sha256_hex(reply.body), body_bytes=len(reply.body))
        if word != "present" or request.pointer is None:
            return Observation(word, evidence)
        document = _json(reply.body) if reply.whole else MISSING
        if document is MISSING:
            return Observation("unknown", dict(evidence, reason="the answer is not JSON (or longer than 1 MiB): the pointer cannot be read"))
        if isinstance(document, list):
            evidence["matches"] = len(document)  # a list of several: worth a person's look if the effect was called more than once
        value = resolve_pointer(document, request.pointer)
        if _empty(value):
            return Observation("absent", dict(evidence, at_pointer=None))
        evidence["at_pointer"] = shown(value)
        return Observation("present", evidence)

    def _answered(self, request: _Request, reply: _Reply, key: str, epoch: Optional[int]) -> str:
        text = " ".join(reply.body[:300].decode("utf-8", "replace").split())[:200]
        return f"{request.method} {self._shown_url(request, key, epoch)} answered {reply.status} {reply.reason}" + (f": {text}" if text else "")

    def _shown(self, request: _Request, key: str, epoch: Optional[int]) -> Dict[str, Any]:
        """The request as it may be recorded: method, URL and the names (never the values) of the headers sent."""
        names = [name for name, _ in request.headers]
        names += [h for h in (self.spec.idempotency_header, self.spec.epoch_header if request.kind == "invoke" else None) if h]
        return {"method": request.method, "url": self._shown_url(request, key, epoch), "headers": sorted(names, key=str.lower)}

    def _shown_url(self, request: _Request, key: str, epoch: Optional[int]) -> str:
        return f"{request.scheme}://{_authority(request)}{self._target(request, key, epoch)}"

    # -- requests -------------------------------------------------------------------------------------
    def _target(self, request: _Request, key: str, epoch: Optional[int]) -> str:
        """The path and query, each placeholder percent-encoded where it lands (a value is always one segment)."""
        values = dict(self.values, key=key, epoch="" if epoch is None else int(epoch))
        encoded = {name: value if isinstance(value, int) and not isinstance(value, bool) else urllib.parse.quote(str(value), safe="")
                   for name, value in values.items()}
        return expand([request.rest], encoded)[0]

    def _headers(self, request: _Request, key: str, epoch: Optional[int], secrets: List[str]) -> Dict[str, str]:
        """The headers to send: placeholders filled, then ``{env:...}`` and ``{file:...}`` read now (``secrets`` gets each value).

        :raises ValueError: a secret cannot be read, or a value holds what HTTP cannot carry (the message names the
            header, never a value).
        """
        values = dict(self.values, key=key, epoch="" if epoch is None else int(epoch))
        out: Dict[str, str] = {}
        for name, template in request.headers:
            value = expand([template], values)[0]

            def secret(match: "re.Match[str]", name: str = name) -> str:
                try:
                    found = _read_secret(match.group(1), match.group(2), self.workspace, self.environ)
                except ValueError as exc:
                    raise ValueError(f"the value of header {name} cannot be made: {exc}") from None
                secrets.append(found)
                return found

            out[name] = SECRET.sub(secret, value)
            if sensitive(name):
                secrets.append(out[name])
            problem = unsendable(out[name])
            if problem:
                raise ValueError(f"the value of header {name} cannot be sent: it holds {problem}")
        lowered = {n.lower() for n in out}
        if request.kind == "invoke":
            if self.spec.idempotency_header:
                out[self.spec.idempotency_header] = key
            if self.spec.epoch_header and epoch is not None:
                out[self.spec.epoch_header] = str(int(epoch))
            if "content-type" not in lowered:
                out["Content-Type"] = "application/json"
        if "accept" not in lowered:
            out["Accept"] = "application/json"
        if "user-agent" not in lowered:
            out["User-Agent"] = "long-running-agent-sessions-runner"
        secrets.sort(key=len, reverse=True)  # a longer value first, so a secret inside another is replaced whole
        return out

    def _origin(self, request: _Request) -> _Origin:
        """Where connections for ``request`` go: straight to the host, or through the environment's proxy for its scheme."""
        ca_file = os.path.join(self.workspace, self.spec.ca_file) if self.spec.ca_file else None
        proxy = _proxy_for(request.scheme, request.host, request.port)
        if not proxy:
            return _Origin(request.scheme, request.host, request.port, None, None, ca_file)
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if parts.scheme != "http" or not parts.hostname:
            raise InvalidInput(f"the {request.scheme} proxy of the environment must be an http:// URL with a host")
        auth = None
        if parts.username is not None:
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
        return _Origin(request.scheme, request.host, request.port, (parts.hostname, parts.port or 80), auth, ca_file)

    def _connect(self, origin: _Origin, timeout: float) -> "http.client.HTTPConnection":
        """A new connection to ``origin`` (through its proxy's tunnel for https); raises _NotSent: nothing was sent."""
        import http.client

        conn: http.client.HTTPConnection
        host, port = origin.proxy if origin.proxy else (origin.host, origin.port)
        if origin.scheme == "https":
            try:
                context = _tls_context(origin.ca_file)
            except (OSError, ValueError) as exc:
                raise _NotSent(f"cannot load the TLS certificates of ca_file: {exc}") from None
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
            if origin.proxy:
                conn.set_tunnel(origin.host, origin.port, headers={"Proxy-Authorization": origin.proxy_auth} if origin.proxy_auth else None)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            conn.close()
            raise _NotSent(f"no connection to {host}:{port}{' (proxy)' if origin.proxy else ''}, nothing was sent: "
                           f"{type(exc).__name__}: {exc}") from None
        self.pool.counted_new()
        return conn

    def _end(self) -> float:
        """The monotonic moment this call must be over: its own time, or the registered call's deadline if sooner."""
        end = time.monotonic() + self.timeout
        making = inflight.current()
        if making is not None:
            registry, call = making
            end = min(end, time.monotonic() + float(call.record["deadline"]) - registry.clock())
        return end

    def _exchange(self, request: _Request, key: str, epoch: Optional[int], body: Optional[bytes], secrets: List[str],
                  end: float) -> _Reply:
        """One request and its answer, before ``end`` (monotonic seconds).

        :raises _NotSent: nothing of the request left this process.
        :raises _Lost: the request was sent, perhaps in part, and no whole answer came back.
        """
        try:
            headers = self._headers(request, key, epoch, secrets)
        except ValueError as exc:
            raise _NotSent(str(exc), final=True) from None
        origin = self._origins[request.kind]
        target = self._target(request, key, epoch)
        if origin.proxy and origin.scheme == "http":
            target = f"http://{_authority(request)}{target}"  # a proxy is sent the whole URL
            if origin.proxy_auth:
                headers["Proxy-Authorization"] = origin.proxy_auth
        for fresh in (False, True):
            conn = None if fresh else self.pool.take(origin)
            reused = conn is not None
            if conn is None:
                left = end - time.monotonic()
                if left <= 0:
                    raise _NotSent(f"the call's {self.timeout:g}s were spent before a connection was made; nothing was sent", final=True)
                conn = self._connect(origin, left)
            try:
                return self._send(conn, origin, request, target, headers, body, end, reused)
            except _Retry:
                continue  # a reused connection the server closed as the request went out, for a lookup: once more, on a new one
        raise _Lost("the target closed a new connection before answering")

    def _send(self, conn: "http.client.HTTPConnection", origin: _Origin, request: _Request, target: str, headers: Dict[str, str],
              body: Optional[bytes], end: float, reused: bool) -> _Reply:
        """Write the request on ``conn`` and read the answer; a connection read to its end goes back to the pool."""
        import http.client

        # The last look before anything is written: a process stopped and continued late sends nothing.
        making = inflight.current()
        if making is not None and making[0].clock() >= float(making[1].record["deadline"]):
            self.pool.give(origin, conn)
            raise _NotSent("the call's deadline passed before the request was sent (the process was held up); nothing was sent", final=True)
        now = time.monotonic()
        if now >= end:
            self.pool.give(origin, conn)
            raise _NotSent(f"the call's {self.timeout:g}s were spent before the request was sent; nothing was sent", final=True)
        try:
            _compose(conn, request.method, target, headers, body)
        except (ValueError, TypeError, http.client.HTTPException) as exc:
            conn.close()  # it holds part of a request that will never be sent
            raise _NotSent(f"the request cannot be written ({type(exc).__name__}); nothing was sent",
                           final=True) from None
        sock = conn.sock
        sock.settimeout(max(0.001, end - now))
        guard = _WATCHDOG.arm(sock, end)
        try:
            try:
                conn.endheaders(body)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and request.kind == "observe" and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                    raise _Retry() from None
                raise _Lost(self._lost(exc, end)) from None
            data = bytearray()
            try:
                # A server that closes the connection with its answer (HTTP/1.0, "Connection: close") has it
                # closed here as the answer's last byte is read: read no further from a closed socket.
                while len(data) <= BODY_LIMIT and not response.isclosed():
                    if sock.fileno() != -1:
                        sock.settimeout(max(0.001, end - time.monotonic()))
                    chunk = response.read(min(65536, BODY_LIMIT + 1 - len(data)))
                    if not chunk:
                        break
                    data += chunk
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _Lost(f"answered {response.status}, then the answer broke off: {self._lost(exc, end)}") from None
        finally:
            _WATCHDOG.disarm(guard)
        whole = len(data) <= BODY_LIMIT
        if whole and response.isclosed() and not response.will_close and conn.sock is not None:
            self.pool.give(origin, conn)
        else:
            conn.close()
        return _Reply(response.status, response.reason, response.headers, bytes(data[:BODY_LIMIT]), whole)

    def _lost(self, exc: BaseException, end: float) -> str:
        import socket

        if time.monotonic() >= end - 0.001 or isinstance(exc, socket.timeout):
            return f"no whole answer within the call's {self.timeout:g}s; the request may have been acted on"
        return f"the connection failed after the request was sent, perhaps in part ({type(exc).__name__}: {exc}); it may have been acted on"


class _Retry(Exception):
    pass


def _compose(conn: "http.client.HTTPConnection", method: str, target: str, headers: Dict[str, str],
             body: Optional[bytes]) -> None:
    """The request line and headers, into ``conn``'s buffer: what cannot be encoded raises here, before a byte is sent.

    What :meth:`http.client.HTTPConnection.request` does before it sends, split from the sending
    (:meth:`~http.client.HTTPConnection.endheaders`) so that an error here is known to have sent nothing.
    """
    lowered = {name.lower() for name in headers}
    conn.putrequest(method, target, skip_accept_encoding="accept-encoding" in lowered)
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    elif method in ("POST", "PUT", "PATCH"):
        conn.putheader("Content-Length", "0")
    for name, value in headers.items():
        conn.putheader(name, value)


def _authority(request: _Request) -> str:
    default = 443 if request.scheme == "https" else 80
    host = f"[{request.host}]" if ":" in request.host else request.host
    return host if request.port == default else f"{host}:{request.port}"


#: The environment variables urllib's proxy settings depend on (each also in upper case).
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "request_method")
_PROXIES: Dict[Tuple[Any, ...], Optional[str]] = {}
_PROXIES_LOCK = threading.Lock()


def _proxy_for(scheme: str, host: str, port: int) -> Optional[str]:
    """The proxy URL for ``scheme://host:port`` as urllib decides it (``getproxies``, ``proxy_bypass``), or None.

    Remembered per value of the variables it depends on: reading the whole
    environment for every item would cost more than the call.
    """
    key = (tuple(os.environ.get(v) for name in _PROXY_VARIABLES for v in (name, name.upper())), scheme, host, port)
    with _PROXIES_LOCK:
        if key in _PROXIES:
            return _PROXIES[key]
    import urllib.request

    proxy = urllib.request.getproxies().get(scheme)
    if proxy:
        try:
            if urllib.request.proxy_bypass(f"{host}:{port}") or urllib.request.proxy_bypass(host):
                proxy = None
        except OSError:
            pass
    with _PROXIES_LOCK:
        if len(_PROXIES) > 64:
            _PROXIES.clear()
        _PROXIES[key] = proxy or None
    return proxy or None


def _json(body: bytes) -> Any:
    try:
        found = loads_strict(body)
        check_nesting(found)
    except (ValueError, UnicodeDecodeError):
        return MISSING
    if len(canonical_json(found)) > MAX_DOCUMENT_BYTES:
        return MISSING
    return found
