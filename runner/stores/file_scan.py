"""Reading a file store's run folder: what it holds, what can be rebuilt from it, and what is damage.

Nothing here writes, and :func:`scan` takes no lock: the harness hooks read a
run with it and nothing else, and the writer (:mod:`runner.stores.file_writer`)
loads through it under the run's lock. :func:`check` is the thorough look that
``doctor`` reports, under the same lock.

Loading never guesses. A torn final journal line (an append that was never
acknowledged) is dropped and the drop is recorded. Any other damage is
rebuilt exactly from another base (the snapshot, the backup, or ``run.json``,
each continued by the journal) or reported as damage, on which the writer
stops the run with :class:`~runner.base.errors.StateUnrecoverable` after moving its
files into ``quarantine/``. A journal that ends before the revision the head
witness names (:mod:`runner.stores.file_witness`) is damage too.
"""

import os
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..ledger.envelope import SchemaMismatch
from ..base.canonical import sha256_hex
from ..base.errors import InvalidInput
from ..base.fs import FileSystem, OsFileSystem
from .base import Finding
from .codec import HISTORY_KEPT, decode_identity, decode_record, genesis, replay
from .file_history import dropped_of, list_segments, walk
from .file_layout import (BACKUP, HEAD, HISTORY, IDENTITY, JOURNAL, PREV_JOURNAL, QUARANTINE, SNAPSHOT, STATE_FILES,
                          TMP_SUFFIX, decode_snapshot)
from .file_witness import decode_head, head_problem

__all__ = ["Scan", "JournalFile", "scan", "check", "parse_journal"]


class JournalFile(NamedTuple):
    """What one journal file held when it was read."""

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
    journal: Optional[JournalFile]
    snapshot_size: int
    journal_bytes_since_snapshot: int

    @property
    def damaged(self) -> bool:
        return any(f.level == "damage" for f in self.findings)

    @property
    def repairable(self) -> List[Finding]:
        return [f for f in self.findings if f.level == "repairable"]



def parse_journal(data: bytes, identity: Optional[Tuple[int, int]], allow_torn: bool) -> JournalFile:
    """The records of a journal file's bytes, up to the first damage; a torn final line only where ``allow_torn``."""
    records: List[Tuple[str, Dict[str, Any]]] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            records.append(decode_record(data[pos:nl]))
        except ValueError as exc:
            return JournalFile(records, pos, len(data), False, f"line {len(records) + 1} (byte {pos}): {exc}", identity)
        pos = nl + 1
    tail = data[pos:]
    if not tail:
        return JournalFile(records, pos, len(data), False, None, identity)
    # A tail without a newline is an append that never completed, unless it is
    # a whole record followed by one wrong byte where the newline should be.
    try:
        decode_record(tail[:-1])
        complete_but_damaged = True
    except ValueError:
        complete_but_damaged = False
    if complete_but_damaged or not allow_torn:
        return JournalFile(records, pos, len(data), False, f"damaged final line (byte {pos})", identity)
    return JournalFile(records, pos, len(data), True, None, identity)


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
    ``thorough`` also validates what the load did not need: the backup,
    every line of the previous journal, and the whole history folder
    (:func:`runner.stores.file_history.walk`).

    A load from a valid snapshot needs only the last line of the previous
    journal (the record at the snapshot's revision), so that is all it reads
    there; any other base needs the whole previous journal, and gets it.

    It takes no lock: a writer compacting meanwhile can make a healthy run
    look damaged. :func:`check` and :meth:`~runner.stores.file_writer.RunStore.open` scan under the lock.
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
    """One look at the folder (:class:`_Reading`); ``whole_prev`` reads every line of the previous journal."""
    return _Reading(path, fs, thorough, whole_prev).scan()


class _Reading:
    """One read-only look at a run folder, phase by phase, in the order its files must be read.

    Each phase adds what it finds to ``findings`` and keeps what a later
    phase needs; a phase that returns a :class:`Scan` ends the look there.
    The folder's names come first (links, temporary files, a folder with no
    run), then the identity and the head witness, the journals, the chain
    of records they hold, and last each base in turn (snapshot, backup,
    identity) until one rebuilds the run to the end of that chain.
    """

    def __init__(self, path: str, fs: FileSystem, thorough: bool, whole_prev: bool) -> None:
        self.path, self.fs, self.thorough, self.whole_prev = path, fs, thorough, whole_prev
        self.findings: List[Finding] = []
        self.names: set = set()
        self.identity: Dict[str, Any] = {}
        self.genesis_head = ""
        self.head: Optional[Tuple[int, str]] = None  # what the head witness says, when it can be read
        self.current: Optional[JournalFile] = None
        self.prev: Optional[JournalFile] = None
        self.records: List[Tuple[str, Dict[str, Any]]] = []  # prev's then current's, where they link
        self.prev_usable = False
        self.highest_valid = -1  # a rebuild must never land below a valid base

    def scan(self) -> Scan:
        """The whole look: see :func:`scan`."""
        phases: Tuple[Callable[[], Optional[Scan]], ...] = (self._folder, self._identity_and_head, self._journals,
                                                            self._chain)
        for phase in phases:
            ended = phase()
            if ended is not None:
                return ended
        for name, load in self._candidates():
            ended = self._from_base(name, load)
            if ended is not None:
                return ended
        return self._no_base()

    def _join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _stop(self, journal: Optional[JournalFile] = None, exists: bool = True) -> Scan:
        """The look ends with no state: ``exists`` says whether a run (or its remains) is here."""
        return Scan(self.path, exists, None, None, self.findings, journal, 0, 0)

    def _all_damage(self) -> None:
        """No base can be trusted now: every finding that was repairable is damage."""
        self.findings = [Finding("damage", f.code, f.message) if f.level == "repairable" else f for f in self.findings]

    def _folder(self) -> Optional[Scan]:
        """Links among the run's files (refused), stray temporary files; where there is no identity, what is here."""
        path, fs, findings = self.path, self.fs, self.findings
        if not fs.exists(path):
            findings.append(Finding("note", "absent", f"no run folder at {path}"))
            return self._stop(exists=False)
        names = self.names = set(fs.listdir(path))
        present = [n for n in STATE_FILES if n in names]
        for name in present + [n for n in (HEAD,) if n in names]:
            if fs.is_symlink(self._join(name)):
                findings.append(Finding("damage", "symlink", f"{name} is a symbolic link; refusing to follow it"))
        for name in sorted(names):
            if name.endswith(TMP_SUFFIX):
                findings.append(Finding("repairable", "stray-temp", f"leftover temporary file {name}"))
        folder = self._join(HISTORY)
        if HISTORY in names and not fs.is_symlink(folder):
            # A copy of the previous journal that never got its segment's name: the next writer removes it.
            for name in list_segments(fs, folder)[1]:
                if name.endswith(TMP_SUFFIX):
                    findings.append(Finding("repairable", "stray-temp", f"leftover temporary file {HISTORY}/{name}"))
        if any(f.code == "symlink" for f in findings):
            return self._stop()
        if IDENTITY in names:
            return None
        if not present:
            if QUARANTINE in names:
                findings.append(Finding("damage", "quarantined",
                                        f"the run's state was quarantined in {self._join(QUARANTINE)}"))
                return self._stop()
            findings.append(Finding("note", "empty", f"no run in {path}"))
            return self._stop(exists=False)
        if _is_unfinished_init(fs, path, names):
            findings.append(Finding("note", "unfinished-init",
                                    "an init that never completed left files; a new init may replace them"))
            return self._stop(exists=False)
        findings.append(Finding("damage", "identity-missing", "run.json is missing but run state is present"))
        return self._stop()

    def _identity_and_head(self) -> Optional[Scan]:
        """The identity (damage when unreadable), then the head witness (ignored, and said so, when it is not valid)."""
        try:
            self.identity, self.genesis_head = _read_identity(self.fs, self._join(IDENTITY))
        except (OSError, ValueError, InvalidInput) as exc:
            self.findings.append(Finding("damage", "identity", f"run.json is unreadable: {exc}"))
            return self._stop()
        # The head is read before the journal: a writer updates it only after
        # the journal, so a reader without the lock still never sees it ahead.
        if HEAD not in self.names:
            self.findings.append(Finding("repairable", "head-missing",
                                         f"{HEAD} is missing, so no witness says how far the run got"))
            return None
        try:
            self.head = decode_head(self.fs.read(self._join(HEAD)), self.identity)
        except (OSError, ValueError) as exc:
            self.findings.append(Finding("repairable", "head-invalid", f"{HEAD} is ignored: {exc}"))
        return None

    def _journals(self) -> None:
        """Both journals read: of the previous one, only its last line unless ``whole_prev``.

        A torn final record of the current one is dropped, and said so; a
        previous one that does not continue itself is unusable, not damage.
        """
        journals: Dict[str, JournalFile] = {}
        for name in (PREV_JOURNAL, JOURNAL):
            if name in self.names:
                ident = self.fs.stat(self._join(name))
                data = self.fs.read(self._join(name))
                if name == PREV_JOURNAL and not self.whole_prev:
                    data = _last_line(data)
                journals[name] = parse_journal(data, ident, allow_torn=(name == JOURNAL))
        current = self.current = journals.get(JOURNAL)
        prev = journals.get(PREV_JOURNAL)
        if current is not None and current.torn:
            dropped = current.size - current.good_end
            self.findings.append(Finding("repairable", "torn-record", f"dropped a torn final journal record: "
                                                                      f"{dropped} bytes at offset {current.good_end}"))
        if prev is not None and prev.error is None:
            # The previous journal is a copy of what the snapshot holds: a gap or
            # a repeated line inside it makes it unusable, not the run.
            for (digest_a, a), (_, b) in zip(prev.records, prev.records[1:]):
                if b["rev"] != a["rev"] + 1 or b["prev"] != digest_a:
                    prev = prev._replace(error=f"revision {b['rev']} does not continue revision {a['rev']}")
                    break
        self.prev = prev

    def _chain(self) -> Optional[Scan]:
        """The records a base may be continued by: the previous journal's then the current one's, where they link.

        Damage in the current journal, or a jump in the revisions, ends the look.
        """
        prev, current, findings = self.prev, self.current, self.findings
        chain_error: Optional[str] = None
        records: List[Tuple[str, Dict[str, Any]]] = []
        prev_usable = prev is not None and prev.error is None
        if prev is not None and prev.error:
            findings.append(Finding("repairable", "prev-journal", f"{PREV_JOURNAL} is damaged at {prev.error}"))
        if current is not None and current.error:
            chain_error = f"{JOURNAL} is damaged at {current.error}"
        else:
            cur_records = current.records if current else []
            if prev is not None and prev_usable and prev.records:
                if cur_records and cur_records[0][1]["prev"] != prev.records[-1][0]:
                    findings.append(Finding("repairable", "prev-journal", f"{PREV_JOURNAL} does not link to {JOURNAL}"))
                    prev_usable = False
                    records = list(cur_records)
                else:
                    records = prev.records + list(cur_records)
            else:
                records = list(cur_records)
            for (_, a), (_, b) in zip(records, records[1:]):
                if b["rev"] != a["rev"] + 1:
                    chain_error = f"journal revisions jump from {a['rev']} to {b['rev']}"
                    break
        self.records, self.prev_usable = records, prev_usable
        if chain_error:
            findings.append(Finding("damage", "journal", chain_error))
            return self._stop(current)
        return None

    def _candidates(self) -> List[Tuple[str, Callable[[], Dict[str, Any]]]]:
        """The bases to try, in order: the snapshot (its absence is said), the backup, the identity's genesis."""
        candidates: List[Tuple[str, Callable[[], Dict[str, Any]]]] = []
        for name in (SNAPSHOT, BACKUP):
            if name in self.names:
                def load_file(name: str = name) -> Dict[str, Any]:
                    return decode_snapshot(self.fs.read(self._join(name)))
                candidates.append((name, load_file))
            elif name == SNAPSHOT:
                self.findings.append(Finding("repairable", "snapshot-missing", "snapshot.json is missing"))
        identity, genesis_head = self.identity, self.genesis_head
        candidates.append((IDENTITY, lambda: genesis(identity, genesis_head)))
        return candidates

    def _last_rev(self) -> int:
        return self.records[-1][1]["rev"] if self.records else 0

    def _from_base(self, name: str, load: Callable[[], Dict[str, Any]]) -> Optional[Scan]:
        """The run rebuilt from base ``name`` and the chain; None when this base cannot do it and the next is tried.

        A base of another version of the state, or a replay that fails, ends
        the look as damage; so does what :meth:`_rebuilt` finds.
        """
        findings, identity = self.findings, self.identity
        try:
            base = load()
        except SchemaMismatch as exc:
            findings.append(Finding("damage", "schema", f"{name}: {exc}"))
            return self._stop(self.current)
        except (OSError, ValueError, InvalidInput) as exc:
            findings.append(Finding("repairable", f"{name}-invalid", f"{name} is invalid: {exc}"))
            return None
        if base["task_id"] != identity["task_id"] or base["created_at"] != identity["created_at"]:
            findings.append(Finding("repairable", f"{name}-foreign",
                                    f"{name} belongs to another run (task {base['task_id']!r})"))
            return None
        self.highest_valid = max(self.highest_valid, base["revision"])
        base_point = (base["revision"], base["head"])
        # Only the snapshot may stand without the record at its revision, and
        # only when the previous journal that held it is the damaged file.
        prev_lost = name == SNAPSHOT and self.prev is not None and not self.prev_usable
        start, error = _chain_from(base, self.records, prev_lost)
        if error is not None:
            findings.append(Finding("repairable", f"{name}-inconsistent", f"{name}: {error}"))
            return None
        try:
            state = replay(base, self.records[start:])
        except ValueError as exc:
            findings.append(Finding("damage", "replay", f"replaying the journal from {name} failed: {exc}"))
            return self._stop(self.current)
        if state["revision"] != max(self._last_rev(), base["revision"]) or state["revision"] < self.highest_valid:
            findings.append(Finding("repairable", f"{name}-behind", f"{name} rebuilds revision {state['revision']}, "
                                                                    f"behind a valid base at {self.highest_valid}"))
            return None
        return self._rebuilt(name, state, base_point)

    def _rebuilt(self, name: str, state: Dict[str, Any], base_point: Tuple[int, str]) -> Scan:
        """The answer for ``state``, rebuilt from base ``name`` (at ``base_point``) to the end of the chain.

        A ``run.json`` that names another version than the state is damage;
        so are lost records: the head witness names a revision the chain
        does not reach or holds otherwise, or the journal is missing where
        no compaction leaves it so.
        """
        identity = self.identity
        if identity.get("schema_version") != state["schema_version"]:
            # A state of another version was refused above, so this is run.json damaged.
            self._all_damage()
            said = (f"{IDENTITY} says schema version {identity.get('schema_version')!r}, "
                    f"the run's state is version {state['schema_version']}")
            self.findings.append(Finding("damage", "identity", said))
            return self._stop(self.current)
        lost = head_problem(self.head, state, base_point, self.records)
        prev = self.prev
        ends_at_snapshot = (self.prev_usable and prev is not None and prev.records
                            and state["revision"] == prev.records[-1][1]["rev"])
        if lost is None and self.current is None and not ends_at_snapshot:
            # Compaction leaves no journal only between rotating it and
            # creating the next, when the previous journal ends at the snapshot.
            lost = (f"{JOURNAL} is missing, and only a compaction that ended with {PREV_JOURNAL} "
                    "at the snapshot may leave it so")
        if lost is not None:
            self._all_damage()
            self.findings.append(Finding("damage", "journal-lost", lost))
            return self._stop(self.current)
        return self._loaded(name, state)

    def _loaded(self, name: str, state: Dict[str, Any]) -> Scan:
        """The answer once base ``name`` rebuilt ``state``; a thorough look checks the backup beside a snapshot."""
        snapshot_size = 0
        if name == SNAPSHOT:
            snapshot_size = self.fs.stat(self._join(SNAPSHOT))[1]  # type: ignore[index]
            if self.thorough and BACKUP in self.names:
                prev_records = self.prev.records if self.prev is not None and self.prev_usable else []
                problem = _backup_problem(self.fs, self._join(BACKUP), self.identity, state, prev_records)
                if problem:
                    self.findings.append(Finding("repairable", f"{BACKUP}-invalid", f"{BACKUP} is invalid: {problem}"))
        else:
            self.findings.append(Finding("repairable", "rebuilt",
                                         f"rebuilt revision {state['revision']} from {name} and the journal"))
        if self.thorough:
            self._history(state)
        since = self.current.good_end if self.current is not None else 0
        return Scan(self.path, True, state, name, self.findings, self.current, snapshot_size, since)

    def _history(self, state: Dict[str, Any]) -> None:
        """The whole history read back (a thorough look only): what breaks its chain, and what else the folder holds.

        A segment missing or altered is damage of the history, not of the
        state, which loads as before; another name there is noted.
        """
        folder = self._join(HISTORY)
        kept = self.identity.get("history") == HISTORY_KEPT
        walked = walk(self.fs, folder, self.records, self.genesis_head, kept, dropped_of(state))
        self.findings.extend(walked.findings)
        if HISTORY in self.names and not self.fs.is_symlink(folder):
            for name in list_segments(self.fs, folder)[1]:
                if not name.endswith(TMP_SUFFIX):  # a temporary one was found with the folder's names
                    said = f"{HISTORY}/{name} is not a segment of the history"
                    self.findings.append(Finding("note", "history-other", said))

    def _no_base(self) -> Scan:
        """No base reaches the end of the journal: every problem found is damage now."""
        self._all_damage()
        self.findings.append(Finding("damage", "no-base", f"no valid base rebuilds revision {self._last_rev()}"))
        return self._stop(self.current)


def _backup_problem(
    fs: FileSystem, path: str, identity: Dict[str, Any], state: Dict[str, Any],
    prev_records: Sequence[Tuple[str, Dict[str, Any]]]
) -> Optional[str]:
    """Why ``backup.json`` is not the snapshot before the current one of this run's history; None when it is.

    It must be of this run (task id and creation time), no newer than the
    state, and, where the previous journal holds the record after it, be the
    revision that record continues.
    """
    try:
        backup = decode_snapshot(fs.read(path))
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
            return decode_snapshot(fs.read(os.path.join(path, SNAPSHOT)))["revision"] == 0
        except (OSError, ValueError):
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
