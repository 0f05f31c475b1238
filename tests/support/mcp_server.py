"""An MCP server written in a test with the ``mcp`` SDK, served over Streamable HTTP on loopback in
the test's own event loop (at ``http://127.0.0.1:PORT/mcp``) for as long as the ``async with`` lasts."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp.server.mcpserver import MCPServer

from tests.support.ports import reserved_port


class Served:
    """Without a ``port``, one is held from construction to the exit (tests/support/ports.py)."""

    def __init__(self, server: MCPServer, port: int | None = None) -> None:
        self.server = server
        self.held = None
        if port is None:
            port, self.held = reserved_port()
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> "Served":
        import uvicorn

        # its own uvicorn server (what ``run_streamable_http_async`` runs), so that the exit can end it
        # gracefully: a cancelled one left its listening socket open, and the next test to serve the
        # same port (a shared server's allowed MCP URL) could not bind it
        app = self.server.streamable_http_app(host="127.0.0.1")
        self.uvicorn = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.task = asyncio.create_task(self.uvicorn.serve())
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return self
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError("the MCP server did not start")

    async def __aexit__(self, *exc: Any) -> None:
        if self.task is not None:
            self.uvicorn.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout=10)
            except (asyncio.TimeoutError, Exception):
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
        if self.held is not None:
            self.held.close()
            self.held = None
