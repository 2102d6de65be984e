"""A Stripe-shaped refunds API on loopback: refunds made from form fields, listed in pages that say ``has_more``.

    python3 -m tests.support.standins.refunds --port 0 --state DIR [--lag S] [--token T] [--fault JSON]...

* ``POST /v1/refunds`` with an ``application/x-www-form-urlencoded`` body
  (``charge``, required; ``amount``; ``metadata[NAME]=VALUE``, brackets read
  as Stripe reads them, ``a[b][c]`` and ``a[]``) makes a refund: 200 with
  ``{"id": "re_000001", "object": "refund", "charge", "amount", "metadata",
  "created", "status"}``. No idempotency: an ``Idempotency-Key`` is ignored,
  so the same body sent twice makes two refunds. A body that is not a form,
  400; without a charge, 400 (``parameter_missing``).
* ``GET /v1/refunds?limit=N&starting_after=ID`` lists refunds newest first,
  ``limit`` 10 by default and 1 to 100: ``{"object": "list", "data": [...],
  "has_more": true|false, "url": "/v1/refunds"}``; the page after the refund
  ``ID`` with ``starting_after``, an unknown ``ID`` 400
  (``resource_missing``). A refund shows in listings only ``--lag`` seconds
  after it was made; ``GET /v1/refunds/ID`` reads it at once.
* ``--token T``: every request must carry ``Authorization: Bearer T``, else 401.
* Faults on the operations ``create``, ``list`` and ``read``: the common ones
  (:mod:`tests.support.standins.common`).
* ``GET /_count`` and :func:`count_by_order`: refunds per ``metadata[order]``,
  the orders refunded more than once, and the listing requests that carried
  an ``Idempotency-Key`` (``keyed_listings``). ``POST /_faults`` also takes
  ``lag``, measured on the stand-in's clock, which a test can hold and
  advance.
"""

import argparse
import re
import urllib.parse
from typing import Any, Dict, Optional, Sequence

from tests.support.standins.common import (Request, Response, Service, State, json_response, parser, read_state,
                                           serve_http, tally)

REFUNDS = "/v1/refunds"
REFUND = re.compile(r"/v1/refunds/(re_[0-9]+)\Z")
#: The most refunds one page lists, and how many unless ``limit`` says.
MAX_LIMIT, DEFAULT_LIMIT = 100, 10
_FORM = "application/x-www-form-urlencoded"


def count_by_order(folder: str) -> Dict[str, int]:
    """How many refunds each ``metadata[order]`` has (read from ``folder``)."""
    return tally([str(r["metadata"].get("order")) for r in read_state(folder).get("refunds", [])])["by"]


def form_fields(body: bytes) -> Dict[str, Any]:
    """A form's fields with their brackets read as Stripe reads them: ``a[b]`` an object's field, ``a[]`` a list's
    next element, ``a[0]`` the element at that index.

    :raises ValueError: the body is no form, or a name is used both as a value and as an object.
    """
    out: Dict[str, Any] = {}
    for name, value in urllib.parse.parse_qsl(body.decode("ascii"), keep_blank_values=True, strict_parsing=True):
        head, _, rest = name.partition("[")
        tokens = [head] + (re.findall(r"([^\[\]]*)\]", "[" + rest) if rest else [])
        here: Any = out
        for token, following in zip(tokens, tokens[1:] + [None]):
            last = following is None
            if isinstance(here, list):
                if token == "" or int(token) >= len(here):
                    here.append(value if last else ([] if following == "" or str(following).isdigit() else {}))
                    here = here[-1]
                    continue
                here = here[int(token)]
                continue
            if not isinstance(here, dict):
                raise ValueError(f"{name!r} puts a field inside a value")
            if last:
                here[token] = value
            else:
                here = here.setdefault(token, [] if following == "" or str(following).isdigit() else {})
    return out


class Refunds(Service):
    def __init__(self, args: argparse.Namespace) -> None:
        self.state = State(args.state, {"refunds": [], "keyed_listings": 0})
        self.lag = float(args.lag)
        self.token: Optional[str] = args.token

    def operation(self, request: Request) -> Optional[str]:
        if request.path == REFUNDS:
            return {"POST": "create", "GET": "list"}.get(request.method)
        if REFUND.match(request.path) and request.method == "GET":
            return "read"
        return None

    def gate(self, request: Request) -> Optional[Response]:
        if self.operation(request) is None:
            return None
        if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
            return _error(401, "invalid_request_error", "Invalid API Key provided")
        return None

    def perform(self, request: Request) -> Response:
        operation = self.operation(request)
        if operation == "create":
            return self._create(request)
        if operation == "list":
            return self._list(request)
        if operation == "read":
            wanted = REFUND.match(request.path).group(1)  # type: ignore[union-attr]
            found = self.state.read(lambda s: [dict(r) for r in s["refunds"] if r["id"] == wanted])
            return json_response(200, found[0]) if found else _error(404, "resource_missing", "No such refund")
        return _error(404, "invalid_request_error", "Unrecognized request URL")

    def _create(self, request: Request) -> Response:
        if not request.headers.get("content-type", "").startswith(_FORM):
            return _error(400, "invalid_request_error", f"a request body is sent as {_FORM}")
        try:
            sent = form_fields(request.body)
        except (ValueError, UnicodeDecodeError):
            return _error(400, "invalid_request_error", "the body is no form")
        if not isinstance(sent.get("charge"), str) or not sent["charge"]:
            return _error(400, "parameter_missing", "Missing required param: charge.")
        metadata = sent.get("metadata", {})
        if not isinstance(metadata, dict):
            return _error(400, "parameter_invalid_string", "Invalid object: metadata")
        now = self.now()

        def add(state: Dict[str, Any]) -> Dict[str, Any]:
            refund = {"id": f"re_{len(state['refunds']) + 1:06d}", "object": "refund", "charge": sent["charge"],
                      "amount": int(sent.get("amount") or 0), "metadata": metadata, "status": "succeeded",
                      "created": int(now), "made": now}
            state["refunds"].append(refund)
            return dict(refund)

        return json_response(200, _shown(self.state.change(add)))

    def _list(self, request: Request) -> Response:
        if "idempotency-key" in request.headers:
            self.state.change(lambda s: s.__setitem__("keyed_listings", s["keyed_listings"] + 1))
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            return _error(400, "parameter_invalid_integer", "Invalid integer: limit (1 to 100)")
        seen_by = self.now() - self.lag
        shown = self.state.read(lambda s: [_shown(r) for r in reversed(s["refunds"]) if r["made"] <= seen_by])
        start = 0
        after = request.query.get("starting_after")
        if after is not None:
            ids = [r["id"] for r in shown]
            if after not in ids:
                return _error(400, "resource_missing", f"No such refund: '{after}'")
            start = ids.index(after) + 1
        page = shown[start:start + limit]
        return json_response(200, {"object": "list", "data": page, "has_more": start + limit < len(shown),
                                   "url": REFUNDS})

    def count(self) -> Dict[str, Any]:
        orders, keyed = self.state.read(lambda s: ([str(r["metadata"].get("order")) for r in s["refunds"]],
                                                   s["keyed_listings"]))
        counted = tally(orders)
        return {"total": counted["total"], "by_order": counted["by"], "duplicates": counted["duplicates"],
                "keyed_listings": keyed}

    def control(self, settings: Dict[str, Any]) -> Dict[str, Any]:
        settings = dict(settings)
        if "lag" in settings:
            lag = settings.pop("lag")
            if not isinstance(lag, (int, float)) or isinstance(lag, bool) or lag < 0:
                raise ValueError("'lag' is a number of seconds")
            self.lag = float(lag)
        super().control(settings)
        return {"lag": self.lag}


def _shown(refund: Dict[str, Any]) -> Dict[str, Any]:
    return {name: value for name, value in refund.items() if name != "made"}


def _error(status: int, code: str, message: str) -> Response:
    return json_response(status, {"error": {"type": "invalid_request_error", "code": code, "message": message}})


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse = parser("refunds", "A Stripe-shaped refunds API on loopback, for tests.")
    parse.add_argument("--lag", type=float, default=0.0, help="seconds before a new refund shows in listings")
    parse.add_argument("--token", default=None, help="the bearer token every request must carry")
    args = parse.parse_args(argv)
    return serve_http(args, Refunds(args))


if __name__ == "__main__":
    raise SystemExit(main())
