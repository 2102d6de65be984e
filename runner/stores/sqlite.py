"""The SQLite store: many runs in one database file, for several worker processes on one host.

WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` (the write lock is taken
before anything is read), a busy timeout, and a bounded retry with jittered
backoff while the database stays locked. The shared SQL logic is
:class:`runner.stores.sql.SQLStore`.
"""

import os
import sqlite3
from typing import Any

from ..errors import InvalidInput
from .sql import SCHEMA, SQLStore

__all__ = ["SQLiteStore"]


class SQLiteStore(SQLStore):
    """Runs in one SQLite file, shared by worker processes on one host."""

    mark = "?"

    def _connect(self) -> Any:
        path = self.url[len("sqlite:"):] if self.url.startswith("sqlite:") else self.url
        if not path:
            raise InvalidInput("sqlite: needs a file path, e.g. sqlite:runs.db")
        self.file = os.path.abspath(path)
        # isolation_level=None: transactions are begun explicitly, so BEGIN IMMEDIATE is ours to issue.
        db = sqlite3.connect(self.file, timeout=5.0, isolation_level=None, check_same_thread=False)
        os.chmod(self.file, 0o600)
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise InvalidInput(f"{self.file}: SQLite refused WAL mode ({mode})")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _default_jobs_root(self) -> str:
        return self.file + ".jobs"

    def _schema(self) -> None:
        self._retrying(lambda: [self._exec(s) for s in SCHEMA])

    def _begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def _is_busy(self, exc: Exception) -> bool:
        message = str(exc).lower()
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in message or "busy" in message)
