"""A chat incoming webhook on loopback: messages posted to a secret URL, and no way to read them back.

    python3 -m tests.support.standins.webhook --port 0 --state DIR [--secret S] [--fault JSON]...

It prints its webhook URL, ``http://HOST:PORT/hooks/T0/B0/SECRET``, whose
path is the secret (``--secret``; by default one made at the first start and
kept in DIR, so the URL survives a restart).

* ``POST`` to that path with ``{"text": ...}`` (JSON, or a form whose
  ``payload`` field holds that JSON, as Slack takes it) delivers the message:
  200 ``ok``. Without a text, 400 ``no_text``; a body that is not JSON, 400
  ``invalid_payload``. Any other path, 404 ``no_service``; any other method on
  the path, 405. Nothing reads a message back: that is what a recipe against
  it must live with.
* Faults (operation ``post``): ``429`` with ``Retry-After`` (nothing
  delivered), ``500-after`` (delivered, then 500), ``reset-after``
  (delivered, then the connection reset), ``stall-after``, and the other
  common ones (:mod:`tests.support.standins.common`).
* DIR keeps every message delivered, for the test only (:func:`messages`);
  ``GET /_count`` and :func:`count_by_text` count them per text.
"""

import argparse
import re
import secrets
import time
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence

from tests.support.standins.common import (Request, Response, Service, State, parser, read_state, serve_http, tally,
                                           text_response)

PREFIX = "/hooks/T0/B0/"
SECRET = re.compile(r"[A-Za-z0-9_-]{1,100}\Z")


def messages(folder: str) -> List[Dict[str, Any]]:
    """Every message the webhook keeping its state in ``folder`` delivered, in order: ``{"n", "text", "at"}``."""
    return list(read_state(folder).get("messages", []))


def count_by_text(folder: str) -> Dict[str, int]:
    """How many times each text was delivered (read from ``folder``)."""
    return tally([m["text"] for m in messages(folder)])["by"]


class Webhook(Service):
    def __init__(self, args: argparse.Namespace) -> None:
        made = args.secret or secrets.token_urlsafe(18).replace("-", "x").replace("_", "y")
        self.state = State(args.state, {"messages": [], "secret": made})
        # Written now, so the URL printed is the one a start again on DIR prints.
        self.state.change(lambda s: s.update(secret=args.secret) if args.secret else None)
        self.path = PREFIX + self.state.read(lambda s: s["secret"])

    def url(self, base: str) -> str:
        return base + self.path

    def operation(self, request: Request) -> Optional[str]:
        return "post" if request.path == self.path and request.method == "POST" else None

    def perform(self, request: Request) -> Response:
        if request.path != self.path:
            return text_response(404, "no_service")
        if request.method != "POST":
            return text_response(405, "invalid_method")
        text = _text(request)
        if isinstance(text, Response):
            return text
        now = time.time()

        def add(state: Dict[str, Any]) -> None:
            state["messages"].append({"n": len(state["messages"]) + 1, "text": text, "at": now})

        self.state.change(add)
        return text_response(200, "ok")

    def count(self) -> Dict[str, Any]:
        counted = tally(self.state.read(lambda s: [m["text"] for m in s["messages"]]))
        return {"total": counted["total"], "by_text": counted["by"], "duplicates": counted["duplicates"]}


def _text(request: Request) -> Any:
    """The message's text, or the 400 answer that says why there is none."""
    body = request.body
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        fields = dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace")))
        body = fields.get("payload", "").encode("utf-8")
    try:
        sent = Request(request.method, request.path, {}, {}, body).json()
    except ValueError:
        return text_response(400, "invalid_payload")
    if not isinstance(sent, dict):
        return text_response(400, "invalid_payload")
    text = sent.get("text")
    if not isinstance(text, str) or not text:
        return text_response(400, "no_text")
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse = parser("webhook", "A chat incoming webhook on loopback (a secret URL, no reading back), for tests.")
    parse.add_argument("--secret", default=None,
                       help="the last part of the webhook's path (default: made once, kept in DIR)")
    args = parse.parse_args(argv)
    if args.secret is not None and not SECRET.match(args.secret):
        parse.error("--secret holds letters, digits, - and _ only")
    return serve_http(args, Webhook(args))


if __name__ == "__main__":
    raise SystemExit(main())
