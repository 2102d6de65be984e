"""An HTTP target declared in the contract (``effects.http``), called in this process with the standard library.

The contract names two requests instead of two commands::

    "http": {
      "invoke":  {"method": "POST", "url": "https://desk.example/api/issues",
                  "headers": {"Authorization": "Bearer {file:.secrets/desk-token}"}},
      "observe": {"url": "https://desk.example/api/issues?external_ref={slug}",
                  "headers": {"Authorization": "Bearer {file:.secrets/desk-token}"}, "pointer": "/0/id"},
      "idempotency_header": "Idempotency-Key", "epoch_header": "X-Fencing-Epoch"
    }

:func:`~runner.contract.http.http_problems` checks that section for
``contract check``; :class:`HttpAdapter` is the :class:`runner.calls.target.Adapter`
that makes the calls, over three modules that each keep one concern: the
client that sends a request and tells one not sent from one lost, and knows
nothing of effects (:mod:`runner.adapters.http_client`), the secrets of the
headers (:mod:`runner.adapters.http_secrets`), and what each answer means,
each overridable per request by ``statuses`` (:mod:`runner.adapters.http_answers`).

Invariants kept here:

* **Secrets never reach the run.** Secrets are read at each call. Receipts,
  evidence and reasons name the headers sent, never their values; a URL
  that holds ``{env:NAME}`` or ``{file:PATH}`` (anywhere: a webhook's whole
  URL may be one) is shown with ``[secret]`` in their place, and where a
  secret names the host, the host is a secret too; any text of the target's
  answer that holds a secret value has it replaced by ``[secret]`` before it
  is returned.
* **No effect begins with a request that cannot be sent.** The constructor
  makes the item's header values, secrets read, and raises InvalidInput (naming
  the header, never its value) when one cannot be read or sent (a character
  outside Latin-1). Whatever else cannot be encoded fails before a byte is
  written: nothing was sent, never an unknown outcome.
* **Nothing is sent past the call's deadline.** Right before the request is
  written, the registered call's deadline (:mod:`runner.calls.inflight`) and the
  call's own time are checked; past either, nothing is sent and the call
  raises :class:`~runner.calls.target.NotApplied`. So a process stopped and
  continued late never sends what another worker has since decided about.
* **One time limit per call.** ``timeout_seconds`` bounds connecting, sending
  and receiving together (the client's deadline), so a target that answers
  one byte at a time cannot stretch it; a listing's pages share it.
* **No request the target announced it would refuse.** An answer that says no
  request is left before a reset (:func:`~runner.adapters.http_answers.rate_limit_wait`)
  holds every request to its origin until then: the call raises
  :class:`~runner.calls.target.NotApplied` with the time left, nothing sent.
* **An answer kept is the acknowledged answer.** With ``invoke.save`` the
  answer (the value at its pointer, or the whole body) is written to the
  item's file inside the workspace before the receipt is returned,
  atomically (:func:`~runner.base.fs.replace_durably`: a temporary file
  beside it, synced, renamed over it), and the receipt names the file, its
  size and its SHA-256 in place of the value, so the acknowledgement that
  records the receipt records the file's hash in the same transition. A
  file written by a call whose answer was never recorded is no evidence:
  it is replaced by the answer of the call that is, and its temporary file
  by the next write.
* **An absence only from a listing read to its end.** With ``observe.list``
  every lookup reads one listing of the target page by page, within the
  call's time and ``max_pages``; a key none of its entries matches is absent
  only when the last page said no other follows (with ``more`` declared, by
  saying false there). A listing cut short (a page that cannot be read within
  the call's time, ``max_pages`` reached, a next page on another origin, a
  page that says more follow and gives no way on) says nothing of a key it did
  not find: unknown.
* **The receipt's entry is the proof.** With ``invoke.receipt_id`` and
  ``observe.list.id``, a listing's entry with the id the effect's receipt
  holds is its proof; a matching entry with another id is recorded and marked
  a possible duplicate.
* **A lookup carries its own headers.** The key and the epoch headers
  (``idempotency_header``, ``epoch_header``) go on the invoke alone, and what
  is recorded of a request names the headers it carried.
* **An endpoint that cannot be read back is never looked at.** With
  ``"observe": "none"`` (a chat incoming webhook) the adapter's ``readable``
  is False and :meth:`HttpAdapter.observe` answers unknown without a
  request, as a command target with ``"observe": "none"`` does: the
  lifecycle verifies an effect by its receipt alone and stops an unknown
  outcome for a person, never calling again on its own.
"""

import dataclasses
import os
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from ..calls import inflight
from ..contract.templates import expand
from ..base.canonical import canonical_json, sha256_hex
from ..base.errors import InvalidInput
from ..base.fs import OsFileSystem, replace_durably
from ..base.workspace import item_problem, resolve_inside
from ..base.pointer import MISSING, matched, resolve_pointer, shown
from ..calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..contract.http import SECRET, http_problems, sensitive, split_url, unsendable
from ..contract.spec import DEFAULT_CALL_TIMEOUT, HttpRequest, HttpSave, HttpSpec, read_http
from .http_answers import (LOOK_AGAIN, MANY_NOT_NOW, PACING, Pacing, answer_word, document_of, empty, listed_document,
                           next_link, observed, partial, rate_limit_wait, refused_for_now, retry_after_seconds,
                           text_matches)
from .http_client import (BODY_LIMIT, POOL, ConnectionPool, HttpClient, Lost, NotSent, Origin, Reply, authority,
                          origin_of)
from .http_secrets import fill_secrets, fill_url, scrub, scrub_text, shown_url

__all__ = ["HttpAdapter", "http_spec", "ConnectionPool", "POOL", "LIST_BATCH", "LIST_PAGE_LIMIT"]

#: The largest JSON object answer kept whole as a receipt; a larger one is kept as its digest.
RECEIPT_BODY_LIMIT = 64 * 1024
#: The most keys one listing is matched to (``observe.list``): any number costs one listing, so the executor's.
LIST_BATCH = 1000
#: The bytes of one page of a listing read at most: a page is matched and let go, never kept.
LIST_PAGE_LIMIT = 8 * BODY_LIMIT
#: Seconds between two tries of a page of a listing that could not be read (a lost connection, a 5xx).
PAGE_AGAIN_SECONDS = 0.5
_FORM = "application/x-www-form-urlencoded"
#: Where saved answers are written: every open refuses a symbolic link at the file's own name.
_FS = OsFileSystem()


class _Located(NamedTuple):
    """Where one request goes: its origin, the path and query sent, and the whole URL as the run may record it."""

    origin: Origin
    target: str
    shown: str


def http_spec(section: Mapping[str, Any]) -> HttpSpec:
    """The spec of an ``effects.http`` section written as JSON, checked as ``contract check`` checks it: for a
    harness or a test that holds a section rather than a run (a run's is :func:`~runner.contract.spec.contract_of`'s).

    :raises InvalidInput: the section has a problem (the first, as ``contract check`` words it).
    """
    problems = http_problems({"http": section})
    if problems:
        raise InvalidInput(f"{problems[0]} (run 'contract check')")
    return read_http(section)


# -- the adapter -----------------------------------------------------------------------------------

class HttpAdapter:
    """The contract's ``effects.http`` as a :class:`runner.calls.target.Adapter` (see the module docstring).

    :param spec: the contract's ``effects.http``: a run's (:func:`~runner.contract.spec.contract_of`, read once per
        plan, so ``drive``'s adapter of each item shares it), or a section's (:func:`http_spec`).
    :param values: the item's placeholders (``item``, ``stem``, ``slug``, ``index``) and ``run_id``.
    :param workspace: the folder ``{file:PATH}`` and ``ca_file`` are relative to.
    :param timeout: seconds one call may take, connecting, sending and receiving together.
    :param environ: where ``{env:NAME}`` is read (default ``os.environ``; proxies are the process's, as urllib reads
        them).
    :param sleep: how a lookup waits before asking again (injectable).
    :param pacing: when each origin takes a request again, as its answers announced (default: the process's).
    :param receipt: the effect's receipt, when the ledger holds one: with ``invoke.receipt_id``, the id in it is the
        one a listing's entry must hold to be this effect's (an invoke's own receipt replaces it).
    :raises InvalidInput: a header's or a URL's secret cannot be read now, a URL made from a secret is no http(s)
        URL, or the environment's proxy is no http:// URL.
    """

    name = "http"
    conflicting_payload = ("not the target's to decide: the ledger binds a key to one payload, and the runner refuses "
                           "another before any call")

    def __init__(self, spec: HttpSpec, *, values: Optional[Mapping[str, Any]] = None, workspace: str = ".",
                 timeout: float = DEFAULT_CALL_TIMEOUT, pool: ConnectionPool = POOL,
                 environ: Optional[Mapping[str, str]] = None, sleep: Callable[[float], None] = time.sleep,
                 pacing: Pacing = PACING, receipt: Optional[Mapping[str, Any]] = None) -> None:
        self.spec = spec
        #: The id of what the effect's receipt says the invoke made (``invoke.receipt_id``), as text; None: no receipt
        #: names one, and a listing's matching entries are this effect's whatever their ids.
        self.receipt_id = self._receipt_id(receipt)
        self.values = dict(values or {})
        self.workspace = os.path.abspath(workspace)
        self.timeout = float(timeout)
        self.pool = pool
        self.client = HttpClient(self.timeout, pool, before_send=_deadline_passed)
        self.environ = os.environ if environ is None else environ
        self.sleep = sleep
        self.pacing = pacing
        self.deduplicates = self.spec.deduplicates
        self.retention_seconds: Optional[float] = self.spec.retention_seconds if self.deduplicates else None
        header = self.spec.idempotency_header
        self.key_scope = (f"the target's, on the {header} header" if header else
                          "none: the key is not sent to the target (it is found by the observe request)")
        observe = self.spec.observe
        #: False for ``"observe": "none"``: the endpoint cannot be read back, and the lifecycle never looks it up.
        self.readable = observe is not None
        requests = (self.spec.invoke,) if observe is None else (self.spec.invoke, observe)
        if observe is None:
            self.verification = "none: the endpoint cannot be read back; its answer is the only evidence"
        else:
            listing = observe.listing
            self.verification = f"{observe.method} {shown_url(observe.url)}" + (
                f" holding a value at {_written(observe.pointer)}" if observe.pointer is not None else "") + (
                f" read page by page to its end, an entry's {_written(listing.match)} matched to {listing.value} "
                f"({listing.how})" if listing is not None else "")
        #: What each request's statuses mean, and the conditions on the body some of them have, as the answers read
        #: them.
        self._statuses = {request.kind: dict(request.statuses) for request in requests}
        self._conditions = {request.kind: dict(request.conditions) for request in requests}
        self._origins: Dict[Tuple[str, str, int], Origin] = {}
        for request in requests:
            if not request.origin_secret:
                self._origin(request.scheme, request.host, request.port)
            # The item's own header values and URL, secrets read now: one that cannot be made or sent stops the item
            # before it begins. Any key and epoch will do: a key is an id and an epoch a number, both ASCII.
            try:
                self._headers(request, "k", 1, [])
                self._locate(request, "k", 1, [])
            except ValueError as exc:
                raise InvalidInput(f"effects.http.{request.kind}: {exc}") from None
        if self.spec.invoke.save is not None:
            self._saved_path(self.spec.invoke.save, "k")  # an item whose file cannot be inside begins nothing

    # -- the two calls -----------------------------------------------------------------------------
    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Send the payload as JSON; the answer's status says what happened (:mod:`runner.adapters.http_answers`)."""
        request = self.spec.invoke
        secrets: List[str] = []
        try:
            reply = self._exchange(request, key, epoch, _body(request.send_as, payload), secrets, self._end())
        except NotSent as exc:
            raise NotApplied(scrub_text(f"{request.method} {self._shown_url(request, key, epoch)}: {exc}",
                                        secrets)) from None
        except Lost as exc:
            raise UnknownOutcome(scrub_text(f"{request.method} {self._shown_url(request, key, epoch)}: {exc}",
                                            secrets)) from None
        retry_after = retry_after_seconds(reply.headers.get("Retry-After"))
        if retry_after is None and reply.status in (403, 429):
            retry_after = rate_limit_wait(reply.headers)  # a limit spent: nothing before its reset
        unnamed = "not-applied" if reply.status == 503 and retry_after is not None else "unknown"
        word = answer_word(self._statuses["invoke"], self._conditions["invoke"], reply, unnamed)
        if word == "receipt" and request.save is not None:
            return self._save(request, request.save, reply, key, epoch, secrets)
        if word == "receipt":
            receipt = scrub(self._receipt(request, reply, key, epoch), secrets)
            self.receipt_id = self._receipt_id(receipt)
            return receipt
        detail = scrub_text(self._answered(request, reply, key, epoch), secrets)
        if word == "not-applied":
            raise NotApplied(detail, retry_after)
        if word == "rejected":
            raise Rejected(detail)
        if word == "stale-epoch":
            raise StaleEpoch(detail)
        raise UnknownOutcome(detail)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Look the effect up; never changes anything at the target. Asks again after "not now" within the call's
        time. An endpoint that cannot be read back (``"observe": "none"``) is never asked: unknown, always."""
        request = self.spec.observe
        if request is None:
            return Observation("unknown", {
                "source": "http", "observe": "none", "request": self._shown(self.spec.invoke, key, None),
                "reason": "the endpoint cannot be read back: whether the call arrived shows only where it lands (the "
                          "channel, the recipients)"})
        if request.listing is not None:
            return self._listing([(key, payload, self)])[0]
        statuses, conditions = self._statuses["observe"], self._conditions["observe"]
        secrets: List[str] = []
        end = self._end()
        evidence: Dict[str, Any] = {"source": "http", "request": self._shown(request, key, None)}
        while True:
            try:
                reply = self._exchange(request, key, None, None, secrets, end)
            except NotSent as exc:
                if exc.final:
                    return Observation("unknown", scrub(dict(evidence, reason=str(exc)[:500]), secrets))
                reason, wait = str(exc), 0.5
            except Lost as exc:
                return Observation("unknown", scrub(dict(evidence, reason=str(exc)[:500]), secrets))
            else:
                word = answer_word(statuses, conditions, reply)
                refused, named = refused_for_now(reply)
                if refused and word == "unknown":
                    # "Not now": the executor waits for it as for an invoke's, and every call to the target with it.
                    raise NotApplied(scrub_text(self._answered(request, reply, key, None), secrets), named)
                if reply.status not in LOOK_AGAIN or word != "unknown":
                    seen = observed(statuses, request.pointer, reply, evidence, conditions)
                    return Observation(seen.status, scrub(seen.evidence, secrets))
                reason = self._answered(request, reply, key, None)
                asked = retry_after_seconds(reply.headers.get("Retry-After"))
                wait = 0.5 if asked is None else asked
            if time.monotonic() + wait >= end:
                return Observation("unknown", scrub(dict(evidence, reason=reason[:500]), secrets))
            self.sleep(wait)

    @property
    def batch_key(self) -> Optional[Tuple[Any, ...]]:
        """Adapters with one ``batch_key`` may be looked up together by :meth:`observe_many` (None: no
        ``observe.many``)."""
        observe = self.spec.observe
        if observe is None or (observe.many is None and observe.listing is None):
            return None
        return ("http", self.spec, self.workspace)

    @property
    def observe_batch(self) -> int:
        """The most keys one :meth:`observe_many` asks for."""
        many = self._look.many
        return LIST_BATCH if self.lists else many.most if many is not None else 1

    @property
    def lists(self) -> bool:
        """True when a lookup reads one listing of the target (``observe.list``), the same whatever keys it is for:
        one at a time answers every key waiting, and a key's own lookup is that listing too."""
        return self.spec.observe is not None and self.spec.observe.listing is not None

    @property
    def _look(self) -> HttpRequest:
        """The observe request; only a contract whose endpoint can be read back has one (the lifecycle asks no
        other to look).

        :raises InvalidInput: ``"observe": "none"``.
        """
        if self.spec.observe is None:
            raise InvalidInput('effects.http.observe is "none": the endpoint cannot be read back, nothing looks it up')
        return self.spec.observe

    def observe_many(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        """Look several keys up with one request (``observe.many``), in the order given.

        Each item is ``(key, payload, adapter)``: its adapter holds the key's
        placeholders. The URL's ``{each:...}`` is filled for every key and the
        parts joined with ``&``; the answer's list (at ``list``) is matched back
        to each key by the value at ``match`` equal to the key's ``value``. A
        key with a match is present (``matches`` says how many), whatever the
        paging. A key with none is absent only when the answer is whole
        (:func:`~runner.adapters.http_answers.partial`); otherwise it is
        ``unseen``: this answer could not have shown it, and the key's own
        lookup must. Any status but 200, an answer that is not a list, or a lost
        connection says nothing of any key: all unseen.

        :raises NotApplied: the lookup was refused for now (408, 429, 503, or no connection).
        :raises Rejected: the target refuses this lookup (any other 4xx, such as 414 or 400): ask key by key.
        """
        if self.lists:
            return self._listing(items)
        many = self._look.many
        if many is None:
            raise InvalidInput("this contract's observe request names no 'many': keys are looked up one by one")
        parts, wanted = [], []
        for key, _payload, adapter in items:
            values = dict(getattr(adapter, "values", self.values), key=key)
            parts.append(expand([many.each], _encoded(values))[0])
            wanted.append(expand([many.value], values)[0])
        request = dataclasses.replace(many.request, rest=many.request.rest.replace("{each}", "&".join(parts)))
        first = items[0][0]
        secrets: List[str] = []
        evidence: Dict[str, Any] = {"source": "http", "request": self._shown(request, first, None), "keys": len(items)}

        def unseen(reason: str) -> List[Observation]:
            return [Observation("unseen", scrub(dict(evidence, reason=reason[:500]), secrets)) for _ in items]

        try:
            reply = self._exchange(request, first, None, None, secrets, self._end())
        except NotSent as exc:
            if exc.final:
                return unseen(str(exc))
            raise NotApplied(str(exc)) from None
        except Lost as exc:
            return unseen(str(exc))
        refused, named = refused_for_now(reply)
        if reply.status in MANY_NOT_NOW or refused:
            raise NotApplied(scrub_text(self._answered(request, reply, first, None), secrets),
                             named if refused else retry_after_seconds(reply.headers.get("Retry-After")))
        if 400 <= reply.status < 500:
            raise Rejected(scrub_text(self._answered(request, reply, first, None), secrets))
        document = document_of(reply.body) if reply.whole and reply.status == 200 else MISSING
        listed = resolve_pointer(document, many.list) if document is not MISSING else MISSING
        if not isinstance(listed, list):
            return unseen(self._answered(request, reply, first, None) + " (not a list to match the keys against)")
        cut = partial(reply, document, listed, many.page_size, many.next)
        found = matched(listed, many.match)
        out = []
        for want in wanted:
            matches = found.get(want, [])
            seen = dict(evidence, status=reply.status, matches=len(matches))
            if matches:
                seen["found"] = shown(matches[0])
            elif cut:
                seen["reason"] = cut
            out.append(Observation("present" if matches else "unseen" if cut else "absent", scrub(seen, secrets)))
        return out

    # -- answers ---------------------------------------------------------------------------------------
    def _receipt_id(self, receipt: Optional[Mapping[str, Any]]) -> Optional[str]:
        """The text or whole number ``receipt`` holds at ``invoke.receipt_id``, as text; None when it holds none."""
        pointer = self.spec.invoke.receipt_id
        if pointer is None or not isinstance(receipt, Mapping):
            return None
        return _id_text(resolve_pointer(receipt, pointer))

    def _receipt(self, request: HttpRequest, reply: Reply, key: str, epoch: Optional[int]) -> Dict[str, Any]:
        """The JSON object answered, when there is one of a sane size; else the status, chosen headers and the body's
        digest."""
        if reply.whole and len(reply.body) <= RECEIPT_BODY_LIMIT:
            found = document_of(reply.body)
            if isinstance(found, dict):
                return found
        kept = {name: reply.headers.get(name) for name in request.receipt_headers
                if reply.headers.get(name) is not None}
        return {"status": reply.status, "headers": kept, "body_sha256": sha256_hex(reply.body),
                "body_bytes": len(reply.body), "request": self._shown(request, key, epoch)}

    def _saved_path(self, save: HttpSave, key: str) -> Tuple[str, str]:
        """``(the path as the contract's template made it, its real path)`` of the file the item's answer is kept in.

        :raises InvalidInput: the path is absolute, holds ``..`` or a NUL, or a symbolic link leads it outside the
            workspace.
        """
        written = expand([save.path], dict(self.values, key=key))[0]
        problem = item_problem(written)
        if problem:
            raise InvalidInput(f"effects.http.invoke.save.path {written[:200]!r} {problem}; the answer is kept inside "
                               f"the workspace {self.workspace}")
        return written, resolve_inside(self.workspace, written, f"effects.http.invoke.save.path {written[:200]!r}")

    def _save(self, request: HttpRequest, save: HttpSave, reply: Reply, key: str, epoch: Optional[int],
              secrets: List[str]) -> Dict[str, Any]:
        """Write the answer the run keeps to the item's file, atomically, and return the receipt that names it.

        The receipt is the answer (as :meth:`_receipt` keeps it) with the value kept replaced by ``sha256:HEX``, and
        ``saved``: the file's path as the template made it, its size and its SHA-256.

        :raises Rejected: the answer holds nothing at the pointer (or null), or is cut: there is nothing to keep.
        :raises UnknownOutcome: the file could not be written; the target answered, and nothing records it.
        """
        receipt = self._receipt(request, reply, key, epoch)
        if save.pointer is None:
            if not reply.whole:
                raise Rejected(scrub_text(f"{self._answered(request, reply, key, epoch)} (longer than "
                                          f"{BODY_LIMIT // (1024 * 1024)} MiB: the answer to save was cut)", secrets))
            data = reply.body
        else:
            document = document_of(reply.body) if reply.whole else MISSING
            value = resolve_pointer(document, save.pointer) if document is not MISSING else MISSING
            if value is MISSING or value is None:
                raise Rejected(scrub_text(f"{self._answered(request, reply, key, epoch)} (nothing at "
                                          f"{save.written} to save)", secrets))
            data = value.encode("utf-8") if isinstance(value, str) else canonical_json(value)
            digest = f"sha256:{sha256_hex(data)}"
            if isinstance(receipt, dict) and resolve_pointer(receipt, save.pointer) is not MISSING:
                receipt = _replaced(receipt, save.pointer, digest)  # the answer is in the file, not the ledger too
        written, real = "", ""
        try:
            written, real = self._saved_path(save, key)
            os.makedirs(os.path.dirname(real), exist_ok=True)
            replace_durably(_FS, real, data)
        except (OSError, InvalidInput) as exc:
            reason = exc.message if isinstance(exc, InvalidInput) else (exc.strerror or str(exc))
            raise UnknownOutcome(scrub_text(f"{request.method} {self._shown_url(request, key, epoch)} answered "
                                            f"{reply.status}, and its answer could not be saved to "
                                            f"{written or save.path}: {reason}", secrets)) from None
        receipt = scrub(receipt, secrets)
        receipt["saved"] = {"path": written, "bytes": len(data), "sha256": sha256_hex(data)}
        return receipt

    def _answered(self, request: HttpRequest, reply: Reply, key: str, epoch: Optional[int]) -> str:
        text = " ".join(reply.body[:300].decode("utf-8", "replace").split())[:200]
        said = f"{request.method} {self._shown_url(request, key, epoch)} answered {reply.status} {reply.reason}"
        return said + (f": {text}" if text else "")

    def _shown(self, request: HttpRequest, key: str, epoch: Optional[int]) -> Dict[str, Any]:
        """The request as it may be recorded: method, URL and the names (never the values) of the headers sent."""
        names = [name for name, _ in request.headers]
        if request.kind == "invoke":  # the headers the runner writes go on the invoke alone (see _headers)
            names += [h for h in (self.spec.idempotency_header, self.spec.epoch_header) if h]
        return {"method": request.method, "url": self._shown_url(request, key, epoch),
                "headers": sorted(names, key=str.lower)}

    def _shown_url(self, request: HttpRequest, key: str, epoch: Optional[int]) -> str:
        """The URL as the run may record it: placeholders filled, each secret ``[secret]`` (no secret is read)."""
        shown = shown_url(self._filled(request, key, epoch))
        if request.origin_secret:
            return shown
        return f"{request.scheme}://{authority(request.scheme, request.host, request.port)}{shown}"

    # -- listings -------------------------------------------------------------------------------------
    def _listing(self, items: Sequence[Tuple[str, Dict[str, Any], Any]]) -> List[Observation]:
        """The target's listing read page by page to its end (``observe.list``), and what it says of each key.

        Each item is ``(key, payload, adapter)``, its adapter holding the key's
        placeholders. An entry matches a key when its text at ``match``
        matches the key's ``value`` (``how``). A key with a match is present
        (``matches`` says how many; more than one is a possible duplicate); a
        key with none is absent only when the last page read said no other
        follows, and unknown when the listing was cut short.

        :raises NotApplied: a page was answered "not now", or the target announced no request before a reset: the
            listing is read again later, whole.
        """
        request = self._look
        listing = request.listing
        assert listing is not None
        first = items[0][0]
        wanted = [expand([listing.value], dict(getattr(adapter, "values", self.values), key=key))[0]
                  for key, _payload, adapter in items]
        secrets: List[str] = []
        end = self._end()
        evidence: Dict[str, Any] = {"source": "http", "request": self._shown(request, first, None), "keys": len(items)}
        found: List[List[Any]] = [[] for _ in wanted]
        by_text: Dict[str, List[int]] = {}
        for index, want in enumerate(wanted):
            by_text.setdefault(want.strip() if listing.how == "first_line" else want, []).append(index)
        pages = listed = 0
        cut: Optional[str] = None
        try:
            located = self._locate(request, first, None, secrets)
            headers = self._headers(request, first, None, secrets)
        except ValueError as exc:
            located, cut = None, str(exc)
        target = located.target if located is not None else ""
        first_number = _page_number(target, listing.param) if listing.pages == "param" else 1
        read = set()
        while located is not None:
            if pages >= listing.max_pages:
                cut = (f"the listing has more than max_pages ({listing.max_pages}) pages: raise max_pages, or list "
                       "fewer entries (a filter in the URL)")
                break
            read.add(target)
            shown_page = located.shown if not pages else f"{located.shown} (page {pages + 1})"
            page = self._page(request, located._replace(target=target, shown=shown_page), headers, end, secrets)
            pages += 1
            if isinstance(page, str):
                cut = page
                break
            document, reply = page
            entries = resolve_pointer(document, listing.list)
            if not isinstance(entries, list):
                cut = f"page {pages} of the listing holds no list at {_written(listing.list) or 'its root'}"
                break
            listed += len(entries)
            for entry in entries:
                for index in self._matching(listing.how, resolve_pointer(entry, listing.match), wanted, by_text):
                    found[index].append(entry)
            following = self._next_page(located, target, document, reply, entries, pages, first_number)
            if following is None:
                break
            if isinstance(following, tuple):
                cut = following[0]
                break
            if following in read:
                cut = "the listing's next page is one it has read already"
                break
            target = following
        out = []
        for matches, (_key, _payload, adapter) in zip(found, items):
            seen = dict(evidence, pages=pages, listed=listed, matches=len(matches))
            own = getattr(adapter, "receipt_id", None) if listing.id is not None else None
            if matches and own is not None:
                # The receipt names what the invoke made: its entry is the proof, and an entry with another id a
                # possible duplicate (made by an earlier call whose answer was lost, or by another writer).
                ids = [_id_text(resolve_pointer(entry, listing.id or ())) for entry in matches]
                matches = [e for e, i in zip(matches, ids) if i == own] + [e for e, i in zip(matches, ids) if i != own]
                seen["receipt_id"] = own
                seen["receipt_listed"] = own in ids
                others = [i for i in ids if i != own]
                if others:
                    seen["possible_duplicate"] = True
                    seen["other_ids"] = others[:4]
            if matches:
                seen["found"] = shown(_summary(matches[0]))
                if len(matches) > 1:
                    seen["possible_duplicate"] = True  # two entries for one item: one may be a duplicate
                    seen["also_found"] = [shown(_summary(entry)) for entry in matches[1:4]]
                status = "present"
            elif cut is not None:
                seen["reason"] = cut[:500]
                status = "unknown"
            else:
                seen["whole"] = True
                status = "absent"
            out.append(Observation(status, scrub(seen, secrets)))
        return out

    @staticmethod
    def _matching(how: str, value: Any, wanted: Sequence[str], by_text: Mapping[str, List[int]]) -> List[int]:
        """The indexes of the keys whose ``wanted`` text an entry's ``value`` matches (see
        :func:`~runner.adapters.http_answers.text_matches`)."""
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return []
        if how == "equals":
            return by_text.get(str(value), [])
        if how == "first_line":
            lines = str(value).splitlines()
            return by_text.get(lines[0].strip(), []) if lines else []
        return [index for index, want in enumerate(wanted) if text_matches(value, want, how)]

    def _next_page(self, located: _Located, target: str, document: Any, reply: Reply, entries: List[Any],
                   number: int, first: int) -> Union[None, str, Tuple[str]]:
        """The path and query of the listing's next page; None after its last page; ``(why,)`` when the next page
        cannot be followed (the listing is cut short there). ``number``: the page's, from 1; ``first``: the page
        number (``pages`` ``param``) of the listing's first page.

        With ``more`` declared, the page's own word ends the listing: false is its last page, true asks for a next
        page, and a page that says true with no way on (no next link, no entries, no cursor) cuts the listing short,
        as does one that says neither. Without it, a page ends the listing as its form says (no next link; no
        entries; no cursor).
        """
        listing = self._look.listing
        assert listing is not None
        more = False
        if listing.more is not None:
            said = resolve_pointer(document, listing.more)
            if said is False:
                return None
            if said is not True:
                return (f"page {number} of the listing holds neither true nor false at {_written(listing.more)}: the "
                        "listing was not read to its end",)
            more = True
        if listing.pages == "link":
            link = next_link(reply.headers)
            if link is None and more:
                return (f"page {number} of the listing says more follow (at {_written(listing.more or ())}) but its "
                        'answer has no Link rel="next": the listing was not read to its end',)
            if link is None:
                return None
            origin = located.origin
            here = f"{origin.scheme}://{authority(origin.scheme, origin.host, origin.port)}{target}"
            parts = urllib.parse.urlsplit(urllib.parse.urljoin(here, link))
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                port = -1
            if (parts.scheme, parts.hostname, port) != (origin.scheme, origin.host, origin.port):
                return ("the next page's Link leads to another origin (or is no URL): it is not followed, so the "
                        "listing was not read to its end",)
            return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if listing.pages == "param":
            if not entries:
                return (f"page {number} of the listing says more follow (at {_written(listing.more or ())}) but holds "
                        "no entries: the listing was not read to its end",) if more else None
            return _with_param(located.target, listing.param or "", str(first + number))
        if listing.pages == "cursor":
            cursor = resolve_pointer(document, listing.cursor or ())
            where = f"the cursor at {_written(listing.cursor or ())}"
        else:
            cursor = resolve_pointer(entries[-1], listing.after_last or ()) if entries else MISSING
            where = f"the last entry's {_written(listing.after_last or ())}"
        if cursor is False or empty(cursor):
            if entries and listing.pages == "after_last":  # entries, but no id to go on from: more may follow
                return (f"page {number} of the listing holds entries but {where} is empty: the listing was not read "
                        "to its end",)
            if not more:
                return None
            return (f"page {number} of the listing says more follow (at {_written(listing.more or ())}) but "
                    f"{'holds no entries' if not entries else 'names no next page: ' + where + ' is empty'}: the "
                    "listing was not read to its end",)
        if isinstance(cursor, (dict, list, bool)) or (isinstance(cursor, float) and not cursor.is_integer()):
            return (f"{where} is no text or whole number: the listing was not read to its end",)
        return _with_param(located.target, listing.param or "", str(cursor))

    def _page(self, request: HttpRequest, located: _Located, headers: Dict[str, str], end: float,
              secrets: List[str]) -> Union[str, Tuple[Any, Reply]]:
        """One page of the listing (``located``: where it is, and how it is shown: the listing's URL as the contract
        wrote it and the page's number, never a URL a page named, which may hold a secret too short to scrub):
        ``(its JSON document, the answer)``, or why it could not be read.

        A page that could not be read for now (no connection, a lost answer, a 5xx, a 408) is asked again within
        the call's time; any other answer but a 200 with JSON ends the listing there.

        :raises NotApplied: the page was answered "not now", or its origin announced no request before a reset.
        """
        page_url = located.shown
        while True:
            try:
                reply = self._send(request, located, headers, None, end, LIST_PAGE_LIMIT)
            except NotSent as exc:
                if exc.final:
                    return str(exc)
                reason = str(exc)
            except Lost as exc:
                reason = str(exc)
            else:
                text = " ".join(reply.body[:300].decode("utf-8", "replace").split())[:200]
                said = f"GET {page_url} answered {reply.status} {reply.reason}" + (f": {text}" if text else "")
                refused, named = refused_for_now(reply)
                if refused:
                    raise NotApplied(scrub_text(said, secrets), named)
                if reply.status == 200:
                    document = listed_document(reply)
                    if document is not MISSING:
                        return document, reply
                    return (f"GET {page_url} answered a page that is not JSON (or longer than "
                            f"{LIST_PAGE_LIMIT // (1024 * 1024)} MiB)")
                if reply.status not in LOOK_AGAIN and reply.status < 500:
                    return scrub_text(said, secrets)
                reason = said
            if time.monotonic() + PAGE_AGAIN_SECONDS >= end:
                return scrub_text(f"{reason} (the call's {self.timeout:g}s are spent)", secrets)
            self.sleep(PAGE_AGAIN_SECONDS)

    # -- requests -------------------------------------------------------------------------------------
    def _filled(self, request: HttpRequest, key: str, epoch: Optional[int]) -> str:
        """The URL's template with its placeholders filled, each percent-encoded where it lands (a value is always one
        segment); its secrets still as written. The path and query; the whole URL where the origin is a secret's."""
        values = dict(self.values, key=key, epoch="" if epoch is None else int(epoch))
        return expand([request.rest], _encoded(values))[0]

    def _locate(self, request: HttpRequest, key: str, epoch: Optional[int], secrets: List[str]) -> _Located:
        """Where the request goes: its URL filled, its secrets read now (``secrets`` gets each value, and where a
        secret names the host, the host too).

        :raises ValueError: a secret cannot be read, or the URL it makes is no http(s) URL (never quoting a value).
        """
        filled = self._filled(request, key, epoch)
        if not request.origin_secret:
            origin = self._origin(request.scheme, request.host, request.port)
            shown = f"{request.scheme}://{authority(request.scheme, request.host, request.port)}{shown_url(filled)}"
            sent = fill_url(filled, self.workspace, self.environ, secrets) if SECRET.search(filled) else filled
            return _Located(origin, sent, shown)
        url = fill_url(filled, self.workspace, self.environ, secrets)
        try:
            scheme, host, port, target = split_url(url)
        except ValueError as exc:
            names = ", ".join(sorted({f"{{{kind}:{name}}}" for kind, name in SECRET.findall(filled)}))
            raise ValueError(f"the URL made from {names} cannot be used: {exc}") from None
        where = authority(scheme, host, port)
        secrets.extend((f"{scheme}://{where}", where, host, target))  # where a secret leads is part of the secret
        try:
            origin = self._origin(scheme, host, port)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return _Located(origin, target, shown_url(filled))

    def _headers(self, request: HttpRequest, key: str, epoch: Optional[int], secrets: List[str]) -> Dict[str, str]:
        """The headers to send: placeholders filled, then ``{env:...}`` and ``{file:...}`` read now (``secrets`` gets
        each value).

        :raises ValueError: a secret cannot be read, or a value holds what HTTP cannot carry (the message names the
            header, never a value).
        """
        values = dict(self.values, key=key, epoch="" if epoch is None else int(epoch))
        out: Dict[str, str] = {}
        for name, template in request.headers:
            out[name] = fill_secrets(name, expand([template], values)[0], self.workspace, self.environ, secrets)
            if sensitive(name):
                secrets.append(out[name])
            problem = unsendable(out[name])
            if problem:
                raise ValueError(f"the value of header {name} cannot be sent: it holds {problem}")
        lowered = {n.lower() for n in out}
        if request.kind == "invoke":
            if self.spec.idempotency_header:
                out[self.spec.idempotency_header] = key
            if self.spec.epoch_header and epoch is not None:
                out[self.spec.epoch_header] = str(int(epoch))
            if "content-type" not in lowered:
                out["Content-Type"] = _FORM if request.send_as == "form" else "application/json"
        if "accept" not in lowered:
            out["Accept"] = "application/json"
        if "user-agent" not in lowered:
            out["User-Agent"] = "long-running-agent-sessions-runner"
        secrets.sort(key=len, reverse=True)  # a longer value first, so a secret inside another is replaced whole
        return out

    def _origin(self, scheme: str, host: str, port: int) -> Origin:
        """Where connections to ``scheme://host:port`` go: straight to the host, or through the environment's proxy for
        its scheme (made once per adapter and origin)."""
        found = self._origins.get((scheme, host, port))
        if found is None:
            ca_file = os.path.join(self.workspace, self.spec.ca_file) if self.spec.ca_file else None
            found = self._origins[(scheme, host, port)] = origin_of(scheme, host, port, ca_file)
        return found

    def _end(self) -> float:
        """The monotonic moment this call must be over: its own time, or the registered call's deadline if sooner."""
        end = time.monotonic() + self.timeout
        making = inflight.current()
        if making is not None:
            registry, call = making
            end = min(end, time.monotonic() + float(call.record["deadline"]) - registry.clock())
        return end

    def _exchange(self, request: HttpRequest, key: str, epoch: Optional[int], body: Optional[bytes], secrets: List[str],
                  end: float) -> Reply:
        """One request and its answer, before ``end`` (monotonic seconds).

        :raises NotSent: nothing of the request left this process (a header or a URL that cannot be made among the
            causes).
        :raises Lost: the request was sent, perhaps in part, and no whole answer came back.
        :raises NotApplied: the target announced no request before a reset that has not come (nothing was sent).
        """
        try:
            located = self._locate(request, key, epoch, secrets)
            headers = self._headers(request, key, epoch, secrets)
        except ValueError as exc:
            raise NotSent(str(exc), final=True) from None
        return self._send(request, located, headers, body, end)

    def _send(self, request: HttpRequest, located: _Located, headers: Dict[str, str], body: Optional[bytes],
              end: float, limit: int = BODY_LIMIT) -> Reply:
        """Send one request where ``located`` says, unless its origin announced no request before a reset; keep what
        its answer announces of the rate limit."""
        origin = located.origin
        where = (origin.scheme, origin.host, origin.port)
        left = self.pacing.left(where)
        if left is not None:
            raise NotApplied(f"{request.method} {located.shown}: the target said no request is left before its rate "
                             f"limit resets, in {left:.0f}s; nothing was sent", left)
        # A lookup changes nothing: sent again on a new connection when a reused one closed as it went out.
        reply = self.client.exchange(origin, request.method, located.target, headers, body, end,
                                     idempotent=request.kind == "observe", limit=limit)
        self.pacing.heard(where, reply.headers)
        return reply


def _written(pointer: Sequence[str]) -> str:
    """A JSON pointer as a contract writes it: the inverse of :func:`~runner.base.pointer.parse_pointer` on every
    pointer the contract's checks accept."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in pointer)


def _replaced(document: Dict[str, Any], pointer: Sequence[str], value: Any) -> Dict[str, Any]:
    """A copy of ``document`` with ``value`` at ``pointer`` (which leads to a value in it), the rest shared."""
    def at(here: Any, tokens: Sequence[str]) -> Any:
        if not tokens:
            return value
        if isinstance(here, dict):
            return dict(here, **{tokens[0]: at(here[tokens[0]], tokens[1:])})
        index = int(tokens[0])
        return here[:index] + [at(here[index], tokens[1:])] + here[index + 1:]
    return at(document, pointer)


def _encoded(values: Mapping[str, Any]) -> Dict[str, Any]:
    """``values`` as a URL holds them: each percent-encoded whole (a value is always one segment), whole numbers as
    they are."""
    return {name: value if isinstance(value, int) and not isinstance(value, bool)
            else urllib.parse.quote(str(value), safe="") for name, value in values.items()}


#: The most fields of a listing's entry its evidence keeps, and the longest text among them.
SUMMARY_FIELDS, SUMMARY_TEXT = 12, 200


def _id_text(value: Any) -> Optional[str]:
    """An id as text: a string or a whole number (a receipt's and a listing's alike); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)


def _summary(entry: Any) -> Any:
    """What evidence keeps of a listing's entry: an object's fields that are numbers, true or false, or short text
    (an issue's id, number, title, state and URLs, never its body), so a person can find it; anything else whole."""
    if not isinstance(entry, dict):
        return entry
    kept = {name: value for name, value in entry.items()
            if isinstance(value, (int, float, bool)) or (isinstance(value, str) and len(value) <= SUMMARY_TEXT)}
    return dict(list(kept.items())[:SUMMARY_FIELDS])


def _body(send_as: str, payload: Dict[str, Any]) -> bytes:
    """The invoke's body: the payload as canonical JSON, or as form fields (``send_as`` ``form``).

    A form holds each field in key order, with the brackets Rails, PHP and Stripe read: text as it is, a number or
    true/false as JSON writes it, null as nothing; an object's fields as ``name[field]``, to any depth; a list's
    elements as fields of the list's name at the payload's top (``to=a&to=b``, an HTML form's repeated field) and as
    ``name[]`` inside an object (``metadata[tags][]=a``), but an element that is an object or a list as
    ``name[INDEX]`` (``items[0][price]=p``), the one form that keeps each element's fields together. An empty object
    or list sends no field.
    """
    if send_as != "form":
        return canonical_json(payload)
    pairs: List[Tuple[str, str]] = []
    for name in sorted(payload):
        _form_fields(name, payload[name], pairs, top=True)
    return urllib.parse.urlencode(pairs).encode("ascii")


def _form_fields(name: str, value: Any, pairs: List[Tuple[str, str]], top: bool = False) -> None:
    """Append the form fields of ``value`` named ``name`` to ``pairs`` (see :func:`_body`)."""
    if isinstance(value, dict):
        for field in sorted(value):
            _form_fields(f"{name}[{field}]", value[field], pairs)
    elif isinstance(value, list):
        for index, one in enumerate(value):
            if isinstance(one, (dict, list)):
                _form_fields(f"{name}[{index}]", one, pairs)
            else:
                pairs.append((name if top else f"{name}[]", _form_text(one)))
    else:
        pairs.append((name, _form_text(value)))


def _form_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return canonical_json(value).decode("utf-8")


def _page_number(target: str, param: Optional[str]) -> int:
    """The number of the listing's first page: its ``param`` in the URL's query, else 1."""
    for part in urllib.parse.urlsplit(target).query.split("&"):
        name, _, value = part.partition("=")
        if urllib.parse.unquote_plus(name) == param and value.isdigit():
            return int(value)
    return 1


def _with_param(target: str, param: str, value: str) -> str:
    """``target`` (a path and query) with the query parameter ``param`` set to ``value`` (percent-encoded), the
    other parameters as they were written."""
    path, _, query = target.partition("?")
    kept = [part for part in query.split("&") if part and urllib.parse.unquote_plus(part.partition("=")[0]) != param]
    kept.append(f"{urllib.parse.quote(param, safe='')}={urllib.parse.quote(value, safe='')}")
    return f"{path}?{'&'.join(kept)}"


def _deadline_passed() -> Optional[str]:
    """Why a request must not be sent now: the registered call's deadline passed (the process was held up), or None."""
    making = inflight.current()
    if making is not None and making[0].clock() >= float(making[1].record["deadline"]):
        return "the call's deadline passed before the request was sent (the process was held up); nothing was sent"
    return None
