"""A checked contract as frozen specs that carry their defaults: what every other module reads instead of the
plan's dict.

:func:`read_contract` turns a block whose checks found nothing (see
:mod:`runner.contract.text`) into a :class:`Contract`; it checks nothing again
and reads nothing but the block. Each default is the value the runner uses
when the contract leaves the field out. :func:`contract_of` gives a run's
contract, read once per plan: cached by the plan's digest, so a reader on a
hot path (one adapter per item, one begin per effect) never parses again.

The bounds a check holds a field to stay with the check (the specs import
them, never the reverse), so a check never loads the specs.
"""

import fnmatch
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ..base.errors import InvalidInput, StateUnrecoverable
from ..base.pointer import parse_pointer
from ..base.values import MAX_ID_LENGTH
from ..base.canonical import canonical_json
from .effects import DEFAULT_CALL_TIMEOUT, OBSERVE_NONE
from .http import (EACH, INVOKE_DEFAULTS, INVOKE_METHODS, MAX_PAGES_DEFAULT, OBSERVE_DEFAULTS, OBSERVE_METHODS,
                   secret_origin, split_url)
from .lookups import MANY_DEFAULT
from .smtp import DEFAULT_MESSAGE_ID, DEFAULT_PORTS, NOT_NOW_SECONDS
from .templates import fields_of, reads_records

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "NOT_NOW_DEFAULT",
    "Contract",
    "StepSpec",
    "ItemsSpec",
    "PayloadSpec",
    "EffectsSpec",
    "Rate",
    "ConcurrencyKey",
    "ManyCommand",
    "HttpSpec",
    "HttpRequest",
    "HttpMany",
    "GitSpec",
    "SmtpSpec",
    "HttpList",
    "HttpSave",
    "BodyCondition",
    "Limits",
    "RetryPolicy",
    "LeaseSpec",
    "JobsSpec",
    "HistorySpec",
    "read_contract",
    "read_http",
    "read_smtp",
    "contract_of",
]

#: What a refusal of a git push says when it means "not now", unless ``effects.git.not_now`` says otherwise.
NOT_NOW_DEFAULT = ("try again later", "temporarily")
#: Seconds a step's checks may run unless its ``timeout_seconds`` says otherwise: long enough for a test suite.
CHECK_TIMEOUT = 600.0
#: The payload of a batch item whose step declares none.
DEFAULT_PAYLOAD_TEMPLATE = {"item": "{item}", "key": "{key}"}

Pairs = Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class ItemsSpec:
    """Where a batch step's items come from: exactly one of an inline list, a glob, an item file, and a file of
    records (JSON Lines, CSV, or lines parsed by ``pattern``, a regular expression with named groups)."""

    inline: Optional[Tuple[str, ...]] = None
    glob: Optional[str] = None
    file: Optional[str] = None
    jsonl: Optional[str] = None
    csv: Optional[str] = None
    lines: Optional[str] = None
    pattern: Optional[str] = None

    @property
    def records_file(self) -> Optional[str]:
        """The file of records the items are read from (``jsonl``, ``csv`` or ``lines``), or None."""
        return self.jsonl or self.csv or self.lines


@dataclass(frozen=True)
class PayloadSpec:
    """What each item's effect sends: a JSON template, or a command whose stdout is the payload."""

    template: Optional[Any] = None
    command: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class StepSpec:
    """One step of the plan. ``artifact`` and ``check`` are prose for people."""

    id: str
    artifact: Optional[str] = None
    check: Optional[str] = None
    next: Optional[str] = None
    approval: bool = False
    evidence: Tuple[str, ...] = ()
    items: Optional[ItemsSpec] = None
    key: Optional[str] = None
    #: None for a step without ``payload``: a batch item then sends :data:`DEFAULT_PAYLOAD_TEMPLATE`.
    payload: Optional[PayloadSpec] = None
    checks: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    artifacts: Tuple[str, ...] = ()
    timeout_seconds: float = CHECK_TIMEOUT
    #: Every field placeholder an item fills, in the step's templates and the effects section's, sorted.
    fields: Tuple[str, ...] = ()
    #: The items are records: from a file of records, or ``.json`` files of a glob whose templates name a field.
    reads_records: bool = False

    @property
    def is_batch(self) -> bool:
        return self.items is not None

    @property
    def observes_itself(self) -> bool:
        """True when the runner can establish the step's completion alone (no claimed evidence needed)."""
        return (self.is_batch or bool(self.checks) or bool(self.artifacts)) and not self.evidence and not self.approval


@dataclass(frozen=True)
class Rate:
    """``effects.rate``: calls a second, and how many may be saved up."""

    per_second: float
    burst: float = 1.0


@dataclass(frozen=True)
class ConcurrencyKey:
    """``effects.concurrency_key``: at most ``limit`` effects of one group (the filled ``key``) in flight."""

    key: str
    limit: int


@dataclass(frozen=True)
class ManyCommand:
    """``effects.observe_many``: one command that looks many keys up at once (pointers as the contract writes them)."""

    command: Tuple[str, ...]
    match: str
    value: str
    list: str = ""
    max: int = MANY_DEFAULT


@dataclass(frozen=True)
class HttpMany:
    """``effects.http.observe.many``: the request (its ``{each:...}`` made ``{each}``), how its list is matched back to
    keys, and how an answer says it is the last page (``page_size``, ``next``; neither: it never says)."""

    request: "HttpRequest"
    each: str
    list: Tuple[str, ...]
    match: Tuple[str, ...]
    value: str
    most: int = MANY_DEFAULT
    page_size: Optional[int] = None
    next: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class HttpList:
    """``effects.http.observe.list``: one listing of the target, read page by page to its end, matched to every key
    waiting for a lookup.

    ``pages``: ``"link"`` (the ``Link`` header's ``rel="next"``), ``"param"`` (page numbers in the query parameter
    ``param``, to the first page without entries), ``"cursor"`` (the value at ``cursor`` in each page, sent back as
    ``param``, to a page that names none) or ``"after_last"`` (the value at ``after_last`` in the page's last entry,
    sent back as ``param``, to the first page without entries). ``more``: where a page says whether another follows
    (true or false); when declared, it alone ends the listing. ``how``: ``equals``, ``first_line`` or ``contains``.
    ``id``: where an entry holds the id an invoke's receipt holds at ``invoke.receipt_id``.
    """

    pages: str
    list: Tuple[str, ...]
    match: Tuple[str, ...]
    value: str
    how: str = "equals"
    max_pages: int = MAX_PAGES_DEFAULT
    param: Optional[str] = None
    cursor: Optional[Tuple[str, ...]] = None
    after_last: Optional[Tuple[str, ...]] = None
    more: Optional[Tuple[str, ...]] = None
    id: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class HttpSave:
    """``effects.http.invoke.save``: where the answer a run must keep is written (``path``, a template of the item's
    placeholders, relative to the workspace) and what of it (the value at ``pointer``; None: the whole body)."""

    path: str
    pointer: Optional[Tuple[str, ...]] = None
    written: Optional[str] = None


@dataclass(frozen=True)
class BodyCondition:
    """A condition on an answer's body that gives its status another word: the value at ``pointer`` is there (not
    null, ``""``, ``[]`` or ``{}``), or, with ``equals`` (canonical JSON), is that value."""

    pointer: Tuple[str, ...]
    then: str
    equals: Optional[str] = None


@dataclass(frozen=True)
class HttpRequest:
    """One request of ``effects.http``: its URL split, and its statuses (the defaults of its kind, then the
    contract's).

    With ``origin_secret`` the URL's scheme, host or port come from a secret: ``scheme``, ``host`` and ``port`` are
    empty and ``rest`` is the whole template, split at each call once the secret is read. ``conditions``: per status
    or class, the conditions on the body tried before its word in ``statuses``. ``receipt_id``: where an invoke's
    answer holds the id of what it made, matched to a listing's ``id``.
    """

    kind: str
    method: str
    url: str
    scheme: str
    host: str
    port: int
    rest: str
    headers: Pairs = ()
    statuses: Pairs = ()
    pointer: Optional[Tuple[str, ...]] = None
    receipt_headers: Tuple[str, ...] = ("Location",)
    many: Optional[HttpMany] = None
    origin_secret: bool = False
    conditions: Tuple[Tuple[str, Tuple[BodyCondition, ...]], ...] = ()
    send_as: str = "json"
    listing: Optional[HttpList] = None
    receipt_id: Optional[Tuple[str, ...]] = None
    save: Optional[HttpSave] = None


@dataclass(frozen=True)
class HttpSpec:
    """``effects.http``: the invoke and observe requests and what the target promises."""

    invoke: HttpRequest
    #: None for ``"observe": "none"``: an endpoint that cannot be read back.
    observe: Optional[HttpRequest]
    idempotency_header: Optional[str] = None
    epoch_header: Optional[str] = None
    deduplicates: bool = False
    retention_seconds: Optional[float] = None
    ca_file: Optional[str] = None


@dataclass(frozen=True)
class GitSpec:
    """``effects.git``: where each item's release goes (its repository folder, the remote, the branch) and what it
    is (the files written, the edit command, the commit's message, the tag), as the contract writes each template.

    ``files`` pairs each path (relative to the repository) with its content; ``author`` is a name and an address.
    """

    message: str
    tag: str
    branch: str
    repository: str = "{item}"
    remote: str = "origin"
    files: Pairs = ()
    edit: Optional[Tuple[str, ...]] = None
    annotated: bool = True
    not_now: Tuple[str, ...] = NOT_NOW_DEFAULT
    author: Optional[Tuple[str, str]] = None


@dataclass(frozen=True)
class SmtpSpec:
    """``effects.smtp``: the mail server one message per effect is sent to, and what every message shares, as the
    contract writes each template (the item's placeholders are filled by the adapter).

    ``sender`` is the section's ``from``; ``to``, ``cc`` and ``bcc`` are lists (a payload may name its own);
    ``username`` and ``password`` are ``{env:NAME}``/``{file:PATH}`` as written, read at each call. A mail server
    cannot be read back: a contract with this section is never looked up.
    """

    host: str
    sender: str
    security: str = "starttls"
    port: int = 587
    to: Tuple[str, ...] = ()
    cc: Tuple[str, ...] = ()
    bcc: Tuple[str, ...] = ()
    reply_to: Optional[str] = None
    username: Optional[str] = None
    password: Optional[str] = None
    message_id: str = DEFAULT_MESSAGE_ID
    ca_file: Optional[str] = None
    helo: Optional[str] = None
    not_now_seconds: float = NOT_NOW_SECONDS


@dataclass(frozen=True)
class EffectsSpec:
    """The ``effects`` section. ``adapter`` and ``verification`` are prose for people; ``readable`` is False for a
    target that cannot be read back: ``observe`` is ``"none"`` (``observe`` is then None), ``effects.http.observe``
    is ``"none"`` (the HTTP spec's ``observe`` is then None), or the target is a mail server (``smtp``);
    ``observe_first``: each item is looked up before its first call, and one the target holds already is verified
    with no call."""

    key_pattern: Optional[str] = None
    approval: Tuple[str, ...] = ()
    adapter: Optional[str] = None
    verification: Optional[str] = None
    max_attempts: int = 3
    several_approvals: bool = False
    invoke: Optional[Tuple[str, ...]] = None
    observe: Optional[Tuple[str, ...]] = None
    http: Optional[HttpSpec] = None
    timeout_seconds: float = DEFAULT_CALL_TIMEOUT
    settle_seconds: float = 0.0
    max_rate_limited: int = 10
    concurrency: int = 1
    rate: Optional[Rate] = None
    concurrency_key: Optional[ConcurrencyKey] = None
    observe_many: Optional[ManyCommand] = None
    git: Optional[GitSpec] = None
    readable: bool = True
    #: ``effects.cost``: each named cost as terms read from a receipt, ``(pointer, price)``; empty when not given.
    cost: Tuple[Tuple[str, Tuple[Tuple[str, float], ...]], ...] = ()
    #: ``effects.cost_estimate``: what one call is reserved of each named cost before any cost was seen.
    cost_estimate: Tuple[Tuple[str, float], ...] = ()
    observe_first: bool = False
    smtp: Optional[SmtpSpec] = None

    @property
    def performs_effects(self) -> bool:
        """True when the contract says how the runner calls the target itself: commands, HTTP, git or SMTP."""
        return self.invoke is not None or self.http is not None or self.git is not None or self.smtp is not None

    def key_allowed(self, key: str) -> bool:
        """True when ``key_pattern`` (if any) matches the whole key, in time linear in the key.

        :raises InvalidInput: the pattern is outside the bounded subset (a run started before patterns were
            checked); a migration to a valid contract fixes it.
        """
        if self.key_pattern is None:
            return True
        try:
            from ..base.keypattern import compile_pattern  # here: most runs have no key pattern

            compiled = compile_pattern(self.key_pattern)
        except InvalidInput as exc:
            raise InvalidInput(
                f"the run's contract has an unsafe {exc.message}; migrate to a contract that passes "
                "`contract check FILE`"
            ) from None
        return len(key) <= MAX_ID_LENGTH and bool(compiled.fullmatch(key))

    def needs_approval(self, key: str) -> bool:
        """True when an ``approval`` glob matches the key."""
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.approval)

    def timeout_for(self, adapter: Any) -> float:
        """Seconds one call of ``adapter`` may take: the adapter's own ``timeout``, else the contract's."""
        return float(getattr(adapter, "timeout", None) or self.timeout_seconds)


@dataclass(frozen=True)
class Limits:
    """The ``limits`` section; None where the contract sets no limit."""

    max_step_attempts: Optional[float] = None
    max_effect_attempts: Optional[float] = None
    max_elapsed_seconds: Optional[float] = None
    max_cost: Optional[float] = None
    max_steps: Optional[float] = None
    no_progress_seconds: Optional[float] = None
    #: Every named cost's limit: ``max_cost`` as a number bounds ``money``; as an object, each cost it names.
    cost_limits: Tuple[Tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RetryPolicy:
    """The ``retry`` section: the backoff between attempts (``deadline_seconds`` is accepted and read by nothing)."""

    base_seconds: float = 1.0
    cap_seconds: float = 60.0
    deadline_seconds: Optional[float] = None


@dataclass(frozen=True)
class LeaseSpec:
    """The ``lease`` section."""

    ttl_seconds: float = 300.0


@dataclass(frozen=True)
class HistorySpec:
    """The ``history`` section: how much of the run's history folder is kept (no bound when left out)."""

    keep_seconds: Optional[float] = None
    keep_bytes: Optional[int] = None


@dataclass(frozen=True)
class JobsSpec:
    """The ``jobs`` section."""

    rerun_vanished: bool = False


@dataclass(frozen=True)
class Contract:
    """A checked contract. ``goal``, ``non_goals`` and the actions are prose for people and the model."""

    task_id: str
    goal: str
    steps: Tuple[StepSpec, ...]
    version: int = 1
    non_goals: Tuple[str, ...] = ()
    allowed_actions: Tuple[str, ...] = ()
    forbidden_actions: Tuple[str, ...] = ()
    completion_evidence: Tuple[str, ...] = ()
    effects: EffectsSpec = EffectsSpec()
    limits: Limits = Limits()
    retry: RetryPolicy = RetryPolicy()
    lease: LeaseSpec = LeaseSpec()
    jobs: JobsSpec = JobsSpec()
    history: HistorySpec = HistorySpec()
    workspace: str = "."

    def step(self, step_id: str) -> Optional[StepSpec]:
        """The step named ``step_id``, or None."""
        return next((step for step in self.steps if step.id == step_id), None)

    def workspace_root(self, base: Optional[str] = None, cwd: Optional[str] = None) -> str:
        """The absolute workspace: ``workspace`` against ``base``, else ``cwd`` (default: the current folder)."""
        return os.path.abspath(os.path.join(base or cwd or os.getcwd(), self.workspace))


def _strings(value: Any) -> Tuple[str, ...]:
    return tuple(value or ())


def _step(block: Mapping[str, Any], effects: Mapping[str, Any]) -> StepSpec:
    items = block.get("items")
    source = None
    if isinstance(items, list):
        source = ItemsSpec(inline=tuple(items))
    elif isinstance(items, dict):
        source = ItemsSpec(**{name: items.get(name) for name in ("glob", "file", "jsonl", "csv", "lines", "pattern")})
    payload = block.get("payload")
    how = None
    if payload is not None:
        how = (
            PayloadSpec(command=tuple(payload["command"]))
            if "command" in payload
            else PayloadSpec(template=payload["template"])
        )
    return StepSpec(
        id=block["id"],
        artifact=block.get("artifact"),
        check=block.get("check"),
        next=block.get("next"),
        approval=bool(block.get("approval", False)),
        evidence=_strings(block.get("evidence")),
        items=source,
        key=block.get("key"),
        payload=how,
        checks=tuple((name, tuple(argv)) for name, argv in (block.get("checks") or {}).items()),
        artifacts=_strings(block.get("artifacts")),
        timeout_seconds=float(block.get("timeout_seconds", CHECK_TIMEOUT)),
        fields=tuple(fields_of(block, effects)),
        reads_records=reads_records(block, effects),
    )


def _request(kind: str, block: Mapping[str, Any], many: Optional[HttpMany] = None,
             listing: Optional[HttpList] = None) -> HttpRequest:
    hidden = secret_origin(block["url"])
    scheme, host, port, rest = ("", "", 0, block["url"]) if hidden else split_url(block["url"])
    statuses = dict(INVOKE_DEFAULTS if kind == "invoke" else OBSERVE_DEFAULTS)
    conditions = []
    for code, word in (block.get("statuses") or {}).items():
        if isinstance(word, list):  # conditions on the body, then the word the status means otherwise
            conditions.append((code, tuple(_condition(c) for c in word[:-1])))
            word = word[-1]
        statuses[code] = word
    pointer = block.get("pointer")
    return HttpRequest(
        kind=kind,
        method=block.get("method", INVOKE_METHODS[0] if kind == "invoke" else OBSERVE_METHODS[0]),
        url=block["url"],
        scheme=scheme,
        host=host,
        port=port,
        rest=rest,
        headers=tuple((block.get("headers") or {}).items()),
        statuses=tuple(statuses.items()),
        pointer=parse_pointer(pointer) if pointer is not None else None,
        receipt_headers=tuple(block.get("receipt_headers", ["Location"])),
        many=many,
        origin_secret=hidden,
        conditions=tuple(conditions),
        send_as=block.get("send_as", "json"),
        listing=listing,
        receipt_id=parse_pointer(block["receipt_id"]) if "receipt_id" in block else None,
        save=_save(block["save"]) if "save" in block else None,
    )


def _save(block: Mapping[str, Any]) -> HttpSave:
    pointer = block.get("pointer")
    return HttpSave(path=block["path"], pointer=parse_pointer(pointer) if pointer is not None else None,
                    written=pointer)


def _condition(block: Mapping[str, Any]) -> BodyCondition:
    return BodyCondition(parse_pointer(block["pointer"]), block["then"],
                         canonical_json(block["equals"]).decode("utf-8") if "equals" in block else None)


def _listing(block: Mapping[str, Any]) -> HttpList:
    pages = block["pages"]
    kind = "link" if pages == "link" else "cursor" if "cursor" in pages else "after_last" if "after_last" in pages \
        else "param"
    return HttpList(
        pages=kind,
        list=parse_pointer(block.get("list", "")),
        match=parse_pointer(block["match"]),
        value=block["value"],
        how=block.get("how", "equals"),
        max_pages=int(block.get("max_pages", MAX_PAGES_DEFAULT)),
        param=None if kind == "link" else pages["param"],
        cursor=parse_pointer(pages["cursor"]) if kind == "cursor" else None,
        after_last=parse_pointer(pages["after_last"]) if kind == "after_last" else None,
        more=parse_pointer(block["more"]) if "more" in block else None,
        id=parse_pointer(block["id"]) if "id" in block else None,
    )


def read_http(block: Mapping[str, Any]) -> HttpSpec:
    """The spec of an ``effects.http`` section whose checks (:func:`runner.contract.http.http_problems`) found nothing;
    like :func:`read_contract`, it checks nothing again."""
    observe = block["observe"]
    if observe == OBSERVE_NONE:
        return _http(block, None)
    many = None
    if "many" in observe:
        found = observe["many"]
        match = EACH.search(found["url"])
        request = _request(
            "observe", {"url": EACH.sub("{each}", found["url"]), "headers": observe.get("headers") or {}}
        )
        many = HttpMany(
            request=request,
            each=match.group(1) if match else "",
            list=parse_pointer(found.get("list", "")),
            match=parse_pointer(found["match"]),
            value=found["value"],
            most=int(found.get("max", MANY_DEFAULT)),
            page_size=found.get("page_size"),
            next=parse_pointer(found["next"]) if "next" in found else None,
        )
    if "list" in observe:
        # The listing is the lookup: its URL is the observe request's, and the request holds only headers besides.
        observe = {"url": observe["list"]["url"], "headers": observe.get("headers") or {}}
        return _http(block, _request("observe", observe, listing=_listing(block["observe"]["list"])))
    return _http(block, _request("observe", observe, many))


def _http(block: Mapping[str, Any], observe: Optional[HttpRequest]) -> HttpSpec:
    return HttpSpec(
        invoke=_request("invoke", block["invoke"]),
        observe=observe,
        idempotency_header=block.get("idempotency_header"),
        epoch_header=block.get("epoch_header"),
        deduplicates=bool(block.get("deduplicates", False)),
        retention_seconds=block.get("retention_seconds"),
        ca_file=block.get("ca_file"),
    )


def _git(block: Mapping[str, Any]) -> GitSpec:
    author = block.get("author")
    return GitSpec(
        message=block["message"],
        tag=block["tag"],
        branch=block["branch"],
        repository=block.get("repository", "{item}"),
        remote=block.get("remote", "origin"),
        files=tuple((block.get("files") or {}).items()),
        edit=tuple(block["edit"]) if "edit" in block else None,
        annotated=bool(block.get("annotated", True)),
        not_now=tuple(block.get("not_now", NOT_NOW_DEFAULT)),
        author=(author["name"], author["email"]) if author else None,
    )


def read_smtp(block: Mapping[str, Any]) -> SmtpSpec:
    """The spec of an ``effects.smtp`` section whose checks (:func:`runner.contract.smtp.smtp_problems`) found nothing;
    like :func:`read_contract`, it checks nothing again."""

    def listed(name: str) -> Tuple[str, ...]:
        value = block.get(name)
        return () if value is None else (value,) if isinstance(value, str) else tuple(value)

    security = block.get("security", "starttls")
    return SmtpSpec(
        host=block["host"],
        sender=block["from"],
        security=security,
        port=int(block.get("port", DEFAULT_PORTS[security])),
        to=listed("to"),
        cc=listed("cc"),
        bcc=listed("bcc"),
        reply_to=block.get("reply_to"),
        username=block.get("username"),
        password=block.get("password"),
        message_id=block.get("message_id", DEFAULT_MESSAGE_ID),
        ca_file=block.get("ca_file"),
        helo=block.get("helo"),
        not_now_seconds=float(block.get("not_now_seconds", NOT_NOW_SECONDS)),
    )


def _effects(block: Mapping[str, Any]) -> EffectsSpec:
    rate, group, many = block.get("rate"), block.get("concurrency_key"), block.get("observe_many")
    return EffectsSpec(
        key_pattern=block.get("key_pattern"),
        approval=_strings(block.get("approval")),
        adapter=block.get("adapter"),
        verification=block.get("verification"),
        max_attempts=int(block.get("max_attempts", 3)),
        several_approvals=bool(block.get("several_approvals", False)),
        invoke=tuple(block["invoke"]) if "invoke" in block else None,
        observe=tuple(block["observe"]) if "observe" in block and block["observe"] != OBSERVE_NONE else None,
        readable=block.get("observe") != OBSERVE_NONE and "smtp" not in block
        and (block.get("http") or {}).get("observe") != OBSERVE_NONE,
        observe_first=bool(block.get("observe_first", False)),
        http=read_http(block["http"]) if "http" in block else None,
        timeout_seconds=float(block.get("timeout_seconds", DEFAULT_CALL_TIMEOUT)),
        settle_seconds=float(block.get("settle_seconds", 0.0)),
        max_rate_limited=int(block.get("max_rate_limited", 10)),
        concurrency=int(block.get("concurrency", 1)),
        rate=Rate(float(rate["per_second"]), float(rate.get("burst", 1))) if rate else None,
        concurrency_key=ConcurrencyKey(group["key"], int(group["limit"])) if group else None,
        observe_many=ManyCommand(
            command=tuple(many["command"]),
            match=many["match"],
            value=many["value"],
            list=many.get("list", ""),
            max=int(many.get("max", MANY_DEFAULT)),
        )
        if many
        else None,
        git=_git(block["git"]) if "git" in block else None,
        cost=tuple((name, tuple((str(t[0]), float(t[1])) for t in terms))
                   for name, terms in (block.get("cost") or {}).items()),
        cost_estimate=tuple((name, float(amount)) for name, amount in (block.get("cost_estimate") or {}).items()),
        smtp=read_smtp(block["smtp"]) if "smtp" in block else None,
    )


def _limits(block: Mapping[str, Any]) -> Limits:
    """The ``limits`` section; ``max_cost`` a number bounds the cost named money, an object each cost it names."""
    values = {name: block.get(name) for name in Limits.__dataclass_fields__ if name != "cost_limits"}
    cost = values.get("max_cost")
    if isinstance(cost, dict):
        named = {str(k): float(v) for k, v in cost.items()}
    else:
        named = {} if cost is None else {"money": float(cost)}
    values["max_cost"] = named.get("money")
    return Limits(**values, cost_limits=tuple(sorted(named.items())))


def read_contract(block: Mapping[str, Any]) -> Contract:
    """The specs of a contract block whose checks found nothing (:func:`runner.contract.text.parse_contract_text`).

    Pure: it reads only ``block`` and checks nothing again, so a block that
    did not pass the checks may raise anything. A run's plan is such a block,
    unless a harness began the run with a plan of its own that names only the
    sections it uses (the simulation's may name its effects alone): a field
    left out reads as its default, and the task, goal and steps as none.
    """
    sections = ("limits", "retry", "lease", "jobs", "history")
    limits, retry, lease, jobs, history = (block.get(name) or {} for name in sections)
    effects = block.get("effects") or {}
    return Contract(
        task_id=block.get("task_id", ""),
        goal=block.get("goal", ""),
        steps=tuple(_step(step, effects) for step in block.get("steps", [])),
        version=int(block.get("contract", 1)),
        non_goals=_strings(block.get("non_goals")),
        allowed_actions=_strings(block.get("allowed_actions")),
        forbidden_actions=_strings(block.get("forbidden_actions")),
        completion_evidence=_strings(block.get("completion_evidence")),
        effects=_effects(effects),
        limits=_limits(limits),
        retry=RetryPolicy(
            float(retry.get("base_seconds", 1.0)), float(retry.get("cap_seconds", 60.0)), retry.get("deadline_seconds")
        ),
        lease=LeaseSpec(float(lease.get("ttl_seconds", 300.0))),
        jobs=JobsSpec(bool(jobs.get("rerun_vanished", False))),
        history=HistorySpec(
            float(history["keep_seconds"]) if "keep_seconds" in history else None,
            int(history["keep_bytes"]) if "keep_bytes" in history else None,
        ),
        workspace=block.get("workspace", "."),
    )


#: Contracts read, by plan digest: at most :data:`_MOST_KEPT`, then the cache starts again.
_READ: Dict[str, Contract] = {}
_READ_LOCK = threading.Lock()
_MOST_KEPT = 16


def contract_of(state: Mapping[str, Any]) -> Contract:
    """The run's contract (its ``plan``), read once per plan digest.

    :param state: a run's envelope: its ``plan`` was checked when the run began or migrated.
    :raises StateUnrecoverable: the plan cannot be read into specs (checked by an older runner under rules this one
        no longer reads so): nothing is done under a plan read only in part.
    """
    digest = state["plan_digest"]
    with _READ_LOCK:
        found = _READ.get(digest)
    if found is not None:
        return found
    try:
        made = read_contract(state["plan"])
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise StateUnrecoverable(
            f"the run's plan cannot be read by this runner ({type(exc).__name__}: {str(exc)[:200]}); check its "
            "contract with `contract check FILE`, then `migrate --contract FILE` moves the run onto it") from None
    with _READ_LOCK:
        if len(_READ) >= _MOST_KEPT:
            _READ.clear()
        _READ[digest] = made
    return made
