"""The PostgreSQL store: runs shared by workers on several hosts. Needs ``psycopg`` (version 3).

``SELECT ... FOR UPDATE`` on the run's row holds the run's lock for the
transaction. ``psycopg`` is imported only when such a store is opened. The
shared SQL logic is :class:`runner.stores.sql.SQLStore`.
"""

import re
from typing import Any, Optional, Tuple

from ..errors import InvalidInput
from .sql import SCHEMA, SQLStore

__all__ = ["PostgresStore"]


class PostgresStore(SQLStore):
    """Runs in PostgreSQL, shared by workers on several hosts. Needs ``psycopg`` (version 3)."""

    mark = "%s"

    def _connect(self) -> Any:
        try:
            import psycopg  # an optional extra: imported only when a postgresql:// store is opened
        except ImportError:
            raise InvalidInput("a postgresql:// store needs psycopg 3 (pip install 'psycopg[binary]'); the file and SQLite stores need nothing") from None
        try:
            return psycopg.connect(self.url, autocommit=False)
        except psycopg.Error as exc:
            raise InvalidInput(f"cannot connect to {re.sub(r'//[^@/]*@', '//***@', self.url)}: {exc}".strip()) from None

    def _begin(self) -> None:
        """psycopg opens a transaction with the first statement; the row lock follows."""

    def _lock_row(self) -> Optional[Tuple[int, str]]:
        row = self._one("SELECT revision, head FROM runner_runs WHERE task_id = {m} FOR UPDATE", (self.task_id,))
        return (int(row[0]), str(row[1])) if row else None

    def _is_busy(self, exc: Exception) -> bool:
        code = getattr(getattr(exc, "diag", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
        return code in ("40001", "40P01", "55P03")  # serialization failure, deadlock, lock not available

    def _schema(self) -> None:
        def create() -> None:
            # One creator at a time: concurrent CREATE TABLE IF NOT EXISTS can collide.
            self._exec("SELECT pg_advisory_xact_lock(7741002)")
            for statement in SCHEMA:
                self._exec(statement)

        self._retrying(create)
