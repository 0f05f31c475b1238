"""Connections coming and going: auth, admission, health, metrics, vanished and slow clients,
graceful shutdown. Assertions read the server's own accounting."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import httpx
import pytest
import websockets

from tests.conftest import synthetic_config
from tests.support.client import connect
from tests.support.processes import free_port
from tests.support.server import ServerThread, until_healthy, wait_until


async def test_vanished_client_leaves_nothing_behind(make_server):
    # Kept for a resume for resume.grace_s (test_resume.py), then freed like any ended session.
    srv = make_server(chunk_interval_ms=40, reply=" ".join(["word"] * 40), server={"resume": {"grace_s": 0.5}})
    pipeline = srv.server.pipeline
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        (session,) = await srv.acall(lambda: list(srv.server.sessions))
        ref = weakref.ref(session)
        del session
        await c.send({"type": "response.create"})
        await c.expect("response.output_audio.delta")
        assert (await srv.acall(pipeline.stats))["active_responses"] == 1
        c.conn._connection.transport.abort()  # gone: no close frame, no goodbye

    async def clean():
        stats = await srv.acall(pipeline.stats)
        return not await srv.acall(lambda: len(srv.server.sessions)) and stats["open_sessions"] == 0 and stats["active_responses"] == 0

    assert await wait_until(clean), await srv.acall(pipeline.stats)
    assert srv.session_tasks() == []
    await srv.acall(gc.collect)
    assert ref() is None, "the session object is still referenced somewhere"


@pytest.mark.slow
async def test_slow_reader_is_dropped_without_stalling_others(make_server):
    srv = make_server(reply=" ".join(["word"] * 2000), limits={"outbox_events": 16, "send_timeout_s": 1.0})
    async with connect(srv.ws_base) as slow, connect(srv.ws_base) as fast:
        await slow.expect("session.created")
        await fast.expect("session.created")
        await slow.send({"type": "response.create"})  # ~8 minutes of audio, as fast as it can go
        # and never read it: its session's outbox fills, and its answer waits on it
        assert await wait_until(lambda: srv.acall(lambda: any(len(s.outbox) >= 16 for s in srv.server.sessions)))

        # Meanwhile another session is served promptly.
        t0 = time.monotonic()
        await fast.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await fast.send({"type": "response.create"})
        done = await fast.expect("response.done", timeout=5)
        assert done.response.status == "completed" and time.monotonic() - t0 < 5

        async def dropped():
            return await srv.acall(lambda: len(srv.server.sessions)) == 1

        assert await wait_until(dropped, timeout=15), "the slow session was never dropped"
        outboxes = await srv.acall(lambda: [len(s.outbox) for s in srv.server.sessions])
        assert all(n <= 16 for n in outboxes)
    assert await wait_until(lambda: srv.acall(lambda: srv.server.pipeline.stats()["active_responses"] == 0))


async def test_api_key_auth():
    srv = ServerThread(synthetic_config(server={"api_key": "sekrit"})).start()
    try:
        with pytest.raises(websockets.InvalidStatus) as info:
            async with connect(srv.ws_base, api_key="wrong") as c:
                await c.recv()
        assert info.value.response.status_code == 401
        assert json.loads(info.value.response.body)["error"]["code"] == "invalid_api_key"
        async with connect(srv.ws_base, api_key="sekrit") as c:
            assert (await c.recv()).type == "session.created"
        # Browsers cannot set headers: the key may come as a subprotocol.
        async with websockets.connect(
            f"{srv.ws_base}/realtime?model=m", subprotocols=["realtime", "openai-insecure-api-key.sekrit", "openai-beta.realtime-v1"]
        ) as ws:
            assert ws.subprotocol == "realtime"
            first = json.loads(await ws.recv())
            assert first["type"] == "session.created" and "modalities" in first["session"]  # beta names
        async with httpx.AsyncClient() as http:
            r = await http.get(f"{srv.http_url}/healthz")
            assert r.status_code == 200  # health needs no key
    finally:
        srv.stop()


async def test_max_sessions_admission():
    srv = ServerThread(synthetic_config(limits={"max_sessions": 2})).start()
    try:
        async with connect(srv.ws_base) as a, connect(srv.ws_base) as b:
            await a.expect("session.created")
            await b.expect("session.created")
            async with connect(srv.ws_base) as c:
                err = await c.recv()
                assert err.type == "error" and err.error.type == "rate_limit_error" and err.error.code == "max_sessions_reached"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await c.conn.recv_bytes()
                assert closed.value.rcvd.code == 1013
            await b.conn.close()
        async with connect(srv.ws_base) as d:
            assert (await d.recv()).type == "session.created"
        metrics = httpx.get(f"{srv.http_url}/metrics").text
        assert 'realtime_sessions_rejected_total{reason="max_sessions"} 1.0' in metrics
    finally:
        srv.stop()


async def test_an_ephemeral_key_is_spent_only_when_its_session_opens():
    """Refused for max_sessions, a key stays usable; it opens one session; of two connections
    racing one key, exactly one gets the session."""
    srv = ServerThread(synthetic_config(server={"api_key": "sekrit"}, limits={"max_sessions": 2})).start()

    async def mint() -> str:
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{srv.http_url}/v1/realtime/client_secrets", json={}, headers={"authorization": "Bearer sekrit"})
        assert r.status_code == 200, r.text
        return r.json()["value"]

    async def first_event(key: str) -> str:
        """What a connection with ``key`` gets first: an event type, or the HTTP status it was refused with."""
        try:
            async with connect(srv.ws_base, api_key=key) as c:
                event = await c.recv()
                return event.error.code if event.type == "error" else event.type
        except websockets.InvalidStatus as refused:
            return str(refused.response.status_code)

    try:
        key = await mint()
        async with connect(srv.ws_base, api_key="sekrit") as a, connect(srv.ws_base, api_key="sekrit") as b:
            await a.expect("session.created")
            await b.expect("session.created")
            assert await first_event(key) == "max_sessions_reached"
        assert await wait_until(lambda: srv.acall(lambda: not srv.server.sessions))
        assert await first_event(key) == "session.created"  # the refusal did not spend it
        assert await first_event(key) == "401"  # the session did
        assert await wait_until(lambda: srv.acall(lambda: not srv.server.sessions))
        raced = await mint()
        results = sorted(await asyncio.gather(first_event(raced), first_event(raced)))
        assert results == ["401", "session.created"], results
    finally:
        srv.stop()


async def test_healthz_and_metrics(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "bogus"})
        await c.expect("error")
        async with httpx.AsyncClient() as http:
            health = await http.get(f"{server.http_url}/healthz")
            assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["sessions"] >= 1
            text = (await http.get(f"{server.http_url}/metrics")).text
    assert "realtime_sessions_active" in text
    assert 'realtime_client_events_total{type="invalid"}' in text
    assert 'realtime_errors_total{code="invalid_value"}' in text
    assert 'realtime_server_events_total{type="session.created"}' in text
    assert "realtime_response_first_audio_seconds_bucket" in text
    assert "realtime_pipeline_open_sessions" in text and "realtime_pipeline_active_responses 0.0" in text


@pytest.mark.slow
async def test_cli_serves_and_shuts_down_gracefully(tmp_path: Path):
    """The real command line: serve, talk, SIGTERM mid-response; the client is told and closed cleanly."""
    port = free_port()
    config = tmp_path / "slow.yaml"
    config.write_text(
        "pipeline:\n  kind: synthetic\n  options:\n    chunk_interval_ms: 40\n    reply: " + " ".join(["word"] * 100) + "\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "host", "serve", "--config", str(config), "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        await until_healthy(port, timeout=10)
        async with connect(f"ws://127.0.0.1:{port}/v1") as c:
            await c.expect("session.created")
            await c.send({"type": "response.create"})
            await c.expect("response.output_audio.delta")
            proc.send_signal(signal.SIGTERM)
            err = await c.expect("error")
            assert (err.error.type, err.error.code) == ("server_error", "server_shutting_down")
            done = await c.expect("response.done")
            assert done.response.status == "cancelled"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await c.conn.recv_bytes()
            assert closed.value.rcvd.code == 1001
        # uvicorn re-raises the captured SIGTERM once shutdown completed: that is a clean exit.
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.stdout.read().decode() if proc.stdout else ""
    assert "Traceback" not in out, out


async def test_healthz_is_ready_only_between_start_and_drain():
    from host.app import create_app
    from realtime_omni.config import from_dict
    from realtime_omni.server import Server

    server = Server(from_dict(synthetic_config()))
    transport = httpx.ASGITransport(app=create_app(server))  # the app itself, lifespan driven by hand
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        r = await http.get("/healthz")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        await server.start()
        r = await http.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        await server.drain()
        r = await http.get("/healthz")
        assert r.status_code == 503 and r.json()["status"] == "draining"
        await server.stop()


async def test_invalid_session_defaults_fail_at_startup():
    from realtime_omni.config import from_dict
    from realtime_omni.server import Server

    server = Server(from_dict(synthetic_config(session={"audio": {"output": {"voice": "nobody"}}})))
    with pytest.raises(ValueError, match="voice"):
        await server.start()
