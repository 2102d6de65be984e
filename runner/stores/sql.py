"""Run stores on a database: SQLite (standard library) and PostgreSQL (psycopg 3, optional).

They keep the same envelope, the same hash-chained journal records and the
same ``transact`` contract as the file store (:class:`runner.stores.file.RunStore`),
so every verb and the whole protocol run unchanged on them. What changes is
where the atomicity comes from: one database transaction holds the row lock
of the run, the catch-up with what other workers committed, the ``decide``
function (and so the lease and fencing check), the journal row, and the rows
the transition changed. A write carrying an older epoch is refused inside
that transaction and changes nothing.

Tables (one database holds many runs)::

    runner_runs     task_id, identity, envelope (without effects), revision, head
    runner_effects  task_id, key, effect          one row per effect
    runner_journal  task_id, rev, line            one row per transition, hash-chained

A transition rewrites the run's envelope row and the effect rows its
operations touch, never the whole ledger, so its cost does not grow with the
number of effects. Journal rows are kept; ``events`` can replay them all.

* SQLite: WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` (the write lock is
  taken before anything is read), a busy timeout, and a bounded retry with
  jittered backoff when the database stays locked. Several worker processes
  on one host.
* PostgreSQL: ``SELECT ... FOR UPDATE`` on the run's row. Workers on several
  hosts. ``psycopg`` is imported only when such a store is opened.
"""

import os
import random
import re
import sqlite3
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..envelope import canonical_json, content_digest, loads_trusted, sha256_hex, validate_envelope, validate_id
from ..errors import InvalidInput, StateUnrecoverable
from .file import CommitThenRaise, Finding, StateView, _decode_record, _genesis, _replay, finish_transition, prepare_transition
from ..windows import NO_HOOKS, Hooks

__all__ = ["SQLStore", "SQLiteStore", "PostgresStore", "db_class", "list_db_runs"]

Ops = List[List[Any]]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runner_runs (task_id TEXT PRIMARY KEY, identity TEXT NOT NULL, envelope TEXT NOT NULL, revision BIGINT NOT NULL, head TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS runner_effects (task_id TEXT NOT NULL, key TEXT NOT NULL, effect TEXT NOT NULL, PRIMARY KEY (task_id, key))",
    "CREATE TABLE IF NOT EXISTS runner_journal (task_id TEXT NOT NULL, rev BIGINT NOT NULL, line TEXT NOT NULL, PRIMARY KEY (task_id, rev))",
)


def _split(state: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    """The envelope row (effects left out) and the effects."""
    envelope = dict(state)
    effects = envelope.pop("effects")
    return canonical_json(envelope).decode("utf-8"), effects


def _touched(ops: Sequence[List[Any]]) -> Tuple[bool, Optional[set]]:
    """Which effect rows the operations touch; ``None`` when the whole ledger was replaced."""
    keys: set = set()
    for op in ops:
        path = op[1]
        if path[0] == "effects":
            if len(path) == 1:
                return True, None
            keys.add(path[1])
    return True, keys


class SQLStore(StateView):
    """The database store's template: subclasses supply the connection and the locking statement.

    Same public surface as :class:`runner.stores.file.RunStore`: ``create``,
    ``open``, ``state``, ``revision``, ``transact``, ``commit``,
    ``refresh``, ``records_after``, ``clock``, ``path`` (a local folder for
    job files), ``findings``, and ``compact``/``repair`` (nothing to do).
    """

    #: SQL placeholder of the driver.
    mark = "?"
    #: How many times a transaction is retried when the database stays busy.
    busy_retries = 8

    def __init__(self, url: str, task_id: str, *, clock: Optional[Callable[[], float]] = None, jobs_root: Optional[str] = None,
                 hooks: Optional[Hooks] = None) -> None:
        self.url = url
        self.hooks = hooks if hooks is not None else NO_HOOKS
        self.task_id = validate_id(task_id, "task id")
        self.clock = clock or time.time
        self.durability = "sync"
        self.findings: List[Finding] = []
        self._state: Optional[Dict[str, Any]] = None
        self.db = self._connect()
        self.path = os.path.join(jobs_root or self._default_jobs_root(), "j" + sha256_hex(task_id.encode())[:16])
        self._schema()

    # -- driver hooks ----------------------------------------------------------------
    def _connect(self) -> Any:
        raise NotImplementedError

    def _default_jobs_root(self) -> str:
        return os.path.abspath(".runner-jobs")

    def _begin(self) -> None:
        """Start a write transaction holding the run's row lock (or the database's)."""
        raise NotImplementedError

    def _lock_row(self) -> Optional[Tuple[int, str]]:
        row = self._one("SELECT revision, head FROM runner_runs WHERE task_id = {m}", (self.task_id,))
        return (int(row[0]), str(row[1])) if row else None

    def _is_busy(self, exc: Exception) -> bool:
        return False

    def _upsert_effect(self) -> str:
        return "INSERT INTO runner_effects (task_id, key, effect) VALUES ({m}, {m}, {m}) ON CONFLICT (task_id, key) DO UPDATE SET effect = excluded.effect"

    # -- SQL helpers -------------------------------------------------------------------
    def _sql(self, text: str) -> str:
        return text.replace("{m}", self.mark)

    def _exec(self, text: str, params: Sequence[Any] = ()) -> Any:
        cur = self.db.cursor()
        cur.execute(self._sql(text), tuple(params))
        return cur

    def _one(self, text: str, params: Sequence[Any] = ()) -> Optional[Tuple[Any, ...]]:
        return self._exec(text, params).fetchone()

    def _all(self, text: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        return list(self._exec(text, params).fetchall())

    def _schema(self) -> None:
        for statement in _SCHEMA:
            self._exec(statement)
        self.db.commit()

    def _retrying(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` in a transaction; retry (bounded, jittered) while the database is busy."""
        for attempt in range(self.busy_retries + 1):
            try:
                self._begin()
                try:
                    out = work()
                except BaseException:
                    self.db.rollback()
                    raise
                self.db.commit()
                return out
            except Exception as exc:
                if not self._is_busy(exc) or attempt == self.busy_retries:
                    raise
                time.sleep(random.uniform(0, min(1.0, 0.01 * 2 ** attempt)))
        raise AssertionError("unreachable")

    # -- public surface ---------------------------------------------------------------------
    @classmethod
    def create(cls, url: str, task_id: str, plan: Dict[str, Any], **options: Any) -> "SQLStore":
        """Start a new run; refuse if the database already holds one with this task id."""
        if not isinstance(plan, dict):
            raise InvalidInput("the plan must be a JSON object")
        store = cls(url, task_id, **options)
        identity = {"created_at": store.now(), "format": "runner-run/1", "plan": plan, "plan_digest": content_digest(plan), "schema_version": 1, "task_id": task_id}
        identity_text = canonical_json(identity).decode("utf-8") + "\n"
        state = _genesis(identity, sha256_hex(identity_text.encode("utf-8")))
        envelope, _ = _split(state)

        def insert() -> None:
            if store._one("SELECT 1 FROM runner_runs WHERE task_id = {m}", (task_id,)):
                raise InvalidInput(f"refusing to start a new run: {url} already holds run {task_id}")
            store._exec("INSERT INTO runner_runs (task_id, identity, envelope, revision, head) VALUES ({m}, {m}, {m}, 0, {m})", (task_id, identity_text, envelope, state["head"]))

        try:
            store._retrying(insert)
        except BaseException:
            store.close()
            raise
        store._state = state
        return store

    @classmethod
    def open(cls, url: str, task_id: str, **options: Any) -> "SQLStore":
        store = cls(url, task_id, **options)
        try:
            store._retrying(store._load)
        except BaseException:
            store.close()
            raise
        return store

    def _load(self) -> None:
        row = self._one("SELECT identity, envelope, revision, head FROM runner_runs WHERE task_id = {m}", (self.task_id,))
        if row is None:
            raise InvalidInput(f"no run {self.task_id} in {self.url} (start one with init)")
        identity_text, envelope_text, revision, head = row
        try:
            identity = loads_trusted(identity_text)
            state = loads_trusted(envelope_text)
            state["effects"] = {key: loads_trusted(text) for key, text in self._all("SELECT key, effect FROM runner_effects WHERE task_id = {m}", (self.task_id,))}
            validate_envelope(state)
            if state["revision"] != int(revision) or state["head"] != head or state["task_id"] != identity["task_id"]:
                raise ValueError("the run row disagrees with its envelope")
            if int(revision) == 0:
                if head != sha256_hex(identity_text.encode("utf-8")):
                    raise ValueError("the head at revision 0 is not the identity's digest")
            else:
                last = self._one("SELECT line FROM runner_journal WHERE task_id = {m} AND rev = {m}", (self.task_id, int(revision)))
                if last is None:
                    raise ValueError(f"the journal lacks revision {revision}")
                digest, _ = _decode_record(str(last[0]).encode("utf-8"))
                if digest != head:
                    raise ValueError(f"journal record {revision} does not match the run's head")
        except (ValueError, KeyError, TypeError) as exc:
            raise StateUnrecoverable(f"run {self.task_id} in {self.url} is damaged: {exc}") from None
        self._state = state

    def _catch_up(self, locked: Optional[Tuple[int, str]]) -> None:
        """Inside the transaction: bring memory up to the committed revision."""
        if locked is None:
            raise InvalidInput(f"no run {self.task_id} in {self.url}")
        if self._state is not None and locked == (self.state["revision"], self.state["head"]):
            return
        if self._state is not None and locked[0] > self.state["revision"]:
            rows = self._all("SELECT line FROM runner_journal WHERE task_id = {m} AND rev > {m} ORDER BY rev", (self.task_id, self.state["revision"]))
            try:
                _replay(self.state, [_decode_record(str(r[0]).encode("utf-8")) for r in rows])
                if (self.state["revision"], self.state["head"]) == locked:
                    return
            except ValueError:
                pass
        self._load()

    def refresh(self) -> Dict[str, Any]:
        self._retrying(lambda: self._catch_up(self._lock_row()))
        return self.state

    def transact(self, decide: Callable[[Dict[str, Any]], Ops], *, epoch: int = 0) -> Dict[str, Any]:
        """``decide(state)`` and its commit in one database transaction (see the module docs)."""
        refusal: List[BaseException] = []

        def work() -> None:
            self._catch_up(self._lock_row())
            try:
                ops = decide(self.state)
            except CommitThenRaise as exc:
                ops, refusal[:] = exc.ops, [exc.error]
            if ops:
                self._commit_ops(ops, epoch)
                self.hooks.reached("store:before-db-commit")

        try:
            self._retrying(work)
        except BaseException:
            self._state = None if self._state is not None and self._dirty else self._state
            raise
        finally:
            committed, self._dirty = self._dirty, False
        if committed:
            self.hooks.reached("store:after-db-commit")
        if refusal:
            raise refusal[0] from None
        return self.state

    _dirty = False

    def commit(self, ops: Ops, *, epoch: int = 0) -> Dict[str, Any]:
        return self.transact(lambda _state: ops, epoch=epoch)

    def _commit_ops(self, ops: Ops, epoch: int) -> None:
        state = self.state
        prepared = prepare_transition(state, ops, epoch, self.now())
        # From here on memory is ahead of the database until the commit: a
        # failure makes the next use reload.
        self._dirty = True
        finish_transition(state, prepared)
        rev, digest = prepared.body["rev"], prepared.digest
        envelope, effects = _split(state)
        self._exec("INSERT INTO runner_journal (task_id, rev, line) VALUES ({m}, {m}, {m})", (self.task_id, rev, prepared.line[:-1].decode("utf-8")))
        self._exec("UPDATE runner_runs SET envelope = {m}, revision = {m}, head = {m} WHERE task_id = {m}", (envelope, rev, digest, self.task_id))
        _, keys = _touched(prepared.ops)
        if keys is None:
            self._exec("DELETE FROM runner_effects WHERE task_id = {m}", (self.task_id,))
            keys = set(effects)
        for key in sorted(keys):
            if key in effects:
                self._exec(self._upsert_effect(), (self.task_id, key, canonical_json(effects[key]).decode("utf-8")))
            else:
                self._exec("DELETE FROM runner_effects WHERE task_id = {m} AND key = {m}", (self.task_id, key))

    def records_after(self, after: int) -> Tuple[List[Dict[str, Any]], int]:
        rows = self._retrying(lambda: self._all("SELECT line FROM runner_journal WHERE task_id = {m} AND rev > {m} ORDER BY rev", (self.task_id, after)))
        records = [dict(body, hash=digest) for digest, body in (_decode_record(str(r[0]).encode("utf-8")) for r in rows)]
        self.refresh()
        return [r for r in records if r["rev"] <= self.revision], 1

    def compact(self) -> None:
        """Nothing to compact: the database keeps the rows."""

    def repair(self, *, epoch: int = 0) -> List[Finding]:
        return []

    def close(self) -> None:
        self.db.close()


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
        self._retrying(lambda: [self._exec(s) for s in _SCHEMA])

    def _begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def _is_busy(self, exc: Exception) -> bool:
        message = str(exc).lower()
        return isinstance(exc, sqlite3.OperationalError) and ("locked" in message or "busy" in message)


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
            for statement in _SCHEMA:
                self._exec(statement)

        self._retrying(create)


def db_class(kind: str) -> type:
    return SQLiteStore if kind == "sqlite" else PostgresStore


def list_db_runs(kind: str, url: str) -> List[str]:
    """Task ids of the runs a database store holds."""
    cls = db_class(kind)
    store = cls.__new__(cls)
    store.url = url
    store.db = store._connect()
    try:
        store._schema()
        return [str(r[0]) for r in store._all("SELECT task_id FROM runner_runs ORDER BY task_id")]
    finally:
        store.db.close()
