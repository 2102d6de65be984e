"""Flow control: how many effects the executor keeps in flight, how fast calls start, and how it yields to "not now".

The executor (:mod:`runner.execution.executor`) asks a :class:`Flow` three things:

* :meth:`Flow.call_room`: may one more call start? At most ``limit`` calls
  are in flight at the target (a lookup of many keys at once is one call),
  and fewer while the target pushes back: every "not now" answer (429, a 503 naming a delay,
  exit 75) halves the number in use, and every call that succeeds adds back
  a fraction, so it climbs back one step per round of successful calls
  (additive increase, multiplicative decrease).
* :meth:`Flow.room`: may one more effect be taken on? Four times as many
  effects as calls are in flight, so that while some wait for their invoke,
  the answered ones wait to be looked up together (a lookup of many keys
  verifies a slot's worth of effects or more in one call); with one call at
  a time, one effect at a time.
* :meth:`Flow.ready`: may a call start now? Calls are spaced by a token
  bucket (``rate``: ``per_second`` tokens, at most ``burst`` saved up), and
  none starts before the latest time a "not now" answer named: such an
  answer pauses every call to the target, not only its own effect's.
* :meth:`Flow.group_room`: with ``concurrency_key``, at most
  ``limit`` effects of one group (a host, a payload field) are in flight.

All of it is a function of the times passed in (the run's clock), so a
simulation drives it with simulated time.
"""

import re
from typing import Any, Dict, Mapping, Optional

from ..contract.effects import GROUP_FIELD as _FIELD
from ..contract.spec import contract_of
from ..calls.answers import AnswerKind

__all__ = ["Flow", "TokenBucket", "flow_for"]

#: Effects taken on per call in flight (see :meth:`Flow.room`).
ROOM_PER_CALL = 4
#: The pause after a "not now" that named no delay: long enough that the answers of calls already out arrive in it.
MIN_PAUSE_SECONDS = 0.1

class TokenBucket:
    """``per_second`` tokens a second, at most ``burst`` saved; each call takes one."""

    def __init__(self, per_second: float, burst: float, now: float) -> None:
        self.per_second, self.burst = float(per_second), max(1.0, float(burst))
        self.tokens, self.at = self.burst, now

    def take(self, now: float) -> Optional[float]:
        """Take a token and return None, or return the time one will be there (taking nothing)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        # A token due "now" may be short of 1.0 by a rounding error; waiting for that sliver would never end
        # on a clock whose next representable instant is further away than the sliver.
        if self.tokens >= 1.0 - 1e-6:
            self.tokens = max(0.0, self.tokens - 1.0)
            return None
        return now + (1.0 - self.tokens) / self.per_second


class Flow:
    """The executor's flow control (see the module docstring).

    :param limit: calls in flight at most (``effects.concurrency``, ``drive --parallel``).
    :param rate: ``{"per_second": R, "burst": B}`` (``effects.rate``), or None.
    :param group: ``{"key": TEMPLATE, "limit": N}`` (``effects.concurrency_key``), or None.
    """

    def __init__(self, limit: int = 1, rate: Optional[Mapping[str, Any]] = None,
                 group: Optional[Mapping[str, Any]] = None, now: float = 0.0) -> None:
        self.limit = max(1, int(limit))
        self.in_use = float(self.limit)
        self.bucket = TokenBucket(rate["per_second"], rate.get("burst", 1), now) if rate else None
        self.group = dict(group) if group else None
        self.paused_until = 0.0
        self.counts: Dict[str, int] = {}
        self.not_now = 0

    def room(self, in_flight: int) -> bool:
        """Whether one more effect may be taken on, with ``in_flight`` effects already."""
        calls = max(1, int(self.in_use))
        return in_flight < (1 if self.limit == 1 else ROOM_PER_CALL * calls)

    def call_room(self, calls: int) -> bool:
        """Whether one more call may start, with ``calls`` in flight already."""
        return calls < max(1, int(self.in_use))

    def ready(self, now: float) -> Optional[float]:
        """None when a call may start now (a token is taken), else the earliest time one may."""
        if now < self.paused_until:
            return self.paused_until
        return self.bucket.take(now) if self.bucket is not None else None

    def answered(self, kind: AnswerKind, now: float, retry_after: Optional[float] = None) -> None:
        """What a call of the target answered: ``not-applied`` pushes back, anything else lets the limit climb.

        One push back halves the calls in flight once: the other "not now" answers of that moment
        (calls that were already out when it came) do not halve it again until the pause is over.
        """
        if kind == "not-applied":
            self.not_now += 1
            if now >= self.paused_until:
                self.in_use = max(1.0, self.in_use / 2)
            self.paused_until = max(self.paused_until,
                                    now + (retry_after if retry_after is not None else MIN_PAUSE_SECONDS))
        else:
            self.in_use = min(float(self.limit), self.in_use + 1.0 / max(1.0, self.in_use))

    def group_of(self, values: Mapping[str, Any]) -> Optional[str]:
        """The group of an effect: the ``key`` template filled from its placeholders and payload fields
        (``{slug}``, ``{payload.customer}``), or None without a ``concurrency_key``."""
        if self.group is None:
            return None
        payload = values.get("payload") or {}

        def one(match: "re.Match[str]") -> str:
            name = match.group(1)
            value = payload.get(name[len("payload."):]) if name.startswith("payload.") else values.get(name)
            return "" if value is None else str(value)

        return _FIELD.sub(one, str(self.group["key"]))

    def group_room(self, group: Optional[str]) -> bool:
        return group is None or self.counts.get(group, 0) < int(self.group["limit"])  # type: ignore[index]

    def take_group(self, group: Optional[str], delta: int) -> None:
        if group is not None:
            self.counts[group] = self.counts.get(group, 0) + delta


def flow_for(state: Mapping[str, Any], parallel: Optional[int], now: float) -> Flow:
    """The flow of a run's contract: ``effects.concurrency`` (or ``parallel``), ``effects.rate``,
    ``effects.concurrency_key``."""
    effects = contract_of(state).effects
    rate, group = effects.rate, effects.concurrency_key
    return Flow(parallel if parallel is not None else effects.concurrency,
                {"per_second": rate.per_second, "burst": rate.burst} if rate is not None else None,
                {"key": group.key, "limit": group.limit} if group is not None else None, now)
