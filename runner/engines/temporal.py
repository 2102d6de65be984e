"""The effect ledger inside Temporal: an activity that performs an effect at most once, and workflow helpers.

Imports ``temporalio`` (``pip install temporalio``); nothing else in the
runner needs it. What Temporal gives and what it leaves (the Temporal
documentation, "Activity Definition" and "Retry Policies"): a completed
activity is never run again on replay, but an activity whose worker died
before reporting is retried, and retries are unlimited unless bounded. So
the window between the target committing and the activity reporting is the
caller's. :class:`EffectActivities` closes it with :func:`runner.engines.once.perform_once`:

* the effect's key is the workflow id and the caller's logical key, never
  the attempt (:func:`runner.engines.once.effect_key`);
* every attempt after the first (and the first, when the workflow says the
  effect may already exist) observes the target before invoking;
* a conflicting payload and an unknown outcome are non-retryable
  application errors (``EffectConflict``, ``EffectUncertain``); on the
  latter the workflow waits and observes (:func:`settle`), it never retries
  the call blindly;
* the activity heartbeats, so a dead worker is noticed within the heartbeat
  timeout and a cancellation reaches the activity: before the call it
  starts nothing; once the call is made it is shielded until the effect has
  been observed, so an in-flight effect is always settled.

Approvals are signals carrying the grant's whole scope (task = workflow id,
plan digest, step, action ``effect:KEY``, payload digest);
:func:`wait_for_grant` opens a gated effect only for a grant that matches
every field, so a grant for another payload leaves the effect unsent.

:class:`TicketJob` is the worked example: one ticket per document, with an
optional gate, in a workflow that survives worker kills at every window.
"""

import asyncio
import contextlib
import contextvars
import datetime
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

try:  # the SDK is this module's reason to exist, and nothing else in the runner imports it
    from temporalio import activity, workflow
    from temporalio.common import RetryPolicy
    from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
except ImportError as exc:
    raise ImportError(f"runner.engines.temporal needs the Temporal SDK (pip install temporalio): {exc}") from exc

with workflow.unsafe.imports_passed_through():
    from ..calls.target import Adapter
    from ..base.canonical import content_digest
    from .once import EffectConflict, EffectUncertain, effect_key, observe_once, perform_once

__all__ = [
    "EffectActivities",
    "PERFORM",
    "OBSERVE",
    "NON_RETRYABLE",
    "grant_record",
    "grant_matches",
    "wait_for_grant",
    "run_effect",
    "settle",
    "TicketJob",
]

#: Activity names, so that workers of any language can serve them.
PERFORM = "runner.perform_effect"
OBSERVE = "runner.observe_effect"
#: Application error types the workflow handles itself; the engine never retries them.
NON_RETRYABLE = ("EffectConflict", "EffectUncertain")


class EffectActivities:
    """The activities of one worker, over an adapter it made (``adapter_factory()`` once per worker).

    :param on_window: called as ``on_window(window, key)`` at each commit window
        (:data:`runner.engines.once.WINDOWS`), for tests and fault injection.
    """

    def __init__(self, adapter_factory: Callable[[], Adapter],
                 on_window: Optional[Callable[[str, str], None]] = None) -> None:
        self.adapter = adapter_factory()
        self.on_window = on_window or (lambda window, key: None)

    @activity.defn(name=PERFORM)
    def perform(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``{"key", "payload", "may_exist", "epoch"}`` -> the verified effect (see :func:`perform_once`)."""
        info = activity.info()
        activity.heartbeat("observing" if info.attempt > 1 else "starting")
        if activity.is_cancelled():
            raise CancelledError("cancelled before the effect was started")

        def window(name: str, key: str) -> None:
            if name == "before-invoke":
                activity.heartbeat("invoking")
                if activity.is_cancelled():
                    raise CancelledError("cancelled before the effect was started")
            self.on_window(name, key)

        try:
            # Once the call may be made, a cancellation waits for the observation; heartbeats go on
            # meanwhile, so a slow target is not mistaken for a dead worker.
            with activity.shield_thread_cancel_exception(), _heartbeating(info.heartbeat_timeout):
                return perform_once(self.adapter, request["key"], request["payload"],
                                    maybe_done=info.attempt > 1 or bool(request.get("may_exist")),
                                    epoch=int(request.get("epoch", 0)), on_window=window)
        except EffectUncertain as exc:
            raise ApplicationError(str(exc), {"key": exc.key, "detail": exc.detail}, type="EffectUncertain",
                                   non_retryable=True) from None
        except EffectConflict as exc:
            raise ApplicationError(str(exc), {"key": exc.key, "detail": exc.detail}, type="EffectConflict",
                                   non_retryable=True) from None

    @activity.defn(name=OBSERVE)
    def observe(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """``{"key", "payload"}`` -> ``{"status": present|absent|unknown, "evidence"}``."""
        seen = observe_once(self.adapter, request["key"], request["payload"])
        return {"status": seen.status, "evidence": seen.evidence}


@contextlib.contextmanager
def _heartbeating(timeout: Optional[datetime.timedelta]) -> Iterator[None]:
    """Heartbeat from a helper thread, three times per heartbeat timeout, while the body runs."""
    if not timeout:
        yield
        return
    context = contextvars.copy_context()  # the activity's context, for the helper thread
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(timeout.total_seconds() / 3):
            context.run(activity.heartbeat, "in flight")

    thread = threading.Thread(target=beat, name="runner-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# -- approvals ------------------------------------------------------------------------

def grant_record(task: str, plan_digest: str, step: str, key: str, payload: Dict[str, Any], by: str) -> Dict[str, Any]:
    """The scope of a grant for one effect: every field must match for the effect to be sent."""
    return {"task": task, "plan_digest": plan_digest, "step": step, "action": f"effect:{key}",
            "payload_digest": content_digest(payload), "by": by}


def grant_matches(grant: Dict[str, Any], wanted: Dict[str, Any]) -> bool:
    return all(grant.get(field) == wanted[field]
               for field in ("task", "plan_digest", "step", "action", "payload_digest"))


async def wait_for_grant(grants: List[Dict[str, Any]], wanted: Dict[str, Any]) -> Dict[str, Any]:
    """Inside a workflow: wait until a grant matching ``wanted`` arrived (in ``grants``, filled by a signal)."""
    await workflow.wait_condition(lambda: any(grant_matches(g, wanted) for g in grants))
    return next(g for g in grants if grant_matches(g, wanted))


# -- effects in a workflow ------------------------------------------------------------------

def _options(heartbeat: float) -> Dict[str, Any]:
    """Timeouts of every activity: a worker that stops heartbeating is given up after ``heartbeat`` seconds."""
    return {"start_to_close_timeout": datetime.timedelta(seconds=30),
            "heartbeat_timeout": datetime.timedelta(seconds=heartbeat)}


def _retry(maximum_attempts: int) -> RetryPolicy:
    return RetryPolicy(initial_interval=datetime.timedelta(milliseconds=200), backoff_coefficient=2.0,
                       maximum_interval=datetime.timedelta(seconds=2), maximum_attempts=maximum_attempts,
                       non_retryable_error_types=list(NON_RETRYABLE))


async def settle(key: str, payload: Dict[str, Any], *, attempts: int = 20, wait: float = 1.0,
                 heartbeat: float = 3.0) -> Dict[str, Any]:
    """Inside a workflow: observe an effect whose outcome is unknown until the target says present or absent.

    :returns: the observation (``status`` present or absent).
    :raises ApplicationError: still unknown after ``attempts`` observations (type ``EffectUncertain``): a
        person must settle it; the call is never made again on a guess.
    """
    for _ in range(attempts):
        seen = await workflow.execute_activity(OBSERVE, {"key": key, "payload": payload}, retry_policy=_retry(3),
                                               **_options(heartbeat))
        if seen["status"] in ("present", "absent"):
            return dict(seen)
        await workflow.sleep(wait)
    raise ApplicationError(f"effect {key} stayed unknown after {attempts} observations", {"key": key},
                           type="EffectUncertain", non_retryable=True)


async def run_effect(key: str, payload: Dict[str, Any], *, may_exist: bool = False, epoch: int = 0,
                     maximum_attempts: int = 5, heartbeat: float = 3.0) -> Dict[str, Any]:
    """Inside a workflow: perform one effect at most once, settling an unknown outcome by observation.

    :raises ApplicationError: ``EffectConflict`` (refused for good) or ``EffectUncertain`` (unsettled).
    """
    request = {"key": key, "payload": payload, "may_exist": may_exist, "epoch": epoch}
    while True:
        try:
            return dict(await workflow.execute_activity(
                PERFORM, request, retry_policy=_retry(maximum_attempts),
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED, **_options(heartbeat)))
        except ActivityError as exc:
            cause = exc.cause
            if not (isinstance(cause, ApplicationError) and cause.type == "EffectUncertain"):
                raise
        seen = await settle(key, payload, heartbeat=heartbeat)
        if seen["status"] == "present":
            return {"key": key, "payload_digest": content_digest(payload), "receipt": None,
                    "evidence": seen["evidence"], "invoked": False}
        request = dict(request, may_exist=True)  # observed absent: one more call is safe


# -- the worked example --------------------------------------------------------------------

@workflow.defn(name="TicketJob")
class TicketJob:
    """One ticket per document, exactly once, whatever dies where.

    Input: ``{"documents": [name, ...], "gated": [name, ...], "step": "file-tickets", "heartbeat_seconds": 3}``.
    A gated document's ticket is filed only after a ``grant`` signal whose
    record matches it (:func:`grant_record` with task = this workflow's id,
    the plan digest of the input, and the document's payload). Cancelling the
    workflow lets the effect in flight be settled and starts no new one.
    Result: ``{"filed": [keys], "reused": [keys], "cancelled": bool}``.
    """

    def __init__(self) -> None:
        self.grants: List[Dict[str, Any]] = []
        self.waiting: Optional[str] = None

    @workflow.signal(name="grant")
    def grant(self, record: Dict[str, Any]) -> None:
        self.grants.append(dict(record))

    @workflow.query(name="waiting")
    def waiting_for(self) -> Optional[str]:
        return self.waiting

    @staticmethod
    def payload(document: str) -> Dict[str, Any]:
        return {"marker": document, "title": f"ticket for {document}"}

    @workflow.run
    async def run(self, job: Dict[str, Any]) -> Dict[str, Any]:
        task = workflow.info().workflow_id
        plan_digest = content_digest(job)
        step = job.get("step", "file-tickets")
        done: Dict[str, List[str]] = {"filed": [], "reused": []}
        for document in job["documents"]:
            key = effect_key(task, f"doc-{document}:ticket")
            payload = self.payload(document)
            try:
                if document in job.get("gated", ()):
                    self.waiting = key
                    await wait_for_grant(self.grants, grant_record(task, plan_digest, step, key, payload, by=""))
                    self.waiting = None
                outcome = await run_effect(key, payload, heartbeat=float(job.get("heartbeat_seconds", 3.0)))
            except (asyncio.CancelledError, CancelledError):
                return {**done, "cancelled": True}
            except ActivityError as exc:
                if isinstance(exc.cause, CancelledError):
                    return {**done, "cancelled": True}
                raise
            done["filed" if outcome["invoked"] else "reused"].append(key)
        return {**done, "cancelled": False}
