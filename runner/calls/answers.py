"""What each answer of a target means for an effect's lifecycle, in one mapping.

A call of the target (:func:`call_target`) ends in an :class:`Answer`, a
lookup (:func:`look_at_target`, :func:`look_at_many`) in a :class:`Seen`;
:func:`runner.execution.lifecycle.next_move` decides from those alone. The rules the
mapping keeps (see :mod:`runner.calls.target` for what each exception says):

* **Only a receipt is proof.** A receipt that is no JSON object within the
  document bounds says the call returned, not what it did: unknown.
* **A failure the adapter did not classify is an unknown outcome**: the
  target may or may not have been reached, so it is settled by observing,
  never by calling again. An engine (:mod:`runner.engines.once`) lets such a
  failure escape instead (``crash="raise"``), so that its own retry observes
  first.
* **A lookup says absent only when it could have shown the key.** A lookup
  that failed, or answered nonsense, is ``unknown``; a lookup of many keys
  that could not have shown one is ``unseen`` for it; "not now" is ``later``.
* **Text from elsewhere is bounded**: at most :data:`MAX_DETAIL_CHARS` of it
  is kept in a lookup's evidence.

The words of each answer are types (:data:`AnswerKind`, :data:`SeenStatus`).
"""

from typing import Any, Callable, Dict, List, Literal, NamedTuple, Optional, Tuple

from ..base.canonical import check_document
from ..base.errors import RunnerError
from .target import Adapter, NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome

__all__ = ["Answer", "Seen", "AnswerKind", "SeenStatus", "MAX_DETAIL_CHARS", "call_target", "adopted_answer",
           "look_at_target", "look_at_many"]

#: What a call may answer (:class:`Answer`); the words of an HTTP request's ``statuses`` too.
AnswerKind = Literal["receipt", "rejected", "not-applied", "stale-epoch", "unknown"]
#: What a lookup may find (:class:`Seen`): a target's three words, ``later`` (the lookup was refused for now) and
#: ``unseen`` (a lookup of many keys could not have shown the key).
SeenStatus = Literal["present", "absent", "unknown", "later", "unseen"]

#: The most characters of a target's or an adapter's own text kept in evidence (a "not now", a lookup's failure).
MAX_DETAIL_CHARS = 500

#: What one key's lookup may say.
ONE_STATUSES: Tuple[SeenStatus, ...] = ("present", "absent", "unknown")
#: What a lookup of many keys may say of each key: ``unseen`` says its answer could not have shown the key.
MANY_STATUSES: Tuple[SeenStatus, ...] = ("present", "absent", "unknown", "unseen")


class Seen(NamedTuple):
    """An observation this pass made, and when it began: ``present``, ``absent``, ``unknown``, or
    ``later`` (the lookup itself was refused for now; ``evidence["retry_after"]`` may say how long)."""

    status: SeenStatus
    evidence: Dict[str, Any]
    at: float


class Answer(NamedTuple):
    """What the call this pass made answered.

    ``kind``: ``receipt``, ``unknown``, ``not-applied``, ``rejected`` or ``stale-epoch``.
    """

    kind: AnswerKind
    detail: str = ""
    receipt: Optional[Dict[str, Any]] = None
    retry_after: Optional[float] = None
    ended_at: float = 0.0


def call_target(adapter: Adapter, key: str, payload: Dict[str, Any], epoch: Optional[int], *,
                crash: Literal["unknown", "raise"] = "unknown", check_receipt: bool = True) -> Answer:
    """One call of the target, and what its answer means.

    :param crash: what a failure the adapter did not classify means: ``"unknown"``, an outcome to settle by
        observing (the runner's), or ``"raise"``: it escapes (an engine's, whose own retry then observes first).
    :param check_receipt: a receipt must be a JSON object within the document bounds, else the outcome is unknown;
        False takes it as it is.
    :raises Exception: with ``crash="raise"``, what the adapter raised that is none of a target's answers. A
        :class:`BaseException` (an interrupt) always escapes.
    """
    return _answer_of(lambda: adapter.invoke(key, payload, epoch), crash, check_receipt)  # type: ignore[arg-type]


def adopted_answer(adapter: Any, key: str, left: Any, epoch: Optional[int]) -> Answer:
    """What a call whose caller died answered, meaning what it would have meant to that caller (:func:`call_target`):
    ``adapter.adopt(key, left, epoch)`` reads what its command left (see
    :meth:`runner.adapters.commands.CommandAdapter.adopt`)."""
    return _answer_of(lambda: adapter.adopt(key, left, epoch), "unknown", True)


def _answer_of(invoke: Callable[[], Any], crash: Literal["unknown", "raise"], check_receipt: bool) -> Answer:
    """What the answer ``invoke()`` returns or raises means (see :func:`call_target`)."""
    try:
        receipt = invoke()
    except NotApplied as exc:
        return Answer("not-applied", str(exc), retry_after=exc.retry_after)
    except Rejected as exc:
        return Answer("rejected", str(exc))
    except StaleEpoch as exc:
        return Answer("stale-epoch", str(exc))
    except UnknownOutcome as exc:
        return Answer("unknown", str(exc))
    except RunnerError as exc:  # the adapter could not even make the call (e.g. its program is missing)
        if crash == "raise":
            raise
        return Answer("unknown", f"{exc.reason}: {exc.message}")
    except Exception as exc:  # an adapter that crashed mid-call: whether the target got it is unknown
        if crash == "raise":
            raise
        return Answer("unknown", f"{type(exc).__name__}: {exc}")
    if check_receipt:
        try:
            check_document(receipt, "receipt")
        except RunnerError as exc:
            return Answer("unknown", f"the call returned, but its receipt is unusable: {exc.message}")
    return Answer("receipt", receipt=receipt)


def look_at_target(adapter: Adapter, key: str, payload: Dict[str, Any]) -> Seen:
    """One lookup; a lookup that failed, or answered nonsense, says nothing: unknown, never absent.

    "Not now" (:class:`NotApplied`) is ``later``: the lookup is made again. The time is 0.0 here; the caller
    stamps when the lookup began.
    """
    try:
        seen = adapter.observe(key, payload)
        if not isinstance(seen, Observation) or seen.status not in ONE_STATUSES:
            raise TypeError(f"observe returned {seen!r:.100}, not an Observation")
        check_document(seen.evidence, "evidence")
    except NotApplied as exc:  # the lookup itself was refused for now (429, a 503): look again later
        return Seen("later", {"not_now": str(exc)[:MAX_DETAIL_CHARS], "retry_after": exc.retry_after}, 0.0)
    except Exception as exc:
        return Seen("unknown", {"error": f"{type(exc).__name__}: {exc}"[:MAX_DETAIL_CHARS]}, 0.0)
    return Seen(seen.status, seen.evidence, 0.0)


def look_at_many(adapter: Any, items: List[Tuple[str, Dict[str, Any], Adapter]]) -> Tuple[List[Seen], bool]:
    """One lookup of several keys (``observe_many``), and whether the target refused it (:class:`Rejected`).

    An answer that fails, is refused or does not fit says nothing of any key: each is ``unseen``, to be looked up
    alone. "Not now" (:class:`NotApplied`) is ``later`` for each: the lookup is made again.
    """
    try:
        found = adapter.observe_many(items)
        if not isinstance(found, list) or len(found) != len(items):
            count = len(found) if isinstance(found, list) else type(found).__name__
            raise TypeError(f"observe_many returned {count} answers for {len(items)} keys")
        out = []
        for seen in found:
            if not isinstance(seen, Observation) or seen.status not in MANY_STATUSES:
                raise TypeError(f"observe_many returned {seen!r:.100}, not an Observation")
            check_document(seen.evidence, "evidence")
            out.append(Seen(seen.status, seen.evidence, 0.0))
        return out, False
    except NotApplied as exc:
        not_now = str(exc)[:MAX_DETAIL_CHARS]
        return [Seen("later", {"not_now": not_now, "retry_after": exc.retry_after}, 0.0) for _ in items], False
    except Rejected as exc:
        return [Seen("unseen", {"refused": str(exc)[:MAX_DETAIL_CHARS]}, 0.0) for _ in items], True
    except Exception as exc:
        return [Seen("unseen", {"error": f"{type(exc).__name__}: {exc}"[:MAX_DETAIL_CHARS]}, 0.0) for _ in items], False
