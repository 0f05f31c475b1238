"""The port to the MCP servers a session calls: ``ToolServer``, one server connected, and ``Connect``,
what opens one. ``McpServers`` (mcp.py) keeps a session's servers through it.

Reaching a server is I/O (the ``mcp`` SDK over its HTTP client), so its adapter lives outside the
core, in host/mcp_client.py, and the host hands it to the server; the core's own ``unreachable``
reaches nothing, so a session composed without a client reports each MCP listing as failed.
"""

from __future__ import annotations

from typing import Protocol

from ..config import McpConfig
from ..protocol import events as ev


class McpFailure(Exception):
    """What a listing or a call of a tool server ended with, as the client is told it."""

    def __init__(self, error: ev.McpCallError) -> None:
        super().__init__(error.message)
        self.error = error


class ToolServer(Protocol):
    """One MCP server of a session, connected (or connecting) from its creation until ``close``."""

    tool: ev.McpTool  # the session's tool that named it, secrets included

    @property
    def closed(self) -> bool: ...

    async def listed(self) -> list[ev.McpListedTool]:
        """The server's tools, once connected; ``McpFailure`` if it could not be reached in time."""

    async def call(self, name: str, arguments: dict[str, object]) -> str:
        """The tool's output; ``McpFailure`` with the error to report otherwise."""

    async def close(self) -> None: ...


class Connect(Protocol):
    """Opens the connection to the server of ``tool`` (checked against ``settings`` already)."""

    def __call__(self, tool: ev.McpTool, settings: McpConfig, session_id: str) -> ToolServer: ...


class Unreachable:
    """A tool server no client reaches: what a session composed without an MCP client connects to."""

    def __init__(self, tool: ev.McpTool, settings: McpConfig, session_id: str) -> None:
        self.tool = tool
        self.closed = False

    async def listed(self) -> list[ev.McpListedTool]:
        self.closed = True
        raise McpFailure(ev.McpCallError(type="protocol_error", code=-32000, message="This server was started without an MCP client."))

    async def call(self, name: str, arguments: dict[str, object]) -> str:
        raise McpFailure(ev.McpCallError(type="protocol_error", code=-32000, message="The connection to the MCP server is closed."))

    async def close(self) -> None:
        self.closed = True


unreachable: Connect = Unreachable
