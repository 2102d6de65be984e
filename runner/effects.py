"""The effect ledger: every external side effect, keyed, digested and reconciled.

Lifecycle of one effect (``state["effects"][KEY]``)::

    planned -> started -> acknowledged -> verified
                  |            |
                  +-> uncertain <-+ -> verified   (observed present)
                  |            \\--> absent     (observed missing: one more attempt allowed)
                  +-> absent / failed            (observed missing / refused for good)

* ``started`` is committed durably *before* the target is called, so a crash
  at any later moment leaves a record that says "this may have happened".
* A response is an acknowledgement, not proof; only ``verified`` (the effect
  was observed at the target) counts as done.
* The key is the caller's stable name for the business action; it must not
  hold attempt numbers or fresh random values. The payload digest is
  ``sha256:`` of the payload's canonical JSON. The same key with another
  payload is refused before anything is called.
* An unresolved effect (started, acknowledged, uncertain) is reconciled
  before anything else happens to it: observed present, it is verified;
  observed absent, one more bounded attempt is allowed; unknown, the run
  stops with needs-reconciliation. A timeout is never read as a failure.

The functions named ``*_ops`` are pure: ``(state, ...) -> ops`` or raise. The
:class:`Adapter` protocol and :func:`drive_effect` run a target through the
whole lifecycle, resuming correctly from whatever the ledger holds.
"""

import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol

from .approvals import require_grant
from .contract import effect_needs_approval, key_allowed
from .envelope import MAX_DOCUMENT_BYTES, Ops, canonical_json, check_nesting, content_digest, format_time, one_line, parse_time, validate_id
from .errors import AlreadyVerified, Cancelled, Failed, Fenced, InvalidInput, LimitExhausted, NeedsReconciliation, RunComplete
from .retry import check_attempts, check_limits, check_wait, limit
from .windows import NO_HOOKS, Hooks


__all__ = [
    "EFFECT_STATES",
    "UNRESOLVED",
    "Observation",
    "Adapter",
    "UnknownOutcome",
    "NotApplied",
    "Rejected",
    "StaleEpoch",
    "begin_ops",
    "ack_ops",
    "verify_ops",
    "absent_ops",
    "uncertain_ops",
    "failed_ops",
    "drive_effect",
    "check_document",
]

EFFECT_STATES = ("planned", "started", "acknowledged", "verified", "uncertain", "absent", "failed")
UNRESOLVED = ("started", "acknowledged", "uncertain")



# -- the adapter contract -------------------------------------------------------

class Observation(NamedTuple):
    """What looking at the target found: ``present``, ``absent`` or ``unknown``, with evidence."""

    status: str
    evidence: Dict[str, Any]


class UnknownOutcome(Exception):
    """The call may or may not have taken effect: a timeout, a dropped connection."""


class NotApplied(Exception):
    """The target says, with certainty, that it did not apply the call (e.g. refused before processing)."""


class Rejected(Exception):
    """The target refused the call for good (for example, a known key with another payload)."""


class StaleEpoch(Exception):
    """The target refused the call because its fencing epoch is older than one it has seen."""


class Adapter(Protocol):
    """What the runner needs from a target. Declare the four facts; implement the two calls.

    ``key_scope``: where keys are unique (e.g. "per ticket service").
    ``retention_seconds``: how long the target remembers a key (None: forever).
    ``conflicting_payload``: what it does with a known key and another payload.
    ``verification``: how ``observe`` establishes presence (lookup by key, by business marker...).
    ``deduplicates``: True when invoking again with the same key and payload,
    within retention, returns the original receipt and makes no second effect.
    """

    name: str
    key_scope: str
    retention_seconds: Optional[float]
    conflicting_payload: str
    verification: str
    deduplicates: bool

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """Perform the effect; return a receipt. Raise UnknownOutcome, NotApplied, Rejected or StaleEpoch."""
        ...

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        """Look at the target: is the effect for ``key`` there? Never performs it."""
        ...


# -- pure transitions ---------------------------------------------------------------

def check_document(value: Any, what: str) -> Dict[str, Any]:
    """A receipt, evidence or payload: a JSON object within the size limit."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    try:
        check_nesting(value)
        size = len(canonical_json(value))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if size > MAX_DOCUMENT_BYTES:
        raise InvalidInput(f"{what} is {size} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    return value


def _effect(state: Dict[str, Any], key: str) -> Dict[str, Any]:
    effect = state["effects"].get(key)
    if effect is None:
        raise InvalidInput(f"no effect {key!r} in the ledger (begin it first)")
    return effect


def _set(key: str, field: str, value: Any) -> List[Any]:
    return ["set", ["effects", key, field], value]


def _check_open(state: Dict[str, Any]) -> None:
    """Refuse new work on a run that is cancelled, complete or blocked."""
    cancellation = state["observations"].get("cancellation")
    if cancellation:
        raise Cancelled(f"run {state['task_id']} was cancelled by {cancellation['by']} at {cancellation['at']}: {cancellation['reason']}")
    status = state["status"]
    if status == "complete":
        raise RunComplete(f"run {state['task_id']} is complete")
    if status == "blocked":
        stop = state.get("next_action") or {}
        detail = f"run {state['task_id']} is blocked: {stop.get('detail', 'a limit was exhausted')}"
        if stop.get("reason") == "failed":
            raise Failed(detail, step=stop.get("step"))
        raise LimitExhausted(detail, limit=stop.get("limit"))
    if status != "active":
        raise InvalidInput(f"run {state['task_id']} is {status}")


def cancelled_ops(state: Dict[str, Any]) -> Ops:
    """The run becomes ``cancelled``; a step still running ends as ``cancelled`` with it."""
    ops: Ops = [["set", ["status"], "cancelled"], ["set", ["next_action"], None]]
    current = state.get("current_step")
    if current:
        ops += [["set", ["steps", current, "state"], "cancelled"], ["set", ["current_step"], None]]
    return ops


def _settle_ops(state: Dict[str, Any], key: str) -> Ops:
    """After ``key`` resolves with nothing else in flight: a cancelled run becomes
    ``cancelled``, and a run whose every step is done becomes ``complete``."""
    if state["status"] != "active":
        return []
    cancelled = bool(state["observations"].get("cancellation"))
    steps = state["plan"].get("steps", [])
    finished = bool(steps) and all((state["steps"].get(s["id"]) or {}).get("state") == "done" for s in steps)
    # The scan over every effect comes last: while a step runs it is not needed,
    # so settling one effect of a long batch does not cost the whole ledger.
    if not (cancelled or finished) or any(k != key and e.get("state") in UNRESOLVED for k, e in state["effects"].items()):
        return []
    return cancelled_ops(state) if cancelled else [["set", ["status"], "complete"], ["set", ["next_action"], None]]


def _owning_step(state: Dict[str, Any], key: str, step: Optional[str], effect: Optional[Dict[str, Any]]) -> Optional[str]:
    """The step an effect begun now belongs to: the running step, and no other.

    ``step`` (the caller's ``--step``) may only name the running step. With no
    step running, an effect belongs to no step (a new attempt keeps the step
    it was first begun in), and it is refused when the next step to run needs
    approval, so a gated step's effect cannot slip in before the step starts.
    """
    current = state.get("current_step")
    if step is not None and step != current:
        validate_id(step, "step")
        running = f"the running step is {current!r}" if current else "no step is running"
        raise InvalidInput(f"effect {key!r} belongs to the running step; --step {step!r} names another ({running})", key=key, step=step)
    if current:
        return current
    for spec in state["plan"].get("steps", []):
        if (state["steps"].get(spec["id"]) or {}).get("state") != "done":
            if spec.get("approval"):
                raise InvalidInput(f"effect {key!r} would begin before step {spec['id']!r}, which needs approval: start that step first",
                                   key=key, step=spec["id"])
            break
    return effect.get("step") if effect else None


def begin_ops(state: Dict[str, Any], key: str, payload_digest: str, now: float, step: Optional[str] = None, resend: bool = False) -> Ops:
    """Commit ``started`` for ``key`` (before the target is called), or raise.

    The effect belongs to the running step (see :func:`_owning_step`); a gated
    one consumes a grant. ``resend`` lets an adapter that deduplicates be
    invoked again for an effect whose outcome is unknown.

    :raises AlreadyVerified: the effect is verified: done, the target must not be called again
        (also on a cancelled or complete run); the context carries the effect.
    :raises Failed: the effect failed for good.
    :raises NeedsReconciliation: the effect is unresolved and must be observed first.
    """
    validate_id(key, "effect key")
    if not key_allowed(state["plan"], key):
        raise InvalidInput(f"effect key {key!r} does not match the contract's key_pattern {state['plan']['effects']['key_pattern']!r}")
    effect = state["effects"].get(key)
    if effect is not None:
        if effect["payload_digest"] != payload_digest:
            raise InvalidInput(
                f"effect {key!r} was recorded with payload {effect['payload_digest']}; refusing a different payload {payload_digest} under the same key",
                key=key,
            )
        current = effect["state"]
        if current == "verified":
            raise AlreadyVerified(f"effect {key!r} is already verified: it is done; do not call the target again", effect=key, record=effect)
        if current == "failed":
            raise Failed(f"effect {key!r} failed for good: {effect.get('reason')}", effect=key)
        if current in UNRESOLVED and not (resend and current in ("started", "uncertain")):
            raise NeedsReconciliation(f"effect {key!r} is {current}: observe the target (effect verify/absent) before anything is retried", key=key, state=current)
    _check_open(state)
    step = _owning_step(state, key, step, effect)
    check_limits(state, now)
    attempts = effect["attempts"] if effect else 0
    check_attempts(attempts, limit(state, "max_effect_attempts", state["plan"].get("effects", {}).get("max_attempts")), f"effect {key}", "max_effect_attempts")
    if effect is not None:
        check_wait(effect, now, f"effect {key}")
    ops: Ops = []
    gated = effect_needs_approval(state["plan"], key) or any(s.get("approval") and s["id"] == step for s in state["plan"].get("steps", []))
    if gated:
        if not step:
            raise InvalidInput(f"effect {key!r} needs approval, which is bound to a step: start the step first", key=key)
        ops += require_grant(state, step, f"effect:{key}", payload_digest, now, key)
    stamp = format_time(now)
    record = {
        "state": "started",
        "payload_digest": payload_digest,
        "attempts": attempts + 1,
        "step": step,
        "started_at": effect["started_at"] if effect else stamp,
        "updated_at": stamp,
        "receipt": effect.get("receipt") if effect else None,
        "evidence": None,
        "reason": None,
        "next_attempt_at": None,
    }
    ops.append(["set", ["effects", key], record])
    ops.append(["set", ["counters", "effect_attempts"], int(state["counters"].get("effect_attempts", 0)) + 1])
    return ops


def ack_ops(state: Dict[str, Any], key: str, receipt: Dict[str, Any], now: float) -> Ops:
    """``started``/``uncertain`` -> ``acknowledged``, keeping the target's receipt."""
    check_document(receipt, "receipt")
    effect = _effect(state, key)
    current = effect["state"]
    if current in ("acknowledged", "verified") and effect.get("receipt") == receipt:
        return []
    if current not in ("started", "uncertain"):
        raise InvalidInput(f"effect {key!r} is {current}; only a started or uncertain effect can be acknowledged")
    return [_set(key, "state", "acknowledged"), _set(key, "receipt", receipt), _set(key, "updated_at", format_time(now))]


def _resolve(state: Dict[str, Any], key: str, to: str, field: str, value: Any, allowed: tuple, now: float, reconciled: bool = False) -> Ops:
    effect = _effect(state, key)
    current = effect["state"]
    if current == to:
        return []
    if current not in allowed:
        raise InvalidInput(f"effect {key!r} is {current}; it cannot become {to} (allowed from: {', '.join(allowed)})")
    stamp = format_time(now)
    ops = [_set(key, "state", to), _set(key, field, value), _set(key, "updated_at", stamp)]
    if to in ("verified", "absent", "failed"):
        ops.append(["set", ["counters", "last_progress_at"], stamp])
        ops += _settle_ops(state, key)
        if reconciled:
            # Settled by observing an effect whose outcome this worker did not know.
            ops.append(["set", ["counters", "reconciled_effects"], int(state["counters"].get("reconciled_effects", 0)) + 1])
    elif to == "uncertain":
        ops.append(["set", ["counters", "uncertain_effects"], int(state["counters"].get("uncertain_effects", 0)) + 1])
    return ops


def verify_ops(state: Dict[str, Any], key: str, evidence: Dict[str, Any], now: float, reconciled: bool = False) -> Ops:
    """The effect was observed at the target: it is done."""
    check_document(evidence, "evidence")
    return _resolve(state, key, "verified", "evidence", evidence, ("started", "acknowledged", "uncertain"), now, reconciled)


def absent_ops(state: Dict[str, Any], key: str, evidence: Dict[str, Any], now: float, reconciled: bool = False) -> Ops:
    """The target was observed not to hold the effect: one more bounded attempt is allowed."""
    check_document(evidence, "evidence")
    return _resolve(state, key, "absent", "evidence", evidence, ("started", "uncertain"), now, reconciled)


def uncertain_ops(state: Dict[str, Any], key: str, reason: str, now: float) -> Ops:
    """The outcome is unknown (timeout, crash): it must be observed before any retry."""
    one_line(reason, "reason")
    effect = _effect(state, key)
    if effect["state"] == "uncertain":
        return [] if effect.get("reason") == reason else [_set(key, "reason", reason)]
    return _resolve(state, key, "uncertain", "reason", reason, ("started", "acknowledged"), now)


def failed_ops(state: Dict[str, Any], key: str, reason: str, now: float) -> Ops:
    """The target refused the effect for good; it will not be retried."""
    return _resolve(state, key, "failed", "reason", reason, ("started", "uncertain"), now)


def schedule_ops(state: Dict[str, Any], key: str, not_before: str) -> Ops:
    return [_set(key, "next_attempt_at", not_before)]


# -- the whole lifecycle in one call ------------------------------------------------------

def _within_retention(effect: Dict[str, Any], adapter: Adapter, now: float) -> bool:
    retention = getattr(adapter, "retention_seconds", None)
    return retention is None or now < parse_time(effect["started_at"]) + float(retention)


def drive_effect(run: Any, key: str, payload: Dict[str, Any], adapter: Adapter, *, step: Optional[str] = None,
                 sleep: Callable[[float], None] = time.sleep, hooks: Optional[Hooks] = None) -> Dict[str, Any]:
    """Take ``key`` to ``verified`` through ``adapter``, from whatever state the ledger holds.

    ``run`` is a :class:`runner.run.Run` holding the lease. Never calls the
    target for a verified effect; reconciles an unresolved one by observation
    before anything else; retries only after the target was observed not to
    have the effect (or, for a deduplicating adapter within its retention
    window, by resending the same key and payload); stops with
    :class:`NeedsReconciliation` when the outcome cannot be established.
    ``hooks`` (default: the run's) receives the effect windows of :mod:`runner.windows`.
    """
    hooks = hooks if hooks is not None else getattr(run, "hooks", NO_HOOKS)
    digest = content_digest(check_document(payload, "payload"))
    while True:
        effect = run.state["effects"].get(key)
        current = effect["state"] if effect else None
        if effect is not None and effect["payload_digest"] != digest:
            raise InvalidInput(f"effect {key!r} was recorded with payload {effect['payload_digest']}; refusing a different payload {digest} under the same key", key=key)
        if current == "verified":
            return effect
        if current == "failed":
            raise Failed(f"effect {key!r} failed for good: {effect.get('reason')}", effect=key)
        resend = False
        if current in UNRESOLVED:
            seen = adapter.observe(key, payload)
            if seen.status == "present":
                hooks.reached("effect:before-verify", key=key)
                run.effect_verify(key, seen.evidence, reconciled=True)
                continue
            if seen.status == "absent" and current != "acknowledged":
                run.effect_absent(key, seen.evidence, reconciled=True)
                continue
            if seen.status == "absent":
                # The target acknowledged it, yet it cannot be seen: never retry on that contradiction.
                run.effect_uncertain(key, f"acknowledged but observation says absent: {seen.evidence}")
                raise NeedsReconciliation(f"effect {key!r} was acknowledged but the target does not show it ({seen.evidence})", key=key)
            if current != "uncertain":
                run.effect_uncertain(key, f"observation was inconclusive: {seen.evidence}")
            if not (adapter.deduplicates and _within_retention(run.state["effects"][key], adapter, run.clock())):
                raise NeedsReconciliation(
                    f"effect {key!r}: the target cannot say whether it happened ({seen.evidence}); it will not be retried blindly",
                    key=key,
                )
            resend = True
        if current == "absent":
            effect = run.state["effects"][key]
            wait = parse_time(effect["next_attempt_at"]) - run.clock() if effect.get("next_attempt_at") else 0
            if wait > 0:
                sleep(wait)
        hooks.reached("effect:before-started", key=key)
        run.effect_begin(key, payload, step=step, resend=resend)
        hooks.reached("effect:after-started", key=key)
        try:
            receipt = _call(adapter, key, payload, run.epoch, hooks)
        except UnknownOutcome as exc:
            run.effect_uncertain(key, f"unknown outcome: {exc}")
            continue  # reconcile by observation on the next turn, never by blind retry
        except NotApplied as exc:
            run.effect_absent(key, {"not_applied": str(exc)}, backoff=True)
            continue
        except StaleEpoch as exc:
            run.effect_uncertain(key, f"target refused a stale epoch: {exc}")
            raise Fenced(f"the target refused epoch {run.epoch} for effect {key!r}: {exc}") from None
        except Rejected as exc:
            run.effect_failed(key, f"rejected by the target: {exc}")
            raise Failed(f"effect {key!r} was rejected by the target: {exc}", effect=key) from None
        run.effect_ack(key, receipt)
        hooks.reached("effect:after-ack", key=key)
        seen = adapter.observe(key, payload)
        if seen.status == "present":
            hooks.reached("effect:before-verify", key=key)
            run.effect_verify(key, {**seen.evidence, "receipt": receipt})
            continue
        # The target said yes but cannot be seen to hold it: never retry on
        # that contradiction; stop until an observation settles it.
        run.effect_uncertain(key, f"acknowledged but observation says {seen.status}: {seen.evidence}")
        raise NeedsReconciliation(f"effect {key!r} was acknowledged but could not be verified ({seen.status}: {seen.evidence})", key=key)


def _call(adapter: Adapter, key: str, payload: Dict[str, Any], epoch: Any, hooks: Hooks) -> Dict[str, Any]:
    """The target's call; the ``effect:after-call`` window is passed whatever the call did."""
    try:
        return adapter.invoke(key, payload, epoch)
    finally:
        hooks.reached("effect:after-call", key=key)
