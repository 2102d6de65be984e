"""One effect's lifecycle, decided by one pure function.

:func:`next_move` looks at what is known of one effect (its ledger record,
the earlier calls of its key that the in-flight registry knows of, the last
observation and the last answer this pass obtained, the caps and the time)
and names the next move. It reads nothing and changes nothing: the executor
(:mod:`runner.execution.executor`) and the engines' helper (:mod:`runner.engines.once`)
carry its moves out and call it again, as tenacity's ``iter()`` decides and
its loop acts. The rules it keeps:

* **Verified is done.** A verified effect is never called again; a failed one
  stops with :class:`~runner.base.errors.Failed`.
* **Nothing is observed or called while an earlier call of the key may be in
  progress**, whichever of the key's calls that is. A call that is alive is
  waited for until its deadline; after it, a call with a process group of its
  own (a command) is killed and waited for, or, where none of its processes
  can be verified to be the call's (no ``/proc``), stops the run for a person
  while it runs; a call without one (an in-process call, or a command not
  started yet) counts as over at its deadline, because the process that made
  it checks that deadline right before it sends or starts its command, and
  sends nothing once it has passed.
* **An absence is an observation only when no earlier call can still land.**
  A lookup that found nothing sooner than ``settle`` seconds after the last
  call ended is not believed: wait, observe again. A presence is believed at
  once, so the target is looked at again before the settle time is out, the
  waits doubling with the time since the last call ended, from the longer of
  :data:`LOOK_AGAIN_SECONDS` and a 64th of the settle time: a call the
  target shows after a lag shorter than the settle time is verified within
  about twice that lag, and an absence is believed after at most nine
  lookups that found nothing (seven for a five-second settle time). Not with
  ``look_early`` off (a target whose calls are rationed by a rate, where
  each early lookup would spend a call an invoke needs): then the next
  lookup is at the settle time.
* **A receipt is proof.** Once an acknowledgement is recorded, no absence
  leads to another call, whatever state the effect has moved to: it is a
  contradiction, recorded and stopped on (needs-reconciliation), never retried.
* **Retry only after an observed absence**, after the persisted backoff, and
  within the attempt caps (which the ledger's ``begin`` enforces); an
  unknown outcome is settled by observing, or (for a target that
  deduplicates) by sending the same key and payload again, only while that
  call would reach the target within its retention counted from the first
  call's start.
* **"Not now" is not "unknown".** A target that says it created nothing
  (429, a 503 naming a delay, exit 75) is recorded as such and called again after the delay
  it named, bounded by its own count.
* **A target that cannot be read back** (``caps.readable`` False: ``"observe": "none"``, a mail
  server) is never looked at: its answer is the only evidence. A receipt verifies the effect, with
  evidence that says the target cannot be read; an outcome left unknown (an unknown answer, a call
  whose process died) is never called again: it is recorded ``uncertain`` and the run stops for a
  person, who records what they saw (``effect verify`` or ``effect absent``, ``--by`` who).
* **Work done before the run is found, not made again** (``caps.observe_first``: ``effects.observe_first``, at a
  target that can be read back). An effect with no record is looked up before its first call: present, it is
  recorded verified with no call (``found``, its evidence saying it was there before any call of this run);
  absent, it is called as any new effect is (no call of this run can land late); a lookup that cannot tell stops,
  with nothing recorded and nothing called, so that the next run looks again.

Times are seconds since the epoch, from the run's clock.
"""

from typing import Any, Dict, Literal, NamedTuple, Optional, Tuple

from ..base.times import parse_time
from ..base.errors import Failed, Fenced, NeedsReconciliation, RunnerError
from ..base.quoting import describe
from ..ledger.states import UNRESOLVED, EffectState
from ..calls.answers import MAX_DETAIL_CHARS, Answer, AnswerKind, Seen, SeenStatus
from ..calls.inflight import Call, CallKind
from ..contract.effects import DEFAULT_CALL_TIMEOUT

__all__ = ["Caps", "Call", "Seen", "Answer", "Facts", "Move", "next_move", "quiet_since", "LOOK_AGAIN_SECONDS",
           "MoveKind", "AnswerKind", "SeenStatus", "CallKind", "ManyLookupState", "MAX_DETAIL_CHARS",
           "FOUND_FIRST_REASON"]

# The words of each vocabulary, as types: a value is one of these strings (never an Enum, whose text would differ
# between Pythons in the reasons and the simulation's trace), and a comparison with any other word is a type error.
# What a call answers and a lookup finds are the words of calls/answers, an earlier call's kind those of the registry.

#: The kinds of :class:`Move`, in the order the docstring of :class:`Move` names them.
MoveKind = Literal["done", "settled", "wait-call", "kill-call", "wait", "observe", "invoke",
                   "ack", "verify", "found", "absent", "defer", "uncertain", "fail", "stop"]
#: What an adapter's lookups of many keys came to: one is out and none answered yet, the target answers them, or it
#: refuses them.
ManyLookupState = Literal["trying", "works", "refused"]

#: Seconds before looking again when a lookup was refused for now and named no delay.
LOOKUP_RETRY_SECONDS = 1.0

#: The shortest wait before looking again at an absence too early to believe.
LOOK_AGAIN_SECONDS = 0.25
#: The first wait is at least this part of the settle time, which bounds the lookups whatever the settle time.
LOOK_AGAIN_PART = 1 / 64


class Caps(NamedTuple):
    """What bounds one effect's calls.

    :param timeout: seconds one call may take (its deadline is its start plus this).
    :param settle: seconds after a call ended during which the target may not show it yet.
    :param deduplicates: the target returns the original for the same key and payload.
    :param retention: seconds the target remembers a key (None: forever).
    :param invoke: False to reconcile only: observe and record, never call the target.
    :param max_later: lookups answered "not now" in a row before the lookup counts as inconclusive.
    :param look_early: look again before the settle time is out after an early absence (a presence is believed at once).
    :param readable: False for a target that cannot be read back: it is never looked at (see the module docstring).
    :param observe_first: look an effect with no record up before its first call, and record it verified if the
        target holds it already (work done before the run); only at a target that can be read back.
    """

    timeout: float = DEFAULT_CALL_TIMEOUT
    settle: float = 0.0
    deduplicates: bool = False
    retention: Optional[float] = None
    invoke: bool = True
    max_later: int = 10
    look_early: bool = True
    readable: bool = True
    observe_first: bool = False


class Facts(NamedTuple):
    """Everything :func:`next_move` decides from."""

    key: str
    effect: Optional[Dict[str, Any]]
    calls: Tuple[Call, ...] = ()
    seen: Optional[Seen] = None
    answer: Optional[Answer] = None
    caps: Caps = Caps()
    now: float = 0.0


class Move(NamedTuple):
    """The one next thing to do for an effect.

    ``kind`` is one of:

    * ``done``: verified; ``settled``: not unresolved, and ``caps.invoke`` is False;
    * ``wait-call``: an earlier call is alive: wait until it ends or ``until`` (its deadline);
    * ``kill-call``: its deadline passed: kill ``call``'s process group, then look again;
    * ``wait``: wait until ``until`` (a backoff, a delay the target asked for, or the settle time);
    * ``observe``: look at the target;
    * ``invoke``: record ``started`` durably, then call the target (``resend``: the same
      key and payload again, to a target that deduplicates);
    * records: ``ack`` (``receipt``), ``verify`` (``evidence``), ``found`` (``evidence``: an effect with no record
      is recorded verified with no call), ``absent`` (``evidence``),
      ``defer`` (``evidence``; the next call not before ``until``), ``uncertain`` (``reason``),
      ``fail`` (``reason``); after a record, ``error`` (if any) is raised;
    * ``stop``: raise ``error``.
    """

    kind: MoveKind
    until: Optional[float] = None
    evidence: Optional[Dict[str, Any]] = None
    receipt: Optional[Dict[str, Any]] = None
    reason: Optional[str] = None
    error: Optional[RunnerError] = None
    call: Optional[Call] = None
    resend: bool = False
    reconciled: bool = False


def quiet_since(facts: Facts) -> float:
    """The moment after which no earlier call of the key can still be in progress, as far as is known.

    The latest end among the registry's calls that ended (a call that ended
    without a recorded end counts as ending at its deadline; so does a call
    without a process of its own still alive past it) and this pass's own
    answer. A recorded ``acknowledged`` or ``uncertain`` was written after its call
    ended, so its time bounds that call too. A ``started`` effect of which
    the registry knows nothing (it was lost with the machine) is assumed to
    have called until its deadline.
    """
    ends = [c.ended_at if c.ended_at is not None else c.deadline for c in facts.calls if not c.alive or not c.killable]
    if facts.answer is not None:
        ends.append(facts.answer.ended_at)
    effect = facts.effect or {}
    state: Optional[EffectState] = effect.get("state")
    if state in UNRESOLVED and effect.get("updated_at"):
        updated = parse_time(effect["updated_at"])
        ends.append(updated + facts.caps.timeout if state == "started" and not facts.calls and facts.answer is None
                    else updated)
    return max(ends) if ends else 0.0


def _within_retention(effect: Dict[str, Any], caps: Caps, now: float) -> bool:
    """Whether a call sent now reaches the target before it forgets the key: the target saw the first call no
    sooner than its start, and a call may arrive as late as its deadline."""
    return caps.retention is None or now + caps.timeout < parse_time(effect["started_at"]) + float(caps.retention)


def _contradiction(key: str, effect: Dict[str, Any], seen: Seen) -> str:
    return (f"acknowledged (receipt {describe(effect.get('receipt'), 120)}) but observed absent "
            f"({describe(seen.evidence, 120)}); a receipt is proof: it is never called again")


#: What the evidence of an effect verified by its receipt alone says, at a target that cannot be read back.
UNREADABLE_REASON = "the target cannot be read back: its receipt is the only evidence"


def _unreadable_stop(key: str, state: Optional[EffectState], why: str) -> Move:
    """An outcome at a target that cannot be read back is not known: recorded ``uncertain`` (once), then the run
    stops for a person, whose commands the error names."""
    error = NeedsReconciliation(
        f"effect {key!r}: {why}, and the target cannot be read back: it is never called again on its own; a person "
        f"looks at the target and records what they saw: `effect verify {key} --by NAME --evidence JSON` if it is "
        f"there, `effect absent {key} --by NAME --evidence JSON` if it is not", key=key, readable=False)
    if state == "uncertain":
        return Move("stop", error=error)
    return Move("uncertain", reason=f"{why}; the target cannot be read back", error=error)


#: What the evidence of an effect found before its first call says (``observe_first``), beside what the lookup found.
FOUND_FIRST_REASON = "found at the target before any call of this run"


def _look(seen: Optional[Seen], now: float) -> Optional[Move]:
    """The lookup still to make: one when nothing was seen; after a lookup answered "not now", a wait until the
    time it gave (else :data:`LOOKUP_RETRY_SECONDS`), then another; None once the target said something."""
    if seen is None:
        return Move("observe")
    if seen.status == "later":
        until = seen.at + float(seen.evidence.get("retry_after") or LOOKUP_RETRY_SECONDS)
        return Move("wait", until=until) if now < until else Move("observe")
    return None


def _look_first(key: str, seen: Optional[Seen], now: float) -> Optional[Move]:
    """Before the first call of an effect with no record (``observe_first``): look; present is ``found`` (verified
    with no call); absent is None (it is called as any new effect); "not now" waits as any lookup does; a lookup that
    cannot tell stops, recording nothing, so that no work done before the run is made a second time."""
    looking = _look(seen, now)
    if looking is not None:
        return looking
    assert seen is not None, "_look asks for a lookup when nothing was seen"
    if seen.status == "present":
        return Move("found", evidence=dict(seen.evidence, observe_first=FOUND_FIRST_REASON))
    if seen.status == "absent":
        return None
    return Move("stop", error=NeedsReconciliation(
        f"effect {key!r}: effects.observe_first: the lookup before its first call could not tell whether the target "
        f"holds it already ({describe(seen.evidence)}); nothing was recorded or called: run again once the target "
        "answers its lookups", key=key, observe_first=True))


def next_move(facts: Facts) -> Move:
    """The next move for one effect (see the module docstring for the rules it keeps)."""
    key, effect, caps, now = facts.key, facts.effect, facts.caps, facts.now
    state: Optional[EffectState] = effect["state"] if effect else None
    if state == "verified":
        return Move("done")
    if state == "failed":
        return Move("stop", error=Failed(f"effect {key!r} failed for good: "
                                         f"{effect.get('reason')}", effect=key))  # type: ignore[union-attr]

    answer = facts.answer
    if answer is not None and state == "started":
        if answer.kind == "receipt":
            return Move("ack", receipt=answer.receipt)
        if answer.kind == "not-applied":
            until = now + answer.retry_after if answer.retry_after is not None else None
            return Move("defer", evidence={"not_applied": answer.detail[:MAX_DETAIL_CHARS]}, until=until)
        if answer.kind == "rejected":
            return Move("fail", reason=f"rejected by the target: {answer.detail}",
                        error=Failed(f"effect {key!r} was rejected by the target: {answer.detail}", effect=key))
        if answer.kind == "stale-epoch":
            return Move("uncertain", reason=f"the target refused a stale epoch: {answer.detail}",
                        error=Fenced(f"the target refused the writer's epoch for effect {key!r}: {answer.detail}",
                                     key=key))
        return Move("uncertain", reason=f"unknown outcome: {answer.detail}")

    live = [c for c in facts.calls if c.alive]
    if live:
        overdue = next((c for c in live if c.killable and now >= c.deadline), None)
        if overdue is not None:
            return Move("kill-call", call=overdue)
        running = [c for c in live if now < c.deadline]
        if running:
            soonest = min(running, key=lambda c: c.deadline)
            return Move("wait-call", until=soonest.deadline, call=soonest)
        stuck = next((c for c in live if c.command and c.kind == "invoke"), None)
        if stuck is not None:
            # A command past its deadline that could be neither verified nor ended may still send: nothing is
            # looked at or called while it runs.
            return Move("stop", call=stuck, error=NeedsReconciliation(
                f"effect {key!r}: the command of an earlier call (process group {stuck.pid}) still runs past its "
                "deadline, and this machine can neither tell that it is the call's nor end it; once that process "
                "group has ended (end it, or see that it did), run again", key=key, process_group=stuck.pid))
        # Only calls past their deadline without a process of their own are left: their maker checks the
        # deadline right before it sends, so none of them sends any more (quiet_since counts them ended).

    if state in UNRESOLVED and not caps.readable:
        # Nothing to look at: what the target answered is all there is.
        if state == "acknowledged":
            receipt = (effect or {}).get("receipt")
            return Move("verify", evidence={"observe": "none", "reason": UNREADABLE_REASON, "receipt": receipt})
        if state == "uncertain":
            return _unreadable_stop(key, state, f"the outcome is unknown ({(effect or {}).get('reason')})")
        return _unreadable_stop(key, state, "a call was made and its answer was lost")

    seen = facts.seen
    # Settled by observing an outcome this pass did not learn from the target's own answer.
    reconciled = answer is None or answer.kind != "receipt"
    if state in UNRESOLVED:
        effect = effect or {}
        looking = _look(seen, now)
        if looking is not None:
            return looking
        assert seen is not None, "_look asks for a lookup when nothing was seen"
        if seen.status == "present":
            return Move("verify", evidence=seen.evidence, reconciled=reconciled)
        if seen.status == "absent":
            quiet = quiet_since(facts)
            settled = quiet + caps.settle
            if seen.at < settled:
                # Looked too early to believe an absence, not too early to see a presence: look again
                # once the time since the last call ended has doubled, and at the settle time at last.
                first = max(LOOK_AGAIN_SECONDS, caps.settle * LOOK_AGAIN_PART)
                again = min(settled, max(quiet, seen.at) + max(first, seen.at - quiet)) if caps.look_early else settled
                return Move("wait", until=again) if now < again else Move("observe")
            if effect.get("receipt") is not None:
                reason = _contradiction(key, effect, seen)
                error = NeedsReconciliation(f"effect {key!r} was {reason}", key=key, receipt=effect.get("receipt"),
                                            observed=seen.evidence)
                return (Move("uncertain", reason=reason, error=error) if state != "uncertain"
                        else Move("stop", error=error))
            return Move("absent", evidence=seen.evidence, reconciled=reconciled)
        # The lookup could not tell.
        if state != "uncertain":
            return Move("uncertain", reason=f"observation was inconclusive: {describe(seen.evidence)}")
        if caps.invoke and caps.deduplicates and effect.get("receipt") is None and _within_retention(effect, caps, now):
            when = parse_time(effect["next_attempt_at"]) if effect.get("next_attempt_at") else None
            if when is not None and now < when:
                return Move("wait", until=when)  # an earlier resend was answered "not now"
            if when is not None and seen.at < when:
                return Move("observe")  # look again before sending again
            return Move("invoke", resend=True)
        return Move("stop", error=NeedsReconciliation(
            f"effect {key!r}: the target cannot say whether it happened ({describe(seen.evidence)}); it will not be "
            "called blindly",
            key=key))

    # No outcome is pending: the effect was never begun, or was observed absent.
    if not caps.invoke:
        return Move("settled")
    if effect is None and caps.observe_first and caps.readable:
        looked = _look_first(key, seen, now)
        if looked is not None:
            return looked
    if effect is not None and effect.get("receipt") is not None:
        return Move("stop", error=NeedsReconciliation(
            f"effect {key!r} holds a receipt ({describe(effect.get('receipt'), 120)}) and is {state}: a receipt is "
            "proof; it is never called again under this key", key=key, receipt=effect.get("receipt")))
    when = (effect or {}).get("next_attempt_at")
    if when and parse_time(when) > now:
        return Move("wait", until=parse_time(when))
    return Move("invoke")
