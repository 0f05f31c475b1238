"""An engine that dies under a live server: clients get errors, health goes red, nothing hangs."""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from tests.conftest import cpu_config
from tests.support.client import connect
from tests.support.processes import server_process

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


async def test_dead_engine_fails_responses_and_health():
    """With ``on_pipeline_failure: stay`` the server serves on, unhealthy."""
    with server_process({**cpu_config(), "on_pipeline_failure": "stay"}, startup_s=900) as url:
        http = url.replace("ws://", "http://").removesuffix("/v1")
        assert httpx.get(f"{http}/healthz").status_code == 200
        engine = [p for p in psutil.Process(url.process.pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
        assert engine, "no vLLM engine-core process found"
        async with connect(url) as c:
            await c.expect("session.created")
            await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
            for p in engine:
                p.kill()
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}
            await c.send({"type": "conversation.item.create", "item": item})
            t0 = time.monotonic()
            await c.send({"type": "response.create"})
            done = await c.expect("response.done", timeout=60)
            assert done.response.status == "failed"
            assert any(e.type == "error" and e.error.code == "pipeline_error" for e in c.events)
            assert time.monotonic() - t0 < 30  # an error, not a hang
            # the session itself survives and still answers protocol requests
            await c.send({"type": "conversation.item.retrieve", "item_id": c.of("conversation.item.added")[0].item.id})
            await c.expect("conversation.item.retrieved")
        for _ in range(100):
            health = httpx.get(f"{http}/healthz")
            if health.status_code == 503:
                break
            await asyncio.sleep(0.1)
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"


async def test_engine_killed_mid_response_fails_it_and_the_server_exits_3_for_its_supervisor():
    """The default, ``on_pipeline_failure: exit``: the engine-core process is killed while a response
    streams. That response ends failed with an ``error``; another session, idle, is told the server
    is going away and closed 1001; /healthz says unhealthy meanwhile; the process exits with 3."""
    with server_process(cpu_config(max_sentences=3), startup_s=900) as url:
        http = url.replace("ws://", "http://").removesuffix("/v1")
        engine = [p for p in psutil.Process(url.process.pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
        assert engine, "no vLLM engine-core process found"
        async with connect(url) as talking, connect(url) as idle:
            await talking.expect("session.created")
            await idle.expect("session.created")
            await talking.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story about a lighthouse keeper."}]}
            await talking.send({"type": "conversation.item.create", "item": item})
            await talking.send({"type": "response.create"})
            await talking.expect("response.output_text.delta", timeout=60)  # mid-response
            for p in engine:
                p.kill()
            t0 = time.monotonic()
            done = await talking.expect("response.done", timeout=60)
            assert done.response.status in ("failed", "completed")  # a response already generated may finish
            if done.response.status == "failed":
                assert any(e.type == "error" and e.error.code == "pipeline_error" for e in talking.events)
            unhealthy = httpx.get(f"{http}/healthz")
            assert unhealthy.status_code == 503
            err = await idle.expect("error", timeout=30)
            assert err.error.code == "server_shutting_down"
        assert await asyncio.to_thread(url.process.wait, 60) == 3
        assert time.monotonic() - t0 < 60
