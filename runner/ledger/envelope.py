"""The versioned envelope of one run.

The envelope is a plain ``dict``; :data:`ENVELOPE_KEYS` lists its fields and
``references/state-envelope.md`` documents each one. It is written in
canonical JSON (:mod:`runner.base.canonical`). A transition never edits
it in place: it is a list of operations (``["set", path, value]`` or
``["del", path]``) that :func:`apply_ops` applies, so the same record can be
replayed from the journal on any machine and give the same state.
"""

import copy
from typing import Any, Dict, List, Optional, Sequence

from ..base.canonical import content_digest
from ..base.values import validate_id

__all__ = [
    "SCHEMA_VERSION",
    "ENVELOPE_KEYS",
    "new_envelope",
    "validate_envelope",
    "check_shape",
    "apply_ops",
    "undo_ops",
]

#: Version of the envelope layout. A file of any other version is refused with
#: a clear error (there is no older layout to migrate from yet).
SCHEMA_VERSION = 1

#: One operation of a transition: ``["set", path, value]`` or ``["del", path]``.
Op = List[Any]
#: The operations of one transition, applied in order by :func:`apply_ops`.
Ops = List[Op]


#: Every field of the envelope, in the order the documentation lists them.
ENVELOPE_KEYS = (
    "schema_version",
    "task_id",
    "plan_digest",
    "plan",
    "revision",
    "head",
    "created_at",
    "updated_at",
    "status",
    "current_step",
    "steps",
    "completed_steps",
    "next_action",
    "observations",
    "effects",
    "jobs",
    "budgets",
    "counters",
    "lease",
)

STATUSES = ("active", "complete", "cancelled", "blocked", "failed")

_FIELD_TYPES = {
    "schema_version": int,
    "task_id": str,
    "plan_digest": str,
    "plan": dict,
    "revision": int,
    "head": str,
    "created_at": str,
    "updated_at": str,
    "status": str,
    "steps": dict,
    "completed_steps": list,
    "observations": dict,
    "effects": dict,
    "jobs": dict,
    "budgets": dict,
    "counters": dict,
    "lease": dict,
}


def new_envelope(task_id: str, plan: Dict[str, Any], head: str, now: str) -> Dict[str, Any]:
    """The envelope of a run at revision 0, before any transition."""
    limits = plan.get("limits", {}) if isinstance(plan, dict) else {}
    return {
        "schema_version": SCHEMA_VERSION,
        "task_id": task_id,
        "plan_digest": content_digest(plan),
        "plan": plan,
        "revision": 0,
        "head": head,
        "created_at": now,
        "updated_at": now,
        "status": "active",
        "current_step": None,
        "steps": {},
        "completed_steps": [],
        "next_action": None,
        "observations": {"authorization": {}, "cancellation": None, "approvals": {}, "store": {}},
        "effects": {},
        "jobs": {},
        "budgets": dict(limits),
        "counters": {"step_attempts": 0, "effect_attempts": 0, "cost": {}, "recoveries": 0},
        "lease": {"owner": None, "epoch": 0, "expires_at": None, "acquired_at": None},
    }


def check_shape(state: Dict[str, Any]) -> None:
    """The cheap part of :func:`validate_envelope`, run after every transition:
    every field present with its type, a known status. Raises ``ValueError``."""
    for key, kind in _FIELD_TYPES.items():
        value = state.get(key, _MISSING)
        if value is _MISSING:
            raise ValueError(f"the envelope would lack {key}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"envelope field {key} would not be a {kind.__name__}")
    if state["status"] not in STATUSES:
        raise ValueError(f"envelope status {state['status']!r} is not one of {', '.join(STATUSES)}")
    for key in ("current_step", "next_action"):
        if key not in state:
            raise ValueError(f"the envelope would lack {key}")


def validate_envelope(state: Any) -> Dict[str, Any]:
    """Check the envelope's shape; raise ``ValueError`` naming the first bad field."""
    if not isinstance(state, dict):
        raise ValueError("envelope is not an object")
    version = state.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaMismatch(version)
    missing = [key for key in ENVELOPE_KEYS if key not in state]
    if missing:
        raise ValueError(f"envelope lacks {', '.join(missing)}")
    check_shape(state)
    if state["revision"] < 0:
        raise ValueError("envelope revision is negative")
    if state["plan_digest"] != content_digest(state["plan"]):
        raise ValueError("envelope plan_digest does not match its plan")
    validate_id(state["task_id"], "task id")
    return state


class SchemaMismatch(ValueError):
    """The envelope was written under another schema version."""

    def __init__(self, version: Any) -> None:
        super().__init__(
            f"state is schema version {version!r}; this runner reads version {SCHEMA_VERSION} only"
            " (use the runner that wrote it, or migrate it explicitly)"
        )
        self.version = version


_MISSING = object()


def apply_leniently(shadow: Dict[str, Any], ops: Sequence[Any], only: Optional[Sequence[str]] = None) -> None:
    """Apply ``ops`` to a replay's shadow, making a missing parent rather than refusing (a compacted history lacks it).

    The shadow gets copies of the values, so a later op never changes a record it came from: replaying the same
    records twice gives the same shadow.

    :param only: when given, the top-level keys whose operations are applied; others are passed over.
    """
    for op in ops:
        if not isinstance(op, list) or len(op) < 2 or not isinstance(op[1], list) or not op[1]:
            continue
        if only is not None and op[1][0] not in only:
            continue
        target = shadow
        for part in op[1][:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = target[part] = {}
            target = child
        if op[0] == "set" and len(op) == 3:
            target[op[1][-1]] = copy.deepcopy(op[2])
        elif op[0] == "del":
            target.pop(op[1][-1], None)


def apply_ops(state: Dict[str, Any], ops: Sequence[Op], undo: Optional[List[Any]] = None) -> None:
    """Apply ``["set", path, value]`` / ``["del", path]`` operations in place.

    A path is a list of object keys; every key but the last must name an
    existing object. Raises ``ValueError`` on a malformed operation. When
    ``undo`` is a list, each change appends what :func:`undo_ops` needs to
    take it back, so a caller can apply first and roll back on failure.
    """
    for op in ops:
        if not isinstance(op, list) or len(op) not in (2, 3) or op[0] not in ("set", "del"):
            raise ValueError(f"malformed operation {op!r:.80}")
        path = op[1]
        if not isinstance(path, list) or not path or not all(isinstance(part, str) for part in path):
            raise ValueError(f"malformed path {path!r:.80}")
        if (op[0] == "set") != (len(op) == 3):
            raise ValueError(f"{op[0]} takes {'a value' if op[0] == 'set' else 'no value'}")
        target = state
        for part in path[:-1]:
            child = target.get(part) if isinstance(target, dict) else None
            if not isinstance(child, dict):
                raise ValueError(f"path {path!r:.80} does not lead to an object")
            target = child
        key = path[-1]
        if undo is not None:
            undo.append((target, key, target.get(key, _MISSING)))
        if op[0] == "set":
            target[key] = op[2]
        else:
            target.pop(key, None)


def undo_ops(undo: List[Any]) -> None:
    """Take back the changes :func:`apply_ops` recorded, newest first."""
    for target, key, old in reversed(undo):
        if old is _MISSING:
            target.pop(key, None)
        else:
            target[key] = old
    undo.clear()
