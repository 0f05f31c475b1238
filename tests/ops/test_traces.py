"""Per-turn traces in OpenTelemetry (realtime_omni/tracing.py, exported by host/otel_tracing.py), checked at an OTLP/HTTP receiver.

The receiver is a plain HTTP server on loopback, written here, that decodes each
``ExportTraceServiceRequest`` with opentelemetry-proto. The server under test is a real one (the
synthetic pipeline) started with the standard OpenTelemetry environment pointing at it; the client
is the official openai SDK. What arrives is checked against what the client saw: the span tree,
the ids, the session's ``tracing`` field.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

from host.otel_tracing import configure
from pipelines.base import Usage
from realtime_omni.config import TracingConfig
from realtime_omni.session.run import Outcome
from realtime_omni.tracing import NO_TRACING, settings
from tests.conftest import synthetic_config
from tests.support.audio import utterance
from tests.support.client import connect
from tests.support.server import ServerThread

OTEL_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_BSP_SCHEDULE_DELAY",
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TRACING = {"workflow_name": "support-line", "group_id": "caller-42", "metadata": {"tier": "gold", "attempt": 2}}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it is sent, decoded, with its resource."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.take(self.path, self.headers.get("Content-Type"), request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def take(self, path: str, content_type: str | None, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces" and content_type == "application/x-protobuf", (path, content_type)
        self.requests += 1
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        {
                            "name": s.name,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex() or None,
                            "attributes": _attrs(s.attributes),
                            "events": [(e.name, _attrs(e.attributes)) for e in s.events],
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "status": s.status.code,
                            "resource": resource,
                        }
                    )

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A clean OpenTelemetry environment (whatever the machine has set), for a test to fill in."""
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _started(config: dict[str, Any]) -> ServerThread:
    return ServerThread(config).start()


async def _answer(srv: ServerThread, text: str = "hello") -> str:
    """One text turn answered; the response's id."""
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        await c.send({"type": "response.create"})
        done = await c.expect("response.done")
        assert done.response.status == "completed"
        return done.response.id


async def test_a_session_is_one_trace_of_its_responses_stages_calls_and_barge_in(receiver, otel_env):
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    otel_env.setenv("OTEL_SERVICE_NAME", "voice-agent-test")
    # 40 words paced in real time: a response still speaking when the user barges in
    srv = _started(synthetic_config(chunk_interval_ms=40, reply=" ".join(["word"] * 40)))
    try:
        async with connect(srv.ws_base) as c:
            await c.expect("session.created")
            await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER], "tracing": TRACING}})
            await c.expect("session.updated")
            # a spoken turn, answered by itself (server VAD), then interrupted by a second one
            await c.append(utterance("Tell me a story about the sea.", lead_ms=300, tail_ms=800))
            first_turn = await c.expect("input_audio_buffer.committed")
            first = (await c.expect("response.created")).response.id
            for _ in range(5):
                await c.expect("response.output_audio.delta")
            await c.append(utterance("Stop, stop please.", lead_ms=200, tail_ms=800))
            barged = await c.expect("response.done")
            assert barged.response.id == first and barged.response.status_details.reason == "turn_detected"
            second_turn = await c.expect("input_audio_buffer.committed")
            second = (await c.expect("response.created")).response.id
            await c.send({"type": "response.cancel"})
            assert (await c.expect("response.done")).response.status == "cancelled"
            # a function call the client asked for
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}})
            await c.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "get_weather"}}})
            called = await c.expect("response.done")
            third = called.response.id
            call = called.response.output[0]
            assert call.type == "function_call"
            # its output, answered to the end
            await c.send({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}})
            await c.send({"type": "response.create"})
            answered = await c.expect("response.done")
            assert answered.response.status == "completed"
            fourth = answered.response.id
            while len(c.of("conversation.item.input_audio_transcription.completed")) < 2:
                await c.expect("conversation.item.input_audio_transcription.completed")
            transcripts = [e.item_id for e in c.of("conversation.item.input_audio_transcription.completed")]
    finally:
        srv.stop()  # ends the session and flushes the spans still queued

    assert receiver.spans, "nothing was exported"
    assert {s["resource"]["service.name"] for s in receiver.spans} == {"voice-agent-test"}
    assert len({s["trace_id"] for s in receiver.spans}) == 1  # the session is one trace
    by_id = {s["span_id"]: s for s in receiver.spans}
    (session,) = receiver.named("realtime.session")
    assert session["parent"] is None
    sa = session["attributes"]
    assert sa["realtime.transport"] == "websocket" and sa["realtime.pipeline"] == "synthetic"
    assert sa["realtime.tracing"] == "custom"
    assert sa["realtime.workflow_name"] == "support-line" and sa["realtime.group_id"] == "caller-42"
    assert sa["realtime.metadata.tier"] == "gold" and sa["realtime.metadata.attempt"] == 2
    for s in receiver.named("realtime.response"):
        assert s["attributes"]["realtime.session.id"] == sa["realtime.session.id"]
        assert s["attributes"]["realtime.transport"] == "websocket" and s["attributes"]["realtime.pipeline"] == "synthetic"

    responses = {s["attributes"]["realtime.response.id"]: s for s in receiver.named("realtime.response")}
    assert set(responses) == {first, second, third, fourth}
    for r in responses.values():
        assert r["parent"] == session["span_id"]
        assert session["start"] <= r["start"] <= r["end"] <= session["end"]

    def children(span: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for s in receiver.spans:
            if s["parent"] == span["span_id"]:
                out.setdefault(s["name"], []).append(s)
        return out

    # the first response: answering the first turn, cut off by the second
    r1 = responses[first]
    a1 = r1["attributes"]
    assert a1["realtime.response.trigger"] == "turn_end" and a1["realtime.item.id"] == first_turn.item_id
    assert a1["realtime.response.status"] == "cancelled" and a1["realtime.cancel_ms"] >= 0
    assert a1["realtime.response.output_item_ids"] == [o.id for o in barged.response.output]
    assert [(name, attrs["realtime.cancel.reason"], attrs["realtime.barge_in"]) for name, attrs in r1["events"]] == [("realtime.cancel", "turn_detected", True)]
    kids = children(r1)
    (turn_end,) = kids["realtime.turn_end"]
    assert turn_end["attributes"]["realtime.item.id"] == first_turn.item_id
    silence = turn_end["attributes"]["realtime.turn_end.silence_ms"]
    assert 400 <= silence <= 700, silence  # server VAD's 500 ms of silence, give or take a frame
    assert turn_end["end"] - turn_end["start"] == pytest.approx(silence * 1e6, abs=1e6)
    (delta,) = kids["realtime.first_delta"]
    assert delta["start"] == r1["start"] < delta["end"] <= r1["end"]
    assert a1["realtime.first_delta_ms"] <= a1["realtime.first_audio_delta_ms"]
    assert "realtime.stage.first_output" not in kids  # a pipeline reports its stages when it finishes: a cut-off answer has none

    r2 = responses[second]
    assert r2["attributes"]["realtime.item.id"] == second_turn.item_id
    assert [e[1]["realtime.cancel.reason"] for e in r2["events"]] == ["client_cancelled"]

    # the third: asked for by response.create, a function call written
    r3 = responses[third]
    assert r3["attributes"]["realtime.response.trigger"] == "response.create" and "realtime.item.id" not in r3["attributes"]
    assert r3["attributes"]["realtime.response.status"] == "completed"
    (tool,) = children(r3)["realtime.tool_call"]
    ta = tool["attributes"]
    assert (ta["realtime.item.id"], ta["realtime.tool.call_id"], ta["realtime.tool.name"]) == (call.id, call.call_id, "get_weather")
    assert ta["realtime.response.id"] == third
    assert "realtime.cancel" not in [e[0] for e in r3["events"]]

    # the fourth, answered to the end: the pipeline's stage (the synthetic one has one), the first delta
    r4 = responses[fourth]
    a4 = r4["attributes"]
    assert a4["realtime.response.status"] == "completed" and a4["realtime.response.output_item_ids"] == [answered.response.output[0].id]
    assert a4["gen_ai.usage.output_tokens"] == answered.response.usage.output_tokens > 0
    kids = children(r4)
    (stage,) = kids["realtime.stage.first_output"]
    assert stage["attributes"]["realtime.stage.ms"] == a4["realtime.stage.first_output_ms"] >= 0
    assert stage["start"] == r4["start"] and stage["end"] - stage["start"] == pytest.approx(a4["realtime.stage.first_output_ms"] * 1e6, abs=1e3)
    (delta,) = kids["realtime.first_delta"]
    assert delta["start"] == r4["start"] < delta["end"] <= r4["end"]
    assert answered.response.metadata["timing.first_audio_delta_ms"] == f"{a4['realtime.first_audio_delta_ms']:.1f}"  # the times the client is told

    # the input transcriptions, one per spoken turn, under the session
    spans = receiver.named("realtime.transcription")
    assert {s["attributes"]["realtime.item.id"] for s in spans} == set(transcripts) == {first_turn.item_id, second_turn.item_id}
    assert all(by_id[s["parent"]] is session for s in spans)


async def test_nothing_set_nothing_exported_and_no_sdk_loaded(receiver, otel_env):
    srv = _started(synthetic_config())
    try:
        assert srv.server.tracing is NO_TRACING
        await _answer(srv)
    finally:
        srv.stop()
    assert receiver.requests == 0
    # and the SDK is not even imported: a fresh process, a server started and a session answered
    code = (
        "import asyncio, sys\n"
        "from realtime_omni.config import from_dict\n"
        "from realtime_omni.server import Server\n"
        "from realtime_omni.session import Media\n"
        "async def main():\n"
        "    s = Server(from_dict({'pipeline': {'kind': 'synthetic'}}))\n"
        "    await s.start()\n"
        "    from realtime_omni.server import Admission\n"
        "    session = await s.open_session(beta=False, transport='websocket', model=None, admission=Admission(None, None))\n"
        "    await session.start()\n"
        "    await session.handle('{\"type\": \"response.create\"}')\n"
        "    while session.runs.active is not None: await asyncio.sleep(0.01)\n"
        "    await s.close_session(session)\n"
        "    await s.stop()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("collector", ["refusing", pytest.param("hung", marks=pytest.mark.slow)])  # hung: each export waits out its 3 s
async def test_a_collector_down_costs_the_sessions_nothing(otel_env, collector):
    """Nobody listening, or a collector that takes connections and never answers: the sessions are
    answered as fast as ever, the spans queue up to the bound and the rest are dropped, and the
    server stops within its limit."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    if collector == "hung":
        hung.listen(64)  # connections complete in the kernel's backlog; none is ever accepted
    port = hung.getsockname()[1]
    if collector == "refusing":
        hung.close()
    otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}/v1/traces")
    otel_env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    timeout_s = 3.0 if collector == "hung" else 1.0
    srv = _started(synthetic_config(server={"tracing": {"max_queue_spans": 4, "export_timeout_s": timeout_s}}))
    try:
        assert srv.server.tracing.enabled
        queue = srv.server.tracing.processor._batch_processor._queue  # (the SDK's; read to see the bound hold)
        assert queue.maxlen == 4  # the bound is the config's
        t0 = time.monotonic()
        fullest = 0
        for _ in range(6):  # 6 sessions of 4 spans or more each: more than the queue holds
            await _answer(srv)
            fullest = max(fullest, len(queue))
        answered_in = time.monotonic() - t0
    finally:
        t0 = time.monotonic()
        srv.stop()
        stopped_in = time.monotonic() - t0
        hung.close()
    assert answered_in < 8, answered_in  # (about 0.1 s a session on two shared cores; waiting on exports, 18 s or more)
    assert stopped_in < 10, stopped_in  # the exporter's retries do not hold the stop up
    if collector == "hung":  # each export waits its whole timeout: the spans pile up to the bound, then are dropped
        assert fullest == 4, fullest


async def test_sampler_ratio_zero_exports_nothing(receiver, otel_env):
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    otel_env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    srv = _started(synthetic_config())
    try:
        assert srv.server.tracing.enabled
        await _answer(srv)
    finally:
        srv.stop()
    assert receiver.spans == []


async def test_the_config_section_alone_turns_traces_on(receiver, otel_env):
    srv = _started(synthetic_config(server={"tracing": {"endpoint": receiver.url, "service_name": "from-config", "sample_ratio": 1.0}}))
    try:
        response_id = await _answer(srv)
    finally:
        srv.stop()
    (response,) = receiver.named("realtime.response")
    assert response["attributes"]["realtime.response.id"] == response_id
    assert response["resource"]["service.name"] == "from-config"


async def test_a_cascade_s_stages_and_speculation_become_spans(receiver, otel_env):
    """The stage spans of a pipeline with more stages than the synthetic one (the CPU cascade's
    names), one of them done ahead of the trigger, and an MCP call that failed: the trace module
    itself, exporting to the receiver."""
    tracing = configure(TracingConfig(endpoint=receiver.url))
    session = tracing.session("sess_1", transport="sip", pipeline="cascade")
    session.configure("auto")
    session.turn_ended("item_1", 520.0)
    started = time.perf_counter()
    response = session.response("resp_1", started, in_band=True, trigger=None, last_item_id="item_1")
    response.mcp_call("item_2", "tools", "weather").end("MCP server 'tools' offers no tool 'weather'.")
    stages = {"asr": -120.0, "judged": -60.0, "thinker_first_token": 80.0, "first_clause": 150.0, "first_audio": 260.0}
    outcome = Outcome("completed", Usage(input_tokens=40, output_tokens=12), True, started, started + 1.5, first_audio_at=started + 0.27)
    outcome.first_delta_at, outcome.stage_times, outcome.stage_info = started + 0.2, stages, {"speculated": True}
    response.finished(outcome, ["item_3"])
    session.turn_ended("item_9", 500.0)  # a turn no response follows by itself (create_response off)
    session.close()
    await tracing.shutdown()

    (r,) = receiver.named("realtime.response")
    assert r["attributes"]["realtime.response.trigger"] == "turn_end" and r["attributes"]["realtime.item.id"] == "item_1"
    assert r["attributes"]["realtime.info.speculated"] is True and r["attributes"]["realtime.transport"] == "sip"
    assert r["end"] - r["start"] == 1_500_000_000
    for name, ms in stages.items():
        (s,) = receiver.named(f"realtime.stage.{name}")
        assert s["parent"] == r["span_id"] and s["attributes"]["realtime.stage.ms"] == ms == r["attributes"][f"realtime.stage.{name}_ms"]
        if ms >= 0:  # the trigger to the stage's first output
            assert (s["start"], s["end"]) == (r["start"], r["start"] + int(ms * 1e6))
        else:  # done ahead: from then to the trigger
            assert (s["start"], s["end"]) == (r["start"] + int(ms * 1e6), r["start"])
    (mcp,) = receiver.named("realtime.mcp_call")
    assert mcp["parent"] == r["span_id"] and mcp["status"] == 2  # STATUS_CODE_ERROR
    assert mcp["attributes"]["realtime.mcp.server_label"] == "tools" and mcp["attributes"]["realtime.item.id"] == "item_2"
    (s,) = receiver.named("realtime.session")
    ends = {t["attributes"]["realtime.item.id"]: t for t in receiver.named("realtime.turn_end")}
    assert ends["item_1"]["parent"] == r["span_id"] and ends["item_1"]["attributes"]["realtime.turn_end.silence_ms"] == 520.0
    assert ends["item_9"]["parent"] == s["span_id"] and set(ends) == {"item_1", "item_9"}
    assert s["attributes"]["realtime.tracing"] == "auto" and "realtime.workflow_name" not in s["attributes"]


async def test_grpc_when_its_exporter_is_installed(otel_env):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="OTLP over grpc needs opentelemetry-exporter-otlp-proto-grpc")
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    tracing = configure(TracingConfig())
    try:
        assert type(tracing.processor.span_exporter).__module__ == "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
    finally:
        await tracing.shutdown()


def test_settings_from_the_environment_and_the_config():
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert settings(TracingConfig(), {}) is None  # nothing set: off
    s = settings(TracingConfig(), on)
    assert s is not None and s.protocol == "http/protobuf" and s.service_name == "realtime-omni" and s.endpoint is None
    assert settings(TracingConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) is not None
    assert settings(TracingConfig(), {**on, "OTEL_SDK_DISABLED": "true"}) is None
    assert settings(TracingConfig(), {**on, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert settings(TracingConfig(enabled=False), on) is None
    s = settings(TracingConfig(service_name="mine"), {**on, "OTEL_SERVICE_NAME": "env", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert s is not None and s.service_name == "mine" and s.protocol == "grpc"
    with pytest.raises(ValueError, match="http/json"):
        settings(TracingConfig(), {**on, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ValueError):
        TracingConfig(sample_ratio=1.5)
