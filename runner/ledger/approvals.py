"""Scoped approval: a human grant bound to one task, plan, step, action and payload.

A request records the task id, the plan digest, the step, the action
(``effect:KEY`` for an effect, the only thing approvals gate), the payload's
digest, and an expiry. A gated effect may begin only when a *granted*
request matches every one of those fields and has not expired. Anything else
(no request, a pending or denied one, an expired one, a different payload or
step, a plan that changed since) is :class:`~runner.base.errors.AwaitingApproval`.

A grant is single-use: the first effect it lets begin consumes it, recording
the effect key. A later attempt of that same effect with the same payload
(after the target was observed not to have it) stays covered until the grant
expires; anything else needs a new grant. There are no wildcard or partial grants, so a grant can
never be broader than the request, and recovery never creates or widens one.

For one step and action, the newest request is the one that counts: a new
request with another payload marks the older pending or granted ones
``superseded`` (recorded, with the newer request's id), so the old grant can
no longer be used, unless the contract's ``effects.several_approvals`` is true
(several requests for one action, each for its own payload, may then stand).
A denial stops the run only while no newer request for the same step and
action exists. Each request records where its payload came from (the file and
its first bytes), so a person can tell which draft a grant covers.
"""

from typing import Any, Dict, List, Optional, Tuple

from .envelope import Ops
from ..base.values import validate_id
from ..base.times import format_time, parse_time
from ..base.errors import AwaitingApproval, InvalidInput
from ..contract.spec import contract_of

__all__ = [
    "request_ops", "answer_ops", "find_grant", "require_grant", "approval_view", "newest_requests", "request_order",
    "payload_source", "HEAD_BYTES",
]

#: How much of the payload file a request keeps, for a person to recognise it.
HEAD_BYTES = 80



def _approvals(state: Dict[str, Any]) -> Dict[str, Any]:
    return state["observations"]["approvals"]


def request_order(rid: str) -> Tuple[int, str]:
    """Requests in the order they were made (``apr-9`` before ``apr-10``)."""
    number = rid.rpartition("-")[2]
    return (int(number) if number.isdigit() else -1, rid)


def _in_order(state: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    return sorted(_approvals(state).items(), key=lambda item: request_order(item[0]))


def payload_source(file: Optional[str], data: bytes) -> Dict[str, Any]:
    """Where a request's payload came from: the file's name (None: not a file) and its first bytes as text."""
    head = data[:HEAD_BYTES].decode("utf-8", "replace")
    return {"payload_file": file, "payload_head": head + ("…" if len(data) > HEAD_BYTES else "")}


def newest_requests(state: Dict[str, Any]) -> Dict[Tuple[str, str], str]:
    """``(step, action) -> request_id`` of the newest request under the run's plan."""
    newest: Dict[Tuple[str, str], str] = {}
    for rid, req in _in_order(state):
        if req["plan_digest"] == state["plan_digest"]:
            newest[(req["step"], req["action"])] = rid
    return newest


def request_ops(state: Dict[str, Any], step: str, action: str, payload_digest: str, ttl: float, now: float,
                source: Optional[Dict[str, Any]] = None) -> Tuple[str, Ops]:
    """Record a pending request, or return the identical pending one. Returns ``(request_id, ops)``.

    ``source`` (see :func:`payload_source`) records the payload's file and first bytes.
    Older pending or granted requests for the same step and action with another
    payload are marked ``superseded`` unless the contract lets several stand.
    """
    validate_id(step, "step")
    if not action or len(action) > 300 or any(ord(c) < 32 for c in action):
        raise InvalidInput("action must be a short single line, e.g. effect:KEY")
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
        raise InvalidInput("ttl must be a positive number of seconds")
    steps = {s.id for s in contract_of(state).steps}
    if step not in steps:
        raise InvalidInput(f"step {step!r} is not in the plan (steps: {', '.join(sorted(steps))})")
    for rid, req in _in_order(state):
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
    source = source or {}
    request = {
        "task_id": state["task_id"],
        "plan_digest": state["plan_digest"],
        "step": step,
        "action": action,
        "payload_digest": payload_digest,
        "payload_file": source.get("payload_file"),
        "payload_head": source.get("payload_head"),
        "requested_at": format_time(now),
        "expires_at": format_time(now + ttl),
        "state": "pending",
        "by": None,
        "answered_at": None,
        "used_by": None,
        "superseded_by": None,
        "source": "approval request",
    }
    ops: Ops = []
    if not contract_of(state).effects.several_approvals:
        for old, req in _in_order(state):
            if (req["step"] == step and req["action"] == action and req["state"] in ("pending", "granted") and
                req["payload_digest"] != payload_digest):
                ops.append(["set", ["observations", "approvals", old, "state"], "superseded"])
                ops.append(["set", ["observations", "approvals", old, "superseded_by"], rid])
    return rid, ops + [["set", ["observations", "approvals", rid], request]]


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


def find_grant(state: Dict[str, Any], step: str, action: str, payload_digest: str, now: float,
               effect_key: Optional[str] = None) -> Tuple[Optional[str], str]:
    """``(request_id, "")`` of a usable grant, or ``(None, why_not)``.

    ``why_not`` speaks of the newest request for this very payload when there is one
    (pending, denied, superseded, expired...), else of one for another payload.
    """
    why, other = "", ""
    for rid, req in _in_order(state):
        if req["action"] != action or req["step"] != step:
            continue
        if req["payload_digest"] != payload_digest:
            other = f"request {rid} is for another payload ({req['payload_digest'][:19]}...)"
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
            if req["state"] == "superseded":
                why += f" by {req.get('superseded_by')}"
            continue
        if parse_time(req["expires_at"]) <= now:
            why = f"the grant of request {rid} expired at {req['expires_at']}"
            continue
        return rid, ""
    return None, why or other or "no approval was requested for it"


def require_grant(state: Dict[str, Any], step: str, action: str, payload_digest: str, now: float,
                  effect_key: str) -> Ops:
    """Ops that consume a matching grant, or raise :class:`AwaitingApproval`."""
    rid, why = find_grant(state, step, action, payload_digest, now, effect_key)
    if rid is None:
        raise AwaitingApproval(
            f"{action} in step {step} needs approval: {why}; run `approval request {step} --action {action} --payload "
            "FILE --ttl SECONDS`",
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
    """Every request in the order made, with whether it expired and whether it is the current one
    for its step and action (the newest under the run's plan)."""
    newest = set(newest_requests(state).values())
    out = []
    for rid, req in _in_order(state):
        item = {"request_id": rid, "payload_file": None, "payload_head": None, "superseded_by": None, **req}
        item["expired"] = parse_time(req["expires_at"]) <= now
        item["current"] = rid in newest
        out.append(item)
    return out
