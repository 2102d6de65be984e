"""Newline-delimited JSON-RPC 2.0, as MCP's stdio transport frames it.

Each message is one line of UTF-8 JSON with no embedded newline. This module
reads one message at a time with a byte bound (a longer line is consumed to
its end and reported, never buffered whole), classifies it as a request, a
notification or something invalid, and builds the protocol's error objects.
It knows nothing of tools or runs.
"""

import json
from typing import Any, BinaryIO, Dict, NamedTuple, Optional, Union

from ...base.canonical import loads_strict

__all__ = [
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_META_KEY",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "RESOURCE_NOT_FOUND",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "MAX_MESSAGE_BYTES",
    "Incoming",
    "ProtocolError",
    "read_message",
    "encode",
    "response",
    "error_response",
]

#: The revision this server speaks: the newest one reachable through the
#: ``initialize`` handshake, which the official Python SDK's ``ClientSession``
#: offers (its ``LATEST_HANDSHAKE_VERSION``).
PROTOCOL_VERSION = "2025-11-25"

#: Where a request of the per-request-envelope revisions names its version.
PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002
UNSUPPORTED_PROTOCOL_VERSION = -32022

#: A message longer than this is refused: four times the largest document
#: (payload, receipt, evidence) the runner accepts, with room for the envelope.
MAX_MESSAGE_BYTES = 1024 * 1024

Id = Union[str, int, None]


class ProtocolError(Exception):
    """A JSON-RPC error to send back: ``code``, ``message`` and optional ``data``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Incoming(NamedTuple):
    """One classified line: a request (``id`` set), a notification, a response, or an error to answer."""

    kind: str  # "request", "notification", "response", "invalid", "empty", "eof"
    method: Optional[str] = None
    params: Optional[Dict[str, Any]] = None
    id: Id = None
    error: Optional[ProtocolError] = None


def _valid_id(value: Any) -> bool:
    # MCP: a string or an integer, never null (and a bool is not an integer here).
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def read_message(stream: BinaryIO, limit: int = MAX_MESSAGE_BYTES) -> Incoming:
    """Read and classify the next line of ``stream``, holding at most ``limit`` + 1 bytes of it.

    :returns: ``eof`` at the end of input, ``empty`` for a blank line,
        ``invalid`` (with the error to send and the id when it could be read)
        for anything that is not one well-formed JSON-RPC 2.0 message.
    """
    line = stream.readline(limit + 1)
    if not line:
        return Incoming("eof")
    if len(line) > limit and not line.endswith(b"\n"):
        while True:  # consume the rest of the oversized line, a bounded piece at a time
            rest = stream.readline(65536)
            if not rest or rest.endswith(b"\n"):
                break
        return Incoming("invalid",
                        error=ProtocolError(INVALID_REQUEST, f"message larger than {limit} bytes", {"limit": limit}))
    if not line.strip():
        return Incoming("empty")
    try:
        message = loads_strict(line)
    except ValueError as exc:  # also bad UTF-8 (UnicodeDecodeError is a ValueError)
        return Incoming("invalid", error=ProtocolError(PARSE_ERROR, f"parse error: {exc}"))
    return classify(message)


def classify(message: Any) -> Incoming:
    """Sort a parsed message into request, notification or response, or say why it is invalid."""
    if isinstance(message, list):
        return Incoming("invalid",
                        error=ProtocolError(INVALID_REQUEST, "batches are not supported: send one message per line"))
    if not isinstance(message, dict):
        return Incoming("invalid", error=ProtocolError(INVALID_REQUEST, "a message must be a JSON object"))
    has_id = "id" in message
    ident = message.get("id") if has_id and _valid_id(message.get("id")) else None
    if message.get("jsonrpc") != "2.0":
        return Incoming("invalid", id=ident,
                        error=ProtocolError(INVALID_REQUEST, 'a message must carry "jsonrpc": "2.0"'))
    method = message.get("method")
    if method is None and ("result" in message or "error" in message):
        return Incoming("response", id=ident)
    if not isinstance(method, str) or not method:
        return Incoming("invalid", id=ident, error=ProtocolError(INVALID_REQUEST, "a request needs a method name"))
    if has_id and not _valid_id(message["id"]):
        return Incoming("invalid", error=ProtocolError(INVALID_REQUEST, "a request id must be a string or an integer"))
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        error = ProtocolError(INVALID_PARAMS, "params must be a JSON object")
        return (Incoming("invalid", method=method, id=ident, error=error) if has_id
                else Incoming("notification", method=method, params={}))
    return Incoming("request" if has_id else "notification", method=method, params=params, id=ident)


def encode(message: Dict[str, Any]) -> bytes:
    """One line: compact JSON (which never contains a raw newline) and the newline."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8") + b"\n"


def response(ident: Id, result: Dict[str, Any]) -> Dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def error_response(ident: Id, error: ProtocolError) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return {"jsonrpc": "2.0", "id": ident, "error": body}
