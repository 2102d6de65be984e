"""The PostgreSQL store: runs shared by workers on several hosts. Needs ``psycopg`` (version 3).

``SELECT ... FOR UPDATE`` on the run's row holds the run's lock for the
transaction. ``psycopg`` is imported only when such a store is opened. The
shared SQL logic is :class:`runner.stores.sql.SQLStore`.

How long a dead or stuck worker can hold a run's lock is bounded by settings
every session of this store makes (the PostgreSQL manual, "Client Connection
Defaults" and "Connections and Authentication"):

* ``idle_in_transaction_session_timeout``: the server ends a session that sits
  inside a transaction without sending anything for ``lock_hold`` seconds
  (default 5): a worker that was stopped (SIGSTOP, a paused VM) or hung
  between two statements loses its transaction and its row lock. Nothing of
  it committed; when it continues, its next statement fails, and the store
  tries the whole transaction again on a new connection, where fencing
  refuses it if its lease was taken over meanwhile.
* ``client_connection_check_interval`` (PostgreSQL 14 and later): while a
  statement runs, the server checks every second that the client is still
  there, so a client that dies mid-statement does not keep it running.
* TCP keepalives on both ends: a host that vanished (power loss, network
  cut) is noticed within about 11 s instead of the kernel's two hours.
* ``lock_timeout``: a writer waits at most one second per try for a row
  lock, and tries again (jittered) for ``lock_wait`` seconds in all (default
  15) before answering ``retry-later``.

A worker killed outright (SIGKILL) releases its lock at once: the kernel
closes its socket and the server rolls the transaction back.
"""

import re
from typing import Any, List, Optional, Tuple

from ..base.canonical import sha256_hex
from ..base.errors import InvalidInput, RunnerError, StateUnrecoverable
from .sql import SQLStore

__all__ = ["PostgresStore"]

#: SQLSTATE codes meaning "locked by someone else, try again": serialization
#: failure, deadlock detected, lock not available (lock_timeout).
_BUSY = ("40001", "40P01", "55P03")
#: SQLSTATE codes meaning "the session is gone": idle-in-transaction timeout,
#: administrator or server shutdown, connection failure.
_GONE = ("25P03", "57P01", "57P02", "57P03", "08000", "08003", "08006")


class PostgresStore(SQLStore):
    """Runs in PostgreSQL, shared by workers on several hosts. See the module docs for the lock bounds."""

    kind = "postgresql"
    mark = "%s"

    def __init__(self, url: str, task_id: str, *, lock_hold: float = 5.0, **options: Any) -> None:
        """:param lock_hold: seconds the server lets a session sit idle inside a transaction."""
        self.lock_hold = float(lock_hold)
        super().__init__(url, task_id, **options)

    def _connect(self) -> Any:
        try:
            import psycopg  # an optional extra: imported only when a postgresql:// store is opened
        except ImportError:
            raise InvalidInput("a postgresql:// store needs psycopg 3 (pip install 'psycopg[binary]'); the file and "
                               "SQLite stores need nothing") from None
        settings = {
            "idle_in_transaction_session_timeout": max(1, int(self.lock_hold * 1000)),
            "lock_timeout": 1000,
            "tcp_keepalives_idle": 5,
            "tcp_keepalives_interval": 2,
            "tcp_keepalives_count": 3,
        }
        options = " ".join(f"-c {name}={value}" for name, value in settings.items())
        db = None
        try:
            db = psycopg.connect(self.url, autocommit=False, connect_timeout=10, options=options,
                                 keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3)
            if db.info.server_version >= 140000:
                db.execute("SET client_connection_check_interval = 1000")
            db.commit()
        except BaseException as exc:
            if db is not None:
                db.close()
            if isinstance(exc, psycopg.Error):
                raise InvalidInput(f"cannot connect to {self._where()}: "
                                   f"{' '.join(str(exc).split())[:300]}".strip()) from None
            raise
        return db

    def _retry_after(self) -> float:
        return self.lock_hold  # by then the server has ended a session stuck inside its transaction

    def _where(self) -> str:
        return re.sub(r"//[^@/]*@", "//***@", self.url)

    def _columns(self, table: str) -> List[str]:
        rows = self._all("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND "
                         "table_name = {m}", (table,))
        return [str(r[0]) for r in rows]

    def _begin(self, write: bool) -> None:
        """psycopg opens a transaction with the first statement; a writer's row lock follows.

        A reader's statements see one snapshot (repeatable read), so the rows it
        checks against each other are never from two revisions.
        """
        if not write:
            self.db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def _lock_row(self) -> Optional[Tuple[int, str]]:
        row = self._one("SELECT revision, head FROM runner_runs WHERE task_id = {m} FOR UPDATE", (self.task_id,))
        return (int(row[0]), str(row[1])) if row else None

    def _is_driver_error(self, exc: Exception) -> bool:
        import psycopg

        return isinstance(exc, psycopg.Error)

    def _is_busy(self, exc: Exception) -> bool:
        return _sqlstate(exc) in _BUSY

    def _is_disconnect(self, exc: Exception) -> bool:
        # The server ended the session (idle in transaction too long, shut down, admin) or the link broke.
        return bool(self.db.closed or getattr(self.db, "broken", False)) or _sqlstate(exc) in _GONE

    def _failure(self, exc: Exception) -> RunnerError:
        return StateUnrecoverable(f"run {self.task_id} in {self._where()}: PostgreSQL refused: "
                                  f"{' '.join(str(exc).split())[:300]}")

    def identity(self) -> str:
        """What names this run however its database's URL is spelled: the database's name, the digest of the run's
        identity record (written once, when the run was made) and the task id.

        The in-flight registry names the run's folder from it (:func:`runner.calls.inflight.registry_for`), so workers
        that reach one database as ``localhost`` and as ``127.0.0.1`` share their calls in flight. The server's
        ``system_identifier`` is not part of it: only some roles may read it, and a name that depends on the
        worker's role would split the registry as the URL's spelling did.

        :raises InvalidInput: the run is not in the database.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        query = "SELECT current_database(), identity FROM runner_runs WHERE task_id = {m}"
        row = self._retrying(lambda: self._one(query, (self.task_id,)), write=False)
        if row is None:
            raise InvalidInput(f"no run {self.task_id} in {self._where()} (start one with init)")
        return "\n".join(("postgresql", str(row[0]), sha256_hex(str(row[1]).encode("utf-8")), self.task_id))

    def _create_tables(self) -> None:
        # One creator at a time: concurrent CREATE TABLE IF NOT EXISTS can collide.
        self._exec("SELECT pg_advisory_xact_lock(7741002)")
        super()._create_tables()


def _sqlstate(exc: BaseException) -> Optional[str]:
    return getattr(getattr(exc, "diag", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
