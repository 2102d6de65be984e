"""The head witness of a file store run: ``head.json``, what it names and when a load believes it.

A journal cut at a line boundary, emptied, deleted or replaced by an older
copy is a well-formed journal of an earlier revision: nothing inside it can
say that later records existed. ``head.json`` says so, at no extra fsync.
After each append's fsync, still under the lock and before the call returns,
the writer overwrites it in place with ``{revision, hash}`` of the record
just made durable, sealed with a SHA-256 over the run's task id and creation
time. It is fsynced only at init and at compaction, never per transition.

Why it cannot raise a false alarm: it is written after the fsync of the
record it names, so a process that dies can leave it behind the journal by
one record, never ahead; after a power loss its unsynced bytes may be an
older head, or a torn mix of two that fails the seal, and an older head is
still a lower bound. So a load accepts a head that is behind, and ignores
(reports, then rewrites) one that is missing, unsealed or sealed for another
run. A load stops, exit 7 and quarantine, when a valid head names a revision
the journal files no longer reach, or a record the journal holds with another
hash. A journal that init created and that is now missing is damage too,
except in the one window compaction leaves between moving the journal to
``journal.prev.jsonl`` and creating the next, when the previous journal ends
exactly at the snapshot.

Caught with the head in place: the newest records lost (journal deleted,
emptied, cut at any byte or at a line boundary, even inside the last record,
which a torn append never acknowledged), the journal (or journal and
snapshot) replaced by an older copy of the same run, a journal from another
history under the same revision. Not caught: damage that also removes or
rolls back the head (the head deleted or invalid is itself only reported,
since an older run has none and a power loss may tear it); records lost in
the window where the head honestly lags (at most the one record whose append
a killed writer never acknowledged; after a power loss, records younger than
the head's last write-back, which are fsynced, so only outside damage at the
same time loses them; the updates of a writer whose head file someone else
replaced while it kept the store open); and a whole
run folder restored from an older copy, which is a consistent past state that
no file inside the folder can tell from the truth: that needs a witness
outside the folder. What such a rollback can repeat is bounded elsewhere: an
effect begun before the rollback point is still in the ledger as begun and
is reconciled before any retry, so only effects begun after it are forgotten;
and the rolled-back lease restarts from an older fencing epoch, which a target
that checks epochs refuses until the epochs climb past the highest it saw.

The witness is public to the proof code: the power-loss explorer
(:mod:`runner.proof.crashcheck`) reads heads with :func:`decode_head` and
writes a deliberately early one with :func:`encode_head`.
"""

import re
from typing import Any, Dict, Optional, Sequence, Tuple

from ..base.canonical import sha256_hex
from .file_layout import HEAD, HEAD_SIZE

__all__ = ["encode_head", "decode_head", "seal_key", "head_problem"]

_HEAD_RECORD = re.compile(rb'\{("head":"([0-9a-f]{64})","rev":(0|[1-9][0-9]{0,18})),"seal":"([0-9a-f]{64})"\} *\n')


def _head_seal(task_id: str, created_at: str, body: bytes) -> str:
    return sha256_hex(seal_key(task_id, created_at) + body)


def seal_key(task_id: str, created_at: str) -> bytes:
    """What a head's seal is computed over besides the head itself: the run's task id and creation time."""
    return task_id.encode() + b"\n" + created_at.encode() + b"\n"


def encode_head(state: Dict[str, Any], key: Optional[bytes] = None) -> bytes:
    """``head.json`` naming ``state``'s revision and hash, sealed for its run, exactly :data:`HEAD_SIZE` bytes.

    ``key`` is :func:`seal_key` of the run, when the caller has it at hand.
    """
    body = b'"head":"%s","rev":%d' % (state["head"].encode(), state["revision"])
    seal = sha256_hex((key or seal_key(state["task_id"], state["created_at"])) + body)
    return (b'{%s,"seal":"%s"}' % (body, seal.encode())).ljust(HEAD_SIZE - 1) + b"\n"


def decode_head(data: bytes, identity: Dict[str, Any]) -> Tuple[int, str]:
    """``(revision, hash)`` a head names. Raises ``ValueError`` if it is torn, damaged or sealed for another run."""
    match = _HEAD_RECORD.fullmatch(data)
    if match is None or len(data) != HEAD_SIZE:
        raise ValueError("not a head record")
    if _head_seal(identity["task_id"], identity["created_at"], match.group(1)) != match.group(4).decode():
        raise ValueError("its seal does not match this run")
    return int(match.group(3)), match.group(2).decode()


def head_problem(
    head: Optional[Tuple[int, str]], state: Dict[str, Any], base: Tuple[int, str],
    records: Sequence[Tuple[str, Dict[str, Any]]]
) -> Optional[str]:
    """Why the loaded ``state`` is behind or beside what the head says was acknowledged; None when it is not.

    ``base`` is ``(revision, hash)`` of the state the load started from, so
    its hash is known too; ``records`` are the journal records read.
    """
    if head is None:
        return None
    rev, digest = head
    if rev > state["revision"]:
        return (f"revision {rev} was acknowledged ({HEAD}) but the journal files end at revision {state['revision']}: "
                "acknowledged records are lost")
    held = {body["rev"]: d for d, body in records}
    held.setdefault(state["revision"], state["head"])
    held.setdefault(base[0], base[1])
    if rev in held and held[rev] != digest:
        return (f"revision {rev} in the journal is not the one acknowledged ({HEAD} names hash {digest[:12]}, the "
                f"journal {held[rev][:12]})")
    return None
