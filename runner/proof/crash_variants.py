"""Deliberately broken write paths, by name, to show that the explorer catches each mistake they model.

A variant is a disk model (one that may drop syncs), observer at the store's
commit windows (which may reorder or forge writes) and a durability mode.
"""

import posixpath
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Type

from ..stores.codec import decode_identity, decode_record
from ..stores.file_layout import HEAD
from ..stores.file_witness import encode_head
from ..base.windows import NO_OBSERVER, Observer
from .recording_fs import RecordingFileSystem

__all__ = ["VARIANTS"]

#: The deliberately broken write paths :func:`runner.proof.crashcheck.explore` can check, by name.
VARIANTS = ("no-file-fsync", "no-dir-fsync", "snapshot-before-journal", "no-journal-fsync", "head-before-append",
            "no-archive-fsync")

#: The store's compaction threshold under every variant: small, so that compactions come often.
_COMPACT_MIN_BYTES = 512


class _LyingDisk(RecordingFileSystem):
    """The recording disk acknowledging some syncs without doing them: the model of a write path that leaves them out.

    Every folder sync is dropped when ``drops_dir_fsyncs``; the next file sync
    after :meth:`drop_next_fsync` (called by observer at a window) is dropped too.
    A dropped sync is not an operation: nothing is logged, the disk is unchanged.
    """

    drops_dir_fsyncs = False

    def __init__(self, observer: Optional[Callable[["RecordingFileSystem"], None]] = None) -> None:
        super().__init__(observer)
        self._drop_next = False

    def drop_next_fsync(self) -> None:
        self._drop_next = True

    def fsync(self, path: str) -> None:
        if self._drop_next:
            self._drop_next = False
            return
        super().fsync(path)

    def fsync_dir(self, path: str) -> None:
        if not self.drops_dir_fsyncs:
            super().fsync_dir(path)


class _DirSyncDroppingDisk(_LyingDisk):
    drops_dir_fsyncs = True


class _DropTempFsyncs(Observer):
    """Observer that make the disk skip the sync of every new file written beside its target (the window just before
    it)."""

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        if window == "store:after-temp-write" and isinstance(self.disk, _LyingDisk):
            self.disk.drop_next_fsync()


class _DropArchiveFsyncs(Observer):
    """Observer that make the disk skip the sync of every copy of the previous journal before it is named a segment."""

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        if window == "store:after-archive-write" and isinstance(self.disk, _LyingDisk):
            self.disk.drop_next_fsync()



class _SnapshotBeforeRecord(Observer):
    """A deliberately wrong write order: a compaction's snapshot is made durable before the record that triggered it.

    That breaks "the journal files always hold the record at the snapshot's
    revision". Observer cannot reorder the store's calls, so when a compaction
    starts right after a record was appended, these take the record back
    off the journal (a ``damage`` of the model, behind the store's back) and
    append and sync it again once the new snapshot's rename is durable. Only
    used to show that the explorer catches such an order.
    """

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk
        self.previous = ""
        self.appended: Optional[Tuple[str, bytes]] = None
        self.held: Optional[Tuple[str, bytes]] = None

    def reached(self, window: str, **facts: Any) -> None:
        if window == "store:before-append":
            self.appended = (facts["path"], facts["data"])
        elif (window == "store:before-compaction" and self.previous == "store:after-append-fsync" and
              self.appended is not None):
            path, data = self.held = self.appended
            self.disk.damage(path, lambda journal: journal[: len(journal) - len(data)])
        elif window == "store:after-rename-fsync" and self.held is not None:
            path, data = self.held
            self.held = None
            self.disk.append(path, data)
            self.disk.fsync(path)
        self.previous = window


class _HeadBeforeAppend(Observer):
    """A deliberately wrong witness: ``head.json`` names the new revision before its record is appended.

    A power loss can then keep the head and lose the record, and the loader,
    which trusts a valid head as a lower bound, raises a false alarm over a
    run that lost only an unacknowledged transition. Only used to show that
    the explorer catches a witness that may lead the journal.
    """

    def __init__(self, disk: RecordingFileSystem) -> None:
        self.disk = disk

    def reached(self, window: str, **facts: Any) -> None:
        if window != "store:before-append":
            return
        folder = posixpath.dirname(facts["path"])
        identity = decode_identity(self.disk.read(posixpath.join(folder, "run.json")))
        digest, body = decode_record(facts["data"].rstrip(b"\n"))
        ahead = {"task_id": identity["task_id"], "created_at": identity["created_at"], "revision": body["rev"],
                 "head": digest}
        self.disk.overwrite(posixpath.join(folder, HEAD), encode_head(ahead))


class _Variant(NamedTuple):
    disk: Type[RecordingFileSystem]
    observer: Callable[[RecordingFileSystem], Observer]
    durability: str

    def options(self, disk: RecordingFileSystem, clock: Callable[[], float]) -> Dict[str, Any]:
        """The store options of this write path over ``disk``."""
        return dict(fs=disk, observer=self.observer(disk), clock=clock, durability=self.durability,
                    compact_min_bytes=_COMPACT_MIN_BYTES)


def _no_hooks(disk: RecordingFileSystem) -> Observer:
    return NO_OBSERVER


def _variant(name: Optional[str]) -> _Variant:
    """The store class, disk model, observer and durability of a write path, by variant name."""
    if name is None:
        return _Variant(RecordingFileSystem, _no_hooks, "sync")
    if name == "no-file-fsync":
        return _Variant(_LyingDisk, _DropTempFsyncs, "sync")
    if name == "no-dir-fsync":
        return _Variant(_DirSyncDroppingDisk, _no_hooks, "sync")
    if name == "snapshot-before-journal":
        return _Variant(RecordingFileSystem, _SnapshotBeforeRecord, "sync")
    if name == "no-journal-fsync":
        return _Variant(RecordingFileSystem, _no_hooks, "process")
    if name == "head-before-append":
        return _Variant(RecordingFileSystem, _HeadBeforeAppend, "sync")
    if name == "no-archive-fsync":
        return _Variant(_LyingDisk, _DropArchiveFsyncs, "sync")
    raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")

