"""A helpdesk API on loopback, with the faults of a real one: no idempotency, 429s, answers dropped after creating,
lookups that lag.

The target the HTTP adapter (:mod:`runner.adapters.http`) is proved against
and benchmarked on, written for exactly those faults. JSON in and out; every
``/api/`` route needs ``Authorization: Bearer TOKEN`` (401 otherwise), the
token read from a file when the helpdesk starts.

* ``POST /api/issues`` with ``{"external_ref", "title", "body"}`` (strings):
  creates an issue **every time**, whatever it was sent before; answers 201
  ``{"id", "external_ref", "title", "url"}`` with ``Location``.
* ``GET /api/issues?external_ref=REF``: the issues with that reference that
  are listed yet, oldest first: an issue is listed ``lag`` seconds after it
  was created, as a search index would.
* ``GET /api/issues/ID``: one issue, listed or not.
* ``GET /admin/issues`` (no token): ``{"issues": N, "by_ref": {REF: N}}``,
  what a test audits; :meth:`Helpdesk.by_ref` is the same in this process.

Faults (:class:`Faults`): a fixed latency before every answer; a rate limit
that answers 429 above N requests per second; for POSTs, a probability or a
schedule (by the POST's number, from 1) of 429 without creating
(``Retry-After`` in seconds or as an HTTP date), of answers dropped after
creating (the connection closed without a byte), and of answers held after
creating until :meth:`Helpdesk.release` (a slow answer a worker can be killed
during). Every decision is logged in order (:meth:`Helpdesk.wait_for` lets a
test act at one). Randomness is seeded; the clock and sleep are injectable.

``python3 -m runner.proof.helpdesk --token-file F [--port P] [--lag S] ...``
serves it and prints ``listening URL``, until interrupted or until the process
that started it is gone (started in a shell's background, it ends with that
shell). A port in use or an unreadable token file is one line on stderr and
exit 1.
"""

import argparse
import collections
import contextlib
import hmac
import http.server
import json
import os
import random
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from email.utils import formatdate
from typing import Any, Callable, Deque, Dict, List, Mapping, NamedTuple, Optional, Protocol, Set, Tuple

__all__ = ["Faults", "Helpdesk", "HelpdeskServer", "conformance_factory", "main"]

#: The largest request body read.
MAX_BODY = 1024 * 1024
#: How long a held answer waits for :meth:`Helpdesk.release` at most.
HOLD_SECONDS = 30.0
POST_FAULTS = ("rate-limited", "dropped", "held")


class Faults(NamedTuple):
    """What goes wrong at the helpdesk. ``schedule``: ``{post_number: "rate-limited" | "dropped" | "held"}``."""

    lag: float = 0.0
    latency: float = 0.0
    rate_limit: Optional[float] = None
    p_rate_limited: float = 0.0
    p_dropped: float = 0.0
    schedule: Mapping[int, str] = {}
    retry_after: str = "seconds"
    retry_after_seconds: int = 1
    seed: int = 0


class Answer(NamedTuple):
    """What the handler sends: a status, headers and a JSON body; ``drop``: close without answering; ``hold``: wait
    first."""

    status: int
    body: Any = None
    headers: Tuple[Tuple[str, str], ...] = ()
    drop: bool = False
    hold: bool = False


class _Headers(Protocol):
    """A request's headers, as the HTTP server's message or a plain mapping gives them."""

    def get(self, name: str) -> Optional[str]:
        ...


class Helpdesk:
    """The helpdesk's issues, its faults and its log; thread-safe. Served by :class:`HelpdeskServer`.

    :param token: the bearer token every ``/api/`` request must carry.
    :param clock: seconds since the epoch (lag, rate limit, Retry-After dates).
    :param sleep: how the latency is waited.
    """

    def __init__(self, token: str, faults: Faults = Faults(), *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not token:
            raise ValueError("the helpdesk needs a token")
        self.token, self.faults, self.clock, self.sleep = token, faults, clock, sleep
        self.issues: List[Dict[str, Any]] = []
        self.log: List[Tuple[str, str]] = []
        self.posts = 0
        self.schedule: Dict[int, str] = dict(faults.schedule)
        self._rand = random.Random(faults.seed)
        self._recent: Deque[float] = collections.deque()
        self._cond = threading.Condition()
        self._released = threading.Event()

    @classmethod
    def from_token_file(cls, path: str, faults: Faults = Faults(), **options: Any) -> "Helpdesk":
        """A helpdesk whose token is the file's text without its trailing newline."""
        with open(path, encoding="utf-8") as handle:
            return cls(handle.read().rstrip("\r\n"), faults, **options)

    # -- what a test reads ----------------------------------------------------------------------
    def by_ref(self) -> Dict[str, int]:
        """How many issues exist per external reference (listed or not)."""
        with self._cond:
            return self._by_ref()

    def count(self, kind: str) -> int:
        """How many log entries of ``kind`` (``created``, ``rate-limited``, ``dropped``, ``held``, ``unauthorized``,
        ``listed``...)."""
        with self._cond:
            return sum(1 for k, _ in self.log if k == kind)

    def wait_for(self, kind: str, count: int = 1, timeout: float = 30.0) -> bool:
        """Block until the log holds ``count`` entries of ``kind``; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: sum(1 for k, _ in self.log if k == kind) >= count, timeout)

    def schedule_next(self, fault: str) -> None:
        """Make the next POST without a fault of its own meet ``fault`` (``rate-limited``, ``dropped`` or ``held``)."""
        if fault not in POST_FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self._cond:
            number = self.posts + 1
            while number in self.schedule:
                number += 1
            self.schedule[number] = fault

    def release(self) -> None:
        """Let every held answer go (and every later one: holding ends)."""
        self._released.set()

    def _note(self, kind: str, detail: str) -> None:
        self.log.append((kind, detail))
        self._cond.notify_all()

    # -- requests -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: _Headers, body: bytes) -> Answer:
        """The answer to one request (the issue is created inside; latency and holding are the server's to wait)."""
        parts = urllib.parse.urlsplit(path)
        if parts.path == "/admin/issues" and method == "GET":
            with self._cond:
                return Answer(200, {"issues": len(self.issues), "by_ref": self._by_ref()})
        if not parts.path.startswith("/api/"):
            return Answer(404, {"error": "not-found"})
        with self._cond:
            if not self._authorized(headers.get("Authorization")):
                self._note("unauthorized", f"{method} {parts.path}")
                return Answer(401, {"error": "unauthorized"}, (("WWW-Authenticate", "Bearer"),))
            if self._over_rate():
                self._note("rate-limited", f"{method} {parts.path} (rate)")
                return self._rate_limited()
            if parts.path == "/api/issues" and method == "POST":
                return self._create(body)
            if parts.path == "/api/issues" and method == "GET":
                refs = urllib.parse.parse_qs(parts.query).get("external_ref")
                now = self.clock()
                found = [self._shown(i) for i in self.issues if (refs is None or i["external_ref"] in refs)
                         and i["created_at"] + self.faults.lag <= now]
                self._note("listed", f"{refs} {len(found)}")
                return Answer(200, found)
            if parts.path.startswith("/api/issues/") and method == "GET":
                number = parts.path.rsplit("/", 1)[1]
                issue = next((i for i in self.issues if str(i["id"]) == number), None)
                return Answer(200, self._shown(issue)) if issue else Answer(404, {"error": "not-found"})
            return Answer(405 if parts.path.startswith("/api/issues") else 404, {"error": "no such route"})

    def _by_ref(self) -> Dict[str, int]:
        return dict(collections.Counter(issue["external_ref"] for issue in self.issues))

    def _authorized(self, value: Optional[str]) -> bool:
        expected = f"Bearer {self.token}".encode("utf-8")
        return value is not None and hmac.compare_digest(value.encode("utf-8", "replace"), expected)

    def _over_rate(self) -> bool:
        limit = self.faults.rate_limit
        if limit is None:
            return False
        now = self.clock()
        while self._recent and self._recent[0] <= now - 1.0:
            self._recent.popleft()
        if len(self._recent) >= limit:
            return True
        self._recent.append(now)
        return False

    def _rate_limited(self) -> Answer:
        wait = self.faults.retry_after_seconds
        value = str(wait) if self.faults.retry_after == "seconds" else formatdate(self.clock() + wait, usegmt=True)
        return Answer(429, {"error": "rate-limited"}, (("Retry-After", value),))

    def _create(self, body: bytes) -> Answer:
        try:
            fields = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return Answer(400, {"error": "the body is not JSON"})
        if (not isinstance(fields, dict) or
                not all(isinstance(fields.get(k), str) for k in ("external_ref", "title", "body")) or
                not fields["external_ref"]):
            return Answer(422, {"error": "external_ref, title and body are required strings"})
        self.posts += 1
        fault = self.schedule.get(self.posts)
        if fault is None and self._rand.random() < self.faults.p_rate_limited:
            fault = "rate-limited"
        if fault == "rate-limited":
            self._note("rate-limited", fields["external_ref"])
            return self._rate_limited()
        issue = {"id": len(self.issues) + 1, "external_ref": fields["external_ref"], "title": fields["title"],
                 "body": fields["body"], "created_at": self.clock()}
        self.issues.append(issue)
        self._note("created", fields["external_ref"])
        if fault is None and self._rand.random() < self.faults.p_dropped:
            fault = "dropped"
        if fault == "dropped":
            self._note("dropped", fields["external_ref"])
            return Answer(201, drop=True)
        if fault == "held":
            self._note("held", fields["external_ref"])
        return Answer(201, self._shown(issue), (("Location", f"/api/issues/{issue['id']}"),), hold=fault == "held")

    @staticmethod
    def _shown(issue: Dict[str, Any]) -> Dict[str, Any]:
        return {"id": issue["id"], "external_ref": issue["external_ref"], "title": issue["title"],
                "url": f"/api/issues/{issue['id']}"}

    def wait_answer(self, answer: Answer) -> None:
        """What the answer waits before it is sent: the fixed latency, and a hold until released."""
        if self.faults.latency:
            self.sleep(self.faults.latency)
        if answer.hold:
            self._released.wait(HOLD_SECONDS)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    helpdesk: Helpdesk
    open_connections: Set[socket.socket]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as a real API
    disable_nagle_algorithm = True  # the head and the body are two writes: without this, each answer waits for a
                                    # delayed ACK
    timeout = 5.0  # an idle connection is closed after this (the client must notice)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def setup(self) -> None:
        super().setup()
        self.server.open_connections.add(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.open_connections.discard(self.connection)

    def _serve(self, method: str) -> None:
        length = self.headers.get("Content-Length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            self._send(Answer(413, {"error": "the body is too large"}))
            self.close_connection = True
            return
        body = self.rfile.read(int(length)) if length else b""
        answer = self.server.helpdesk.handle(method, self.path, self.headers, body)
        self.server.helpdesk.wait_answer(answer)
        if answer.drop:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(answer, method != "HEAD")

    def _send(self, answer: Answer, with_body: bool = True) -> None:
        data = json.dumps(answer.body).encode("utf-8")
        try:
            self.send_response(answer.status)
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if with_body:
                self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client is gone (killed during a slow answer): the issue stays created

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve("HEAD")


class HelpdeskServer:
    """Serve a :class:`Helpdesk` on ``host:port`` (0: any free port) in a thread; ``tls=(cert, key)`` for https.

    A context manager; :meth:`stop` also closes every open connection, so a
    pooled client connection sees the server gone.
    """

    def __init__(self, helpdesk: Helpdesk, host: str = "127.0.0.1", port: int = 0,
                 tls: Optional[Tuple[str, str]] = None) -> None:
        self.helpdesk = helpdesk
        self.server = _Server((host, port), _Handler)
        self.server.helpdesk = helpdesk
        self.server.open_connections = set()
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="helpdesk", daemon=True)
        self._thread.start()

    def __enter__(self) -> "HelpdeskServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self.helpdesk.release()
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self.server.open_connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)


class _Controls:
    """What the conformance kit may ask of the helpdesk behind an adapter (see :mod:`runner.proof.conformance`)."""

    def __init__(self, desk: Helpdesk, served: HelpdeskServer, folder: str, pool: Any) -> None:
        self.desk, self.served, self.folder, self.pool = desk, served, folder, pool

    def lose_next_response(self) -> None:
        self.desk.schedule_next("dropped")

    def effect_count(self, key: str, payload: Dict[str, Any]) -> int:
        return self.desk.by_ref().get(key, 0)

    @staticmethod
    def make_payload(key: str, variant: int) -> Dict[str, Any]:
        return {"external_ref": key, "title": f"variant {variant}", "body": f"the body of variant {variant}"}

    def close(self) -> None:
        self.pool.clear()
        self.served.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def conformance_factory() -> Tuple[Any, _Controls]:
    """A fresh helpdesk (no faults of its own) and the HTTP adapter of a contract for it, looking issues up by key."""
    from ..adapters.http import ConnectionPool, HttpAdapter, http_spec

    folder = tempfile.mkdtemp(prefix="helpdesk-")
    token = "conformance-" + os.urandom(8).hex()
    with open(os.path.join(folder, "token"), "w") as handle:
        handle.write(token + "\n")
    desk = Helpdesk(token)
    served = HelpdeskServer(desk)
    headers = {"Authorization": "Bearer {file:token}"}
    spec = {"invoke": {"url": served.url + "/api/issues", "headers": headers},
            "observe": {"url": served.url + "/api/issues?external_ref={key}", "headers": headers, "pointer": "/0/id"}}
    pool = ConnectionPool()
    return HttpAdapter(http_spec(spec), workspace=folder, timeout=10, pool=pool), _Controls(desk, served, folder, pool)


def _schedule(text: str) -> Dict[int, str]:
    out = {}
    for part in filter(None, text.split(",")):
        number, _, fault = part.partition(":")
        if fault not in POST_FAULTS or not number.isdigit():
            raise argparse.ArgumentTypeError(f"{part!r}: write POST_NUMBER:FAULT with FAULT one of "
                                             f"{', '.join(POST_FAULTS)}")
        out[int(number)] = fault
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m runner.proof.helpdesk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--lag", type=float, default=0.0, help="seconds before a created issue is listed")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before every answer")
    parser.add_argument("--rate-limit", type=float, default=None, help="requests per second answered; 429 above")
    parser.add_argument("--p-rate-limited", type=float, default=0.0)
    parser.add_argument("--p-dropped", type=float, default=0.0)
    parser.add_argument("--schedule", type=_schedule, default={}, help="e.g. 3:dropped,5:rate-limited")
    parser.add_argument("--retry-after", choices=("seconds", "date"), default="seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    faults = Faults(args.lag, args.latency, args.rate_limit, args.p_rate_limited, args.p_dropped, args.schedule,
                    args.retry_after, 1, args.seed)
    try:
        desk = Helpdesk.from_token_file(args.token_file, faults)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"helpdesk: cannot read a token from {args.token_file}: "
                         f"{getattr(exc, 'strerror', None) or exc}\n")
        return 1
    try:
        served = HelpdeskServer(desk, args.host, args.port)
    except OSError as exc:
        sys.stderr.write(f"helpdesk: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}\n")
        return 1
    with served:
        print(f"listening {served.url}", flush=True)
        try:
            _until_parent_gone()
        except KeyboardInterrupt:
            pass
    return 0


def _until_parent_gone(every: float = 0.5) -> None:
    """Return once the process that started this one is gone: a helpdesk started in a shell's background ends with that
    shell."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(every)


if __name__ == "__main__":
    sys.exit(main())
