"""Scoped approval: a human grant bound to one task, plan, step, action and payload.

A request records the task id, the plan digest, the step, the action
(``effect:KEY`` for an effect, the only thing approvals gate), the payload's
digest, and an expiry. A gated effect may begin only when a *granted*
request matches every one of those fields and has not expired. Anything else
(no request, a pending or denied one, an expired one, a different payload or
step, a plan that changed since) is :class:`~runner.errors.AwaitingApproval`.

A grant is single-use: the first effect it lets begin consumes it, recording
the effect key. A later attempt of that same effect with the same payload
(after the target was observed not to have it) stays covered until the grant
expires; anything else needs a new grant. There are no wildcard or partial grants, so a grant can
never be broader than the request, and recovery never creates or widens one.
"""

from typing import Any, Dict, List, Optional, Tuple

from .envelope import format_time, parse_time, validate_id
from .errors import AwaitingApproval, InvalidInput

__all__ = ["request_ops", "answer_ops", "find_grant", "require_grant", "approval_view"]

Ops = List[List[Any]]


def _approvals(state: Dict[str, Any]) -> Dict[str, Any]:
    return state["observations"]["approvals"]


def request_ops(state: Dict[str, Any], step: str, action: str, payload_digest: str, ttl: float, now: float) -> Tuple[str, Ops]:
    """Record a pending request, or return the identical pending one. Returns ``(request_id, ops)``."""
    validate_id(step, "step")
    if not action or len(action) > 300 or any(ord(c) < 32 for c in action):
        raise InvalidInput("action must be a short single line, e.g. effect:KEY")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
        raise InvalidInput("ttl must be a positive number of seconds")
    steps = {s["id"] for s in state["plan"].get("steps", [])}
    if step not in steps:
        raise InvalidInput(f"step {step!r} is not in the plan (steps: {', '.join(sorted(steps))})")
    for rid, req in _approvals(state).items():
        if (
            req["state"] == "pending"
            and req["step"] == step
            and req["action"] == action
            and req["payload_digest"] == payload_digest
            and req["plan_digest"] == state["plan_digest"]
            and parse_time(req["expires_at"]) > now
        ):
            return rid, []
    rid = f"apr-{state['revision'] + 1}"
    request = {
        "task_id": state["task_id"],
        "plan_digest": state["plan_digest"],
        "step": step,
        "action": action,
        "payload_digest": payload_digest,
        "requested_at": format_time(now),
        "expires_at": format_time(now + ttl),
        "state": "pending",
        "by": None,
        "answered_at": None,
        "used_by": None,
        "source": "approval request",
    }
    return rid, [["set", ["observations", "approvals", rid], request]]


def answer_ops(state: Dict[str, Any], request_id: str, by: str, grant: bool, now: float) -> Ops:
    """Grant or deny a pending, unexpired request."""
    validate_id(by, "approver")
    req = _approvals(state).get(request_id)
    if req is None:
        raise InvalidInput(f"no approval request {request_id!r}")
    if req["state"] != "pending":
        raise InvalidInput(f"approval request {request_id} is already {req['state']}")
    if parse_time(req["expires_at"]) <= now:
        raise InvalidInput(f"approval request {request_id} expired at {req['expires_at']}; request a new one")
    if req["plan_digest"] != state["plan_digest"]:
        raise InvalidInput(f"approval request {request_id} was made under another plan; request a new one")
    return [
        ["set", ["observations", "approvals", request_id, "state"], "granted" if grant else "denied"],
        ["set", ["observations", "approvals", request_id, "by"], by],
        ["set", ["observations", "approvals", request_id, "answered_at"], format_time(now)],
    ]


def find_grant(state: Dict[str, Any], step: str, action: str, payload_digest: str, now: float, effect_key: Optional[str] = None) -> Tuple[Optional[str], str]:
    """``(request_id, "")`` of a usable grant, or ``(None, why_not)``."""
    why = "no approval was requested for it"
    for rid, req in sorted(_approvals(state).items()):
        if req["action"] != action or req["step"] != step:
            continue
        if req["payload_digest"] != payload_digest:
            why = f"request {rid} is for another payload ({req['payload_digest'][:19]}...)"
            continue
        if req["task_id"] != state["task_id"] or req["plan_digest"] != state["plan_digest"]:
            why = f"request {rid} was made under another plan"
            continue
        if req["state"] == "pending":
            why = f"request {rid} is still pending"
            continue
        reusable = req["state"] == "used" and effect_key is not None and req.get("used_by") == effect_key
        if req["state"] != "granted" and not reusable:
            why = f"request {rid} is {req['state']}" + (f" (by {req['used_by']})" if req["state"] == "used" else "")
            continue
        if parse_time(req["expires_at"]) <= now:
            why = f"the grant of request {rid} expired at {req['expires_at']}"
            continue
        return rid, ""
    return None, why


def require_grant(state: Dict[str, Any], step: str, action: str, payload_digest: str, now: float, effect_key: str) -> Ops:
    """Ops that consume a matching grant, or raise :class:`AwaitingApproval`."""
    rid, why = find_grant(state, step, action, payload_digest, now, effect_key)
    if rid is None:
        raise AwaitingApproval(
            f"{action} in step {step} needs approval: {why}; run 'approval request {step} --action {action} --payload FILE'",
            step=step,
            action=action,
            payload_digest=payload_digest,
        )
    req = _approvals(state)[rid]
    if req["state"] == "used":
        return []
    return [
        ["set", ["observations", "approvals", rid, "state"], "used"],
        ["set", ["observations", "approvals", rid, "used_by"], effect_key],
    ]


def approval_view(state: Dict[str, Any], now: float) -> List[Dict[str, Any]]:
    out = []
    for rid, req in sorted(_approvals(state).items()):
        item = {"request_id": rid, **req}
        item["expired"] = parse_time(req["expires_at"]) <= now
        out.append(item)
    return out
