"""An HTTP/1.1 client of the standard library that sends a request only when it can say whether anything was sent.

It knows nothing of effects, keys or contracts: :class:`HttpClient` sends one
request to an :class:`Origin` before a deadline and returns a :class:`Reply`,
or raises :class:`NotSent` (nothing of the request left this process) or
:class:`Lost` (the request was sent, perhaps in part, and no whole answer came
back). Its caller decides what either means; the HTTP adapter
(:mod:`runner.adapters.http`) fills :attr:`HttpClient.before_send` from the
registry of calls in flight.

Invariants kept here:

* **Nothing is sent that cannot be written whole.** The request line and
  headers are composed into the connection's buffer first: whatever cannot
  be encoded fails there, before a byte is written (:class:`NotSent`).
* **Nothing is sent past the deadline.** Right before the request is
  written, ``before_send()`` is asked (a reason not to send, or None) and the
  deadline checked; past either, nothing is sent.
* **One time limit per request.** The deadline bounds connecting, sending
  and receiving together: each phase gets what is left, and a watchdog
  thread shuts the socket down at the deadline, so a server that answers one
  byte at a time cannot stretch it. Answers are read up to
  :data:`BODY_LIMIT` bytes, or the limit a request names.
* **Connections are reused only when they are seen open.** Idle connections
  are kept per origin (scheme, host, port, proxy, CA file) in a thread-safe
  pool; before one is reused, its socket is polled: one the server closed (or
  that holds unexpected bytes) is thrown away and a new one made, so a closed
  keep-alive connection never turns a POST into a lost answer. Only a request
  its caller calls idempotent is sent once more, on a new connection, when a
  reused one was closed as it went out. No process is started for a request.
* Proxies come from the environment as :func:`urllib.request.getproxies` and
  :func:`urllib.request.proxy_bypass` read it (``https_proxy``,
  ``http_proxy``, ``no_proxy``); https goes through a CONNECT tunnel. TLS is
  :func:`ssl.create_default_context`, with the origin's CA file for a private
  CA.
"""

import base64
import heapq
import os
import select
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..base.errors import InvalidInput

# http.client, ssl, socket and urllib.request are imported where a request needs them: a driver imports the HTTP
# adapter whatever its target, and those modules would add tens of milliseconds to each start.
if TYPE_CHECKING:
    import http.client
    import socket
    import ssl

__all__ = [
    "HttpClient",
    "ConnectionPool",
    "POOL",
    "Origin",
    "Reply",
    "NotSent",
    "Lost",
    "BODY_LIMIT",
    "IDLE_PER_ORIGIN",
    "origin_of",
    "authority",
    "dropped",
]

#: Bytes of an answer read at most; a longer answer is cut there and its connection closed.
BODY_LIMIT = 1024 * 1024
#: Idle connections kept per origin.
IDLE_PER_ORIGIN = 16


class Origin(NamedTuple):
    """Where a connection leads: a pooled connection is only reused for the same origin."""

    scheme: str
    host: str
    port: int
    proxy: Optional[Tuple[str, int]]
    proxy_auth: Optional[str]
    ca_file: Optional[str]


class Reply(NamedTuple):
    """An answer: its status line, headers (an ``http.client.HTTPMessage``) and body, ``whole`` unless cut at
    :data:`BODY_LIMIT`."""

    status: int
    reason: str
    headers: Any
    body: bytes
    whole: bool


class NotSent(Exception):
    """Nothing of the request left this process: no connection, a header that cannot be made, a deadline passed.

    ``final``: asking again before the same deadline cannot help.
    """

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


class Lost(Exception):
    """The request was (perhaps partly) sent and no whole answer came back."""


class _Retry(Exception):
    """A reused connection the server closed as an idempotent request went out: send it once more, on a new one."""


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


def dropped(conn: "http.client.HTTPConnection") -> bool:
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
        self._idle: Dict[Origin, List["http.client.HTTPConnection"]] = {}
        self._lock = threading.Lock()
        self.made = 0
        self.reused = 0
        self.discarded = 0

    def take(self, origin: Origin) -> Optional["http.client.HTTPConnection"]:
        """An idle connection to ``origin`` that is still open, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            if conn is None:
                return None
            if dropped(conn):
                conn.close()
                with self._lock:
                    self.discarded += 1
                continue
            with self._lock:
                self.reused += 1
            return conn

    def give(self, origin: Origin, conn: "http.client.HTTPConnection") -> None:
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


#: The connections of this process, shared by every client (``drive`` makes one adapter, and so one client, per item).
POOL = ConnectionPool()


class _Watchdog:
    """One daemon thread that shuts sockets down at their deadlines: a request's time bounds its reads, however slow."""

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


def _no_objection() -> Optional[str]:
    return None


class HttpClient:
    """Requests over pooled connections, each within a deadline, each telling a request not sent from one lost.

    :param timeout: the seconds a request may take, as its messages name them (its caller gives the deadline).
    :param pool: where idle connections wait between requests.
    :param before_send: asked right before a request is written: a reason not to send it (ending in "nothing was
        sent"), or None. The request is then not sent, and :meth:`exchange` raises a final :class:`NotSent`.
    """

    def __init__(self, timeout: float, pool: ConnectionPool = POOL,
                 before_send: Callable[[], Optional[str]] = _no_objection) -> None:
        self.timeout = float(timeout)
        self.pool = pool
        self.before_send = before_send

    def exchange(self, origin: Origin, method: str, target: str, headers: Dict[str, str], body: Optional[bytes],
                 end: float, idempotent: bool = False, limit: int = BODY_LIMIT) -> Reply:
        """One request and its answer, before ``end`` (monotonic seconds).

        :param target: the path and query, encoded (a proxy of plain http is sent the whole URL instead).
        :param idempotent: sending it twice is harmless: a reused connection closed as it went out is retried once.
        :param limit: the bytes of the answer read at most (a longer one is cut there, ``whole`` False).
        :raises NotSent: nothing of the request left this process.
        :raises Lost: the request was sent, perhaps in part, and no whole answer came back.
        """
        if origin.proxy and origin.scheme == "http":
            target = f"http://{authority(origin.scheme, origin.host, origin.port)}{target}"  # a proxy is sent the URL
            if origin.proxy_auth:
                headers = dict(headers, **{"Proxy-Authorization": origin.proxy_auth})
        for fresh in (False, True):
            conn = None if fresh else self.pool.take(origin)
            reused = conn is not None
            if conn is None:
                left = end - time.monotonic()
                if left <= 0:
                    raise NotSent(f"the call's {self.timeout:g}s were spent before a connection was made; "
                                  "nothing was sent", final=True)
                conn = self._connect(origin, left)
            try:
                return self._send(conn, origin, method, target, headers, body, end, reused and idempotent, limit)
            except _Retry:
                continue  # a reused connection the server closed as the request went out: once more, on a new one
        raise Lost("the target closed a new connection before answering")

    def _connect(self, origin: Origin, timeout: float) -> "http.client.HTTPConnection":
        """A new connection to ``origin`` (through its proxy's tunnel for https); raises NotSent: nothing was sent."""
        import http.client

        conn: http.client.HTTPConnection
        host, port = origin.proxy if origin.proxy else (origin.host, origin.port)
        if origin.scheme == "https":
            try:
                context = _tls_context(origin.ca_file)
            except (OSError, ValueError) as exc:
                raise NotSent(f"cannot load the TLS certificates of ca_file: {exc}") from None
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
            if origin.proxy:
                conn.set_tunnel(origin.host, origin.port,
                                headers={"Proxy-Authorization": origin.proxy_auth} if origin.proxy_auth else None)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            conn.close()
            raise NotSent(f"no connection to {host}:{port}{' (proxy)' if origin.proxy else ''}, nothing was sent: "
                          f"{type(exc).__name__}: {exc}") from None
        self.pool.counted_new()
        return conn

    def _send(self, conn: "http.client.HTTPConnection", origin: Origin, method: str, target: str,
              headers: Dict[str, str], body: Optional[bytes], end: float, retry: bool,
              limit: int = BODY_LIMIT) -> Reply:
        """Write the request on ``conn`` and read the answer; a connection read to its end goes back to the pool.

        :param retry: a connection closed as the request went out raises :class:`_Retry` rather than :class:`Lost`.
        """
        import http.client

        # The last look before anything is written: a process stopped and continued late sends nothing.
        objection = self.before_send()
        if objection is not None:
            self.pool.give(origin, conn)
            raise NotSent(objection, final=True)
        now = time.monotonic()
        if now >= end:
            self.pool.give(origin, conn)
            raise NotSent(f"the call's {self.timeout:g}s were spent before the request was sent; nothing was sent",
                          final=True)
        try:
            _compose(conn, method, target, headers, body)
        except (ValueError, TypeError, http.client.HTTPException) as exc:
            conn.close()  # it holds part of a request that will never be sent
            raise NotSent(f"the request cannot be written ({type(exc).__name__}); nothing was sent",
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
                if retry and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                    raise _Retry() from None
                raise Lost(self._lost(exc, end)) from None
            data = bytearray()
            try:
                # A server that closes the connection with its answer (HTTP/1.0, "Connection: close") has it
                # closed here as the answer's last byte is read: read no further from a closed socket.
                while len(data) <= limit and not response.isclosed():
                    if sock.fileno() != -1:
                        sock.settimeout(max(0.001, end - time.monotonic()))
                    chunk = response.read(min(65536, limit + 1 - len(data)))
                    if not chunk:
                        break
                    data += chunk
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise Lost(f"answered {response.status}, then the answer broke off: {self._lost(exc, end)}") from None
        finally:
            _WATCHDOG.disarm(guard)
        whole = len(data) <= limit
        if whole and response.isclosed() and not response.will_close and conn.sock is not None:
            self.pool.give(origin, conn)
        else:
            conn.close()
        return Reply(response.status, response.reason, response.headers, bytes(data[:limit]), whole)

    def _lost(self, exc: BaseException, end: float) -> str:
        import socket

        if time.monotonic() >= end - 0.001 or isinstance(exc, socket.timeout):
            return f"no whole answer within the call's {self.timeout:g}s; the request may have been acted on"
        return (f"the connection failed after the request was sent, perhaps in part ({type(exc).__name__}: {exc}); "
                "it may have been acted on")


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


def authority(scheme: str, host: str, port: int) -> str:
    """``host[:port]`` as a URL writes it: an IPv6 address in brackets, the scheme's default port left out."""
    default = 443 if scheme == "https" else 80
    shown = f"[{host}]" if ":" in host else host
    return shown if port == default else f"{shown}:{port}"


def origin_of(scheme: str, host: str, port: int, ca_file: Optional[str] = None) -> Origin:
    """Where connections to ``scheme://host:port`` go: straight to the host, or through the environment's proxy for
    its scheme.

    :param ca_file: the absolute path of the CA file https trusts (None: the system's CAs).
    :raises InvalidInput: the environment's proxy for the scheme is not an http:// URL with a host.
    """
    proxy = _proxy_for(scheme, host, port)
    if not proxy:
        return Origin(scheme, host, port, None, None, ca_file)
    parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
    if parts.scheme != "http" or not parts.hostname:
        raise InvalidInput(f"the {scheme} proxy of the environment must be an http:// URL with a host")
    auth = None
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return Origin(scheme, host, port, (parts.hostname, parts.port or 80), auth, ca_file)


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
