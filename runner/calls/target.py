"""What the runner needs from a target, and what a target's calls can answer.

A leaf module: the :class:`Adapter` protocol, the :class:`Observation` a
lookup returns, and the exceptions an invoke raises to say what it knows of
its outcome. The ledger (:mod:`runner.ledger.effects`), the lifecycle
(:mod:`runner.execution.lifecycle`), the executor and every adapter import these from
here, so none of them needs another to be imported first.

What each outcome means for the next move:

* a receipt (``invoke`` returns): the target acknowledged the call. A
  receipt is proof that it happened; no later absence leads to a second call.
* :class:`UnknownOutcome`: the call may or may not have taken effect (a
  timeout, a reset after the request was sent, a 5xx). Settled only by
  observing the target, never by calling again.
* :class:`NotApplied`: the target says, with certainty, that it created
  nothing (a refused connection, a 429, a 503 that names when to come
  back). Retried after ``retry_after`` seconds (or the contract's backoff),
  bounded by its own count. An answer that may follow delivery (a proxy's
  502, 503 or 504) is an unknown outcome, not this.
* :class:`Rejected`: refused for good (a known key with another payload, a
  400 or 422). Never retried.
* :class:`StaleEpoch`: the target refused the writer's fencing epoch. The
  writer stops (fenced) and calls nothing more.
"""

from typing import Any, Dict, NamedTuple, Optional, Protocol

from ..base.quoting import describe

__all__ = ["Adapter", "Observation", "UnknownOutcome", "NotApplied", "Rejected", "StaleEpoch", "describe"]


class Observation(NamedTuple):
    """What looking at the target found: ``present``, ``absent`` or ``unknown``, with evidence.

    A lookup of many keys (``observe_many``) may also say ``unseen`` of a key: its answer could not have
    shown that key (a page of several, a refusal, a failure), so it says nothing of it; the key's own
    ``observe`` decides. ``absent`` is only for an answer that would have shown the key had it been there.
    """

    status: str
    evidence: Dict[str, Any]


class UnknownOutcome(Exception):
    """The call may or may not have taken effect: a timeout, a dropped connection."""


class NotApplied(Exception):
    """The target says, with certainty, that it created nothing (refused before processing, 429, a 503 naming a delay).

    :param retry_after: seconds the target asked to wait before the next call, if it said.
    """

    def __init__(self, message: str = "", retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Rejected(Exception):
    """The target refused the call for good (for example, a known key with another payload)."""


class StaleEpoch(Exception):
    """The target refused the call because its fencing epoch is older than one it has seen."""


class Adapter(Protocol):
    """What the runner needs from a target. Declare the facts; implement the two calls.

    ``key_scope``: where keys are unique (e.g. "per ticket service").
    ``retention_seconds``: how long the target remembers a key (None: forever).
    ``conflicting_payload``: what it does with a known key and another payload.
    ``verification``: how ``observe`` establishes presence (lookup by key, by business marker...).
    ``deduplicates``: True when invoking again with the same key and payload,
    within retention, returns the original receipt and makes no second effect.

    An adapter that starts processes should start them with
    :func:`runner.calls.commands.run_command`, so that each is registered as the
    call in flight (:mod:`runner.calls.inflight`) and can be waited for by whoever
    takes over after a crash.

    An adapter may also look many keys up in one call: ``batch_key`` (adapters
    with one are looked up together; None: never), ``observe_batch`` (the most
    keys per call) and ``observe_many(items)``, which returns one
    :class:`Observation` per ``(key, payload, adapter)`` in order, ``unseen``
    for a key its answer could not have shown; it raises :class:`NotApplied`
    for "not now" and :class:`Rejected` when the target refuses such lookups
    (the executor then looks key by key for the rest of its pass). One whose
    ``lists`` is True reads one listing of the target whatever keys it is
    given: the executor asks it for every key waiting, one listing at a time,
    a single key too.
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
