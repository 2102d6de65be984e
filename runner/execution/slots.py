"""The executor's call slots: how many calls are at the target now, as the flow's limit counts them.

One object holds every count (:class:`CallSlots`), so that each change is a
named method and the arithmetic can be read in one place.
"""

from typing import Set

from .flow import Flow

__all__ = ["CallSlots"]


class CallSlots:
    """The calls at the target that count against the flow's limit of calls in flight (:meth:`Flow.call_room`).

    Three kinds count: calls started and not yet ended (a lookup of many keys is one), slots reserved for
    calls about to start (an invoke's ``started`` is being committed), and the earlier calls of a holder that
    stopped which are still at the target (one per key, each filling a slot until it ends). Every change is
    one of the methods below, in the order the executor makes them: a reserved slot is given back
    (:meth:`unreserve`) before its call is counted started (:meth:`start`), or when its call never starts.
    """

    __slots__ = ("flow", "started", "reserved", "earlier")

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.started = 0
        self.reserved = 0
        #: Keys whose earlier call is still at the target. A set: a key counts once, however often it is waited for.
        self.earlier: Set[str] = set()

    def room(self) -> bool:
        """Whether one more call may start under the flow's limit, counting every call at the target now."""
        return self.flow.call_room(self.started + self.reserved + len(self.earlier))

    def reserve(self) -> None:
        """Take a slot for a call about to start."""
        self.reserved += 1

    def unreserve(self) -> None:
        """Give a reserved slot back: its call starts now (and :meth:`start` counts it), or never will."""
        self.reserved -= 1

    def start(self) -> None:
        """A call started."""
        self.started += 1

    def release(self) -> None:
        """A call ended."""
        self.started -= 1

    def waits_on_earlier(self, key: str) -> None:
        """``key``'s task waits for (or kills) an earlier call of the key, which is still at the target."""
        self.earlier.add(key)

    def earlier_done(self, key: str) -> None:
        """No earlier call of ``key`` is waited for any more."""
        self.earlier.discard(key)

    def forget_earlier(self) -> None:
        """The tasks that waited for earlier calls are gone (the pass ended): those calls count no more."""
        self.earlier.clear()
