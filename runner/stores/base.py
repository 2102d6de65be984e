"""The store interface: what every backend (file, SQLite, PostgreSQL) provides, and the loop they share.

A store holds one run's durable state and changes it only by transitions:
:meth:`Store.transact` runs ``decide(state)`` on the latest committed state
while holding the run's write lock, and makes the operations it returns
durable as one journal record before returning. That loop is written once,
here; a backend supplies how a run is created, opened and listed
(:meth:`Store.create`, :meth:`Store.open`, :meth:`Store.list_runs`) and the
three steps the loop is made of (like filelock's ``BaseFileLock`` with
``_acquire``/``_release`` per platform):

* :meth:`Store._in_transaction` runs a callable while holding the run's lock
  (the file store: ``flock`` on the run's folder; the database stores: a
  transaction holding the run's row lock, committed when the callable returns
  and rolled back when it raises);
* :meth:`Store._catch_up` brings memory up to what other processes committed;
* :meth:`Store._commit_locked` makes one transition durable.
"""

import abc
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..base.times import format_time
from ..base.errors import StateUnrecoverable
from .codec import Ops

__all__ = ["Store", "CommitThenRaise", "Finding"]


class CommitThenRaise(Exception):
    """Raised by a ``decide`` function: commit ``ops`` (a recorded refusal), then raise ``error``."""

    def __init__(self, ops: Ops, error: BaseException) -> None:
        super().__init__(str(error))
        self.ops = ops
        self.error = error


class Finding(NamedTuple):
    """One fact a load or a check established. ``level``: ``note``, ``repairable`` or ``damage``."""

    level: str
    code: str
    message: str


class Store(abc.ABC):
    """One run's durable state, whatever keeps it. Open with :meth:`open`, start with :meth:`create`.

    ``state`` is the envelope at the store's current revision; treat it as
    read-only and change it only through :meth:`transact` or :meth:`commit`.
    ``clock`` (seconds since the epoch) is injectable. ``path`` is a local
    folder for the run's job files. ``findings`` lists what the last load
    noted or repaired.

    A backend is a row of the table in :mod:`runner.stores`, which names its
    URL schemes and imports its module only when such a URL is used; the
    ``location`` its class methods take, first and by position (each backend
    names it as it likes), is what :func:`runner.stores.parse_store_url`
    gives for the URL (a folder for ``file:``, the whole URL for a database).
    The keyword ``options`` of :meth:`open` and :meth:`create` are the
    backend's own (its constructor's parameters); an unknown one is a ``TypeError``.
    """

    _state: Optional[Dict[str, Any]] = None
    clock: Callable[[], float]
    path: str
    findings: List[Finding]
    #: What the last :meth:`records_after` found breaking the history's chain (none where the backend keeps every
    #: record).
    history_findings: Tuple[Finding, ...] = ()

    # -- what a backend supplies ------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def create(cls, location: str, /, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None,
               **options: Any) -> "Store":
        """Start a new run at revision 0; refuse, changing nothing, if one is there.

        Of two concurrent creates of one run, exactly one succeeds.

        :param location: where the run is kept (see the class docs).
        :param task_id: the run's id (see :func:`runner.base.values.validate_id`).
        :param plan: the run's plan, a JSON object, kept in its identity.
        :param workspace_base: the absolute folder a relative ``workspace`` resolves
            against, kept in the run's identity (see :func:`runner.stores.codec.new_identity`).
        :returns: the store, holding the new run's state.
        :raises InvalidInput: the task id or the plan is malformed, or a run (or
            what is left of one) is already there.
        :raises StateUnrecoverable: the backend's medium is damaged (a database
            file that is not a database).
        """

    @classmethod
    @abc.abstractmethod
    def open(cls, location: str, /, task_id: Optional[str] = None, **options: Any) -> "Store":
        """Load a run, checked against its journal; damage is never loaded as if it were state.

        :param location: where the run is kept (see the class docs).
        :param task_id: which run: required where one location holds many
            runs; where it holds one, the run there must be this one when given.
        :returns: the store, holding the latest state its journal proves.
        :raises InvalidInput: no such run, no task id where one is required, or
            another run than ``task_id`` at ``location``.
        :raises StateUnrecoverable: the run's state is damaged beyond an exact
            rebuild (a file store moves its files into ``quarantine/`` first).
        :raises RetryLater: a database stayed locked for the backend's ``lock_wait``.
        """

    @classmethod
    @abc.abstractmethod
    def list_runs(cls, location: str, /, **options: Any) -> List[str]:
        """The task ids of the runs a collection holds, sorted.

        :param location: the collection: for a file store the folder that holds
            one folder per run, for a database the database.
        :returns: the task ids; empty when the collection does not exist.
        :raises InvalidInput: ``location`` cannot be read as a collection of this backend.
        """

    @classmethod
    def run_location(cls, location: str, task_id: str) -> str:
        """Where :meth:`open` finds run ``task_id`` of the collection at ``location``.

        A backend that keeps runs by task id (a database) is opened at the
        collection's own location, which this default returns.

        :returns: the location to pass to :meth:`open` with ``task_id``.
        """
        return location

    @abc.abstractmethod
    def _in_transaction(self, work: Callable[[], Any]) -> Any:
        """Run ``work()`` holding the run's write lock; its writes commit together or not at all."""

    @abc.abstractmethod
    def _catch_up(self) -> None:
        """Inside a transaction: bring ``state`` up to the latest committed revision."""

    @abc.abstractmethod
    def _commit_locked(self, ops: Ops, epoch: int) -> None:
        """Inside a transaction: make ``ops`` durable as the next revision and apply them to ``state``."""

    @abc.abstractmethod
    def records_after(self, after: int) -> Tuple[List[Dict[str, Any]], int]:
        """The journal records after revision ``after`` that the store holds, oldest first.

        Every backend keeps every record (the file store in its history
        folder), unless the run's retention dropped the oldest: an observer
        that asks for more than is held learns it from the second value and
        re-reads the state instead. Records the store should hold and cannot
        read back are left out and said in :attr:`history_findings`.

        :param after: the last revision the caller has seen (``-1`` or ``0`` for all).
        :returns: ``(records, oldest)``: each record is the journal body
            (``rev``, ``prev``, ``epoch``, ``at``, ``ops``) with its ``hash``,
            up to the store's current revision; ``oldest`` is the lowest
            revision held (the current revision plus one when none is).
        :raises StateUnrecoverable: catching up found the run damaged.
        :raises RetryLater: a database stayed locked for the backend's ``lock_wait``.
        """

    def compact(self) -> None:
        """Fold the journal into a snapshot, where the backend has one; nothing otherwise.

        :raises OSError: a file store could not write the snapshot (the run
            stays loadable from what was left).
        """

    def repair(self, *, epoch: int = 0) -> List[Finding]:
        """Perform the lossless repairs a load found, recorded as one transition.

        :param epoch: the fencing epoch written on the repair's record.
        :returns: the findings repaired (empty when there was nothing to do).
        :raises StateUnrecoverable: the run is damaged beyond an exact rebuild.
        """
        return []

    def close(self) -> None:
        """Release what the store holds open (a database connection). The store is not used afterwards."""

    # -- the shared surface -----------------------------------------------------------
    @property
    def state(self) -> Dict[str, Any]:
        """The envelope at :attr:`revision`, as this object last loaded or wrote it.

        :raises StateUnrecoverable: no state is loaded (a failed write left memory
            unsure, and the next transaction reloads).
        """
        if self._state is None:
            raise StateUnrecoverable("the store has no loaded state")
        return self._state

    @property
    def revision(self) -> int:
        """The revision of :attr:`state`: the number of transitions committed since ``create``.

        :raises StateUnrecoverable: no state is loaded (see :attr:`state`).
        """
        return int(self.state["revision"])

    def now(self) -> str:
        """The time of the store's clock.

        :returns: the time as the envelope writes times (UTC, ISO 8601).
        """
        return format_time(self.clock())

    def transact(self, decide: Callable[[Dict[str, Any]], Ops], *, epoch: int = 0) -> Dict[str, Any]:
        """Run ``decide(state)`` under the lock on current state and commit its operations.

        ``decide`` sees the latest durable state, may raise to refuse (nothing
        is written) or raise :class:`CommitThenRaise` to record the refusal,
        and returns the operations to commit (an empty list commits nothing).
        The call returns after the record is durable. A database backend may
        call ``decide`` again when the database was busy, so it must not act
        outside the state it is given. Whatever ``decide`` raises reaches the
        caller unchanged (after the operations of a :class:`CommitThenRaise`
        are committed).

        :param decide: from the current state to the operations of one transition
            (``["set", path, value]`` and ``["del", path]``).
        :param epoch: the writer's fencing epoch, written on the record.
        :returns: the state after the transition.
        :raises InvalidInput: an operation is malformed or would leave an envelope
            that does not load; nothing is written.
        :raises StateUnrecoverable: catching up found the run damaged.
        :raises RetryLater: a database stayed locked for the backend's ``lock_wait``.
        :raises OSError: a file store could not make the record durable; the
            transition is not acknowledged and not in the journal.
        """
        refusal: List[BaseException] = []

        def work() -> None:
            refusal.clear()  # a backend may run ``work`` again after a busy database
            self._catch_up()
            try:
                ops = decide(self.state)
            except CommitThenRaise as exc:
                ops = exc.ops
                refusal.append(exc.error)
            if ops:
                self._commit_locked(ops, epoch)

        self._in_transaction(work)
        if refusal:
            raise refusal[0] from None
        return self.state

    def commit(self, ops: Ops, *, epoch: int = 0) -> Dict[str, Any]:
        """Commit ``ops`` as one transition; shorthand for ``transact(lambda s: ops)``.

        :param ops: the transition's operations (an empty list commits nothing).
        :param epoch: the writer's fencing epoch, written on the record.
        :returns: the state after the transition.
        :raises InvalidInput: an operation is malformed; nothing is written.
        :raises StateUnrecoverable: catching up found the run damaged.
        :raises RetryLater: a database stayed locked for the backend's ``lock_wait``.
        """
        return self.transact(lambda _state: ops, epoch=epoch)

    def refresh(self) -> Dict[str, Any]:
        """Catch up with transitions other processes committed.

        :returns: the latest committed state.
        :raises StateUnrecoverable: catching up found the run damaged.
        :raises RetryLater: a database stayed locked for the backend's ``lock_wait``.
        """
        self._in_transaction(self._catch_up)
        return self.state
