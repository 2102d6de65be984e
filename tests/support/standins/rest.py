"""A generic REST API on loopback with a lookup by key: items created without idempotency, found by ``external_id``.

    python3 -m tests.support.standins.rest --port 0 --state DIR [--lag S] [--token T] [--key K] [--fault JSON]...

* ``POST /items`` (or ``PUT /items``) with a JSON object that carries
  ``external_id`` (a non-empty string) creates an item: 201 with the item
  (``id``, ``external_id``, ``created_at`` and the fields sent) and a
  ``Location``. No idempotency: the same body sent twice makes two items,
  which is the duplicate a runner must not make. Without ``external_id``, 422.
* ``PUT /items/ID`` replaces an item's fields (its ``id`` and ``external_id``
  stay): 200, or 404.
* ``GET /items?external_id=K``: a JSON list of the items with that key (every
  item without the parameter), oldest first; an item shows there only
  ``--lag`` seconds after it was created. ``GET /items/ID`` reads it at once,
  or 404.
* ``--token T``: every request must carry ``Authorization: Bearer T``, else 401.
* ``--key K``: every request must carry ``key=K`` in its query (an API key in the URL), else 401.
* Faults on the operations ``create``, ``update``, ``lookup`` and ``read``:
  the common ones (:mod:`tests.support.standins.common`), ``429`` and
  ``503`` with ``Retry-After``, ``500-after``, ``502-after``,
  ``reset-after``, ``stall-after``, ``reset-before``.
* ``GET /_count`` and :func:`count_by_external_id`: items per key, and the
  keys held more than once. ``POST /_faults`` also takes ``lag``, measured on
  the stand-in's clock, which a test can hold and advance.
"""

import argparse
import re
import time
from typing import Any, Dict, List, Optional, Sequence

from tests.support.standins.common import (Request, Response, Service, State, json_response, parser, read_state,
                                           serve_http, tally)

ITEMS = "/items"
ITEM = re.compile(r"/items/([0-9]+)\Z")


def items(folder: str) -> List[Dict[str, Any]]:
    """Every item the API keeping its state in ``folder`` created, oldest first."""
    return list(read_state(folder).get("items", []))


def count_by_external_id(folder: str) -> Dict[str, int]:
    """How many items hold each ``external_id`` (read from ``folder``)."""
    return tally([item["external_id"] for item in items(folder)])["by"]


class Rest(Service):
    def __init__(self, args: argparse.Namespace) -> None:
        self.state = State(args.state, {"items": []})
        self.lag = float(args.lag)
        self.token: Optional[str] = args.token
        self.key: Optional[str] = args.key

    def operation(self, request: Request) -> Optional[str]:
        if request.path == ITEMS:
            return {"POST": "create", "PUT": "create", "GET": "lookup"}.get(request.method)
        if ITEM.match(request.path):
            return {"PUT": "update", "GET": "read"}.get(request.method)
        return None

    def gate(self, request: Request) -> Optional[Response]:
        if self.operation(request) is None:
            return None
        if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
            return json_response(401, {"error": "unauthorized"})
        if self.key is not None and request.query.get("key") != self.key:
            return json_response(401, {"error": "no valid key in the URL"})
        return None

    def perform(self, request: Request) -> Response:
        operation = self.operation(request)
        if operation in ("create", "update"):
            try:
                sent = request.json()
            except ValueError:
                return json_response(400, {"error": "the body is not JSON"})
            if not isinstance(sent, dict):
                return json_response(422, {"error": "the body is a JSON object"})
            if operation == "create":
                return self._create(sent)
            return self._update(int(ITEM.match(request.path).group(1)), sent)  # type: ignore[union-attr]
        if operation == "lookup":
            key = request.query.get("external_id")
            seen_by = self.now() - self.lag
            found = self.state.read(lambda s: [dict(i) for i in s["items"] if key is None or i["external_id"] == key])
            return json_response(200, [_shown(i) for i in found if i["created"] <= seen_by])
        if operation == "read":
            number = int(ITEM.match(request.path).group(1))  # type: ignore[union-attr]
            found = self.state.read(lambda s: [dict(i) for i in s["items"] if i["id"] == number])
            return json_response(200, _shown(found[0])) if found else json_response(404, {"error": "not found"})
        return json_response(404, {"error": "not found"})

    def _create(self, sent: Dict[str, Any]) -> Response:
        if not isinstance(sent.get("external_id"), str) or not sent["external_id"]:
            return json_response(422, {"error": "external_id is required (a non-empty string)"})
        now = self.now()

        def add(state: Dict[str, Any]) -> Dict[str, Any]:
            fields = {k: v for k, v in sent.items() if k not in ("id", "external_id", "created_at")}
            item = {"id": len(state["items"]) + 1, "external_id": sent["external_id"], "created": now, "fields": fields}
            state["items"].append(item)
            return dict(item)

        item = self.state.change(add)
        return json_response(201, _shown(item), (("Location", f"{ITEMS}/{item['id']}"),))

    def _update(self, number: int, sent: Dict[str, Any]) -> Response:
        def replace(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
            for item in state["items"]:
                if item["id"] == number:
                    item["fields"] = {k: v for k, v in sent.items() if k not in ("id", "external_id", "created_at")}
                    return dict(item)
            return None

        item = self.state.change(replace)
        return json_response(200, _shown(item)) if item else json_response(404, {"error": "not found"})

    def count(self) -> Dict[str, Any]:
        counted = tally(self.state.read(lambda s: [i["external_id"] for i in s["items"]]))
        return {"total": counted["total"], "by_external_id": counted["by"], "duplicates": counted["duplicates"]}

    def control(self, settings: Dict[str, Any]) -> Dict[str, Any]:
        settings = dict(settings)
        if "lag" in settings:
            lag = settings.pop("lag")
            if not isinstance(lag, (int, float)) or isinstance(lag, bool) or lag < 0:
                raise ValueError("'lag' is a number of seconds")
            self.lag = float(lag)
        super().control(settings)
        return {"lag": self.lag}


def _shown(item: Dict[str, Any]) -> Dict[str, Any]:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(item["created"]))
    return dict(item["fields"], id=item["id"], external_id=item["external_id"], created_at=created)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse = parser("rest", "A REST API with a lookup by key, on loopback, for tests.")
    parse.add_argument("--lag", type=float, default=0.0, help="seconds before a new item shows in lookups by key")
    parse.add_argument("--token", default=None, help="the bearer token every request must carry")
    parse.add_argument("--key", default=None, help="the API key every request's URL must carry (key=K)")
    args = parse.parse_args(argv)
    return serve_http(args, Rest(args))


if __name__ == "__main__":
    raise SystemExit(main())
