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
  evidence and reasons name the headers sent, never their values, and any
  text of the target's answer that holds a secret value has it replaced by
  ``[secret]`` before it is returned.
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
  one byte at a time cannot stretch it.
"""

import dataclasses
import os
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..calls import inflight
from ..contract.templates import expand
from ..base.canonical import canonical_json, sha256_hex
from ..base.errors import InvalidInput
from ..base.pointer import MISSING, matched, resolve_pointer, shown
from ..calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..contract.http import http_problems, sensitive, unsendable
from ..contract.spec import DEFAULT_CALL_TIMEOUT, HttpRequest, HttpSpec, read_http
from .http_answers import (LOOK_AGAIN, MANY_NOT_NOW, document_of, invoke_outcome, observed, outcome_of, partial,
                           retry_after_seconds)
from .http_client import POOL, ConnectionPool, HttpClient, Lost, NotSent, Origin, Reply, authority, origin_of
from .http_secrets import fill_secrets, scrub, scrub_text

__all__ = ["HttpAdapter", "http_spec", "ConnectionPool", "POOL"]

#: The largest JSON object answer kept whole as a receipt; a larger one is kept as its digest.
RECEIPT_BODY_LIMIT = 64 * 1024


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
    :raises InvalidInput: a header's secret cannot be read now, or the environment's proxy is no http:// URL.
    """

    name = "http"
    conflicting_payload = ("not the target's to decide: the ledger binds a key to one payload, and the runner refuses "
                           "another before any call")

    def __init__(self, spec: HttpSpec, *, values: Optional[Mapping[str, Any]] = None, workspace: str = ".",
                 timeout: float = DEFAULT_CALL_TIMEOUT, pool: ConnectionPool = POOL,
                 environ: Optional[Mapping[str, str]] = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.values = dict(values or {})
        self.workspace = os.path.abspath(workspace)
        self.timeout = float(timeout)
        self.pool = pool
        self.client = HttpClient(self.timeout, pool, before_send=_deadline_passed)
        self.environ = os.environ if environ is None else environ
        self.sleep = sleep
        self.deduplicates = self.spec.deduplicates
        self.retention_seconds: Optional[float] = self.spec.retention_seconds if self.deduplicates else None
        header = self.spec.idempotency_header
        self.key_scope = (f"the target's, on the {header} header" if header else
                          "none: the key is not sent to the target (it is found by the observe request)")
        observe = self.spec.observe
        self.verification = f"{observe.method} {observe.url}" + (
            f" holding a value at {_written(observe.pointer)}" if observe.pointer is not None else "")
        #: What each request's statuses mean, as the answers read them.
        self._statuses = {request.kind: dict(request.statuses) for request in (self.spec.invoke, observe)}
        self._origins = {request.kind: self._origin(request) for request in (self.spec.invoke, observe)}
        for request in (self.spec.invoke, observe):
            # The item's own header values, secrets read now: one that cannot be made or sent stops the item before it
            # begins. Any key and epoch will do: a key is an id and an epoch a number, both ASCII.
            try:
                self._headers(request, "k", 1, [])
            except ValueError as exc:
                raise InvalidInput(f"effects.http.{request.kind}: {exc}") from None

    # -- the two calls -----------------------------------------------------------------------------
    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Send the payload as JSON; the answer's status says what happened (:mod:`runner.adapters.http_answers`)."""
        request = self.spec.invoke
        secrets: List[str] = []
        try:
            reply = self._exchange(request, key, epoch, canonical_json(payload), secrets, self._end())
        except NotSent as exc:
            raise NotApplied(scrub_text(f"{request.method} {self._shown_url(request, key, epoch)}: {exc}",
                                        secrets)) from None
        except Lost as exc:
            raise UnknownOutcome(scrub_text(f"{request.method} {self._shown_url(request, key, epoch)}: {exc}",
                                            secrets)) from None
        retry_after = retry_after_seconds(reply.headers.get("Retry-After"))
        word = invoke_outcome(self._statuses["invoke"], reply.status, retry_after)
        if word == "receipt":
            return scrub(self._receipt(request, reply, key, epoch), secrets)
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
        time."""
        request = self.spec.observe
        statuses = self._statuses["observe"]
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
                if reply.status not in LOOK_AGAIN or outcome_of(statuses, reply.status) != "unknown":
                    seen = observed(statuses, request.pointer, reply, evidence)
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
        return None if self.spec.observe.many is None else ("http", self.spec, self.workspace)

    @property
    def observe_batch(self) -> int:
        """The most keys one :meth:`observe_many` asks for."""
        many = self.spec.observe.many
        return many.most if many is not None else 1

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
        many = self.spec.observe.many
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
        if reply.status in MANY_NOT_NOW:
            raise NotApplied(self._answered(request, reply, first, None),
                             retry_after_seconds(reply.headers.get("Retry-After")))
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

    def _answered(self, request: HttpRequest, reply: Reply, key: str, epoch: Optional[int]) -> str:
        text = " ".join(reply.body[:300].decode("utf-8", "replace").split())[:200]
        said = f"{request.method} {self._shown_url(request, key, epoch)} answered {reply.status} {reply.reason}"
        return said + (f": {text}" if text else "")

    def _shown(self, request: HttpRequest, key: str, epoch: Optional[int]) -> Dict[str, Any]:
        """The request as it may be recorded: method, URL and the names (never the values) of the headers sent."""
        names = [name for name, _ in request.headers]
        managed = (self.spec.idempotency_header, self.spec.epoch_header if request.kind == "invoke" else None)
        names += [h for h in managed if h]
        return {"method": request.method, "url": self._shown_url(request, key, epoch),
                "headers": sorted(names, key=str.lower)}

    def _shown_url(self, request: HttpRequest, key: str, epoch: Optional[int]) -> str:
        where = authority(request.scheme, request.host, request.port)
        return f"{request.scheme}://{where}{self._target(request, key, epoch)}"

    # -- requests -------------------------------------------------------------------------------------
    def _target(self, request: HttpRequest, key: str, epoch: Optional[int]) -> str:
        """The path and query, each placeholder percent-encoded where it lands (a value is always one segment)."""
        values = dict(self.values, key=key, epoch="" if epoch is None else int(epoch))
        return expand([request.rest], _encoded(values))[0]

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
                out["Content-Type"] = "application/json"
        if "accept" not in lowered:
            out["Accept"] = "application/json"
        if "user-agent" not in lowered:
            out["User-Agent"] = "long-running-agent-sessions-runner"
        secrets.sort(key=len, reverse=True)  # a longer value first, so a secret inside another is replaced whole
        return out

    def _origin(self, request: HttpRequest) -> Origin:
        """Where connections for ``request`` go: straight to the host, or through the environment's proxy for its
        scheme."""
        ca_file = os.path.join(self.workspace, self.spec.ca_file) if self.spec.ca_file else None
        return origin_of(request.scheme, request.host, request.port, ca_file)

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

        :raises NotSent: nothing of the request left this process (a header that cannot be made among the causes).
        :raises Lost: the request was sent, perhaps in part, and no whole answer came back.
        """
        try:
            headers = self._headers(request, key, epoch, secrets)
        except ValueError as exc:
            raise NotSent(str(exc), final=True) from None
        # A lookup changes nothing: sent again on a new connection when a reused one closed as it went out.
        return self.client.exchange(self._origins[request.kind], request.method, self._target(request, key, epoch),
                                    headers, body, end, idempotent=request.kind == "observe")


def _written(pointer: Sequence[str]) -> str:
    """A JSON pointer as a contract writes it: the inverse of :func:`~runner.base.pointer.parse_pointer` on every
    pointer the contract's checks accept."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in pointer)


def _encoded(values: Mapping[str, Any]) -> Dict[str, Any]:
    """``values`` as a URL holds them: each percent-encoded whole (a value is always one segment), whole numbers as
    they are."""
    return {name: value if isinstance(value, int) and not isinstance(value, bool)
            else urllib.parse.quote(str(value), safe="") for name, value in values.items()}


def _deadline_passed() -> Optional[str]:
    """Why a request must not be sent now: the registered call's deadline passed (the process was held up), or None."""
    making = inflight.current()
    if making is not None and making[0].clock() >= float(making[1].record["deadline"]):
        return "the call's deadline passed before the request was sent (the process was held up); nothing was sent"
    return None
