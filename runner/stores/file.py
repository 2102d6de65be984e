"""The durable run store: an identity file, a snapshot, a journal, a backup and a head witness.

Layout of a run folder (mode 0700; every file 0600)::

    run.json             identity: task id, plan, creation time. Written once;
                         the state at revision 0 is derived from it.
    snapshot.json        the envelope at some revision S, with its digest
    journal.jsonl        one line per transition after the snapshot
    journal.prev.jsonl   the transitions that led up to the snapshot
    backup.json          the snapshot before the current one
    head.json            the witness: the last acknowledged revision and its hash
    quarantine/          damaged files, moved aside, never deleted

The run folder itself is the ``flock(2)`` target: there is no lock file that
someone could remove as "stale" while a writer holds it. (A ``lock`` file
left by an older version is ignored.)

Invariants the store keeps:

* A transition is one fsync'd append of one journal line; it is acknowledged
  (the call returns) only after that fsync. Each line carries the revision,
  the writer's fencing epoch and the hash of the line before it, so the
  journal is a hash chain rooted in ``run.json``.
* The snapshot is a cache of the journal: the journal files always hold the
  record at the snapshot's revision. A snapshot ahead of its journal is damage.
* Compaction writes the new snapshot beside the old, fsyncs it, then rotates
  journal -> prev and snapshot -> backup with a directory fsync after each
  step, so every crash leaves a base (snapshot, backup or ``run.json``) from
  which the journal rebuilds the last acknowledged revision.
* Loading never guesses. A torn final journal line (an append that was never
  acknowledged) is dropped and the drop is recorded. Any other damage is
  rebuilt exactly from another base or the run stops with
  :class:`~runner.errors.StateUnrecoverable` after its files are moved into
  ``quarantine/``. A new run is never created over existing or damaged state.

The head witness
----------------

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

Every mutation runs under an exclusive ``flock`` on the run folder, after the
store has caught up with what other processes appended, so a check made
inside a transaction (such as the fencing check) sees the state it writes
against. Loads and ``doctor`` (:func:`check`) read under the same lock.
"""

import contextlib
import hashlib
import os
import re
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..envelope import SchemaMismatch, canonical_json, loads_trusted, sha256_hex, undo_ops, validate_envelope, validate_id
from ..errors import InvalidInput, StateUnrecoverable
from ..fs import FileSystem, OsFileSystem, replace_durably
from .base import CommitThenRaise, Finding, Store
from .codec import Ops, decode_identity, decode_record, finish_transition, genesis, new_identity, prepare_transition, replay
from ..windows import NO_HOOKS, Hooks

__all__ = ["RunStore", "Scan", "Finding", "scan", "check", "CommitThenRaise", "DURABILITY_MODES", "STATE_FILES", "HEAD", "encode_head", "decode_head"]

IDENTITY = "run.json"
SNAPSHOT = "snapshot.json"
BACKUP = "backup.json"
JOURNAL = "journal.jsonl"
PREV_JOURNAL = "journal.prev.jsonl"
HEAD = "head.json"
LOCK = "lock"  # the lock file of older versions: allowed in a folder, never used
HOOKS = "hooks.json"  # the counters of the harness's hooks: neither state nor damage
QUARANTINE = "quarantine"
DISPLACED = "quarantine.displaced"  # whatever held the name quarantine/ without being a folder
TMP_SUFFIX = ".tmp"

#: Files that hold run state.
STATE_FILES = (IDENTITY, SNAPSHOT, BACKUP, PREV_JOURNAL, JOURNAL)

#: Files a quarantine moves: the state and its witness.
RUN_FILES = STATE_FILES + (HEAD,)

#: The fixed size of ``head.json``, so each overwrite replaces the whole record in place.
HEAD_SIZE = 192

SNAPSHOT_FORMAT = "runner-snapshot/1"

#: ``sync`` fsyncs before a call returns and survives power loss (the
#: default). ``process`` skips every fsync: it survives the death of the
#: process, since the kernel still holds what was written, but not of the machine.
DURABILITY_MODES = ("sync", "process")

_SNAPSHOT_HEAD = re.compile(rb'\{"digest":"([0-9a-f]{64})","format":"runner-snapshot/1","state":')
_HEAD_RECORD = re.compile(rb'\{("head":"([0-9a-f]{64})","rev":(0|[1-9][0-9]{0,18})),"seal":"([0-9a-f]{64})"\} *\n')


class _Journal(NamedTuple):
    records: List[Tuple[str, Dict[str, Any]]]  # (hash, body) in file order
    good_end: int  # byte offset after the last complete, valid line
    size: int  # bytes in the file
    torn: bool  # trailing bytes after good_end form a torn (unacknowledged) line
    error: Optional[str]  # damage inside the file, if any
    identity: Optional[Tuple[int, int]]  # (inode, size) when read


class Scan(NamedTuple):
    """What a read-only look at a run folder found. ``state`` is None unless loadable."""

    path: str
    exists: bool  # a run (or the remains of one) is here
    state: Optional[Dict[str, Any]]
    base: Optional[str]  # the file the state was rebuilt from
    findings: List[Finding]
    journal: Optional[_Journal]
    snapshot_size: int
    journal_bytes_since_snapshot: int

    @property
    def damaged(self) -> bool:
        return any(f.level == "damage" for f in self.findings)

    @property
    def repairable(self) -> List[Finding]:
        return [f for f in self.findings if f.level == "repairable"]


def _encode_snapshot(state: Dict[str, Any]) -> bytes:
    body = canonical_json(state)
    return b'{"digest":"' + sha256_hex(body).encode() + b'","format":"' + SNAPSHOT_FORMAT.encode() + b'","state":' + body + b"}\n"


def _decode_snapshot(data: bytes) -> Dict[str, Any]:
    match = _SNAPSHOT_HEAD.match(data)
    if not match or not data.endswith(b"}\n"):
        raise ValueError("not a snapshot file (bad framing)")
    body = data[match.end() : -2]
    if sha256_hex(body) != match.group(1).decode():
        raise ValueError("snapshot digest does not match its content")
    try:
        state = loads_trusted(body)
    except ValueError as exc:
        raise ValueError(f"snapshot content is not valid JSON: {exc}") from None
    return validate_envelope(state)


def _head_seal(task_id: str, created_at: str, body: bytes) -> str:
    return hashlib.sha256(_seal_key(task_id, created_at) + body).hexdigest()


def _seal_key(task_id: str, created_at: str) -> bytes:
    return task_id.encode() + b"\n" + created_at.encode() + b"\n"


def encode_head(state: Dict[str, Any], key: Optional[bytes] = None) -> bytes:
    """``head.json`` naming ``state``'s revision and hash, sealed for its run, exactly :data:`HEAD_SIZE` bytes.

    ``key`` is :func:`_seal_key` of the run, when the caller has it at hand.
    """
    body = b'"head":"%s","rev":%d' % (state["head"].encode(), state["revision"])
    seal = hashlib.sha256((key or _seal_key(state["task_id"], state["created_at"])) + body).hexdigest()
    return (b'{%s,"seal":"%s"}' % (body, seal.encode())).ljust(HEAD_SIZE - 1) + b"\n"


def decode_head(data: bytes, identity: Dict[str, Any]) -> Tuple[int, str]:
    """``(revision, hash)`` a head names. Raises ``ValueError`` if it is torn, damaged or sealed for another run."""
    match = _HEAD_RECORD.fullmatch(data)
    if match is None or len(data) != HEAD_SIZE:
        raise ValueError("not a head record")
    if _head_seal(identity["task_id"], identity["created_at"], match.group(1)) != match.group(4).decode():
        raise ValueError("its seal does not match this run")
    return int(match.group(3)), match.group(2).decode()


def _witness(
    head: Optional[Tuple[int, str]], state: Dict[str, Any], base: Tuple[int, str], records: Sequence[Tuple[str, Dict[str, Any]]]
) -> Optional[str]:
    """Why the loaded ``state`` is behind or beside what the head says was acknowledged; None when it is not.

    ``base`` is ``(revision, hash)`` of the state the load started from, so
    its hash is known too; ``records`` are the journal records read.
    """
    if head is None:
        return None
    rev, digest = head
    if rev > state["revision"]:
        return f"revision {rev} was acknowledged ({HEAD}) but the journal files end at revision {state['revision']}: acknowledged records are lost"
    held = {body["rev"]: d for d, body in records}
    held.setdefault(state["revision"], state["head"])
    held.setdefault(base[0], base[1])
    if rev in held and held[rev] != digest:
        return f"revision {rev} in the journal is not the one acknowledged ({HEAD} names hash {digest[:12]}, the journal {held[rev][:12]})"
    return None


def _parse_journal(data: bytes, identity: Optional[Tuple[int, int]], allow_torn: bool) -> _Journal:
    records: List[Tuple[str, Dict[str, Any]]] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            records.append(decode_record(data[pos:nl]))
        except ValueError as exc:
            return _Journal(records, pos, len(data), False, f"line {len(records) + 1} (byte {pos}): {exc}", identity)
        pos = nl + 1
    tail = data[pos:]
    if not tail:
        return _Journal(records, pos, len(data), False, None, identity)
    # A tail without a newline is an append that never completed, unless it is
    # a whole record followed by one wrong byte where the newline should be.
    try:
        decode_record(tail[:-1])
        complete_but_damaged = True
    except ValueError:
        complete_but_damaged = False
    if complete_but_damaged or not allow_torn:
        return _Journal(records, pos, len(data), False, f"damaged final line (byte {pos})", identity)
    return _Journal(records, pos, len(data), True, None, identity)


def _chain_from(
    base: Dict[str, Any], records: Sequence[Tuple[str, Dict[str, Any]]], prev_lost: bool
) -> Tuple[Optional[int], Optional[str]]:
    """Index of the first record after ``base``, or an error if the journal does not continue it.

    A base ahead of the journal is an error: the journal always holds the
    record at the snapshot's revision, so such a base means records are gone.
    The one exception is a damaged previous journal, which held exactly those.
    """
    rev, head = base["revision"], base["head"]
    for index, (digest, body) in enumerate(records):
        if body["rev"] == rev:
            if digest != head:
                return None, f"journal record {rev} disagrees with the base's head"
            return index + 1, None
        if body["rev"] == rev + 1:
            if body["prev"] != head:
                return None, f"journal record {rev + 1} does not continue revision {rev}"
            return index, None
    if not records:
        if rev == 0 or prev_lost:
            return 0, None
        return None, f"base is at revision {rev} but the journal holds no records"
    if records[-1][1]["rev"] < rev:
        return None, f"base is at revision {rev}, ahead of the journal (last record {records[-1][1]['rev']})"
    return None, f"the journal starts at revision {records[0][1]['rev']}, after the base's revision {rev}"


def _read_identity(fs: FileSystem, path: str) -> Tuple[Dict[str, Any], str]:
    data = fs.read(path)
    return decode_identity(data), sha256_hex(data)


def scan(path: str, fs: Optional[FileSystem] = None, thorough: bool = False) -> Scan:
    """Read a run folder without changing anything and say what can be loaded.

    The state returned, when there is one, is the latest revision the files
    prove: rebuilt from the first valid base (snapshot, then backup, then the
    identity) that the journal continues to its last complete record.
    ``thorough`` also validates what the load did not need: the backup and
    every line of the previous journal.

    A load from a valid snapshot needs only the last line of the previous
    journal (the record at the snapshot's revision), so that is all it reads
    there; any other base needs the whole previous journal, and gets it.

    It takes no lock: a writer compacting meanwhile can make a healthy run
    look damaged. :func:`check` and :meth:`RunStore.open` scan under the lock.
    """
    fs = fs or OsFileSystem()
    if not thorough:
        quick = _scan(path, fs, thorough=False, whole_prev=False)
        if quick.base == SNAPSHOT or not quick.exists:
            return quick
    return _scan(path, fs, thorough=thorough, whole_prev=True)


def _last_line(data: bytes) -> bytes:
    """The final complete line of ``data`` (with its newline), or all of it when there is no such line."""
    end = data.rfind(b"\n", 0, len(data) - 1) if data.endswith(b"\n") else -1
    return data[end + 1 :] if data.endswith(b"\n") else data


def _scan(path: str, fs: FileSystem, thorough: bool, whole_prev: bool) -> Scan:
    findings: List[Finding] = []

    def join(name: str) -> str:
        return os.path.join(path, name)

    if not fs.exists(path):
        return Scan(path, False, None, None, [Finding("note", "absent", f"no run folder at {path}")], None, 0, 0)
    names = set(fs.listdir(path))
    present = [n for n in STATE_FILES if n in names]
    for name in present + [n for n in (HEAD,) if n in names]:
        if fs.is_symlink(join(name)):
            findings.append(Finding("damage", "symlink", f"{name} is a symbolic link; refusing to follow it"))
    for name in sorted(names):
        if name.endswith(TMP_SUFFIX):
            findings.append(Finding("repairable", "stray-temp", f"leftover temporary file {name}"))
    if any(f.code == "symlink" for f in findings):
        return Scan(path, True, None, None, findings, None, 0, 0)

    if IDENTITY not in names:
        if not present:
            if QUARANTINE in names:
                findings.append(Finding("damage", "quarantined", f"the run's state was quarantined in {join(QUARANTINE)}"))
                return Scan(path, True, None, None, findings, None, 0, 0)
            findings.append(Finding("note", "empty", f"no run in {path}"))
            return Scan(path, False, None, None, findings, None, 0, 0)
        if _is_unfinished_init(fs, path, names):
            findings.append(Finding("note", "unfinished-init", "an init that never completed left files; a new init may replace them"))
            return Scan(path, False, None, None, findings, None, 0, 0)
        findings.append(Finding("damage", "identity-missing", "run.json is missing but run state is present"))
        return Scan(path, True, None, None, findings, None, 0, 0)

    try:
        identity, genesis_head = _read_identity(fs, join(IDENTITY))
    except (OSError, ValueError, InvalidInput) as exc:
        findings.append(Finding("damage", "identity", f"run.json is unreadable: {exc}"))
        return Scan(path, True, None, None, findings, None, 0, 0)

    # The head is read before the journal: a writer updates it only after
    # the journal, so a reader without the lock still never sees it ahead.
    head: Optional[Tuple[int, str]] = None
    if HEAD not in names:
        findings.append(Finding("repairable", "head-missing", f"{HEAD} is missing, so no witness says how far the run got"))
    else:
        try:
            head = decode_head(fs.read(join(HEAD)), identity)
        except (OSError, ValueError) as exc:
            findings.append(Finding("repairable", "head-invalid", f"{HEAD} is ignored: {exc}"))

    journals: Dict[str, _Journal] = {}
    for name in (PREV_JOURNAL, JOURNAL):
        if name in names:
            ident = fs.stat(join(name))
            data = fs.read(join(name))
            if name == PREV_JOURNAL and not whole_prev:
                data = _last_line(data)
            journals[name] = _parse_journal(data, ident, allow_torn=(name == JOURNAL))
    current = journals.get(JOURNAL)
    prev = journals.get(PREV_JOURNAL)
    if current is not None and current.torn:
        findings.append(
            Finding(
                "repairable",
                "torn-record",
                f"dropped a torn final journal record: {current.size - current.good_end} bytes at offset {current.good_end}",
            )
        )
    if prev is not None and prev.error is None:
        # The previous journal is a copy of what the snapshot holds: a gap or
        # a repeated line inside it makes it unusable, not the run.
        for (digest_a, a), (_, b) in zip(prev.records, prev.records[1:]):
            if b["rev"] != a["rev"] + 1 or b["prev"] != digest_a:
                prev = prev._replace(error=f"revision {b['rev']} does not continue revision {a['rev']}")
                break

    # The records a base may be continued by: prev then current, if they link.
    records: List[Tuple[str, Dict[str, Any]]] = []
    chain_error: Optional[str] = None
    prev_usable = prev is not None and prev.error is None
    if prev is not None and prev.error:
        findings.append(Finding("repairable", "prev-journal", f"{PREV_JOURNAL} is damaged at {prev.error}"))
    if current is not None and current.error:
        chain_error = f"{JOURNAL} is damaged at {current.error}"
    else:
        cur_records = current.records if current else []
        if prev_usable and prev.records:  # type: ignore[union-attr]
            if cur_records and cur_records[0][1]["prev"] != prev.records[-1][0]:  # type: ignore[union-attr]
                findings.append(Finding("repairable", "prev-journal", f"{PREV_JOURNAL} does not link to {JOURNAL}"))
                prev_usable = False
                records = list(cur_records)
            else:
                records = prev.records + list(cur_records)  # type: ignore[union-attr]
        else:
            records = list(cur_records)
        for (_, a), (_, b) in zip(records, records[1:]):
            if b["rev"] != a["rev"] + 1:
                chain_error = f"journal revisions jump from {a['rev']} to {b['rev']}"
                break
    if chain_error:
        findings.append(Finding("damage", "journal", chain_error))
        return Scan(path, True, None, None, findings, current, 0, 0)

    last_rev = records[-1][1]["rev"] if records else 0
    candidates: List[Tuple[str, Callable[[], Dict[str, Any]]]] = []
    snapshot_size = 0
    for name in (SNAPSHOT, BACKUP):
        if name in names:
            def load(name: str = name) -> Dict[str, Any]:
                return _decode_snapshot(fs.read(join(name)))
            candidates.append((name, load))
        elif name == SNAPSHOT:
            findings.append(Finding("repairable", "snapshot-missing", "snapshot.json is missing"))
    candidates.append((IDENTITY, lambda: genesis(identity, genesis_head)))

    highest_valid = -1  # a rebuild must never land below a valid base
    for name, load in candidates:
        try:
            base = load()
        except SchemaMismatch as exc:
            findings.append(Finding("damage", "schema", f"{name}: {exc}"))
            return Scan(path, True, None, None, findings, current, 0, 0)
        except (OSError, ValueError, InvalidInput) as exc:
            findings.append(Finding("repairable", f"{name}-invalid", f"{name} is invalid: {exc}"))
            continue
        if base["task_id"] != identity["task_id"] or base["created_at"] != identity["created_at"]:
            findings.append(Finding("repairable", f"{name}-foreign", f"{name} belongs to another run (task {base['task_id']!r})"))
            continue
        highest_valid = max(highest_valid, base["revision"])
        base_point = (base["revision"], base["head"])
        # Only the snapshot may stand without the record at its revision, and
        # only when the previous journal that held it is the damaged file.
        start, error = _chain_from(base, records, name == SNAPSHOT and prev is not None and not prev_usable)
        if error is not None:
            findings.append(Finding("repairable", f"{name}-inconsistent", f"{name}: {error}"))
            continue
        try:
            state = replay(base, records[start:])  # type: ignore[index]
        except ValueError as exc:
            findings.append(Finding("damage", "replay", f"replaying the journal from {name} failed: {exc}"))
            return Scan(path, True, None, None, findings, current, 0, 0)
        if state["revision"] != max(last_rev, base["revision"]) or state["revision"] < highest_valid:
            findings.append(Finding("repairable", f"{name}-behind", f"{name} rebuilds revision {state['revision']}, behind a valid base at {highest_valid}"))
            continue
        if identity.get("schema_version") != state["schema_version"]:
            # A state of another version was refused above, so this is run.json damaged.
            findings = [Finding("damage", f.code, f.message) if f.level == "repairable" else f for f in findings]
            said = f"{IDENTITY} says schema version {identity.get('schema_version')!r}, the run's state is version {state['schema_version']}"
            findings.append(Finding("damage", "identity", said))
            return Scan(path, True, None, None, findings, current, 0, 0)
        lost = _witness(head, state, base_point, records)
        ends_at_snapshot = prev_usable and prev.records and state["revision"] == prev.records[-1][1]["rev"]  # type: ignore[union-attr]
        if lost is None and current is None and not ends_at_snapshot:
            # Compaction leaves no journal only between rotating it and
            # creating the next, when the previous journal ends at the snapshot.
            lost = f"{JOURNAL} is missing, and only a compaction that ended with {PREV_JOURNAL} at the snapshot may leave it so"
        if lost is not None:
            findings = [Finding("damage", f.code, f.message) if f.level == "repairable" else f for f in findings]
            findings.append(Finding("damage", "journal-lost", lost))
            return Scan(path, True, None, None, findings, current, 0, 0)
        if name == SNAPSHOT:
            snapshot_size = fs.stat(join(SNAPSHOT))[1]  # type: ignore[index]
            if thorough and BACKUP in names:
                problem = _backup_problem(fs, join(BACKUP), identity, state, prev.records if prev_usable else [])  # type: ignore[union-attr]
                if problem:
                    findings.append(Finding("repairable", f"{BACKUP}-invalid", f"{BACKUP} is invalid: {problem}"))
        else:
            findings.append(Finding("repairable", "rebuilt", f"rebuilt revision {state['revision']} from {name} and the journal"))
        since = current.good_end if current is not None else 0
        return Scan(path, True, state, name, findings, current, snapshot_size, since)

    # No base reaches the end of the journal: every problem found is damage now.
    findings = [Finding("damage", f.code, f.message) if f.level == "repairable" else f for f in findings]
    findings.append(Finding("damage", "no-base", f"no valid base rebuilds revision {last_rev}"))
    return Scan(path, True, None, None, findings, current, 0, 0)


def _backup_problem(
    fs: FileSystem, path: str, identity: Dict[str, Any], state: Dict[str, Any], prev_records: Sequence[Tuple[str, Dict[str, Any]]]
) -> Optional[str]:
    """Why ``backup.json`` is not the snapshot before the current one of this run's history; None when it is.

    It must be of this run (task id and creation time), no newer than the
    state, and, where the previous journal holds the record after it, be the
    revision that record continues.
    """
    try:
        backup = _decode_snapshot(fs.read(path))
    except (OSError, ValueError, InvalidInput) as exc:
        return str(exc)
    if backup["task_id"] != identity["task_id"] or backup["created_at"] != identity["created_at"]:
        return "it belongs to another run"
    if backup["revision"] > state["revision"]:
        return f"it is at revision {backup['revision']}, ahead of the run"
    for digest, body in prev_records:
        if body["rev"] == backup["revision"] + 1 and body["prev"] != backup["head"]:
            return f"the previous journal's revision {body['rev']} does not continue it"
        if body["rev"] == backup["revision"] and digest != backup["head"]:
            return f"its revision {body['rev']} differs from the previous journal's"
    return None


def _is_unfinished_init(fs: FileSystem, path: str, names: set) -> bool:
    """True when the only state is what an interrupted ``init`` writes before run.json."""
    if BACKUP in names or PREV_JOURNAL in names:
        return False
    if JOURNAL in names and fs.stat(os.path.join(path, JOURNAL))[1] != 0:  # type: ignore[index]
        return False
    if SNAPSHOT in names:
        try:
            return _decode_snapshot(fs.read(os.path.join(path, SNAPSHOT)))["revision"] == 0
        except (OSError, ValueError):
            return False
    return True



class RunStore(Store):
    """One run's durable state. Create with :meth:`create`, load with :meth:`open`.

    ``state`` is the envelope at the store's current revision; treat it as
    read-only. Change it only through :meth:`transact` or :meth:`commit`.

    ``clock`` (seconds since the epoch) and ``fs`` are injectable.
    ``compact_min_bytes`` is the journal size below which no compaction
    happens; above it, the journal is compacted once it reaches a quarter of
    the snapshot's size, which keeps both loading and compaction cost
    proportional to the state, not to its history.
    ``hooks`` receives the store's commit windows (see :mod:`runner.windows`).
    """

    def __init__(
        self,
        path: str,
        *,
        fs: Optional[FileSystem] = None,
        clock: Optional[Callable[[], float]] = None,
        durability: str = "sync",
        compact_min_bytes: int = 256 * 1024,
        hooks: Optional[Hooks] = None,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise InvalidInput(f"durability must be one of {', '.join(DURABILITY_MODES)}")
        self.path = os.path.abspath(path) if fs is None else path
        self.fs = fs or OsFileSystem()
        self.clock = clock or time.time
        self.durability = durability
        self.compact_min_bytes = compact_min_bytes
        self.hooks = hooks if hooks is not None else NO_HOOKS
        self._paths: Dict[str, str] = {}
        self._state: Optional[Dict[str, Any]] = None
        self._journal_id: Optional[Tuple[int, int]] = None
        self._journal_bytes = 0
        self._snapshot_size = 0
        self._pending: List[Finding] = []  # repairs the next writer performs
        self._torn_at: Optional[int] = None
        self._seal: Optional[bytes] = None  # the head's seal key: the run's task id and creation time
        #: Findings of the last full load (notes and lossless repairs).
        self.findings: List[Finding] = []

    # -- paths --------------------------------------------------------------
    def _p(self, name: str) -> str:
        path = self._paths.get(name)
        if path is None:
            path = self._paths[name] = os.path.join(self.path, name)
        return path

    # -- durable primitives ---------------------------------------------------
    def _fsync(self, name: str) -> None:
        if self.durability == "sync":
            self.fs.fsync(self._p(name))

    def _fsync_dir(self, path: Optional[str] = None) -> None:
        if self.durability == "sync":
            self.fs.fsync_dir(path or self.path)

    def _write_replace(self, name: str, data: bytes) -> None:
        """Temp file beside the target, write, fsync, rename over, fsync the folder."""
        replace_durably(self.fs, self._p(name), data, self.durability == "sync", hooks=self.hooks)

    # -- creation -------------------------------------------------------------
    @classmethod
    def create(cls, path: str, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None, **options: Any) -> "RunStore":
        """Start a new run in ``path``; refuse if the folder holds any run state.

        The refusal is decided once, under the folder's lock, before anything
        is written, so of two concurrent inits exactly one starts the run and
        the other is refused. ``run.json`` is written last: until it is
        durable the run does not exist, and a repeated ``create`` may replace
        what an interrupted one left.

        :raises InvalidInput: the folder is a symbolic link or holds a run, its remains, or other files.
        """
        validate_id(task_id, "task id")
        if not isinstance(plan, dict):
            raise InvalidInput("the plan must be a JSON object")
        store = cls(path, **options)
        fs = store.fs
        if fs.is_symlink(store.path):
            raise InvalidInput(f"{store.path} is a symbolic link; refusing to use it as a run folder", path=store.path)
        if not fs.exists(store.path):
            try:
                fs.mkdir(store.path)
            except FileExistsError:
                pass  # a concurrent init made it; the check under the lock decides
            else:
                store.hooks.reached("store:after-mkdir", path=store.path)
                store._fsync_dir(os.path.dirname(store.path) or ".")
                store.hooks.reached("store:after-mkdir-fsync", path=store.path)
        with fs.lock(store.path):
            found = scan(store.path, fs)
            leftovers = [n for n in fs.listdir(store.path) if n not in (LOCK, HOOKS) + RUN_FILES and not n.endswith(TMP_SUFFIX)]
            if found.exists or leftovers:
                detail = "; ".join(f.message for f in found.findings if f.level != "note") or (
                    "it already holds a run" if found.exists else f"it holds other files ({', '.join(leftovers[:5])})")
                raise InvalidInput(f"refusing to start a new run in {store.path}: {detail}", path=store.path)
            fs.make_private(store.path)  # an existing empty folder is narrowed too
            now = store.now()
            identity, identity_bytes = new_identity(task_id, plan, now, workspace_base)
            state = genesis(identity, sha256_hex(identity_bytes))
            snapshot = _encode_snapshot(state)
            # Unfinished-init leftovers are overwritten, never appended to.
            for name in (JOURNAL, HEAD):
                if fs.exists(store._p(name)):
                    fs.unlink(store._p(name))
            store._write_replace(SNAPSHOT, snapshot)
            fs.create_exclusive(store._p(JOURNAL))
            store.hooks.reached("store:after-journal-create", path=store._p(JOURNAL))
            fs.create_exclusive(store._p(HEAD), encode_head(state))
            store._fsync(HEAD)  # its blocks exist from now on, so later overwrites need no new space
            store._fsync_dir()
            store.hooks.reached("store:after-journal-create-fsync", path=store._p(JOURNAL))
            store._write_replace(IDENTITY, identity_bytes)  # the commit point of init
            store._state = state
            store._snapshot_size = len(snapshot)
            store._journal_bytes = 0
            store._journal_id = fs.stat(store._p(JOURNAL))
        return store

    # -- loading --------------------------------------------------------------
    @classmethod
    def open(cls, path: str, **options: Any) -> "RunStore":
        """Load the run in ``path`` under its lock; quarantine and raise if it cannot be rebuilt exactly.

        Reading needs no write access: a run on a read-only file system loads.

        :raises InvalidInput: no run is there, or ``path`` is a symbolic link (which ``create`` refuses too).
        :raises StateUnrecoverable: the state is damaged; its files were moved into ``quarantine/``.
        """
        store = cls(path, **options)
        fs = store.fs
        if fs.is_symlink(store.path):
            raise InvalidInput(f"{store.path} is a symbolic link; refusing to use it as a run folder", path=store.path)
        if not fs.exists(store.path):
            raise InvalidInput(f"no run in {store.path} (start one with init)", path=store.path)
        with fs.lock(store.path):  # locking a folder writes nothing, even in a folder without a run
            store._load()
        return store

    def _load(self, thorough: bool = False) -> None:
        found = scan(self.path, self.fs, thorough=thorough)
        if not found.exists:
            raise InvalidInput(f"no run in {self.path} (start one with init)", path=self.path)
        if found.state is None:
            problems = "; ".join(f.message for f in found.findings if f.level == "damage")
            where = None
            if not any(f.code in ("quarantined", "schema", "symlink") for f in found.findings):
                try:
                    where = self._quarantine(problems)
                except OSError as exc:
                    problems += f"; moving the files to quarantine failed: {exc.strerror or exc}"
            if where:
                problems += f"; files moved to {where}"
            raise StateUnrecoverable(f"run state in {self.path} is unrecoverable: {problems}", path=self.path, quarantine=where)
        self._state = found.state
        self.findings = found.findings
        self._pending = found.repairable
        journal = found.journal
        self._journal_id = (journal.identity[0], journal.good_end) if journal and journal.identity else None
        self._torn_at = journal.good_end if journal is not None and journal.torn else None
        self._journal_bytes = found.journal_bytes_since_snapshot
        self._snapshot_size = found.snapshot_size

    def _catch_up(self) -> None:
        """Bring the in-memory state up to what is on disk (under the lock)."""
        ident = self.fs.stat(self._p(JOURNAL))
        if ident is not None and self._journal_id is not None and ident == self._journal_id and self._torn_at is None:
            return
        if ident is not None and self._journal_id is not None and ident[0] == self._journal_id[0] and ident[1] > self._journal_id[1] and self._torn_at is None:
            tail = self.fs.read_from(self._p(JOURNAL), self._journal_id[1])
            parsed = _parse_journal(tail, None, allow_torn=True)
            if parsed.error is None:
                try:
                    replay(self.state, parsed.records)
                except ValueError:
                    pass  # fall through to a full load, which decides
                else:
                    self._journal_bytes += parsed.good_end
                    self._journal_id = (ident[0], self._journal_id[1] + parsed.good_end)
                    if parsed.torn:
                        self._torn_at = self._journal_id[1]
                        self._pending.append(Finding("repairable", "torn-record", f"dropped a torn final journal record at offset {self._torn_at}"))
                    return
        self._load()

    def records_after(self, after: int) -> Tuple[List[Dict[str, Any]], int]:
        """Journal records with revision > ``after`` that the store still holds, and the oldest it holds.

        Compaction drops records older than the previous journal, so an
        observer that asks for more than is held learns it from the second
        value and re-reads the state instead.
        """
        with self.fs.lock(self.path):
            self._catch_up()
            records: List[Tuple[str, Dict[str, Any]]] = []
            for name in (PREV_JOURNAL, JOURNAL):
                if self.fs.exists(self._p(name)):
                    parsed = _parse_journal(self.fs.read(self._p(name)), None, allow_torn=(name == JOURNAL))
                    if not records or (parsed.records and parsed.records[0][1]["prev"] == records[-1][0]):
                        records += parsed.records
                    else:
                        records = list(parsed.records)
            oldest = records[0][1]["rev"] if records else self.revision + 1
            return [dict(body, hash=digest) for digest, body in records if body["rev"] > after and body["rev"] <= self.revision], oldest

    # -- transitions ------------------------------------------------------------
    def _in_transaction(self, work: Callable[[], Any]) -> Any:
        with self.fs.lock(self.path):
            return work()

    def _commit_locked(self, ops: Ops, epoch: int) -> None:
        if self._pending:
            ops = self._repair_ops() + list(ops)
        state = self.state
        # Applied before the append, so a bad operation is refused with
        # nothing written; taken back if the append fails.
        prepared = prepare_transition(state, ops, epoch, self.now())
        try:
            self._append_record(prepared.line)
        except BaseException:
            undo_ops(prepared.undo)
            self._journal_id = None  # unknown how much reached the file: reload next time
            self._state = None
            raise
        finish_transition(state, prepared)
        self._write_head()
        self._upkeep()

    def _upkeep(self) -> None:
        """After a durable commit: pending repairs, then a due compaction.

        The transition is committed whatever happens here, so a failure (a
        full disk refusing the new snapshot) is a finding, never the call's
        error: a caller told "failed" would retry a transition that happened.
        Every step of both keeps the files loadable, so the next load or
        commit starts from whatever this left.
        """
        try:
            if self._pending:
                self._finish_repairs()
            if self._journal_bytes >= max(self.compact_min_bytes, self._snapshot_size // 4):
                self._compact_locked()
        except OSError as exc:
            failed = f"compaction or repair after revision {self.revision} failed: {exc.strerror or exc}"
            self.findings.append(Finding("repairable", "upkeep-failed", failed))
            tmp = self._p(SNAPSHOT + TMP_SUFFIX)
            with contextlib.suppress(OSError):
                if self.fs.exists(tmp):
                    self.fs.unlink(tmp)
            self._journal_id = None  # the files are as the failure left them: reload them next time

    def _append_record(self, line: bytes) -> None:
        """Make one journal line durable: the single fsync of a transition.

        If the append or its fsync fails, the line is cut off again, so a
        transition reported as failed is not there for the next reader.
        """
        journal = self._p(JOURNAL)
        if self._torn_at is not None:
            self.fs.truncate(journal, self._torn_at)
            self.hooks.reached("store:after-truncate", path=journal)
            self._fsync(JOURNAL)
            self._torn_at = None
        if self._journal_id is None:
            self.fs.create_exclusive(journal)
            self.hooks.reached("store:after-journal-create", path=journal)
            self._fsync_dir()
            self.hooks.reached("store:after-journal-create-fsync", path=journal)
            self._journal_id = self.fs.stat(journal)
        assert self._journal_id is not None
        end = self._journal_id[1]
        self.hooks.reached("store:before-append", fs=self.fs, path=journal, data=line)
        try:
            self.fs.append(journal, line)
            self.hooks.reached("store:after-append", path=journal)
            self._fsync(JOURNAL)
            self.hooks.reached("store:after-append-fsync", path=journal)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.truncate(journal, end)
            raise
        self._journal_bytes += len(line)
        self._journal_id = (self._journal_id[0], end + len(line))

    def _write_head(self) -> None:
        """Point ``head.json`` at the revision just made durable: in place, no fsync (see the module docs).

        It is written only after the record's fsync, so it never leads the
        journal; failing to write it only leaves it behind, which is allowed.
        """
        state = self.state
        if self._seal is None:
            self._seal = _seal_key(state["task_id"], state["created_at"])
        data = encode_head(state, self._seal)
        try:
            self.fs.overwrite(self._p(HEAD), data)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                self.fs.create_exclusive(self._p(HEAD), data)
        except OSError:
            pass

    # -- repairs ----------------------------------------------------------------
    def _repair_ops(self) -> Ops:
        """Record lossless repairs as a store observation in the next transition."""
        key = f"r{self.state['revision'] + 1}"
        event = {"at": self.now(), "source": "store", "findings": [f"{f.code}: {f.message}" for f in self._pending]}
        return [["set", ["observations", "store", key], event]]

    def _finish_repairs(self) -> None:
        pending, self._pending = self._pending, []
        codes = {f.code for f in pending}
        damaged = [name for name in (SNAPSHOT, BACKUP, PREV_JOURNAL) if f"{name}-invalid" in codes or f"{name}-foreign" in codes or f"{name}-inconsistent" in codes]
        if "prev-journal" in codes:
            damaged.append(PREV_JOURNAL)
        damaged = [n for n in dict.fromkeys(damaged) if self.fs.exists(self._p(n))]
        if damaged:
            self._quarantine("lossless repair: " + "; ".join(f.message for f in pending), names=damaged)
        for name in self.fs.listdir(self.path):
            if name.endswith(TMP_SUFFIX):
                self.fs.unlink(self._p(name))
        if "head-missing" in codes or "head-invalid" in codes:
            # Whole and durable, in the same file where there is one, so that
            # other writers' descriptors for it stay good.
            head = self._p(HEAD)
            if self.fs.exists(head):
                self.fs.write_file(head, encode_head(self.state))
                self._fsync(HEAD)
            else:
                self.fs.create_exclusive(head, encode_head(self.state))
                self._fsync(HEAD)
                self._fsync_dir()
        if damaged or "rebuilt" in codes or "snapshot-missing" in codes:
            self._compact_locked()

    def repair(self, *, epoch: int = 0) -> List[Finding]:
        """Perform every lossless repair a thorough look finds; return what was done.

        The look is the one ``doctor`` reports (:func:`check`): it reads every
        line of the previous journal and the backup, which a load need not.
        """
        with self.fs.lock(self.path):
            self._load(thorough=True)
            done = list(self._pending)
            if done:
                self._commit_locked([], epoch)
            return done

    # -- compaction -------------------------------------------------------------
    def compact(self) -> None:
        """Write a fresh snapshot and rotate journal and backup (see module docs)."""
        with self.fs.lock(self.path):
            self._catch_up()
            self._compact_locked()

    def _compact_locked(self) -> None:
        # Each rename is made durable before the next, so a crash between any
        # two leaves a base that the remaining journal continues:
        #   after 1: backup=S, journal=S+1..R      after 2: snapshot=R
        #   after 3: prev=S+1..R                   after 4: an empty journal
        fs, reached = self.fs, self.hooks.reached
        data = _encode_snapshot(self.state)
        tmp = SNAPSHOT + TMP_SUFFIX
        reached("store:before-compaction", path=self._p(SNAPSHOT))
        fs.write_file(self._p(tmp), data)
        reached("store:after-temp-write", path=self._p(SNAPSHOT))
        self._fsync(tmp)
        reached("store:after-temp-fsync", path=self._p(SNAPSHOT))
        if fs.exists(self._p(SNAPSHOT)):
            fs.replace(self._p(SNAPSHOT), self._p(BACKUP))  # 1
            reached("store:after-backup-rename", path=self._p(BACKUP))
            self._fsync_dir()
            reached("store:after-backup-fsync", path=self._p(BACKUP))
        fs.replace(self._p(tmp), self._p(SNAPSHOT))  # 2
        reached("store:after-rename", path=self._p(SNAPSHOT))
        self._fsync_dir()
        reached("store:after-rename-fsync", path=self._p(SNAPSHOT))
        journal = fs.stat(self._p(JOURNAL))
        if journal is None or journal[1] > 0:
            # An empty journal is never rotated: the previous journal holds
            # the record at the snapshot's revision and must stay.
            if journal is not None:
                fs.replace(self._p(JOURNAL), self._p(PREV_JOURNAL))  # 3
                reached("store:after-journal-rename", path=self._p(PREV_JOURNAL))
                self._fsync_dir()
                reached("store:after-journal-rename-fsync", path=self._p(PREV_JOURNAL))
            fs.create_exclusive(self._p(JOURNAL))  # 4
            reached("store:after-journal-create", path=self._p(JOURNAL))
            self._fsync_dir()
            reached("store:after-journal-create-fsync", path=self._p(JOURNAL))
        if fs.exists(self._p(HEAD)):
            # Not needed for safety (the snapshot is a lower bound already):
            # it keeps what a power loss can make of the head to the
            # overwrites since the last compaction.
            self._fsync(HEAD)
        self._snapshot_size = len(data)
        self._journal_bytes = 0
        self._journal_id = fs.stat(self._p(JOURNAL))

    # -- quarantine ---------------------------------------------------------------
    def _quarantine(self, reason: str, names: Optional[Sequence[str]] = None) -> str:
        """Move run files (all of them unless ``names``) into a fresh folder under ``quarantine/``.

        Nothing is deleted. Something else under the name ``quarantine`` (a
        file, or a symbolic link that would carry the files out of the run
        folder) is moved aside and then into the new folder with the rest.
        """
        fs = self.fs
        root = self._p(QUARANTINE)
        displaced = None
        if fs.exists(root) and not _is_folder(fs, root):
            existing = set(fs.listdir(self.path))
            n = 1
            while f"{DISPLACED}-{n}" in existing:
                n += 1
            displaced = self._p(f"{DISPLACED}-{n}")
            fs.replace(root, displaced)  # renames a link itself, never what it points to
            self._fsync_dir()
        if not fs.exists(root):
            fs.mkdir(root)
            self._fsync_dir()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        existing = set(fs.listdir(root))
        n = 1
        while f"{stamp}-{n}" in existing:
            n += 1
        target = os.path.join(root, f"{stamp}-{n}")
        fs.mkdir(target)
        self._fsync_dir(root)
        note = os.path.join(target, "REASON.txt")
        if displaced:
            reason += f"; a non-folder named {QUARANTINE} was in the way and is kept here as {QUARANTINE}"
        fs.write_file(note, (reason.strip() + "\n").encode("utf-8", "replace"))
        if self.durability == "sync":
            fs.fsync(note)
        candidates = names if names is not None else [n for n in fs.listdir(self.path) if n in RUN_FILES or n.endswith(TMP_SUFFIX)]
        for name in candidates:
            if fs.exists(self._p(name)):
                fs.replace(self._p(name), os.path.join(target, name))
        if displaced:
            fs.replace(displaced, os.path.join(target, QUARANTINE))
        self._fsync_dir(target)
        self._fsync_dir()
        return target


def _is_folder(fs: FileSystem, path: str) -> bool:
    """True when ``path`` is a directory itself, not a file and not a link to one."""
    if fs.is_symlink(path):
        return False
    try:
        fs.listdir(path)
    except NotADirectoryError:
        return False
    return True


def check(path: str, fs: Optional[FileSystem] = None) -> Scan:
    """A thorough, read-only look at a run folder (what ``doctor`` reports), under the run's lock.

    The lock keeps a writer from compacting mid-look, so a healthy run never
    looks damaged for having been read between two renames. Nothing is
    written: the lock is the folder itself.
    """
    own = fs is None
    fs = fs or OsFileSystem()
    try:
        if fs.is_symlink(path):
            raise InvalidInput(f"{path} is a symbolic link; refusing to use it as a run folder", path=path)
        if not fs.exists(path):
            return scan(path, fs, thorough=True)
        with fs.lock(path):
            return scan(path, fs, thorough=True)
    finally:
        if own:
            fs.close()  # type: ignore[attr-defined]
