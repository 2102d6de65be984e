"""The effect ledger inside DBOS: a step that performs an effect at most once, and workflow helpers.

Imports ``dbos`` (``pip install dbos``; its system database may be SQLite or
PostgreSQL); nothing else in the runner needs it. What DBOS gives and what it
leaves (the DBOS documentation, "Workflows" and "Steps"): a step's output is
recorded when the step returns, and a workflow interrupted inside a step
runs that step again from its first line on recovery (at least once; a
zombie executor can even overlap its replacement). A step cannot tell a
first run from a re-run, so :func:`perform_effect` always observes the
target before invoking (one lookup per effect, the price of the guarantee,
measured in ``BENCHMARKS.md``), binds the payload by digest, and returns only
what it observed at the target:

* an unknown outcome is ``EffectUncertain``; the step does not let DBOS
  retry it (``retries_allowed=False``), and :func:`run_effect` waits with
  ``DBOS.sleep`` and observes (:func:`observe_effect`) until the target says
  present or absent, never calling again on a guess;
* a grant is a message (``DBOS.send(workflow_id, record, topic="grant")``)
  whose record carries the whole scope (task = workflow id, plan digest,
  step, action ``effect:KEY``, payload digest); :func:`wait_for_grant` opens
  a gated effect only for one that matches every field;
* ``DBOS.cancel_workflow`` stops a workflow at the next step boundary: the
  step in flight finishes, observation included, and no new one starts.

Register the adapter the steps use with :func:`use_adapter` before
``DBOS.launch()``. :func:`ticket_job` is the worked example: one ticket per
document, exactly once, whatever dies where.
"""

from typing import Any, Callable, Dict, List, Optional

try:  # the SDK is this module's reason to exist, and nothing else in the runner imports it
    from dbos import DBOS
except ImportError as exc:
    raise ImportError(f"runner.engines.dbos needs DBOS (pip install dbos): {exc}") from exc

from ..calls.target import Adapter, NotApplied
from ..base.canonical import content_digest
from .once import EffectUncertain, effect_key, observe_once, perform_once

__all__ = ["use_adapter", "perform_effect", "observe_effect", "run_effect", "settle", "grant_record", "grant_matches",
           "wait_for_grant", "ticket_job", "GRANT_TOPIC"]

GRANT_TOPIC = "grant"

_adapter: List[Adapter] = []
_on_window: List[Callable[[str, str], None]] = []


def use_adapter(factory: Callable[[], Adapter], on_window: Optional[Callable[[str, str], None]] = None) -> None:
    """Make the adapter this process's steps call (once, before ``DBOS.launch()``).

    :param on_window: called as ``on_window(window, key)`` at each commit window, for tests and fault injection.
    """
    _adapter[:] = [factory()]
    _on_window[:] = [on_window or (lambda window, key: None)]


def _the_adapter() -> Adapter:
    if not _adapter:
        raise RuntimeError("call runner.engines.dbos.use_adapter(factory) before DBOS.launch()")
    return _adapter[0]


@DBOS.step(name="runner.perform_effect", retries_allowed=False)
def perform_effect(key: str, payload: Dict[str, Any], epoch: int = 0) -> Dict[str, Any]:
    """The effect, observed first, invoked only after an observed absence (see :func:`perform_once`).

    Returns ``{"outcome": "verified", ...}``, or ``{"outcome": "uncertain", "detail"}`` /
    ``{"outcome": "not-applied"}`` for the workflow to handle: recorded as the step's output, so a
    recovery replays the answer instead of calling again.
    """
    try:
        done = perform_once(_the_adapter(), key, payload, maybe_done=True, epoch=epoch, on_window=_on_window[0])
    except EffectUncertain as exc:
        return {"outcome": "uncertain", "key": key, "detail": exc.detail}
    except NotApplied as exc:
        return {"outcome": "not-applied", "key": key, "detail": str(exc)}
    return {"outcome": "verified", **done}


@DBOS.step(name="runner.observe_effect", retries_allowed=False)
def observe_effect(key: str, payload: Dict[str, Any]) -> Dict[str, Any]:
    seen = observe_once(_the_adapter(), key, payload)
    return {"status": seen.status, "evidence": seen.evidence}


def settle(key: str, payload: Dict[str, Any], *, attempts: int = 20, wait: float = 1.0) -> Dict[str, Any]:
    """Inside a workflow: observe until the target says present or absent.

    :raises EffectUncertain: still unknown after ``attempts`` observations; a person must settle it.
    """
    for _ in range(attempts):
        seen = observe_effect(key, payload)
        if seen["status"] in ("present", "absent"):
            return seen
        DBOS.sleep(wait)
    raise EffectUncertain(key, f"still unknown after {attempts} observations")


def run_effect(key: str, payload: Dict[str, Any], *, epoch: int = 0, maximum_attempts: int = 5) -> Dict[str, Any]:
    """Inside a workflow: one effect, at most once, its unknown outcomes settled by observation.

    :raises EffectUncertain: unsettled, or ``maximum_attempts`` calls were not enough.
    """
    for _ in range(maximum_attempts):
        done = perform_effect(key, payload, epoch)
        if done["outcome"] == "verified":
            return done
        if done["outcome"] == "uncertain":
            seen = settle(key, payload)
            if seen["status"] == "present":
                return {"outcome": "verified", "key": key, "payload_digest": content_digest(payload), "receipt": None,
                        "evidence": seen["evidence"], "invoked": False}
        # observed absent, or certainly not applied: one more call is safe
    raise EffectUncertain(key, f"not done after {maximum_attempts} attempts")


def grant_record(task: str, plan_digest: str, step: str, key: str, payload: Dict[str, Any], by: str) -> Dict[str, Any]:
    """The scope of a grant for one effect: every field must match for the effect to be sent."""
    return {"task": task, "plan_digest": plan_digest, "step": step, "action": f"effect:{key}",
            "payload_digest": content_digest(payload), "by": by}


def grant_matches(grant: Any, wanted: Dict[str, Any]) -> bool:
    return isinstance(grant, dict) and all(grant.get(field) == wanted[field]
                                           for field in ("task", "plan_digest", "step", "action", "payload_digest"))


def wait_for_grant(wanted: Dict[str, Any], *, poll_seconds: float = 60.0) -> Dict[str, Any]:
    """Inside a workflow: wait for a grant message matching ``wanted``; others are read and set aside."""
    DBOS.set_event("waiting", wanted["action"])
    while True:
        grant = DBOS.recv(GRANT_TOPIC, timeout_seconds=poll_seconds)
        if grant is not None and grant_matches(grant, wanted):
            DBOS.set_event("waiting", None)
            return dict(grant)


def ticket_payload(document: str) -> Dict[str, Any]:
    return {"marker": document, "title": f"ticket for {document}"}


@DBOS.workflow(name="runner.ticket_job")
def ticket_job(job: Dict[str, Any]) -> Dict[str, Any]:
    """The worked example: ``{"documents": [...], "gated": [...], "step": "file-tickets"}`` -> filed and reused keys."""
    task = DBOS.workflow_id or ""
    plan_digest = content_digest(job)
    step = job.get("step", "file-tickets")
    done: Dict[str, List[str]] = {"filed": [], "reused": []}
    for document in job["documents"]:
        key = effect_key(task, f"doc-{document}:ticket")
        payload = ticket_payload(document)
        if document in job.get("gated", ()):
            wait_for_grant(grant_record(task, plan_digest, step, key, payload, by=""))
        outcome = run_effect(key, payload)
        done["filed" if outcome["invoked"] else "reused"].append(key)
    return done
