"""The named commit windows: the points where the core may lose its process, and the observers that see them.

A *window* is a moment between two durable steps of the core: a crash there
leaves exactly the durable state the window's description names. The core
calls ``observer.reached(window, **facts)`` at each one, through an observer
handed to it (``RunStore(..., observer=)``, the SQL stores, ``Run``,
``drive_effect``); the default, :data:`NO_OBSERVER`, does nothing. The core never
acts on what an observer does: recording, pausing or killing the process
there is the business of whoever passed it in (``runner/proof/faults.py``
holds the fault injection; a supervisor may use the same observer to observe).

:data:`WINDOWS` is the one table of window names, in the order one pass
reaches them: a transition's append, then the compaction it may trigger
(which first copies the previous journal into the history folder) and the
drop of history the retention asks for after it, the repair of a torn
record, ``init``; one effect's lifecycle; steps, the lease, jobs. Each entry
is ``(name, facts, what is durable when it is reached)``.
``tests/test_windows.py`` drives one transition and one effect and checks
that observer receive these windows, in this order, so the table cannot drift
from the code.
"""

from typing import Any, Tuple

__all__ = ["WINDOWS", "WINDOW_NAMES", "Observer", "NO_OBSERVER", "check_window"]

#: ``(name, facts passed, the durable state at that moment)``, in the order a pass reaches them.
WINDOWS: Tuple[Tuple[str, str, str], ...] = (
    # the file store: one transition
    ("store:before-append", "fs, path, data",
     "the record is encoded; nothing of it is in the journal (a fault may write part of it here)"),
    ("store:after-append", "path", "the record is in the journal, not yet synced"),
    ("store:after-append-fsync", "path", "the record is durable; the commit has not returned"),
    # the file store: the compaction a transition may trigger
    ("store:before-compaction", "path", "a compaction is due; nothing of it is written"),
    ("store:after-history-mkdir", "path",
     "the run's first segment is due: the history folder exists; the run folder is not synced"),
    ("store:after-archive-write", "path",
     "the previous journal's compressed copy is written in the history folder under a temporary name, not yet synced"),
    ("store:after-archive-fsync", "path", "that copy is durable under its temporary name"),
    ("store:after-archive-rename", "path", "the copy has its segment's name; the history folder is not synced"),
    ("store:after-archive-rename-fsync", "path",
     "the segment is durable beside the previous journal it copies, which is unchanged"),
    ("store:after-temp-write", "path", "a new file is written beside its target, not yet synced"),
    ("store:after-temp-fsync", "path", "the new file is durable; its target is unchanged"),
    ("store:after-backup-rename", "path", "the old snapshot is renamed to the backup; the folder is not synced"),
    ("store:after-backup-fsync", "path", "the backup rename is durable; there is no snapshot file"),
    ("store:after-rename", "path", "the new file is renamed over its target; the folder is not synced"),
    ("store:after-rename-fsync", "path", "that rename is durable"),
    ("store:after-journal-rename", "path", "the journal is renamed to the previous journal; the folder is not synced"),
    ("store:after-journal-rename-fsync", "path", "that rename is durable; there is no journal file"),
    ("store:after-journal-create", "path", "a new empty journal exists; the folder is not synced"),
    ("store:after-journal-create-fsync", "path", "the new journal is durable"),
    # the file store: the oldest history the contract's retention no longer keeps, dropped after a compaction
    ("store:before-history-drop", "path",
     "a transition of its own has recorded the drop; the segments it drops are still in the history folder"),
    # the file store: the first write after a torn final record
    ("store:after-truncate", "path", "the torn tail is cut off the journal, not yet synced"),
    # the file store: init (then temp write, temp fsync, rename of the snapshot and of run.json, and the journal's
    # creation)
    ("store:after-mkdir", "path", "the run folder exists; its parent is not synced"),
    ("store:after-mkdir-fsync", "path", "the run folder is durable and empty"),
    # the database stores: one transition
    ("store:before-db-commit", "", "the transaction holds the record, not committed"),
    ("store:after-db-commit", "", "the record is committed; the commit has not returned"),
    # one effect (drive_effect)
    ("effect:before-started", "key", "nothing of this attempt is recorded"),
    ("effect:after-started", "key", "started is durable; the target was not called"),
    ("effect:after-call", "key", "the target's call returned or raised; its answer is not recorded"),
    ("effect:after-ack", "key", "acknowledged is durable; the effect is not yet observed"),
    ("effect:before-verify", "key", "the effect was observed at the target; verified is not recorded"),
    # a step, the lease, a job
    ("step:after-start", "step", "the step's start is durable"),
    ("step:after-done", "step", "the step's completion is durable"),
    ("lease:after-acquire", "owner, epoch", "the lease is durable at its new epoch"),
    ("job:after-intent", "key", "the job's intent is durable; no process was started"),
    ("job:after-spawn", "key, pid", "the job's process runs; its pid is not recorded"),
)

WINDOW_NAMES = frozenset(name for name, _, _ in WINDOWS)


def check_window(name: str) -> str:
    """``name`` if it is a window of the table; else ``ValueError`` (so a misspelt window fails, never waits
    forever)."""
    if name not in WINDOW_NAMES:
        raise ValueError(f"unknown window {name!r}; see runner.base.windows.WINDOWS")
    return name


class Observer:
    """What the core tells about its windows. The base does nothing; override :meth:`reached`.

    The model is an overridable named method (like python-atomicwrites'
    ``AtomicWriter``) called at fixed points (like tenacity's before/after
    observer). The core calls :meth:`reached` synchronously, in the thread
    doing the work, holding whatever lock that work holds; an exception
    raised there propagates as a failure of the operation at that point.
    """

    def reached(self, window: str, **facts: Any) -> None:
        """Called at ``window`` (a name of :data:`WINDOWS`) with the facts the table lists."""


#: The observer of code that was given none: a shared object that does nothing.
NO_OBSERVER = Observer()

