"""A ticket service over HTTP with its own ledger, fault switches, and the adapters that call it.

It stands in for an external system that a run changes: it runs in its own
process, keeps its own SQLite ledger, and can be made to misbehave the way
real services do (answers lost after the commit, answers later than the
client waits, a retention window after which keys are forgotten).

Start it with::

    python3 -m runner.proof.ticketservice --db PATH --port-file FILE [--no-idempotency] [--retention SECONDS]

It listens on 127.0.0.1 at a random port, writes the port to FILE (a temp
file renamed over FILE, so a reader never sees half a number) and prints
``ready PORT`` on stdout.

API (JSON bodies)::

    POST /tickets            {"payload": {...}}  headers Idempotency-Key, X-Fencing-Epoch, X-Run-Id
                             201 {"ticket", "key", "created": true}   a new ticket
                             200 {"ticket", "key", "created": false}  the same key and payload again
                             409 the key is known with another payload
                             412 the epoch is below the run scope's high-water mark
                             503 {"applied": false} refused before processing
    GET  /tickets/by-key/KEY 200 the ticket; 404 {"status": "never-seen" | "past-retention" | "keys-not-kept"}
    GET  /tickets?marker=M   {"tickets": [...]} whose payload holds "marker": M
    GET  /tickets?key=K      {"tickets": [...]} ever created under K (diagnostic; ignores retention)
    GET  /tickets/T-000001   one ticket with its payload
    GET  /stats              counts: tickets, keys, duplicates, requests, high-water marks
    GET  /faults, POST /faults   read or set the fault switches

Invariants of the ledger:

* A ticket and its key registration are committed in one transaction, with
  the run scope's epoch high-water mark: a crash leaves both or neither.
* A known key with the same payload creates nothing; a refused request
  (409, 412, 503, 400) changes nothing.
* An epoch below the high-water mark of its run scope (one mark per
  ``X-Run-Id``, a global one when the header is absent) is refused while
  ``reject_stale_epoch`` is on. A request without ``X-Fencing-Epoch`` is
  not fenced.
* A key registered ``retention_seconds`` ago or earlier is forgotten: moved
  to a tombstone, so the key lookup can say "past retention" instead of
  "never seen", and a POST with it creates a new ticket, as a real
  service's dedup would once its window has passed.
* With ``--no-idempotency`` the key header is ignored: every POST creates a
  ticket and only the marker lookup finds it.

Fault switches (``POST /faults`` with a JSON object, or start-up flags):
``drop_after_commit`` (commit, then close the connection without an answer),
``delay_response_seconds`` (commit, then answer after this delay),
``unavailable`` (answer 503 before processing), ``drop_lookups`` (close the
connection of a lookup without an answer), ``crash_before_commit`` (the
process exits inside the transaction, before its commit),
``reject_stale_epoch`` and ``refuse_conflicting_payload`` (on by default),
and the setting ``retention_seconds``. A switch takes a plain value, which
holds until changed, or ``{"value": V, "times": N}``, which holds for the
next N requests it applies to (POST /tickets, or lookups for
``drop_lookups``) and then gives way to the plain value. For a switch that
is off by default a whole number N is short for ``{"value": true, "times":
N}``: ``{"drop_after_commit": 1}`` drops the next answer only.
``{"reset": true}`` restores the start-up plain values and retention and
cancels pending overrides.

The client side: :class:`TicketAdapter` (dedup and lookup by key) and
:class:`MarkerTicketAdapter` (no keys; lookup by the payload's ``marker``)
implement :class:`runner.effects.Adapter`. :class:`TicketServiceProcess`
starts and stops a service in a child process for tests and demos.
"""

import argparse
import contextlib
import hashlib
import http.client
import http.server
import json
import os
import selectors
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..effects import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ..envelope import content_digest

__all__ = [
    "FAULT_DEFAULTS",
    "Faults",
    "TicketLedger",
    "serve",
    "parse_command_line",
    "main",
    "TicketAdapter",
    "MarkerTicketAdapter",
    "TicketServiceProcess",
    "conformance_factory",
    "marker_conformance_factory",
]

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
POST_FAULTS = ("drop_after_commit", "delay_response_seconds", "unavailable", "crash_before_commit", "reject_stale_epoch", "refuse_conflicting_payload")
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
            raise BadRequest(f"unknown fault(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(FAULT_DEFAULTS))}, retention_seconds, reset)")
        parsed = {name: self._parse(name, spec) for name, spec in changes.items() if name in FAULT_DEFAULTS}
        retention = changes.get("retention_seconds")
        if retention is not None and (isinstance(retention, bool) or not isinstance(retention, (int, float)) or retention < 0):
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
    "bad_requests", "dropped", "delayed", "get_by_key", "get_by_marker", "get_by_key_diagnostic", "get_ticket", "dropped_lookups",
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

    def create(self, key: Optional[str], epoch: Optional[int], scope: str, payload: Dict[str, Any], faults: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
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
                    raise _Answer(412, {"error": "stale-epoch", "epoch": epoch, "high_water": high, "run_id": scope or None})
                if high is None or epoch > high:
                    self.db.execute("INSERT OR REPLACE INTO epochs (run_scope, epoch) VALUES (?, ?)", (scope, epoch))
            if key is not None:
                known = self.db.execute("SELECT seq, payload_digest FROM idempotency_keys WHERE idem_key = ?", (key,)).fetchone()
                if known is not None:
                    if known[1] != digest and faults["refuse_conflicting_payload"]:
                        self.counters["refused_conflict"] += 1
                        # Raised, not returned: the rollback also undoes the epoch mark moved above.
                        raise _Answer(409, {"error": "conflicting-payload", "key": key, "ticket": _ticket_id(known[0])})
                    self.counters["replayed"] += 1
                    return 200, {"ticket": _ticket_id(known[0]), "key": key, "created": False}
            cursor = self.db.execute(
                "INSERT INTO tickets (idem_key, payload, payload_digest, marker, run_scope, epoch, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, text, digest, marker, scope, epoch, now),
            )
            seq = int(cursor.lastrowid)
            if key is not None:
                self.db.execute("INSERT INTO idempotency_keys (idem_key, seq, payload_digest, registered_at) VALUES (?, ?, ?, ?)", (key, seq, digest, now))
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
                f"SELECT {self._COLUMNS} FROM tickets WHERE seq = (SELECT seq FROM idempotency_keys WHERE idem_key = ?)", (key,)
            ).fetchone()
            if row is not None:
                return 200, self._record(row)
            gone = self.db.execute("SELECT forgotten_at, registered_at FROM forgotten_keys WHERE idem_key = ?", (key,)).fetchone()
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
            rows = self.db.execute(f"SELECT {self._COLUMNS} FROM tickets WHERE {column} = ? ORDER BY seq", (value,)).fetchall()
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
                "(t.idem_key IS NOT NULL AND EXISTS (SELECT 1 FROM tickets u WHERE u.idem_key = t.idem_key AND u.seq < t.seq)) OR "
                "(t.marker IS NOT NULL AND EXISTS (SELECT 1 FROM tickets u WHERE u.marker = t.marker AND u.seq < t.seq))"
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


# -- HTTP -----------------------------------------------------------------------------------

class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    ledger: TicketLedger
    quiet: bool = False


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "TicketService/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if not self.server.quiet:
            super().log_message(format, *args)

    # -- plumbing ------------------------------------------------------------------
    def _body(self) -> Any:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or int(length) > _MAX_BODY:
            raise BadRequest("a JSON body with a Content-Length of at most 1 MiB is required")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
        except ValueError as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from None

    def _answer(self, status: int, body: Dict[str, Any]) -> None:
        data = json.dumps(body, sort_keys=True).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (a delayed answer); nothing to undo: the ledger decided already

    def _drop(self) -> None:
        """Close the connection without a byte of answer: the client cannot know the outcome."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BadRequest as exc:
            self.server.ledger.count("bad_requests")
            self._answer(400, {"error": "bad-request", "message": str(exc)})
        except _Answer as exc:
            self._answer(exc.status, exc.body)
        except Exception as exc:  # an answer, not a dropped connection, for a bug in the service
            self._answer(500, {"error": "internal", "message": f"{type(exc).__name__}: {exc}"})

    # -- routes ---------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._guard(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._guard(self._post)

    def _get(self) -> None:
        ledger = self.server.ledger
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if path == "/stats":
            return self._answer(200, ledger.stats())
        if path == "/faults":
            return self._answer(200, ledger.faults.view())
        if path.startswith("/tickets/by-key/"):
            ledger.count("get_by_key")
            if ledger.faults.take(LOOKUP_FAULTS)["drop_lookups"]:
                ledger.count("dropped_lookups")
                return self._drop()
            key = urllib.parse.unquote(path[len("/tickets/by-key/"):])
            return self._answer(*ledger.by_key(key))
        if path == "/tickets":
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            if set(query) == {"marker"} and len(query["marker"]) == 1:
                ledger.count("get_by_marker")
                if ledger.faults.take(LOOKUP_FAULTS)["drop_lookups"]:
                    ledger.count("dropped_lookups")
                    return self._drop()
                return self._answer(200, {"tickets": ledger.search("marker", query["marker"][0])})
            if set(query) == {"key"} and len(query["key"]) == 1:
                ledger.count("get_by_key_diagnostic")
                return self._answer(200, {"tickets": ledger.search("idem_key", query["key"][0])})
            raise BadRequest("GET /tickets takes exactly one of ?marker=M or ?key=K")
        if path.startswith("/tickets/"):
            ledger.count("get_ticket")
            found = ledger.ticket(urllib.parse.unquote(path[len("/tickets/"):]))
            if found is None:
                return self._answer(404, {"error": "not-found"})
            return self._answer(200, found)
        self._answer(404, {"error": "no-such-route", "path": path})

    def _post(self) -> None:
        ledger = self.server.ledger
        path = urllib.parse.urlsplit(self.path).path
        if path == "/faults":
            ledger.faults.update(self._body())
            return self._answer(200, ledger.faults.view())
        if path != "/tickets":
            return self._answer(404, {"error": "no-such-route", "path": path})
        ledger.count("post_tickets")
        faults = ledger.faults.take(POST_FAULTS)
        body = self._body()
        if not isinstance(body, dict) or set(body) != {"payload"} or not isinstance(body["payload"], dict):
            raise BadRequest('the body must be {"payload": {...}}')
        key = self.headers.get("Idempotency-Key")
        if key is not None and not (0 < len(key) <= 255 and key.isprintable()):
            raise BadRequest("Idempotency-Key must be 1 to 255 printable characters")
        epoch_text = self.headers.get("X-Fencing-Epoch")
        epoch: Optional[int] = None
        if epoch_text is not None:
            if not epoch_text.strip().isdigit():
                raise BadRequest("X-Fencing-Epoch must be a whole number >= 0")
            epoch = int(epoch_text)
        scope = self.headers.get("X-Run-Id") or ""
        if faults["unavailable"]:
            ledger.count("refused_unavailable")
            return self._answer(503, {"error": "unavailable", "applied": False})
        status, answer = ledger.create(key, epoch, scope, body["payload"], faults)
        if status in (200, 201):
            if faults["drop_after_commit"]:
                ledger.count("dropped")
                return self._drop()
            delay = faults["delay_response_seconds"]
            if delay > 0:
                ledger.count("delayed")
                # Wait outside the ledger's lock, and wake early when the service stops.
                ledger.stopping.wait(delay)
        self._answer(status, answer)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def serve(db_path: str, port_file: str, *, port: int = 0, idempotency: bool = True, retention_seconds: Optional[float] = None, faults: Optional[Dict[str, Any]] = None, quiet: bool = False) -> None:
    """Run the service until SIGTERM or SIGINT; the port is published only once it is listening."""
    ledger = TicketLedger(db_path, idempotency=idempotency, faults=Faults(faults, retention_seconds))
    server = _Server(("127.0.0.1", port), _Handler)
    server.ledger = ledger
    server.quiet = quiet

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        bound = server.server_address[1]
        tmp = f"{port_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as handle:
            handle.write(f"{bound}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, port_file)  # a reader sees no file or the whole number
        sys.stdout.write(f"ready {bound}\n")
        sys.stdout.flush()
        server.serve_forever(poll_interval=0.2)
    finally:
        ledger.stopping.set()
        server.server_close()
        ledger.close()


def parse_command_line(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The keyword arguments of :func:`serve` from a command line; exits 2 on a usage error."""
    parser = argparse.ArgumentParser(prog="python3 -m runner.proof.ticketservice", description="A ticket service with a SQLite ledger and fault switches.")
    parser.add_argument("--db", required=True, help="the SQLite ledger (created if missing)")
    parser.add_argument("--port-file", required=True, help="where to write the port once listening")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a random free one)")
    parser.add_argument("--no-idempotency", action="store_true", help="ignore Idempotency-Key: every POST creates a ticket")
    parser.add_argument("--retention", type=float, default=None, metavar="SECONDS", help="forget keys this long after registration")
    parser.add_argument("--drop-after-commit", type=int, default=0, metavar="N", help="drop the answers of the next N POSTs after committing")
    parser.add_argument("--delay-response-seconds", type=float, default=0.0, metavar="S", help="answer every POST S seconds after committing")
    parser.add_argument("--accept-stale-epoch", action="store_true", help="do not refuse epochs below the high-water mark")
    parser.add_argument("--accept-conflicting-payload", action="store_true", help="answer a known key with another payload with the original ticket")
    parser.add_argument("--faults", default=None, metavar="JSON", help="a POST /faults body applied at start-up")
    parser.add_argument("--quiet", action="store_true", help="no request log on stderr")
    args = parser.parse_args(argv)
    faults: Dict[str, Any] = {}
    if args.drop_after_commit:
        faults["drop_after_commit"] = args.drop_after_commit
    if args.delay_response_seconds:
        faults["delay_response_seconds"] = args.delay_response_seconds
    if args.accept_stale_epoch:
        faults["reject_stale_epoch"] = False
    if args.accept_conflicting_payload:
        faults["refuse_conflicting_payload"] = False
    if args.faults:
        try:
            extra = json.loads(args.faults)
        except ValueError as exc:
            parser.error(f"--faults is not valid JSON: {exc}")
        if not isinstance(extra, dict):
            parser.error("--faults must be a JSON object")
        faults.update(extra)
    if args.retention is not None and args.retention < 0:
        parser.error("--retention must be >= 0")
    try:
        Faults(faults)  # refuse a bad switch here, with a usage error, not after binding the port
    except BadRequest as exc:
        parser.error(str(exc))
    return {
        "db_path": args.db,
        "port_file": args.port_file,
        "port": args.port,
        "idempotency": not args.no_idempotency,
        "retention_seconds": args.retention,
        "faults": faults,
        "quiet": args.quiet,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    options = parse_command_line(argv)
    try:
        serve(**options)
    except KeyboardInterrupt:
        pass
    return 0


# -- the client side: adapters ----------------------------------------------------------------

class _NotSent(Exception):
    """The request certainly did not reach the service (connection refused)."""


class _Lost(Exception):
    """The request may have reached the service; no usable answer came back."""


class _TicketClient:
    """HTTP plumbing shared by the two adapters: one request, a timeout, no proxies."""

    def __init__(self, url: str, *, timeout: float = 5.0, run_id: Optional[str] = None) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.run_id = run_id
        # Environment proxies would route 127.0.0.1 through another hop and change what a timeout means.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _send(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, Any]]:
        """``(status, JSON body)``; raises :class:`_NotSent` or :class:`_Lost` when there is no answer."""
        data = None if body is None else json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=dict(headers or {}))
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:  # an answer with an error status: the service decided
            status = exc.code
            try:
                raw = exc.read()
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                exc.close()
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                raise _NotSent(f"connection refused by {self.url}") from None
            raise _Lost(f"{type(exc.reason).__name__}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:  # timeout, reset, RemoteDisconnected, IncompleteRead
            raise _Lost(f"{type(exc).__name__}: {exc}") from None
        try:
            parsed = json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            if 200 <= status < 300:
                raise _Lost(f"answer {status} with an unreadable body")
            parsed = {"raw": raw[:200].decode("utf-8", "replace")}
        return status, parsed

    def _post_ticket(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """POST /tickets mapped onto the adapter contract's outcomes."""
        headers = {"Idempotency-Key": key, "X-Fencing-Epoch": str(int(epoch))}
        if self.run_id:
            headers["X-Run-Id"] = self.run_id
        try:
            status, body = self._send("POST", "/tickets", {"payload": payload}, headers)
        except _NotSent as exc:
            raise NotApplied(str(exc)) from None
        except _Lost as exc:
            raise UnknownOutcome(f"no answer from the ticket service: {exc}") from None
        if status in (200, 201) and isinstance(body.get("ticket"), str):
            return body
        if status == 409:
            raise Rejected(f"the key is known with another payload (ticket {body.get('ticket')})")
        if status == 412:
            raise StaleEpoch(f"epoch {epoch} is below the service's high-water mark {body.get('high_water')}")
        if status == 503 and body.get("applied") is False:
            raise NotApplied("the service was unavailable and did not process the request")
        if 400 <= status < 500:
            raise Rejected(f"the service refused the request: {status} {body}")
        # A 5xx without a "not applied" statement, or a 2xx without a ticket: anything may have happened.
        raise UnknownOutcome(f"answer {status} does not say whether the ticket was created: {body}")


class TicketAdapter(_TicketClient):
    """The ticket service with idempotency keys: deduplicating, observed by key lookup.

    ``retention_seconds`` must be the service's retention (None: it keeps
    keys forever); the runner resends an unresolved effect only within it.
    ``observe`` says ``absent`` only when the service says it never saw the
    key; a key past the retention horizon, a payload mismatch or a failed
    lookup is ``unknown``.
    """

    name = "ticket-service"
    key_scope = "one ticket service: keys are unique across its whole ledger"
    verification = "lookup by key: GET /tickets/by-key/KEY, payload digest compared"
    deduplicates = True

    def __init__(self, url: str, *, retention_seconds: Optional[float], timeout: float = 5.0, run_id: Optional[str] = None, refuses_conflicting_payload: bool = True, enforces_fencing: bool = True) -> None:
        super().__init__(url, timeout=timeout, run_id=run_id)
        self.retention_seconds = retention_seconds
        self.enforces_fencing = enforces_fencing
        self.conflicting_payload = (
            "refused: 409, nothing created" if refuses_conflicting_payload else "the original ticket is returned; the new payload is ignored"
        )

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        return self._post_ticket(key, payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        try:
            status, body = self._send("GET", "/tickets/by-key/" + urllib.parse.quote(key, safe=""))
        except (_NotSent, _Lost) as exc:
            return Observation("unknown", {"lookup": "by-key", "key": key, "error": str(exc)})
        if status == 200:
            expected = content_digest(payload)
            if body.get("payload_digest") != expected:
                return Observation("unknown", {"lookup": "by-key", "key": key, "ticket": body.get("ticket"), "reason": "the key's ticket holds another payload", "found_digest": body.get("payload_digest"), "expected_digest": expected})
            return Observation("present", {"lookup": "by-key", "key": key, "ticket": body.get("ticket"), "payload_digest": expected, "created_at": body.get("created_at")})
        if status == 404 and body.get("status") == "never-seen":
            return Observation("absent", {"lookup": "by-key", "key": key, "status": "never-seen"})
        if status == 404:
            # Past retention, or a service that keeps no keys: a 404 proves nothing here.
            return Observation("unknown", {"lookup": "by-key", "key": key, "status": body.get("status"), "reason": "the service may have forgotten the key", "forgotten_at": body.get("forgotten_at")})
        return Observation("unknown", {"lookup": "by-key", "key": key, "http_status": status})


class MarkerTicketAdapter(_TicketClient):
    """The ticket service without idempotency: never deduplicates, observed by business marker.

    The payload must hold a ``"marker"`` string naming the business action
    (for example the effect key). The runner never resends through this
    adapter; an unresolved effect is settled by the marker lookup alone.
    """

    name = "ticket-service-by-marker"
    key_scope = "none: the service keeps no keys; the payload's marker names the effect"
    retention_seconds: Optional[float] = None  # the marker lookup has no retention window
    conflicting_payload = "not detected: the service ignores keys, so another payload is another ticket"
    verification = "lookup by business marker: GET /tickets?marker=M, payload digest compared"
    deduplicates = False

    def __init__(self, url: str, *, timeout: float = 5.0, run_id: Optional[str] = None, enforces_fencing: bool = True) -> None:
        super().__init__(url, timeout=timeout, run_id=run_id)
        self.enforces_fencing = enforces_fencing

    @staticmethod
    def _marker(payload: Dict[str, Any]) -> Optional[str]:
        marker = payload.get("marker")
        return marker if isinstance(marker, str) and marker else None

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        if self._marker(payload) is None:
            raise Rejected("the payload has no 'marker' string, so the ticket could never be found again")
        return self._post_ticket(key, payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        marker = self._marker(payload)
        if marker is None:
            return Observation("unknown", {"lookup": "by-marker", "reason": "the payload has no marker"})
        try:
            status, body = self._send("GET", "/tickets?" + urllib.parse.urlencode({"marker": marker}))
        except (_NotSent, _Lost) as exc:
            return Observation("unknown", {"lookup": "by-marker", "marker": marker, "error": str(exc)})
        tickets = body.get("tickets")
        if status != 200 or not isinstance(tickets, list):
            return Observation("unknown", {"lookup": "by-marker", "marker": marker, "http_status": status})
        if not tickets:
            return Observation("absent", {"lookup": "by-marker", "marker": marker, "count": 0})
        expected = content_digest(payload)
        ids = [t.get("ticket") for t in tickets]
        if any(t.get("payload_digest") != expected for t in tickets):
            return Observation("unknown", {"lookup": "by-marker", "marker": marker, "tickets": ids, "reason": "a ticket with this marker holds another payload"})
        return Observation("present", {"lookup": "by-marker", "marker": marker, "ticket": ids[0], "tickets": ids, "count": len(ids), "payload_digest": expected})


# -- a service in a child process ----------------------------------------------------------

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder holding runner/


class TicketServiceProcess:
    """Start ``python3 -m runner.proof.ticketservice`` in a child process; stop it on exit.

    ``flags``: ``idempotency`` (default True), ``retention_seconds`` (None),
    ``quiet`` (True) and any fault switch as a start-up value. The service's
    stderr goes to ``DB.log``. Usable as a context manager, or started by the
    constructor and stopped with :meth:`stop`. :meth:`start` after a stop
    or a crash brings the service back on the same ledger and port.
    """

    def __init__(self, db_path: str, *, idempotency: bool = True, retention_seconds: Optional[float] = None, quiet: bool = True, startup_timeout: float = 20.0, **faults: Any) -> None:
        self.db_path = os.path.abspath(db_path)
        self.port_file = self.db_path + ".port"
        self.log_path = self.db_path + ".log"
        self.idempotency = idempotency
        self.retention_seconds = retention_seconds
        self.quiet = quiet
        self.startup_timeout = startup_timeout
        self.faults = dict(faults)
        self.process: Optional["subprocess.Popen[bytes]"] = None
        self.port = 0
        self.url = ""
        self._client = _TicketClient("http://127.0.0.1:0", timeout=10.0)
        self.start()

    def __enter__(self) -> "TicketServiceProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Spawn the service and wait (without polling) for its ``ready`` line."""
        if self.process is not None:
            raise RuntimeError("the service is already running")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.port_file)
        # -S: the service needs the standard library only, and starts faster without site-packages.
        command = [sys.executable, "-S", "-m", "runner.proof.ticketservice", "--db", self.db_path, "--port-file", self.port_file]
        if not self.idempotency:
            command.append("--no-idempotency")
        if self.retention_seconds is not None:
            command += ["--retention", repr(float(self.retention_seconds))]
        if self.faults:
            command += ["--faults", json.dumps(self.faults)]
        if self.quiet:
            command.append("--quiet")
        if self.port:
            # A restart comes back at the same address, so adapters made earlier still reach it.
            command += ["--port", str(self.port)]
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env)
        assert self.process.stdout is not None
        line = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if selector.select(self.startup_timeout):
                line = self.process.stdout.readline()
        if not line.startswith(b"ready "):
            self._reap()
            with open(self.log_path, "rb") as log:
                tail = log.read()[-2000:].decode("utf-8", "replace")
            raise RuntimeError(f"the ticket service did not start: {tail.strip() or 'no output'}")
        with open(self.port_file, encoding="ascii") as handle:
            port = int(handle.read())
        if port != int(line.split()[1]) or self.port not in (0, port):
            raise RuntimeError("the port file, the ready line and the requested port disagree")
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self._client.url = self.url

    def _reap(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers. Committed tickets stay in the ledger."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash of the service."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self._reap()

    def restart(self) -> None:
        self.stop()
        self.start()

    def wait_exit(self, timeout: float = 10.0) -> Optional[int]:
        """Wait for a service that is expected to exit (``crash_before_commit``); its exit code."""
        if self.process is None:
            return None
        code = self.process.wait(timeout=timeout)
        self._reap()
        return code

    # -- talking to it -------------------------------------------------------------------
    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, Any]]:
        """One request; raises ``ConnectionError`` when no answer comes back."""
        try:
            return self._client._send(method, path, body, headers)
        except (_NotSent, _Lost) as exc:
            raise ConnectionError(str(exc)) from None

    def set_faults(self, **faults: Any) -> Dict[str, Any]:
        status, body = self.request("POST", "/faults", faults)
        if status != 200:
            raise ValueError(f"faults refused: {body}")
        return body

    def reset_faults(self) -> Dict[str, Any]:
        return self.set_faults(reset=True)

    def stats(self) -> Dict[str, Any]:
        return self.request("GET", "/stats")[1]

    def tickets_for_key(self, key: str) -> List[Dict[str, Any]]:
        """Every ticket ever created under ``key`` (ignores retention)."""
        return self.request("GET", "/tickets?" + urllib.parse.urlencode({"key": key}))[1]["tickets"]

    def tickets_for_marker(self, marker: str) -> List[Dict[str, Any]]:
        return self.request("GET", "/tickets?" + urllib.parse.urlencode({"marker": marker}))[1]["tickets"]

    def adapter(self, **options: Any) -> TicketAdapter:
        """A :class:`TicketAdapter` declaring this service's start-up retention and refusals."""
        options.setdefault("retention_seconds", self.retention_seconds)
        # A start-up override for the next N requests only does not change what the service normally does.
        options.setdefault("refuses_conflicting_payload", self.faults.get("refuse_conflicting_payload", True) is not False)
        options.setdefault("enforces_fencing", self.faults.get("reject_stale_epoch", True) is not False)
        return TicketAdapter(self.url, **options)

    def marker_adapter(self, **options: Any) -> MarkerTicketAdapter:
        options.setdefault("enforces_fencing", self.faults.get("reject_stale_epoch", True) is not False)
        return MarkerTicketAdapter(self.url, **options)


# -- conformance factories -----------------------------------------------------------------

class _ServiceControls:
    """Conformance hooks for a service started by a factory (see :mod:`runner.proof.conformance`)."""

    def __init__(self, service: TicketServiceProcess, folder: str, by: str) -> None:
        self.service = service
        self.folder = folder
        self.by = by

    def lose_next_response(self) -> None:
        self.service.set_faults(drop_after_commit=1)

    def effect_count(self, key: str, payload: Dict[str, Any]) -> int:
        if self.by == "marker":
            return len(self.service.tickets_for_marker(str(payload.get("marker"))))
        return len(self.service.tickets_for_key(key))

    def close(self) -> None:
        try:
            self.service.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def conformance_factory() -> Tuple[TicketAdapter, _ServiceControls]:
    """A fresh service with idempotency in a temp folder, and a :class:`TicketAdapter` for it."""
    folder = tempfile.mkdtemp(prefix="ticketservice-")
    try:
        service = TicketServiceProcess(os.path.join(folder, "tickets.db"))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return service.adapter(run_id="conformance"), _ServiceControls(service, folder, by="key")


def marker_conformance_factory() -> Tuple[MarkerTicketAdapter, _ServiceControls]:
    """A fresh service without idempotency, and a :class:`MarkerTicketAdapter` for it."""
    folder = tempfile.mkdtemp(prefix="ticketservice-")
    try:
        service = TicketServiceProcess(os.path.join(folder, "tickets.db"), idempotency=False)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return service.marker_adapter(run_id="conformance"), _ServiceControls(service, folder, by="marker")


if __name__ == "__main__":
    sys.exit(main())
