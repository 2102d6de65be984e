"""Bounded retry: error classes, capped exponential backoff with full jitter, limits.

Everything here is a pure function of persisted state and an injected clock
or random source, so a restarted process computes the same answer the dead
one would have: attempt counters, the earliest next attempt time and the
run-wide counters all live in the envelope and nothing resets on restart.

* :func:`backoff_delay` is "full jitter": a uniform draw between 0 and
  ``min(cap, base * 2 ** (attempt - 1))``. Spreading retries over the whole
  window keeps many workers that failed together from retrying together.
* :func:`check_limits` enforces the run-wide limits of the contract:
  elapsed time since creation, each named cost spent (``limits.max_cost``: a
  number bounds ``money``), steps started, and no progress
  (time since the last step completed or effect resolved).
"""

import random as _random
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..base.times import format_time, parse_time
from ..base.errors import InvalidInput, LimitExhausted, RetryLater
from ..contract.spec import contract_of
from .costs import cost_limits

__all__ = [
    "backoff_delay",
    "next_attempt_at",
    "check_wait",
    "check_limits",
    "check_attempts",
    "cost_ops",
    "limit",
]

DEFAULT_BASE_SECONDS = 1.0
DEFAULT_CAP_SECONDS = 60.0


def limit(state: Dict[str, Any], name: str, default: Optional[float] = None) -> Optional[float]:
    """A limit from the run's budgets (copied from the contract at init)."""
    value = state["budgets"].get(name, default)
    return None if value is None else float(value)


def backoff_delay(attempt: int, base: float = DEFAULT_BASE_SECONDS, cap: float = DEFAULT_CAP_SECONDS,
                  rand: Callable[[], float] = _random.random) -> float:
    """Seconds to wait before attempt ``attempt + 1`` after ``attempt`` failures (full jitter)."""
    if attempt < 1:
        return 0.0
    ceiling = min(cap, base * (2 ** min(attempt - 1, 62)))
    return ceiling * rand()


def next_attempt_at(state: Dict[str, Any], attempts: int, now: float,
                    rand: Callable[[], float] = _random.random) -> str:
    """The persisted earliest time of the next attempt, from the contract's retry policy."""
    policy = contract_of(state).retry
    delay = backoff_delay(attempts, policy.base_seconds, policy.cap_seconds, rand)
    return format_time(now + delay)


def check_wait(record: Mapping[str, Any], now: float, what: str) -> None:
    """Refuse an attempt before its persisted earliest time (a restart does not skip the wait).

    :raises RetryLater: carrying ``retry_at`` (the persisted time) and ``wait_seconds``.
    """
    when = record.get("next_attempt_at")
    if when and parse_time(when) > now:
        wait = parse_time(when) - now
        raise RetryLater(f"{what}: the next attempt is not allowed before {when} (backoff; {wait:.3f}s left)",
                         retry_at=when, wait_seconds=wait)


def check_attempts(attempts: int, maximum: Optional[float], what: str, name: str) -> None:
    """Refuse another attempt once ``attempts`` reached ``maximum`` (the limit called ``name``)."""
    if maximum is not None and attempts >= maximum:
        raise LimitExhausted(f"{what}: {attempts} attempts used of {int(maximum)}", limit=name)


def check_limits(state: Dict[str, Any], now: float) -> None:
    """Raise :class:`LimitExhausted` naming the first run-wide limit that is spent."""
    created = parse_time(state["created_at"])
    counters = state["counters"]
    elapsed_limit = limit(state, "max_elapsed_seconds")
    if elapsed_limit is not None and now - created > elapsed_limit:
        raise LimitExhausted(f"the run has taken {now - created:.0f}s of its {elapsed_limit:.0f}s",
                             limit="max_elapsed_seconds")
    for cost, cost_limit in sorted(cost_limits(state).items()):
        spent = float(counters.get("cost", {}).get(cost, 0))
        if spent >= cost_limit:
            named = "" if cost == "money" else f" {cost}"
            raise LimitExhausted(f"the run has spent {spent:g} of its{named} cost limit {cost_limit:g}",
                                 limit="max_cost")
    steps_limit = limit(state, "max_steps")
    if steps_limit is not None and counters.get("steps_started", 0) >= steps_limit:
        raise LimitExhausted(f"the run has started {counters.get('steps_started', 0)} steps of its {int(steps_limit)}",
                             limit="max_steps")
    idle_limit = limit(state, "no_progress_seconds")
    last = counters.get("last_progress_at") or state["created_at"]
    if idle_limit is not None and now - parse_time(last) > idle_limit:
        raise LimitExhausted(f"no progress since {last} (limit {idle_limit:.0f}s)", limit="no_progress_seconds")


def cost_ops(state: Dict[str, Any], cost: Dict[str, float]) -> List[List[Any]]:
    """Add one attempt's reported costs (tokens, money, ...) to the run's totals."""
    totals = dict(state["counters"].get("cost", {}))
    for name, amount in cost.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise InvalidInput(f"cost {name!r} must be a non-negative number")
        totals[name] = totals.get(name, 0) + amount
    return [["set", ["counters", "cost"], totals]]
