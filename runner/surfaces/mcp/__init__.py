"""The runner as a Model Context Protocol server over stdio (``python3 -m runner mcp``).

Three modules, one concept each:

* :mod:`runner.surfaces.mcp.jsonrpc`: newline-delimited JSON-RPC 2.0 framing: reading
  one bounded message, classifying it, and the error objects of the protocol.
* :mod:`runner.surfaces.mcp.tools`: the tool table: each tool's JSON Schemas (input and
  output), its annotations, the authority it needs, and the library call it makes.
* :mod:`runner.surfaces.mcp.server`: the session: the initialize handshake, the methods,
  the resources, and the lease the server holds for its owner.

Standard library only; every tool calls the library (:class:`runner.execution.run.Run`,
:mod:`runner.execution.recovery`, :mod:`runner.surfaces.views`), never the command line.
"""

from .jsonrpc import PROTOCOL_VERSION

__all__ = ["PROTOCOL_VERSION"]
