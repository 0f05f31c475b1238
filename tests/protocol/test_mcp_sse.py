"""MCP servers that speak only the older HTTP+SSE transport (an event stream at ``/sse``, messages
posted to ``/messages/``), written here with the ``mcp`` SDK's own SSE server on loopback. The
session reaches one after Streamable HTTP is refused with 405 (the MCP spec's backwards-compatible
client), or at once for a URL under ``mcp.sse_servers``; every request is still held to the
allow-list. The official openai SDK is the client, every event validated against its GA models."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer

from tests.support.client import connect


class SseServer:
    """An SSE-only MCP server; ``requests`` records each HTTP request's method and path."""

    def __init__(self) -> None:
        # the port is held from here (the allow-list names it when the module is collected) until
        # the test serves on it: a port only picked then was taken by another process meanwhile
        self.sock = self._bind(0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/sse"
        self.requests: list[tuple[str, str]] = []
        self.calls: list[str] = []
        server = MCPServer("sse-only")

        @server.tool()
        def weather(city: str) -> str:
            """The weather in a city."""
            self.calls.append(city)
            return f"foggy and 9 degrees in {city}"

        app = server.sse_app(host="127.0.0.1")

        async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.requests.append((scope["method"], scope["path"]))
            await app(scope, receive, send)

        self.server = uvicorn.Server(uvicorn.Config(recorded, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"))
        self.task: asyncio.Task[Any] | None = None

    @staticmethod
    def _bind(port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return sock

    async def __aenter__(self) -> "SseServer":
        if self.sock.fileno() == -1:  # closed with the last serve: bind the same port again
            self.sock = self._bind(self.port)
        self.server.started = self.server.should_exit = self.server.force_exit = False
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        for _ in range(200):
            if self.server.started:
                return self
            await asyncio.sleep(0.05)
        raise RuntimeError("the SSE server did not start")

    async def __aexit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.server.force_exit = True  # (its event streams stay open)
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


FALLBACK, EXPLICIT, NARROW = SseServer(), SseServer(), SseServer()


@pytest.fixture(scope="module")
def ws_base(make_server: Any) -> str:
    allowed = [f"http://127.0.0.1:{s.port}/" for s in (FALLBACK, EXPLICIT)] + [NARROW.url]  # NARROW: /sse only, not its /messages/
    settings = {"allowed_servers": allowed, "sse_servers": [EXPLICIT.url], "list_timeout_s": 5.0, "call_timeout_s": 5.0}
    return str(make_server(server={"mcp": settings}).ws_base)


async def listed_and_called(ws_base: str, server: SseServer) -> None:
    async with connect(ws_base) as c:
        tool = {"type": "mcp", "server_label": "fog", "server_url": server.url, "require_approval": "never"}
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "tools": [tool]}})
        await c.expect("session.updated")
        events = await c.until("mcp_list_tools.completed", timeout=15)
        assert [e.type for e in events if e.type.startswith("mcp_list_tools.")] == ["mcp_list_tools.in_progress", "mcp_list_tools.completed"]
        assert [t.name for t in (await c.expect("conversation.item.done")).item.tools] == ["weather"]
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "The weather in Bergen?"}]}})
        await c.send({"type": "response.create"})
        events = await c.until("response.done", timeout=15)
        (call,) = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"]
        assert call.name == "weather" and json.loads(call.arguments) == {"city": "Bergen"} and call.output == "foggy and 9 degrees in Bergen"
        assert "response.mcp_call.completed" in [e.type for e in events]
        assert "foggy and 9 degrees in Bergen" in next(e.text for e in events if e.type == "response.output_text.done")
        assert server.calls == ["Bergen"]


async def test_a_server_that_refuses_streamable_http_is_reached_over_sse(ws_base):
    async with FALLBACK:
        await listed_and_called(ws_base, FALLBACK)
    methods = [r for r in FALLBACK.requests if r[1] == "/sse"]
    assert methods[0] == ("POST", "/sse") and ("GET", "/sse") in methods  # refused with 405, then the event stream
    assert any(r == ("POST", "/messages/") for r in FALLBACK.requests)


async def test_a_server_under_sse_servers_is_reached_over_sse_at_once(ws_base):
    async with EXPLICIT:
        await listed_and_called(ws_base, EXPLICIT)
    assert ("POST", "/sse") not in EXPLICIT.requests and EXPLICIT.requests[0] == ("GET", "/sse")


async def test_the_sse_message_endpoint_is_held_to_the_allow_list(ws_base):
    """Only ``/sse`` allowed: the messages the server's stream points at (``/messages/``) are off the
    list, so nothing is posted there and the listing fails, saying why."""
    async with NARROW, connect(ws_base) as c:
        tool = {"type": "mcp", "server_label": "fog", "server_url": NARROW.url, "require_approval": "never"}
        await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [tool]}})
        await c.expect("session.updated")
        events = await c.until("mcp_list_tools.failed", timeout=15)
        assert "mcp_list_tools.completed" not in [e.type for e in events]
        error = await c.expect("error")
        assert error.error.code == "mcp_list_tools_failed" and "mcp.allowed_servers" in error.error.message, error.error.message
        assert not [r for r in NARROW.requests if r[1].startswith("/messages")] and NARROW.calls == []
        # the session lives
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        await c.expect("session.updated")
