"""What the database stores share: SQLite (:mod:`.sqlite`) and PostgreSQL (:mod:`.postgres`).

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

Each backend supplies the connection, the statement that takes the run's
lock, and which errors mean "busy, try again".
"""

import os
import random
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..envelope import canonical_json, loads_trusted, sha256_hex, validate_envelope, validate_id
from ..errors import InvalidInput, StateUnrecoverable
from .base import Finding, Store
from .codec import Ops, decode_record, finish_transition, genesis, new_identity, prepare_transition, replay

__all__ = ["SQLStore", "SCHEMA", "db_class", "list_db_runs"]


SCHEMA = (
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


class SQLStore(Store):
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

    def __init__(self, url: str, task_id: str, *, clock: Optional[Callable[[], float]] = None, jobs_root: Optional[str] = None) -> None:
        self.url = url
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
        for statement in SCHEMA:
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
        identity, identity_bytes = new_identity(task_id, plan, store.now())
        identity_text = identity_bytes.decode("utf-8")
        state = genesis(identity, sha256_hex(identity_text.encode("utf-8")))
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
                digest, _ = decode_record(str(last[0]).encode("utf-8"))
                if digest != head:
                    raise ValueError(f"journal record {revision} does not match the run's head")
        except (ValueError, KeyError, TypeError) as exc:
            raise StateUnrecoverable(f"run {self.task_id} in {self.url} is damaged: {exc}") from None
        self._state = state

    def _catch_up(self) -> None:
        """Inside the transaction: take the run's row lock and bring memory up to the committed revision."""
        locked = self._lock_row()
        if locked is None:
            raise InvalidInput(f"no run {self.task_id} in {self.url}")
        if self._state is not None and locked == (self.state["revision"], self.state["head"]):
            return
        if self._state is not None and locked[0] > self.state["revision"]:
            rows = self._all("SELECT line FROM runner_journal WHERE task_id = {m} AND rev > {m} ORDER BY rev", (self.task_id, self.state["revision"]))
            try:
                replay(self.state, [decode_record(str(r[0]).encode("utf-8")) for r in rows])
                if (self.state["revision"], self.state["head"]) == locked:
                    return
            except ValueError:
                pass
        self._load()

    def _in_transaction(self, work: Callable[[], Any]) -> Any:
        try:
            return self._retrying(work)
        except BaseException:
            if self._dirty:
                self._state = None  # memory got ahead of a transaction that did not commit: reload
            raise
        finally:
            self._dirty = False

    _dirty = False

    def _commit_locked(self, ops: Ops, epoch: int) -> None:
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
        records = [dict(body, hash=digest) for digest, body in (decode_record(str(r[0]).encode("utf-8")) for r in rows)]
        self.refresh()
        return [r for r in records if r["rev"] <= self.revision], 1

    def close(self) -> None:
        self.db.close()


def db_class(kind: str) -> type:
    """The backend class of ``sqlite`` or ``postgresql``, imported only when asked for."""
    if kind == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore
    from .postgres import PostgresStore

    return PostgresStore


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
