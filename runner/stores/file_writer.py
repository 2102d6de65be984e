"""Writing a file store's run: transitions, compaction, repair and quarantine (:class:`RunStore`).

Invariants the store keeps:

* A transition is one fsync'd append of one journal line; it is acknowledged
  (the call returns) only after that fsync. Each line carries the revision,
  the writer's fencing epoch and the hash of the line before it, so the
  journal is a hash chain rooted in ``run.json``. The head witness
  (:mod:`runner.stores.file_witness`) is then overwritten in place, unsynced.
* The snapshot is a cache of the journal: the journal files always hold the
  record at the snapshot's revision. A snapshot ahead of its journal is damage.
* Compaction writes the new snapshot beside the old, fsyncs it, then rotates
  journal -> prev and snapshot -> backup with a directory fsync after each
  step, so every crash leaves a base (snapshot, backup or ``run.json``) from
  which the journal rebuilds the last acknowledged revision.
* Compaction forgets nothing: before the rotation replaces the previous
  journal, a compressed copy of it is made durable in the history folder
  (:mod:`runner.stores.file_history`), so the segments and the journals
  hold every record since revision 1. A retention bound of the contract
  drops the oldest segments only after a transition recorded the drop.
* A load is a :func:`~runner.stores.file_scan.scan` under the lock; what it
  cannot rebuild exactly is moved into ``quarantine/`` (never deleted) and the
  run stops with :class:`~runner.base.errors.StateUnrecoverable`. Lossless repairs
  it found are made by the next writer. A new run is never created over
  existing or damaged state.

Every mutation runs under an exclusive ``flock`` on the run folder, after the
store has caught up with what other processes appended, so a check made
inside a transaction (such as the fencing check) sees the state it writes
against. Loads and ``doctor`` (:func:`~runner.stores.file_scan.check`) read under the same lock.
"""

import contextlib
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..ledger.envelope import new_envelope, undo_ops
from ..base.values import validate_id
from ..base.times import parse_time
from ..base.canonical import sha256_hex
from ..base.errors import InvalidInput, StateUnrecoverable
from ..base.fs import FileSystem, OsFileSystem, replace_durably
from ..base.windows import NO_OBSERVER, Observer
from .base import Finding, Store
from .codec import (HISTORY_KEPT, Ops, decode_identity, finish_transition, genesis, new_identity, prepare_transition,
                    replay)
from .file_history import (compress, dropped_of, dropped_record, due_for_drop, list_segments, read_segment,
                           retention_of, segment_name, walk)
from .file_layout import (BACKUP, DISPLACED, HEAD, HISTORY, HOOKS, IDENTITY, JOURNAL, LOCK, PREV_JOURNAL, QUARANTINE,
                          RUN_FILES, SNAPSHOT, TMP_SUFFIX, encode_snapshot)
from .file_scan import parse_journal, scan
from .file_witness import encode_head, seal_key

__all__ = ["RunStore", "DURABILITY_MODES"]

#: ``sync`` fsyncs before a call returns and survives power loss (the
#: default). ``process`` skips every fsync: it survives the death of the
#: process, since the kernel still holds what was written, but not of the machine.
DURABILITY_MODES = ("sync", "process")


class RunStore(Store):
    """One run's durable state. Create with :meth:`create`, load with :meth:`open`.

    ``state`` is the envelope at the store's current revision; treat it as
    read-only. Change it only through :meth:`transact` or :meth:`commit`.
    The ``location`` of the backend's class methods is the run's folder
    (for :meth:`list_runs`, the folder that holds one folder per run).
    """

    def __init__(
        self,
        path: str,
        *,
        fs: Optional[FileSystem] = None,
        clock: Optional[Callable[[], float]] = None,
        durability: str = "sync",
        compact_min_bytes: int = 256 * 1024,
        observer: Optional[Observer] = None,
    ) -> None:
        """The options of :meth:`open` and :meth:`create`.

        :param path: the run's folder (made absolute, unless ``fs`` is given).
        :param fs: the file system the store reads and writes through (:mod:`runner.base.fs`).
        :param clock: wall clock (seconds since the epoch) for record times.
        :param durability: one of :data:`DURABILITY_MODES`.
        :param compact_min_bytes: the journal size below which no compaction
            happens; above it, the journal is compacted once it reaches a quarter
            of the snapshot's size, which keeps both loading and compaction cost
            proportional to the state, not to its history.
        :param observer: receives the store's commit windows (see :mod:`runner.base.windows`).
        :raises InvalidInput: ``durability`` is not one of the modes.
        """
        if durability not in DURABILITY_MODES:
            raise InvalidInput(f"durability must be one of {', '.join(DURABILITY_MODES)}")
        self.path = os.path.abspath(path) if fs is None else path
        self.fs = fs or OsFileSystem()
        self.clock = clock or time.time
        self.durability = durability
        self.compact_min_bytes = compact_min_bytes
        self.observer = observer if observer is not None else NO_OBSERVER
        self._paths: Dict[str, str] = {}
        self._state: Optional[Dict[str, Any]] = None
        self._journal_id: Optional[Tuple[int, int]] = None
        self._journal_bytes = 0
        self._snapshot_size = 0
        self._pending: List[Finding] = []  # repairs the next writer performs
        self._torn_at: Optional[int] = None
        self._seal: Optional[bytes] = None  # the head's seal key: the run's task id and creation time
        self._keeping = False  # a drop of history is being recorded: its own transition compacts nothing
        #: Findings of the last full load (notes and lossless repairs).
        self.findings: List[Finding] = []
        #: What the last :meth:`records_after` found breaking the history's chain (missing or altered segments).
        self.history_findings: Tuple[Finding, ...] = ()

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
        replace_durably(self.fs, self._p(name), data, self.durability == "sync", observer=self.observer)

    # -- creation -------------------------------------------------------------
    @classmethod
    def create(cls, path: str, /, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None,
               **options: Any) -> "RunStore":
        """Start a new run in ``path``; refuse if the folder holds any run state.

        The refusal is decided once, under the folder's lock, before anything
        is written, so of two concurrent inits exactly one starts the run and
        the other is refused. ``run.json`` is written last: until it is
        durable the run does not exist, and a repeated ``create`` may replace
        what an interrupted one left.

        :param path: the run's folder; made (0700) if it does not exist, narrowed to 0700 if it does.
        :param task_id: the run's id. :param plan: its plan, a JSON object.
        :param workspace_base: the folder a relative ``workspace`` resolves against.
        :param options: the constructor's keywords (``fs``, ``clock``, ``durability``, ``compact_min_bytes``,
            ``observer``).
        :returns: the store at revision 0.
        :raises InvalidInput: the task id or plan is malformed, or the folder is a
            symbolic link or holds a run, its remains, or other files.
        :raises OSError: the folder or its files could not be written.
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
                store.observer.reached("store:after-mkdir", path=store.path)
                store._fsync_dir(os.path.dirname(store.path) or ".")
                store.observer.reached("store:after-mkdir-fsync", path=store.path)
        with fs.lock(store.path):
            found = scan(store.path, fs)
            leftovers = [n for n in fs.listdir(store.path) if n not in (LOCK, HOOKS) + RUN_FILES and
                         not n.endswith(TMP_SUFFIX)]
            if found.exists or leftovers:
                detail = "; ".join(f.message for f in found.findings if f.level != "note") or (
                    "it already holds a run" if found.exists else f"it holds other files ({', '.join(leftovers[:5])})")
                raise InvalidInput(f"refusing to start a new run in {store.path}: {detail}", path=store.path)
            fs.make_private(store.path)  # an existing empty folder is narrowed too
            now = store.now()
            identity, identity_bytes = new_identity(task_id, plan, now, workspace_base)
            state = genesis(identity, sha256_hex(identity_bytes))
            snapshot = encode_snapshot(state)
            # Unfinished-init leftovers are overwritten, never appended to.
            for name in (JOURNAL, HEAD):
                if fs.exists(store._p(name)):
                    fs.unlink(store._p(name))
            store._write_replace(SNAPSHOT, snapshot)
            fs.create_exclusive(store._p(JOURNAL))
            store.observer.reached("store:after-journal-create", path=store._p(JOURNAL))
            fs.create_exclusive(store._p(HEAD), encode_head(state))
            store._fsync(HEAD)  # its blocks exist from now on, so later overwrites need no new space
            store._fsync_dir()
            store.observer.reached("store:after-journal-create-fsync", path=store._p(JOURNAL))
            store._write_replace(IDENTITY, identity_bytes)  # the commit point of init
            store._state = state
            store._snapshot_size = len(snapshot)
            store._journal_bytes = 0
            store._journal_id = fs.stat(store._p(JOURNAL))
        return store

    # -- loading --------------------------------------------------------------
    @classmethod
    def open(cls, path: str, /, task_id: Optional[str] = None, **options: Any) -> "RunStore":
        """Load the run in ``path`` under its lock; quarantine and raise if it cannot be rebuilt exactly.

        Reading needs no write access: a run on a read-only file system loads.

        :param path: the run's folder.
        :param task_id: when given, the run there must be this one.
        :param options: the constructor's keywords (``fs``, ``clock``, ``durability``, ``compact_min_bytes``,
            ``observer``).
        :returns: the store, holding the latest state the folder proves; ``findings``
            lists what the load noted and the lossless repairs the next write makes.
        :raises InvalidInput: no run is there, ``path`` is a symbolic link (which
            ``create`` refuses too), or the run there is not ``task_id``.
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
        if task_id and store.state["task_id"] != task_id:
            raise InvalidInput(f"{path} holds run {store.state['task_id']}, not {task_id}")
        return store

    @classmethod
    def list_runs(cls, location: str, /, **options: Any) -> List[str]:
        """The names of the run folders under ``location`` (each holds a ``run.json``), sorted.

        :param location: the folder that holds one folder per run.
        :returns: the names, which are the runs' task ids when ``init`` named the
            folders so; empty when ``location`` is not a folder.
        """
        if not os.path.isdir(location):
            return []
        return sorted(name for name in os.listdir(location) if os.path.isfile(os.path.join(location, name, IDENTITY)))

    @classmethod
    def run_location(cls, location: str, task_id: str) -> str:
        """The folder of run ``task_id`` in the collection at ``location``: ``location/task_id``."""
        return os.path.join(location, task_id)

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
            raise StateUnrecoverable(f"run state in {self.path} is unrecoverable: {problems}", path=self.path,
                                     quarantine=where)
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
        if (ident is not None and self._journal_id is not None and ident[0] == self._journal_id[0] and
            ident[1] > self._journal_id[1] and self._torn_at is None):
            tail = self.fs.read_from(self._p(JOURNAL), self._journal_id[1])
            parsed = parse_journal(tail, None, allow_torn=True)
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
                        self._pending.append(Finding("repairable", "torn-record",
                                                     f"dropped a torn final journal record at offset {self._torn_at}"))
                    return
        self._load()

    def records_after(self, after: int) -> Tuple[List[Dict[str, Any]], int]:
        """Journal records with revision > ``after``, from the history folder and the journals, and the oldest held.

        Compaction keeps every record (in the history folder), so the oldest
        is revision 1 unless the run's retention dropped older ones; an
        observer that asks for those learns it from the second value.
        Missing or altered segments are not read past as if nothing were
        there: :attr:`history_findings` says what breaks the chain.

        :param after: the last revision the caller has seen.
        :returns: ``(records, oldest)`` as :meth:`runner.stores.base.Store.records_after` describes.
        :raises StateUnrecoverable: catching up found the run damaged (its files were quarantined).
        """
        with self.fs.lock(self.path):
            self._catch_up()
            records: List[Tuple[str, Dict[str, Any]]] = []
            for name in (PREV_JOURNAL, JOURNAL):
                if self.fs.exists(self._p(name)):
                    parsed = parse_journal(self.fs.read(self._p(name)), None, allow_torn=(name == JOURNAL))
                    if not records or not parsed.records or parsed.records[0][1]["prev"] == records[-1][0]:
                        records += parsed.records
                    else:
                        records = list(parsed.records)  # the previous journal does not link to it: walk says so
            identity = self.fs.read(self._p(IDENTITY))
            kept = decode_identity(identity).get("history") == HISTORY_KEPT
            walked = walk(self.fs, self._p(HISTORY), records, sha256_hex(identity), kept, dropped_of(self.state), after)
            self.history_findings = tuple(walked.findings)
            held = [dict(body, hash=digest) for digest, body in walked.records if after < body["rev"] <= self.revision]
            return held, walked.oldest

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
            if not self._keeping and self._journal_bytes >= max(self.compact_min_bytes, self._snapshot_size // 4):
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
            self.observer.reached("store:after-truncate", path=journal)
            self._fsync(JOURNAL)
            self._torn_at = None
        if self._journal_id is None:
            self.fs.create_exclusive(journal)
            self.observer.reached("store:after-journal-create", path=journal)
            self._fsync_dir()
            self.observer.reached("store:after-journal-create-fsync", path=journal)
            self._journal_id = self.fs.stat(journal)
        assert self._journal_id is not None
        end = self._journal_id[1]
        self.observer.reached("store:before-append", fs=self.fs, path=journal, data=line)
        try:
            self.fs.append(journal, line)
            self.observer.reached("store:after-append", path=journal)
            self._fsync(JOURNAL)
            self.observer.reached("store:after-append-fsync", path=journal)
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
            self._seal = seal_key(state["task_id"], state["created_at"])
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
        damaged = [name for name in (SNAPSHOT, BACKUP, PREV_JOURNAL) if f"{name}-invalid" in codes or
                   f"{name}-foreign" in codes or f"{name}-inconsistent" in codes]
        if "prev-journal" in codes:
            damaged.append(PREV_JOURNAL)
        damaged = [n for n in dict.fromkeys(damaged) if self.fs.exists(self._p(n))]
        if PREV_JOURNAL in damaged:
            self._archive_prev()  # what of it still chains is kept in the history before it goes
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
        folder = self._p(HISTORY)
        if self.fs.exists(folder) and not self.fs.is_symlink(folder):
            for name in list_segments(self.fs, folder)[1]:
                if name.endswith(TMP_SUFFIX):
                    self.fs.unlink(os.path.join(folder, name))
        if damaged or "rebuilt" in codes or "snapshot-missing" in codes:
            self._compact_locked()

    def repair(self, *, epoch: int = 0) -> List[Finding]:
        """Perform every lossless repair a thorough look finds; return what was done.

        The look is the one ``doctor`` reports (:func:`~runner.stores.file_scan.check`):
        it reads every line of the previous journal and the backup, which a load need not.
        Damaged copies are moved into ``quarantine/``, then a fresh snapshot is written.

        :param epoch: the fencing epoch written on the record of the repair.
        :returns: the findings repaired (empty when there was nothing to do).
        :raises StateUnrecoverable: the run is damaged beyond an exact rebuild (its files were quarantined).
        :raises OSError: a repair could not be written.
        """
        with self.fs.lock(self.path):
            self._load(thorough=True)
            done = list(self._pending)
            if done:
                self._commit_locked([], epoch)
            return done

    # -- compaction -------------------------------------------------------------
    def compact(self) -> None:
        """Write a fresh snapshot and rotate journal and backup (see module docs).

        Every step keeps the folder loadable, so a crash or a failure part way
        loses nothing acknowledged.

        :raises StateUnrecoverable: catching up found the run damaged (its files were quarantined).
        :raises OSError: the snapshot or a rename could not be written.
        """
        with self.fs.lock(self.path):
            self._catch_up()
            self._compact_locked()

    def _compact_locked(self) -> None:
        # Each rename is made durable before the next, so a crash between any
        # two leaves a base that the remaining journal continues:
        #   after 1: backup=S, journal=S+1..R      after 2: snapshot=R
        #   after 3: prev=S+1..R                   after 4: an empty journal
        fs, reached = self.fs, self.observer.reached
        data = encode_snapshot(self.state)
        tmp = SNAPSHOT + TMP_SUFFIX
        reached("store:before-compaction", path=self._p(SNAPSHOT))
        rotating = fs.stat(self._p(JOURNAL))
        if rotating is None or rotating[1] > 0:
            self._archive_prev()  # 0: before step 3 replaces it
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
        if not self._keeping:
            self._keep_history()

    # -- the history folder -------------------------------------------------------
    def _archive_prev(self) -> None:
        """Make a compressed copy of the previous journal durable in the history folder, under its segment's name.

        A copy left by a compaction that stopped before its rotation has the
        same name and the same records, and is replaced. Of a previous
        journal that is damaged (which a repair is about to quarantine), the
        records up to the first that does not continue the one before are
        copied: whatever follows is then missing from the history, which a
        look at the history reports.
        """
        fs, reached = self.fs, self.observer.reached
        prev = self._p(PREV_JOURNAL)
        if not fs.exists(prev):
            return
        data = fs.read(prev)
        records = parse_journal(data, None, allow_torn=False).records
        whole = 1
        while whole < len(records) and records[whole][1]["rev"] == records[whole - 1][1]["rev"] + 1 \
                and records[whole][1]["prev"] == records[whole - 1][0]:
            whole += 1
        if not records:
            return
        records = records[:whole]
        data = b"\n".join(data.split(b"\n")[:whole]) + b"\n"  # one record per line, the first lines read
        folder = self._p(HISTORY)
        if not fs.exists(folder):
            fs.mkdir(folder)
            reached("store:after-history-mkdir", path=folder)
            self._fsync_dir()
        target = os.path.join(folder, segment_name(records[0][1]["rev"], records[-1][1]["rev"]))
        tmp = target + TMP_SUFFIX
        fs.write_file(tmp, compress(data))
        reached("store:after-archive-write", path=target)
        if self.durability == "sync":
            fs.fsync(tmp)
        reached("store:after-archive-fsync", path=target)
        fs.replace(tmp, target)
        reached("store:after-archive-rename", path=target)
        self._fsync_dir(folder)
        reached("store:after-archive-rename-fsync", path=target)

    def _keep_history(self) -> None:
        """Drop the oldest segments the contract's retention no longer keeps, the drop recorded first.

        The record is a transition of its own (epoch 0: the store's, no
        worker's), made durable before any segment is deleted, so the
        envelope covers whatever is gone; segments a recorded drop left
        behind (a crash before their deletion) are deleted here too.
        """
        fs, folder = self.fs, self._p(HISTORY)
        if not fs.exists(folder) or fs.is_symlink(folder):
            return
        segments = list_segments(fs, folder)[0]
        before = dropped_of(self.state)
        through = int(before["through"]) if before else 0
        left = [s for s in segments if s.last <= through]
        kept = [s for s in segments if s.last > through]
        keep_seconds, keep_bytes = retention_of(self.state["plan"])
        if len(kept) > 1 and (keep_seconds is not None or keep_bytes is not None):
            total = sum((fs.stat(os.path.join(folder, s.name)) or (0, 0))[1] for s in kept)
            now = self.clock()
            dropping = []
            for segment in kept[:-1]:
                try:
                    records, size = read_segment(fs, folder, segment)
                except ValueError:
                    break  # a damaged segment is never dropped, nor anything after it: a look at the history reports it
                if not due_for_drop(total, parse_time(records[-1][1]["at"]), keep_seconds, keep_bytes, now):
                    break
                dropping.append((segment, records, size))
                total -= size
            # A drop continues the last one (a run that kept no history folder at first may begin anywhere).
            continues = not before or (dropping and dropping[0][0].first == through + 1
                                       and dropping[0][1][0][1]["prev"] == before["head"])
            if dropping and continues:
                start = new_envelope(self.state["task_id"], {}, "", self.state["created_at"])
                bounds = (("keep_seconds", keep_seconds), ("keep_bytes", keep_bytes))
                policy = {k: v for k, v in bounds if v is not None}
                record = dropped_record(before, start, dropping, policy, self.now())
                self._keeping = True
                try:
                    self._commit_locked([["set", ["observations", "history"], {"dropped": record}]], 0)
                finally:
                    self._keeping = False
                left += [segment for segment, _, _ in dropping]
        if left:
            self.observer.reached("store:before-history-drop", path=folder)
            for segment in left:
                fs.unlink(os.path.join(folder, segment.name))
            self._fsync_dir(folder)

    # -- quarantine ---------------------------------------------------------------
    def _quarantine(self, reason: str, names: Optional[Sequence[str]] = None) -> str:
        """Move run files (all, and the history folder, unless ``names``) into a fresh folder under ``quarantine/``.

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
        candidates = names if names is not None else [n for n in fs.listdir(self.path)
                                                      if n in RUN_FILES or n == HISTORY or n.endswith(TMP_SUFFIX)]
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

