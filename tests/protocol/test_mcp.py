"""MCP tools run by the server (``type: "mcp"``): a real MCP server written here with the ``mcp``
SDK on loopback, the official openai SDK as the client (every event validated against its GA
models), the synthetic pipeline calling the tool the user's words name."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from host.mcp_client import McpConnection
from pipelines.base import ResponseRequest, TextDelta, ToolCall, ToolCallDelta, Usage
from realtime_omni import config as config_file
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.audio import WireFormat
from realtime_omni.session.audio_out import EventAudio
from realtime_omni.session.mcp import McpServers, pipeline_view
from realtime_omni.session.run import ResponseRun
from tests.core.test_run import ListPort
from tests.support.client import connect
from tests.support.fake_pipeline import CAPS
from tests.support.mcp_server import Served
from tests.support.ports import reserved_port
from tests.support.validation import validate


def _free_port() -> int:
    """A port held for the module's life (tests/support/ports.py): picked now, served later."""
    port, sock = reserved_port()
    _HELD.append(sock)
    return port


# The allowed MCP servers' ports: each test starts its own on a port of its own (a server killed by
# cancelling its task may hold its port until the process ends).
_HELD: list[socket.socket] = []
_PORTS = [_free_port() for _ in range(16)]
ALLOWED = [f"http://127.0.0.1:{port}/mcp" for port in _PORTS]
PORTS = iter(_PORTS)
SECRET = "s3cret-token-never-echoed"
MCP_SETTINGS = {"allowed_servers": ALLOWED, "call_timeout_s": 2.0, "list_timeout_s": 5.0, "max_output_bytes": 1000, "max_servers": 2}


class ToolServer(Served):
    """An MCP server with a few tools, served by the SDK's Streamable HTTP runner."""

    def __init__(self, port: int | None = None) -> None:
        server = MCPServer("test-tools")
        super().__init__(server, next(PORTS) if port is None else port)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.started = asyncio.Event()

        @server.tool()
        def weather(city: str) -> str:
            """The weather in a city."""
            self.calls.append(("weather", {"city": city}))
            return f"sunny and 21 degrees in {city}"

        @server.tool()
        async def slowpoke(city: str) -> str:
            """Answers after a long while."""
            self.calls.append(("slowpoke", {"city": city}))
            self.started.set()
            await asyncio.sleep(30)
            return "too late"

        @server.tool()
        def verbose(city: str) -> str:
            """Answers with far too much."""
            return "x" * 5000

        @server.tool()
        def broken(city: str) -> str:
            """Fails."""
            raise ToolError("the backend is down")

    @property
    def sessions(self) -> int:
        """MCP sessions open on this server now."""
        try:
            return len(self.server.session_manager._server_instances)
        except RuntimeError:  # (no session manager yet: nothing ever connected)
            return 0

    async def __aenter__(self) -> "ToolServer":
        await super().__aenter__()
        return self

    async def kill(self) -> None:
        await self.__aexit__()


@pytest.fixture(scope="module")
def mcp_server_url(make_server: Any) -> str:
    return make_server(server={"mcp": MCP_SETTINGS}).ws_base


def mcp_tool(server: ToolServer, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "tools", "server_url": server.url, "require_approval": "never", **fields}


async def _configure(c: Any, tool: dict[str, Any]) -> Any:
    await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "tools": [tool]}})
    updated = await c.expect("session.updated")
    return updated


async def _ask(c: Any, text: str) -> list[Any]:
    await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await c.send({"type": "response.create"})
    return await c.until("response.done", timeout=15)


async def test_listing_a_call_and_the_answer_from_its_output(mcp_server_url):
    async with ToolServer() as tools:
        await _call_and_answer(mcp_server_url, tools)
        # the client gone: its session's MCP connection closed on the server
        for _ in range(100):
            if tools.sessions == 0:
                break
            await asyncio.sleep(0.05)
        assert tools.sessions == 0


async def _call_and_answer(mcp_server_url: str, tools: ToolServer) -> None:
    async with connect(mcp_server_url) as c:
        updated = await _configure(c, mcp_tool(tools, headers={"X-Key": SECRET}, authorization=SECRET, allowed_tools=["weather", "broken"]))
        shown = updated.session.tools[0]
        assert shown.type == "mcp" and shown.server_url == tools.url and shown.headers is None and shown.authorization is None
        listing = await c.until("mcp_list_tools.completed")
        added = next(e for e in listing if e.type == "conversation.item.added")
        assert added.item.type == "mcp_list_tools"
        assert [e.type for e in listing if e.type.startswith("mcp_list_tools.")] == ["mcp_list_tools.in_progress", "mcp_list_tools.completed"]
        done = await c.expect("conversation.item.done")
        assert done.item.type == "mcp_list_tools" and sorted(t.name for t in done.item.tools) == ["broken", "weather"]  # allowed_tools
        assert tools.sessions == 1

        events = await _ask(c, "What is the weather in Paris today?")
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" not in kinds  # the server's call, not the client's
        order = [k for k in kinds if k.startswith("response.mcp_call")]
        assert order[0] == "response.mcp_call_arguments.delta" and order[-2:] == ["response.mcp_call.in_progress", "response.mcp_call.completed"]
        call = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
        assert call.server_label == "tools" and call.name == "weather" and json.loads(call.arguments) == {"city": "Paris"}
        assert call.output == "sunny and 21 degrees in Paris" and call.error is None
        assert tools.calls == [("weather", {"city": "Paris"})]
        response = events[-1].response
        assert response.status == "completed"
        assert [i.type for i in response.output] == ["mcp_call", "message"]  # the answer goes on in the same response
        text = next(e.text for e in events if e.type == "response.output_text.done")
        assert "sunny and 21 degrees in Paris" in text
        assert SECRET not in json.dumps([e.model_dump() for e in c.events])

        # a tool error is the call's error, and the answer says so
        events = await _ask(c, "Is the broken thing fixed?")
        call = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
        assert "response.mcp_call.failed" in [e.type for e in events]
        assert call.output is None and call.error.type == "tool_execution_error" and "the backend is down" in call.error.message
        assert events[-1].response.status == "completed"


async def test_a_server_not_allowed_is_refused_before_any_connection(mcp_server_url):
    other = ToolServer(_free_port())
    async with other, connect(mcp_server_url) as c:
        port = ALLOWED[0].split(":")[2].split("/")[0]
        for url in [other.url, f"http://127.0.0.1:{port}.evil.example/mcp", f"http://127.0.0.1:{port}/other", f"https://127.0.0.1:{port}/mcp"]:
            await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [mcp_tool(other, server_url=url)]}})
            err = await c.expect("error")
            assert err.error.code == "mcp_server_not_allowed" and err.error.param == "session.tools[0].server_url" and "mcp.allowed_servers" in err.error.message
        assert await c.quiet(0.3) == []
        assert other.sessions == 0 and other.calls == []
        # nor through response.create's own tools
        await c.send({"type": "response.create", "response": {"tools": [mcp_tool(other)]}})
        err = await c.expect("error")
        assert err.error.code == "mcp_server_not_allowed" and err.error.param == "response.tools[0].server_url"
        assert other.sessions == 0
        # the session is unchanged and lives
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "hi"}})
        assert (await c.expect("session.updated")).session.tools == []


async def test_a_beta_connection_is_told_mcp_needs_ga(mcp_server_url):
    async with connect(mcp_server_url, beta=True) as c:
        await c.send({"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "t", "server_url": ALLOWED[0]}]}})
        err = await c.expect("error")
        assert (err.error.code, err.error.param) == ("unsupported_value", "session.tools[0].type")


async def test_approval_granted_runs_the_call_and_declined_does_not(mcp_server_url):
    async with ToolServer() as tools, connect(mcp_server_url) as c:
        await _configure(c, mcp_tool(tools, require_approval={"never": {"tool_names": ["verbose"]}}))
        await c.until("mcp_list_tools.completed")
        events = await _ask(c, "What is the weather in Oslo?")
        request = next(e.item for e in events if e.type == "response.output_item.done").model_dump()
        assert request["type"] == "mcp_approval_request" and request["name"] == "weather" and tools.calls == []
        assert not any(e.type.startswith("response.mcp_call") for e in events)

        await c.send({"type": "conversation.item.create", "item": {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}})
        events = await c.until("response.done", timeout=15)
        call = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
        assert call.approval_request_id == request["id"] and call.output == "sunny and 21 degrees in Oslo"
        assert tools.calls == [("weather", {"city": "Oslo"})]
        assert "sunny and 21 degrees in Oslo" in next(e.text for e in events if e.type == "response.output_text.done")

        events = await _ask(c, "And the weather in Rome?")
        request = next(e.item for e in events if e.type == "response.output_item.done").model_dump()
        await c.send({"type": "conversation.item.create", "item": {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": False}})
        events = await c.until("response.done", timeout=15)
        assert not any(e.type.startswith("response.mcp_call") for e in events)
        assert "declined" in next(e.text for e in events if e.type == "response.output_text.done")
        assert len(tools.calls) == 1

        # an approval answers a request of this conversation, once
        await c.send({"type": "conversation.item.create", "item": {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}})
        assert (await c.expect("error")).error.param == "item.approval_request_id"


async def test_mcp_tools_in_the_configs_session_run_without_a_client_when_approval_is_never(make_server):
    """What a phone caller gets (docs/tools.md): the config's session (`session:`, or `sip.session`
    for calls: the same object) names the MCP server with `require_approval: never`; a client that
    sends no session.update and answers no approval hears the tool's output."""
    async with ToolServer() as tools:
        tool = mcp_tool(tools)
        sip_config = config_file.from_dict({"pipeline": {"kind": "synthetic"}, "mcp": MCP_SETTINGS, "sip": {"session": {"tools": [tool]}}})
        assert sip_config.sip.session.tools[0].require_approval == "never"  # type: ignore[index]
        server = make_server(server={"mcp": MCP_SETTINGS}, session={"output_modalities": ["text"], "tools": [tool]})
        async with connect(server.ws_base) as c:
            await c.until("mcp_list_tools.completed")
            events = await _ask(c, "What is the weather in Lima?")
            assert not any(e.type == "response.output_item.done" and e.item.type == "mcp_approval_request" for e in events)
            assert tools.calls == [("weather", {"city": "Lima"})]
            assert "sunny and 21 degrees in Lima" in next(e.text for e in events if e.type == "response.output_text.done")


WEATHER_FUNCTION = {"type": "function", "name": "get_time", "description": "The time in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


async def test_tool_choice_of_an_mcp_server_and_tool_is_honoured(mcp_server_url):
    async with ToolServer() as tools, connect(mcp_server_url) as c:
        # a function first: "required" alone would call it (the synthetic pipeline calls the first tool)
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER_FUNCTION, mcp_tool(tools, allowed_tools=["weather", "broken"])]}})
        await c.expect("session.updated")
        await c.until("mcp_list_tools.completed")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there, Lisbon"}]}})
        # a named tool: that one, though the words name none
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "mcp", "server_label": "tools", "name": "weather"}}})
        events = await c.until("response.done", timeout=15)
        (call,) = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"]
        assert call.name == "weather" and call.output == "sunny and 21 degrees in Lisbon"
        # the forced call once, then the answer from its output in the same response (tool_choice "auto" after it)
        assert [o.type for o in events[-1].response.output] == ["mcp_call", "message"]
        # a server without a name: a call of one of its tools, never the function
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "mcp", "server_label": "tools"}}})
        events = await c.until("response.done", timeout=15)
        kinds = [e.item.type for e in events if e.type == "response.output_item.done"]
        assert "function_call" not in kinds and kinds.count("mcp_call") == 1, kinds
        # the session's own tool_choice serves its responses too
        await c.send({"type": "session.update", "session": {"type": "realtime", "tool_choice": {"type": "mcp", "server_label": "tools", "name": "weather"}}})
        updated = await c.expect("session.updated")
        assert updated.session.tool_choice.type == "mcp" and updated.session.tool_choice.name == "weather"
        await c.send({"type": "response.create"})
        events = await c.until("response.done", timeout=15)
        assert [e.item.name for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"] == ["weather"]
        assert len(tools.calls) == 3


async def test_the_listed_tools_are_prepared_once_listed(mcp_server_url, make_server):
    """The pipeline is told what every response begins with (``prepare``: the cascade prefills it)
    again when the listing completes, so an MCP server's tools are prefilled off the turn's path as
    a function's are."""
    srv = make_server(server={"mcp": MCP_SETTINGS})
    async with ToolServer() as tools, connect(mcp_server_url) as c:
        await _configure(c, mcp_tool(tools, allowed_tools=["weather", "broken"]))
        await c.until("mcp_list_tools.completed")
        (session,) = [s for s in await srv.acall(lambda: list(srv.server.sessions)) if "tools" in s.mcp.listings and not s.mcp.closed]
        for _ in range(100):  # (prepared just after the listing's events)
            if list(session.ctx.pipe.prepared)[-1][1]:
                break
            await asyncio.sleep(0.02)
        assert [names for _, names in session.ctx.pipe.prepared][-2:] == [[], ["weather", "broken"]]


async def test_tool_choice_of_an_mcp_tool_not_offered_is_refused(mcp_server_url):
    async with ToolServer() as tools, connect(mcp_server_url) as c:
        await _configure(c, mcp_tool(tools, allowed_tools=["weather"]))
        await c.until("mcp_list_tools.completed")
        # a label no tool has: refused by the update, which changes nothing
        await c.send({"type": "session.update", "session": {"type": "realtime", "tool_choice": {"type": "mcp", "server_label": "other"}}})
        err = await c.expect("error")
        assert (err.error.code, err.error.param) == ("invalid_value", "session.tool_choice.server_label") and "'other'" in err.error.message
        # a tool the server does not offer (allowed_tools left it out): the response is refused
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "mcp", "server_label": "tools", "name": "broken"}}})
        err = await c.expect("error")
        assert (err.error.code, err.error.param) == ("invalid_value", "response.tool_choice.name")
        assert "'broken'" in err.error.message and "weather" in err.error.message
        assert not [e for e in await c.quiet(0.3) if e.type == "response.created"] and tools.calls == []


@pytest.mark.slow
async def test_a_slow_server_and_oversize_output_fail_the_call_not_the_session(mcp_server_url):
    async with ToolServer() as tools, connect(mcp_server_url) as c:
        await _configure(c, mcp_tool(tools))
        await c.until("mcp_list_tools.completed")
        events = await _ask(c, "Ask the slowpoke about Paris")  # call_timeout_s: 2
        call = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
        assert "response.mcp_call.failed" in [e.type for e in events] and "in time" in call.error.message
        assert events[-1].response.status == "completed"

        events = await _ask(c, "Something verbose about Paris")  # max_output_bytes: 1000
        call = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
        assert call.output is None and "mcp.max_output_bytes" in call.error.message



KILLABLE = """
import asyncio, sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("killable")

@server.tool()
async def slowpoke(city: str) -> str:
    \"\"\"Answers after a long while.\"\"\"
    print("called", flush=True)
    await asyncio.sleep(30)
    return "too late"

asyncio.run(server.run_streamable_http_async(host="127.0.0.1", port=int(sys.argv[1])))
"""


@pytest.mark.slow
async def test_a_server_killed_mid_call_fails_the_call_not_the_session(mcp_server_url):
    port = next(PORTS)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", KILLABLE, str(port), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(400):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        async with connect(mcp_server_url) as c:
            url = f"http://127.0.0.1:{port}/mcp"
            await _configure(c, {"type": "mcp", "server_label": "k", "server_url": url, "require_approval": "never"})
            await c.until("mcp_list_tools.completed")
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "slowpoke please"}]}})
            await c.send({"type": "response.create"})
            assert proc.stdout is not None
            while (await asyncio.wait_for(proc.stdout.readline(), 10)).strip() != b"called":  # (the access log shares stdout)
                pass
            proc.kill()  # mid-call
            events = await c.until("response.done", timeout=15)
            assert "response.mcp_call.failed" in [e.type for e in events] and events[-1].response.status == "completed"
            # the session lives, and the dead server's next call fails at once
            events = await _ask(c, "slowpoke again")
            assert "response.mcp_call.failed" in [e.type for e in events] and events[-1].response.status == "completed"
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_a_server_that_is_down_fails_its_listing(mcp_server_url):
    async with connect(mcp_server_url) as c:
        await _configure(c, mcp_tool(ToolServer()))  # (never started)
        events = await c.until("mcp_list_tools.failed", timeout=10)
        assert any(e.type == "conversation.item.added" and e.item.type == "mcp_list_tools" for e in events)
        err = await c.expect("error")
        assert err.error.code == "mcp_list_tools_failed"
        events = await _ask(c, "What is the weather in Paris?")  # no tool offered: a plain answer
        assert [i.type for i in events[-1].response.output] == ["message"]


def test_mcp_allow_flags_make_the_allow_list():
    from host import cli
    from realtime_omni import config as config_file

    assert config_file.load("synthetic").mcp.allowed_servers == []  # nothing allowed by default
    args = cli.parser().parse_args(["serve", "--config", "synthetic", "--mcp-allow", "http://127.0.0.1:9000/mcp", "--mcp-allow", "https://tools.example/"])
    cfg = cli.config_from(args)
    assert cfg.mcp.allowed_servers == ["http://127.0.0.1:9000/mcp", "https://tools.example/"]
    assert cfg.mcp.max_servers == config_file.load("synthetic").mcp.max_servers


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:9000/mcp", True),
        ("http://127.0.0.1:9000/mcp/x", True),
        ("http://127.0.0.1:9000/other", False),
        ("http://127.0.0.1:90001/mcp", False),
        ("http://127.0.0.1:900/mcp", False),
        ("https://127.0.0.1:9000/mcp", False),
        ("http://127.0.0.1:9000.evil.example/mcp", False),
        ("http://user:pw@127.0.0.1:9000/mcp", False),
        ("file:///etc/passwd", False),
        ("https://tools.example/a", True),
        ("https://tools.example.evil/a", False),
    ],
)
def test_the_allow_list_compares_scheme_host_and_port_exactly(url, ok):
    from realtime_omni.session.mcp import allowed

    assert allowed(url, ["http://127.0.0.1:9000/mcp", "https://tools.example/"]) is ok


class Recorder:
    """Not an MCP server: an HTTP server on an allowed URL that records what reaches it. ``/mcp``
    redirects (307, the same origin) to ``/hidden/mcp``, off the allow-list; ``/mcp/garbage``
    answers HTML."""

    def __init__(self) -> None:
        self.port = next(PORTS)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.server: Any = None
        self.task: asyncio.Task[Any] | None = None

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests.append((scope["path"], {k.decode().lower(): v.decode() for k, v in scope["headers"]}))
        if scope["path"] == "/mcp":
            status, headers, body = 307, [(b"location", f"http://127.0.0.1:{self.port}/hidden/mcp".encode())], b""
        elif scope["path"] == "/mcp/garbage":
            status, headers, body = 200, [(b"content-type", b"text/html")], b"<html>not an MCP server</html>"
        else:
            status, headers, body = 404, [], b""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __aenter__(self) -> "Recorder":
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", interface="asgi3"))
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, 10)


async def test_a_redirect_off_the_list_is_not_followed_and_the_secrets_reach_only_the_server(mcp_server_url, caplog):
    caplog.set_level(logging.DEBUG)  # the server's logs (its thread's too), every level: never the secrets
    async with Recorder() as rec, connect(mcp_server_url) as c:
        url = f"http://127.0.0.1:{rec.port}/mcp"
        tool = {"type": "mcp", "server_label": "r", "server_url": url, "headers": {"X-Key": SECRET}, "authorization": SECRET}
        await _configure(c, tool)
        await c.until("mcp_list_tools.failed", timeout=10)
        err = await c.expect("error")
        assert err.error.code == "mcp_list_tools_failed", err
        assert rec.requests and {path for path, _ in rec.requests} == {"/mcp"}  # /hidden/mcp never asked
        first = rec.requests[0][1]
        assert first["authorization"] == f"Bearer {SECRET}" and first["x-key"] == SECRET
        # an answer that is not MCP: the listing fails, the session lives
        await _configure(c, {**tool, "server_url": f"http://127.0.0.1:{rec.port}/mcp/garbage"})
        await c.until("mcp_list_tools.failed", timeout=10)
        assert rec.requests[-1][0] == "/mcp/garbage"
        assert SECRET not in json.dumps([e.model_dump() for e in c.events])
        events = await _ask(c, "hello")
        assert events[-1].response.status == "completed"
    assert f"127.0.0.1:{rec.port}/mcp" in caplog.text  # (the capture saw the connection's own logs)
    assert SECRET not in caplog.text


async def test_a_response_s_own_mcp_tools_are_connected_for_it(mcp_server_url):
    async with ToolServer() as tools, connect(mcp_server_url) as c:
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await c.expect("session.updated")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in Lima"}]}})
        await c.send({"type": "response.create", "response": {"tools": [mcp_tool(tools)]}})
        events = await c.until("response.done", timeout=15)
        kinds = [e.type for e in events]
        assert kinds.index("mcp_list_tools.completed") < kinds.index("response.created")
        call = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call")
        assert call.output == "sunny and 21 degrees in Lima"


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    leaves = [None, True, 0, -1, 1.5, "", "x", "always", "never", "weather", ALLOWED[-1], "http://127.0.0.1:1/mcp", "ftp://x", "http://[::1", "mcp"]
    if depth > 3 or rng.random() < 0.5:
        return rng.choice(leaves)
    if rng.random() < 0.4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["tool_names", "read_only", "always", "never", "X-Key", "type"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def random_mcp_tool(rng: random.Random) -> dict[str, Any]:
    fields = ["server_label", "server_url", "connector_id", "server_description", "headers", "authorization", "allowed_tools", "require_approval", "allowed_callers", "bogus"]
    tool: dict[str, Any] = {"type": "mcp"}
    for name in rng.sample(fields, rng.randrange(len(fields))):
        tool[name] = _random_value(rng)
    return tool


async def test_seeded_random_mcp_tool_shapes_get_an_answer_and_the_session_lives(mcp_server_url):
    """400 seeded random ``type: "mcp"`` tools (random fields, values and nesting; URLs allowed,
    refused and malformed): each update is answered (``session.updated`` or an ``error``), every
    event validates, and the session still answers at the end. A failure names its seed."""
    async with connect(mcp_server_url) as c:
        for seed in range(400):
            tool = random_mcp_tool(random.Random(seed))
            await c.send({"type": "session.update", "event_id": f"seed-{seed}", "session": {"type": "realtime", "tools": [tool]}})
            while True:
                event = await c.recv(timeout=10)
                if event.type == "session.updated" or (event.type == "error" and event.error.event_id == f"seed-{seed}"):
                    break
        await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [], "output_modalities": ["text"]}})
        await c.expect("session.updated")
        events = await _ask(c, "hello")
        assert events[-1].response.status == "completed"


# --- a run on its own (as tests/core/test_run.py drives one), with a call written in pieces ---


class McpPort(ListPort):
    """A run's whole view of its session over a list, with the session's real MCP servers; the
    pipeline asked again answers from the last output it is shown."""

    def __init__(self, servers: McpServers) -> None:
        super().__init__()
        self.mcp = servers
        self.asked_again: list[ResponseRequest] = []

    def again(self, request: ResponseRequest, output: Any, in_band: bool) -> ResponseRequest:
        again = dataclasses.replace(request, items=pipeline_view(self.conversation), tool_choice="auto")
        self.asked_again.append(again)
        return again

    async def respond(self, request: ResponseRequest) -> AsyncIterator[Any]:
        yield TextDelta(f"It is {request.items[-1].output}.")


async def _listed(tools: ToolServer, **fields: Any) -> tuple[McpServers, dict[str, Any]]:
    servers = McpServers(config_file.McpConfig(**MCP_SETTINGS), "sess_test", connect=McpConnection)
    tool = ev.McpTool(server_label="tools", server_url=tools.url, **{"require_approval": "never", **fields})
    items: list[Any] = []

    async def keep(item: Any) -> None:
        items.append(item)

    await servers.ensure([tool], keep, keep, keep)
    return servers, servers.offer([tool], set())[1]


def _text_run(port: McpPort, chunks: AsyncIterator[Any], where: dict[str, Any]) -> ResponseRun:
    request = ResponseRequest(response_id="resp_1", items=[], output_modalities=("text",))
    run = ResponseRun(
        port, request, chunks, EventAudio(port, CAPS.output_rate, WireFormat.PCM16), in_band=True, output_format=WireFormat.PCM16,
        voice="fake", max_output_tokens="inf", metadata=None, started_at=0.0,
    )  # fmt: skip
    run.items.mcp_tools = where
    return run


async def _pieces(name: str, gate: asyncio.Event | None = None) -> AsyncIterator[Any]:
    """A call as the cascade's parser streams it (pipelines/base.py's contract): only its first
    delta names the tool, the others carry its call_id and pieces of the arguments."""
    yield TextDelta("Let me check.")
    yield ToolCallDelta("c1", name, "")
    yield ToolCallDelta("c1", "", '{"city": ')
    yield ToolCallDelta("c1", "", '"Oslo"}')
    yield ToolCall("c1", name, '{"city": "Oslo"}')
    yield Usage(output_tokens=9)


def _validated(port: McpPort) -> list[Any]:
    port.take()
    return [validate(json.loads(msgspec.json.encode(e))) for e in port.taken]


async def test_a_call_written_in_pieces_streams_its_arguments_and_the_answer_goes_on():
    async with ToolServer() as tools:
        servers, where = await _listed(tools)
        try:
            port = McpPort(servers)
            outcome = await _text_run(port, _pieces("weather"), where).run()
            events = _validated(port)
        finally:
            await servers.close()
        assert outcome.status == "completed" and servers.open_connections == 0
        kinds = [e.type for e in events]
        deltas = [e.delta for e in events if e.type == "response.mcp_call_arguments.delta"]
        assert deltas == ['{"city": ', '"Oslo"}']
        call_events = [k for k in kinds if k.startswith("response.mcp_call")]
        assert call_events == ["response.mcp_call_arguments.delta"] * 2 + [
            "response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed"
        ]
        # the preamble closed before the call opened; the answer after it, in the same response
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [i.type for i in done] == ["message", "mcp_call", "message"]
        assert done[1].output == "sunny and 21 degrees in Oslo"
        assert done[2].content[0].text == "It is sunny and 21 degrees in Oslo."
        history = port.asked_again[0].items
        assert [type(i).__name__ for i in history] == ["Message", "FunctionCall", "FunctionResult"]


async def test_a_call_that_needs_approval_is_held_back_until_complete():
    async with ToolServer() as tools:
        servers, where = await _listed(tools, require_approval="always")
        try:
            port = McpPort(servers)
            await _text_run(port, _pieces("weather"), where).run()
            events = _validated(port)
        finally:
            await servers.close()
        assert not any(e.type.startswith("response.mcp_call") for e in events) and tools.calls == []
        request = [e.item for e in events if e.type == "response.output_item.done"][-1]
        assert request.type == "mcp_approval_request" and request.arguments == '{"city": "Oslo"}'
        assert port.asked_again == []


async def test_a_cancel_while_a_call_runs_closes_its_item():
    async with ToolServer() as tools:
        servers, where = await _listed(tools)
        try:
            port = McpPort(servers)
            run = _text_run(port, _pieces("slowpoke"), where)
            run.task = asyncio.create_task(run.run())
            await asyncio.wait_for(tools.started.wait(), 10)
            await run.cancel("client_cancelled")
            events = _validated(port)
        finally:
            await servers.close()
        kinds = [e.type for e in events]
        assert "response.mcp_call.in_progress" in kinds and "response.mcp_call.completed" not in kinds
        assert any(e.type == "response.output_item.done" and e.item.type == "mcp_call" for e in events)
        assert events[-1].type == "response.done" and events[-1].response.status == "cancelled"


async def test_a_session_closed_while_a_listing_hangs_leaves_no_connection(make_server):
    thread = make_server(server={"mcp": MCP_SETTINGS})
    hanging, release = asyncio.Event(), asyncio.Event()

    class Hanging(Recorder):
        async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                hanging.set()
                await release.wait()  # no answer while the test runs

    async with Hanging() as rec:
        async with connect(thread.ws_base) as c:
            await _configure(c, {"type": "mcp", "server_label": "h", "server_url": f"http://127.0.0.1:{rec.port}/mcp"})
            await asyncio.wait_for(hanging.wait(), 5)
            session = next(s for s in list(thread.server.sessions) if s.mcp.connections)
            servers = session.mcp
        for _ in range(200):  # the client gone: its session closes, and with it the connection being made
            if servers.closed and not servers.connections and all(t.done() for t in list(servers._pending)):
                break
            await asyncio.sleep(0.02)
        release.set()
    assert servers.closed and servers.connections == {} and servers.open_connections == 0


def test_allowed_tools_and_require_approval_filters():
    from realtime_omni.session.mcp import needs_approval, offered

    ro = ev.McpListedTool(name="read", input_schema={}, annotations={"readOnlyHint": True})
    rw = ev.McpListedTool(name="write", input_schema={})

    def tool(**fields: Any) -> ev.McpTool:
        return msgspec.json.decode(msgspec.json.encode({"type": "mcp", "server_label": "s", **fields}), type=ev.McpTool)

    assert [offered(tool(), t) for t in (ro, rw)] == [True, True]
    assert [offered(tool(allowed_tools=["write"]), t) for t in (ro, rw)] == [False, True]
    assert [offered(tool(allowed_tools={"read_only": True}), t) for t in (ro, rw)] == [True, False]
    assert [offered(tool(allowed_tools={"tool_names": ["read"]}), t) for t in (ro, rw)] == [True, False]
    assert [needs_approval(tool(), t) for t in (ro, rw)] == [True, True]  # OpenAI's default: always
    assert [needs_approval(tool(require_approval="never"), t) for t in (ro, rw)] == [False, False]
    assert [needs_approval(tool(require_approval="always"), t) for t in (ro, rw)] == [True, True]
    assert [needs_approval(tool(require_approval={"never": {"tool_names": ["write"]}}), t) for t in (ro, rw)] == [True, False]
    assert [needs_approval(tool(require_approval={"never": {"read_only": True}}), t) for t in (ro, rw)] == [False, True]
    assert [needs_approval(tool(require_approval={"always": {"tool_names": ["read"]}}), t) for t in (ro, rw)] == [True, True]
