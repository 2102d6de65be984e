"""A mail server on loopback, a subset of RFC 5321, that keeps each message it accepts in DIR as an ``.eml`` file.

    python3 -m tests.support.standins.smtpd --port 0 --state DIR [--auth USER:PASSWORD]
        [--tls-cert PEM --tls-key KEY [--ssl]] [--fault JSON]...

It prints ``smtp://HOST:PORT`` (``smtps://`` with ``--ssl``: TLS from the
first byte). Written on :mod:`socketserver`, since the standard library's
``smtpd`` module is gone in Python 3.12.

* Commands: EHLO, HELO, MAIL FROM, RCPT TO, DATA, RSET, NOOP, QUIT, VRFY
  (252), STARTTLS (with ``--tls-cert``, before TLS only) and AUTH PLAIN (with
  ``--auth``: MAIL is refused 530 until it succeeded; with TLS configured,
  offered only once the session is under TLS). A command out of order, 503;
  an unknown one, 500.
* A message accepted (250 after the final ``.``) is written to
  ``DIR/messages/NNNNNN.eml`` (atomically), as received, under a
  ``Return-Path``, an ``X-Envelope-To`` and a ``Received`` line whose protocol
  says TLS and authentication (``ESMTP``, ``ESMTPS``, ``ESMTPA``,
  ``ESMTPSA``, RFC 3848). :func:`message_ids` lists the Message-IDs received,
  in order, and :func:`count_by_message_id` counts them: the lookup a test
  makes where a person would search a mailbox.
* Faults, each at a stage (``on``): ``greeting``, ``ehlo``, ``auth``,
  ``mail``, ``rcpt``, ``data`` (the DATA command) or ``dot`` (after the
  final ``.``):

  - ``421`` (``mail`` by default): "try again later", and the connection closed;
  - ``451`` (``dot``): the message not delivered, "try again later";
  - ``550`` (``rcpt``): the recipient refused; ``554`` (``dot``): the message refused;
  - ``reply``: any ``code`` and ``text``, closing the connection with ``"close": true``;
  - ``drop-after-dot``: the message delivered, the connection closed with no answer;
  - ``stall-after-dot``: the message delivered, no answer for ``seconds`` (so a
    test can kill the sender while it waits);
  - ``drop`` and ``stall`` at another stage: no answer, nothing delivered;
  - ``slow``: the stage's usual answer, ``seconds`` late.

  A fault at ``dot`` other than those two delivers nothing. Faults come from
  ``--fault`` and from orders left in DIR (:func:`~tests.support.standins.common.post_faults`).
"""

import argparse
import base64
import email.parser
import email.policy
import os
import socket
import socketserver
import ssl
import threading
import time
from email.message import EmailMessage
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tests.support.standins.common import STALL_SECONDS, Faults, origin, parser, serve, tally

MESSAGES = "messages"
#: The longest command line read (RFC 5321 allows 512 octets; a little more is taken).
COMMAND_LIMIT = 2048
#: The longest line of a message read at once.
DATA_LINE_LIMIT = 1024 * 1024
#: The largest message accepted, in bytes (as EHLO's SIZE says).
MAX_SIZE = 10 * 1024 * 1024
MAX_RECIPIENTS = 100
#: Seconds an idle client is waited for.
IDLE_SECONDS = 60.0

#: Each fault's stage when it names none.
STAGES = {"421": "mail", "451": "dot", "550": "rcpt", "554": "dot", "reply": "mail", "drop-after-dot": "dot",
          "stall-after-dot": "dot", "drop": "mail", "stall": "mail", "slow": "data"}
#: The replies of the faults named by a code.
CODES = {"421": "421 4.3.2 Service not available, try again later",
         "451": "451 4.3.0 Error: local error in processing, message not delivered, try again later",
         "550": "550 5.1.1 Recipient address rejected: User unknown",
         "554": "554 5.7.1 Message refused"}


# -- what a test reads ----------------------------------------------------------------------------

def message_paths(folder: str) -> List[str]:
    """The ``.eml`` files the server keeping its state in ``folder`` wrote, in the order it accepted them."""
    where = os.path.join(folder, MESSAGES)
    if not os.path.isdir(where):
        return []
    return [os.path.join(where, name) for name in sorted(os.listdir(where)) if name.endswith(".eml")]


def read_messages(folder: str) -> List[EmailMessage]:
    """Every message accepted, parsed (headers and body), in order."""
    out = []
    for path in message_paths(folder):
        with open(path, "rb") as handle:
            parsed = email.parser.BytesParser(policy=email.policy.default).parse(handle)
            assert isinstance(parsed, EmailMessage)  # the default policy's message class
            out.append(parsed)
    return out


def message_ids(folder: str) -> List[str]:
    """The Message-ID of every message accepted, in order (``""`` for a message without one)."""
    found = []
    for path in message_paths(folder):
        with open(path, "rb") as handle:
            headers = email.parser.BytesHeaderParser(policy=email.policy.compat32).parse(handle)
        found.append(str(headers.get("Message-ID", "")).strip())
    return found


def count_by_message_id(folder: str) -> Dict[str, int]:
    """How many messages were accepted with each Message-ID."""
    return tally(message_ids(folder))["by"]


# -- the server ---------------------------------------------------------------------------------------

class MailServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], args: argparse.Namespace, faults: Faults) -> None:
        self.folder = args.state
        self.faults = faults
        self.stopping = threading.Event()
        self.credentials: Optional[Tuple[str, str]] = None
        if args.auth:
            user, _, password = args.auth.partition(":")
            self.credentials = (user, password)
        self.tls: Optional[ssl.SSLContext] = None
        if args.tls_cert:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.load_cert_chain(args.tls_cert, args.tls_key)
        self.implicit_tls = bool(args.ssl)
        self._lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Session)

    def store(self, data: bytes) -> str:
        """Write one accepted message as the next ``.eml`` (atomically); its queue id."""
        where = os.path.join(self.folder, MESSAGES)
        with self._lock:
            os.makedirs(where, exist_ok=True)
            taken = [int(n[:-4]) for n in os.listdir(where) if n.endswith(".eml") and n[:-4].isdigit()]
            number = max(taken, default=0) + 1
            path = os.path.join(where, f"{number:06d}.eml")
            temporary = os.path.join(where, f".{number:06d}.tmp")
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
            directory = os.open(where, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return f"{number:06d}"


class _Closed(Exception):
    """The session ends here (QUIT, a fault that closes, a client gone)."""


class _Session(socketserver.StreamRequestHandler):
    server: MailServer
    timeout = IDLE_SECONDS

    def setup(self) -> None:
        if self.server.implicit_tls and self.server.tls is not None:
            self.request.settimeout(self.timeout)
            self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        super().setup()
        self.helo: Optional[str] = None
        self.under_tls = bool(self.server.implicit_tls and self.server.tls is not None)
        self.user: Optional[str] = None
        self._transaction()

    def _transaction(self) -> None:
        self.sender: Optional[str] = None
        self.recipients: List[str] = []

    # -- answering -----------------------------------------------------------------------------------
    def say(self, *lines: str) -> None:
        """One reply; several lines are sent as a multi-line reply (``250-...``, then ``250 ...``)."""
        out = [line if i == len(lines) - 1 else line[:3] + "-" + line[4:] for i, line in enumerate(lines)]
        self.request.sendall("".join(f"{line}\r\n" for line in out).encode("utf-8"))

    def fault(self, stage: str) -> bool:
        """Answer the fault taken at ``stage``, if one is; True when it answered (the command is done with)."""
        fault = self.server.faults.take(stage)
        if fault is None:
            return False
        name = fault["fault"]
        if name == "slow":
            self.server.stopping.wait(float(fault.get("seconds", 1)))
            return False
        if name in ("drop", "drop-after-dot"):
            raise _Closed()
        if name in ("stall", "stall-after-dot"):
            self.server.stopping.wait(float(fault.get("seconds", STALL_SECONDS)))
            raise _Closed()
        if name == "reply":
            self.say(f"{int(fault.get('code', 451))} {fault.get('text', 'Scripted reply')}")
            closing = bool(fault.get("close", False))
        elif name in CODES:
            self.say(CODES[name])
            closing = name == "421"
        else:
            self.say(f"451 4.3.0 the stand-in knows no fault {name!r}")
            closing = False
        if closing:
            raise _Closed()
        return True

    # -- the session -----------------------------------------------------------------------------------
    def handle(self) -> None:
        try:
            if not self.fault("greeting"):
                self.say("220 standin.test ESMTP stand-in")
            while True:
                line = self.rfile.readline(COMMAND_LIMIT + 1)
                if not line:
                    return
                if len(line) > COMMAND_LIMIT:
                    self.say("500 5.5.0 Line too long")
                    continue
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                verb, _, argument = text.partition(" ")
                command = getattr(self, f"smtp_{verb.upper()}", None) if verb.isalpha() else None
                if command is None:
                    self.say("500 5.5.2 Error: command not recognized")
                    continue
                command(argument.strip())
        except (_Closed, OSError, ssl.SSLError):
            return

    def smtp_EHLO(self, argument: str) -> None:
        if not argument:
            self.say("501 5.5.4 Syntax: EHLO hostname")
            return
        if self.fault("ehlo"):
            return
        self.helo = argument
        self._transaction()
        lines = ["250 standin.test", f"250 SIZE {MAX_SIZE}", "250 8BITMIME"]
        if self.server.tls is not None and not self.under_tls:
            lines.append("250 STARTTLS")
        if self._auth_offered():
            lines.append("250 AUTH PLAIN")
        self.say(*lines, "250 HELP")

    def smtp_HELO(self, argument: str) -> None:
        if not argument:
            self.say("501 5.5.4 Syntax: HELO hostname")
            return
        if self.fault("ehlo"):
            return
        self.helo = argument
        self._transaction()
        self.say("250 standin.test")

    def _auth_offered(self) -> bool:
        return self.server.credentials is not None and (self.server.tls is None or self.under_tls)

    def smtp_STARTTLS(self, argument: str) -> None:
        if self.server.tls is None or self.under_tls:
            self.say("503 5.5.1 Error: TLS " + ("not available" if self.server.tls is None else "already active"))
            return
        self.say("220 2.0.0 Ready to start TLS")
        self.request = self.server.tls.wrap_socket(self.request, server_side=True)
        self.connection = self.request
        self.rfile = self.connection.makefile("rb", self.rbufsize)  # the client sent nothing more before the 220
        self.under_tls = True
        self.helo = None  # RFC 3207: the client starts over with EHLO
        self.user = None
        self._transaction()

    def smtp_AUTH(self, argument: str) -> None:
        mechanism, _, initial = argument.partition(" ")
        if not self._auth_offered() or self.helo is None:
            self.say("503 5.5.1 Error: authentication not enabled")
            return
        if self.user is not None:
            self.say("503 5.5.1 Error: already authenticated")
            return
        if mechanism.upper() != "PLAIN":
            self.say("504 5.5.4 Unrecognized authentication type")
            return
        if not initial:
            self.say("334 ")
            initial = self.rfile.readline(COMMAND_LIMIT).decode("ascii", "replace").strip()
        if initial == "*":
            self.say("501 5.7.0 Authentication aborted")
            return
        if self.fault("auth"):
            return
        try:
            _, user, password = base64.b64decode(initial, validate=True).decode("utf-8").split("\0")
        except (ValueError, UnicodeDecodeError):
            self.say("501 5.5.2 Cannot decode response")
            return
        if (user, password) != self.server.credentials:
            self.say("535 5.7.8 Error: authentication failed")
            return
        self.user = user
        self.say("235 2.7.0 Authentication successful")

    def smtp_MAIL(self, argument: str) -> None:
        if self.helo is None:
            self.say("503 5.5.1 Error: send HELO/EHLO first")
            return
        if self.server.credentials is not None and self.user is None:
            self.say("530 5.7.0 Authentication required")
            return
        if self.sender is not None:
            self.say("503 5.5.1 Error: nested MAIL command")
            return
        address = _path(argument, "FROM:")
        if address is None:
            self.say("501 5.5.4 Syntax: MAIL FROM:<address>")
            return
        if self.fault("mail"):
            return
        self.sender = address
        self.say("250 2.1.0 Ok")

    def smtp_RCPT(self, argument: str) -> None:
        if self.sender is None:
            self.say("503 5.5.1 Error: need MAIL command")
            return
        address = _path(argument, "TO:")
        if not address:
            self.say("501 5.5.4 Syntax: RCPT TO:<address>")
            return
        if len(self.recipients) >= MAX_RECIPIENTS:
            self.say("452 4.5.3 Error: too many recipients")
            return
        if self.fault("rcpt"):
            return
        self.recipients.append(address)
        self.say("250 2.1.5 Ok")

    def smtp_DATA(self, argument: str) -> None:
        if not self.recipients:
            self.say("503 5.5.1 Error: need RCPT command")
            return
        if self.fault("data"):
            return
        self.say("354 End data with <CR><LF>.<CR><LF>")
        lines: List[bytes] = []
        size, whole = 0, False
        while True:
            line = self.rfile.readline(DATA_LINE_LIMIT)
            if not line:
                raise _Closed()  # the client went before the final ".": nothing is delivered
            if line in (b".\r\n", b".\n"):
                whole = True
                break
            if line.startswith(b"."):
                line = line[1:]
            size += len(line)
            if size <= MAX_SIZE:
                lines.append(line)
        sender, recipients = self.sender, self.recipients
        self._transaction()
        if not whole or size > MAX_SIZE:
            self.say("552 5.3.4 Message size exceeds fixed limit")
            return
        fault = self.server.faults.take("dot")
        if fault is not None and fault["fault"] == "slow":
            self.server.stopping.wait(float(fault.get("seconds", 1)))
            fault = None
        if fault is not None and fault["fault"] not in ("drop-after-dot", "stall-after-dot"):
            self._refuse_after_dot(fault)
            return
        tls, auth = ("S" if self.under_tls else ""), ("A" if self.user else "")
        head = (f"Return-Path: <{sender}>\r\nX-Envelope-To: {', '.join(f'<{r}>' for r in recipients)}\r\n"
                f"Received: from {self.helo} ({self.client_address[0]}) by standin.test with ESMTP{tls}{auth};\r\n"
                f"\t{time.strftime('%a, %d %b %Y %H:%M:%S +0000', time.gmtime())}\r\n")
        queued = self.server.store(head.encode("utf-8") + b"".join(lines))
        if fault is not None:
            if fault["fault"] == "stall-after-dot":
                self.server.stopping.wait(float(fault.get("seconds", STALL_SECONDS)))
            raise _Closed()
        self.say(f"250 2.0.0 Ok: queued as {queued}")

    def _refuse_after_dot(self, fault: Dict[str, Any]) -> None:
        """Answer a fault taken after the final ``.`` that delivers nothing."""
        name = fault["fault"]
        if name in ("drop", "stall"):
            if name == "stall":
                self.server.stopping.wait(float(fault.get("seconds", STALL_SECONDS)))
            raise _Closed()
        if name == "reply":
            self.say(f"{int(fault.get('code', 451))} {fault.get('text', 'Scripted reply')}")
            if fault.get("close"):
                raise _Closed()
            return
        self.say(CODES.get(name, f"451 4.3.0 the stand-in knows no fault {name!r}"))
        if name == "421":
            raise _Closed()

    def smtp_RSET(self, argument: str) -> None:
        self._transaction()
        self.say("250 2.0.0 Ok")

    def smtp_NOOP(self, argument: str) -> None:
        self.say("250 2.0.0 Ok")

    def smtp_VRFY(self, argument: str) -> None:
        self.say("252 2.0.0 Cannot VRFY user, but will accept message and attempt delivery")

    def smtp_QUIT(self, argument: str) -> None:
        self.say("221 2.0.0 Bye")
        raise _Closed()


def _path(argument: str, prefix: str) -> Optional[str]:
    """The address of ``FROM:<a>`` or ``TO:<a>`` (parameters after it ignored); None when it is not one."""
    if not argument.upper().startswith(prefix):
        return None
    rest = argument[len(prefix):].strip()
    if not rest.startswith("<") or ">" not in rest:
        return None
    address = rest[1:rest.index(">")]
    return address if "\r" not in address and "\n" not in address else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse = parser("smtpd", "A mail server on loopback that keeps each message it accepts, for tests.")
    parse.add_argument("--auth", default=None, help="USER:PASSWORD: AUTH PLAIN required before MAIL")
    parse.add_argument("--tls-cert", default=None, help="a PEM certificate chain: STARTTLS offered")
    parse.add_argument("--tls-key", default=None, help="the certificate's key")
    parse.add_argument("--ssl", action="store_true", help="TLS from the first byte (with --tls-cert)")
    args = parse.parse_args(argv)
    if (args.ssl or args.tls_key) and not args.tls_cert:
        parse.error("--ssl and --tls-key need --tls-cert")

    def start(host: str, faults: Faults) -> Tuple[Any, str]:
        server = MailServer((host, args.port), args, faults)
        return server, origin(host, server.server_address[1], "smtps" if args.ssl else "smtp")

    return serve(args, start, default_on=STAGES)


if __name__ == "__main__":
    raise SystemExit(main())
