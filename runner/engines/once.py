"""One external effect, at most once across an engine's retries: observe before invoking again.

An engine keeps its own durable history, so inside it the runner's store is
not needed; what the engine does not give is the window between a target
committing an effect and the engine recording that the step returned. A
Temporal activity whose worker dies there is retried; a DBOS step runs
again on recovery. Both then call the target a second time. This module
closes that window with the runner's lifecycle (:func:`runner.execution.lifecycle.next_move`),
applied to a target through the same :class:`runner.calls.target.Adapter` protocol the runner uses:

* the key is stable: the workflow's id and the caller's logical key, never
  an attempt number (:func:`effect_key`);
* the payload is bound by its digest, and a target that already holds the
  key with another payload is a conflict, never retried (:class:`EffectConflict`);
* an attempt that may follow an earlier one (any retry, a recovery, or a
  first attempt the caller says may have been preceded) observes the target
  first and invokes only after an observed absence;
* an outcome that stays unknown is :class:`EffectUncertain`: the workflow
  must wait for reconciliation (an observation), not retry blindly;
* success means observed at the target (verified), not "the call returned".

``on_window(window, key)`` is called at each commit window (``before-invoke``,
``after-invoke``, ``after-verify``) so that tests and fault injection can
act there without patching anything.
"""

import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, cast

from ..base.values import validate_id
from ..base.times import format_time
from ..base.canonical import content_digest
from ..base.errors import Failed, Fenced, NeedsReconciliation
from ..calls.answers import Answer, AnswerKind, Seen, SeenStatus, call_target
from ..execution.lifecycle import Caps, Facts, next_move
from ..calls.target import Adapter, NotApplied, Observation
from ..contract.spec import EffectsSpec
from ..ledger.costs import priced

__all__ = ["effect_key", "perform_once", "observe_once", "EffectUncertain", "EffectConflict", "WINDOWS"]

#: The commit windows of one effect, in the order they are passed.
WINDOWS = ("before-invoke", "after-invoke", "after-verify")


class EffectUncertain(Exception):
    """The target may or may not hold the effect; only an observation may settle it. Never retry blindly."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"effect {key}: outcome unknown ({detail}); observe the target before any retry")
        self.key, self.detail = key, detail


class EffectConflict(Exception):
    """The target refused the effect for good (for example, the key is held with another payload)."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"effect {key}: refused for good ({detail})")
        self.key, self.detail = key, detail


def effect_key(workflow_id: str, logical_key: str) -> str:
    """The effect's key inside one workflow: stable across attempts, recoveries and worker restarts."""
    return validate_id(f"{workflow_id}:{logical_key}", "effect key")


def _nothing(window: str, key: str) -> None:
    """The default ``on_window``: no fault injection."""


def observe_once(adapter: Adapter, key: str, payload: Dict[str, Any]) -> Observation:
    """Observe ``key`` at the target; an observer's failure is an unknown observation, never an absence."""
    try:
        return adapter.observe(key, payload)
    except Exception as exc:  # a lookup that failed says nothing about the target
        return Observation("unknown", {"error": f"{type(exc).__name__}: {exc}"})


def perform_once(
    adapter: Adapter,
    key: str,
    payload: Dict[str, Any],
    *,
    maybe_done: bool,
    epoch: int = 0,
    on_window: Callable[[str, str], None] = _nothing,
    clock: Callable[[], float] = time.time,
    cost: Sequence[Tuple[str, Sequence[Tuple[str, float]]]] = (),
) -> Dict[str, Any]:
    """Bring ``key`` with ``payload`` to verified at the target, calling it at most once per observed absence.

    The moves are :func:`runner.execution.lifecycle.next_move`'s, carried out against a
    record kept in memory (the engine keeps the durable history): an earlier
    attempt that may have reached the target is an ``uncertain`` effect, so
    it is observed first, and the target is called only after an observed
    absence, once per call of this function.

    :param maybe_done: an earlier attempt may have reached the target (every retry, every
        recovery; a first attempt when the workflow says so): observe first.
    :param epoch: the fencing epoch passed to the target.
    :param cost: each named cost as terms read from the receipt (a contract's ``effects.cost``, as
        :attr:`runner.contract.spec.EffectsSpec.cost` holds it).
    :returns: ``{"key", "payload_digest", "receipt", "evidence", "invoked"}``; ``invoked`` is
        False when an earlier attempt's effect was found and reused. With ``cost``, also ``"cost"``: what
        this call's answer says it cost (``{}`` when no call of this attempt was answered), and
        ``"cost_unread"``: the names its receipt did not hold. The engine records them with the result, in
        the same commit, so a cost is never recorded apart from its answer.
    :raises EffectUncertain: the outcome stays unknown after the call or the observation.
    :raises EffectConflict: the target refused the effect for good.
    :raises NotApplied: the target created nothing, for now: the engine's own retry may try again.
    """
    digest = content_digest(payload)
    stamp = format_time(clock())
    record: Optional[Dict[str, Any]] = None
    if maybe_done:
        record = {"state": "uncertain", "attempts": 0, "receipt": None, "started_at": stamp, "updated_at": stamp}
    caps = Caps(timeout=EffectsSpec().timeout_for(adapter), deduplicates=bool(getattr(adapter, "deduplicates", False)),
                retention=getattr(adapter, "retention_seconds", None))
    seen: Optional[Seen] = None
    answer = None
    invoked = False
    detail = "an earlier attempt may have reached the target"
    while True:
        now = clock()
        move = next_move(Facts(key, record, (), seen, answer, caps, now))
        kind = move.kind
        if kind == "done":
            assert record is not None
            done = {"key": key, "payload_digest": digest, "receipt": record.get("receipt"),
                    "evidence": record.get("evidence"), "invoked": invoked}
            if cost:
                answered = answer.receipt if answer is not None and answer.kind == "receipt" else None
                done["cost"], done["cost_unread"] = priced(cost, answered) if answered is not None else ({}, [])
            return done
        if kind == "observe":
            found = observe_once(adapter, key, payload)
            # Passed on unchecked, as the engines always have: a word of the target's own reads as "cannot tell".
            seen = Seen(cast(SeenStatus, found.status), found.evidence, now)
        elif kind == "invoke":
            if invoked:
                raise EffectUncertain(key, f"{detail} (observed {seen.status if seen else 'nothing'})")
            on_window("before-invoke", key)
            record = dict(record or {"attempts": 0, "started_at": format_time(now)}, state="started",
                          updated_at=format_time(now),
                          attempts=int((record or {}).get("attempts", 0)) + 1, receipt=None)
            answer, invoked, seen = _call(adapter, key, payload, epoch, clock), True, None
            detail = ("the call returned but the target does not show the effect" if answer.kind == "receipt"
                      else f"the call's outcome is unknown: {answer.detail}")
            on_window("after-invoke", key)
        elif kind == "defer":
            raise NotApplied(answer.detail if answer else "the target created nothing",
                             answer.retry_after if answer else None)
        elif kind in ("ack", "verify", "absent", "uncertain", "fail"):
            assert record is not None
            record = dict(record, updated_at=format_time(now))
            if kind == "ack":
                record.update(state="acknowledged", receipt=move.receipt)
            elif kind == "verify":
                record.update(state="verified", evidence=move.evidence)
                on_window("after-verify", key)
            else:
                record.update(state={"absent": "absent", "uncertain": "uncertain", "fail": "failed"}[kind],
                              reason=move.reason)
            if move.error is not None:
                raise _engine_error(key, move.error, detail)
        elif kind == "stop":
            raise _engine_error(key, move.error, detail)
        else:  # waits: nothing here waits; the engine retries the activity or step
            raise EffectUncertain(key, f"{detail} (the lifecycle asks to wait until {move.until})")


#: An engine takes a stale epoch as a refusal for good too, and names which refusal it was in the answer's detail
#: (the detail of the :class:`EffectConflict` raised).
_REFUSALS: Dict[AnswerKind, str] = {"rejected": "Rejected", "stale-epoch": "StaleEpoch"}


def _call(adapter: Adapter, key: str, payload: Dict[str, Any], epoch: int, clock: Callable[[], float]) -> Answer:
    """One call of the target and what its answer means: the runner's mapping (:func:`runner.calls.answers.call_target`)
    with an engine's differences, each named here.

    A failure the adapter did not classify escapes (the engine retries the activity or step, and that attempt
    observes first); the receipt is taken unchecked; a refusal is ``rejected`` whatever its kind; the answer is
    stamped with the time it came.
    """
    answer = call_target(adapter, key, payload, epoch, crash="raise", check_receipt=False)._replace(ended_at=clock())
    if answer.kind in _REFUSALS:
        answer = answer._replace(kind="rejected", detail=f"{_REFUSALS[answer.kind]}: {answer.detail}")
    return answer


def _engine_error(key: str, error: Any, detail: str) -> Exception:
    """The engine's exception for a stop of the lifecycle."""
    if isinstance(error, (Failed, Fenced)):
        return EffectConflict(key, error.message.split(": ", 1)[-1])
    if isinstance(error, NeedsReconciliation):
        return EffectUncertain(key, f"{detail}: {error.message}")
    return EffectUncertain(key, str(error))
