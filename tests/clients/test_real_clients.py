"""Real Realtime clients, unmodified, against the server: LiveKit Agents' OpenAI plugin, the OpenAI
Agents SDK for JavaScript, the openai JS SDK over wss://, and the openai Python SDK over wss:// and
HTTPS. Each runs as its users run it (tests/clients/setup installs them apart from the server's
environment); every server event each one received is validated strictly against the official
Python SDK's GA models, and what each scenario observed is checked here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import tls
from tests.support.audio import spoken
from tests.support.client import connect
from tests.support.peers import RtcClient
from tests.support.processes import free_port
from tests.support.validation import validate

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
VENV_PYTHON = ROOT / os.environ.get("CLIENTS_VENV", ".venv-clients") / "bin" / "python"
NODE_MODULES = HERE / "node" / "node_modules"
QUESTION = "Please book a table for two people at eight tonight."

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def installed() -> None:
    missing = [str(p) for p in (VENV_PYTHON, NODE_MODULES / "@openai" / "agents-realtime", NODE_MODULES / "openai") if not p.exists()]
    if missing:
        pytest.fail(f"the test clients are not installed ({', '.join(missing)}): run tests/clients/setup (./scripts/test does)")


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    pcm = spoken(QUESTION)
    path = tmp_path_factory.mktemp("speech") / "question.pcm"
    pcm.astype("<i2").tofile(path)
    return path, len(pcm) / 24000


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tls.TestCertificates:
    return tls.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(make_server, certs):
    return make_server(server={"ssl_certfile": str(certs.cert), "ssl_keyfile": str(certs.key), "webrtc": {"host_addresses": ["127.0.0.1"]}})


def drive(command: list[str], config: dict[str, Any], tmp: Path, env: dict[str, str] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """Run one client scenario; its result and every server event it received, validated."""
    config = {**config, "events": str(tmp / "events.jsonl")}
    (tmp / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([*command, str(tmp / "config.json")], capture_output=True, text=True, timeout=200, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    events = [validate(json.loads(line)) for line in (tmp / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e.type == "error"], [e for e in events if e.type == "error"]
    return result, events


def seconds_heard(text: str) -> float:
    """The synthetic pipeline's transcript of an audio item: '3.5 seconds of audio'."""
    m = re.search(r"([\d.]+) seconds of audio", text or "")
    assert m, text
    return float(m.group(1))


@pytest.mark.system
def test_livekit_realtime_session(installed, server, speech, tmp_path):
    path, seconds = speech
    result, events = drive(
        [str(VENV_PYTHON), str(HERE / "livekit_agent.py")],
        {"base_url": f"{server.http_url}/v1", "api_key": "test-key", "speech": str(path)},
        tmp_path,
    )
    assert result["errors"] == []
    assert result["greeting"]["audio_s"] > 0 and result["text_reply"]["text"] == "You said Hello there, how are you?."
    # four VAD turns, two of them after clear_audio: each heard whole (the utterance and its padding)
    assert len(result["vad_turns"]) == 4
    for turn in result["vad_turns"]:
        assert seconds - 0.2 <= seconds_heard(turn["text"]) <= seconds + 1.0, (turn, seconds)
        assert turn["audio_s"] > 0
    assert 0.3 * seconds <= seconds_heard(result["committed_reply"]["text"]) <= 0.5 * seconds + 1.0
    assert seconds - 0.2 <= seconds_heard(result["after_commit"]["text"]) <= seconds + 1.0  # still heard after the manual commit
    (call,) = result["tool_call"]["calls"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert result["tool_answer"]["text"] == "The tool returned sunny in Paris." and result["tool_answer"]["audio_s"] > 0
    # the plugin's response.create for the tool's answer carried "instructions": null, and was answered
    assert sum(e.type == "response.done" and e.response.status == "completed" for e in events) >= 10


@pytest.mark.system
def test_openai_agents_realtime_session(installed, server, speech, tmp_path):
    path, seconds = speech
    result, events = drive(
        ["node", str(HERE / "node" / "agents_realtime.mjs")],
        {"url": f"{server.ws_base}/realtime?model=gpt-realtime", "apiKey": "test-key", "speech": str(path)},
        tmp_path,
    )
    assert "failure" not in result, result.get("failure")
    assert result["errors"] == []
    assert result["message"] == "You said Hello there, how are you?."
    assert len(result["turns"]) == 4  # two before the mid-turn commit, two after
    for turn in result["turns"]:
        heard = seconds_heard(result["transcripts"][turn["item"]])
        assert seconds - 0.2 <= heard <= seconds + 1.0, (turn, seconds)
        assert turn["answer"] == f"You said {heard:.1f} seconds of audio."
    assert 0.3 * seconds <= seconds_heard(result["transcripts"][result["midCommit"]]) <= 0.5 * seconds + 1.0
    assert result["toolCalls"] == [{"city": "Paris"}]  # the SDK parsed the arguments with its zod schema and ran the tool
    assert result["toolAnswer"] == "The tool returned sunny in Paris."
    calls = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}]


@pytest.mark.system
def test_openai_js_over_wss(installed, tls_server, certs, speech, tmp_path):
    path, seconds = speech
    result, events = drive(
        ["node", str(HERE / "node" / "openai_ws.mjs")],
        {"baseURL": f"{tls_server.http_url}/v1", "apiKey": "test-key", "speech": str(path)},
        tmp_path,
        env={"NODE_EXTRA_CA_CERTS": str(certs.ca)},
    )
    assert "failure" not in result, result.get("failure")
    assert result["url"].startswith("wss://127.0.0.1:")
    assert result["text"]["status"] == "completed"
    assert result["text"]["output"][0]["content"][0]["transcript"] == "You said Hello there!."
    assert result["audio"]["status"] == "completed"
    assert seconds - 0.2 <= seconds_heard(result["audio"]["output"][0]["content"][0]["transcript"]) <= seconds + 1.0
    assert [e.type for e in events[:2]] == ["session.created", "conversation.created"]


async def test_openai_python_sdk_over_wss_and_https(tls_server, certs):
    context = certs.client_context()
    async with connect(tls_server.ws_base, websocket_connection_options={"ssl": context}) as c:
        assert tls_server.ws_base.startswith("wss://")
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await c.send({"type": "response.create"})
        assert (await c.expect("response.done")).response.status == "completed"
    async with httpx.AsyncClient(verify=context) as http:  # the demo page, over HTTPS
        page = await http.get(f"{tls_server.http_url}/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        with pytest.raises(httpx.ConnectError):  # and only HTTPS: a client that does not trust it cannot talk to it
            async with httpx.AsyncClient() as untrusting:
                await untrusting.get(f"{tls_server.http_url}/healthz")
    client = RtcClient(tls_server.http_url, verify=context, validate=validate)  # WebRTC signalling over HTTPS
    try:
        await client.connect()
        assert client.call_id.startswith("rtc_")
        assert (await client.next("session.created"))["type"] == "session.created"
    finally:
        await client.close()


def test_serve_takes_tls_from_the_command_line(certs, tmp_path):
    """``realtime-omni serve --ssl-certfile --ssl-keyfile``: HTTPS on the port; one without the other is refused."""
    config = tmp_path / "synthetic.yaml"
    port = free_port()
    config.write_text(f"pipeline: {{kind: synthetic}}\nport: {port}\n")
    serve = [sys.executable, "-m", "host", "serve", "--config", str(config), "--ssl-certfile", str(certs.cert)]
    half = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert half.returncode != 0 and "ssl_keyfile" in half.stderr
    proc = subprocess.Popen([*serve, "--ssl-keyfile", str(certs.key), "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        status = None
        while status != 200:  # 503 while it starts
            assert proc.poll() is None and time.monotonic() < deadline, f"the TLS server did not come up ({status})"
            time.sleep(0.2)
            try:
                status = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=certs.client_context()).status_code
            except httpx.TransportError:
                status = None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.system
def test_openai_agents_tool_on_the_cpu_agent(installed, cpu_server, tmp_path):
    """The Agents SDK's own tool flow against the CPU agent's real thinker: the model calls the
    zod-typed tool, the SDK runs it and asks for the answer, which says what the tool returned."""
    result, events = drive(
        ["node", str(HERE / "node" / "agents_realtime.mjs")],
        {"url": f"{cpu_server.ws_base}/realtime?model=gpt-realtime", "apiKey": "test-key", "toolOnly": True, "question": "What is the weather in Paris?"},
        tmp_path,
    )
    assert "failure" not in result, result.get("failure")
    assert result["errors"] == []
    assert [c["city"].lower() for c in result["toolCalls"]] == ["paris"]  # parsed with its zod schema, run by the SDK
    calls = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [c.name for c in calls] == ["get_weather"] and len([e for e in events if e.type == "response.function_call_arguments.delta"]) >= 2
    outputs = [e.item for e in events if e.type == "conversation.item.added" and e.item.type == "function_call_output"]
    assert [o.call_id for o in outputs] == [calls[0].call_id]  # the SDK sent the output back
    assert "sunny" in result["toolAnswer"].lower(), result["toolAnswer"]  # what the tool returned: "sunny in Paris"


@pytest.mark.system
def test_livekit_function_tool_on_the_cpu_agent(installed, cpu_server, speech, tmp_path):
    """LiveKit's function_tool against the CPU agent's real thinker: the call, its output through
    update_chat_ctx, and the spoken reply that says it."""
    path, _ = speech
    config = {"base_url": f"{cpu_server.http}/v1", "api_key": "test-key", "speech": str(path), "tool_only": True, "wait_s": 30}
    result, events = drive([str(VENV_PYTHON), str(HERE / "livekit_agent.py")], config, tmp_path)
    assert result["errors"] == []
    (call,) = result["tool_call"]["calls"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"].lower() == "paris"
    assert result["tool_answer"]["audio_s"] > 0 and "sunny" in result["tool_answer"]["text"].lower(), result["tool_answer"]
