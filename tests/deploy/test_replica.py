"""One replica of a deployment, in its own process, sharing a real redis-server: what it does when
Redis goes away and comes back, when it is told to stop (SIGTERM: drain), and ``--workers``."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import pytest
import websockets
import yaml

from tests.conftest import synthetic_config
from tests.support.client import connect
from tests.support.peers import OP_CLOSE, RawWebSocket, ResumingClient
from tests.support.processes import free_port, redis_server, replica
from tests.support.server import wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

API_KEY = "sk-replica"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def config(**extra: Any) -> dict[str, Any]:
    return {**synthetic_config(), "api_key": API_KEY, "web_demo": False, **extra}


async def healthz(http: httpx.AsyncClient, url: str) -> tuple[int, dict[str, Any]]:
    r = await http.get(f"{url}/healthz")
    return r.status_code, r.json()


async def test_redis_down_refuses_new_sessions_and_keeps_open_ones_then_recovers():
    port = free_port()
    with redis_server(port) as redis_url, replica(config(), redis_url) as r:
        ws_base = f"ws://127.0.0.1:{r.port}/v1"
        async with httpx.AsyncClient(headers=AUTH, timeout=10) as http, connect(ws_base, api_key=API_KEY) as open_one:
            await open_one.expect("session.created")
            key = (await http.post(f"{r.http}/v1/realtime/client_secrets", json={})).json()["value"]
            redis_url.process.terminate()  # Redis goes away
            await asyncio.to_thread(redis_url.process.wait, 10)
            assert await wait_until(lambda: _status_is(http, r.http, 503), 6), "healthz stayed 200 with Redis gone"
            status, body = await healthz(http, r.http)
            assert body["status"] == "state_unavailable" and "Redis at 127.0.0.1" in body["state_error"], body
            # a new session with an ephemeral key: refused at the handshake, saying why
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(f"{ws_base}/realtime?model=m", additional_headers={"Authorization": f"Bearer {key}"})
            assert refused.value.response.status_code == 503 and b"shared state" in refused.value.response.body
            # with the API key: told in the protocol, then closed 1013
            async with connect(ws_base, api_key=API_KEY) as late:
                err = await late.expect("error")
                assert err.error.code == "server_unavailable" and "shared state" in err.error.message
            # minting: 503, OpenAI-shaped
            r503 = await http.post(f"{r.http}/v1/realtime/client_secrets", json={})
            assert r503.status_code == 503 and r503.json()["error"]["code"] == "server_unavailable"
            # the open session carries on
            await open_one.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
            done = await open_one.expect("response.done", timeout=15)
            assert done.response.status == "completed"
            # Redis back (empty: a restart without persistence): healthy again, sessions open again
            with redis_server(port):
                assert await wait_until(lambda: _status_is(http, r.http, 200), 6), "healthz stayed 503 with Redis back"
                fresh = (await http.post(f"{r.http}/v1/realtime/client_secrets", json={})).json()["value"]
                async with connect(ws_base, api_key=fresh) as again:
                    await again.expect("session.created")


async def test_redis_killed_and_back_leaves_no_connection_to_the_dead_one_in_the_pool():
    """Twenty mints at once fill the replica's Redis pool with connections; Redis killed (SIGKILL)
    and an empty one started on its port: once the replica says healthy, twenty mints at once are
    all 200 (each idle connection to the dead Redis failed a request with a 503 once Redis was
    back, ``bench redis_outage`` found)."""
    port = free_port()
    with redis_server(port) as redis_url, replica(config(limits={"key_mints_per_s": 1000.0, "key_mint_burst": 1000}), redis_url) as r:
        async with httpx.AsyncClient(headers=AUTH, timeout=10) as http:
            before = await asyncio.gather(*(http.post(f"{r.http}/v1/realtime/client_secrets", json={}) for _ in range(20)))
            assert [m.status_code for m in before] == [200] * 20
            redis_url.process.kill()
            await asyncio.to_thread(redis_url.process.wait, 10)
            assert await wait_until(lambda: _status_is(http, r.http, 503), 6), "healthz stayed 200 with Redis gone"
            with redis_server(port):
                assert await wait_until(lambda: _status_is(http, r.http, 200), 6), "healthz stayed 503 with Redis back"
                after = await asyncio.gather(*(http.post(f"{r.http}/v1/realtime/client_secrets", json={}) for _ in range(20)))
                assert [m.status_code for m in after] == [200] * 20, [m.text for m in after if m.status_code != 200][:3]
                assert (await healthz(http, r.http))[0] == 200


async def test_redis_unreachable_refuses_keys_with_503_spends_none_and_sessions_resume_through_it():
    """Redis stopped (SIGSTOP: unreachable, not gone) under an open session: every redemption and
    mint is a 503 (never a 500, never a session), /healthz says degraded, the session talks on and
    even resumes after a drop (nothing of it is in Redis); Redis back (SIGCONT), with no restart of
    the replica: each key minted before opens exactly one session, however many race for it."""
    with redis_server() as redis_url, replica(config(), redis_url) as r:
        async with httpx.AsyncClient(headers=AUTH, timeout=10) as http:
            keys = [(await http.post(f"{r.http}/v1/realtime/client_secrets", json={})).json()["value"] for _ in range(4)]
            talker = ResumingClient("127.0.0.1", r.port, api_key=API_KEY)
            await talker.open()
            await talker.until("conversation.created")
            redis_url.process.send_signal(signal.SIGSTOP)
            try:
                statuses = await asyncio.gather(*[_upgrade_status(r.port, key) for key in keys * 2])
                assert statuses == [503] * 8, statuses
                minted = await http.post(f"{r.http}/v1/realtime/client_secrets", json={})
                assert minted.status_code == 503 and minted.json()["error"]["code"] == "server_unavailable", minted.text
                assert await wait_until(lambda: _status_is(http, r.http, 503), 6)
                status, body = await healthz(http, r.http)
                assert body["status"] == "state_unavailable" and body["degraded"] is True, body
                await talker.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
                await talker.until("response.created")
                talker.drop()
                await talker.resume()  # the session lives on its replica: a resume needs no Redis
                await talker.until("response.done")
                assert talker.events[-1]["response"]["status"] == "completed"
            finally:
                redis_url.process.send_signal(signal.SIGCONT)
            assert await wait_until(lambda: _status_is(http, r.http, 200), 8), "healthz stayed 503 with Redis back"
            statuses = await asyncio.gather(*[_upgrade_status(r.port, key) for key in keys * 2])
            assert sorted(statuses) == [101] * 4 + [401] * 4, statuses  # each key spent once, by one of its two
            assert (await http.post(f"{r.http}/v1/realtime/client_secrets", json={})).status_code == 200
            await talker.close()


async def _upgrade_status(port: int, key: str) -> int:
    """The status a WebSocket upgrade with ``key`` gets (a 101's session closed at once, cleanly)."""
    ws = await RawWebSocket.connect("127.0.0.1", port, "/v1/realtime?model=m", {"Authorization": f"Bearer {key}"})
    if ws.status == 101:
        await ws.send_frame(OP_CLOSE, struct.pack("!H", 1000))
    await ws.close()
    return ws.status


async def _status_is(http: httpx.AsyncClient, url: str, status: int) -> bool:
    return (await http.get(f"{url}/healthz")).status_code == status


async def test_sigterm_turns_healthz_503_at_once_and_lets_sessions_run_the_grace_period():
    grace = 3.0
    with redis_server() as redis_url, replica(config(shutdown_grace_s=grace), redis_url) as r:
        ws_base = f"ws://127.0.0.1:{r.port}/v1"
        async with httpx.AsyncClient(timeout=5) as http, connect(ws_base, api_key=API_KEY) as c:
            await c.expect("session.created")
            t0 = time.monotonic()
            r.process.send_signal(signal.SIGTERM)
            assert await wait_until(lambda: _status_is(http, r.http, 503), 0.5), "healthz did not turn 503 at once"
            assert (await healthz(http, r.http))[1]["status"] == "draining"
            # the open session goes on answering during the grace period
            await c.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
            done = await c.expect("response.done", timeout=5)
            assert done.response.status == "completed" and time.monotonic() - t0 < grace
            # then it is told to reconnect, and closed 1001
            err = await c.expect("error", timeout=grace + 5)
            told_after = time.monotonic() - t0
            assert err.error.code == "server_shutting_down", err
            assert told_after >= grace - 0.5, told_after
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await c.conn.recv_bytes()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert await asyncio.to_thread(r.process.wait, 15) in (0, -signal.SIGTERM)


async def test_workers_share_the_port_and_the_keys():
    with redis_server() as redis_url, replica(config(), redis_url, workers=2) as r:
        ws_base = f"ws://127.0.0.1:{r.port}/v1"
        replicas = set()
        for _ in range(40):  # a new connection each time: the kernel hands them to either worker
            async with httpx.AsyncClient(timeout=5) as http:
                replicas.add((await healthz(http, r.http))[1]["replica"])
            if len(replicas) == 2:
                break
        assert len(replicas) == 2, replicas
        async with httpx.AsyncClient(headers=AUTH, timeout=10) as http:
            keys = [(await http.post(f"{r.http}/v1/realtime/client_secrets", json={})).json()["value"] for _ in range(10)]
        for key in keys:
            async with connect(ws_base, api_key=key) as c:
                await c.expect("session.created")
        with pytest.raises(websockets.InvalidStatus) as spent:
            await websockets.connect(f"{ws_base}/realtime?model=m", additional_headers={"Authorization": f"Bearer {keys[0]}"})
        assert spent.value.response.status_code == 401


def test_a_worker_that_fails_to_start_stops_them_all():
    with redis_server() as redis_url:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump({**config(), "session": {"voice": "nosuchvoice"}}, f)  # fails in Server.start
            cmd = [sys.executable, "-m", "host", "serve", "--config", f.name, "--port", str(free_port()), "--workers", "2", "--state-url", redis_url]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode != 0 and "failed while starting" in done.stderr, (done.returncode, done.stderr[-2000:])


def test_workers_need_a_shared_state():
    cmd = [sys.executable, "-m", "host", "serve", "--config", "synthetic", "--port", str(free_port()), "--workers", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ})
    assert done.returncode == 2 and "--state-url" in done.stderr, (done.returncode, done.stderr)
