"""An SMTP target: one e-mail message per effect, sent with the standard library's smtplib; it cannot be read back.

The section of a contract that declares it (:func:`runner.contract.smtp.smtp_problems` checks it, and
:class:`runner.contract.spec.SmtpSpec` is what it is read into)::

    "smtp": {
      "host": "smtp.example.org", "port": 587, "security": "starttls",
      "username": "releases@example.org", "password": "{env:SMTP_PASSWORD}",
      "from": "Releases <releases@example.org>", "to": ["team@example.org"],
      "message_id": "<{key_text}.{digest}@mail.example.org>"
    }

``security`` is ``starttls`` (the default; port 587), ``ssl`` (TLS from the
first byte; port 465) or ``none`` (port 25; with a password only to a
loopback host). ``from``, ``to``, ``cc``, ``bcc``, ``reply_to``,
``username``, ``host`` and ``helo`` may hold the item's placeholders;
``password`` (and ``username``) may be ``{env:NAME}`` or ``{file:PATH}``,
read at each call and never recorded. ``ca_file`` (relative to the
workspace) trusts a private CA; ``not_now_seconds`` (60) is the wait after a
4xx. Each effect's payload is its message: ``subject`` and ``text``
(required), ``html`` (an alternative part), ``to``, ``cc`` and ``bcc``
(instead of the section's), ``reply_to`` and ``headers`` (more header
fields). The recipients take the message whole or not at all: one refused
recipient and nothing is sent.

**The Message-ID is made from the key.** By default
``<KEY_TEXT.DIGEST@runner>``: KEY_TEXT is the key spelled as a Message-ID
allows (``:`` and ``@`` become ``-``), so a person or an IMAP search for the
key finds the message; DIGEST is 16 hex digits of the SHA-256 of the run's id
and the key, so two runs that use one key for different messages never share
a Message-ID (a mail system may drop a message whose Message-ID it holds
already, and the second run's message would be lost with a receipt). The
same key in the same run always makes the same Message-ID, in any process.
``message_id`` may give another template (a domain of one's own, say); it
must hold ``{digest}`` or ``{key_text}``. The key also travels as the
``X-Runner-Key`` header.

What the answers mean (:mod:`runner.calls.target`):

* 250 after the final ``.``: the receipt, ``{"message_id", "reply",
  "server", "from", "recipients"}``.
* A 4xx reply at any step: nothing delivered, "not now"
  (:class:`~runner.calls.target.NotApplied` after ``not_now_seconds``). The
  credentials' 5xx (530, 534, 535, 538) likewise, after the contract's
  backoff, as HTTP's 401: the message was not refused, the login was.
* Any other 5xx: refused for good (:class:`~runner.calls.target.Rejected`), with
  the server's words; a payload that is no message, the same, before any
  connection.
* No connection, a failed TLS handshake, a server without STARTTLS when it
  is asked for, a connection lost before the message's end was handed to the
  network: nothing delivered (a server delivers no message whose final
  ``.`` it did not receive), "not now".
* A connection lost, or no answer within the call's time, once the whole
  message was written, or a reply to it that is neither 2xx nor a refusal
  (4xx, 5xx): the outcome is unknown
  (:class:`~runner.calls.target.UnknownOutcome`). Once the final ``.`` may
  have left, nothing is ever called "not sent".

**It cannot be read back**: :meth:`SmtpAdapter.observe` answers ``unknown``,
with the Message-ID to look for, so the runner never sends a message again on
its own; only a person (or a lookup of the recipients' mailboxes) can say.

**Nothing is sent past the call's deadline.** Before connecting and again
right before the message is written, the registered call's deadline
(:mod:`runner.calls.inflight`) and the call's own time are checked; past either,
the message is not written (the DATA command is abandoned with the
connection) and the call raises NotApplied. A watchdog closes the connection
at the deadline, so a server that answers slowly cannot stretch the call.
"""

import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

from ..base.canonical import sha256_hex
from ..base.errors import InvalidInput
from ..calls import inflight
from ..calls.target import NotApplied, Observation, Rejected, UnknownOutcome
from ..contract.http import SECRET
from ..contract.smtp import (DEFAULT_MESSAGE_ID, MESSAGE_ID, NOT_NOW_SECONDS, address_problem, addresses, listed,
                             smtp_problems, strings)
from ..contract.spec import SmtpSpec, read_smtp
from ..contract.templates import expand
from .http_secrets import read_secret, scrub, scrub_text

# smtplib, ssl and email are imported where a call needs them: they would add tens of milliseconds to a start.
if TYPE_CHECKING:
    import smtplib
    import ssl

__all__ = ["SmtpAdapter", "smtp_problems", "DEFAULT_MESSAGE_ID", "NOT_NOW_SECONDS", "key_text"]

#: Replies that refuse the login, not the message: called again after the backoff.
CREDENTIALS = (530, 534, 535, 538)
#: The most recipients one message has (to, cc and bcc together).
MAX_RECIPIENTS = 100
#: The longest reply text kept in a receipt or a reason.
REPLY_CHARS = 500

_PAYLOAD = ("subject", "text", "html", "to", "cc", "bcc", "reply_to", "headers")
#: Header fields the adapter writes itself: a payload's ``headers`` may not name them.
_OWN_HEADERS = frozenset(("from", "to", "cc", "bcc", "reply-to", "subject", "message-id", "date", "mime-version",
                          "content-type", "content-transfer-encoding", "x-runner-key", "sender", "return-path",
                          "received"))
_HEADER_NAME = re.compile(r"[!-9;-~]+\Z")


def key_text(key: str) -> str:
    """``key`` spelled as the left part of a Message-ID allows: ``:`` and ``@`` become ``-``, no dot ends or doubles."""
    text = re.sub(r"[^A-Za-z0-9._+=-]", "-", key)
    return re.sub(r"\.(?=\.|\Z)", "-", text)


class _Message(NamedTuple):
    content: bytes
    sender: str
    recipients: List[str]


class _NotSent(Exception):
    """Nothing was delivered: the message's end was never handed to the network."""


class _Lost(Exception):
    """The whole message was written and no answer came back: delivered or not, nobody here can tell."""


class _Watchdog:
    """Shuts the session's socket down at the call's deadline, so that no reply can hold the call past it."""

    def __init__(self, smtp: "smtplib.SMTP", end: float) -> None:
        self.smtp = smtp
        self.fired = False
        self._timer = threading.Timer(max(0.0, end - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        import socket

        self.fired = True
        sock = getattr(self.smtp, "sock", None)  # read now: STARTTLS replaces the socket
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()


class SmtpAdapter:
    """The contract's ``effects.smtp`` as a :class:`runner.calls.target.Adapter` (see the module docstring).

    :param spec: the section (checked by :func:`smtp_problems`).
    :param values: the item's placeholders and ``run_id`` (which the Message-ID's digest holds).
    :param workspace: the folder ``{file:PATH}`` and ``ca_file`` are relative to.
    :param timeout: seconds one call may take, from connecting to the last reply.
    :param environ: where ``{env:NAME}`` is read (default ``os.environ``).
    :raises InvalidInput: the section is invalid, or a secret cannot be read now (the message names the field, never
        the value).
    """

    name = "smtp"
    #: A mail server cannot be read back: the lifecycle never looks it up (its receipt is the only evidence).
    readable = False
    retention_seconds: Optional[float] = None
    deduplicates = False
    conflicting_payload = ("not the target's to decide: the ledger binds a key to one payload, and the runner refuses "
                           "another before any call")
    key_scope = "none at the server: the key travels in the message, as its Message-ID and its X-Runner-Key header"

    def __init__(self, spec: Union[SmtpSpec, Dict[str, Any]], *, values: Optional[Mapping[str, Any]] = None,
                 workspace: str = ".", timeout: float = 60.0, environ: Optional[Mapping[str, str]] = None) -> None:
        if not isinstance(spec, SmtpSpec):
            problems = smtp_problems(spec)
            if problems:
                raise InvalidInput(f"effects.smtp.{problems[0]}")
            spec = read_smtp({k: v for k, v in spec.items()})
        self.spec = spec
        self.values = dict(values or {})
        self.workspace = os.path.abspath(workspace)
        self.timeout = float(timeout)
        self.environ = os.environ if environ is None else environ

        def filled(value: Optional[str]) -> Optional[str]:
            return None if value is None else expand([value], self.values)[0]

        self.security: str = spec.security
        self.host = filled(spec.host) or ""
        self.port = spec.port
        self.sender = filled(spec.sender) or ""
        self.to = expand(list(spec.to), self.values)
        self.cc = expand(list(spec.cc), self.values)
        self.bcc = expand(list(spec.bcc), self.values)
        self.reply_to = filled(spec.reply_to)
        self.helo = filled(spec.helo) or "localhost"
        self.username: Optional[str] = spec.username
        self.password: Optional[str] = spec.password
        self.ca_file = os.path.join(self.workspace, spec.ca_file) if spec.ca_file else None
        self.template: str = spec.message_id
        self.not_now = spec.not_now_seconds
        self.verification = ("none: a mail server cannot be read back; a person or an IMAP search of the recipients' "
                             "mailboxes finds the message by its Message-ID")
        if self.username is not None:
            try:
                self._credentials([])
            except ValueError as exc:
                raise InvalidInput(f"effects.smtp.password: {exc}") from None

    # -- what names the message -------------------------------------------------------------------
    def message_id(self, key: str) -> str:
        """The Message-ID of ``key``'s message: the same for the same key and run, in any process.

        :raises Rejected: the template makes no valid Message-ID of this key (one of the item's placeholders did not).
        """
        digest = sha256_hex(f"{self.values.get('run_id', '')}\n{key}".encode("utf-8"))[:16]
        made = expand([self.template], dict(self.values, key_text=key_text(key), digest=digest))[0]
        if not MESSAGE_ID.match(made):
            raise Rejected(f"the message_id template makes {made[:200]!r} of this key, which is no Message-ID")
        return made

    # -- the two calls -------------------------------------------------------------------------------
    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Send ``key``'s message once; the server's replies say what happened (see the module docstring)."""
        message_id = self.message_id(key)
        message = self._message(key, payload, message_id)
        secrets: List[str] = []
        try:
            credentials = self._credentials(secrets)
        except ValueError as exc:
            raise NotApplied(f"effects.smtp.password: {exc}; nothing was sent") from None
        try:
            reply = self._send(message, credentials, self._end())
        except _NotSent as exc:
            raise NotApplied(scrub_text(str(exc), secrets)[:2000]) from None
        except _Lost as exc:
            raise UnknownOutcome(scrub_text(str(exc), secrets)[:2000]) from None
        return scrub({"message_id": message_id, "reply": reply[:REPLY_CHARS], "server": f"{self.host}:{self.port}",
                       "from": message.sender, "recipients": message.recipients}, secrets)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """The target cannot be read back: ``unknown``, always, naming the Message-ID a person would look for."""
        try:
            message_id = self.message_id(key)
        except Rejected as exc:
            message_id = f"none: {exc}"
        return Observation("unknown", {
            "source": "smtp", "observe": "none", "message_id": message_id, "server": f"{self.host}:{self.port}",
            "reason": "a mail server cannot be read back: whether the message arrived shows only in the recipients' "
                      "mailboxes (search them for its Message-ID)"})

    # -- making the message -----------------------------------------------------------------------------
    def _message(self, key: str, payload: Dict[str, Any], message_id: str) -> _Message:
        """The message of ``payload``, as the bytes to send; :class:`Rejected` (nothing sent) when it cannot be one."""
        import email.policy
        import email.utils
        from email.message import EmailMessage

        if not isinstance(payload, dict):
            raise Rejected("the payload of an e-mail message is a JSON object with a subject and a text")
        unknown = sorted(set(payload) - set(_PAYLOAD))
        if unknown:
            raise Rejected(f"the payload holds {', '.join(unknown)}: a message takes {', '.join(_PAYLOAD)}")
        for name in ("subject", "text"):
            if not isinstance(payload.get(name), str):
                raise Rejected(f"the payload's {name!r} is a string, and required")
        if "html" in payload and not isinstance(payload["html"], str):
            raise Rejected("the payload's 'html' is a string")
        fields = {name: payload[name] if name in payload else getattr(self, name) for name in ("to", "cc", "bcc")}
        for name, value in fields.items():
            if name in payload and not strings(value) and value != []:
                raise Rejected(f"the payload's {name!r} is an address or a list of addresses")
            fields[name] = listed(value)
        reply_to = payload.get("reply_to", self.reply_to)
        extra = payload.get("headers") or {}
        if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
            raise Rejected("the payload's 'headers' is an object of header names and string values")
        for name in extra:
            if not _HEADER_NAME.match(name) or name.lower() in _OWN_HEADERS:
                raise Rejected(f"the payload's headers may not set {name!r}")
        sender = self._addresses(self.sender, "from", one=True)[0]
        if reply_to is not None and not isinstance(reply_to, str):
            raise Rejected("the payload's 'reply_to' is an address")
        if reply_to:
            self._addresses(reply_to, "reply_to")
        recipients: List[str] = []
        for name in ("to", "cc", "bcc"):
            for text in fields[name]:
                recipients += self._addresses(text, name)
        if not recipients:
            raise Rejected("the message has no recipient: the contract's 'to' or the payload's 'to', 'cc' or 'bcc'")
        if len(recipients) > MAX_RECIPIENTS:
            raise Rejected(f"the message has {len(recipients)} recipients; the most is {MAX_RECIPIENTS}")
        # Lines of up to 998 characters (RFC 5322's limit) keep a long key and its Message-ID on one line each.
        message = EmailMessage(policy=email.policy.SMTP.clone(max_line_length=998))
        try:
            message["Message-ID"] = message_id
            message["Date"] = email.utils.formatdate(usegmt=True)
            message["From"] = self.sender
            for name, header in (("to", "To"), ("cc", "Cc")):
                if fields[name]:
                    message[header] = ", ".join(fields[name])
            if reply_to:
                message["Reply-To"] = reply_to
            message["Subject"] = payload["subject"]
            message["X-Runner-Key"] = key
            for name, value in extra.items():
                message[name] = value
            message.set_content(payload["text"])
            if "html" in payload:
                message.add_alternative(payload["html"], subtype="html")
            content = message.as_bytes()
        except (ValueError, TypeError, UnicodeError) as exc:
            raise Rejected(f"the payload cannot be written as a message: {exc}") from None
        return _Message(content, sender, recipients)

    @staticmethod
    def _addresses(text: str, field: str, one: bool = False) -> List[str]:
        """The addresses of ``text`` (the envelope's); :class:`Rejected` naming ``field`` when it holds none."""
        wrong = address_problem(text, one)
        if wrong:
            raise Rejected(f"{field}: {wrong}")
        return [address for _, address in addresses(text)]

    # -- sending ---------------------------------------------------------------------------------------
    def _credentials(self, secrets: List[str]) -> Optional[Tuple[str, str]]:
        """The username and password, secrets read now (and added to ``secrets``).

        :raises ValueError: a secret cannot be read; the message holds no value.
        """
        if self.username is None or self.password is None:
            return None
        values = []
        for text in (self.username, self.password):
            match = SECRET.fullmatch(text)
            if match is None:
                values.append(expand([text], self.values)[0])
                continue
            value = read_secret(match.group(1), match.group(2), self.workspace, self.environ)
            secrets.append(value)
            values.append(value)
        return values[0], values[1]

    def _end(self) -> float:
        """The monotonic moment this call must be over: its own time, or the registered call's deadline if sooner."""
        end = time.monotonic() + self.timeout
        making = inflight.current()
        if making is not None:
            registry, call = making
            end = min(end, time.monotonic() + float(call.record["deadline"]) - registry.clock())
        return end

    def _context(self) -> "ssl.SSLContext":
        import ssl

        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise _NotSent(f"ca_file {self.ca_file}: {exc}; nothing was sent") from None

    def _send(self, message: _Message, credentials: Optional[Tuple[str, str]], end: float) -> str:
        """One session that sends ``message``; the text of the server's 2xx after the final ``.``.

        :raises _NotSent: nothing was delivered (a refused connection, a lost one before the message's end).
        :raises NotApplied: a 4xx reply, or a refused login.
        :raises Rejected: any other 5xx reply.
        :raises _Lost: the whole message was written and no answer came back.
        """
        import smtplib

        where = f"{self.host}:{self.port}"
        if time.monotonic() >= end:
            raise _NotSent("the call's deadline passed before connecting (the process was held up); nothing was sent")
        context = self._context() if self.security != "none" else None
        left = max(0.001, end - time.monotonic())
        try:
            if self.security == "ssl":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, local_hostname=self.helo, timeout=left,
                                                      context=context)
            else:
                smtp = smtplib.SMTP(self.host, self.port, local_hostname=self.helo, timeout=left)
        except smtplib.SMTPConnectError as exc:
            self._refused(exc.smtp_code, exc.smtp_error, "the greeting")
            raise  # not reached: _refused always raises
        except OSError as exc:
            raise _NotSent(f"no connection to {where}, nothing was sent: {type(exc).__name__}: {exc}") from None
        watchdog = _Watchdog(smtp, end)
        sent = False
        try:
            self._greet(smtp, context, credentials)
            self._envelope(smtp, message)
            code, text = smtp.docmd("DATA")
            if code != 354:
                self._refused(code, text, "DATA")
            if time.monotonic() >= end:
                raise _NotSent("the call's deadline passed before the message was written (the process was held up); "
                               "the DATA command was abandoned with the connection, nothing was delivered")
            try:
                smtp.sock.sendall(_stuffed(message.content))  # type: ignore[union-attr]
            except OSError as exc:
                raise _NotSent(f"{where}: the connection was lost before the message's end was sent, so nothing was "
                               f"delivered: {type(exc).__name__}: {exc}") from None
            sent = True
            try:
                code, text = smtp.getreply()
            except OSError as exc:
                cut = " at the call's deadline" if watchdog.fired else ""
                raise _Lost(f"{where}: the whole message was sent, and the connection was lost{cut} before the "
                            f"server's answer: it may or may not have been delivered "
                            f"({type(exc).__name__}: {exc})") from None
            said = _said(code, text)
            if 200 <= code < 300:
                return said
            if 400 <= code < 600:
                self._refused(code, text, "the message")
            # Only 4xx and 5xx say "not delivered"; once the final "." may have left, anything else is unknown.
            raise _Lost(f"{where}: the server answered the message with {said!r}, which says neither delivered nor not")
        except smtplib.SMTPServerDisconnected as exc:
            if sent:
                raise _Lost(f"{where}: the whole message was sent, and the connection was lost before the server's "
                            f"answer: it may or may not have been delivered ({exc})") from None
            raise _NotSent(f"{where}: the connection was lost before the message was sent, nothing was delivered: "
                           f"{exc}") from None
        except (NotApplied, Rejected, _NotSent, _Lost):
            raise
        except OSError as exc:
            if sent:
                raise _Lost(f"{where}: {type(exc).__name__}: {exc}") from None
            raise _NotSent(f"{where}: nothing was delivered: {type(exc).__name__}: {exc}") from None
        finally:
            self._close(smtp, polite=sent)  # while the watchdog still bounds a QUIT the server does not answer
            watchdog.cancel()

    def _greet(self, smtp: "smtplib.SMTP", context: "Optional[ssl.SSLContext]",
               credentials: Optional[Tuple[str, str]]) -> None:
        """EHLO (HELO for an old server), STARTTLS when asked for, then the login."""
        import smtplib

        self._hello(smtp)
        if self.security == "starttls":
            if not smtp.has_extn("starttls"):
                raise _NotSent(f"{self.host}:{self.port} offers no STARTTLS, and the contract asks for it: nothing was "
                               "sent in clear")
            try:
                smtp.starttls(context=context)
            except smtplib.SMTPResponseException as exc:
                self._refused(exc.smtp_code, exc.smtp_error, "STARTTLS")
            self._hello(smtp)
        if credentials is None:
            return
        try:
            smtp.login(*credentials)
        except smtplib.SMTPNotSupportedError:
            raise _NotSent(f"{self.host}:{self.port} offers no AUTH, and the contract names a username: nothing was "
                           "sent") from None
        except smtplib.SMTPResponseException as exc:
            self._refused(exc.smtp_code, exc.smtp_error, "the login")
        except smtplib.SMTPException as exc:
            if isinstance(exc, smtplib.SMTPServerDisconnected):
                raise
            raise _NotSent(f"{self.host}:{self.port}: the login could not be made ({exc}); nothing was sent") from None

    def _hello(self, smtp: "smtplib.SMTP") -> None:
        code, text = smtp.ehlo()
        if code != 250:
            code, text = smtp.helo()
            if code != 250:
                self._refused(code, text, "HELO")

    def _envelope(self, smtp: "smtplib.SMTP", message: _Message) -> None:
        """MAIL FROM, then RCPT TO for every recipient; any refusal refuses the message (RSET, nothing sent)."""
        code, text = smtp.mail(message.sender)
        if code != 250:
            self._refused(code, text, "MAIL FROM")
        refused: List[Tuple[str, int, bytes]] = []
        for recipient in message.recipients:
            code, text = smtp.rcpt(recipient)
            if code not in (250, 251):
                refused.append((recipient, code, text))
        if not refused:
            return
        try:
            smtp.rset()
        except OSError:
            pass
        # A recipient refused for good refuses the message for good; a recipient refused for now, for now.
        worst = next((r for r in refused if r[1] >= 500), refused[0])
        others = f" ({len(refused) - 1} more refused)" if len(refused) > 1 else ""
        self._refused(worst[1], worst[2], f"RCPT TO:<{worst[0]}>", others)

    def _refused(self, code: int, text: Any, step: str, more: str = "") -> None:
        """Raise what a refusal at ``step`` means: 4xx and the login's 5xx, NotApplied; another 5xx, Rejected."""
        detail = f"{self.host}:{self.port} answered {step} with {_said(code, text)!r}{more}; nothing was delivered"
        if 400 <= code < 500:
            raise NotApplied(detail, self.not_now)
        if code in CREDENTIALS:
            raise NotApplied(detail + " (the login was refused: check the username and password)")
        if 500 <= code < 600:
            raise Rejected(detail)
        raise _NotSent(f"{self.host}:{self.port} answered {step} with {_said(code, text)!r}, which no server says "
                       "there; nothing was delivered")

    @staticmethod
    def _close(smtp: "smtplib.SMTP", polite: bool) -> None:
        """QUIT after a message went (its answer does not matter); otherwise just close the connection."""
        try:
            if polite:
                smtp.quit()
        except OSError:
            pass
        finally:
            try:
                smtp.close()
            except OSError:
                pass


def _said(code: int, text: Any) -> str:
    words = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    return f"{code} {' '.join(words.split())}"[:REPLY_CHARS]


def _stuffed(content: bytes) -> bytes:
    """The message as DATA sends it: CRLF line ends, a ``.`` more at the start of each line that has one, the final
    ``.``."""
    lines = re.sub(rb"\r?\n", b"\r\n", content)
    if not lines.endswith(b"\r\n"):
        lines += b"\r\n"
    return re.sub(rb"(?m)^\.", b"..", lines) + b".\r\n"
