"""npm's ``@modelcontextprotocol/server-everything`` (the MCP project's own server that exercises
every feature of the protocol; pinned in tests/clients/node/package.json, installed by
tests/clients/setup) served over Streamable HTTP on loopback, as a session's ``type: "mcp"`` tool on
the synthetic pipeline. The official openai SDK is the client, every event validated against its GA
models: the listing, ``allowed_tools``, a call without approval (its read-only hint), a call
approved and one declined."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.client import connect
from tests.support.processes import free_port
from tests.support.validation import validate

NODE = Path(__file__).parent / "node"
EVERYTHING = NODE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def everything() -> Iterator[str]:
    """The server's URL: ``node dist/index.js streamableHttp`` (its package's ``start:streamableHttp``),
    on the port its ``PORT`` names, bound to 127.0.0.1 only (loopback_only.mjs)."""
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is not installed: run tests/clients/setup (./scripts/test does)")
    port = free_port()
    command = ["node", "--import", "./loopback_only.mjs", str(EVERYTHING), "streamableHttp"]
    proc = subprocess.Popen(command, cwd=NODE, env={**os.environ, "PORT": str(port)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server-everything did not start: {proc.stderr.read().decode() if proc.stderr else ''}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def ws_base(make_server: Any, everything: str) -> str:
    return str(make_server(server={"mcp": {"allowed_servers": [everything], "call_timeout_s": 10.0}}).ws_base)


def tool(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "everything", "server_url": url, **fields}


async def configure(c: Any, mcp_tool: dict[str, Any]) -> Any:
    """The session's tools; the ``mcp_list_tools`` item once listed."""
    await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "tools": [mcp_tool]}})
    await c.expect("session.updated")
    events = await c.until("mcp_list_tools.completed", timeout=30)
    assert [e.type for e in events if e.type.startswith("mcp_list_tools.")] == ["mcp_list_tools.in_progress", "mcp_list_tools.completed"]
    return (await c.expect("conversation.item.done")).item


async def ask(c: Any, text: str) -> list[Any]:
    await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await c.send({"type": "response.create"})
    return await c.until("response.done", timeout=30)


def output_items(events: list[Any], kind: str) -> list[Any]:
    return [e.item for e in events if e.type == "response.output_item.done" and e.item.type == kind]


def answer(events: list[Any]) -> str:
    return str(next(e.text for e in events if e.type == "response.output_text.done"))


async def test_its_tools_are_listed_with_their_schemas_and_hints(ws_base, everything):
    async with connect(ws_base) as c:
        listed = await configure(c, tool(everything, require_approval="never"))
        assert listed.type == "mcp_list_tools" and listed.server_label == "everything"
        tools = {t.name: t for t in listed.tools}
        assert {"echo", "get-sum", "get-tiny-image", "trigger-long-running-operation"} <= set(tools), sorted(tools)
        assert tools["echo"].input_schema["properties"]["message"]["type"] == "string"
        assert tools["echo"].description == "Echoes back the input string"
        assert tools["get-sum"].annotations["readOnlyHint"] is True
        assert set(tools["get-sum"].input_schema["required"]) == {"a", "b"}
        # a listing is the session's: the next update with the same server lists nothing again
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        await c.expect("session.updated")
        assert not [e for e in await c.quiet(0.5) if e.type.startswith("mcp_list_tools")]


async def test_a_call_without_approval_by_its_read_only_hint(ws_base, everything):
    async with connect(ws_base) as c:
        # allowed_tools by name; approval never for the tools the server hints are read-only (echo is)
        listed = await configure(c, tool(everything, allowed_tools=["echo", "get-sum"], require_approval={"never": {"read_only": True}}))
        assert sorted(t.name for t in listed.tools) == ["echo", "get-sum"]
        events = await ask(c, "Please echo Hello")
        kinds = [e.type for e in events]
        assert not output_items(events, "mcp_approval_request") and "response.function_call_arguments.delta" not in kinds
        (call,) = output_items(events, "mcp_call")
        assert call.server_label == "everything" and call.name == "echo" and json.loads(call.arguments) == {"message": "Hello"}
        assert call.output == "Echo: Hello" and call.error is None
        order = [k for k in kinds if k.startswith("response.mcp_call")]
        assert order[0] == "response.mcp_call_arguments.delta" and order[-3:] == [
            "response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed",
        ]  # fmt: skip
        assert json.loads(next(e.arguments for e in events if e.type == "response.mcp_call_arguments.done")) == {"message": "Hello"}
        response = events[-1].response
        assert response.status == "completed" and [o.type for o in response.output] == ["mcp_call", "message"]
        assert "Echo: Hello" in answer(events)


async def test_calls_approved_and_declined(ws_base, everything):
    async with connect(ws_base) as c:
        await configure(c, tool(everything, allowed_tools=["echo", "get-sum"]))  # require_approval: always (the default)
        events = await ask(c, "Please echo Bonjour")
        (request,) = output_items(events, "mcp_approval_request")
        assert request.server_label == "everything" and request.name == "echo" and json.loads(request.arguments) == {"message": "Bonjour"}
        assert not any(e.type.startswith("response.mcp_call") for e in events)

        await c.send({"type": "conversation.item.create", "item": {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}})
        events = await c.until("response.done", timeout=30)
        (call,) = output_items(events, "mcp_call")
        assert call.approval_request_id == request.id and call.name == "echo" and call.output == "Echo: Bonjour"
        assert "response.mcp_call.completed" in [e.type for e in events] and "Echo: Bonjour" in answer(events)

        events = await ask(c, "Please echo Goodbye")
        (request,) = output_items(events, "mcp_approval_request")
        assert request.name == "echo" and json.loads(request.arguments) == {"message": "Goodbye"}
        await c.send({"type": "conversation.item.create", "item": {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False, "reason": "not now"}})
        events = await c.until("response.done", timeout=30)
        assert not any(e.type.startswith("response.mcp_call") for e in events) and not output_items(events, "mcp_call")
        assert "declined" in answer(events) and "not now" in answer(events)


@pytest.mark.parametrize("approval", [False, True], ids=["never", "approved"])
def test_the_openai_agents_sdk_with_a_hosted_mcp_tool(ws_base, everything, approval, tmp_path):
    """@openai/agents-realtime, unmodified, with agents-core's ``hostedMcpTool`` naming the server:
    the server lists and runs it; approvals go through the SDK's own ``session.approve``."""
    config = {"url": f"{ws_base}/realtime?model=gpt-realtime", "apiKey": "test-key", "mcpUrl": everything, "approval": approval,
              "question": "Please echo Hello", "events": str(tmp_path / "events.jsonl")}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    proc = subprocess.run(["node", str(NODE / "agents_realtime_mcp.mjs"), str(tmp_path / "config.json")], capture_output=True, text=True, timeout=60, cwd=NODE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    events = [validate(json.loads(line)) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert "failure" not in result, result["failure"]
    assert result["errors"] == [] and not [e for e in events if e.type == "error"], result["errors"]
    assert result["tools"] == ["echo"]
    assert result["approvals"] == (["mcp_approval_request"] if approval else [])
    assert [(c["name"], json.loads(c["arguments"]), c["output"]) for c in result["calls"]] == [("echo", {"message": "Hello"}, "Echo: Hello")]
    assert len(result["answers"]) == 1 and "Echo: Hello" in result["answers"][0]  # one answer, in the call's response
    assert [e.item.output for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"] == ["Echo: Hello"]
