"""The words of every stop: one code and one sentence for each reason a run stops, the same in every view.

A stop decision (:func:`runner.execution.recovery.decide`, ``drive`` ending
on an error, the harness hooks letting a session stop) carries the exit
table's ``reason`` (:data:`runner.base.errors.EXIT_TABLE`), which one exit
code stands for. Several stops share a reason: ``limit-exhausted`` is any of
seven limits, ``awaiting-approval`` a request pending or one denied. Here
each stop has a code of its own (the reason, then ``/`` and the case where
the reason has several) and a sentence: what the stop means, then what of
the run says so, then what moves the run on. ``next``, ``status``, ``brief``,
``drive`` and the hooks print ``CODE: SENTENCE``, and ``--json`` carries both as
``stop_code`` and ``sentence``. A reason outside this table still reads as its
own code with the exit table's meaning, never as something unknown.

Every sentence is the runner's prose: values from the run (ids, names,
reasons, amounts) go through :mod:`runner.base.quoting`, as in the rest of a
decision.
"""

from typing import Any, Dict, Mapping, NamedTuple, Optional

from ..base.errors import EXIT_TABLE
from ..base.quoting import PERSON, RECORD, moment, name, number, quote
from ..base.times import parse_time
from ..contract.spec import contract_of
from ..ledger.costs import spend_line

__all__ = ["Stop", "STOPS", "LIMIT_CODES", "stop_of", "with_stop", "line"]


class Stop(NamedTuple):
    """How a stop reads: its code, the exit table's reason it exits with, and its sentence."""

    code: str
    reason: str
    sentence: str


#: The code of each limit of the contract, after ``limit-exhausted/``.
LIMIT_CODES = {
    "max_cost": "cost",
    "max_elapsed_seconds": "elapsed-time",
    "max_steps": "steps",
    "no_progress_seconds": "no-progress",
    "max_step_attempts": "step-attempts",
    "max_effect_attempts": "effect-attempts",
    "max_rate_limited": "not-now",
}

#: What each stop means, by code: the first part of its sentence.
STOPS: Dict[str, str] = {
    "complete": "every step is done and every effect verified",
    "cancelled": "the run was cancelled: no new step or effect may begin",
    "awaiting-approval/pending": "the plan needs a person's approval first",
    "awaiting-approval/denied": "a person denied a request the plan needs",
    "failed/step": "a step failed for good",
    "limit-exhausted/cost": "the run has spent its cost limit (limits.max_cost)",
    "limit-exhausted/elapsed-time": "the run has taken the time it may (limits.max_elapsed_seconds)",
    "limit-exhausted/steps": "the run has started as many steps as it may (limits.max_steps)",
    "limit-exhausted/no-progress": "the run made no progress for longer than it may (limits.no_progress_seconds)",
    "limit-exhausted/step-attempts": "a step has used every attempt it may (limits.max_step_attempts)",
    "limit-exhausted/effect-attempts": "an effect has used every attempt it may (limits.max_effect_attempts)",
    "limit-exhausted/not-now":
        "the target answered 'not now' as often as an effect may wait for it (effects.max_rate_limited)",
    "limit-exhausted": "a limit of the run is spent",
    "needs-reconciliation/effect":
        "no one knows yet whether an effect happened, and it is observed at the target before anything is retried",
    "needs-reconciliation/job": "a job vanished and the contract does not allow a rerun",
    "already-running": "another owner holds the run's lease",
    "fenced": "this writer does not hold the run's live lease",
    "state-unrecoverable": "the run's state is damaged or of another schema",
    "retry-later": "a backoff the run recorded has not ended yet",
    "stopped": "drive was asked to stop: the calls in flight were recorded and the lease released",
    "no-progress": "the session was kept going without the run changing",
    "not-adopted": "the run is not this user's: a recover by this user on this machine adopts it",
}

#: What moves the run on, where the specifics do not say: the last part of the sentence.
_NEXT = {
    "already-running": "wait until it gives the lease back or it lapses; if that worker is gone for good, "
                       "`lease break --by NAME --reason TEXT` ends its lease at once and the next drive takes over",
    "fenced": "stop writing at once; `recover --owner ID` (or `drive --owner ID`) takes the lease again at a new "
              "epoch if you are meant to go on",
    "awaiting-approval/denied": "a new request, a plan change or a cancellation moves the run on",
    "failed/step": "a plan change (`migrate --contract FILE`) or a cancellation moves the run on",
    "needs-reconciliation/job": "what it left behind is for a person to check",
}
#: What moves the run on after a limit: the end of each limit's sentence.
_LIMIT_NEXT = "a plan change that raises it (`migrate --contract FILE`) lets the run go on; a cancellation ends it"
_MEANINGS = {row.reason: row.meaning for row in EXIT_TABLE}


def stop_of(decision: Mapping[str, Any], state: Optional[Dict[str, Any]] = None) -> Stop:
    """The code, reason and sentence of a stop decision, its specifics read from ``state`` where given.

    :param decision: a stop (``decision`` is ``stop``): its ``reason``, ``detail`` and the fields the
        recovery procedure adds (``limit``, ``step``, ``request_id``, ``check``).
    """
    reason = str(decision.get("reason"))
    code = _code(reason, decision, state)
    meaning = STOPS.get(code) or _MEANINGS.get(reason) or f"the run stopped ({reason})"
    said = _specifics(code, decision, state)
    sentence = f"{meaning}: {said}" if said and said != meaning else meaning
    return Stop(code, reason, f"{sentence}; {_NEXT[code]}" if code in _NEXT else sentence)


def with_stop(decision: Dict[str, Any], state: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``decision`` with ``stop_code`` and ``sentence`` added when it is a stop (an act is returned as it is)."""
    if decision.get("decision") != "stop":
        return decision
    stop = stop_of(decision, state)
    return dict(decision, stop_code=stop.code, sentence=stop.sentence)


def line(decision: Mapping[str, Any], state: Optional[Dict[str, Any]] = None) -> str:
    """``CODE: SENTENCE`` of a stop decision: how every view prints it."""
    stop = stop_of(decision, state)
    return f"{stop.code}: {stop.sentence}"


def _code(reason: str, decision: Mapping[str, Any], state: Optional[Dict[str, Any]]) -> str:
    if reason == "limit-exhausted":
        limit = decision.get("limit") or (decision.get("context") or {}).get("limit")
        return f"limit-exhausted/{LIMIT_CODES[limit]}" if limit in LIMIT_CODES else "limit-exhausted"
    if reason == "awaiting-approval":
        request = (state or {}).get("observations", {}).get("approvals", {}).get(decision.get("request_id")) or {}
        denied = request.get("state") == "denied" if request else " was denied by " in str(decision.get("detail"))
        return "awaiting-approval/denied" if denied else "awaiting-approval/pending"
    if reason == "failed":
        return "failed/step"
    if reason == "needs-reconciliation":
        return "needs-reconciliation/job" if not decision.get("check") and "job " in str(decision.get("detail")) else \
            "needs-reconciliation/effect"
    return reason


def _specifics(code: str, decision: Mapping[str, Any], state: Optional[Dict[str, Any]]) -> str:
    """What of the run says so: read from the state for a limit or a cancellation, else the decision's own detail."""
    detail = str(decision.get("detail") or "")
    if state is None:
        return detail
    if code.startswith("limit-exhausted"):
        found = _limit(code, state)
        return f"{found}; {_LIMIT_NEXT}" if found else f"{detail}; {_LIMIT_NEXT}"
    if code == "cancelled":
        cancellation = state["observations"].get("cancellation")
        if isinstance(cancellation, dict):
            return (f"by {name(cancellation.get('by'))} at {moment(cancellation.get('at'))}: "
                    f"{quote(cancellation.get('reason'), PERSON, 200)}")
    return detail


def _limit(code: str, state: Dict[str, Any]) -> str:
    """The spent amount of a run-wide limit against its bound, from the state; "" for a limit of one step or effect."""
    limits, counters = contract_of(state).limits, state["counters"]
    if code == "limit-exhausted/cost" and limits.cost_limits:
        return spend_line(state)
    if code == "limit-exhausted/elapsed-time" and limits.max_elapsed_seconds is not None:
        taken = parse_time(state["updated_at"]) - parse_time(state["created_at"])
        since = moment(state["created_at"])
        return f"{number(round(taken))} s taken of {number(limits.max_elapsed_seconds)} s, since {since}"
    if code == "limit-exhausted/steps" and limits.max_steps is not None:
        return f"{number(counters.get('steps_started', 0))} steps started of {number(limits.max_steps)}"
    if code == "limit-exhausted/no-progress" and limits.no_progress_seconds is not None:
        return f"no progress since {moment(counters.get('last_progress_at') or state['created_at'])}, for at most " \
               f"{number(limits.no_progress_seconds)} s"
    stop = state.get("next_action") if isinstance(state.get("next_action"), dict) else {}
    if stop and stop.get("detail"):
        return f"recorded: {quote(stop['detail'], RECORD, 200)}"
    return ""

