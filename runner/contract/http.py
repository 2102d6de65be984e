"""What the contract's ``effects.http`` section may say: :func:`http_problems`, for ``contract check``.

The contract's checks (:mod:`runner.contract.text`, through :mod:`runner.contract.effects`)
use this module, and every verb imports them, so it holds only the checks and
what they need: the calls are made by :mod:`runner.adapters.http`, from the
spec :mod:`runner.contract.spec` reads once these checks find nothing. Each problem is a
:class:`FieldProblem`, whose ``path`` names the JSON fields that lead to it so
that ``contract check`` can give its line.

``"observe": "none"`` declares an endpoint that cannot be read back (a chat
incoming webhook): no lookup is made, the invoke's answer is the only
evidence, and an unknown outcome stops for a person.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .lookups import MANY_DEFAULT, MANY_MAX, OBSERVE_NONE
from .templates import FIELD_NAME, expand, is_field, placeholders_in
from ..base.pointer import parse_pointer, pointer_problem

__all__ = ["FieldProblem", "http_problems", "sensitive", "unsendable", "split_url", "secret_origin", "INVOKE_METHODS",
           "OBSERVE_METHODS", "INVOKE_WORDS", "OBSERVE_WORDS", "INVOKE_DEFAULTS", "OBSERVE_DEFAULTS", "MANY_MAX",
           "PAGE_SIZE_MAX", "EACH", "SECRET", "SEND_AS", "LIST_HOW", "MAX_PAGES_DEFAULT", "MAX_PAGES_MAX",
           "LIST_PLACEHOLDERS", "SAVE_PLACEHOLDERS"]

INVOKE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
OBSERVE_METHODS = ("GET", "HEAD")
INVOKE_WORDS = ("receipt", "rejected", "not-applied", "stale-epoch", "unknown")
OBSERVE_WORDS = ("present", "absent", "unknown")

#: What an invoke answer means unless the contract says otherwise: exact statuses first, then classes; any status
#: neither names is unknown, but a 503 with a ``Retry-After`` (:func:`runner.adapters.http_answers.invoke_outcome`). 408
#: is unknown: a proxy answers it after it passed the whole request on and the service sent nothing back in time
#: (Envoy's stream idle timeout).
INVOKE_DEFAULTS: Dict[str, str] = {
    "2xx": "receipt",
    "429": "not-applied",
    "401": "not-applied", "403": "not-applied", "407": "not-applied",
    "408": "unknown",
    "412": "stale-epoch",
    "4xx": "rejected",
}
#: What an observe answer means unless the contract says otherwise; any status not listed is unknown.
OBSERVE_DEFAULTS: Dict[str, str] = {"200": "present", "404": "absent"}

_URL_PLACEHOLDERS = {"invoke": ("key", "item", "stem", "slug", "index", "run_id", "epoch"),
                     "observe": ("key", "item", "stem", "slug", "index", "run_id")}
_HEADER_PLACEHOLDERS = {"invoke": ("key", "slug", "index", "run_id", "epoch"),
                        "observe": ("key", "slug", "index", "run_id")}
_REQUEST_KEYS = {"invoke": ("method", "url", "headers", "statuses", "receipt_headers", "send_as", "receipt_id",
                            "save"),
                 "observe": ("method", "url", "headers", "statuses", "pointer", "many", "list")}
_MANY_KEYS = ("url", "list", "match", "value", "max", "page_size", "next")
#: How an invoke sends its payload: as JSON (the default), or as an HTML form's fields.
SEND_AS = ("json", "form")
_FORM_TYPE = "application/x-www-form-urlencoded"
#: What ``observe.list`` holds; ``url``, ``pages``, ``match`` and ``value`` are required.
_LIST_KEYS = ("url", "pages", "list", "match", "value", "how", "max_pages", "more", "id")
#: What ``observe.list.pages`` may hold besides ``param``: how the next page is named, one of them at most.
_PAGE_FORMS = ("cursor", "after_last")
#: How ``observe.list`` compares the text at ``match`` with an item's ``value``.
LIST_HOW = ("equals", "first_line", "contains")
#: Pages one listing reads at most unless ``max_pages`` says otherwise, and the most it may say.
MAX_PAGES_DEFAULT, MAX_PAGES_MAX = 10, 1000
#: The placeholders a listing's URL may hold: one listing answers every item, so it names none of an item's.
LIST_PLACEHOLDERS = ("run_id",)
_CONDITION_KEYS = ("pointer", "equals", "then")
#: What ``invoke.save`` holds (``path`` required), and the placeholders its path may hold besides a record's fields.
_SAVE_KEYS = ("path", "pointer")
SAVE_PLACEHOLDERS = ("key", "item", "stem", "slug", "index", "run_id")
#: The largest ``observe.many.page_size`` a contract may declare.
PAGE_SIZE_MAX = 100000
#: ``{each:TEMPLATE}`` in a lookup of many keys: TEMPLATE filled for each key, the parts joined with ``&``.
#: TEMPLATE may hold ``{name}`` and a record's ``{field.PATH|FILTER}``.
EACH = re.compile(r"\{each:([^{}]*(?:\{(?:[a-z_]+|" + FIELD_NAME + r")\}[^{}]*)*)\}")
_HTTP_KEYS = ("invoke", "observe", "idempotency_header", "epoch_header", "deduplicates", "retention_seconds", "ca_file")
#: Headers whose value is a credential: a literal value is refused.
_SENSITIVE = ("authorization", "proxy-authorization", "cookie")
_SENSITIVE_SUFFIXES = ("-api-key", "-token")
#: Headers the adapter itself writes.
_MANAGED = ("host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer", "keep-alive")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
SECRET = re.compile(r"\{(env|file):([^{}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STATUS_KEY = re.compile(r"^(?:[1-5][0-9][0-9]|[1-5]xx)$")
_QUERY_NAME = re.compile(r"^[A-Za-z0-9_.~\[\]-]+$")


class FieldProblem(str):
    """A problem of the ``effects.http`` section; ``path`` names the JSON fields that lead to it, for its line."""

    path: Tuple[str, ...] = ()

    def __new__(cls, path: Sequence[str], message: str) -> "FieldProblem":
        made = super().__new__(cls, message)
        made.path = tuple(path)
        return made


def sensitive(name: str) -> bool:
    """True for a header whose value is a credential (``Authorization``, ``Cookie``, ``*-Api-Key``, ``*-Token``...)."""
    lowered = name.lower()
    return lowered in _SENSITIVE or lowered.endswith(_SENSITIVE_SUFFIXES)


def unsendable(value: str) -> Optional[str]:
    """What in a header value HTTP/1.1 cannot carry (a character outside Latin-1, a control character), or None.

    The text never quotes the value: it may be a secret.
    """
    for c in value:
        if ord(c) > 0xFF:
            return "a character outside Latin-1"
        if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F:
            return "a control character"
    return None


def _relative_path(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return bool(path) and not path.startswith("/") and "\0" not in path and ".." not in parts


def _secret_problem(value: str) -> Optional[str]:
    for kind, name in SECRET.findall(value):
        if kind == "env" and not _ENV_NAME.match(name):
            return f"{{env:{name}}} must name an environment variable (letters, digits, _)"
        if kind == "file" and not _relative_path(name):
            return f"{{file:{name}}} must be a path relative to the workspace, without '..'"
    return None


def _url_problems(kind: str, url: Any, allowed: Optional[Sequence[str]] = None,
                  field: Optional[str] = None) -> List[FieldProblem]:
    field = field or f"effects.http.{kind}.url"
    at = ("http", kind) + tuple(field.split(".")[3:])
    if not isinstance(url, str) or not url:
        return [FieldProblem(at, f"{field} must be a string: http:// or https://, a host, and a path")]
    problem = _secret_problem(url)
    if problem:
        return [FieldProblem(at, f"{field}: {problem}")]
    allowed = _URL_PLACEHOLDERS[kind] if allowed is None else allowed
    unknown = sorted({n for n in placeholders_in(url) if n not in allowed and not is_field(n)})
    if unknown:
        return [FieldProblem(at, f"{field}: unknown placeholder {{{unknown[0]}}} "
                                 f"(allowed: {', '.join('{' + n + '}' for n in allowed)})")]
    try:
        if secret_origin(url):
            _secret_url_shape(url)
        else:
            split_url(url)
    except ValueError as exc:
        return [FieldProblem(at, f"{field}: {exc}")]
    return []


def secret_origin(url: str) -> bool:
    """True when a URL template's scheme, host or port come from ``{env:NAME}`` or ``{file:PATH}``: where it leads is
    known only once the secret is read, at each call."""
    first = SECRET.search(url)
    if first is None:
        return False
    match = re.match(r"^https?://[^/?#]*", url, re.IGNORECASE)
    return first.start() < (match.end() if match else 1)


def _secret_url_shape(url: str) -> None:
    """Check what can be checked of a URL template whose origin is a secret's: it starts with the secret (or with
    ``http(s)://`` and then the secret), no item placeholder comes before a ``/``, ``?`` or ``&`` after the secret,
    and its literal text can be sent.

    :raises ValueError: the problem, in :func:`split_url`'s words.
    """
    first = SECRET.search(url)
    assert first is not None
    if first.start() and not re.match(r"^https?://", url, re.IGNORECASE):
        raise ValueError("must start with http:// or https://")
    rest = url[first.end():]
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("&")) if i >= 0]  # "&": the secret ends in a query
    if placeholders_in(url[:first.end() + min(ends, default=len(rest))]):
        raise ValueError("the scheme, host and port must be written out: placeholders go in the path and the query")
    literal = SECRET.sub("", url)
    if "#" in literal:
        raise ValueError("a fragment is never sent; leave it out")
    if any(c.isspace() for c in literal):
        raise ValueError("white space must be percent-encoded")
    if not literal.isascii() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in literal):
        raise ValueError("a request line is ASCII: percent-encode other characters in the path and query "
                         "(é as %C3%A9), write a host in its xn-- form, and leave control characters out")


def split_url(url: str) -> Tuple[str, str, int, str]:
    """``(scheme, host, port, rest)`` of a URL template whose origin is literal; ``rest`` starts with ``/``.

    :raises ValueError: not http(s), a placeholder or credentials in the origin, a fragment, a bad port.
    """
    match = re.match(r"^(https?)://([^/?#]*)(.*)$", url, re.IGNORECASE)
    if not match:
        raise ValueError("must start with http:// or https://")
    scheme, authority, rest = match.group(1).lower(), match.group(2), match.group(3)
    if "{" in authority or "}" in authority:
        raise ValueError("the scheme, host and port must be written out: placeholders go in the path and the query")
    if "@" in authority:
        raise ValueError("credentials in the URL are refused: put them in a header, from {env:NAME} or {file:PATH}")
    if "#" in rest:
        raise ValueError("a fragment is never sent; leave it out")
    if any(c.isspace() for c in url):
        raise ValueError("white space must be percent-encoded")
    if not url.isascii() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("a request line is ASCII: percent-encode other characters in the path and query "
                         "(é as %C3%A9), write a host in its xn-- form, and leave control characters out")
    import urllib.parse  # only a contract with an http section needs it; every verb imports this module

    parts = urllib.parse.urlsplit(f"{scheme}://{authority}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the port must be a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError("names no host")
    if not rest.startswith("/"):
        rest = "/" + rest  # "http://host" and "http://host?q=1" ask for the root
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80), rest


def _header_problems(kind: str, headers: Any) -> List[FieldProblem]:
    at = ("http", kind, "headers")
    if not isinstance(headers, dict):
        return [FieldProblem(at, f"effects.http.{kind}.headers must be an object of header names and string values")]
    out: List[FieldProblem] = []
    allowed = _HEADER_PLACEHOLDERS[kind]
    for name, value in headers.items():
        here = at + (name,)
        if not _TOKEN.match(name):
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name!r} is not a header name"))
            continue
        if name.lower() in _MANAGED:
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name} is written by the runner, not the "
                                          "contract"))
            continue
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name} must be a string on one line"))
            continue
        problem = _secret_problem(value)
        if problem:
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name}: {problem}"))
            continue
        unknown = sorted({n for n in placeholders_in(value) if n not in allowed and not is_field(n)})
        if unknown:
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name}: unknown placeholder {{{unknown[0]}}} "
                                          f"(allowed: {', '.join('{' + n + '}' for n in allowed)}, {{env:NAME}}, "
                                          f"{{file:PATH}})"))
            continue
        literal = unsendable(expand([SECRET.sub("", value)], {n: "" for n in allowed})[0])
        if literal:
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name} holds {literal}, which an HTTP header "
                                          "cannot carry (Latin-1 text without control characters)"))
            continue
        if sensitive(name) and not SECRET.search(value):
            out.append(FieldProblem(here, f"effects.http.{kind}.headers: {name} holds a credential, and a literal one "
                                          "would be recorded with the run: write {env:NAME} or {file:PATH} for the "
                                          "secret part"))
    return out


def _status_problems(kind: str, statuses: Any) -> List[FieldProblem]:
    at = ("http", kind, "statuses")
    words = INVOKE_WORDS if kind == "invoke" else OBSERVE_WORDS
    if not isinstance(statuses, dict):
        return [FieldProblem(at, f"effects.http.{kind}.statuses must be an object: a status or class (\"409\", "
                                 f"\"5xx\") to one of {', '.join(words)}")]
    out = []
    for code, word in statuses.items():
        if not _STATUS_KEY.match(code):
            out.append(FieldProblem(at + (code,), f"effects.http.{kind}.statuses: {code!r} is neither a status "
                                                  "(100-599) nor a class (\"4xx\")"))
        elif isinstance(word, list):
            out.extend(_condition_problems(kind, code, word, words))
        elif word not in words:
            out.append(FieldProblem(at + (code,), f"effects.http.{kind}.statuses: {code} maps to {word!r}; an {kind} "
                                                  f"answer is one of {', '.join(words)}"))
    return out


def _condition_problems(kind: str, code: str, conditions: List[Any], words: Sequence[str]) -> List[FieldProblem]:
    """Problems of a status whose meaning depends on the answer's body: conditions tried in order, then a word."""
    at = ("http", kind, "statuses", code)
    field = f"effects.http.{kind}.statuses: {code}"
    shape = (f"{field}: a list of conditions on the answer's body ({{\"pointer\": \"/errors\", \"then\": WORD}}, with "
             "\"equals\": VALUE to compare the value there) that ends with the word the status means otherwise")
    if (len(conditions) < 2 or not isinstance(conditions[-1], str) or
        not all(isinstance(c, dict) for c in conditions[:-1])):
        return [FieldProblem(at, shape)]
    out = []
    if conditions[-1] not in words:
        out.append(FieldProblem(at, f"{field} ends with {conditions[-1]!r}; an {kind} answer is one of "
                                    f"{', '.join(words)}"))
    for condition in conditions[:-1]:
        unknown = [name for name in condition if name not in _CONDITION_KEYS]
        if unknown or "pointer" not in condition or "then" not in condition:
            out.append(FieldProblem(at, shape if not unknown else
                                    f"{field}: unknown field {unknown[0]!r} in a condition (allowed: "
                                    f"{', '.join(_CONDITION_KEYS)})"))
            continue
        problem = pointer_problem(condition["pointer"], f"{field}: a condition's pointer")
        if problem:
            out.append(FieldProblem(at, problem))
        equals = condition.get("equals")
        if isinstance(equals, str) and placeholders_in(equals):
            # Compared as written, never filled: a placeholder there would make every item's answer fail the test.
            out.append(FieldProblem(at, f"{field}: a condition's equals is compared as written, and "
                                        f"{{{placeholders_in(equals)[0]}}} is not filled from the item: look the "
                                        "item's value up in the request (its URL or query) instead"))
        if condition["then"] not in words:
            out.append(FieldProblem(at, f"{field}: a condition gives {condition['then']!r}; an {kind} answer is one of "
                                        f"{', '.join(words)}"))
    return out


def _pointer_problem(pointer: Any) -> Optional[str]:
    return pointer_problem(pointer, "effects.http.observe.pointer")


def _request_problems(kind: str, spec: Any) -> List[FieldProblem]:
    at = ("http", kind)
    if not isinstance(spec, dict):
        return [FieldProblem(at, f"effects.http.{kind} must be an object with at least a url")]
    out: List[FieldProblem] = []
    for name in spec:
        if name in ("idempotency_header", "epoch_header") and kind == "invoke":
            out.append(FieldProblem(at + (name,), f"effects.http.invoke: {name} belongs to effects.http, beside invoke "
                                                  "and observe (the runner writes it on the invoke only); or write the "
                                                  "header in invoke.headers with the value \"{key}\""))
        elif name not in _REQUEST_KEYS[kind]:
            out.append(FieldProblem(at + (name,), f"effects.http.{kind}: unknown field {name!r} (allowed: "
                                                  f"{', '.join(_REQUEST_KEYS[kind])})"))
    methods = INVOKE_METHODS if kind == "invoke" else OBSERVE_METHODS
    method = spec.get("method", methods[0])
    if method not in methods:
        out.append(FieldProblem(at + ("method",), f"effects.http.{kind}.method must be one of {', '.join(methods)}"))
    if "list" in spec:
        out.extend(_list_problems(spec))
    else:
        out.extend(_url_problems(kind, spec.get("url")))
    if "headers" in spec:
        out.extend(_header_problems(kind, spec["headers"]))
    if "send_as" in spec:
        out.extend(_send_as_problems(spec))
    if "save" in spec:
        out.extend(_save_problems(spec["save"]))
    if "statuses" in spec:
        out.extend(_status_problems(kind, spec["statuses"]))
    if "pointer" in spec:
        problem = _pointer_problem(spec["pointer"])
        if problem:
            out.append(FieldProblem(at + ("pointer",), problem))
        elif method == "HEAD":
            out.append(FieldProblem(at + ("pointer",), "effects.http.observe.pointer needs an answer body; a HEAD "
                                                       "request has none"))
    if "many" in spec:
        out.extend(_many_problems(spec["many"]))
    if "receipt_id" in spec:
        problem = pointer_problem(spec["receipt_id"], "effects.http.invoke.receipt_id")
        if problem:
            out.append(FieldProblem(at + ("receipt_id",), problem))
    if "receipt_headers" in spec:
        names = spec["receipt_headers"]
        if not isinstance(names, list) or not all(isinstance(n, str) and _TOKEN.match(n) for n in names):
            out.append(FieldProblem(at + ("receipt_headers",), "effects.http.invoke.receipt_headers must list header "
                                                               "names"))
        elif any(n.lower() in ("set-cookie", "authorization") or sensitive(n) for n in names):
            out.append(FieldProblem(at + ("receipt_headers",), "effects.http.invoke.receipt_headers: a credential "
                                                               "header is never kept in a receipt"))
    return out


def _save_problems(save: Any) -> List[FieldProblem]:
    """Problems of ``invoke.save``: a file of the workspace the answer is kept in, named for its item, and the part of
    the answer kept (a pointer into its JSON; none: the whole body)."""
    at = ("http", "invoke", "save")
    if not isinstance(save, dict) or not isinstance(save.get("path"), str):
        return [FieldProblem(at, 'effects.http.invoke.save must be {"path": "summaries/{stem}.md", "pointer": '
                                 '"/choices/0/message/content"} (no pointer: the whole answer is kept)')]
    out = [FieldProblem(at + (name,), f"effects.http.invoke.save: unknown field {name!r} (allowed: "
                                      f"{', '.join(_SAVE_KEYS)})") for name in save if name not in _SAVE_KEYS]
    path = save["path"]
    unknown = sorted({n for n in placeholders_in(path) if n not in SAVE_PLACEHOLDERS and not is_field(n)})
    if not _relative_path(path) or path.endswith(("/", "\\")):
        out.append(FieldProblem(at + ("path",), "effects.http.invoke.save.path must be a file's path relative to the "
                                                "workspace, without '..': the answer is kept inside the project"))
    elif unknown:
        out.append(FieldProblem(at + ("path",), f"effects.http.invoke.save.path: unknown placeholder {{{unknown[0]}}} "
                                                f"(allowed: {', '.join('{' + n + '}' for n in SAVE_PLACEHOLDERS)})"))
    elif not placeholders_in(path):
        out.append(FieldProblem(at + ("path",), "effects.http.invoke.save.path must name the item (such as {stem} or "
                                                "{key}): each item's answer is a file of its own"))
    if "pointer" in save:
        problem = pointer_problem(save["pointer"], "effects.http.invoke.save.pointer")
        if problem:
            out.append(FieldProblem(at + ("pointer",), problem))
    return out


def _send_as_problems(spec: Dict[str, Any]) -> List[FieldProblem]:
    """Problems of ``invoke.send_as``: ``json`` or ``form``, and a form sent under its own content type."""
    at = ("http", "invoke", "send_as")
    if spec["send_as"] not in SEND_AS:
        return [FieldProblem(at, 'effects.http.invoke.send_as must be "json" (the payload as JSON, the default) or '
                                 '"form" (its fields as application/x-www-form-urlencoded)')]
    headers = spec.get("headers")
    said = [v for n, v in headers.items() if n.lower() == "content-type"] if isinstance(headers, dict) else []
    if spec["send_as"] == "form" and said and not str(said[0]).lower().startswith(_FORM_TYPE):
        return [FieldProblem(at, f"effects.http.invoke.send_as \"form\" sends {_FORM_TYPE}: leave Content-Type out of "
                                 "the headers, or give that type")]
    return []


def _list_problems(observe: Dict[str, Any]) -> List[FieldProblem]:
    """Problems of ``observe.list``: one listing of the target, read page by page to its end, that answers the lookups
    of every item waiting for one; the listing is the lookup, so the observe request holds only headers beside it."""
    at = ("http", "observe", "list")
    listing = observe["list"]
    shape = ('effects.http.observe.list must be {"url": ".../issues?state=all&per_page=100", "pages": "link", '
             '"match": "/body", "value": "{field.id}"} (and "list", "how", "max_pages" if needed)')
    if not isinstance(listing, dict) or not {"url", "pages", "match", "value"} <= set(listing):
        return [FieldProblem(at, shape)]
    out = [FieldProblem(("http", "observe", name), f"effects.http.observe.list is the lookup: leave observe.{name} out")
           for name in ("url", "pointer", "many", "statuses", "method") if name in observe]
    out += [FieldProblem(at + (name,), f"effects.http.observe.list: unknown field {name!r} (allowed: "
                                       f"{', '.join(_LIST_KEYS)})")
            for name in listing if name not in _LIST_KEYS]
    out.extend(_url_problems("observe", listing["url"], LIST_PLACEHOLDERS, "effects.http.observe.list.url"))
    headers = observe.get("headers")
    for name, value in headers.items() if isinstance(headers, dict) else ():
        named = [n for n in placeholders_in(value) if n not in LIST_PLACEHOLDERS] if isinstance(value, str) else []
        if named:
            out.append(FieldProblem(("http", "observe", "headers", name),
                                    f"effects.http.observe.headers: {name}: {{{named[0]}}} names an item, and one "
                                    "listing serves every item: a listing's headers may hold {run_id}, {env:NAME} and "
                                    "{file:PATH}"))
    out.extend(_pages_problems(listing))
    for name in ("list", "match", "more", "id"):
        if name in listing:
            problem = _pointer_problem(listing[name])
            if problem:
                out.append(FieldProblem(at + (name,), problem.replace("observe.pointer", f"observe.list.{name}")))
    value = listing["value"]
    if not isinstance(value, str) or not placeholders_in(value) \
            or any(n not in _URL_PLACEHOLDERS["observe"] and not is_field(n) for n in placeholders_in(value)):
        out.append(FieldProblem(at + ("value",), "effects.http.observe.list.value must be a template of the key, such "
                                                 "as \"{field.id}\" or \"crash {slug}\""))
    if listing.get("how", "equals") not in LIST_HOW:
        out.append(FieldProblem(at + ("how",), f"effects.http.observe.list.how must be one of {', '.join(LIST_HOW)}"))
    most = listing.get("max_pages", MAX_PAGES_DEFAULT)
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_PAGES_MAX:
        out.append(FieldProblem(at + ("max_pages",), "effects.http.observe.list.max_pages must be a whole number from "
                                                     f"1 to {MAX_PAGES_MAX}"))
    return out


def _pages_problems(listing: Dict[str, Any]) -> List[FieldProblem]:
    """Problems of ``observe.list.pages``: how the next page is named. A cursor read from inside the list (its
    pointer leads through an entry, ``/data/99/id``) is refused: on a page of another size no entry is there, and
    that page would be taken for the last."""
    at = ("http", "observe", "list", "pages")
    pages = listing["pages"]
    if pages == "link":
        return []
    forms = [name for name in _PAGE_FORMS if isinstance(pages, dict) and name in pages]
    if not isinstance(pages, dict) or not set(pages) <= {"param", *_PAGE_FORMS} or len(forms) > 1 \
            or not isinstance(pages.get("param"), str) or not _QUERY_NAME.match(pages["param"]) \
            or any(pointer_problem(pages[name], name) for name in forms):
        return [FieldProblem(at, 'effects.http.observe.list.pages must be "link" (the Link header\'s '
                                 'rel="next"), {"param": "page"} (page numbers, to the first empty page) '
                                 'or {"cursor": "/next_cursor", "param": "after"} (the cursor each page '
                                 "names, sent back as that query parameter)"
                                 ', or {"after_last": "/id", "param": "starting_after"} (the last entry\'s id, sent '
                                 "back as that query parameter)")]
    if "cursor" in pages:
        cursor, entries = parse_pointer(pages["cursor"]), parse_pointer(listing.get("list", "")) \
            if not pointer_problem(listing.get("list", ""), "list") else None
        if entries is not None and cursor[:len(entries)] == entries:
            return [FieldProblem(at + ("cursor",), f"effects.http.observe.list.pages.cursor {pages['cursor']} lies "
                                                   "inside the list of entries (observe.list.list): a page of another "
                                                   "size has no entry there and would be taken for the last; for the "
                                                   'last entry\'s id write {"after_last": "/id", "param": ...}, and '
                                                   '"more": "/has_more" where a page says whether another follows')]
    return []


def _id_problems(spec: Dict[str, Any]) -> List[FieldProblem]:
    """``invoke.receipt_id`` and ``observe.list.id`` go together: a receipt's id is looked for in the listing."""
    invoke, observe = spec.get("invoke"), spec.get("observe")
    receipt = isinstance(invoke, dict) and "receipt_id" in invoke
    listing = observe.get("list") if isinstance(observe, dict) else None
    listed = isinstance(listing, dict) and "id" in listing
    if receipt == listed:
        return []
    at = ("http", "invoke", "receipt_id") if receipt else ("http", "observe", "list", "id")
    return [FieldProblem(at, "effects.http.invoke.receipt_id and effects.http.observe.list.id go together: where the "
                             "invoke's answer holds the id of what it made, and where a listed entry holds its id")]


def _many_problems(many: Any) -> List[FieldProblem]:
    """Problems of ``observe.many``: one GET that looks up several keys, answered by a list matched back to each key;
    ``page_size`` and ``next`` say how an answer that is one page of several is told apart."""
    at = ("http", "observe", "many")
    if not isinstance(many, dict) or not {"url", "match", "value"} <= set(many):
        return [FieldProblem(at, 'effects.http.observe.many must be {"url": ".../issues?{each:external_ref={slug}}", '
                                 '"match": "/external_ref", "value": "{slug}"} '
                                 '(and "list", "max", "page_size", "next" if needed)')]
    out = [FieldProblem(at + (name,), f"effects.http.observe.many: unknown field {name!r} (allowed: "
                                      f"{', '.join(_MANY_KEYS)})")
           for name in many if name not in _MANY_KEYS]
    url = many["url"]
    if (not isinstance(url, str) or len(EACH.findall(url)) != 1 or "?" not in url or
        url.index("?") > url.index("{each:")):
        out.append(FieldProblem(at + ("url",), "effects.http.observe.many.url must hold {each:NAME=TEMPLATE} once, in "
                                               "its query"))
    else:
        out.extend(FieldProblem(at + ("url",), p) for p in _url_problems("observe", EACH.sub("x", url)))
        inner = EACH.search(url).group(1)  # type: ignore[union-attr]
        bad = [n for n in placeholders_in(inner) if n not in _URL_PLACEHOLDERS["observe"] and not is_field(n)]
        if bad:
            out.append(FieldProblem(at + ("url",), f"effects.http.observe.many.url: unknown placeholder {{{bad[0]}}}"))
        elif not inner.isascii() or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in inner):
            out.append(FieldProblem(at + ("url",), "effects.http.observe.many.url: {each:...} is part of the "
                                                   "request line, which is ASCII: percent-encode other characters "
                                                   "and white space"))
    for name in ("match", "list"):
        if name in many:
            problem = _pointer_problem(many[name])
            if problem:
                out.append(FieldProblem(at + (name,), problem.replace("observe.pointer", f"observe.many.{name}")))
    value = many["value"]
    if not isinstance(value, str) or not placeholders_in(value) \
            or any(n not in _URL_PLACEHOLDERS["observe"] and not is_field(n) for n in placeholders_in(value)):
        out.append(FieldProblem(at + ("value",), "effects.http.observe.many.value must be a template of the key, such "
                                                 "as \"{slug}\""))
    limit = many.get("max", MANY_DEFAULT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 2 <= limit <= MANY_MAX:
        out.append(FieldProblem(at + ("max",), "effects.http.observe.many.max must be a whole number from 2 to "
                                               f"{MANY_MAX}"))
    page = many.get("page_size", 1)
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= PAGE_SIZE_MAX:
        out.append(FieldProblem(at + ("page_size",), "effects.http.observe.many.page_size must be a whole number "
                                                     f"from 1 to {PAGE_SIZE_MAX}: the most entries one answer holds"))
    if "next" in many:
        problem = _pointer_problem(many["next"])
        if problem:
            out.append(FieldProblem(at + ("next",), problem.replace("observe.pointer", "observe.many.next")))
    return out


def http_problems(effects: Dict[str, Any]) -> List[FieldProblem]:
    """Every problem of the contract's ``effects.http`` (none when it has no such section).

    Each problem is a :class:`FieldProblem`: its text, and the fields leading
    to it so that ``contract check`` can name its line.
    """
    spec = effects.get("http")
    if spec is None or not isinstance(spec, dict):
        return []
    out: List[FieldProblem] = []
    if "invoke" in effects or "observe" in effects:
        out.append(FieldProblem(("http",), "effects: http and the invoke/observe commands exclude each other; keep one "
                                           "of them"))
    for name in spec:
        if name not in _HTTP_KEYS:
            out.append(FieldProblem(("http", name), f"effects.http: unknown field {name!r} (allowed: "
                                                    f"{', '.join(_HTTP_KEYS)})"))
    for kind in ("invoke", "observe"):
        if kind not in spec:
            out.append(FieldProblem(("http",), f"effects.http needs {kind!r}: an effect the runner performs must be "
                                               "one it can observe"))
        elif kind == "observe" and spec[kind] == OBSERVE_NONE:
            # An endpoint that cannot be read back (a chat webhook): the answer is the only evidence.
            if "observe_many" in effects:
                out.append(FieldProblem(("http", "observe"), 'effects: observe_many looks keys up: a target with '
                                                             '"observe": "none" cannot be read back'))
        else:
            out.extend(_request_problems(kind, spec[kind]))
    out.extend(_id_problems(spec))
    names = {}
    for field in ("idempotency_header", "epoch_header"):
        if field in spec:
            name = spec[field]
            if not isinstance(name, str) or not _TOKEN.match(name) or name.lower() in _MANAGED or sensitive(name):
                out.append(FieldProblem(("http", field), f"effects.http.{field} must be a header name (not a "
                                                         "credential's, not one the runner writes)"))
            else:
                names[field] = name.lower()
    if len(set(names.values())) < len(names):
        out.append(FieldProblem(("http", "epoch_header"), "effects.http: idempotency_header and epoch_header must "
                                                          "differ"))
    for field, lowered in names.items():
        for kind in ("invoke", "observe"):
            request = spec.get(kind)
            headers = request.get("headers") if isinstance(request, dict) else None
            if isinstance(headers, dict) and any(h.lower() == lowered for h in headers):
                out.append(FieldProblem(("http", field), f"effects.http.{field} {spec[field]} is also in "
                                                         f"{kind}.headers; the runner writes it"))
    dedup = spec.get("deduplicates")
    if "deduplicates" in spec and not isinstance(dedup, bool):
        out.append(FieldProblem(("http", "deduplicates"), "effects.http.deduplicates must be true or false"))
    elif dedup and "idempotency_header" not in names:
        out.append(FieldProblem(("http", "deduplicates"), "effects.http.deduplicates needs an idempotency_header: the "
                                                          "target can only deduplicate on a key it is sent"))
    retention = spec.get("retention_seconds")
    if "retention_seconds" in spec and retention is not None and (
            isinstance(retention, bool) or not isinstance(retention, (int, float)) or not 0 < retention <= 10 ** 10):
        out.append(FieldProblem(("http", "retention_seconds"), "effects.http.retention_seconds must be a positive "
                                                               "number of seconds, or null (forever)"))
    ca_file = spec.get("ca_file")
    if "ca_file" in spec and (not isinstance(ca_file, str) or not _relative_path(ca_file)):
        out.append(FieldProblem(("http", "ca_file"), "effects.http.ca_file must be a path relative to the workspace, "
                                                     "without '..'"))
    return out
