"""The ticket service's HTTP front: requests, answers and the faults that act on them; ``main``.
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import urllib.parse
from typing import Any, Callable, Dict, Optional, Sequence


from .ledger import LOOKUP_FAULTS, POST_FAULTS, BadRequest, Faults, TicketLedger, _Answer, _MAX_BODY
from .wire import BadRequestLine, Request, answer, read_request


# -- HTTP -----------------------------------------------------------------------------------

class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True  # a restarted service binds its old port at once
    ledger: TicketLedger
    quiet: bool = False


class _Handler(socketserver.StreamRequestHandler):
    """One connection, one request (:mod:`.wire`): read the head, route it, answer or drop, close."""

    server: _Server
    request_head: Request

    def handle(self) -> None:
        try:
            head = read_request(self.rfile)
        except BadRequestLine as exc:
            self._answer(400, {"error": "bad-request", "message": str(exc)})
            return
        if head is None:
            return
        self.request_head = head
        route = {"GET": self._get, "POST": self._post}.get(head.method)
        if route is None:
            self._answer(501, {"error": "unsupported-method", "method": head.method})
            return
        self._guard(route)

    def finish(self) -> None:
        # Half-close, then read what the client may still be sending (a body a refused request left unread):
        # closing a socket with unread data resets the connection, which can destroy the answer before it is read.
        super().finish()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1.0)
            for _ in range(16):
                if not self.connection.recv(65536):
                    break

    def _log(self, status: Any) -> None:
        if not self.server.quiet:
            head = getattr(self, "request_head", None)
            line = f"{head.method} {head.target} {head.version}" if head else "-"
            sys.stderr.write(f'{self.client_address[0]} "{line}" {status}\n')

    # -- plumbing ------------------------------------------------------------------
    def _body(self) -> Any:
        length = self.request_head.header("Content-Length")
        if length is None or not length.isdigit() or int(length) > _MAX_BODY:
            raise BadRequest("a JSON body with a Content-Length of at most 1 MiB is required")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
        except ValueError as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from None

    def _answer(self, status: int, body: Dict[str, Any]) -> None:
        self._log(status)
        try:
            answer(self.wfile, status, json.dumps(body, sort_keys=True).encode("utf-8"))
        except OSError:
            pass  # the client gave up (a delayed answer); nothing to undo: the ledger decided already

    def _drop(self) -> None:
        """Close the connection without a byte of answer: the client cannot know the outcome."""
        self._log("dropped")
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BadRequest as exc:
            self.server.ledger.count("bad_requests")
            self._answer(400, {"error": "bad-request", "message": str(exc)})
        except _Answer as exc:
            self._answer(exc.status, exc.body)
        except Exception as exc:  # an answer, not a dropped connection, for a bug in the service
            self._answer(500, {"error": "internal", "message": f"{type(exc).__name__}: {exc}"})

    # -- routes ---------------------------------------------------------------------
    def _get(self) -> None:
        ledger = self.server.ledger
        url = urllib.parse.urlsplit(self.request_head.target)
        path = url.path
        if path == "/stats":
            return self._answer(200, ledger.stats())
        if path == "/faults":
            return self._answer(200, ledger.faults.view())
        if path.startswith("/tickets/by-key/"):
            ledger.count("get_by_key")
            if ledger.faults.take(LOOKUP_FAULTS)["drop_lookups"]:
                ledger.count("dropped_lookups")
                return self._drop()
            key = urllib.parse.unquote(path[len("/tickets/by-key/"):])
            return self._answer(*ledger.by_key(key))
        if path == "/tickets":
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            if set(query) == {"marker"} and len(query["marker"]) == 1:
                ledger.count("get_by_marker")
                if ledger.faults.take(LOOKUP_FAULTS)["drop_lookups"]:
                    ledger.count("dropped_lookups")
                    return self._drop()
                return self._answer(200, {"tickets": ledger.search("marker", query["marker"][0])})
            if set(query) == {"key"} and len(query["key"]) == 1:
                ledger.count("get_by_key_diagnostic")
                return self._answer(200, {"tickets": ledger.search("idem_key", query["key"][0])})
            raise BadRequest("GET /tickets takes exactly one of ?marker=M or ?key=K")
        if path.startswith("/tickets/"):
            ledger.count("get_ticket")
            found = ledger.ticket(urllib.parse.unquote(path[len("/tickets/"):]))
            if found is None:
                return self._answer(404, {"error": "not-found"})
            return self._answer(200, found)
        self._answer(404, {"error": "no-such-route", "path": path})

    def _post(self) -> None:
        ledger = self.server.ledger
        path = urllib.parse.urlsplit(self.request_head.target).path
        if path == "/faults":
            ledger.faults.update(self._body())
            return self._answer(200, ledger.faults.view())
        if path != "/tickets":
            return self._answer(404, {"error": "no-such-route", "path": path})
        ledger.count("post_tickets")
        faults = ledger.faults.take(POST_FAULTS)
        body = self._body()
        if not isinstance(body, dict) or set(body) != {"payload"} or not isinstance(body["payload"], dict):
            raise BadRequest('the body must be {"payload": {...}}')
        key = self.request_head.header("Idempotency-Key")
        if key is not None and not (0 < len(key) <= 255 and key.isprintable()):
            raise BadRequest("Idempotency-Key must be 1 to 255 printable characters")
        epoch_text = self.request_head.header("X-Fencing-Epoch")
        epoch: Optional[int] = None
        if epoch_text is not None:
            if not epoch_text.strip().isdigit():
                raise BadRequest("X-Fencing-Epoch must be a whole number >= 0")
            epoch = int(epoch_text)
        scope = self.request_head.header("X-Run-Id") or ""
        if faults["unavailable"]:
            ledger.count("refused_unavailable")
            return self._answer(503, {"error": "unavailable", "applied": False})
        status, answer = ledger.create(key, epoch, scope, body["payload"], faults)
        if status in (200, 201):
            if faults["drop_after_commit"]:
                ledger.count("dropped")
                return self._drop()
            delay = faults["delay_response_seconds"]
            if delay > 0:
                ledger.count("delayed")
                # Wait outside the ledger's lock, and wake early when the service stops.
                ledger.stopping.wait(delay)
        self._answer(status, answer)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def serve(db_path: str, port_file: str, *, port: int = 0, idempotency: bool = True,
          retention_seconds: Optional[float] = None, faults: Optional[Dict[str, Any]] = None,
          quiet: bool = False) -> None:
    """Run the service until SIGTERM or SIGINT; the port is published only once it is listening."""
    ledger = TicketLedger(db_path, idempotency=idempotency, faults=Faults(faults, retention_seconds))
    server = _Server(("127.0.0.1", port), _Handler)
    server.ledger = ledger
    server.quiet = quiet

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    _end_with_parent(ledger)
    try:
        bound = server.server_address[1]
        tmp = f"{port_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write(f"{bound}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, port_file)  # a reader sees no file or the whole number
        sys.stdout.write(f"ready {bound}\n")
        sys.stdout.flush()
        server.serve_forever(poll_interval=0.2)
    finally:
        ledger.stopping.set()
        server.server_close()
        ledger.close()


def _end_with_parent(ledger: TicketLedger, every: float = 0.5) -> None:
    """Stop (as SIGTERM would) once the process that started the service is gone: a killed test leaves no server
    behind."""
    parent = os.getppid()

    def watch() -> None:
        while not ledger.stopping.wait(every):
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def parse_command_line(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The keyword arguments of :func:`serve` from a command line; exits 2 on a usage error."""
    parser = argparse.ArgumentParser(prog="python3 -m runner.proof.ticketservice",
                                     description="A ticket service with a SQLite ledger and fault switches.")
    parser.add_argument("--db", required=True, help="the SQLite ledger (created if missing)")
    parser.add_argument("--port-file", required=True, help="where to write the port once listening")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a random free one)")
    parser.add_argument("--no-idempotency", action="store_true",
                        help="ignore Idempotency-Key: every POST creates a ticket")
    parser.add_argument("--retention", type=float, default=None, metavar="SECONDS",
                        help="forget keys this long after registration")
    parser.add_argument("--drop-after-commit", type=int, default=0, metavar="N",
                        help="drop the answers of the next N POSTs after committing")
    parser.add_argument("--delay-response-seconds", type=float, default=0.0, metavar="S",
                        help="answer every POST S seconds after committing")
    parser.add_argument("--accept-stale-epoch", action="store_true",
                        help="do not refuse epochs below the high-water mark")
    parser.add_argument("--accept-conflicting-payload", action="store_true",
                        help="answer a known key with another payload with the original ticket")
    parser.add_argument("--faults", default=None, metavar="JSON", help="a POST /faults body applied at start-up")
    parser.add_argument("--quiet", action="store_true", help="no request log on stderr")
    args = parser.parse_args(argv)
    faults: Dict[str, Any] = {}
    if args.drop_after_commit:
        faults["drop_after_commit"] = args.drop_after_commit
    if args.delay_response_seconds:
        faults["delay_response_seconds"] = args.delay_response_seconds
    if args.accept_stale_epoch:
        faults["reject_stale_epoch"] = False
    if args.accept_conflicting_payload:
        faults["refuse_conflicting_payload"] = False
    if args.faults:
        try:
            extra = json.loads(args.faults)
        except ValueError as exc:
            parser.error(f"--faults is not valid JSON: {exc}")
        if not isinstance(extra, dict):
            parser.error("--faults must be a JSON object")
        faults.update(extra)
    if args.retention is not None and args.retention < 0:
        parser.error("--retention must be >= 0")
    try:
        Faults(faults)  # refuse a bad switch here, with a usage error, not after binding the port
    except BadRequest as exc:
        parser.error(str(exc))
    return {
        "db_path": args.db,
        "port_file": args.port_file,
        "port": args.port,
        "idempotency": not args.no_idempotency,
        "retention_seconds": args.retention,
        "faults": faults,
        "quiet": args.quiet,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    options = parse_command_line(argv)
    try:
        serve(**options)
    except KeyboardInterrupt:
        pass
    return 0
