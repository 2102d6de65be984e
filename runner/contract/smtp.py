"""What the contract's ``effects.smtp`` section may say: :func:`smtp_problems` (each ``FIELD: why``) and
:func:`smtp_section_problems` (each a :class:`~runner.contract.http.FieldProblem` for ``contract check``).

The section declares a mail server that is sent one message per effect
(:mod:`runner.adapters.smtp` makes the calls, with :mod:`smtplib`); this
module holds only what the checks need, so that every verb may import it. A
mail server cannot be read back: the section's ``observe`` may only say
``"none"``, which is also what it means when left out.

``from``, ``to``, ``cc``, ``bcc``, ``reply_to``, ``username``, ``host`` and
``helo`` may hold the item's placeholders (``{item}``, ``{stem}``, ``{slug}``,
``{index}``, ``{run_id}``, a record's ``{field.PATH}``); ``message_id`` also
``{key_text}`` and ``{digest}``; ``password`` (and ``username``) may be
``{env:NAME}`` or ``{file:PATH}``.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

from .http import SECRET, FieldProblem
from .lookups import OBSERVE_NONE
from .templates import expand, is_field, placeholders_in

__all__ = ["smtp_problems", "smtp_section_problems", "address_problem", "addresses", "listed", "strings",
           "loopback", "SMTP_FIELDS", "SECURITY", "DEFAULT_PORTS", "DEFAULT_MESSAGE_ID", "NOT_NOW_SECONDS",
           "MESSAGE_ID", "ITEM_PLACEHOLDERS", "MESSAGE_ID_PLACEHOLDERS"]

SECURITY = ("starttls", "ssl", "none")
DEFAULT_PORTS = {"starttls": 587, "ssl": 465, "none": 25}
#: The Message-ID a message gets when the contract gives no template.
DEFAULT_MESSAGE_ID = "<{key_text}.{digest}@runner>"
#: Seconds before sending again after a 4xx, when the contract says nothing.
NOT_NOW_SECONDS = 60.0
#: The longest ``not_now_seconds`` (a day, the longest wait any answer may ask for).
_MOST_NOT_NOW = 86400.0
#: The fields of the section; ``observe`` may only be ``"none"``.
SMTP_FIELDS = ("host", "port", "security", "username", "password", "from", "to", "cc", "bcc", "reply_to",
               "message_id", "ca_file", "helo", "not_now_seconds")
#: The placeholders an item fills in the section's addresses, host, helo and username.
ITEM_PLACEHOLDERS = ("item", "stem", "slug", "index", "run_id")
#: The placeholders a ``message_id`` template may hold besides the item's.
MESSAGE_ID_PLACEHOLDERS = ("key_text", "digest")
#: A Message-ID as the runner makes them: ``<dot-atom@dot-atom>`` (RFC 5322), braces left out so that a placeholder
#: left unfilled is caught.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`|~-]+"
MESSAGE_ID = re.compile(rf"<{_ATOM}(?:\.{_ATOM})*@{_ATOM}(?:\.{_ATOM})*>\Z")
_ADDRESS = re.compile(r"[^\s<>()\[\],;:\"@]+@[^\s<>()\[\],;:\"@]+\Z")


def smtp_problems(spec: Any) -> List[str]:
    """What is wrong with an ``effects.smtp`` section, one ``FIELD: why`` each (none: it can be used).

    ``observe`` is not a field here: :func:`smtp_section_problems` checks it, with the rest of the effects section.
    """
    if not isinstance(spec, dict):
        return ["the section is a JSON object"]
    fields = ", ".join(SMTP_FIELDS)
    problems = [f"{name}: not a field of the section (it has {fields})" for name in spec if name not in SMTP_FIELDS]
    security = spec.get("security", "starttls")
    if security not in SECURITY:
        problems.append(f"security: one of {', '.join(SECURITY)}, not {security!r}")
    host = spec.get("host")
    if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
        problems.append("host: the mail server's name or address (a string without spaces)")
    port = spec.get("port", DEFAULT_PORTS.get(security, 25))
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        problems.append("port: a whole number from 1 to 65535")
    for name in ("username", "from", "reply_to", "helo", "ca_file", "message_id", "password"):
        if name in spec and (not isinstance(spec[name], str) or not spec[name].strip()):
            problems.append(f"{name}: a non-empty string")
    for name in ("to", "cc", "bcc"):
        if name in spec and not strings(spec[name]):
            problems.append(f"{name}: an address or a list of addresses")
    if "from" not in spec:
        problems.append("from: the sender's address, required")
    for name in ("from", "reply_to", "to", "cc", "bcc"):
        # A value with a placeholder is an item's: it is checked when its message is made.
        for text in (t for t in listed(spec.get(name)) if isinstance(t, str) and t.strip() and "{" not in t):
            wrong = address_problem(text, one=name == "from")
            if wrong:
                problems.append(f"{name}: {wrong}")
    password, username = spec.get("password"), spec.get("username")
    if (password is None) != (username is None):
        problems.append("password: given with a username, and only then")
    if isinstance(password, str) and not SECRET.fullmatch(password):
        problems.append("password: {env:NAME} or {file:PATH}, read when the message is sent; a password written in "
                        "the contract would be recorded with the run")
    if isinstance(username, str) and SECRET.search(username) and not SECRET.fullmatch(username):
        problems.append("username: a name, or one {env:NAME} or {file:PATH}")
    for name, value in spec.items():
        texts = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
        if name not in ("username", "password") and any(SECRET.search(t) for t in texts):
            problems.append(f"{name}: {{env:...}} and {{file:...}} are read in username and password only")
    if password is not None and security == "none" and isinstance(host, str) and not loopback(host):
        problems.append("security: 'none' sends the password in clear: use starttls or ssl (or a loopback host)")
    template = spec.get("message_id", DEFAULT_MESSAGE_ID)
    if isinstance(template, str):
        if "{digest}" not in template and "{key_text}" not in template:
            problems.append("message_id: holds {digest} or {key_text}, so that each effect's message has its own")
        elif not MESSAGE_ID.match(expand([template], {name: "x" for name in placeholders_in(template)})[0]):
            problems.append(f"message_id: {template!r} does not make <left@right> of letters, digits and "
                            "!#$%&'*+/=?^_`|~- (dots between)")
    wait = spec.get("not_now_seconds", NOT_NOW_SECONDS)
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= _MOST_NOT_NOW:
        problems.append(f"not_now_seconds: a number of seconds from 0 to {int(_MOST_NOT_NOW)}")
    return problems + _placeholder_problems(spec)


def _placeholder_problems(spec: Dict[str, Any]) -> List[str]:
    """A placeholder no item fills, in a field that may hold the item's (one problem per field)."""
    out = []
    for name in ("host", "helo", "username", "from", "reply_to", "to", "cc", "bcc", "message_id"):
        allowed = ITEM_PLACEHOLDERS + (MESSAGE_ID_PLACEHOLDERS if name == "message_id" else ())
        texts = [SECRET.sub("", t) for t in listed(spec.get(name)) if isinstance(t, str)]
        unknown = [n for t in texts for n in placeholders_in(t) if n not in allowed and not is_field(n)]
        if unknown:
            named = ", ".join("{" + n + "}" for n in allowed)
            out.append(f"{name}: unknown placeholder {{{unknown[0]}}} (allowed: {named}, {{field.PATH}})")
    return out


def smtp_section_problems(effects: Dict[str, Any]) -> List[FieldProblem]:
    """Every problem of the contract's ``effects.smtp`` (none when it has no such section), each with the fields that
    lead to it: the section's own (:func:`smtp_problems`), its ``observe`` (only ``"none"``: a mail server cannot be
    read back), and the other ways to reach a target beside it."""
    smtp = effects.get("smtp")
    if not isinstance(smtp, dict):
        return []  # absent, or not an object: the effects section's own check says so
    out: List[FieldProblem] = []
    others = [name for name in ("http", "git", "invoke") if name in effects]
    if "observe" in effects and effects["observe"] != OBSERVE_NONE:
        others.append("observe")
    if others:
        out.append(FieldProblem(("smtp",), f"effects: smtp and {'/'.join(others)} exclude each other; keep one of "
                                           "them"))
    section = dict(smtp)
    observe = section.pop("observe", OBSERVE_NONE)
    if observe != OBSERVE_NONE:
        out.append(FieldProblem(("smtp", "observe"), 'effects.smtp.observe: a mail server cannot be read back: '
                                                     'leave observe out, or write "none"'))
    for problem in smtp_problems(section):
        field = problem.split(":", 1)[0]
        at = ("smtp", field) if field in SMTP_FIELDS or field in section else ("smtp",)
        out.append(FieldProblem(at, f"effects.smtp.{problem}"))
    return out


def strings(value: Any) -> bool:
    """True for a non-empty string, or a non-empty list of them."""
    return (isinstance(value, str) and bool(value.strip())) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, str) and v.strip() for v in value))


def listed(value: Any) -> List[Any]:
    """``value`` as a list: none, one, or the list itself."""
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def addresses(text: str) -> List[Tuple[str, str]]:
    """The ``(name, address)`` pairs of a header value such as ``Ops <ops@example.org>, dev@example.org``."""
    import email.utils  # here: a contract without a mail target never loads it

    return email.utils.getaddresses([text])


def address_problem(text: str, one: bool = False) -> Optional[str]:
    """Why ``text`` is not a list of addresses (one address with ``one``) a message can be sent to, or None."""
    found = addresses(text)
    if not found or any(not _ADDRESS.match(address) or not address.isascii() for _, address in found):
        return f"{text[:200]!r} is not a list of addresses (ASCII, name@domain)"
    if one and len(found) != 1:
        return f"{text[:200]!r} is not one address"
    return None


def loopback(host: str) -> bool:
    """True for ``localhost`` and a loopback address (a password may go there in clear)."""
    if host == "localhost":
        return True
    import ipaddress  # here: only a section with a password in clear asks

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
