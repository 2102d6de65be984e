"""The SQLite store: many runs in one database file, for several worker processes on one host.

WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` (the write lock is taken
before anything is read), a busy timeout, and a bounded retry with jittered
backoff while the database stays locked. The shared SQL logic is
:class:`runner.stores.sql.SQLStore`.
"""

import os
import sqlite3
import urllib.parse
from typing import Any, List

from ..base.errors import InvalidInput, RunnerError, StateUnrecoverable
from .sql import SQLStore

__all__ = ["SQLiteStore"]


class SQLiteStore(SQLStore):
    """Runs in one SQLite file, shared by worker processes on one host.

    Only ``init`` creates the database file; every other use needs it to
    exist, so a mistyped path is an error, not a new empty database. A worker
    that dies inside a transaction releases the database's write lock with
    its process; one that is stopped (SIGSTOP) holds it until it continues,
    and writers waiting on it give up after ``lock_wait`` seconds.
    """

    kind = "sqlite"
    mark = "?"

    def _connect(self) -> Any:
        self.file = _path_of(self.url)
        if os.path.isdir(self.file):
            raise InvalidInput(f"{self.file} is a folder, not a SQLite database file")
        if not self.creating and not os.path.exists(self.file):
            raise InvalidInput(f"no SQLite database at {self.file} (start a run there with init)")
        is_new = not os.path.exists(self.file)
        uri = "file:" + urllib.parse.quote(self.file) + ("?mode=rwc" if self.creating else "?mode=rw")
        db = None
        try:
            # isolation_level=None: transactions are begun explicitly, so BEGIN IMMEDIATE is ours to issue.
            # Opening waits out a database held locked (a connection checkpointing as it closes, or recovering the
            # log) for lock_wait, as _retrying does for a transaction; after that each statement waits one second
            # and _retrying's own loop keeps the bound.
            db = sqlite3.connect(uri, uri=True, timeout=self.lock_wait, isolation_level=None, check_same_thread=False)
            if is_new:
                os.chmod(self.file, 0o600)
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=1000")
        except BaseException as exc:
            if db is not None:
                db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise self._failure(exc) from None
            raise
        if str(mode).lower() != "wal":
            db.close()
            raise InvalidInput(f"{self.file}: SQLite refused WAL mode ({mode})")
        return db

    def _where(self) -> str:
        return getattr(self, "file", None) or self.url

    @classmethod
    def _missing(cls, url: str) -> bool:
        return not os.path.exists(_path_of(url))

    def _failure(self, exc: Exception) -> RunnerError:
        if self._is_busy(exc):
            return self._still_locked()
        message = " ".join(str(exc).split())[:300]
        if isinstance(exc, sqlite3.OperationalError) and "unable to open" in message:
            return InvalidInput(f"cannot open the SQLite database {self._where()}: {message}")
        if isinstance(exc, sqlite3.DatabaseError):
            return StateUnrecoverable(f"the SQLite database {self._where()} is damaged or not a database: {message}",
                                      store=self._where())
        return super()._failure(exc)

    def _default_jobs_root(self) -> str:
        return self.file + ".jobs"

    def _columns(self, table: str) -> List[str]:
        return [str(row[1]) for row in self._all(f"PRAGMA table_info({table})")]

    def _begin(self, write: bool) -> None:
        self.db.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _is_driver_error(self, exc: Exception) -> bool:
        return isinstance(exc, sqlite3.Error)

    def _is_busy(self, exc: Exception) -> bool:
        message = str(exc).lower()
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in message or "busy" in message)


def _path_of(url: str) -> str:
    path = url[len("sqlite:"):] if url.startswith("sqlite:") else url
    if not path:
        raise InvalidInput("sqlite: needs a file path, e.g. sqlite:runs.db")
    return os.path.abspath(path)
