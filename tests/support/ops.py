"""In-memory states for the unit tests of the transition rules (no processes, no disk).

A state is built by applying the ``*_ops`` functions' own operations, exactly as the store would
(revision + 1, ``updated_at`` = now), so each test reads as a short history and asserts the exact
operations or the exact error class of the next transition.
"""

import copy
from typing import Any, Callable, Dict, List, Optional

from runner.ledger import approvals, effects, lease, steps
from runner.ledger.envelope import apply_ops, new_envelope
from runner.base.times import format_time, parse_time
from runner.base.canonical import content_digest

#: A fixed instant, on a whole millisecond, so persisted times are exact.
T0 = parse_time("2026-06-01T12:00:00.000Z")
PAYLOAD = {"title": "Week 48", "body": "..."}
DIGEST = content_digest(PAYLOAD)
OTHER = content_digest({"title": "Week 48, second draft"})
EVIDENCE = {"draft": {"file_sha256": "a" * 64}, "review": {"exit_code": 0}, "publish": {"receipt": "r-1", "url_check": 200}}


def plan(**sections: Any) -> Dict[str, Any]:
    """Three steps (publish needs approval), keys under ``publish:*`` gated, small limits."""
    block: Dict[str, Any] = {
        "contract": 1,
        "task_id": "ops-1",
        "goal": "unit tests of the transition rules",
        "steps": [
            {"id": "draft", "evidence": ["file_sha256"], "next": "review"},
            {"id": "review", "evidence": ["exit_code"], "next": "publish"},
            {"id": "publish", "evidence": ["receipt", "url_check"], "approval": True, "next": "done"},
        ],
        "effects": {"key_pattern": "[a-z0-9][a-z0-9:._-]*", "approval": ["publish:*"]},
        "limits": {"max_step_attempts": 3, "max_effect_attempts": 3},
        "retry": {"base_seconds": 10, "cap_seconds": 100},
        "lease": {"ttl_seconds": 300},
    }
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(block.get(name), dict):
            block[name] = {**block[name], **value}
        else:
            block[name] = value
    return block


def fresh(block: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A run at revision 0 under ``block`` (default :func:`plan`)."""
    block = block or plan()
    return new_envelope(block["task_id"], block, "0" * 64, format_time(T0))


def apply(state: Dict[str, Any], ops: List[List[Any]], now: float = T0) -> Dict[str, Any]:
    """A copy of ``state`` after ``ops``, as the store would commit them."""
    out = copy.deepcopy(state)
    apply_ops(out, ops)
    out["revision"] += 1
    out["updated_at"] = format_time(now)
    return out


def then(state: Dict[str, Any], rule: Callable[..., Any], *args: Any, now: float = T0, **kwargs: Any) -> Dict[str, Any]:
    """Apply ``rule(state, *args, now=now)``'s ops (a rule returning ``(id, ops)`` is accepted)."""
    result = rule(state, *args, now=now, **kwargs)
    ops = result[1] if isinstance(result, tuple) else result
    return apply(state, ops, now)


def held(state: Dict[str, Any], owner: str = "w1", now: float = T0, ttl: float = 300) -> Dict[str, Any]:
    return apply(state, lease.acquire_ops(state, owner, ttl, now), now)


def through(state: Dict[str, Any], *names: str, now: float = T0) -> Dict[str, Any]:
    """Start and finish each named step with its evidence."""
    for name in names:
        state = then(state, steps.start_ops, name, now=now)
        state = then(state, steps.done_ops, name, EVIDENCE.get(name, {}), now=now)
    return state


def at_publish(state: Optional[Dict[str, Any]] = None, now: float = T0) -> Dict[str, Any]:
    """draft and review done, publish (the gated step) running."""
    state = through(state or fresh(), "draft", "review", now=now)
    return then(state, steps.start_ops, "publish", now=now)


def granted(state: Dict[str, Any], action: str, digest: str = DIGEST, step: str = "publish", ttl: float = 600, now: float = T0) -> Dict[str, Any]:
    rid, ops = approvals.request_ops(state, step, action, digest, ttl, now)
    state = apply(state, ops, now)
    return apply(state, approvals.answer_ops(state, rid, "carol", True, now), now)


def begun(state: Dict[str, Any], key: str, digest: str = DIGEST, now: float = T0, **kwargs: Any) -> Dict[str, Any]:
    return apply(state, effects.begin_ops(state, key, digest, now, **kwargs), now)
