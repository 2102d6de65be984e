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
implement :class:`runner.calls.target.Adapter`. :class:`TicketServiceProcess`
starts and stops a service in a child process for tests and demos.
"""

from ...base.lazy import lazy_exports

#: Where each exported name lives. Each is imported on first use: the service's own process needs the
#: server and the ledger, not the client's HTTP stack, and a worker needs the client alone.
_HOMES = {
    **dict.fromkeys(("MarkerTicketAdapter", "TicketAdapter"), "client"),
    **dict.fromkeys(("FAULT_DEFAULTS", "Faults", "TicketLedger"), "ledger"),
    **dict.fromkeys(("TicketServiceProcess", "conformance_factory", "marker_conformance_factory"), "process"),
    **dict.fromkeys(("main", "parse_command_line", "serve"), "server"),
}

__getattr__ = lazy_exports(__name__, _HOMES)


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
