"""The omni pipeline (pipelines/omni/pipeline.py) on a vLLM-Omni deployment: the stock openai SDK talks to
this server, which talks to the faithful fake deployment (bench/fake_omni.py, the only stand-in:
no GPU here). Every server event is validated strictly against the SDK's models."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from realtime_omni import config as config_file
from tests.support.audio import utterance
from tests.support.client import audio_of, connect
from tests.support.fake_omni import FakeOmniConfig, FakeOmniServer, Faults
from tests.support.server import ServerThread

QUESTION = utterance("What is the capital of France?", lead_ms=500, tail_ms=1200)
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}


def omni_config(url: str, profile: str = "qwen3-omni") -> dict[str, Any]:
    """The shipped config (configs/<profile>.yaml), pointed at the fake deployment."""
    config = config_file.raw(profile)
    config["pipeline"]["options"]["remote"].update(url=f"{url}/v1", stall_s=2.0, probe_interval_s=0.2)
    config["session"]["instructions"] = "Be brief."
    return config


def warm(fake: FakeOmniServer) -> FakeOmniServer:
    """One request first: the fake's first answer pays one-time costs (imports, tone tables) that
    would read as a stall."""
    body = {"model": fake.fake.config.served_model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    httpx.post(f"{fake.url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
    fake.fake.reset()
    return fake


@pytest.fixture(scope="module")
def deployment() -> Iterator[FakeOmniServer]:
    with FakeOmniServer(FakeOmniConfig(profile="qwen3-omni")) as fake:
        yield warm(fake)


@pytest.fixture(scope="module")
def omni(deployment: FakeOmniServer) -> Iterator[ServerThread]:
    srv = ServerThread(omni_config(deployment.url)).start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def clean(deployment: FakeOmniServer) -> Iterator[None]:
    deployment.fake.reset()
    deployment.fake.faults = Faults()
    yield
    deployment.fake.faults = Faults()


async def spoken_turn(c: Any) -> Any:
    """Speak the question in real time; the response.done of the answer it gets."""
    await c.speak(QUESTION)
    return await c.expect("response.done", timeout=15)


async def test_a_spoken_turn_goes_to_the_thinker_as_audio_and_comes_back_as_speech(omni, deployment):
    async with connect(omni.ws_base) as c:
        created = await c.expect("session.created")
        assert created.session.audio.input.transcription is None  # no ASR in the loop unless configured
        done = await spoken_turn(c)
        assert done.response.status == "completed"
        transcript = done.response.output[0].content[0].transcript
        assert transcript.startswith("I heard") and transcript.endswith("seconds of audio.")
        audio = np.frombuffer(audio_of(c.events), "<i2")
        assert len(audio) == pytest.approx(len(transcript.split()) * 0.240 * 24000, rel=0.05)  # one 240 ms tone a word
    body = deployment.fake.bodies()[-1]
    assert body["modalities"] == ["text", "audio"] and body["audio"] == {"format": "pcm"} and body["stream"] is True
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    audio_part = body["messages"][-1]["content"][0]
    assert audio_part["type"] == "input_audio" and audio_part["input_audio"]["format"] == "wav"
    heard = float(transcript.split()[2])  # what the deployment received: the turn's audio, at 16 kHz
    assert 1.5 < heard < 3.5


@pytest.mark.slow
async def test_the_second_turn_resends_the_first_byte_for_byte_and_hits_the_prefix_cache(omni, deployment):
    async with connect(omni.ws_base) as c:
        await c.expect("session.created")
        first = await spoken_turn(c)
        second = await spoken_turn(c)
    bodies = [r.body for r in deployment.fake.requests if r.outcome == "done"]
    b = bodies[-1]  # the second turn's answer
    a = next(x for x in bodies if len(x["messages"]) == 2)  # the first turn's: system, user
    assert a["cache_salt"] == b["cache_salt"]
    assert json.dumps(b["messages"][: len(a["messages"])]) == json.dumps(a["messages"])  # the same bytes
    assert b["messages"][len(a["messages"])] == {"role": "assistant", "content": first.response.output[0].content[0].transcript}
    assert second.response.usage.input_token_details.cached_tokens > 0
    assert first.response.usage.input_token_details.cached_tokens <= second.response.usage.input_token_details.cached_tokens


async def test_sessions_of_two_keys_never_share_a_cache_salt(omni, deployment):
    """The salt is the API key's (docs/reliability.md): two keys, two cache namespaces; two sessions
    of one key, one."""
    seen = len(deployment.fake.requests)
    async with connect(omni.ws_base, api_key="key-a") as a, connect(omni.ws_base, api_key="key-b") as b, connect(omni.ws_base, api_key="key-a") as a2:
        for c in (a, b, a2):
            await c.expect("session.created")
            await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
            await c.send({"type": "response.create"})
        for c in (a, b, a2):
            await c.expect("response.done")
    requests = deployment.fake.requests[seen:]
    assert len(requests) == 3
    salts = {r.body["cache_salt"] for r in requests}
    assert len(salts) == 2
    assert "key-a" not in salts and "key-b" not in salts  # a digest, never the key


async def test_barge_in_aborts_the_upstream_request(omni, deployment):
    deployment.fake.faults = Faults(chunk_ms=60)  # an answer that takes seconds to stream
    async with connect(omni.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
        await c.send({"type": "response.create"})
        await c.expect("response.output_audio.delta", timeout=10)
        request_id = deployment.fake.requests[-1].request_id
        await c.speak(QUESTION[: 24000 * 3 // 2])  # the user talks over it
        done = await c.expect("response.done")
        assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    assert await asyncio.to_thread(deployment.fake.wait_outcome, request_id, 10) == "aborted"


async def test_out_of_band_and_text_only_responses(omni, deployment):
    async with connect(omni.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"], "input": [TEXT_ITEM]}})
        done = await c.expect("response.done")
        assert done.response.conversation_id is None and done.response.output[0].content[0].text.startswith("I heard")
        assert not c.of("response.output_audio.delta")
    assert deployment.fake.bodies()[-1]["modalities"] == ["text"]


@pytest.mark.parametrize(
    "faults,reason",
    [
        (Faults(status=503), "503"),
        (Faults(cut_after=3), "before the answer ended"),
        (Faults(stall_after=3), "stalled"),
        (Faults(error_after=3), "injected error mid-stream"),
    ],
    ids=["http-503", "cut-stream", "stall", "in-stream-error"],
)
async def test_engine_faults_fail_the_response_and_the_session_lives_on(omni, deployment, faults, reason):
    deployment.fake.faults = faults
    async with connect(omni.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
        await c.send({"type": "response.create"})
        done = await c.expect("response.done", timeout=15)
        assert done.response.status == "failed" and done.response.status_details.error.code == "pipeline_error"
        assert any(e.type == "error" and e.error.code == "pipeline_error" for e in c.events)
        assert reason in done.response.status_details.error.message
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{omni.http_url}/healthz")
            assert health.status_code == 503 and health.json()["status"] == "unhealthy"
            deployment.fake.faults = Faults()  # the deployment recovers: so does the server, without a restart
            for _ in range(100):
                if (await http.get(f"{omni.http_url}/healthz")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await http.get(f"{omni.http_url}/healthz")).status_code == 200
            metrics = (await http.get(f"{omni.http_url}/metrics")).text
            assert "realtime_pipeline_engine_failures" in metrics
        await c.send({"type": "response.create"})
        assert (await c.expect("response.done", timeout=15)).response.status == "completed"


async def test_ming_audio_at_44100_is_resampled_once_for_the_client():
    with FakeOmniServer(FakeOmniConfig(profile="ming-omni")) as fake:
        warm(fake)
        srv = ServerThread(omni_config(fake.url, profile="ming-omni")).start()
        try:
            async with connect(srv.ws_base) as c:
                await c.expect("session.created")
                await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
                await c.send({"type": "response.create"})
                done = await c.expect("response.done", timeout=15)
                words = done.response.output[0].content[0].transcript.split()
                audio = np.frombuffer(audio_of(c.events), "<i2")
                assert len(audio) == pytest.approx(len(words) * 0.240 * 24000, rel=0.05)  # 24 kHz pcm16 on the wire
                spectrum = np.abs(np.fft.rfft(audio[: 24000 // 5].astype(float)))
                assert 50 < np.argmax(spectrum) * 5 < 12000  # a tone, not noise from misread samples
        finally:
            srv.stop()


async def test_images_reach_the_thinker_with_the_words(omni, deployment):
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What is this?"}]}
    async with connect(omni.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": item})
        await c.send({"type": "response.create"})
        assert (await c.expect("response.done", timeout=15)).response.status == "completed"
    parts = deployment.fake.bodies()[-1]["messages"][-1]["content"]
    assert parts == [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]


async def test_a_deployment_down_at_startup_is_served_unhealthy_until_it_comes_up():
    fake = FakeOmniServer(FakeOmniConfig(profile="qwen3-omni"))  # its port is bound, nothing listens yet: refused
    srv = ServerThread(omni_config(fake.url)).start()
    try:
        async with httpx.AsyncClient() as http, connect(srv.ws_base) as c:
            assert (await http.get(f"{srv.http_url}/healthz")).status_code == 503
            await c.expect("session.created")
            await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
            await c.send({"type": "response.create"})
            done = await c.expect("response.done", timeout=15)
            assert done.response.status == "failed" and "unreachable" in done.response.status_details.error.message
            with fake:  # the deployment comes up: the server sees it without a restart
                for _ in range(200):
                    if (await http.get(f"{srv.http_url}/healthz")).status_code == 200:
                        break
                    await asyncio.sleep(0.05)
                assert (await http.get(f"{srv.http_url}/healthz")).status_code == 200
                await c.send({"type": "response.create"})
                assert (await c.expect("response.done", timeout=15)).response.status == "completed"
    finally:
        srv.stop()


async def test_input_transcripts_come_from_a_configured_whisper_and_only_when_asked(deployment):
    config = omni_config(deployment.url)
    config["pipeline"]["options"]["asr_model"] = "whisper-tiny.en"
    config["pipeline"]["options"]["remote"]["stall_s"] = 15.0  # Whisper shares the cores with the fake deployment
    srv = ServerThread(config).start()
    try:
        async with connect(srv.ws_base) as c:
            created = await c.expect("session.created")
            assert created.session.audio.input.transcription is None  # off until the client asks
            await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-tiny.en"}}}}})
            await c.expect("session.updated")
            since = len(c.events)
            await c.speak(QUESTION)
            done = await c.first("conversation.item.input_audio_transcription.completed", since, timeout=40)
            assert "capital" in done.transcript.lower() and "france" in done.transcript.lower()
            assert (await c.first("response.done", since, timeout=30)).response.status == "completed"
    finally:
        srv.stop()


async def test_function_calling_through_the_deployments_tool_parser(deployment):
    config = omni_config(deployment.url)
    config["pipeline"]["options"]["tools"] = True
    srv = ServerThread(config).start()
    weather = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    try:
        async with connect(srv.ws_base) as c:
            await c.expect("session.created")
            await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [weather], "tool_choice": "auto"}})
            await c.expect("session.updated")
            done = await spoken_turn(c)
            call = done.response.output[0]
            assert done.response.status == "completed" and call.type == "function_call" and call.name == "get_weather"
            assert 1.5 < json.loads(call.arguments)["seconds"] < 3.5  # what the deployment heard
            asked = deployment.fake.bodies()[-1]
            assert asked["tools"] == [{"type": "function", "function": {k: weather[k] for k in ("name", "description", "parameters")}}]
            assert asked["tool_choice"] == "auto"
            await c.send({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}})
            await c.send({"type": "response.create"})
            answer = await c.expect("response.done", timeout=15)
            assert answer.response.output[0].type == "message" and answer.response.status == "completed"
        messages = deployment.fake.bodies()[-1]["messages"]
        assert messages[-2] == {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}]}
        assert messages[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": '{"sky": "clear"}'}
    finally:
        srv.stop()


async def test_tools_are_refused_where_the_deployment_has_no_tool_parser(omni):
    async with connect(omni.ws_base) as c:  # configs/qwen3-omni.yaml: tools off
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [{"type": "function", "name": "f", "parameters": {}}]}})
        error = await c.expect("error")
        assert error.error.code == "unsupported_value" and error.error.param == "session.tools"


async def test_an_mcp_tool_is_offered_as_a_function_and_its_call_run_by_the_server(deployment):
    """The deployment's tool parser calls an MCP server's tool (offered to it as a function); this
    server runs the call on the MCP server and asks the deployment again with the output, in the
    same response."""
    from mcp.server.mcpserver import MCPServer

    from tests.support.mcp_server import Served

    calls: list[float] = []
    server = MCPServer("clips")

    @server.tool()
    def clip_length(seconds: float) -> str:
        """How long the user's clip was."""
        calls.append(seconds)
        return f"The clip lasted {seconds:.1f} seconds."

    async with Served(server) as served:
        config = omni_config(deployment.url)
        config["pipeline"]["options"]["tools"] = True
        config["mcp"] = {"allowed_servers": [served.url]}
        srv = ServerThread(config).start()
        try:
            async with connect(srv.ws_base) as c:
                await c.expect("session.created")
                tool = {"type": "mcp", "server_label": "clips", "server_url": served.url, "require_approval": "never"}
                await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [tool]}})
                await c.expect("session.updated")
                await c.expect("mcp_list_tools.completed", timeout=15)
                done = await spoken_turn(c)
                assert done.response.status == "completed", done.response.status_details
                assert [o.type for o in done.response.output] == ["mcp_call", "message"]
                call = done.response.output[0]
                assert call.server_label == "clips" and call.name == "clip_length" and call.error is None
                assert len(calls) == 1 and 1.5 < calls[0] < 3.5 and call.output == f"The clip lasted {calls[0]:.1f} seconds."
                assert not c.of("response.function_call_arguments.done")  # the server's call, never the client's
                assert [e.type for e in c.events if e.type.startswith("response.mcp_call.")] == ["response.mcp_call.in_progress", "response.mcp_call.completed"]
                assert done.response.output[1].content[0].transcript  # the answer after the output, spoken
            first, again = deployment.fake.bodies()[-2:]
            (offered,) = first["tools"]
            assert offered["type"] == "function" and offered["function"]["name"] == "clip_length"
            assert offered["function"]["description"] == "How long the user's clip was."
            assert offered["function"]["parameters"]["properties"]["seconds"]["type"] == "number"
            # asked again with the call and its output in the history, the tools still offered (auto)
            assert again["messages"][-2]["tool_calls"][0]["function"]["name"] == "clip_length"
            assert again["messages"][-1] == {"role": "tool", "tool_call_id": again["messages"][-2]["tool_calls"][0]["id"], "content": call.output}
            assert again["tool_choice"] == "auto"
        finally:
            srv.stop()
