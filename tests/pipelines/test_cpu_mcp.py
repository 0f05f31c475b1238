"""An MCP tool on the embedded CPU cascade: the real thinker (Qwen2.5's own tool format), Whisper and
Piper, an MCP server written here with the ``mcp`` SDK on loopback (the one the shared
``cpu_server`` allows: ``CpuServer.mcp_url``), the official SDK as the client with every event
validated. The user asks aloud; the thinker calls the MCP tool, the server runs it, and the agent
speaks its output in the same response."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated
from urllib.parse import urlsplit

import pytest
from mcp.server.mcpserver import MCPServer
from pydantic import Field

from tests.pipelines.test_cpu_pipeline import RESPONSE_TIMEOUT, transcribe, words
from tests.pipelines.test_cpu_tools import INSTRUCTIONS
from tests.support.audio import utterance
from tests.support.client import audio_of, connect
from tests.support.mcp_server import Served

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


def weather_server(calls: list[str]) -> MCPServer:
    """The function tests' ``get_weather`` as an MCP server's tool."""
    server = MCPServer("weather")

    @server.tool()
    async def get_weather(city: Annotated[str, Field(description="The city, e.g. Paris")]) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        await asyncio.sleep(0.3)  # a weather service's round trip
        return json.dumps({"city": city, "sky": "snowing", "celsius": -3})

    return server


async def test_a_spoken_request_runs_the_mcp_tool_and_its_output_is_spoken_in_the_same_turn(cpu_server):
    before = cpu_server.stats()
    tool = {"type": "mcp", "server_label": "weather", "server_url": cpu_server.mcp_url, "require_approval": "never"}
    calls: list[str] = []
    port = urlsplit(cpu_server.mcp_url).port
    async with Served(weather_server(calls), port), connect(cpu_server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS, "tools": [tool]}})
        await c.expect("session.updated")
        listed = await c.expect("conversation.item.done", timeout=30)
        assert listed.item.type == "mcp_list_tools" and [t.name for t in listed.item.tools] == ["get_weather"]

        await c.speak(utterance("What is the weather in Paris?", lead_ms=500, tail_ms=1200))
        response = (await c.expect("response.done", timeout=3 * RESPONSE_TIMEOUT)).response
        assert response.status == "completed", response.status_details
        kinds = [o.type for o in response.output]
        assert kinds.count("mcp_call") == 1 and kinds[-1] == "message", kinds  # the answer after the call, one response
        (call,) = [o for o in response.output if o.type == "mcp_call"]
        assert call.server_label == "weather" and call.name == "get_weather" and call.error is None
        assert json.loads(call.arguments)["city"].lower() == "paris"
        assert calls and calls[0].lower() == "paris"
        assert json.loads(call.output or "")["sky"] == "snowing"
        # the client was never asked to run it
        assert not c.of("response.function_call_arguments.delta") and not c.of("response.function_call_arguments.done")
        assert [e.type for e in c.events if e.type.startswith("response.mcp_call.")] == ["response.mcp_call.in_progress", "response.mcp_call.completed"]

        # what the user hears after the call is the tool's output
        done_at = next(i for i, e in enumerate(c.events) if e.type == "response.mcp_call.completed")
        heard = transcribe(audio_of(c.events[done_at:]))
        assert words(heard) & {"snow", "snowing", "snowy", "minus", "three", "3"}, heard
        said = " ".join(e.transcript for e in c.of("response.output_audio_transcript.done"))
        assert "tool_call" not in said and "get_weather" not in said and "{" not in said, said
    after = cpu_server.stats()
    assert after["tool_calls"] == before["tool_calls"] + 1
    # the conversation through the call was prefilled while the tool ran (its 300 ms; CascadeSession._ahead_of_output),
    # and the answer found it in the prefix cache (the tools-free prompt shares no whole block with the call's)
    assert after["prefills_ahead_of_output"] == before["prefills_ahead_of_output"] + 1
    assert response.usage.input_token_details.cached_tokens >= 32, response.usage


def forecast_server(calls: list[str]) -> MCPServer:
    """A forecast whose answer runs long (the issue's: "heavy hail, 3 degrees Celsius, strong wind")."""
    server = MCPServer("forecast")

    @server.tool()
    async def get_forecast(city: Annotated[str, Field(description="The city, e.g. Paris")]) -> str:
        """Get today's weather forecast for a city."""
        calls.append(city)
        return json.dumps({"city": city, "conditions": "heavy hail", "temperature_c": 3, "wind": "strong from the north", "visibility": "poor", "advice": "stay indoors"})

    return server


async def test_a_city_said_reaches_the_mcp_call_as_said_and_the_answer_is_whole_sentences_with_its_key_fact(cpu_server):
    tool = {"type": "mcp", "server_label": "forecast", "server_url": cpu_server.mcp_url, "require_approval": "never"}
    calls: list[str] = []
    port = urlsplit(cpu_server.mcp_url).port
    async with Served(forecast_server(calls), port), connect(cpu_server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS, "tools": [tool]}})
        await c.expect("session.updated")
        await c.expect("conversation.item.done", timeout=30)  # (the tools listed)
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the weather forecast for Lisbon today?"}]}
        await c.send({"type": "conversation.item.create", "item": item})
        await c.send({"type": "response.create"})
        response = (await c.expect("response.done", timeout=3 * RESPONSE_TIMEOUT)).response
        assert response.status == "completed", response.status_details
        assert calls == ["Lisbon"]  # as the user said it (the thinker alone writes "Lisboa")
        said = c.of("response.output_audio_transcript.done")[-1].transcript
        assert said.rstrip().endswith((".", "!", "?")), said  # every sentence finished
        assert "hail" in said.lower(), said  # the output's key fact, in its words
