"""Scripted model servers on 127.0.0.1 for whole sessions of the real Claude Code and Codex CLIs.

Both CLIs talk to their model over HTTP and can be pointed at another address
(``ANTHROPIC_BASE_URL`` for Claude Code; a ``[model_providers.NAME]`` with
``base_url`` in Codex's ``config.toml``). A server here stands in for the
model: every model request is recorded as an :class:`Exchange`, handed to the
test's *script* (a function from the exchange to the next :class:`Turn`), and
answered with that turn as the server-sent events the CLI expects. Nothing
here decides what the session does; the script and the CLI do.

* :class:`MessagesModel` speaks Anthropic's Messages API as Claude Code calls
  it: ``HEAD /`` (answered 200), then ``POST /v1/messages`` with ``stream:
  true``, answered with ``message_start``, one ``content_block_start`` /
  ``content_block_delta`` / ``content_block_stop`` per block (``text_delta``
  for text, ``input_json_delta`` for a tool call's input), ``message_delta``
  with the ``stop_reason``, and ``message_stop``.
* :class:`ResponsesModel` speaks OpenAI's Responses API as Codex calls it:
  one ``POST /v1/responses`` per model turn, answered with
  ``response.created``, ``response.output_item.added`` and
  ``response.output_item.done`` per item (a ``message``, or a
  ``function_call``), and ``response.completed``.

Standard library only; the server runs on a daemon thread of the test process.
"""

import http.server
import json
import threading
import uuid
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["ToolCall", "Turn", "Exchange", "ScriptedModel", "MessagesModel", "ResponsesModel"]


class ToolCall(NamedTuple):
    """One tool call the model makes: the tool's name as the CLI listed it, and its arguments."""

    name: str
    arguments: Dict[str, Any]


class Turn(NamedTuple):
    """What the model answers in one request: text, tool calls, or both (text first)."""

    text: str = ""
    calls: Tuple[ToolCall, ...] = ()


class Exchange:
    """One model request as the CLI sent it, read the same way for both protocols.

    :param protocol: ``messages`` or ``responses``.
    :param body: the request's JSON body.
    """

    def __init__(self, protocol: str, body: Dict[str, Any], headers: Dict[str, str]) -> None:
        self.protocol = protocol
        self.body = body
        self.headers = headers
        self.answer: Optional[Turn] = None

    # -- what the CLI offered ----------------------------------------------------------------
    def tool_names(self) -> List[str]:
        """The names of the tools offered, with a namespace's functions as ``NAMESPACE.NAME``."""
        names = []
        for tool in self.body.get("tools") or []:
            if self.protocol == "responses" and tool.get("type") == "namespace":
                names += [f"{tool.get('name')}.{t.get('name')}" for t in tool.get("tools") or []]
            elif tool.get("name"):
                names.append(str(tool["name"]))
        return names

    # -- what it said ----------------------------------------------------------------------------
    def context_texts(self) -> List[str]:
        """Every text the request carries outside the assistant's own turns (system, developer, user)."""
        texts: List[str] = []
        if self.protocol == "messages":
            system = self.body.get("system")
            texts += [system] if isinstance(system, str) else [b.get("text", "") for b in system or [] if isinstance(b, dict)]
            for message in self.body.get("messages") or []:
                if message.get("role") != "assistant":
                    texts += _message_texts(message.get("content"))
        else:
            for item in self.body.get("input") or []:
                if item.get("type") == "message" and item.get("role") != "assistant":
                    texts += _message_texts(item.get("content"))
            if isinstance(self.body.get("instructions"), str):
                texts.append(self.body["instructions"])
        return texts

    def last_input(self) -> List[Dict[str, Any]]:
        """The items the CLI added after the model's last turn: a user message, tool results."""
        if self.protocol == "messages":
            messages = self.body.get("messages") or []
            if not messages:
                return []
            content = messages[-1].get("content")
            return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        items = list(self.body.get("input") or [])
        tail: List[Dict[str, Any]] = []
        for item in reversed(items):
            if item.get("role") == "assistant" or item.get("type") in ("function_call", "reasoning", "custom_tool_call"):
                break
            tail.insert(0, item)
        return tail

    def tool_results(self) -> List[str]:
        """The outputs of the tool calls the model made in its last turn, as text."""
        out = []
        for item in self.last_input():
            if item.get("type") == "tool_result":
                out.append("\n".join(_message_texts(item.get("content"))))
            elif item.get("type") in ("function_call_output", "custom_tool_call_output"):
                output = item.get("output")
                out.append(output if isinstance(output, str) else "\n".join(_message_texts(output)))
        return out

    def new_texts(self) -> List[str]:
        """The texts of the user or developer messages added since the model's last turn."""
        texts: List[str] = []
        for item in self.last_input():
            if self.protocol == "messages":
                if item.get("type") == "text":
                    texts.append(str(item.get("text", "")))
            elif item.get("type") == "message":
                texts += _message_texts(item.get("content"))
        return texts

    def stop_feedback(self) -> Optional[str]:
        """The Stop hook's reason when the CLI sent it back as this request's new user turn, else None."""
        for text in self.new_texts():
            if self.protocol == "messages" and text.startswith("Stop hook feedback:"):
                return text[len("Stop hook feedback:"):].strip()
            if self.protocol == "responses" and "<hook_prompt" in text:
                return text
        return None


def _message_texts(content: Any) -> List[str]:
    if isinstance(content, str):
        return [content]
    texts = []
    for block in content or []:
        if isinstance(block, dict):
            if isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "tool_result":
                texts += _message_texts(block.get("content"))
    return texts


Script = Callable[[Exchange], Turn]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    model: "ScriptedModel"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._empty(200)

    def do_GET(self) -> None:  # noqa: N802
        self.server.model.others.append(("GET", self.path))
        self._empty(404)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        model = self.server.model
        if self.path.split("?")[0] != model.path:
            model.others.append(("POST", self.path))
            self._empty(404)
            return
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            self._empty(400)
            return
        events = model.answer(body, {k.lower(): v for k, v in self.headers.items()})
        data = "".join(f"event: {name}\ndata: {json.dumps(payload)}\n\n" for name, payload in events).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ScriptedModel:
    """A model server on 127.0.0.1; ``with`` starts it at a free port and stops it.

    :param script: called with each model request's :class:`Exchange`, one at a
        time, in the order the requests arrive; returns the turn to answer.
    :ivar exchanges: every model request, in order, each with the turn it got.
    :ivar others: any other request (method, path), answered 404.
    """

    protocol = ""
    path = ""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.exchanges: List[Exchange] = []
        self.others: List[Tuple[str, str]] = []
        self.errors: List[str] = []
        self.port = 0
        self._lock = threading.Lock()

    def __enter__(self) -> "ScriptedModel":
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.model = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"scripted-{self.protocol}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def answer(self, body: Dict[str, Any], headers: Dict[str, str]) -> Sequence[Tuple[str, Dict[str, Any]]]:
        exchange = Exchange(self.protocol, body, headers)
        with self._lock:
            self.exchanges.append(exchange)
            try:
                turn = self.script(exchange)
            except Exception as exc:  # the script's own failure: recorded for the test, and the session is ended
                self.errors.append(f"{type(exc).__name__}: {exc}")
                turn = Turn(text=f"script error: {exc}")
            exchange.answer = turn
        return self.events(body, turn)

    def events(self, body: Dict[str, Any], turn: Turn) -> Sequence[Tuple[str, Dict[str, Any]]]:
        raise NotImplementedError


class MessagesModel(ScriptedModel):
    """Anthropic's Messages API, streamed, as Claude Code calls it."""

    protocol = "messages"
    path = "/v1/messages"
    url = property(lambda self: f"http://127.0.0.1:{self.port}")

    def events(self, body: Dict[str, Any], turn: Turn) -> Sequence[Tuple[str, Dict[str, Any]]]:
        message = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": body.get("model", "scripted"),
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}
        out: List[Tuple[str, Dict[str, Any]]] = [("message_start", {"type": "message_start", "message": message})]
        blocks: List[Tuple[Dict[str, Any], Dict[str, Any]]] = []
        if turn.text or not turn.calls:
            blocks.append(({"type": "text", "text": ""}, {"type": "text_delta", "text": turn.text}))
        for call in turn.calls:
            blocks.append(({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name, "input": {}},
                           {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}))
        for index, (start, delta) in enumerate(blocks):
            out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
            out.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
            out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        stop = "tool_use" if turn.calls else "end_turn"
        out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 1}}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out


class ResponsesModel(ScriptedModel):
    """OpenAI's Responses API, streamed, as Codex calls it (``wire_api = "responses"``)."""

    protocol = "responses"
    path = "/v1/responses"
    url = property(lambda self: f"http://127.0.0.1:{self.port}/v1")

    def events(self, body: Dict[str, Any], turn: Turn) -> Sequence[Tuple[str, Dict[str, Any]]]:
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        items: List[Dict[str, Any]] = []
        if turn.text or not turn.calls:
            items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": turn.text, "annotations": []}]})
        for call in turn.calls:
            namespace, _, name = call.name.rpartition(".")
            item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:24]}", "call_id": f"call_{uuid.uuid4().hex[:24]}",
                    "name": name, "arguments": json.dumps(call.arguments), "status": "completed"}
            if namespace:
                item["namespace"] = namespace
            items.append(item)
        out: List[Tuple[str, Dict[str, Any]]] = [
            ("response.created", {"type": "response.created", "response": {"id": response_id, "status": "in_progress", "output": []}})]
        for index, item in enumerate(items):
            out.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": index, "item": item}))
            out.append(("response.output_item.done", {"type": "response.output_item.done", "output_index": index, "item": item}))
        usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2}
        out.append(("response.completed", {"type": "response.completed",
                                           "response": {"id": response_id, "status": "completed", "output": items, "usage": usage}}))
        return out
