"""One effect in the executor's loop: the :class:`Job` it was given and the :class:`EffectTask` that carries it.

A task keeps what is fixed for its effect (the job, its payload and digest,
its caps), what the current pass learned (the last lookup and answer), what
it waits for (an earlier call, its own call in flight, a time, a call slot),
what it holds (its own invoke's record in the registry, its flow group) and
how it ended. Only the executor (:mod:`runner.execution.executor`) changes it.
"""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Union

from ..base.canonical import check_document, content_digest
from ..calls import inflight
from ..calls.inflight import Call, CallKind
from ..calls.target import Adapter
from .lifecycle import Answer, Caps, Seen

__all__ = ["Job", "EffectTask", "KnownCall", "CallInFlight"]


class Job(NamedTuple):
    """One effect to take to verified: its key, payload (or a function that makes it), adapter and step.

    ``values``: the item's placeholders (``item``, ``stem``, ``slug``, ``index``), for the flow's groups.
    """

    key: str
    payload: Union[Dict[str, Any], Callable[[], Dict[str, Any]]]
    adapter: Adapter
    step: Optional[str] = None
    values: Optional[Dict[str, Any]] = None


class KnownCall(NamedTuple):
    """An earlier call of a task's key: its record in the registry, and how :func:`next_move` weighs it."""

    record: inflight.Registered
    view: Call


class CallInFlight(NamedTuple):
    """A task's call at the target now: its record in the registry (None for a lookup of many keys), kind and start."""

    record: Optional[inflight.Registered]
    kind: CallKind
    began: float


class EffectTask:
    """One job in the loop: what is fixed for it, what this pass learned of it, what it waits for, what it holds, and
    how it ended."""

    __slots__ = ("job", "payload", "digest", "caps",
                 "last_lookup", "last_answer", "not_now_lookups", "registry_knew_a_call", "lookup_alone",
                 "earlier_calls", "in_flight", "wait_until", "watched_call", "waits_for_slot",
                 "own_invoke", "flow_group",
                 "done", "stop_error", "settled_record")

    def __init__(self, job: Job, payload: Dict[str, Any], caps: Caps) -> None:
        self.job, self.payload, self.caps = job, payload, caps
        self.digest = content_digest(check_document(payload, "payload"))
        # What this pass learned.
        self.last_lookup: Optional[Seen] = None
        self.last_answer: Optional[Answer] = None
        self.not_now_lookups = 0  # lookups the target answered "not now" in a row
        self.registry_knew_a_call = False  # the registry knew of an earlier call of this key when this pass began
        self.lookup_alone = False  # a lookup of many keys could not have shown this key: its own lookups decide
        # What it waits for.
        self.earlier_calls: Optional[List[KnownCall]] = None  # the registry's view, read once, then while waiting
        self.in_flight: Optional[CallInFlight] = None
        self.wait_until: Optional[float] = None
        self.watched_call: Optional[inflight.Registered] = None  # an earlier call being waited for or killed
        self.waits_for_slot = False  # any call's end may free one
        # What it holds.
        self.own_invoke: Optional[inflight.Registered] = None  # until what the call answered is recorded
        self.flow_group: Optional[str] = None
        # How it ended.
        self.done = False
        self.stop_error: Optional[BaseException] = None
        self.settled_record: Optional[Dict[str, Any]] = None

    def ready(self, now: float) -> bool:
        """Whether its next move is decided now: not done, no call in flight, waiting for neither a slot nor a time."""
        return (not self.done and self.in_flight is None and not self.waits_for_slot
                and (self.wait_until is None or self.wait_until <= now))
