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
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..ledger.envelope import validate_envelope
from ..base.values import validate_id
from ..base.times import format_time
from ..base.canonical import canonical_json, loads_trusted, sha256, sha256_hex
from ..base.errors import InvalidInput, RetryLater, RunnerError, StateUnrecoverable
from ..base.windows import NO_OBSERVER, Observer
from .base import Finding, Store
from .codec import (Ops, decode_identity, decode_record, finish_transition, genesis, new_identity, prepare_transition,
                    replay)

__all__ = ["SQLStore", "SCHEMA"]


SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runner_runs (task_id TEXT PRIMARY KEY, identity TEXT NOT NULL, envelope TEXT NOT NULL, "
    "revision BIGINT NOT NULL, head TEXT NOT NULL, rows_digest TEXT)",
    "CREATE TABLE IF NOT EXISTS runner_effects (task_id TEXT NOT NULL, key TEXT NOT NULL, effect TEXT NOT NULL, "
    "PRIMARY KEY (task_id, key))",
    "CREATE TABLE IF NOT EXISTS runner_journal (task_id TEXT NOT NULL, rev BIGINT NOT NULL, line TEXT NOT NULL, "
    "PRIMARY KEY (task_id, rev))",
)


_MOD = 1 << 256


def _effect_hash(key: str, text: str) -> int:
    """One effect row's share of the rows digest."""
    return int.from_bytes(sha256(key.encode("utf-8") + b"\0" + text.encode("utf-8")).digest(), "big")


def rows_digest(envelope_text: str, effects_sum: int) -> str:
    """The digest the run row keeps of its envelope row and of every effect row.

    The effect rows enter as a sum of per-row hashes (a multiset hash), so a
    transition updates it from the rows it touches alone and its cost does not
    grow with the ledger; a deleted, added or edited row changes it.
    """
    return sha256_hex((envelope_text + "\n" + format(effects_sum % _MOD, "064x")).encode("utf-8"))


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

    The public surface is :class:`runner.stores.base.Store`'s; ``compact``
    has nothing to do, ``path`` is a local folder for job files, and the
    ``location`` of the class methods is the database's URL.
    """

    #: The backend's name in messages (the ``kind`` of :func:`runner.stores.parse_store_url`).
    kind = ""
    #: SQL placeholder of the driver.
    mark = "?"

    def __init__(
        self,
        url: str,
        task_id: str,
        *,
        clock: Optional[Callable[[], float]] = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
        monotonic: Callable[[], float] = time.monotonic,
        lock_wait: float = 15.0,
        jobs_root: Optional[str] = None,
        creating: bool = False,
        observer: Optional[Observer] = None,
    ) -> None:
        """The options of :meth:`open` and :meth:`create`.

        :param url: the database's URL.
        :param task_id: the run's id.
        :param clock: wall clock for record times and leases.
        :param sleep: how the store waits between tries while the database is busy.
        :param rand: draws the jitter of those waits (in [0, 1)).
        :param monotonic: measures ``lock_wait``.
        :param lock_wait: seconds a transaction keeps trying while the run's lock (or the
            database's) is held by someone else; then :class:`RetryLater` says so.
        :param jobs_root: the local folder under which the run's job files are kept
            (by default beside a SQLite file, else ``.runner-jobs`` in the working folder).
        :param creating: the database may be created (``init``); every other use needs it to exist.
        :param observer: receives the store's commit windows (see :mod:`runner.base.windows`).
        """
        self.url = url
        self.observer = observer if observer is not None else NO_OBSERVER
        self.task_id = validate_id(task_id, "task id")
        self.clock = clock or time.time
        self.sleep, self.rand, self.monotonic = sleep, rand, monotonic
        self.lock_wait = float(lock_wait)
        self.creating = creating
        self.durability = "sync"
        self.findings: List[Finding] = []
        self._pending: List[Finding] = []
        self._state: Optional[Dict[str, Any]] = None
        self._hashes: Dict[str, int] = {}
        self._sum = 0
        self.db = self._connect()
        self.path = os.path.join(jobs_root or self._default_jobs_root(), "j" + sha256_hex(task_id.encode())[:16])
        try:
            self._schema()
        except BaseException:  # not a database, or locked: the connection is not handed to anyone
            self.db.close()
            raise

    # -- driver seams ----------------------------------------------------------------
    def _connect(self) -> Any:
        raise NotImplementedError

    def _default_jobs_root(self) -> str:
        return os.path.abspath(".runner-jobs")

    def _begin(self, write: bool) -> None:
        """Start a transaction; a ``write`` one holds the database's write lock where the backend has one."""
        raise NotImplementedError

    def _lock_row(self) -> Optional[Tuple[int, str]]:
        row = self._one("SELECT revision, head FROM runner_runs WHERE task_id = {m}", (self.task_id,))
        return (int(row[0]), str(row[1])) if row else None

    def _retry_after(self) -> float:
        """Seconds after which a writer that found the run locked may try again."""
        return 1.0

    def _is_driver_error(self, exc: Exception) -> bool:
        """``exc`` came from the database driver (and so says something about the database)."""
        return False

    def _is_busy(self, exc: Exception) -> bool:
        """The database (or the run's row) is locked by another transaction: try again."""
        return False

    def _is_disconnect(self, exc: Exception) -> bool:
        """The connection is gone (the server ended the session): nothing of the transaction committed."""
        return False

    def _reconnect(self) -> None:
        try:
            self.db.close()
        except Exception:  # a dead connection may fail to close; it is dropped either way
            pass
        self.db = self._connect()

    def _failure(self, exc: Exception) -> RunnerError:
        """The runner's error for a driver error that is neither busy nor a lost connection."""
        return StateUnrecoverable(f"run {self.task_id} in {self._where()}: the database failed: {_one_line(exc)}")

    def _where(self) -> str:
        return self.url

    def _upsert_effect(self) -> str:
        return ("INSERT INTO runner_effects (task_id, key, effect) VALUES ({m}, {m}, {m}) ON CONFLICT (task_id, key) "
                "DO UPDATE SET effect = excluded.effect")

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
        """Create the tables (and columns) that are missing; a database that has them all is only read."""
        def complete() -> bool:
            return ("rows_digest" in self._columns("runner_runs") and
                    all(self._columns(t) for t in ("runner_effects", "runner_journal")))

        if self.creating or not self._retrying(complete, write=False):
            self._retrying(self._create_tables)

    def _create_tables(self) -> None:
        for statement in SCHEMA:
            self._exec(statement)
        if "rows_digest" not in self._columns("runner_runs"):
            self._exec("ALTER TABLE runner_runs ADD COLUMN rows_digest TEXT")  # a database from before the digest

    def _columns(self, table: str) -> List[str]:
        raise NotImplementedError

    def _retrying(self, work: Callable[[], Any], write: bool = True) -> Any:
        """Run ``work`` in one transaction; try again (jittered, within ``lock_wait``) while the database is busy.

        A lost connection is also tried again, on a new one: the server ends a
        session only before its transaction commits, so nothing of it is
        durable. Every other driver error becomes a :class:`RunnerError`.

        :raises RetryLater: the lock stayed held for ``lock_wait`` seconds.
        """
        deadline = self.monotonic() + self.lock_wait
        attempt = 0
        while True:
            try:
                self._begin(write)
                try:
                    out = work()
                except BaseException:
                    self._rollback()
                    raise
                self.db.commit()
                return out
            except Exception as exc:
                if not self._is_driver_error(exc):
                    raise  # the caller's own refusal or failure, untouched
                busy, lost = self._is_busy(exc), self._is_disconnect(exc)
                if not (busy or lost):
                    raise self._failure(exc) from None
                left = deadline - self.monotonic()
                if left <= 0:
                    if lost:
                        raise StateUnrecoverable(f"{self._where()}: the database connection keeps failing: "
                                                 f"{_one_line(exc)}") from None
                    raise self._still_locked() from None
                if lost:
                    try:
                        self._reconnect()
                    except RunnerError:
                        pass  # tried again until the deadline
                self.sleep(min(left, self.rand() * min(1.0, 0.01 * 2 ** attempt)))
                attempt += 1

    def _still_locked(self) -> RetryLater:
        """The answer once the database stayed locked for ``lock_wait`` seconds: try again later, nothing is damaged."""
        wait = self._retry_after()
        return RetryLater(f"{self._where()} stayed locked by another transaction for {self.lock_wait:g} s; "
                          "try again later",
                          retry_at=format_time(self.clock() + wait), wait_seconds=wait)

    def _rollback(self) -> None:
        try:
            self.db.rollback()
        except Exception as exc:
            if not self._is_disconnect(exc):
                raise

    # -- public surface ---------------------------------------------------------------------
    @classmethod
    def create(cls, url: str, /, task_id: str, plan: Dict[str, Any], workspace_base: Optional[str] = None,
               **options: Any) -> "SQLStore":
        """Start a new run; refuse if the database already holds one with this task id.

        :param url: the database's URL. Only ``create`` makes a database that does not exist yet.
        :param task_id: the run's id. :param plan: its plan, a JSON object.
        :param workspace_base: the folder a relative ``workspace`` resolves against.
        :param options: the constructor's keywords.
        :returns: the store at revision 0.
        :raises InvalidInput: the task id or plan is malformed, the database cannot
            be opened, or it already holds run ``task_id``.
        :raises StateUnrecoverable: the database is damaged or not a database.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        if not isinstance(plan, dict):
            raise InvalidInput("the plan must be a JSON object")
        store = cls(url, task_id, creating=True, **options)
        identity, identity_bytes = new_identity(task_id, plan, store.now(), workspace_base)
        identity_text = identity_bytes.decode("utf-8")
        state = genesis(identity, sha256_hex(identity_bytes))
        envelope, _ = _split(state)

        def insert() -> None:
            if store._one("SELECT 1 FROM runner_runs WHERE task_id = {m}", (task_id,)):
                raise InvalidInput(f"refusing to start a new run: {store._where()} already holds run {task_id}")
            store._exec("INSERT INTO runner_runs (task_id, identity, envelope, revision, head, rows_digest) VALUES "
                        "({m}, {m}, {m}, 0, {m}, {m})",
                        (task_id, identity_text, envelope, state["head"], rows_digest(envelope, 0)))

        try:
            store._retrying(insert)
        except BaseException:
            store.close()
            raise
        store._state = state
        return store

    @classmethod
    def open(cls, url: str, /, task_id: Optional[str] = None, **options: Any) -> "SQLStore":
        """Load run ``task_id`` from its rows, checked against its journal (see :meth:`_load`).

        :param url: the database's URL; the database must exist.
        :param task_id: which run (a database holds many): required.
        :param options: the constructor's keywords.
        :returns: the store; ``findings`` names rows rebuilt from the journal, which the next write rewrites.
        :raises InvalidInput: no task id, no such database or no such run in it.
        :raises StateUnrecoverable: the database is damaged, or the run's journal
            cannot prove the revision its rows claim.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        if not task_id:
            raise InvalidInput(f"a {cls.kind} store holds many runs: name one with --task ID")
        store = cls(url, task_id, **options)
        try:
            store._retrying(store._load, write=False)
        except BaseException:
            store.close()
            raise
        return store

    def _load(self) -> None:
        """Load the run from its rows, checked against the journal, which is the state of record.

        The rows are accepted when the run row's digest covers exactly the
        envelope and effect rows read, and the journal ends at the run row's
        revision with the record the row names as its head. Otherwise the
        state is rebuilt by replaying the whole journal from the identity; if
        that chain is whole, the rebuild is exact (a ``repairable`` finding: the
        next write rewrites the rows), and if not, the run is unrecoverable.
        """
        row = self._one("SELECT identity, envelope, revision, head, rows_digest FROM runner_runs WHERE task_id = {m}",
                        (self.task_id,))
        if row is None:
            raise InvalidInput(f"no run {self.task_id} in {self._where()} (start one with init)")
        identity_text, envelope_text, revision, head, stored_digest = (str(row[0]), str(row[1]), int(row[2]),
                                                                       str(row[3]), row[4])
        effect_rows = [(str(k), str(t))
                       for k, t in self._all("SELECT key, effect FROM runner_effects WHERE task_id = {m}",
                                             (self.task_id,))]
        last_rev = self._one("SELECT MAX(rev) FROM runner_journal WHERE task_id = {m}", (self.task_id,))
        journal_end = int(last_rev[0]) if last_rev and last_rev[0] is not None else 0
        problem = None
        try:
            identity = loads_trusted(identity_text)
            state = loads_trusted(envelope_text)
            state["effects"] = {key: loads_trusted(text) for key, text in effect_rows}
            validate_envelope(state)
            if (state["revision"] != revision or state["head"] != head or state["task_id"] != identity["task_id"] or
                state["task_id"] != self.task_id):
                raise ValueError("the run row disagrees with its envelope")
            hashes = {key: _effect_hash(key, text) for key, text in effect_rows}
            if stored_digest is None:
                raise ValueError("the run row has no rows digest yet")
            if rows_digest(envelope_text, sum(hashes.values())) != stored_digest:
                raise ValueError("the envelope or effect rows do not match the run row's digest")
            if journal_end != revision:
                raise ValueError(f"the journal ends at revision {journal_end}, the rows at {revision}")
            if revision == 0:
                if head != sha256_hex(identity_text.encode("utf-8")):
                    raise ValueError("the head at revision 0 is not the identity's digest")
            else:
                last = self._one("SELECT line FROM runner_journal WHERE task_id = {m} AND rev = {m}",
                                 (self.task_id, revision))
                if last is None or decode_record(str(last[0]).encode("utf-8"))[0] != head:
                    raise ValueError(f"journal record {revision} does not match the run's head")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = str(exc)
        if problem is None:
            self._state, self._hashes, self._sum = state, hashes, sum(hashes.values()) % _MOD
            self.findings, self._pending = [], []
            return
        rebuilt, heads = self._replay_journal(identity_text)
        if rebuilt["revision"] < revision or (revision > 0 and heads.get(revision) != head):
            # The run row proves revisions the journal no longer holds (or another history):
            # acknowledged transitions are lost, which no rebuild can undo.
            raise StateUnrecoverable(
                f"run {self.task_id} in {self._where()} is damaged: {problem}; the run row is at revision {revision} "
                f"but the journal proves only {rebuilt['revision']}" + ("" if rebuilt["revision"] < revision
                                                                        else " along another chain"),
                store=self._where(), task=self.task_id)
        self._state = rebuilt
        self._rehash(None)
        found = Finding("repairable", "rows-rebuilt", f"{problem}; revision {rebuilt['revision']} rebuilt exactly from "
                                                      "the journal")
        self.findings, self._pending = [found], [found]

    def _replay_journal(self, identity_text: str) -> Tuple[Dict[str, Any], Dict[int, str]]:
        """The run's state replayed from its identity through every journal record, and each revision's head.

        :raises StateUnrecoverable: the identity or the chain is broken.
        """
        where = f"run {self.task_id} in {self._where()}"
        try:
            identity_bytes = identity_text.encode("utf-8")
            state = genesis(decode_identity(identity_bytes), sha256_hex(identity_bytes))
            rows = self._all("SELECT rev, line FROM runner_journal WHERE task_id = {m} ORDER BY rev", (self.task_id,))
            records = []
            for rev, line in rows:
                digest, body = decode_record(str(line).encode("utf-8"))
                if body["rev"] != int(rev):
                    raise ValueError(f"journal row {rev} holds record {body['rev']}")
                records.append((digest, body))
            replay(state, records)
            validate_envelope(state)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateUnrecoverable(f"{where} is damaged and its journal cannot rebuild it: {exc}",
                                     store=self._where(), task=self.task_id) from None
        return state, {body["rev"]: digest for digest, body in records}

    def _rehash(self, keys: Optional[Iterable[str]]) -> None:
        """Bring the per-row hashes up to ``state`` for ``keys`` (every row when None)."""
        effects = self.state["effects"]
        if keys is None:
            self._hashes = {key: _effect_hash(key, canonical_json(value).decode("utf-8"))
                            for key, value in effects.items()}
            self._sum = sum(self._hashes.values()) % _MOD
            return
        for key in keys:
            self._sum -= self._hashes.pop(key, 0)
            if key in effects:
                self._hashes[key] = _effect_hash(key, canonical_json(effects[key]).decode("utf-8"))
                self._sum += self._hashes[key]
        self._sum %= _MOD

    def _catch_up(self) -> None:
        """Inside the transaction: take the run's row lock and bring memory up to the committed revision."""
        self._catch_up_to(self._lock_row())

    def _catch_up_to(self, committed: Optional[Tuple[int, str]]) -> None:
        if committed is None:
            raise InvalidInput(f"no run {self.task_id} in {self._where()}")
        if self._state is not None and committed == (self.state["revision"], self.state["head"]):
            return
        if self._state is not None and not self._pending and committed[0] > self.state["revision"]:
            rows = self._all("SELECT line FROM runner_journal WHERE task_id = {m} AND rev > {m} ORDER BY rev",
                             (self.task_id, self.state["revision"]))
            try:
                records = [decode_record(str(r[0]).encode("utf-8")) for r in rows]
                replay(self.state, records)
            except ValueError:
                pass  # a full load decides
            else:
                touched: set = set()
                for _, body in records:
                    keys = _touched(body["ops"])[1]
                    if keys is None:
                        touched = None  # type: ignore[assignment]
                        break
                    touched |= keys
                self._rehash(touched)
                if (self.state["revision"], self.state["head"]) == committed:
                    return
        self._load()

    def refresh(self) -> Dict[str, Any]:
        """Catch up with what other processes committed, without taking the run's write lock.

        :returns: the latest committed state.
        :raises InvalidInput: the run's row is gone.
        :raises StateUnrecoverable: the rows and the journal disagree beyond a rebuild.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        def read() -> None:
            row = self._one("SELECT revision, head FROM runner_runs WHERE task_id = {m}", (self.task_id,))
            self._catch_up_to((int(row[0]), str(row[1])) if row else None)

        self._in_transaction(read, write=False)
        return self.state

    def _in_transaction(self, work: Callable[[], Any], write: bool = True) -> Any:
        try:
            out = self._retrying(work, write)
        except BaseException:
            if self._dirty:
                self._state = None  # memory got ahead of a transaction that did not commit: reload
            raise
        finally:
            committed, self._dirty = self._dirty, False
        if committed:
            self.observer.reached("store:after-db-commit")
        return out

    _dirty = False

    def _commit_locked(self, ops: Ops, epoch: int) -> None:
        if self._pending:
            ops = self._repair_ops() + list(ops)
        state = self.state
        prepared = prepare_transition(state, ops, epoch, self.now())
        # From here on memory is ahead of the database until the commit: a
        # failure makes the next use reload.
        self._dirty = True
        finish_transition(state, prepared)
        rev, digest = prepared.body["rev"], prepared.digest
        envelope, effects = _split(state)
        _, keys = _touched(prepared.ops)
        if self._pending:
            keys = None  # the rows are rewritten from the state the journal proved
        self._rehash(keys)
        self._exec("INSERT INTO runner_journal (task_id, rev, line) VALUES ({m}, {m}, {m})",
                   (self.task_id, rev, prepared.line[:-1].decode("utf-8")))
        self._exec("UPDATE runner_runs SET envelope = {m}, revision = {m}, head = {m}, rows_digest = {m} "
                   "WHERE task_id = {m}",
                   (envelope, rev, digest, rows_digest(envelope, self._sum), self.task_id))
        if keys is None:
            self._exec("DELETE FROM runner_effects WHERE task_id = {m}", (self.task_id,))
            keys = set(effects)
        for key in sorted(keys):
            if key in effects:
                self._exec(self._upsert_effect(), (self.task_id, key, canonical_json(effects[key]).decode("utf-8")))
            else:
                self._exec("DELETE FROM runner_effects WHERE task_id = {m} AND key = {m}", (self.task_id, key))
        self._pending = []
        self.observer.reached("store:before-db-commit")

    def _repair_ops(self) -> Ops:
        """Record the rebuild as a store observation in the transition that rewrites the rows."""
        event = {"at": self.now(), "source": "store", "findings": [f"{f.code}: {f.message}" for f in self._pending]}
        return [["set", ["observations", "store", f"r{self.state['revision'] + 1}"], event]]

    def repair(self, *, epoch: int = 0) -> List[Finding]:
        """Rewrite rows the last load rebuilt from the journal, as one transition.

        :param epoch: the fencing epoch written on the record of the repair.
        :returns: the findings repaired (empty when there was nothing to do).
        :raises StateUnrecoverable: the run is damaged beyond a rebuild.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        done: List[Finding] = []

        def work() -> None:
            self._catch_up()
            done[:] = list(self._pending)
            if self._pending:
                self._commit_locked([], epoch)

        self._in_transaction(work)
        return done

    def records_after(self, after: int) -> Tuple[List[Dict[str, Any]], int]:
        """Every journal record after ``after`` up to the current revision; the database keeps them all.

        :returns: ``(records, 1)``: see :meth:`runner.stores.base.Store.records_after`.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        rows = self._retrying(lambda: self._all("SELECT line FROM runner_journal WHERE task_id = {m} AND rev > {m} "
                                                "ORDER BY rev", (self.task_id, after)), write=False)
        records = [dict(body, hash=digest) for digest, body in (decode_record(str(r[0]).encode("utf-8")) for r in rows)]
        self.refresh()
        return [r for r in records if r["rev"] <= self.revision], 1

    def close(self) -> None:
        """Close the database connection."""
        self.db.close()

    @classmethod
    def list_runs(cls, url: str, /, **options: Any) -> List[str]:
        """The task ids of the runs in the database at ``url``, sorted.

        :returns: the task ids; empty when the database does not exist.
        :raises InvalidInput: the database cannot be opened.
        :raises StateUnrecoverable: the database is damaged or not a database.
        :raises RetryLater: the database stayed locked for ``lock_wait`` seconds.
        """
        try:
            store = cls(url, "listing", **options)
        except InvalidInput:
            if cls._missing(url):
                return []
            raise
        try:
            return [str(r[0])
                    for r in store._retrying(lambda: store._all("SELECT task_id FROM runner_runs ORDER BY task_id"),
                                             write=False)]
        finally:
            store.close()

    @classmethod
    def _missing(cls, url: str) -> bool:
        """True when ``url`` names a database that does not exist (so it holds no runs)."""
        return False


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__
