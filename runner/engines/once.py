"""One external effect, at most once across an engine's retries: observe before invoking again.

An engine keeps its own durable history, so inside it the runner's store is
not needed; what the engine does not give is the window between a target
committing an effect and the engine recording that the step returned. A
Temporal activity whose worker dies there is retried; a DBOS step runs
again on recovery. Both then call the target a second time. This module
closes that window with the ledger's rules, applied to a target through the
same :class:`runner.effects.Adapter` protocol the runner uses:

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

from typing import Any, Callable, Dict, Optional

from ..effects import Adapter, NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..envelope import content_digest, validate_id

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
) -> Dict[str, Any]:
    """Bring ``key`` with ``payload`` to verified at the target, calling it at most once per observed absence.

    :param maybe_done: an earlier attempt may have reached the target (every retry, every
        recovery; a first attempt when the workflow says so): observe first.
    :param epoch: the fencing epoch passed to the target.
    :returns: ``{"key", "payload_digest", "receipt", "evidence", "invoked"}``; ``invoked`` is
        False when an earlier attempt's effect was found and reused.
    :raises EffectUncertain: the outcome stays unknown after the call or the observation.
    :raises EffectConflict: the target refused the effect for good.
    """
    digest = content_digest(payload)
    if maybe_done:
        seen = observe_once(adapter, key, payload)
        if seen.status == "present":
            return {"key": key, "payload_digest": digest, "receipt": None, "evidence": seen.evidence, "invoked": False}
        if seen.status != "absent":
            raise EffectUncertain(key, f"observation before a retry was {seen.status}: {seen.evidence}")
    on_window("before-invoke", key)
    receipt: Optional[Dict[str, Any]] = None
    try:
        receipt = adapter.invoke(key, payload, epoch)
    except NotApplied:
        raise  # certainly not applied: the engine's own retry may try again, observing first
    except (Rejected, StaleEpoch) as exc:
        raise EffectConflict(key, f"{type(exc).__name__}: {exc}") from None
    except UnknownOutcome as exc:
        receipt = None
        detail = f"the call's outcome is unknown: {exc}"
    else:
        detail = "the call returned but the target does not show the effect"
    on_window("after-invoke", key)
    seen = observe_once(adapter, key, payload)
    if seen.status != "present":
        raise EffectUncertain(key, f"{detail} (observed {seen.status})")
    on_window("after-verify", key)
    return {"key": key, "payload_digest": digest, "receipt": receipt, "evidence": seen.evidence, "invoked": True}
