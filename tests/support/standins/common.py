"""What the stand-ins share: their state in DIR, the faults a test scripts, an HTTP front and the program's start.

* **State survives.** A stand-in keeps what it received in one JSON document,
  ``DIR/state.json``, changed under one lock and written whole after each
  change (to a temporary file, flushed to disk, then renamed over the old
  one), so a reader, or the stand-in started again on DIR after a kill, sees
  the document before or after a change, never half of it.
* **Faults are a queue.** Each fault is a JSON object: ``fault`` (its name),
  ``on`` (the operation it applies to; by default the one the stand-in gives
  that fault, else ``any``), ``times`` (how
  many requests it answers, 1 by default) and the fault's own fields
  (``retry_after``, ``seconds``). A request takes the first fault that names
  its operation, so a test scripts a sequence. Faults come from ``--fault``
  flags at start (a JSON object or list, queued in order) or, while the
  stand-in runs, from ``POST /_faults`` (HTTP) or an order left in
  ``DIR/faults/`` (:func:`post_faults`, any stand-in).
* **HTTP faults** every HTTP stand-in knows, besides its own: answered
  before the operation (nothing done) ``429`` and ``503`` with
  ``Retry-After``, ``500``, ``reset-before`` (the connection reset, nothing
  done); answered after it (done) ``500-after``, ``502-after`` (a proxy's
  page), ``reset-after`` (done, the connection reset, no answer) and
  ``stall-after`` (done, no answer for ``seconds``, so a test can kill the
  caller while it waits).
* **A clock a test can hold.** An HTTP stand-in's time (what its lags and
  rate-limit windows are measured on) is the wall clock until ``POST
  /_faults`` says ``{"hold_clock": true}``; from then it stands still and
  moves only by ``{"advance": SECONDS}``, so a test of a lag or a window
  never races the wall clock. ``{"hold_clock": false}`` gives the wall clock
  back.
* **Loopback only.** A stand-in listens on a loopback address and refuses
  any other.
"""

import argparse
import ipaddress
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

#: The document a stand-in keeps in its DIR.
STATE_FILE = "state.json"
#: The largest request body an HTTP stand-in reads; a larger one is answered 413.
BODY_LIMIT = 1024 * 1024
#: Seconds a ``stall`` fault holds the connection when it names none.
STALL_SECONDS = 60.0

#: HTTP faults answered before the operation: name -> status (a Retry-After is sent with 429 and 503).
BEFORE = {"429": 429, "503": 503, "500": 500, "reset-before": 0}
#: HTTP faults answered after the operation was done.
AFTER = ("500-after", "502-after", "reset-after", "stall-after")

PROXY_PAGE = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>\n"


# -- state -----------------------------------------------------------------------------------------

def write_json(path: str, value: Any) -> None:
    """Write ``value`` to ``path`` whole or not at all: a temporary file beside it, flushed, then renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".state-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(value, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_state(folder: str) -> Dict[str, Any]:
    """The document a stand-in keeps in ``folder`` (empty when it has written none yet)."""
    try:
        with open(os.path.join(folder, STATE_FILE), encoding="utf-8") as handle:
            value = json.load(handle)
    except FileNotFoundError:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{folder}/{STATE_FILE} does not hold a JSON object")
    return value


class State:
    """The stand-in's document in DIR: read once at start, changed under one lock, written whole after each change."""

    def __init__(self, folder: str, initial: Mapping[str, Any]) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.path = os.path.join(folder, STATE_FILE)
        self._lock = threading.Lock()
        self.data: Dict[str, Any] = dict(initial)
        self.data.update(read_state(folder))

    def read(self, look: Callable[[Dict[str, Any]], Any]) -> Any:
        """What ``look`` returns of the document, under the lock (``look`` must not change it)."""
        with self._lock:
            return look(self.data)

    def change(self, edit: Callable[[Dict[str, Any]], Any]) -> Any:
        """Apply ``edit`` to the document and write it before the lock is let go; return what ``edit`` returned."""
        with self._lock:
            result = edit(self.data)
            write_json(self.path, self.data)
            return result


def first_line(text: Any) -> str:
    """The first line of ``text`` (a string), without its end; ``""`` for anything else."""
    return text.splitlines()[0] if isinstance(text, str) and text.splitlines() else ""


def tally(values: Sequence[str]) -> Dict[str, Any]:
    """``{"total", "by", "duplicates"}``: how often each value occurs, and those that occur more than once."""
    by: Dict[str, int] = {}
    for value in values:
        by[value] = by.get(value, 0) + 1
    return {"total": len(values), "by": by, "duplicates": {k: n for k, n in by.items() if n > 1}}


# -- faults ----------------------------------------------------------------------------------------

def checked_fault(value: Any) -> Dict[str, Any]:
    """A fault as the queue keeps it (``on`` and ``times`` filled in); raises ValueError naming what is wrong."""
    if not isinstance(value, dict) or not isinstance(value.get("fault"), str):
        raise ValueError(f"a fault is a JSON object with a 'fault' name, not {value!r:.100}")
    fault = dict(value)
    fault.setdefault("times", 1)
    if not isinstance(fault.get("on", "any"), str):
        raise ValueError(f"fault {fault['fault']!r}: 'on' names an operation, not {fault['on']!r}")
    if not isinstance(fault["times"], int) or isinstance(fault["times"], bool) or fault["times"] < 1:
        raise ValueError(f"fault {fault['fault']!r}: 'times' is a whole number of at least 1")
    for name in ("retry_after", "seconds"):
        value = fault.get(name, 0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"fault {fault['fault']!r}: {name!r} is a number of seconds")
    return fault


def fault_argument(text: str) -> List[Dict[str, Any]]:
    """The ``--fault`` flag: a JSON object or a list of them."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    try:
        return [checked_fault(v) for v in (value if isinstance(value, list) else [value])]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Faults:
    """The queue of scripted faults (see the module docstring); thread-safe.

    ``inbox``: a folder of orders (``{"faults": [...], "add": bool}`` in a JSON
    file each, see :func:`post_faults`) taken in name order before each
    :meth:`take`, for a stand-in with no control route of its own.
    """

    def __init__(self, faults: Sequence[Dict[str, Any]] = (), inbox: Optional[str] = None,
                 default_on: Optional[Mapping[str, str]] = None) -> None:
        self._lock = threading.Lock()
        self._queue: List[Dict[str, Any]] = [checked_fault(f) for f in faults]
        self.inbox = inbox
        self.default_on = dict(default_on or {})

    def replace(self, faults: Sequence[Any], add: bool = False) -> None:
        """Queue ``faults`` instead of those pending (after them with ``add``); raises ValueError, queueing none."""
        checked = [checked_fault(f) for f in faults]
        with self._lock:
            self._queue = (self._queue if add else []) + checked

    def take(self, operation: str) -> Optional[Dict[str, Any]]:
        """The first pending fault for ``operation`` (or ``any``), counted once; None when none applies."""
        with self._lock:
            self._read_inbox()
            for fault in self._queue:
                if fault.get("on", self.default_on.get(fault["fault"], "any")) in (operation, "any"):
                    fault["times"] -= 1
                    if fault["times"] == 0:
                        self._queue.remove(fault)
                    return dict(fault)
        return None

    def pending(self) -> List[Dict[str, Any]]:
        with self._lock:
            self._read_inbox()
            return [dict(f) for f in self._queue]

    def _read_inbox(self) -> None:
        if self.inbox is None or not os.path.isdir(self.inbox):
            return
        for name in sorted(n for n in os.listdir(self.inbox) if n.endswith(".json") and not n.startswith(".")):
            path = os.path.join(self.inbox, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    order = json.load(handle)
                checked = [checked_fault(f) for f in order.get("faults", [])]
            except (OSError, ValueError, AttributeError) as exc:
                print(f"{path}: not an order of faults ({exc})", file=sys.stderr, flush=True)
                checked, order = [], {"add": True}
            self._queue = (self._queue if order.get("add") else []) + checked
            os.unlink(path)


#: The folder in DIR where :func:`post_faults` leaves orders for a stand-in without a control route.
INBOX = "faults"


def post_faults(folder: str, faults: Sequence[Dict[str, Any]], add: bool = False) -> None:
    """Leave an order of faults for the stand-in keeping its state in ``folder``; it takes it before its next fault."""
    inbox = os.path.join(folder, INBOX)
    os.makedirs(inbox, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{threading.get_ident()}.json"
    write_json(os.path.join(inbox, name), {"faults": [checked_fault(f) for f in faults], "add": add})


# -- the HTTP front ----------------------------------------------------------------------------------

class Request(NamedTuple):
    """One HTTP request as a stand-in's service sees it: ``query`` maps each name to its last value."""

    method: str
    path: str
    query: Dict[str, str]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON; raises ValueError."""
        return json.loads(self.body.decode("utf-8"))


class Response(NamedTuple):
    status: int
    body: bytes = b""
    headers: Tuple[Tuple[str, str], ...] = ()


def json_response(status: int, value: Any, headers: Sequence[Tuple[str, str]] = ()) -> Response:
    body = json.dumps(value, sort_keys=True).encode("utf-8")
    return Response(status, body, (("Content-Type", "application/json; charset=utf-8"),) + tuple(headers))


def text_response(status: int, text: str, headers: Sequence[Tuple[str, str]] = ()) -> Response:
    return Response(status, text.encode("utf-8"), (("Content-Type", "text/plain; charset=utf-8"),) + tuple(headers))


class Service:
    """What an HTTP stand-in does; :class:`HttpFront` asks it, in this order, for each request but the control ones.

    ``gate`` may answer first (a missing token, a spent rate limit: nothing
    done, no fault taken); ``operation`` names what the request does (the
    name faults are matched on; None: no fault applies); ``fault`` answers a
    fault of the service's own (None: not one of its own); ``perform`` does it;
    ``decorate`` adds headers to every answer. ``count`` is ``GET /_count``;
    ``control`` takes the settings ``POST /_faults`` carries besides faults
    and the clock's. ``now`` is the service's time: every lag and window is
    measured on it, never on :func:`time.time` directly.
    """

    @property
    def clock(self) -> "Clock":
        """The service's clock, made on first use (a service's ``__init__`` may read the time)."""
        made = self.__dict__.get("_clock")
        if made is None:
            made = self.__dict__["_clock"] = Clock()
        return made

    def now(self) -> float:
        """The service's time in epoch seconds (the wall clock's unless a test holds the clock)."""
        return self.clock.now()

    def url(self, base: str) -> str:
        return base

    def gate(self, request: Request) -> Optional[Response]:
        return None

    def operation(self, request: Request) -> Optional[str]:
        return None

    def fault(self, fault: Dict[str, Any], request: Request) -> Optional[Response]:
        return None

    def perform(self, request: Request) -> Response:
        return json_response(404, {"message": "Not Found"})

    def decorate(self, response: Response) -> Response:
        return response

    def count(self) -> Dict[str, Any]:
        return {}

    def control(self, settings: Dict[str, Any]) -> Dict[str, Any]:
        """Apply the settings a test sent; return the current ones. Raises ValueError for one it does not know."""
        if settings:
            raise ValueError(f"unknown settings: {sorted(settings)}")
        return {}


class Clock:
    """A stand-in's time: the wall clock's, or, while held, a time that moves only when a test advances it.

    Held, ``now`` is the same on every call until ``advance``; a test then
    knows exactly which side of a lag or a window each request falls on,
    however slowly the machine runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Optional[float] = None

    def now(self) -> float:
        with self._lock:
            return time.time() if self._held is None else self._held

    def control(self, settings: Dict[str, Any]) -> Dict[str, Any]:
        """Apply ``hold_clock`` (true: stop at the present time; false: the wall clock) then ``advance`` (seconds).

        :returns: the settings left for the service.
        :raises ValueError: a setting of the wrong type, or ``advance`` on a clock not held.
        """
        settings = dict(settings)
        with self._lock:
            if "hold_clock" in settings:
                hold = settings.pop("hold_clock")
                if not isinstance(hold, bool):
                    raise ValueError("'hold_clock' is true or false")
                if not hold:
                    self._held = None
                elif self._held is None:
                    self._held = time.time()
            if "advance" in settings:
                seconds = settings.pop("advance")
                if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
                    raise ValueError("'advance' is a number of seconds")
                if self._held is None:
                    raise ValueError("'advance' moves a held clock; send \"hold_clock\": true first")
                self._held += float(seconds)
        return settings

    def shown(self) -> Dict[str, Any]:
        """The clock as ``/_faults`` shows it: whether it is held and its time."""
        with self._lock:
            return {"clock_held": self._held is not None, "clock": time.time() if self._held is None else self._held}


class HttpFront(ThreadingHTTPServer):
    """An HTTP/1.1 server on loopback that answers for ``service``, with the scripted ``faults`` and control routes.

    ``GET /_count``: the service's counts. ``GET /_faults``: the faults pending
    and the settings. ``POST /_faults`` with ``{"faults": [...]}`` (instead of
    those pending), ``{"add": [...]}`` (after them) and any settings the
    service knows. ``GET /_requests``: requests seen per operation and status.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], service: Service, faults: Faults) -> None:
        self.service = service
        service.clock.now()  # made here, before any request thread can race to make it
        self.faults = faults
        self.stopping = threading.Event()
        self._seen_lock = threading.Lock()
        self.seen: Dict[str, Dict[str, int]] = {}
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _Handler)

    def note(self, operation: Optional[str], status: int) -> None:
        with self._seen_lock:
            counts = self.seen.setdefault(operation or "-", {})
            counts[str(status)] = counts.get(str(status), 0) + 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HttpFront

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a test reads counts, not a log

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def _serve(self) -> None:
        length = self.headers.get("Content-Length")
        try:
            size = int(length) if length else 0
        except ValueError:
            size = -1
        if size < 0 or size > BODY_LIMIT or self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            said = {"message": "a body needs a Content-Length of at most 1 MiB"}
            self._send(json_response(413 if size > BODY_LIMIT else 400, said))
            return
        body = self.rfile.read(size) if size else b""
        split = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(split.query, keep_blank_values=True))
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = Request(self.command, split.path, query, headers, body)
        if split.path.startswith("/_"):
            self._send(self._control(request))
            return
        service, front = self.server.service, self.server
        gated = service.gate(request)
        if gated is not None:
            front.note(service.operation(request), gated.status)
            self._send(service.decorate(gated))
            return
        operation = service.operation(request)
        fault = front.faults.take(operation) if operation else None
        if fault is not None and fault["fault"] not in AFTER:
            answer = service.fault(fault, request)
            if answer is None:
                answer = self._before(fault)
            front.note(operation, answer.status if answer else 0)
            if answer is None:
                self._reset()
            else:
                self._send(service.decorate(answer))
            return
        response = service.perform(request)
        if fault is None:
            front.note(operation, response.status)
            self._send(service.decorate(response))
            return
        name = fault["fault"]
        front.note(operation, {"500-after": 500, "502-after": 502}.get(name, 0))
        if name == "500-after":
            self._send(service.decorate(json_response(500, {"message": "Server Error"})))
        elif name == "502-after":
            self._send(Response(502, PROXY_PAGE, (("Content-Type", "text/html"),)))  # the proxy's: no service headers
        elif name == "reset-after":
            self._reset()
        else:
            front.stopping.wait(float(fault.get("seconds", STALL_SECONDS)))
            self.close_connection = True

    def _before(self, fault: Dict[str, Any]) -> Optional[Response]:
        """The generic answer of a fault taken before the operation; None: reset the connection."""
        name = fault["fault"]
        if name not in BEFORE:
            return json_response(500, {"message": f"the stand-in knows no fault {name!r}"})
        status = BEFORE[name]
        if not status:
            return None
        headers = (("Retry-After", _seconds(fault.get("retry_after", 1))),) if status in (429, 503) else ()
        said = {429: "Too Many Requests", 503: "Service Unavailable"}.get(status, "Server Error")
        return json_response(status, {"message": said}, headers)

    def _control(self, request: Request) -> Response:
        front = self.server
        if request.path == "/_count" and request.method == "GET":
            return json_response(200, front.service.count())
        if request.path == "/_requests" and request.method == "GET":
            with front._seen_lock:
                return json_response(200, {k: dict(v) for k, v in front.seen.items()})
        if request.path == "/_faults" and request.method in ("GET", "POST"):
            try:
                body = request.json() if request.method == "POST" and request.body else {}
                if not isinstance(body, dict):
                    raise ValueError("the body is a JSON object")
                if "faults" in body:
                    front.faults.replace(_listed(body.pop("faults")))
                if "add" in body:
                    front.faults.replace(_listed(body.pop("add")), add=True)
                # The clock first: a setting the service applies at once (a new rate window) starts on the held time.
                settings = front.service.control(front.service.clock.control(body))
            except ValueError as exc:
                return json_response(400, {"message": str(exc)})
            return json_response(200, dict(settings, faults=front.faults.pending(), **front.service.clock.shown()))
        return json_response(404, {"message": f"no control route {request.method} {request.path}"})

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        for name, value in response.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def _reset(self) -> None:
        """Close the connection with a reset (RST), no answer: what a crashed service or a cut network looks like."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass


def _listed(value: Any) -> List[Any]:
    if not isinstance(value, list):
        raise ValueError("faults are a JSON list")
    return value


def _seconds(value: Any) -> str:
    return str(int(value)) if float(value) == int(value) else str(value)


# -- the program --------------------------------------------------------------------------------------

def loopback(host: str) -> str:
    """``host`` when it is a loopback address (or ``localhost``); raises ValueError for any other."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"a stand-in listens on loopback only, not on {host!r}")


def origin(host: str, port: int, scheme: str) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The flags every stand-in takes: ``--port``, ``--host``, ``--state``, ``--fault`` and ``--exit-with-parent``."""
    parse = argparse.ArgumentParser(prog=f"python3 -m tests.support.standins.{prog}", description=description)
    parse.add_argument("--port", type=int, default=0, help="the port to listen on (0: any free one)")
    parse.add_argument("--host", default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    parse.add_argument("--state", required=True, help="the folder that keeps what the stand-in received")
    parse.add_argument("--fault", action="append", default=[], type=fault_argument,
                       help="a fault (a JSON object) or a list of them, queued in order; may be repeated")
    parse.add_argument("--exit-with-parent", action="store_true",
                       help="stop when the process that started this one is gone (a test killed mid-run)")
    return parse


def serve(args: argparse.Namespace, start: Callable[[str, Faults], Tuple[Any, str]],
          default_on: Optional[Mapping[str, str]] = None) -> int:
    """Start the server ``start(host, faults)`` makes, print its URL on the first line, serve until SIGTERM or SIGINT.

    ``start`` returns the server (a :class:`socketserver.BaseServer`) and the URL to print; ``default_on``: the
    operation each fault applies to when it names none.
    """
    parent = os.getppid()  # now: the process that started this one may be gone by the time the URL is printed
    try:
        host = loopback(args.host)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    os.makedirs(args.state, exist_ok=True)
    faults = Faults([f for group in args.fault for f in group], inbox=os.path.join(args.state, INBOX),
                    default_on=default_on)
    server, url = start(host, faults)

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    if args.exit_with_parent:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    print(url, flush=True)
    try:
        server.serve_forever(poll_interval=0.05)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        stopping = getattr(server, "stopping", None)
        if stopping is not None:
            stopping.set()
        server.server_close()
    return 0


def _watch_parent(parent: int) -> None:
    """SIGTERM this process once its parent is gone (it was given another), so that no stand-in outlives its test."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


def serve_http(args: argparse.Namespace, service: Service) -> int:
    """:func:`serve` for an HTTP stand-in: its URL is the service's, from ``http://HOST:PORT``."""

    def start(host: str, faults: Faults) -> Tuple[Any, str]:
        front = HttpFront((host, args.port), service, faults)
        return front, service.url(origin(host, front.server_address[1], "http"))

    return serve(args, start)
