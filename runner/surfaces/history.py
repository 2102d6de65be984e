"""The history of a run, read back from its journal records.

Every transition of a run is one journal record (``rev``, ``at``, ``epoch``,
``ops``). :func:`build` replays those records in order and turns the state
changes they make into the facts an observer asks about: who held the lease
from when to when and how each holding ended (released, broken by a
supervisor, taken over after it expired, or still held); each step attempt
and the backoff wait after a failed one; each effect's path through started,
acknowledged, uncertain, verified, absent or failed, and whether it was
settled by observation after its outcome was unknown; approval requests and
their answers; the cancellation and what was in flight at that moment; jobs.

It reads records only, so it works the same for every store, and every
store keeps every record (the file store's compaction copies each journal
it rotates out into the run's history folder). Records that are not there
are kept in :attr:`History.gaps` and never papered over: where the store
says its history is damaged (:attr:`History.damage`), where a run's
retention dropped the oldest (:attr:`History.dropped`, whose counts the
figures of :func:`figures` add back), or where a run was compacted before
its runner kept a history folder. A :class:`Recorder` that polls a store
while the run runs keeps every record it saw, whatever the store keeps.

A holding that ended without a release is a *crash* here: its holder stopped
writing (its last durable write is :attr:`Holding.last_write`) and the lease
was broken or taken over later. That is what the journal can show; a holder
that merely stalled past its lease looks the same, and is fenced the same.
"""

import copy
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..ledger.effects import attempt_counts
from ..ledger.envelope import apply_leniently, new_envelope
from ..ledger.states import UNRESOLVED
from ..base.times import parse_time
from ..base.errors import RunnerError
from .views import report

__all__ = ["History", "Holding", "StepAttempt", "EffectPath", "Approval", "build", "load", "figures", "Recorder",
           "EXCEPTIONAL", "FIGURES"]

#: Effect states an observer must always see one by one.
EXCEPTIONAL = ("uncertain", "absent", "failed")


class Holding:
    """One lease holder at one epoch: a lane of the timeline."""

    def __init__(self, owner: str, epoch: int, start: float) -> None:
        self.owner, self.epoch, self.start = owner, epoch, start
        self.end: Optional[float] = None
        #: released, broken, expired (taken over after expiry), superseded (re-acquired by the same owner), or open.
        self.ended = "open"
        self.last_write = start
        self.writes = 0
        self.renewals = 0
        self.takeover = False  # this holding began by taking over an unreleased lease
        self.before_kept = False  # it began in the records the run's retention dropped, and is counted with them
        self.broken_by: Optional[str] = None
        self.reason: Optional[str] = None
        #: (at, decision, reason, action): why a recovery stopped, or what it chose to do as its action's kind and the
        #: step or key it names (``resume-step ingest``); each None where it does not apply or the records do not say.
        self.recoveries: List[Tuple[float, str, Optional[str], Optional[str]]] = []
        self.in_flight: List[str] = []  # unresolved effects when the holding ended
        self.step_at_end: Optional[str] = None

    @property
    def crashed(self) -> bool:
        """The holder stopped without releasing (see the module docstring)."""
        return self.ended in ("broken", "expired", "superseded")


class StepAttempt:
    def __init__(self, step: str, attempt: int, start: float, epoch: int) -> None:
        self.step, self.attempt, self.start, self.epoch = step, attempt, start, epoch
        self.end: Optional[float] = None
        self.outcome = "running"  # done, failed, cancelled, interrupted (started again), running
        self.error: Optional[str] = None
        self.error_class: Optional[str] = None
        self.evidence: Any = None
        self.wait_until: Optional[float] = None  # persisted backoff before the next attempt


class EffectPath:
    """One effect's transitions: ``(at, state, epoch, reconciled)`` in journal order.

    A *deferral* (the target answered "not now": it created nothing and named
    a time to come back) enters the ledger's ``absent`` state, but is no
    absence of the effect: its transitions are those in :attr:`deferrals`,
    kept apart from :attr:`waits` and from what makes a path exceptional.
    A *reopening* (a person gave the failed effect a new budget of attempts)
    enters ``absent`` too, and is no absence either: :attr:`reopenings`.
    ``attempts`` counts the calls that could have created the effect and
    ``deferrals`` the "not now" answers, each over every budget.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self.step: Optional[str] = None
        self.payload_digest: Optional[str] = None
        self.transitions: List[Tuple[float, str, int, bool]] = []
        self.waits: List[Tuple[float, float]] = []  # (from, until): backoff after an absence
        self.deferrals: List[Tuple[float, float]] = []  # (at, until): "not now", and no call before until
        self.receipt: Any = None
        self.evidence: Any = None
        self.reason: Optional[str] = None
        self.attempts = 0
        self.deferral_count = 0
        self.reopenings: List[Tuple[float, Any, Any]] = []  # (at, by, reason)

    @property
    def state(self) -> str:
        return self.transitions[-1][1] if self.transitions else "unknown"

    @property
    def reconciled(self) -> bool:
        """Settled by observing the target after its outcome was unknown to the worker."""
        return any(flag for _, _, _, flag in self.transitions) or (
            self.went_uncertain and self.state in ("verified", "absent", "failed"))

    @property
    def went_uncertain(self) -> bool:
        return any(state == "uncertain" for _, state, _, _ in self.transitions)

    def deferred(self, at: float, state: str) -> bool:
        """Whether the transition to ``state`` at ``at`` was a deferral ("not now"), not an absence."""
        return state == "absent" and any(when == at for when, _ in self.deferrals)

    def reopened(self, at: float, state: str) -> bool:
        """Whether the transition to ``state`` at ``at`` was a person's reopening, not an absence."""
        return state == "absent" and any(when == at for when, _, _ in self.reopenings)

    @property
    def exceptional(self) -> bool:
        return self.reconciled or any(
            state in EXCEPTIONAL and not self.deferred(at, state) and not self.reopened(at, state)
            for at, state, _, _ in self.transitions)


class Approval:
    def __init__(self, rid: str, request: Dict[str, Any], at: float) -> None:
        self.rid = rid
        self.step = request.get("step")
        self.action = request.get("action")
        self.payload_digest = request.get("payload_digest")
        self.requested_at = at
        expires = request.get("expires_at")
        self.expires_at = _time(expires) if expires else None
        self.state = request.get("state", "pending")
        self.by: Optional[str] = None
        self.answered_at: Optional[float] = None
        self.used_by: Optional[str] = None
        self.used_at: Optional[float] = None
        self.superseded_at: Optional[float] = None


class History:
    """What the journal records of one run show; see the module docstring."""

    def __init__(self, state: Dict[str, Any]) -> None:
        self.task_id: str = state["task_id"]
        self.state = state
        self.summary = report(state)
        self.first_rev = 0
        self.last_rev = 0
        self.records = 0
        self.gaps: List[Tuple[int, int]] = []  # (last rev seen, next rev seen): records between are missing
        #: What the run's retention dropped (``observations.history.dropped``: range, counts, the run at its end),
        #: or None.
        self.dropped: Optional[Dict[str, Any]] = _dropped(state)
        #: What the store found breaking the history's chain (missing or altered records): damage, said on every view.
        self.damage: List[str] = []
        #: What the store noted of records it never kept (compacted before the run kept a history folder).
        self.notes: List[str] = []
        self.start = _time(state["created_at"])
        self.end = _time(state["updated_at"])
        self.holdings: List[Holding] = []
        self.steps: List[StepAttempt] = []
        self.effects: Dict[str, EffectPath] = {}
        self.approvals: Dict[str, Approval] = {}
        self.cancellation: Optional[Dict[str, Any]] = None  # at, by, reason, in_flight, step
        self.jobs: Dict[str, List[Tuple[float, str, Dict[str, Any]]]] = {}
        self.marks: List[Tuple[float, str, str]] = []  # (at, kind, text): status changes, repairs, migrations

    @property
    def crashes(self) -> List[Holding]:
        return [h for h in self.holdings if h.crashed]


def _dropped(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    history = state["observations"].get("history")
    dropped = history.get("dropped") if isinstance(history, dict) else None
    return dropped if isinstance(dropped, dict) and isinstance(dropped.get("through"), int) else None


#: The figures :func:`figures` adds to :func:`runner.surfaces.views.report`'s, each over the whole history.
FIGURES = ("lease_holders", "crashes", "history_records", "history_dropped", "history_missing")


def figures(history: "History") -> Dict[str, int]:
    """The figures of ``history`` that the state alone does not give, whole whatever compaction did.

    ``lease_holders``: lease holdings (epochs); ``crashes``: holdings that
    stopped without releasing (see the module docstring); ``history_records``:
    the journal records read; ``history_dropped``: those the run's retention
    dropped, whose holdings and crashes the first two figures count from the
    drop's record; ``history_missing``: records missing from the history for
    no recorded reason (damage, or compacted before a history folder was kept).
    """
    dropped = history.dropped or {}
    epochs = int((dropped.get("lease") or {}).get("epoch") or 0) if dropped else 0
    crashed = int((dropped.get("counters") or {}).get("recoveries") or 0) if dropped else 0
    missing = sum(max(0, upto - after - 1) for after, upto in history.gaps)
    return {
        "lease_holders": epochs + sum(1 for h in history.holdings if not h.before_kept),
        "crashes": crashed + len(history.crashes),
        "history_records": history.records,
        "history_dropped": int(dropped.get("records") or 0),
        "history_missing": missing,
    }


_TIMES: Dict[str, float] = {}


def _time(text: str) -> float:
    value = _TIMES.get(text)
    if value is None:
        if len(_TIMES) > 100000:
            _TIMES.clear()
        value = _TIMES[text] = parse_time(text)
    return value


def _apply(shadow: Dict[str, Any], ops: List[Any]) -> None:
    """Apply operations leniently: a missing parent (compacted history) is created, not refused."""
    apply_leniently(shadow, ops)


class _Touched(NamedTuple):
    """What one record's ops change."""

    effects: set  # keys of effects
    steps: set
    approvals: set  # request ids
    jobs: set
    lease: bool
    cancel: bool  # the cancellation
    observed: bool  # some observation: only then can an authorization or a repair be new


def _touched(ops: List[Any]) -> _Touched:
    effects, steps, approvals, jobs = set(), set(), set(), set()
    lease = cancel = observed = False
    for op in ops:
        path = op[1] if isinstance(op, list) and len(op) >= 2 and isinstance(op[1], list) else []
        if not path:
            continue
        head = path[0]
        if head == "effects" and len(path) > 1:
            effects.add(path[1])
        elif head == "steps" and len(path) > 1:
            steps.add(path[1])
        elif head == "jobs" and len(path) > 1:
            jobs.add(path[1])
        elif head == "lease":
            lease = True
        elif head == "observations":
            observed = True
            if len(path) > 2 and path[1] == "approvals":
                approvals.add(path[2])
            elif len(path) > 1 and path[1] == "cancellation":
                cancel = True
    return _Touched(effects, steps, approvals, jobs, lease, cancel, observed)


class _Before(NamedTuple):
    """The parts of the shadow one record may change, as they were before it (copies)."""

    effects: Dict[str, Dict[str, Any]]  # each touched effect
    steps: Dict[str, Dict[str, Any]]
    approvals: Dict[str, Dict[str, Any]]
    jobs: Dict[str, Dict[str, Any]]
    lease: Dict[str, Any]
    status: Any
    reconciled: int  # the counter of effects settled by observation
    auth: set  # keys of the authorization records, where the record touches observations (else empty)
    store: set  # keys of the store's repair records, likewise
    unresolved: List[str]  # effects unresolved, where the record touches the lease, the cancellation or observations
    step: Any  # the current step


def _action_named(action: Any) -> Optional[str]:
    """A persisted action as its kind and the step or key it names (``resume-step ingest``); None without a kind."""
    if not isinstance(action, dict) or not action.get("kind"):
        return None
    target = action.get("step") or action.get("key")
    return f"{action['kind']} {target}" if target else str(action["kind"])


class _Replay:
    """One pass over a run's journal records, in revision order, building its :class:`History`.

    ``shadow`` is the run's state as the records replayed so far make it:
    a fresh envelope of the run, then each record's ops applied leniently
    (:func:`_apply`), so a journal whose first records were compacted away
    still replays. Each record is read as the difference it makes to the
    shadow; ``unresolved`` holds the effects started, acknowledged or
    uncertain after the record replayed last, and ``gaps`` the revisions
    known to be missing.
    """

    def __init__(self, state: Dict[str, Any], gaps: Optional[List[Tuple[int, int]]]) -> None:
        self.history = History(state)
        # Of the run's envelope, only the plan is left empty: no part of the history reads it.
        self.shadow = new_envelope(state["task_id"], {}, "", state["created_at"])
        self.gaps = list(gaps or [])
        self.previous = 0
        self.holding: Optional[Holding] = None
        self.by_epoch: Dict[int, Holding] = {}
        self.open_steps: Dict[str, StepAttempt] = {}
        self.unresolved: set = set()
        if self.history.dropped is not None:
            self._after_drop(self.history.dropped)

    def _after_drop(self, dropped: Dict[str, Any]) -> None:
        """Start where the run's retention stopped: lease, counters, status and step as they stood, its holding open."""
        self.previous = int(dropped["through"])
        for key in ("lease", "counters", "status", "current_step"):
            if key in dropped:
                self.shadow[key] = copy.deepcopy(dropped[key])
        lease = self.shadow["lease"] if isinstance(self.shadow["lease"], dict) else {}
        if lease.get("owner") is not None:
            since = lease.get("acquired_at") or dropped.get("last_at") or self.history.state["created_at"]
            holding = self.holding = Holding(str(lease["owner"]), int(lease.get("epoch") or 0), _time(str(since)))
            holding.before_kept = True
            self.history.holdings.append(holding)
            self.by_epoch[holding.epoch] = holding

    def record(self, record: Dict[str, Any]) -> None:
        """Replay one record, the next in revision order, and add to the history what it changed."""
        shadow, history = self.shadow, self.history
        rev = int(record["rev"])
        if rev != self.previous + 1 and not any(a <= self.previous and b >= rev for a, b in self.gaps):
            self.gaps.append((self.previous, rev))
        self.previous = rev
        at = _time(record["at"])
        epoch = int(record.get("epoch") or 0)
        ops = record.get("ops") or []
        touched = _touched(ops)
        before = self._before(touched)
        _apply(shadow, ops)
        for key in touched.effects:
            if (shadow["effects"].get(key) or {}).get("state") in UNRESOLVED:
                self.unresolved.add(key)
            else:
                self.unresolved.discard(key)
        history.records += 1
        if history.first_rev == 0:
            history.first_rev = rev
        history.last_rev = rev
        writer = self.by_epoch.get(epoch)
        if writer is not None and writer.end is None:
            writer.last_write, writer.writes = at, writer.writes + 1
        reconciled_now = int(shadow["counters"].get("reconciled_effects", 0) or 0) > before.reconciled
        new_auth = self._authorizations(at, touched, before)
        if touched.lease:
            self._lease(at, before, new_auth)
        self._steps(at, epoch, touched.steps, before.steps)
        self._effects(at, epoch, touched.effects, before.effects, reconciled_now)
        self._approvals(at, touched.approvals, before.approvals)
        self._marks(at, touched, before)

    def _before(self, touched: _Touched) -> _Before:
        shadow = self.shadow
        return _Before(
            effects={k: dict(shadow["effects"].get(k) or {}) for k in touched.effects},
            steps={k: dict(shadow["steps"].get(k) or {}) for k in touched.steps},
            approvals={k: dict(shadow["observations"]["approvals"].get(k) or {}) for k in touched.approvals},
            jobs={k: dict(shadow["jobs"].get(k) or {}) for k in touched.jobs},
            lease=dict(shadow["lease"]),
            status=shadow.get("status"),
            reconciled=int(shadow["counters"].get("reconciled_effects", 0) or 0),
            auth=set(shadow["observations"].get("authorization") or {}) if touched.observed else set(),
            store=set(shadow["observations"].get("store") or {}) if touched.observed else set(),
            unresolved=sorted(self.unresolved) if (touched.lease or touched.cancel or touched.observed) else [],
            step=shadow.get("current_step"),
        )

    def _authorizations(self, at: float, touched: _Touched, before: _Before) -> List[Dict[str, Any]]:
        """The authority records the record added, in key order, each read: a lease broken, a recovery, a migration."""
        auth = (self.shadow["observations"].get("authorization") or {}) if touched.observed else {}
        new_auth = [auth[k] for k in sorted(set(auth) - before.auth) if isinstance(auth.get(k), dict)]
        holding = self.holding
        for entry in new_auth:
            source = entry.get("source")
            if source == "lease break" and holding is not None and holding.end is None:
                holding.end, holding.ended = at, "broken"
                holding.broken_by, holding.reason = entry.get("by"), entry.get("reason")
                holding.in_flight, holding.step_at_end = before.unresolved, before.step
            elif source == "recover":
                target = self.by_epoch.get(int(entry.get("epoch") or 0))
                if target is not None:
                    reason, decision = entry.get("reason"), str(entry.get("decision"))
                    # The action is persisted as next_action by the same record (or was already, when unchanged).
                    action = _action_named(self.shadow.get("next_action")) if decision == "act" else None
                    target.recoveries.append((at, decision, None if reason is None else str(reason), action))
            elif source == "migrate":
                self.history.marks.append((at, "migrate", f"plan changed: {entry.get('reason', '')}"))
                for earlier in self.history.approvals.values():
                    if earlier.state in ("pending", "granted") and earlier.superseded_at is None:
                        earlier.superseded_at = at
        return new_auth

    def _lease(self, at: float, before: _Before, new_auth: List[Dict[str, Any]]) -> None:
        """A new epoch begins a holding (ending the open one), a release ends it, a later expiry renews it."""
        now_lease, holding = self.shadow["lease"], self.holding
        owner, new_epoch = now_lease.get("owner"), int(now_lease.get("epoch") or 0)
        old_owner, old_epoch = before.lease.get("owner"), int(before.lease.get("epoch") or 0)
        if owner is not None and new_epoch != old_epoch:
            taken = False
            if holding is not None and holding.end is None:
                holding.end = at
                holding.ended = "superseded" if holding.owner == owner else "expired"
                holding.in_flight, holding.step_at_end = before.unresolved, before.step
                taken = True
            elif holding is not None and holding.ended == "broken":
                taken = True
            holding = self.holding = Holding(owner, new_epoch, at)
            holding.takeover = taken or (old_owner is not None and old_owner != owner)
            self.history.holdings.append(holding)
            self.by_epoch[new_epoch] = holding
        elif owner is None and old_owner is not None and holding is not None and holding.end is None:
            holding.end, holding.ended = at, "released"
            holding.in_flight, holding.step_at_end = before.unresolved, before.step
        elif owner is not None and now_lease.get("expires_at") != before.lease.get("expires_at") \
                and holding is not None and not any(e.get("source") == "lease break" for e in new_auth):
            holding.renewals += 1

    def _steps(self, at: float, epoch: int, steps: set, before: Dict[str, Dict[str, Any]]) -> None:
        """A new attempt where a step's attempts grew (interrupting the open one), an end, a persisted backoff."""
        for step in sorted(steps):
            now_step = self.shadow["steps"].get(step) or {}
            old = before[step]
            attempts = int(now_step.get("attempts") or 0)
            state_now = now_step.get("state")
            if attempts > int(old.get("attempts") or 0) and state_now == "running":
                current = self.open_steps.get(step)
                if current is not None and current.end is None:
                    current.end, current.outcome = at, "interrupted"
                started = StepAttempt(step, attempts, at, epoch)
                self.history.steps.append(started)
                self.open_steps[step] = started
            elif state_now != old.get("state") and state_now in ("done", "failed", "cancelled"):
                attempt = self.open_steps.get(step)
                if attempt is None:  # its start was compacted away
                    start = _time(now_step["started_at"]) if now_step.get("started_at") else at
                    attempt = StepAttempt(step, attempts, start, epoch)
                    self.history.steps.append(attempt)
                    self.open_steps[step] = attempt
                attempt.end, attempt.outcome = at, state_now
                attempt.error, attempt.error_class = now_step.get("error"), now_step.get("class")
                attempt.evidence = now_step.get("evidence")
            if now_step.get("next_attempt_at") and now_step.get("next_attempt_at") != old.get("next_attempt_at"):
                attempt = self.open_steps.get(step)
                if attempt is not None:
                    attempt.wait_until = _time(now_step["next_attempt_at"])

    def _effects(self, at: float, epoch: int, effects: set, before: Dict[str, Dict[str, Any]],
                 reconciled_now: bool) -> None:
        """A transition where an effect's state or attempts changed (settled by observation where the counter grew)."""
        for key in sorted(effects):
            now_effect = self.shadow["effects"].get(key) or {}
            old = before[key]
            path = self.history.effects.get(key)
            if path is None:
                path = self.history.effects[key] = EffectPath(key)
            state_now = now_effect.get("state")
            attempts = int(now_effect.get("attempts") or 0)
            if state_now and (state_now != old.get("state") or attempts > int(old.get("attempts") or 0)):
                settled = reconciled_now and state_now in ("verified", "absent")
                path.transitions.append((at, state_now, epoch, settled))
            path.step = now_effect.get("step") or path.step
            path.payload_digest = now_effect.get("payload_digest") or path.payload_digest
            if now_effect:
                made = attempt_counts(now_effect)
                path.attempts, path.deferral_count = made["attempts_total"], made["deferrals_total"]
            reopened = now_effect.get("reopened") or []
            if len(reopened) > len(old.get("reopened") or []) and isinstance(reopened[-1], dict):
                path.reopenings.append((at, reopened[-1].get("by"), reopened[-1].get("reason")))
            path.receipt, path.evidence = now_effect.get("receipt"), now_effect.get("evidence")
            path.reason = now_effect.get("reason")
            wait = now_effect.get("next_attempt_at")
            deferral = int(now_effect.get("deferred") or 0) > int(old.get("deferred") or 0)
            if deferral:
                path.deferrals.append((at, _time(wait) if wait else at))
            elif wait and wait != old.get("next_attempt_at"):
                path.waits.append((at, _time(wait)))

    def _approvals(self, at: float, approvals: set, before: Dict[str, Dict[str, Any]]) -> None:
        """A new request (superseding an open one of the same step and action); each answer, use or supersession."""
        known = self.history.approvals
        for rid in sorted(approvals):
            now_request = self.shadow["observations"]["approvals"].get(rid) or {}
            approval = known.get(rid)
            if approval is None:
                for other in known.values():
                    if (other.step, other.action) == (now_request.get("step"), now_request.get("action")) \
                            and other.state in ("pending", "granted") and other.superseded_at is None:
                        other.superseded_at = at
                approval = known[rid] = Approval(rid, now_request, at)
            state_now = now_request.get("state")
            if state_now != before[rid].get("state"):
                approval.state = state_now or approval.state
                if state_now in ("granted", "denied"):
                    approval.answered_at, approval.by = at, now_request.get("by")
                elif state_now == "used":
                    approval.used_at, approval.used_by = at, now_request.get("used_by")
                elif state_now == "superseded" and approval.superseded_at is None:
                    approval.superseded_at = at  # the run records it since approvals supersede

    def _marks(self, at: float, touched: _Touched, before: _Before) -> None:
        """The cancellation (with what was in flight), each job's new state, a change of status, a repair."""
        shadow, history = self.shadow, self.history
        if touched.cancel and shadow["observations"].get("cancellation") and history.cancellation is None:
            entry = shadow["observations"]["cancellation"]
            history.cancellation = {"at": at, "by": entry.get("by"), "reason": entry.get("reason"),
                                    "in_flight": before.unresolved, "step": before.step}
        for key in sorted(touched.jobs):
            now_job = shadow["jobs"].get(key) or {}
            if now_job.get("state") != before.jobs[key].get("state"):
                detail = {name: now_job.get(name) for name in ("attempt", "pid", "exit_code")
                          if now_job.get(name) is not None}
                history.jobs.setdefault(key, []).append((at, str(now_job.get("state")), detail))
        if shadow.get("status") != before.status:
            history.marks.append((at, "status", f"run {shadow.get('status')}"))
        for key in sorted(set(shadow["observations"].get("store") or {}) - before.store if touched.observed else ()):
            entry = shadow["observations"]["store"][key] or {}
            findings = "; ".join(str(f) for f in entry.get("findings", []))
            history.marks.append((at, "repair", "store repaired: " + findings[:300]))

    def finish(self, records: List[Dict[str, Any]]) -> History:
        """The history, with the gaps the replayed ``records`` leave before, between and after them, and its span."""
        history, gaps = self.history, self.gaps
        origin = int(history.dropped["through"]) if history.dropped else 0
        if records and records[0]["rev"] > origin + 1 and not any(a == origin for a, _ in gaps):
            gaps.append((origin, int(records[0]["rev"])))
        if records and self.previous < int(history.state["revision"]):
            gaps.append((self.previous, int(history.state["revision"]) + 1))
        history.gaps = sorted(set(gaps))
        if records:
            # After a drop the page begins with what is kept; the drop's span is said, not drawn.
            first = _time(records[0]["at"])
            history.start = first if history.dropped else min(history.start, first)
            history.end = max(history.end, _time(records[-1]["at"]))
        history.summary.update(figures(history))
        return history


def build(records: List[Dict[str, Any]], state: Dict[str, Any],
          gaps: Optional[List[Tuple[int, int]]] = None) -> History:
    """The history of the run whose current state is ``state``, from its journal ``records`` (any order).

    :param gaps: revisions already known to be missing, as (last seen, next seen); the replay adds the ones it finds.
    """
    replay = _Replay(state, gaps)
    records = sorted({r["rev"]: r for r in records}.values(), key=lambda r: r["rev"])
    for record in records:
        replay.record(record)
    return replay.finish(records)


def load(store: Any) -> History:
    """The history of the run in ``store`` (any store): every record it holds, and what it says breaks the chain."""
    records, _oldest = store.records_after(0)
    history = build(records, store.state)
    for finding in getattr(store, "history_findings", ()):
        (history.damage if finding.level == "damage" else history.notes).append(finding.message)
    return history


class Recorder:
    """Keeps every journal record of a run while it runs, so that compaction cannot drop any unseen.

    ``open_store`` returns the run's store; it is called in the thread that
    polls. :meth:`poll` reads what is new; :meth:`start` polls every
    ``interval`` seconds in a daemon thread until :meth:`stop`. A gap can only
    appear if the journal was compacted twice between two polls; it is kept.
    """

    def __init__(self, open_store: Callable[[], Any]) -> None:
        self.open_store = open_store
        self.records: Dict[int, Dict[str, Any]] = {}
        self.gaps: List[Tuple[int, int]] = []
        self.last = 0
        self._store: Any = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def poll(self) -> None:
        """Read the records committed since the last poll; raises what opening or reading the store raises."""
        with self._lock:
            if self._store is None:
                self._store = self.open_store()
            records, _oldest = self._store.records_after(self.last)
            if records and int(records[0]["rev"]) > self.last + 1:
                self.gaps.append((self.last, int(records[0]["rev"])))
            for record in records:
                self.records[int(record["rev"])] = record
            if records:
                self.last = int(records[-1]["rev"])

    def try_poll(self) -> bool:
        """:meth:`poll`, for an observer that must never disturb the run: False when the store could not be read now."""
        try:
            self.poll()
            return True
        except (RunnerError, OSError, ValueError):  # the next poll, or the final one, reads it again
            self._store = None
            return False

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.try_poll()

    def start(self, interval: float = 0.25) -> "Recorder":
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="history-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def history(self) -> History:
        """Stop polling, read what is left, and build the history."""
        self.stop()
        self._store = None
        self.poll()
        self._store.refresh()
        return build(list(self.records.values()), self._store.state, self.gaps)
