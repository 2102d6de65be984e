"""Steps, cancellation and plan migration: the run's own transitions.

Steps run in the order the contract lists them. Each has a persisted attempt
counter; ``done`` requires the evidence the contract names for that step and
refuses while an effect begun in the step is unresolved, so a step is never
declared done on a claim. The run becomes ``complete`` only when every step
is done and no effect is unresolved.

Cancellation is recorded with who, why and when, and refuses every new step
and effect. Effects already in flight are still reconciled; the run becomes
``cancelled`` as soon as none is left in flight, which is at most one step.

A plan change is refused unless recorded as a migration: the new plan and
its digest replace the old, pending approvals (bound to the old digest) stop
matching, and every counter carries over. A migration to a plan without the
running step is refused: finish or fail that step first (``step done`` needs
its effects reconciled), so no run is left running a step no verb can end.

A permanent step failure ends the run as ``blocked`` with the reason
``failed`` and the step named; a spent limit, with ``limit-exhausted`` and the
limit named.
"""

from typing import Any, Dict, Optional, Tuple

from ..contract.spec import StepSpec, contract_of
from ..contract.text import parse_contract_text
from .effects import check_open, cancelled_ops
from ..base.canonical import check_document
from .states import UNRESOLVED
from .envelope import Ops
from ..base.values import one_line, validate_id
from ..base.times import format_time
from ..base.canonical import content_digest
from ..base.errors import InvalidInput, NeedsReconciliation, RunComplete
from .retry import check_attempts, check_limits, check_wait, limit, next_attempt_at

__all__ = ["start_ops", "done_ops", "fail_ops", "cancel_ops", "migrate_ops", "blocked_ops", "step_failed_ops",
           "plan_steps", "started_by_holder"]



def plan_steps(state: Dict[str, Any]) -> Tuple[StepSpec, ...]:
    """The run's steps in plan order, as its contract's specs."""
    return contract_of(state).steps


def _plan_step(state: Dict[str, Any], step: str) -> StepSpec:
    validate_id(step, "step")
    found = contract_of(state).step(step)
    if found is None:
        raise InvalidInput(f"step {step!r} is not in the plan (steps: {', '.join(s.id for s in plan_steps(state))})")
    return found


def blocked_ops(detail: str, limit_name: Optional[str], now: float) -> Ops:
    """Record a spent limit as the run's blocked outcome."""
    return [
        ["set", ["status"], "blocked"],
        ["set", ["next_action"],
         {"kind": "stop", "reason": "limit-exhausted", "limit": limit_name, "detail": detail, "at": format_time(now)}],
    ]


def step_failed_ops(step: str, detail: str, now: float) -> Ops:
    """Record a permanent step failure as the run's blocked outcome, naming the step."""
    return [
        ["set", ["status"], "blocked"],
        ["set", ["next_action"],
         {"kind": "stop", "reason": "failed", "step": step, "detail": detail, "at": format_time(now)}],
    ]


def start_ops(state: Dict[str, Any], step: str, now: float) -> Ops:
    """Start ``step`` (a new attempt if it was running when its worker died)."""
    spec = _plan_step(state, step)
    record = state["steps"].get(step) or {}
    if record.get("state") == "done":
        raise InvalidInput(f"step {step!r} is already done")
    current = state.get("current_step")
    if current and current != step:
        raise InvalidInput(f"step {current!r} is still running: finish or fail it before starting {step!r}")
    check_open(state)
    for earlier in plan_steps(state):
        if earlier.id == step:
            break
        if (state["steps"].get(earlier.id) or {}).get("state") != "done":
            raise InvalidInput(f"step {step!r} cannot start before step {earlier.id!r} is done "
                               "(steps run in plan order)")
    check_limits(state, now)
    attempts = int(record.get("attempts", 0))
    check_attempts(attempts, limit(state, "max_step_attempts"), f"step {step}", "max_step_attempts")
    check_wait(record, now, f"step {step}")
    stamp = format_time(now)
    counters = state["counters"]
    return [
        ["set", ["steps", step], {
            "state": "running",
            "attempts": attempts + 1,
            "started_at": stamp,
            # The lease epoch it started under: a later holder is known by its epoch, never by comparing times.
            "epoch": int(state["lease"].get("epoch") or 0),
            "finished_at": None,
            "evidence": None,
            "error": None,
            "class": None,
            "next_attempt_at": None,
            "approval": spec.approval,
        }],
        ["set", ["current_step"], step],
        ["set", ["next_action"], {"kind": "finish-step", "step": step}],
        ["set", ["counters", "steps_started"], int(counters.get("steps_started", 0)) + 1],
        ["set", ["counters", "step_attempts"], int(counters.get("step_attempts", 0)) + 1],
    ]


def started_by_holder(state: Dict[str, Any], record: Dict[str, Any]) -> bool:
    """Whether the step ``record`` was started under the present lease: its holder is still at work on it.

    Judged by the lease epoch the step started under, which only grows: a holder that took the lease
    in the same millisecond as the step's start is still a later holder. A step recorded before the
    epoch was kept falls back to comparing the start with the lease's acquisition time.
    """
    lease = state["lease"]
    if "epoch" in record:
        return lease.get("owner") is not None and int(record["epoch"]) == int(lease.get("epoch") or 0)
    return bool(lease.get("acquired_at")) and record.get("started_at", "") >= lease["acquired_at"]


def _next_step(state: Dict[str, Any], done_step: str) -> Optional[str]:
    for item in plan_steps(state):
        if item.id == done_step:
            nxt = item.next
            if nxt and nxt != "done":
                return nxt
    for item in plan_steps(state):
        if item.id != done_step and (state["steps"].get(item.id) or {}).get("state") != "done":
            return item.id
    return None


def done_ops(state: Dict[str, Any], step: str, evidence: Dict[str, Any], now: float) -> Ops:
    """Record ``step`` as done with the evidence its contract asks for."""
    spec = _plan_step(state, step)
    check_document(evidence, "evidence")
    record = state["steps"].get(step) or {}
    if record.get("state") == "done":
        if record.get("evidence") == evidence:
            return []
        raise InvalidInput(f"step {step!r} is already done with other evidence")
    if record.get("state") != "running":
        raise InvalidInput(f"step {step!r} is not running (start it first)")
    missing = [name for name in spec.evidence if name not in evidence]
    if missing:
        raise InvalidInput(f"step {step!r} needs evidence {', '.join(missing)} "
                           f"(the contract asks for {', '.join(spec.evidence)})")
    if spec.approval and not any(e.get("step") == step and e.get("state") == "verified"
                                 for e in state["effects"].values()):
        # The step exists to gate an effect; without a verified one, "done" would be a claim.
        raise InvalidInput(f"step {step!r} needs approval: it is done only with a verified effect begun in it "
                           "(approval request, grant, effect begin ... effect verify)")
    open_effects = sorted(k for k, e in state["effects"].items() if e.get("step") == step and
                          e.get("state") in UNRESOLVED)
    if open_effects:
        raise NeedsReconciliation(f"step {step!r} has unresolved effects: {', '.join(open_effects[:5])}; verify them "
                                  "first", keys=open_effects[:20])
    stamp = format_time(now)
    ops: Ops = [
        ["set", ["steps", step, "state"], "done"],
        ["set", ["steps", step, "evidence"], evidence],
        ["set", ["steps", step, "finished_at"], stamp],
        ["set", ["completed_steps"], list(state["completed_steps"]) + [step]],
        ["set", ["current_step"], None],
        ["set", ["counters", "last_progress_at"], stamp],
    ]
    if state["observations"].get("cancellation"):
        in_flight = any(e.get("state") in UNRESOLVED for e in state["effects"].values())
        if not in_flight and state["status"] == "active":
            ops += [["set", ["status"], "cancelled"], ["set", ["next_action"], None]]
        return ops
    nxt = _next_step(state, step)
    if nxt is None:
        unresolved = sorted(k for k, e in state["effects"].items() if e.get("state") in UNRESOLVED)
        if unresolved:
            ops.append(["set", ["next_action"], {"kind": "reconcile", "keys": unresolved[:20]}])
        else:
            ops += [["set", ["status"], "complete"], ["set", ["next_action"], None]]
    else:
        ops.append(["set", ["next_action"], {"kind": "start-step", "step": nxt}])
    return ops


def fail_ops(state: Dict[str, Any], step: str, error_class: str, error: str, now: float, rand: Any = None) -> Ops:
    """Record a failed attempt: transient waits (capped, jittered, persisted); permanent blocks."""
    _plan_step(state, step)
    if error_class not in ("transient", "permanent"):
        raise InvalidInput("--class must be transient or permanent")
    one_line(error, "error")
    record = state["steps"].get(step) or {}
    if record.get("state") != "running":
        raise InvalidInput(f"step {step!r} is not running")
    attempts = int(record.get("attempts", 0))
    stamp = format_time(now)
    ops: Ops = [
        ["set", ["steps", step, "state"], "failed"],
        ["set", ["steps", step, "error"], error],
        ["set", ["steps", step, "class"], error_class],
        ["set", ["steps", step, "finished_at"], stamp],
        ["set", ["current_step"], None],
    ]
    maximum = limit(state, "max_step_attempts")
    if error_class == "permanent":
        return ops + step_failed_ops(step, f"step {step} failed permanently: {error}", now)
    if maximum is not None and attempts >= maximum:
        return ops + blocked_ops(f"step {step}: {attempts} attempts used of {int(maximum)}; last error: {error}",
                                 "max_step_attempts", now)
    kwargs = {"rand": rand} if rand is not None else {}
    when = next_attempt_at(state, attempts, now, **kwargs)
    return ops + [
        ["set", ["steps", step, "next_attempt_at"], when],
        ["set", ["next_action"], {"kind": "start-step", "step": step, "not_before": when}],
    ]


def cancel_ops(state: Dict[str, Any], by: str, reason: str, now: float) -> Ops:
    """Record a cancellation; the run is ``cancelled`` at once if nothing is in flight."""
    validate_id(by, "canceller")
    one_line(reason, "reason")
    if state["observations"].get("cancellation"):
        return []
    if state["status"] == "complete":
        raise RunComplete(f"run {state['task_id']} is already complete; there is nothing left to cancel")
    if state["status"] == "cancelled":
        raise InvalidInput(f"run {state['task_id']} is already cancelled")
    stamp = format_time(now)
    ops: Ops = [["set", ["observations", "cancellation"],
                 {"by": by, "reason": reason, "at": stamp, "source": "cancel"}]]
    in_flight = sorted(k for k, e in state["effects"].items() if e.get("state") in UNRESOLVED)
    if in_flight:
        ops.append(["set", ["next_action"], {"kind": "reconcile", "keys": in_flight[:20], "then": "cancelled"}])
    else:
        ops += cancelled_ops(state)
    return ops


def migrate_ops(state: Dict[str, Any], contract_text: str, reason: str, now: float) -> Ops:
    """Record an explicit change of plan as a new attempt of the same run."""
    block, problems = parse_contract_text(contract_text)
    if block is None:
        raise InvalidInput(f"the new contract is invalid: {problems[0].message} (line {problems[0].line})")
    if block["task_id"] != state["task_id"]:
        raise InvalidInput(f"the new contract is for task {block['task_id']!r}, not {state['task_id']!r}")
    digest = content_digest(block)
    if digest == state["plan_digest"]:
        return []
    running = state.get("current_step")
    if running and running not in {s["id"] for s in block["steps"]}:
        raise InvalidInput(
            f"the new plan has no step {running!r}, which is running: finish it (`step done {running}`) or fail it "
            f"(`step fail {running}`) first, then migrate",
            step=running,
        )
    key = f"m{state['revision'] + 1}"
    record = {"from": state["plan_digest"], "to": digest, "reason": reason, "at": format_time(now), "source": "migrate"}
    ops: Ops = [
        ["set", ["plan"], block],
        ["set", ["plan_digest"], digest],
        ["set", ["observations", "authorization", key], record],
    ]
    for name in ("max_step_attempts", "max_effect_attempts", "max_elapsed_seconds", "max_cost", "max_steps",
                 "no_progress_seconds"):
        value = block.get("limits", {}).get(name)
        ops.append(["set", ["budgets", name], value] if value is not None else ["del", ["budgets", name]])
    if state["status"] == "blocked":
        ops += [["set", ["status"], "active"], ["set", ["next_action"], None]]
    return ops


def require_plan(state: Dict[str, Any], contract_text: Optional[str]) -> None:
    """Refuse to continue under a plan other than the run's (unless migrated)."""
    if contract_text is None:
        return
    block, problems = parse_contract_text(contract_text)
    if block is None:
        raise InvalidInput(f"the contract is invalid: {problems[0].message} (line {problems[0].line})")
    digest = content_digest(block)
    if digest != state["plan_digest"]:
        raise InvalidInput(
            f"the contract's plan {digest} differs from the run's {state['plan_digest']}; record the change with "
            "`migrate --contract FILE --reason TEXT` first",
            plan_digest=state["plan_digest"],
        )
