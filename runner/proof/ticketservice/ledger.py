"""The ticket service's ledger: tickets, keys and epochs in SQLite, and the fault switches.

See the package docs for the invariants the ledger keeps.
"""

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple




#: The fault switches and their start-up values when no flag changes them.
FAULT_DEFAULTS: Dict[str, Any] = {
    "drop_after_commit": False,
    "delay_response_seconds": 0.0,
    "unavailable": False,
    "drop_lookups": False,
    "crash_before_commit": False,
    "reject_stale_epoch": True,
    "refuse_conflicting_payload": True,
}

#: Switches consumed by each POST /tickets, and by each lookup.
POST_FAULTS = ("drop_after_commit", "delay_response_seconds", "unavailable", "crash_before_commit",
               "reject_stale_epoch", "refuse_conflicting_payload")
LOOKUP_FAULTS = ("drop_lookups",)

_OFF_BY_DEFAULT = {name for name, value in FAULT_DEFAULTS.items() if value is False}
_MAX_BODY = 1 << 20
_CRASH_EXIT = 75


def _canonical_digest(value: Any) -> str:
    """``sha256:`` of canonical JSON (sorted keys, no spaces, UTF-8): the runner's payload digest."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _iso(seconds: float) -> str:
    whole, milli = divmod(int(round(seconds * 1000)), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + ".%03dZ" % milli


def _ticket_id(seq: int) -> str:
    return "T-%06d" % seq


class BadRequest(ValueError):
    """The request is malformed; it is answered 400 and changes nothing."""


# -- fault switches ---------------------------------------------------------------------

class Faults:
    """Fault switches: a plain value per switch, plus an optional override for the next N requests.

    Thread-safe. :meth:`take` consumes one use of each counted override, so
    "the next N requests" is exact even with concurrent requests.
    """

    def __init__(self, startup: Optional[Dict[str, Any]] = None, retention_seconds: Optional[float] = None) -> None:
        self._lock = threading.Lock()
        self._plain: Dict[str, Any] = dict(FAULT_DEFAULTS)
        self._counted: Dict[str, List[Any]] = {}  # name -> [value, remaining]
        self.retention_seconds = retention_seconds
        if startup:
            self.update(startup)
        self._startup = (dict(self._plain), self.retention_seconds)

    @staticmethod
    def _parse(name: str, spec: Any) -> Tuple[Any, Optional[int]]:
        """``(value, times)``; ``times`` is None for a plain value."""
        times: Optional[int] = None
        if isinstance(spec, dict):
            if set(spec) - {"value", "times"} or "value" not in spec:
                raise BadRequest(f"fault {name}: an override is {{\"value\": V, \"times\": N}}")
            times = spec.get("times", 1)
            if isinstance(times, bool) or not isinstance(times, int) or times < 0:
                raise BadRequest(f"fault {name}: times must be a whole number >= 0")
            spec = spec["value"]
        elif name in _OFF_BY_DEFAULT and isinstance(spec, int) and not isinstance(spec, bool):
            if spec < 0:
                raise BadRequest(f"fault {name}: a count must be >= 0")
            spec, times = True, spec
        if name == "delay_response_seconds":
            if isinstance(spec, bool) or not isinstance(spec, (int, float)) or not 0 <= spec <= 3600:
                raise BadRequest("fault delay_response_seconds must be a number of seconds between 0 and 3600")
            return float(spec), times
        if not isinstance(spec, bool):
            raise BadRequest(f"fault {name} must be true or false" + (" or a count" if name in _OFF_BY_DEFAULT else ""))
        return spec, times

    def update(self, changes: Dict[str, Any]) -> None:
        """Apply a ``POST /faults`` body; every entry is checked before any is applied."""
        if not isinstance(changes, dict):
            raise BadRequest("faults must be a JSON object")
        unknown = set(changes) - set(FAULT_DEFAULTS) - {"retention_seconds", "reset"}
        if unknown:
            raise BadRequest(f"unknown fault(s): {', '.join(sorted(unknown))} (known: "
                             f"{', '.join(sorted(FAULT_DEFAULTS))}, retention_seconds, reset)")
        parsed = {name: self._parse(name, spec) for name, spec in changes.items() if name in FAULT_DEFAULTS}
        retention = changes.get("retention_seconds")
        if retention is not None and (isinstance(retention, bool) or not isinstance(retention, (int, float)) or
                                      retention < 0):
            raise BadRequest("retention_seconds must be a number >= 0 or null")
        with self._lock:
            if changes.get("reset"):
                plain, self.retention_seconds = self._startup
                self._plain, self._counted = dict(plain), {}
            for name, (value, times) in parsed.items():
                if times is None:
                    self._plain[name] = value
                    self._counted.pop(name, None)  # a plain value replaces any pending override
                elif times == 0:
                    self._counted.pop(name, None)
                else:
                    self._counted[name] = [value, times]
            if "retention_seconds" in changes:
                self.retention_seconds = None if retention is None else float(retention)

    def take(self, names: Sequence[str]) -> Dict[str, Any]:
        """The values in force for one request, consuming one use of each counted override."""
        out: Dict[str, Any] = {}
        with self._lock:
            for name in names:
                counted = self._counted.get(name)
                if counted is not None:
                    out[name] = counted[0]
                    counted[1] -= 1
                    if counted[1] <= 0:
                        del self._counted[name]
                else:
                    out[name] = self._plain[name]
        return out

    def view(self) -> Dict[str, Any]:
        with self._lock:
            return {
                "plain": dict(self._plain),
                "next": {name: {"value": v, "remaining": n} for name, (v, n) in self._counted.items()},
                "retention_seconds": self.retention_seconds,
            }


# -- the ledger -------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    idem_key TEXT,
    payload TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    marker TEXT,
    run_scope TEXT NOT NULL,
    epoch INTEGER,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tickets_by_key ON tickets(idem_key);
CREATE INDEX IF NOT EXISTS tickets_by_marker ON tickets(marker);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    idem_key TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    payload_digest TEXT NOT NULL,
    registered_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS forgotten_keys (
    idem_key TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    registered_at REAL NOT NULL,
    forgotten_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS epochs (
    run_scope TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL
);
"""

_COUNTERS = (
    "post_tickets", "created", "replayed", "refused_conflict", "refused_stale", "refused_unavailable",
    "bad_requests", "dropped", "delayed", "get_by_key", "get_by_marker", "get_by_key_diagnostic", "get_ticket",
    "dropped_lookups",
)


class TicketLedger:
    """The service's durable state: tickets, key registry, tombstones, epoch high-water marks.

    One SQLite connection, serialised by a lock (``BEGIN IMMEDIATE`` per
    write), journal_mode WAL and synchronous NORMAL, so a committed ticket
    survives the death of the service's process.
    """

    def __init__(self, db_path: str, *, idempotency: bool = True, faults: Optional[Faults] = None) -> None:
        self.idempotency = idempotency
        self.faults = faults or Faults()
        self.lock = threading.Lock()
        self.counters = {name: 0 for name in _COUNTERS}
        self.stopping = threading.Event()
        self.db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False, timeout=30)
        mode = self.db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"the ledger needs journal_mode WAL; SQLite answered {mode!r}")
        # WAL with synchronous=NORMAL: a committed transaction survives the
        # death of the service's process (the failure the tests inject), and a
        # commit costs no fsync. Power loss is the run store's concern, not this stand-in's.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def count(self, name: str, by: int = 1) -> None:
        with self.lock:
            self.counters[name] += by

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _forget_expired(self, now: float) -> None:
        """Move keys past the retention horizon to tombstones (inside the caller's transaction)."""
        retention = self.faults.retention_seconds
        if retention is None:
            return
        horizon = now - retention
        self.db.execute(
            "INSERT OR REPLACE INTO forgotten_keys (idem_key, seq, registered_at, forgotten_at) "
            "SELECT idem_key, seq, registered_at, ? FROM idempotency_keys WHERE registered_at <= ?",
            (now, horizon),
        )
        self.db.execute("DELETE FROM idempotency_keys WHERE registered_at <= ?", (horizon,))

    def _record(self, row: Sequence[Any], with_payload: bool = False) -> Dict[str, Any]:
        seq, key, payload, digest, marker, scope, epoch, created = row
        out: Dict[str, Any] = {
            "ticket": _ticket_id(seq),
            "key": key,
            "payload_digest": digest,
            "marker": marker,
            "run_id": scope or None,
            "epoch": epoch,
            "created_at": _iso(created),
        }
        if with_payload:
            out["payload"] = json.loads(payload)
        return out

    _COLUMNS = "seq, idem_key, payload, payload_digest, marker, run_scope, epoch, created_at"

    def create(self, key: Optional[str], epoch: Optional[int], scope: str, payload: Dict[str, Any],
               faults: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
        """Decide and commit one POST /tickets; return ``(status, body)``. See the module invariants."""
        if not self.idempotency:
            key = None  # the header is ignored entirely
        digest = _canonical_digest(payload)
        marker = payload.get("marker") if isinstance(payload.get("marker"), str) and payload.get("marker") else None
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        now = time.time()
        with self.lock, self._transaction():
            self._forget_expired(now)
            if epoch is not None:
                row = self.db.execute("SELECT epoch FROM epochs WHERE run_scope = ?", (scope,)).fetchone()
                high = row[0] if row else None
                if high is not None and epoch < high and faults["reject_stale_epoch"]:
                    self.counters["refused_stale"] += 1
                    raise _Answer(412, {"error": "stale-epoch", "epoch": epoch, "high_water": high,
                                        "run_id": scope or None})
                if high is None or epoch > high:
                    self.db.execute("INSERT OR REPLACE INTO epochs (run_scope, epoch) VALUES (?, ?)", (scope, epoch))
            if key is not None:
                known = self.db.execute("SELECT seq, payload_digest FROM idempotency_keys WHERE idem_key = ?",
                                        (key,)).fetchone()
                if known is not None:
                    if known[1] != digest and faults["refuse_conflicting_payload"]:
                        self.counters["refused_conflict"] += 1
                        # Raised, not returned: the rollback also undoes the epoch mark moved above.
                        raise _Answer(409, {"error": "conflicting-payload", "key": key, "ticket": _ticket_id(known[0])})
                    self.counters["replayed"] += 1
                    return 200, {"ticket": _ticket_id(known[0]), "key": key, "created": False}
            cursor = self.db.execute(
                "INSERT INTO tickets (idem_key, payload, payload_digest, marker, run_scope, epoch, created_at) VALUES "
                "(?, ?, ?, ?, ?, ?, ?)",
                (key, text, digest, marker, scope, epoch, now),
            )
            rowid: Any = cursor.lastrowid  # an int after an insert; int() of anything else fails as it would
            seq = int(rowid)
            if key is not None:
                self.db.execute("INSERT INTO idempotency_keys (idem_key, seq, payload_digest, registered_at) VALUES "
                                "(?, ?, ?, ?)", (key, seq, digest, now))
                self.db.execute("DELETE FROM forgotten_keys WHERE idem_key = ?", (key,))
            if faults["crash_before_commit"]:
                # Both rows are written but not committed: recovery must show neither.
                os._exit(_CRASH_EXIT)
            self.counters["created"] += 1
        return 201, {"ticket": _ticket_id(seq), "key": key, "created": True}

    def by_key(self, key: str) -> Tuple[int, Dict[str, Any]]:
        """The key lookup, which honours retention: 200 with the ticket, or 404 saying why."""
        if not self.idempotency:
            return 404, {"error": "not-found", "key": key, "status": "keys-not-kept"}
        now = time.time()
        with self.lock, self._transaction():
            self._forget_expired(now)
            row = self.db.execute(
                f"SELECT {self._COLUMNS} FROM tickets WHERE seq = (SELECT seq FROM idempotency_keys "
                "WHERE idem_key = ?)", (key,)
            ).fetchone()
            if row is not None:
                return 200, self._record(row)
            gone = self.db.execute("SELECT forgotten_at, registered_at FROM forgotten_keys WHERE idem_key = ?",
                                   (key,)).fetchone()
        if gone is not None:
            return 404, {
                "error": "not-found",
                "key": key,
                "status": "past-retention",
                "registered_at": _iso(gone[1]),
                "forgotten_at": _iso(gone[0]),
                "retention_seconds": self.faults.retention_seconds,
            }
        return 404, {"error": "not-found", "key": key, "status": "never-seen"}

    def search(self, column: str, value: str) -> List[Dict[str, Any]]:
        with self.lock:
            rows = self.db.execute(f"SELECT {self._COLUMNS} FROM tickets WHERE {column} = ? ORDER BY seq",
                                   (value,)).fetchall()
        return [self._record(row) for row in rows]

    def ticket(self, ticket: str) -> Optional[Dict[str, Any]]:
        if not (ticket.startswith("T-") and ticket[2:].isdigit()):
            return None
        with self.lock:
            row = self.db.execute(f"SELECT {self._COLUMNS} FROM tickets WHERE seq = ?", (int(ticket[2:]),)).fetchone()
        return None if row is None else self._record(row, with_payload=True)

    def stats(self) -> Dict[str, Any]:
        with self.lock:
            q = self.db.execute
            tickets = q("SELECT COUNT(*) FROM tickets").fetchone()[0]
            keys = q("SELECT COUNT(DISTINCT idem_key) FROM tickets WHERE idem_key IS NOT NULL").fetchone()[0]
            # A duplicate is a ticket whose key or business marker an earlier ticket already had.
            duplicates = q(
                "SELECT COUNT(*) FROM tickets t WHERE "
                "(t.idem_key IS NOT NULL AND EXISTS (SELECT 1 FROM tickets u WHERE u.idem_key = t.idem_key "
                "AND u.seq < t.seq)) OR "
                "(t.marker IS NOT NULL AND EXISTS (SELECT 1 FROM tickets u WHERE u.marker = t.marker "
                "AND u.seq < t.seq))"
            ).fetchone()[0]
            registered = q("SELECT COUNT(*) FROM idempotency_keys").fetchone()[0]
            forgotten = q("SELECT COUNT(*) FROM forgotten_keys").fetchone()[0]
            marks = {scope: epoch for scope, epoch in q("SELECT run_scope, epoch FROM epochs")}
            requests = dict(self.counters)
        return {
            "tickets": tickets,
            "keys": keys,
            "duplicates": duplicates,
            "registered_keys": registered,
            "forgotten_keys": forgotten,
            "high_water": marks,
            "requests": requests,
            "idempotency": self.idempotency,
            "faults": self.faults.view(),
        }


class _Answer(Exception):
    """Leave a transaction with a rollback and answer ``status`` with ``body``."""

    def __init__(self, status: int, body: Dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
