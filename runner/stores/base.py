"""The store interface: what every backend (file, SQLite, PostgreSQL) provides, and the loop they share.

A store holds one run's durable state and changes it only by transitions:
:meth:`Store.transact` runs ``decide(state)`` on the latest committed state
while holding the run's write lock, and makes the operations it returns
durable as one journal record before returning. That loop is written once,
here; a backend supplies the three steps it is made of (like filelock's
``BaseFileLock`` with ``_acquire``/``_release`` per platform):

* :meth:`Store._in_transaction` runs a callable while holding the run's lock
  (the file store: ``flock`` on the run's lock file; the database stores: a
  transaction holding the run's row lock, committed when the callable returns
  and rolled back when it raises);
* :meth:`Store._catch_up` brings memory up to what other processes committed;
* :meth:`Store._commit_locked` makes one transition durable.
"""

import abc
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..envelope import format_time
from ..errors import StateUnrecoverable
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
    """One run's durable state, whatever keeps it. Open with ``open``, start with ``create``.

    ``state`` is the envelope at the store's current revision; treat it as
    read-only and change it only through :meth:`transact` or :meth:`commit`.
    ``clock`` (seconds since the epoch) is injectable. ``path`` is a local
    folder for the run's job files. ``findings`` lists what the last load
    noted or repaired.
    """

    _state: Optional[Dict[str, Any]] = None
    clock: Callable[[], float]
    path: str
    findings: List[Finding]

    # -- what a backend supplies ------------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def create(cls, location: str, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None, **options: Any) -> "Store":
        """Start a new run; refuse (changing nothing) if one is there.

        ``workspace_base``: the absolute folder a relative ``workspace`` resolves
        against, kept in the run's identity (see :func:`runner.stores.codec.new_identity`).
        """

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
        """Journal records with revision > ``after`` that the store still holds, and the oldest it holds."""

    def compact(self) -> None:
        """Fold the journal into a snapshot, where the backend has one."""

    def repair(self, *, epoch: int = 0) -> List[Finding]:
        """Perform the lossless repairs the last load found; return what was done."""
        return []

    def close(self) -> None:
        """Release what the store holds open."""

    # -- the shared surface -----------------------------------------------------------
    @property
    def state(self) -> Dict[str, Any]:
        if self._state is None:
            raise StateUnrecoverable("the store has no loaded state")
        return self._state

    @property
    def revision(self) -> int:
        return int(self.state["revision"])

    def now(self) -> str:
        return format_time(self.clock())

    def transact(self, decide: Callable[[Dict[str, Any]], Ops], *, epoch: int = 0) -> Dict[str, Any]:
        """Run ``decide(state)`` under the lock on current state and commit its operations.

        ``decide`` sees the latest durable state, may raise to refuse (nothing
        is written) or raise :class:`CommitThenRaise` to record the refusal,
        and returns the operations to commit (an empty list commits nothing).
        The call returns after the record is durable.
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
        """Commit ``ops`` as one transition; shorthand for ``transact(lambda s: ops)``."""
        return self.transact(lambda _state: ops, epoch=epoch)

    def refresh(self) -> Dict[str, Any]:
        """Catch up with transitions other processes committed; return the state."""
        self._in_transaction(self._catch_up)
        return self.state
