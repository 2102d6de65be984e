"""The ticket service's wire: HTTP/1.0, one request per connection, JSON bodies.

Both sides of it: :func:`exchange` for the clients (the adapters and the
parent's :class:`~runner.proof.ticketservice.process.TicketServiceProcess`),
:func:`read_request` and :func:`answer` for the server. The service needs
this small part of HTTP only, and the standard library's HTTP modules
(``http.client``, ``http.server``, ``urllib.request``) build on its e-mail
parser: importing them costs a process more than all the rest of what a
demo worker imports, and the demo, the pool and the tests start hundreds of
processes that talk to the service. Any HTTP/1.x client (the runner's
``effects.http`` adapter, curl) talks to the server as to any HTTP/1.0 server:
each answer carries a ``Content-Length`` and closes the connection.
"""

import io
import socket
from typing import Dict, NamedTuple, Optional, Tuple

__all__ = ["NotSent", "Lost", "BadRequestLine", "Request", "exchange", "read_request", "answer"]

#: The longest request line or header line, and the most header lines, a request may have.
MAX_LINE = 65536
MAX_HEADERS = 100

_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found", 409: "Conflict",
            412: "Precondition Failed",
            413: "Content Too Large", 429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
            503: "Service Unavailable"}


class NotSent(Exception):
    """The request certainly did not reach the service (connection refused)."""


class Lost(Exception):
    """The request may have reached the service; no whole answer came back."""


class BadRequestLine(Exception):
    """What arrived is not an HTTP/1.x request head."""


class Request(NamedTuple):
    """A request head: ``headers`` keyed by lower-case name (the first of a repeated name is kept)."""

    method: str
    target: str
    version: str
    headers: Dict[str, str]

    def header(self, name: str) -> Optional[str]:
        return self.headers.get(name.lower())


# -- the client side ----------------------------------------------------------------------------

def exchange(host: str, port: int, method: str, target: str, *, headers: Optional[Dict[str, str]] = None,
             body: Optional[bytes] = None, timeout: float = 5.0) -> Tuple[int, bytes]:
    """Send one request and read its whole answer: ``(status, body)``.

    ``timeout`` bounds each wait for the connection, a send or a read.

    :raises NotSent: the connection was refused, so nothing was sent.
    :raises Lost: anything else that leaves no whole answer (a timeout, a reset, an answer cut short or
        unreadable): the service may have acted on the request.
    """
    lines = [f"{method} {target} HTTP/1.0", f"Host: {host}:{port}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        raise NotSent(f"connection refused by {host}:{port}") from None
    except OSError as exc:
        raise Lost(f"{type(exc).__name__}: {exc}") from None
    with sock:
        try:
            sock.sendall(head + (body or b""))
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:  # a timeout, a reset
            raise Lost(f"{type(exc).__name__}: {exc}") from None
    return _parse_answer(b"".join(chunks))


def _parse_answer(data: bytes) -> Tuple[int, bytes]:
    head, blank, rest = data.partition(b"\r\n\r\n")
    if not blank:
        raise Lost("the connection closed before a whole answer head" if data
                   else "the connection closed without an answer")
    status_line, _, header_lines = head.partition(b"\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise Lost(f"not an HTTP answer: {status_line[:80]!r}")
    length: Optional[int] = None
    for line in header_lines.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
    if length is not None:
        if len(rest) < length:
            raise Lost(f"the answer was cut short: {len(rest)} of {length} bytes")
        rest = rest[:length]
    return int(parts[1]), rest


# -- the server side ----------------------------------------------------------------------------

def read_request(rfile: io.BufferedIOBase) -> Optional[Request]:
    """The head of the request on ``rfile`` (a binary file of the connection); None when it closed first.

    :raises BadRequestLine: a line too long, too many header lines, or a malformed request or header line.
    """
    line = rfile.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE:
        raise BadRequestLine("the request line is too long")
    words = line.decode("latin-1").rstrip("\r\n").split()
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        raise BadRequestLine(f"not an HTTP/1.x request line: {line[:80]!r}")
    headers: Dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        raw = rfile.readline(MAX_LINE + 1)
        if len(raw) > MAX_LINE:
            raise BadRequestLine("a header line is too long")
        text = raw.decode("latin-1").rstrip("\r\n")
        if not text:
            return Request(words[0], words[1], words[2], headers)
        name, colon, value = text.partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequestLine(f"a malformed header line: {text[:80]!r}")
        headers.setdefault(name.lower(), value.strip())
    raise BadRequestLine(f"more than {MAX_HEADERS} header lines")


def answer(wfile: io.BufferedIOBase, status: int, body: bytes, *, server: str = "TicketService/1") -> None:
    """Write a whole JSON answer to ``wfile``; the connection is then closed by its handler."""
    head = (f"HTTP/1.0 {status} {_REASONS.get(status, 'Status')}\r\nServer: {server}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    wfile.write(head.encode("latin-1") + body)
