"""The record codec every store shares: the run's identity, journal records, replay, transitions.

A run is its identity record (task id, plan, creation time, who made it
and, when ``init`` knew it, the folder its workspace resolves against:
written once) plus a hash chain of journal records, each ``{"h": sha256(body), "r": body}``
with ``body = {"at", "epoch", "ops", "prev", "rev"}`` in canonical JSON.
Revision 0 is derived from the identity alone (:func:`genesis`), and every
later revision is the previous one with one record's operations applied
(:func:`replay`). The file store writes these bytes to ``run.json`` and
``journal.jsonl``; the database stores write the same text into rows, so a
record means the same thing wherever it is kept.

Who made a run (``made_by``: the host name and the user id of the process
that ran ``init``) is part of the identity, so it is covered by the digest
every later record chains from. It stays out of the envelope, whose size
(and so when compaction runs) must not depend on a host's name; a reader
takes it from the identity (the harness hooks read ``run.json``). Runs made
before the field existed lack it and load as before; a reader decides what
an unrecorded maker means (the hooks treat it as someone else's).
"""

import json
import os
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..ledger.envelope import SCHEMA_VERSION, Ops, apply_ops, check_shape, new_envelope, undo_ops
from ..base.values import validate_id
from ..base.canonical import canonical_json, content_digest, loads_strict, loads_trusted, sha256_hex
from ..base.errors import InvalidInput
from ..base.host import local_maker

__all__ = [
    "IDENTITY_FORMAT",
    "HISTORY_KEPT",
    "Ops",
    "Prepared",
    "new_identity",
    "decode_identity",
    "genesis",
    "encode_record",
    "decode_record",
    "replay",
    "prepare_transition",
    "finish_transition",
]


IDENTITY_FORMAT = "runner-run/1"

#: The identity's ``history`` of a run that keeps every journal record (in its journal files, its
#: history folder or its journal rows) unless its envelope records that its retention dropped them.
#: A run made before records were kept has no such field: what was compacted away before is not damage.
HISTORY_KEPT = "kept"

_RECORD_HEAD = re.compile(rb'\{"h":"([0-9a-f]{64})","r":')
_RECORD_KEYS = {"at", "epoch", "ops", "prev", "rev"}


# -- identity -----------------------------------------------------------------------

def new_identity(task_id: str, plan: Dict[str, Any], created_at: str,
                 workspace_base: Optional[str] = None) -> Tuple[Dict[str, Any], bytes]:
    """The identity record of a new run and its bytes (canonical JSON and a newline), naming this process as its maker.

    :param workspace_base: the absolute folder a relative ``workspace`` of the
        plan resolves against (the contract file's folder); kept outside the
        plan, so the plan digest stays that of the contract as written.
    """
    identity: Dict[str, Any] = {
        "created_at": created_at,
        "format": IDENTITY_FORMAT,
        "history": HISTORY_KEPT,
        "made_by": local_maker(),
        "plan": plan,
        "plan_digest": content_digest(plan),
        "schema_version": SCHEMA_VERSION,
        "task_id": validate_id(task_id, "task id"),
    }
    if workspace_base is not None:
        if not isinstance(workspace_base, str) or not os.path.isabs(workspace_base):
            raise InvalidInput(f"the workspace base must be an absolute folder, not {workspace_base!r}")
        identity["workspace_base"] = workspace_base
    return identity, canonical_json(identity) + b"\n"


def decode_identity(data: bytes) -> Dict[str, Any]:
    """Parse and check identity bytes as :func:`new_identity` wrote them. Raises ``ValueError``."""
    identity = loads_strict(data)
    if not isinstance(identity, dict) or identity.get("format") != IDENTITY_FORMAT:
        raise ValueError("not a run identity file")
    if data != canonical_json(identity) + b"\n":
        raise ValueError("identity file is not in canonical form")
    validate_id(identity.get("task_id"), "task id")
    if not isinstance(identity.get("plan"), dict) or not isinstance(identity.get("created_at"), str):
        raise ValueError("identity file lacks its plan or creation time")
    if identity.get("plan_digest") != content_digest(identity["plan"]):
        raise ValueError("identity plan_digest does not match its plan")
    base = identity.get("workspace_base", "/")
    if not isinstance(base, str) or not os.path.isabs(base):
        raise ValueError("identity workspace_base is not an absolute folder")
    return identity


def genesis(identity: Dict[str, Any], head: str) -> Dict[str, Any]:
    """Revision 0 of a run: its envelope as the identity alone defines it; ``head`` is the identity's digest."""
    state = new_envelope(identity["task_id"], identity["plan"], head, identity["created_at"])
    if "workspace_base" in identity:
        state["workspace_base"] = identity["workspace_base"]
    return state


# -- journal records ------------------------------------------------------------------

def encode_record(body: Dict[str, Any]) -> Tuple[str, bytes, bytes]:
    """``(hash, canonical body, journal line)`` of one transition."""
    raw = canonical_json(body)
    digest = sha256_hex(raw)
    return digest, raw, b'{"h":"' + digest.encode() + b'","r":' + raw + b"}\n"


def decode_record(line: bytes) -> Tuple[str, Dict[str, Any]]:
    """Parse one journal line (without its newline). Raises ``ValueError``."""
    match = _RECORD_HEAD.match(line)
    if not match or not line.endswith(b"}"):
        raise ValueError("bad framing")
    raw = line[match.end() : -1]
    digest = match.group(1).decode()
    if sha256_hex(raw) != digest:
        raise ValueError("hash does not match content")
    body = loads_trusted(raw)
    if not isinstance(body, dict) or set(body) != _RECORD_KEYS:
        raise ValueError("record fields are wrong")
    if not isinstance(body["rev"], int) or not isinstance(body["ops"], list) or not isinstance(body["prev"], str):
        raise ValueError("record field types are wrong")
    return digest, body


def replay(base: Dict[str, Any], records: Sequence[Tuple[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """Apply ``records`` to ``base`` in place; each must continue the chain. Raises ``ValueError``."""
    state = base
    for digest, body in records:
        if body["rev"] != state["revision"] + 1 or body["prev"] != state["head"]:
            raise ValueError(f"journal record {body['rev']} breaks the chain")
        apply_ops(state, body["ops"])
        state["revision"], state["head"], state["updated_at"] = body["rev"], digest, body["at"]
    return state


# -- transitions ----------------------------------------------------------------------

class Prepared(NamedTuple):
    """A transition applied in memory and encoded, not yet durable."""

    digest: str
    body: Dict[str, Any]
    line: bytes
    ops: Ops
    undo: List[Any]


def prepare_transition(state: Dict[str, Any], ops: Ops, epoch: int, at: str) -> Prepared:
    """Encode the record of ``ops`` and apply them to ``state`` in place.

    The ops applied are those decoded from the record, so memory holds exactly
    what a replay will. A refused transition (not canonical JSON, a bad path,
    or an envelope that would not load) raises :class:`InvalidInput` with
    ``state`` unchanged. The caller makes the record durable, then calls
    :func:`finish_transition`, or takes it back with ``undo_ops(prepared.undo)``.
    """
    body = {"at": at, "epoch": int(epoch), "ops": ops, "prev": state["head"], "rev": state["revision"] + 1}
    try:
        digest, raw, line = encode_record(body)
        ops = json.loads(raw)["ops"]
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"transition is not canonical JSON: {exc}") from None
    undo: List[Any] = []
    try:
        apply_ops(state, ops, undo)
        check_shape(state)  # a transition may never leave an envelope that would not load
    except ValueError as exc:
        undo_ops(undo)
        raise InvalidInput(f"transition refused: {exc}") from None
    return Prepared(digest, body, line, ops, undo)


def finish_transition(state: Dict[str, Any], prepared: Prepared) -> None:
    """Advance revision, head and time once the record is durable."""
    state["revision"], state["head"], state["updated_at"] = prepared.body["rev"], prepared.digest, prepared.body["at"]
