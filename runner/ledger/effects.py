"""The effect ledger: every external side effect, keyed, digested and reconciled.

Lifecycle of one effect (``state["effects"][KEY]``)::

    planned -> started -> acknowledged -> verified
                  |            |
                  +-> uncertain <-+ -> verified   (observed present)
                  |                  -> absent     (observed missing, no receipt: one more attempt allowed)
                  +-> absent / failed            (observed missing or "not now" / refused for good)

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
  observed absent, one more bounded attempt is allowed after the contract's
  backoff; unknown, the run stops with needs-reconciliation. A timeout is
  never read as a failure.
* A receipt is proof. An effect whose record holds one is never begun again
  and never recorded absent: an absence observed after an acknowledgement is
  a contradiction for a person, not a reason to call again.
* Work done before the run (``effects.observe_first``) is found, not made:
  an effect with no record that the target already holds is recorded
  ``verified`` with no call and no attempt (:func:`found_ops`).
* Attempts are bounded: calls that may have created the effect by
  ``limits.max_effect_attempts`` (or ``effects.max_attempts``; 3 when neither
  is given), "not now" answers (``deferred``) by ``effects.max_rate_limited``
  (10 when not given). The record's ``attempts`` counts every begin; a call
  answered "not now" created nothing and is a *deferral*, so an effect's
  attempts are ``attempts - deferred`` (:func:`attempt_counts`), never above
  their limit.
* A failed effect is failed for good, unless a person reopens it
  (:func:`reopen_ops`, with who and why): it becomes absent with a new budget
  of attempts and deferrals, the spent ones kept in its ``reopened`` list.

The functions named ``*_ops`` are pure: ``(state, ...) -> ops`` or raise.
:mod:`runner.execution.lifecycle` decides one effect's next move and
:mod:`runner.execution.executor` carries it out against a target.
"""

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional

from .approvals import require_grant
from ..contract.spec import contract_of
from .envelope import Ops
from ..base.values import one_line, validate_id
from ..base.times import format_time
from ..base.canonical import canonical_json, check_document
from ..base.errors import (AlreadyVerified, Cancelled, Failed, InvalidInput, LimitExhausted, NeedsReconciliation,
                           RunComplete)
from .states import UNRESOLVED
from .retry import check_attempts, check_limits, check_wait, limit
from . import costs as _costs
from ..base.host import local_maker
from ..base.quoting import describe

if TYPE_CHECKING:  # the records are types only: nothing of them is loaded to run
    from .records import EffectRecord

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_RATE_LIMITED",
    "begin_ops",
    "ack_ops",
    "verify_ops",
    "found_ops",
    "absent_ops",
    "deferred_ops",
    "uncertain_ops",
    "failed_ops",
    "reopen_ops",
    "attempt_counts",
    "effect_caps",
    "kept_payload",
    "KEPT_PAYLOAD_BYTES",
    "FLAGS",
    "check_open",
]

#: Calls per effect that may have created it, when the contract names no limit.
DEFAULT_MAX_ATTEMPTS = 3
#: "Not now" answers (429, a 503 naming a delay, exit 75) per effect, when the contract names no limit.
DEFAULT_MAX_RATE_LIMITED = 10
#: Why an effect is marked for a person to check (its record's ``flags``): it may have a duplicate at the target.
FLAGS = {
    "absent-soon-after-takeover": "observed absent soon after a takeover, then invoked again: a call of the earlier "
                                  "holder could have landed late",
    "several-matches": "invoked more than once, and the target shows more than one match",
    "several-listed": "the target's listing holds more than one entry for it: one may be a duplicate, made before the "
                      "run or by another writer",
}

#: The largest payload an effect's record keeps whole (canonical JSON); a larger one is kept as its file's path.
KEPT_PAYLOAD_BYTES = 64 * 1024



# -- pure transitions ---------------------------------------------------------------

def _effect(state: Dict[str, Any], key: str) -> "EffectRecord":
    effect: Optional["EffectRecord"] = state["effects"].get(key)
    if effect is None:
        raise InvalidInput(f"no effect {key!r} in the ledger (begin it first)")
    return effect


def _set(key: str, field: str, value: Any) -> List[Any]:
    return ["set", ["effects", key, field], value]


def check_open(state: Dict[str, Any]) -> None:
    """Refuse new work on a run that is cancelled, complete or blocked."""
    cancellation = state["observations"].get("cancellation")
    if cancellation:
        raise Cancelled(f"run {state['task_id']} was cancelled by {cancellation['by']} at {cancellation['at']}: "
                        f"{cancellation['reason']}")
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
    steps = contract_of(state).steps
    finished = bool(steps) and all((state["steps"].get(s.id) or {}).get("state") == "done" for s in steps)
    # The scan over every effect comes last: while a step runs it is not needed,
    # so settling one effect of a long batch does not cost the whole ledger.
    if (not (cancelled or finished) or
        any(k != key and e.get("state") in UNRESOLVED for k, e in state["effects"].items())):
        return []
    return cancelled_ops(state) if cancelled else [["set", ["status"], "complete"], ["set", ["next_action"], None]]


def _owning_step(state: Dict[str, Any], key: str, step: Optional[str],
                 effect: Optional["EffectRecord"]) -> Optional[str]:
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
        raise InvalidInput(f"effect {key!r} belongs to the running step; --step {step!r} names another ({running})",
                           key=key, step=step)
    if current:
        return current
    for spec in contract_of(state).steps:
        if (state["steps"].get(spec.id) or {}).get("state") != "done":
            if spec.approval:
                raise InvalidInput(f"effect {key!r} would begin before step {spec.id!r}, which needs approval: "
                                   "start that step first", key=key, step=spec.id)
            break
    return effect.get("step") if effect else None


def effect_caps(state: Dict[str, Any]) -> Dict[str, float]:
    """The per-effect bounds of the run's contract: ``max_attempts`` and ``max_rate_limited``."""
    effects = contract_of(state).effects
    attempts = limit(state, "max_effect_attempts", effects.max_attempts)
    return {"max_attempts": float(attempts if attempts is not None else DEFAULT_MAX_ATTEMPTS),
            "max_rate_limited": float(effects.max_rate_limited)}


def attempt_counts(effect: Optional[Mapping[str, Any]]) -> Dict[str, int]:
    """An effect's calls that could have created it (``attempts``) and its "not now" answers (``deferrals``), apart.

    ``attempts`` and ``deferrals`` are those of the present budget (what the limits bound); ``*_total`` add the
    budgets spent before each reopening. A record of a run journaled before deferrals were counted apart has no
    ``deferred``: each of its begins is an attempt, as it was counted then.
    """
    effect = effect or {}
    deferrals = int(effect.get("deferred") or 0)
    attempts = max(0, int(effect.get("attempts") or 0) - deferrals)
    earlier = [r for r in effect.get("reopened") or [] if isinstance(r, dict)]
    return {"attempts": attempts, "deferrals": deferrals,
            "attempts_total": attempts + sum(int(r.get("attempts") or 0) for r in earlier),
            "deferrals_total": deferrals + sum(int(r.get("deferrals") or 0) for r in earlier),
            "reopened": len(earlier)}


def kept_payload(payload: Optional[Dict[str, Any]], source: Optional[str] = None) -> Dict[str, Any]:
    """What an effect's record keeps of its payload: the payload itself up to :data:`KEPT_PAYLOAD_BYTES`,
    else the file it came from (when known), so another session can run or reconcile the effect."""
    if payload is not None and len(canonical_json(payload)) <= KEPT_PAYLOAD_BYTES:
        return {"payload": payload}
    return {"payload_file": source} if source else {}


def begin_ops(state: Dict[str, Any], key: str, payload_digest: str, now: float, step: Optional[str] = None,
              resend: bool = False, kept: Optional[Dict[str, Any]] = None,
              maker: Optional[Dict[str, Any]] = None) -> Ops:
    """Commit ``started`` for ``key`` (before the target is called), or raise.

    The effect belongs to the running step (see :func:`_owning_step`); a gated
    one consumes a grant. ``resend`` lets an adapter that deduplicates be
    invoked again for an effect whose outcome is unknown. ``kept`` (from
    :func:`kept_payload`) is stored with the record the first time, so the
    payload can be sent again or reconciled from the run alone. ``attempts`` counts
    every begin; ``deferred`` those the target answered "not now", which do
    not count against ``max_attempts``. ``begun_by`` names the host and user
    that began this attempt (``maker``, else this process's), and the lease epoch
    it was begun under: a runner of another user on that host, who cannot see
    its calls in flight, refuses to touch the effect while it is ``started``
    (:mod:`runner.calls.inflight`), and a later holder knows the attempt for an earlier
    holder's by its epoch, never by comparing times.

    :raises AlreadyVerified: the effect is verified: done, the target must not be called again
        (also on a cancelled or complete run); the context carries the effect.
    :raises Failed: the effect failed for good.
    :raises NeedsReconciliation: the effect is unresolved and must be observed first, or it holds a
        receipt (the target acknowledged it): it is never begun again.
    :raises LimitExhausted: ``max_attempts`` or ``max_rate_limited`` is spent.
    :raises RetryLater: the persisted backoff has not ended.
    """
    validate_id(key, "effect key")
    effects = contract_of(state).effects
    if not effects.key_allowed(key):
        raise InvalidInput(f"effect key {key!r} does not match the contract's key_pattern {effects.key_pattern!r}")
    effect: Optional["EffectRecord"] = state["effects"].get(key)
    if effect is not None:
        if effect["payload_digest"] != payload_digest:
            raise InvalidInput(
                f"effect {key!r} was recorded with payload {effect['payload_digest']}; refusing a different payload "
                f"{payload_digest} under the same key",
                key=key,
            )
        current = effect["state"]
        if current == "verified":
            raise AlreadyVerified(f"effect {key!r} is already verified: it is done; do not call the target again",
                                  effect=key, record=effect)
        if current == "failed":
            raise Failed(f"effect {key!r} failed for good: {effect.get('reason')}", effect=key)
        if current in UNRESOLVED and not (resend and current in ("started", "uncertain")):
            raise NeedsReconciliation(f"effect {key!r} is {current}: observe the target (effect verify/absent) before "
                                      "anything is retried", key=key, state=current)
        if effect.get("receipt") is not None:
            raise NeedsReconciliation(f"effect {key!r} holds the target's receipt "
                                      f"({describe(effect['receipt'], 120)}): a receipt is proof; it is never begun "
                                      "again", key=key, state=current)
    check_open(state)
    step = _owning_step(state, key, step, effect)
    check_limits(state, now)
    attempts = effect["attempts"] if effect else 0
    deferred = int(effect.get("deferred", 0)) if effect else 0
    caps = effect_caps(state)
    check_attempts(attempts - deferred, caps["max_attempts"], f"effect {key}", "max_effect_attempts")
    check_attempts(deferred, caps["max_rate_limited"], f"effect {key} (answers of 'not now')", "max_rate_limited")
    if effect is not None:
        check_wait(effect, now, f"effect {key}")
    reserved = _costs.reservation(state)
    _costs.check_fits(state, key, reserved)
    ops: Ops = []
    gated = effects.needs_approval(key) or any(s.approval and s.id == step for s in contract_of(state).steps)
    if gated:
        if not step:
            raise InvalidInput(f"effect {key!r} needs approval, which is bound to a step: start the step first",
                               key=key)
        ops += require_grant(state, step, f"effect:{key}", payload_digest, now, key)
    stamp = format_time(now)
    record = {
        "state": "started",
        "payload_digest": payload_digest,
        "attempts": attempts + 1,
        "step": step,
        "started_at": effect["started_at"] if effect else stamp,
        "updated_at": stamp,
        "receipt": None,
        "evidence": None,
        "reason": None,
        "next_attempt_at": None,
        "begun_by": dict(maker if maker is not None else local_maker(), epoch=int(state["lease"].get("epoch") or 0)),
    }
    if deferred:
        record["deferred"] = deferred
    if resend and effect is not None and effect["state"] in UNRESOLVED:
        record["resent"] = True  # the earlier call's outcome is unknown: this attempt's answer does not settle it alone
    for field in ("payload", "payload_file", "flags", "cost", "cost_estimated", "reopened"):
        if effect is not None and field in effect:
            record[field] = effect[field]
    # The reservation of an earlier call whose outcome is unknown stays with this one's.
    held = _costs.summed((effect.get("reserved") if effect else None) or {}, reserved)
    if held:
        record["reserved"] = held
    if effect is None or not ({"payload", "payload_file"} & set(effect)):
        record.update(kept or {})
    ops.append(["set", ["effects", key], record])
    ops.append(["set", ["counters", "effect_attempts"], int(state["counters"].get("effect_attempts", 0)) + 1])
    return ops + _costs.reserve_ops(state, reserved)


def ack_ops(state: Dict[str, Any], key: str, receipt: Dict[str, Any], now: float) -> Ops:
    """``started``/``uncertain`` -> ``acknowledged``, keeping the target's receipt and the cost read from it
    (:func:`runner.ledger.costs.read_cost`), which replaces the call's reservation in the same transition."""
    check_document(receipt, "receipt")
    effect = _effect(state, key)
    current = effect["state"]
    if current in ("acknowledged", "verified") and effect.get("receipt") == receipt:
        return []
    if current not in ("started", "uncertain"):
        raise InvalidInput(f"effect {key!r} is {current}; only a started or uncertain effect can be acknowledged")
    cost, estimated = _costs.read_cost(state, receipt, effect.get("reserved") or {})
    return ([_set(key, "state", "acknowledged"), _set(key, "receipt", receipt),
             _set(key, "updated_at", format_time(now))]
            + _costs.charge_ops(state, key, cost, estimated) + _costs.release_ops(state, key))


def _resolve(state: Dict[str, Any], key: str, to: str, field: str, value: Any, allowed: tuple, now: float,
             reconciled: bool = False) -> Ops:
    effect = _effect(state, key)
    current = effect["state"]
    if current == to:
        return []
    if current not in allowed:
        raise InvalidInput(f"effect {key!r} is {current}; it cannot become {to} (allowed from: {', '.join(allowed)})")
    stamp = format_time(now)
    ops = [_set(key, "state", to), _set(key, field, value), _set(key, "updated_at", stamp)]
    if to in ("verified", "absent", "failed") and effect.get("reserved"):
        if to == "verified":  # made, and its answer never recorded: what was reserved is the cost known
            ops += _costs.charge_ops(state, key, effect["reserved"], sorted(effect["reserved"]))
        ops += _costs.release_ops(state, key)
    if to in ("verified", "absent", "failed"):
        ops.append(["set", ["counters", "last_progress_at"], stamp])
        ops += _settle_ops(state, key)
        if reconciled:
            # Settled by observing an effect whose outcome this worker did not know.
            ops.append(["set", ["counters", "reconciled_effects"],
                        int(state["counters"].get("reconciled_effects", 0)) + 1])
    elif to == "uncertain":
        ops.append(["set", ["counters", "uncertain_effects"], int(state["counters"].get("uncertain_effects", 0)) + 1])
    return ops


def verify_ops(state: Dict[str, Any], key: str, evidence: Dict[str, Any], now: float, reconciled: bool = False) -> Ops:
    """The effect was observed at the target: it is done.

    An effect invoked more than once whose evidence shows more than one match (``matches`` above 1)
    is flagged ``several-matches`` for a person to check; one whose evidence says a listing held
    more than one entry for it (``possible_duplicate``), ``several-listed``, however often it was invoked.
    """
    check_document(evidence, "evidence")
    ops = _resolve(state, key, "verified", "evidence", evidence, UNRESOLVED, now, reconciled)
    effect = state["effects"][key]
    matches = evidence.get("matches")
    calls = int(effect.get("attempts", 0)) - int(effect.get("deferred", 0))
    flags = []
    if ops and isinstance(matches, int) and not isinstance(matches, bool) and matches > 1 and calls > 1:
        flags.append("several-matches")
    if ops and evidence.get("possible_duplicate") is True:
        flags.append("several-listed")
    if flags:
        ops += _flag_ops(effect, key, *flags)
    return ops


def found_ops(state: Dict[str, Any], key: str, payload_digest: str, evidence: Dict[str, Any], now: float,
              step: Optional[str] = None, kept: Optional[Dict[str, Any]] = None) -> Ops:
    """The target was found to hold ``key``'s effect before any call of this run (``effects.observe_first``): its
    record is made ``verified`` with no attempt, so the target is never called for it.

    The record keeps the digest of the payload the run would have sent (a lookup says the key is there, not with
    which payload) and ``kept`` (:func:`kept_payload`); it belongs to the running step (:func:`_owning_step`). An
    evidence that says a listing held more than one entry for the key (``possible_duplicate``) flags it
    ``several-listed``. Nothing is called, so no grant, attempt or limit is spent.

    :raises NeedsReconciliation: the key has a record already (it was begun since it was looked up): it is
        reconciled as any begun effect is. A verified record with the same payload digest makes this no change.
    :raises Cancelled: the run is cancelled (likewise complete or blocked: :func:`check_open`).
    """
    validate_id(key, "effect key")
    check_document(evidence, "evidence")
    if not contract_of(state).effects.key_allowed(key):
        raise InvalidInput(f"effect key {key!r} does not match the contract's key_pattern "
                           f"{contract_of(state).effects.key_pattern!r}")
    effect: Optional["EffectRecord"] = state["effects"].get(key)
    if effect is not None:
        if effect["state"] == "verified" and effect["payload_digest"] == payload_digest:
            return []
        raise NeedsReconciliation(f"effect {key!r} is {effect['state']}: it was begun since it was looked up; it is "
                                  "reconciled as any begun effect is", key=key, state=effect["state"])
    check_open(state)
    stamp = format_time(now)
    record: Dict[str, Any] = {
        "state": "verified",
        "payload_digest": payload_digest,
        "attempts": 0,
        "step": _owning_step(state, key, step, None),
        "started_at": stamp,
        "updated_at": stamp,
        "receipt": None,
        "evidence": evidence,
        "reason": None,
        "next_attempt_at": None,
    }
    if evidence.get("possible_duplicate") is True:
        record["flags"] = ["several-listed"]
    record.update(kept or {})
    ops: Ops = [["set", ["effects", key], record], ["set", ["counters", "last_progress_at"], stamp]]
    return ops + _settle_ops(state, key)


def absent_ops(state: Dict[str, Any], key: str, evidence: Dict[str, Any], now: float, reconciled: bool = False,
               backoff: Optional[Callable[[int], str]] = None, flag: Optional[str] = None) -> Ops:
    """The target was observed not to hold the effect: one more bounded attempt is allowed, not before
    ``backoff(attempts)``.

    ``backoff`` is given the effect's attempts so far, once the effect is known
    to exist. ``flag`` marks the effect for a person to check (see :data:`FLAGS`),
    kept across its later attempts.

    :raises NeedsReconciliation: the effect holds a receipt: the target acknowledged it, so an
        absence is a contradiction to settle by observing again or by a person, never a reason to call again.
    """
    check_document(evidence, "evidence")
    effect = _effect(state, key)
    if effect.get("receipt") is not None:
        raise NeedsReconciliation(
            f"effect {key!r} was acknowledged by the target (receipt {describe(effect['receipt'], 120)}); an absence "
            "contradicts it: observe again (the target may lag: effects.settle_seconds), verify it if it is there, or "
            "leave it to a person; it is never called again under this key", key=key, state=effect["state"])
    ops = _resolve(state, key, "absent", "evidence", evidence, ("started", "uncertain"), now, reconciled)
    if ops and backoff is not None:
        ops += schedule_ops(state, key, backoff(effect["attempts"]))
    if ops and flag is not None:
        ops += _flag_ops(effect, key, flag)
    return ops


def _flag_ops(effect: "EffectRecord", key: str, *flags: str) -> Ops:
    kept = list(effect.get("flags") or [])
    added = [flag for flag in flags if flag not in kept]
    return [_set(key, "flags", kept + added)] if added else []


def deferred_ops(state: Dict[str, Any], key: str, evidence: Dict[str, Any], now: float, not_before: str) -> Ops:
    """The target said it created nothing for now (429, a 503 naming a delay, exit 75): absent, counted apart, next call
    not before ``not_before``.

    Said of a resend of an unknown outcome (``resent``), it says nothing of the earlier call: the effect
    goes back to uncertain, not absent, so that it is observed (or resent) again, never called afresh.
    """
    check_document(evidence, "evidence")
    effect = _effect(state, key)
    if effect.get("resent") and effect["state"] == "started":
        reason = (f"the resend was refused for now ({describe(evidence, 200)}); the earlier call's outcome is still "
                  "unknown")
        ops = [_set(key, "state", "uncertain"), _set(key, "reason", one_line(reason[:2000], "reason")),
               _set(key, "updated_at", format_time(now))]
        return ops + schedule_ops(state, key, not_before) + [_set(key, "deferred", int(effect.get("deferred", 0)) + 1)]
    ops = _resolve(state, key, "absent", "evidence", evidence, ("started",), now)
    if not ops:
        return ops
    return ops + schedule_ops(state, key, not_before) + [_set(key, "deferred", int(effect.get("deferred", 0)) + 1)]


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


def reopen_ops(state: Dict[str, Any], key: str, by: str, reason: str, now: float) -> Ops:
    """A person gives a failed effect a new budget of attempts: it becomes absent, called again at the next drive.

    The record's ``reopened`` list keeps who, why, when, the failure and the attempts and deferrals it had spent;
    its counts start again from zero, so its attempts stay within ``max_attempts`` in each budget.

    :raises InvalidInput: no such effect, it is not failed, it holds a receipt (the target applied it), its batch item
        was skipped, or a bad ``by`` or ``reason``; the run is not active (:func:`check_open`).
    """
    validate_id(by, "--by")
    one_line(reason, "--reason")
    effect = _effect(state, key)
    if effect["state"] != "failed":
        raise InvalidInput(f"effect {key!r} is {effect['state']}; only a failed effect is reopened", key=key)
    if effect.get("receipt") is not None:
        raise InvalidInput(f"effect {key!r} holds the target's receipt ({describe(effect['receipt'], 120)}): a receipt "
                           "is proof; it is never called again under this key", key=key)
    skipped_in = [step for step, record in state["steps"].items()
                  if key in ((record or {}).get("batch") or {}).get("skipped", {})]
    if skipped_in:
        raise InvalidInput(f"effect {key!r} is the item of step {skipped_in[0]!r} that was skipped; a skipped item is "
                           "not called again", key=key)
    check_open(state)
    counts = attempt_counts(effect)
    stamp = format_time(now)
    entry = {"by": by, "reason": reason, "at": stamp, "failure": effect.get("reason"),
             "attempts": counts["attempts"], "deferrals": counts["deferrals"]}
    return [_set(key, "state", "absent"), _set(key, "attempts", 0), _set(key, "deferred", 0),
            _set(key, "reason", None), _set(key, "next_attempt_at", None), _set(key, "updated_at", stamp),
            _set(key, "reopened", list(effect.get("reopened") or []) + [entry]),
            ["set", ["counters", "last_progress_at"], stamp]]


def schedule_ops(state: Dict[str, Any], key: str, not_before: str) -> Ops:
    return [_set(key, "next_attempt_at", not_before)]
