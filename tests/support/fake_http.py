"""Test-time HTTP parts: a server that answers from a script, a CONNECT proxy, and a test CA made with openssl.

The scripted server speaks HTTP/1.1 on raw sockets so that a test can make it
answer any status, close a kept-alive connection without saying so, answer one
byte at a time, or never answer. The proxy tunnels CONNECT and passes
absolute-form requests on, recording what it was asked. Nothing here is used
at run time.
"""

import os
import select
import shutil
import socket
import socketserver
import subprocess
import threading
import time
import urllib.parse
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple


class Reply(NamedTuple):
    """One scripted answer.

    ``close``: close the connection right after the answer without a
    ``Connection: close`` header (as a server that times idle connections out
    does); ``silent``: read the request and never answer; ``trickle``: seconds
    between the answer's bytes.
    """

    status: int = 200
    body: bytes = b"{}"
    headers: Tuple[Tuple[str, str], ...] = (("Content-Type", "application/json"),)
    close: bool = False
    silent: bool = False
    trickle: float = 0.0


class Seen(NamedTuple):
    method: str
    target: str
    headers: Dict[str, str]
    body: bytes
    connection: int


def _read_head(sock: socket.socket, buffered: bytearray) -> Optional[bytes]:
    while b"\r\n\r\n" not in buffered:
        data = sock.recv(65536)
        if not data:
            return None
        buffered += data
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    buffered[:] = rest
    return head


def _headers(lines: Sequence[bytes]) -> Dict[str, str]:
    out = {}
    for line in lines:
        name, _, value = line.decode("latin-1").partition(":")
        out[name.strip().lower()] = value.strip()
    return out


class ScriptedServer:
    """An HTTP/1.1 server on loopback whose answers are ``script`` (then ``default``), one per request, in order."""

    def __init__(self, script: Sequence[Reply] = (), default: Reply = Reply()) -> None:
        self.script = list(script)
        self.default = default
        self.seen: List[Seen] = []
        self.connections = 0
        # (bytes of the answer sent, bytes of the whole answer) for each answer whose client hung up before its end
        self.hung_up: List[Tuple[int, int]] = []
        self._lock = threading.Lock()
        self._hung_up = threading.Condition(self._lock)
        self._stop = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            number = self.connections
        sock.settimeout(20)
        buffered = bytearray()
        try:
            while not self._stop.is_set():
                head = _read_head(sock, buffered)
                if head is None:
                    return
                lines = head.split(b"\r\n")
                method, target, _ = lines[0].decode("latin-1").split(" ", 2)
                headers = _headers(lines[1:])
                length = int(headers.get("content-length", "0"))
                while len(buffered) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffered += data
                body, buffered[:] = bytes(buffered[:length]), buffered[length:]
                with self._lock:
                    self.seen.append(Seen(method, target, headers, body, number))
                    reply = self.script.pop(0) if self.script else self.default
                if reply.silent:
                    self._stay_silent(sock)
                    return
                data = f"HTTP/1.1 {reply.status} Scripted\r\n".encode()
                data += b"".join(f"{n}: {v}\r\n".encode() for n, v in reply.headers)
                data += f"Content-Length: {len(reply.body)}\r\n\r\n".encode() + reply.body
                if reply.trickle:
                    for i in range(len(data)):
                        try:
                            sock.sendall(data[i:i + 1])
                        except OSError:
                            self._note_hang_up(i, len(data))
                            return
                        if self._stop.wait(reply.trickle):
                            return
                else:
                    sock.sendall(data)
                if reply.close:
                    sock.shutdown(socket.SHUT_RDWR)
                    return
        except OSError:
            return
        finally:
            sock.close()

    def _stay_silent(self, sock: socket.socket) -> None:
        """Answer nothing for 30 seconds or until the client hangs up (noted) or the server stops."""
        end = time.monotonic() + 30
        while not self._stop.is_set() and time.monotonic() < end:
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._note_hang_up(0, 0)
                    return

    def _note_hang_up(self, sent: int, whole: int) -> None:
        with self._hung_up:
            self.hung_up.append((sent, whole))
            self._hung_up.notify_all()

    def wait_for_hang_up(self, timeout: float = 60.0) -> Tuple[int, int]:
        """The first answer a client hung up on: (bytes of it sent, bytes of the whole); waits for it at most
        ``timeout`` seconds.

        :raises AssertionError: no client hung up before then.
        """
        with self._hung_up:
            if not self._hung_up.wait_for(lambda: bool(self.hung_up), timeout):
                raise AssertionError(f"no client hung up on an answer within {timeout} s")
            return self.hung_up[0]

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "ScriptedServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    def one_way(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    other = threading.Thread(target=one_way, args=(b, a), daemon=True)
    other.start()
    one_way(a, b)
    other.join(5)


class ConnectProxy:
    """A forward proxy on loopback: CONNECT tunnels, absolute-form requests passed on; ``asked`` holds each first request line."""

    def __init__(self) -> None:
        self.asked: List[str] = []
        self.authorizations: List[Optional[str]] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buffered = bytearray()
        head = _read_head(sock, buffered)
        if head is None:
            return
        lines = head.split(b"\r\n")
        first = lines[0].decode("latin-1")
        self.asked.append(first)
        self.authorizations.append(_headers(lines[1:]).get("proxy-authorization"))
        method, target, _ = first.split(" ", 2)
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            try:
                upstream = socket.create_connection((host, int(port)), timeout=10)
            except OSError:
                sock.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            upstream.sendall(bytes(buffered))
        else:
            parts = urllib.parse.urlsplit(target)
            upstream = socket.create_connection((parts.hostname, parts.port or 80), timeout=10)
            upstream.sendall(head + b"\r\n\r\n" + bytes(buffered))
        upstream.settimeout(None)
        sock.settimeout(None)
        try:
            _pipe(sock, upstream)
        finally:
            upstream.close()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "ConnectProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def make_certificates(folder: str) -> Tuple[str, str, str]:
    """A test CA and a server certificate for 127.0.0.1 signed by it, made with openssl: ``(ca.pem, server.pem, server.key)``."""
    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args)}: {done.stderr.decode(errors='replace')}")

    with open(os.path.join(folder, "ca.cnf"), "w") as handle:
        handle.write("[req]\ndistinguished_name=dn\n[dn]\n[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
                     "subjectKeyIdentifier=hash\n[server]\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                     "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\nsubjectKeyIdentifier=hash\n"
                     "authorityKeyIdentifier=keyid,issuer\n")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=runner test CA",
            "-config", "ca.cnf", "-extensions", "ca")
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", "-config", "ca.cnf")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem",
            "-days", "2", "-extfile", "ca.cnf", "-extensions", "server")
    return os.path.join(folder, "ca.pem"), os.path.join(folder, "server.pem"), os.path.join(folder, "server.key")


def free_port() -> int:
    """A loopback port nothing listens on now (for a target that is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(condition: Any, timeout: float = 10.0, step: float = 0.01) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())
