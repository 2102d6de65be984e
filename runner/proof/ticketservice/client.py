"""The client side: adapters that call the ticket service (:class:`runner.calls.target.Adapter`).
"""

import json
import urllib.parse
from typing import Any, Dict, Optional, Tuple

from ...calls.target import NotApplied, Observation, Rejected, StaleEpoch, UnknownOutcome
from ...base.canonical import content_digest
from .wire import Lost, NotSent, exchange



# -- the client side: adapters ----------------------------------------------------------------

class _TicketClient:
    """The plumbing shared by the two adapters: one request to the service (:mod:`.wire`), a timeout, no proxies."""

    def __init__(self, url: str, *, timeout: float = 5.0, run_id: Optional[str] = None) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.run_id = run_id

    def _send(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
              headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, Any]]:
        """``(status, JSON body)``; raises :class:`NotSent` or :class:`Lost` when there is no answer."""
        data = None if body is None else json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                    ensure_ascii=False).encode("utf-8")
        sent = dict(headers or {})
        if data is not None:
            sent["Content-Type"] = "application/json"
        where = urllib.parse.urlsplit(self.url)
        if where.scheme != "http" or not where.hostname or where.port is None:
            raise ValueError(f"the ticket service's URL must be http://HOST:PORT, not {self.url!r}")
        status, raw = exchange(where.hostname, where.port, method, where.path + path, headers=sent, body=data,
                               timeout=self.timeout)
        try:
            parsed = json.loads(raw.decode("utf-8")) if raw else {}
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            if 200 <= status < 300:
                raise Lost(f"answer {status} with an unreadable body")
            parsed = {"raw": raw[:200].decode("utf-8", "replace")}
        return status, parsed

    def _post_ticket(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        """POST /tickets mapped onto the adapter contract's outcomes."""
        headers = {"Idempotency-Key": key, "X-Fencing-Epoch": str(int(epoch))}
        if self.run_id:
            headers["X-Run-Id"] = self.run_id
        try:
            status, body = self._send("POST", "/tickets", {"payload": payload}, headers)
        except NotSent as exc:
            raise NotApplied(str(exc)) from None
        except Lost as exc:
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

    def __init__(self, url: str, *, retention_seconds: Optional[float], timeout: float = 5.0,
                 run_id: Optional[str] = None,
                 refuses_conflicting_payload: bool = True, enforces_fencing: bool = True) -> None:
        super().__init__(url, timeout=timeout, run_id=run_id)
        self.retention_seconds = retention_seconds
        self.enforces_fencing = enforces_fencing
        self.conflicting_payload = (
            "refused: 409, nothing created" if refuses_conflicting_payload
            else "the original ticket is returned; the new payload is ignored"
        )

    def invoke(self, key: str, payload: Dict[str, Any], epoch: int) -> Dict[str, Any]:
        return self._post_ticket(key, payload, epoch)

    def observe(self, key: str, payload: Dict[str, Any]) -> Observation:
        try:
            status, body = self._send("GET", "/tickets/by-key/" + urllib.parse.quote(key, safe=""))
        except (NotSent, Lost) as exc:
            return Observation("unknown", {"lookup": "by-key", "key": key, "error": str(exc)})
        if status == 200:
            expected = content_digest(payload)
            if body.get("payload_digest") != expected:
                return Observation("unknown", {"lookup": "by-key", "key": key, "ticket": body.get("ticket"),
                                               "reason": "the key's ticket holds another payload",
                                               "found_digest": body.get("payload_digest"), "expected_digest": expected})
            return Observation("present",
                               {"lookup": "by-key", "key": key, "ticket": body.get("ticket"),
                                "payload_digest": expected, "created_at": body.get("created_at")})
        if status == 404 and body.get("status") == "never-seen":
            return Observation("absent", {"lookup": "by-key", "key": key, "status": "never-seen"})
        if status == 404:
            # Past retention, or a service that keeps no keys: a 404 proves nothing here.
            return Observation("unknown",
                               {"lookup": "by-key", "key": key, "status": body.get("status"),
                                "reason": "the service may have forgotten the key",
                                "forgotten_at": body.get("forgotten_at")})
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

    def __init__(self, url: str, *, timeout: float = 5.0, run_id: Optional[str] = None,
                 enforces_fencing: bool = True) -> None:
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
        except (NotSent, Lost) as exc:
            return Observation("unknown", {"lookup": "by-marker", "marker": marker, "error": str(exc)})
        tickets = body.get("tickets")
        if status != 200 or not isinstance(tickets, list):
            return Observation("unknown", {"lookup": "by-marker", "marker": marker, "http_status": status})
        if not tickets:
            return Observation("absent", {"lookup": "by-marker", "marker": marker, "count": 0})
        expected = content_digest(payload)
        ids = [t.get("ticket") for t in tickets]
        if any(t.get("payload_digest") != expected for t in tickets):
            return Observation("unknown",
                               {"lookup": "by-marker", "marker": marker, "tickets": ids,
                                "reason": "a ticket with this marker holds another payload"})
        return Observation("present",
                           {"lookup": "by-marker", "marker": marker, "ticket": ids[0], "tickets": ids,
                            "count": len(ids), "payload_digest": expected})
