"""An OpenAI-compatible chat-completions API on loopback, which bills every request it processed.

    python3 -m tests.support.standins.models --port 0 --state DIR [--key K] [--latency S] [--fault JSON]...

It prints its base URL, ``http://HOST:PORT/v1``.

* ``POST /v1/chat/completions`` with ``{"model": ..., "messages": [{"role", "content"}, ...]}`` answers 200
  with a completion: ``choices[0].message.content`` a summary of the last message (its first line and its
  size, and the number of the call, so two calls of one prompt answer apart, as a model's do) and ``usage``
  (``prompt_tokens``, a token per four characters of the messages; ``completion_tokens``; ``total_tokens``).
  With ``--key``, a request without ``Authorization: Bearer K`` is answered 401 (billed nothing). A body
  that is no such request: 400 ``invalid_request_error``. ``--latency``: seconds every completion takes.
* **The bill.** Every request the API processed is billed, with its tokens, whether or not its answer
  reached the caller: DIR keeps them (:func:`bill`), each with the SHA-256 of its messages (``prompt``: one
  prompt, one item) and the ``Idempotency-Key`` it was sent with, if any. ``GET /_count`` sums them.
* Faults (operation ``complete``): ``429`` with ``Retry-After`` and ``500`` (nothing processed, nothing
  billed), ``slow`` (processed and billed, answered after ``seconds``), ``reset-after`` (processed and
  billed, the connection dropped with no answer), ``500-after``, ``stall-after`` and the other common ones
  (:mod:`tests.support.standins.common`).
"""

import argparse
import hashlib
import json
import math
import time
from typing import Any, Dict, List, Optional, Sequence

from tests.support.standins.common import (Request, Response, Service, State, json_response, parser, read_state,
                                           serve_http)

PATH = "/v1/chat/completions"
MODEL = "standin-summary-1"


def bill(folder: str) -> List[Dict[str, Any]]:
    """Every request the API keeping its state in ``folder`` billed, in order: ``{"n", "prompt", "key",
    "prompt_tokens", "completion_tokens", "total_tokens", "at"}``."""
    return list(read_state(folder).get("bill", []))


def billed_by_prompt(folder: str) -> Dict[str, int]:
    """How many times each prompt (the SHA-256 of its messages) was billed."""
    out: Dict[str, int] = {}
    for entry in bill(folder):
        out[entry["prompt"]] = out.get(entry["prompt"], 0) + 1
    return out


def prompt_digest(messages: Any) -> str:
    """The SHA-256 the bill keeps of a request's messages (JSON with sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode("utf-8")).hexdigest()


def tokens(text: str) -> int:
    """The tokens the API counts for ``text``: one per four characters, at least one."""
    return max(1, math.ceil(len(text) / 4))


def _error(status: int, message: str, kind: str) -> Response:
    return json_response(status, {"error": {"message": message, "type": kind, "code": None}})


class Models(Service):
    def __init__(self, args: argparse.Namespace) -> None:
        self.state = State(args.state, {"bill": []})
        self.key: Optional[str] = args.key
        self.latency = float(args.latency)

    def url(self, base: str) -> str:
        return base + "/v1"

    def gate(self, request: Request) -> Optional[Response]:
        if self.key is not None and request.path == PATH and \
                request.headers.get("authorization") != f"Bearer {self.key}":
            return _error(401, "Incorrect API key provided.", "invalid_request_error")
        return None

    def operation(self, request: Request) -> Optional[str]:
        return "complete" if request.path == PATH and request.method == "POST" else None

    def fault(self, fault: Dict[str, Any], request: Request) -> Optional[Response]:
        if fault["fault"] != "slow":
            return None
        answer = self.perform(request)
        self._wait(float(fault.get("seconds", 1)))
        return answer

    def perform(self, request: Request) -> Response:
        if request.path != PATH:
            return _error(404, f"Unknown request URL: {request.method} {request.path}", "invalid_request_error")
        if request.method != "POST":
            return _error(405, "Method not allowed", "invalid_request_error")
        try:
            sent = request.json()
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.", "invalid_request_error")
        messages = sent.get("messages") if isinstance(sent, dict) else None
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            return _error(400, "'messages' must be a non-empty list of {role, content}", "invalid_request_error")
        prompt = "".join(m["content"] for m in messages)
        last = messages[-1]["content"]
        now = self.now()

        def add(state: Dict[str, Any]) -> Dict[str, Any]:
            n = len(state["bill"]) + 1
            first = next((line.strip().lstrip("#").strip() for line in last.splitlines() if line.strip()), "")
            content = f"Summary of '{first[:80]}' ({len(last)} characters), answer {n}."
            entry = {"n": n, "prompt": prompt_digest(messages), "key": request.headers.get("idempotency-key"),
                     "prompt_tokens": tokens(prompt), "completion_tokens": tokens(content), "at": now}
            entry["total_tokens"] = entry["prompt_tokens"] + entry["completion_tokens"]
            state["bill"].append(entry)
            return dict(entry, content=content)

        billed = self.state.change(add)
        self._wait(self.latency)
        return json_response(200, {
            "id": f"chatcmpl-{billed['n']}", "object": "chat.completion", "created": int(now),
            "model": sent.get("model") or MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": billed["content"]},
                         "finish_reason": "stop"}],
            "usage": {name: billed[name] for name in ("prompt_tokens", "completion_tokens", "total_tokens")}})

    @staticmethod
    def _wait(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)  # in the request's own thread: other requests are answered meanwhile

    def count(self) -> Dict[str, Any]:
        entries = self.state.read(lambda s: list(s["bill"]))
        prompts: Dict[str, int] = {}
        for entry in entries:
            prompts[entry["prompt"]] = prompts.get(entry["prompt"], 0) + 1
        return {"billed": len(entries), "prompts": len(prompts),
                "billed_again": sum(n - 1 for n in prompts.values()),
                "tokens": {name: sum(e[name] for e in entries)
                           for name in ("prompt_tokens", "completion_tokens", "total_tokens")}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parse = parser("models", "An OpenAI-compatible chat-completions API on loopback that bills each request, "
                             "for tests.")
    parse.add_argument("--key", default=None, help="the API key every request must carry as a Bearer token")
    parse.add_argument("--latency", type=float, default=0.0, help="seconds every completion takes (default 0)")
    args = parse.parse_args(argv)
    if args.latency < 0:
        parse.error("--latency is a number of seconds")
    return serve_http(args, Models(args))


if __name__ == "__main__":
    raise SystemExit(main())
