"""A deployment with real parts, all on loopback: Debian's nginx (deploy/nginx.conf) in front of
two ``realtime-omni serve`` replicas sharing Debian's redis-server, both in front of one remote
engine (the fake vLLM-Omni deployment). Keys minted through the balancer open sessions on either
replica; a WebRTC call's sideband and call control reach the call from either; racing
redemptions spend each key once; kill -9 of one replica ends only its own sessions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import websockets
from openai import AsyncOpenAI

from realtime_omni import config as config_file
from tests.support.fake_omni import FakeOmniConfig, FakeOmniServer
from tests.support.peers import Refused, ResumingClient, RtcClient, event_number
from tests.support.processes import cluster, redis_server
from tests.support.server import wait_until
from tests.support.validation import validated_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

API_KEY = "sk-cluster"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEXT = {"type": "response.create", "response": {"output_modalities": ["text"], "instructions": "Say hi."}}


def replica_config(engine_url: str) -> dict[str, Any]:
    """The shipped Qwen3-Omni config on the fake deployment, minting fast enough for the race."""
    config = config_file.raw("qwen3-omni")
    config["pipeline"]["options"]["remote"].update(url=f"{engine_url}/v1", stall_s=5.0, probe_interval_s=0.2)
    config.update(api_key=API_KEY, web_demo=False, shutdown_grace_s=2.0, webrtc={"host_addresses": ["127.0.0.1"]})
    config["limits"] = {"max_sessions": 1000, "key_mints_per_s": 5000.0, "key_mint_burst": 2000}
    return config


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeOmniServer]:
    with FakeOmniServer(FakeOmniConfig(profile="qwen3-omni")) as fake:
        body = {"model": fake.fake.config.served_model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
        httpx.post(f"{fake.url}/v1/chat/completions", json=body, timeout=30).raise_for_status()  # one-time costs first
        fake.fake.reset()
        yield fake


@pytest.fixture(scope="module")
def deployment(engine: FakeOmniServer) -> Iterator[Any]:
    with cluster(replica_config(engine.url), replicas=2) as c:
        yield c


async def sessions_on(c: Any) -> list[int]:
    """Each replica's open sessions, asked of it directly."""
    async with httpx.AsyncClient() as http:
        return [(await http.get(f"{r.http}/healthz")).json()["sessions"] for r in c.replicas]


async def mint(http_url: str) -> str:
    sdk = AsyncOpenAI(api_key=API_KEY, base_url=f"{http_url}/v1")
    secret = await sdk.realtime.client_secrets.create()
    return secret.value


@contextlib.asynccontextmanager
async def session(ws_base: str, key: str) -> AsyncIterator[Any]:
    sdk = AsyncOpenAI(api_key=key, base_url=ws_base.replace("ws://", "http://"), websocket_base_url=ws_base)
    async with sdk.realtime.connect(model="qwen3-omni") as conn:
        first = await asyncio.wait_for(conn.recv(), 10)
        assert first.type == "session.created"
        yield conn


async def answer(conn: Any) -> dict[str, Any]:
    """Ask for a short text answer; the response.done it ends with."""
    await conn.send(TEXT)
    return (await validated_until(conn, "response.done"))[-1]


async def test_a_key_minted_through_the_balancer_opens_a_session_on_the_other_replica(deployment, engine):
    """Mint through nginx, connect through nginx, until a key minted on one replica has opened a
    session on the other (least_conn alternates them); every key works once, anywhere."""
    crossed = False
    async with httpx.AsyncClient() as http:
        for _ in range(6):
            minted_by = await minted_where(deployment, http)
            async with session(deployment.ws, minted_by[1]) as conn:
                held = await sessions_on(deployment)
                assert sum(held) == 1, held
                crossed |= held.index(1) != minted_by[0]
                done = await answer(conn)
                assert done["response"]["status"] == "completed", done
            if crossed:
                break
    assert crossed, "no key minted on one replica was redeemed on the other"
    # every remote request of a session carried one affinity header and its cache_salt
    requests = [r for r in engine.fake.requests if r.body and r.body.get("cache_salt")]
    assert requests and all(r.headers.get("x-session-id") for r in requests)
    by_salt: dict[str, set[str]] = {}
    for r in requests:
        by_salt.setdefault(r.body["cache_salt"], set()).add(r.headers["x-session-id"])
    assert all(len(ids) == 1 for ids in by_salt.values()), by_salt
    assert len({next(iter(ids)) for ids in by_salt.values()}) == len(by_salt)  # one per session


async def minted_where(c: Any, http: httpx.AsyncClient) -> tuple[int, str]:
    """A key minted through the balancer, and which replica minted it (the one whose mint counter moved)."""
    before = [await mints(http, r.http) for r in c.replicas]
    key = await mint(c.http)
    after = [await mints(http, r.http) for r in c.replicas]
    moved = [i for i, (a, b) in enumerate(zip(before, after)) if b > a]
    assert len(moved) == 1, (before, after)
    return moved[0], key


async def mints(http: httpx.AsyncClient, url: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("realtime_ephemeral_keys_minted_total"))


async def test_a_webrtc_calls_sideband_and_control_reach_it_from_either_replica(deployment):
    client = RtcClient(deployment.http, API_KEY)
    await client.connect()
    try:
        await client.next("session.created")
        held = await sessions_on(deployment)
        owner = held.index(1)
        other = deployment.replicas[1 - owner]
        for base in (other.http, deployment.http):  # the replica without the call, and the balancer
            sdk = AsyncOpenAI(api_key=API_KEY, base_url=f"{base}/v1")
            async with sdk.realtime.connect(call_id=client.call_id) as sideband:
                await sideband.send(TEXT)  # type: ignore[arg-type]
                seen = [e["type"] for e in await validated_until(sideband, "response.done")]
                assert "response.created" in seen, seen
            done = await client.next("response.done")  # the same answer on the call's own data channel
            assert done["response"]["status"] == "completed"
        async with httpx.AsyncClient() as http:
            # an unknown call is unknown everywhere (and not forwarded in circles)
            r = await http.post(f"{other.http}/v1/realtime/calls/rtc_nosuchcall/hangup", headers=AUTH)
            assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"
            r = await http.post(f"{other.http}/v1/realtime/calls/{client.call_id}/hangup", headers=AUTH)
            assert r.status_code == 200, r.text
        assert await wait_until(lambda: _none_held(deployment), 10)
    finally:
        await client.close()


async def _none_held(c: Any) -> bool:
    return sum(await sessions_on(c)) == 0


async def test_racing_redemptions_spend_each_key_exactly_once_across_both_replicas(deployment):
    """1,000 keys, each raced by 10 WebSocket handshakes, 5 on each replica at once: 10,000
    redemptions, of which exactly one per key opens a session; the other 9,000 get a 401."""
    keys_n, tries = 1000, 10
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=deployment.http, headers=AUTH, timeout=60, limits=limits) as http:
        minted = await asyncio.gather(*(http.post("/v1/realtime/client_secrets", json={}) for _ in range(keys_n)))
    keys = [r.json()["value"] for r in minted]
    assert len(set(keys)) == keys_n
    opened: dict[str, int] = {k: 0 for k in keys}
    refused: dict[int, int] = {}
    gate = asyncio.Semaphore(200)
    urls = [f"ws://127.0.0.1:{r.port}/v1/realtime?model=m" for r in deployment.replicas]

    async def redeem(key: str, i: int) -> None:
        async with gate:
            try:
                async with websockets.connect(urls[i % 2], additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=30) as ws:
                    first = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if first["type"] == "session.created":
                        opened[key] += 1
            except websockets.InvalidStatus as err:
                refused[err.response.status_code] = refused.get(err.response.status_code, 0) + 1

    async def race(key: str) -> None:
        await asyncio.gather(*(redeem(key, i) for i in range(tries)))

    t0 = time.monotonic()
    await asyncio.gather(*(race(k) for k in keys))
    took = time.monotonic() - t0
    assert sorted(set(opened.values())) == [1], {n: sum(1 for v in opened.values() if v == n) for n in set(opened.values())}
    assert refused == {401: keys_n * (tries - 1)}, refused
    assert took < 120, took
    assert await wait_until(lambda: _none_held(deployment), 10)


async def test_a_resume_through_the_balancer_reaches_the_replica_holding_the_session(deployment):
    """nginx routes each resume by its x-session-id (the replica's route_tag begins it) to the
    replica holding the session, whichever replica a new connection would go to; every event once."""
    tags = set()
    for _ in range(4):  # least_conn alternates the new sessions between the two replicas
        c = ResumingClient("127.0.0.1", deployment.port, api_key=API_KEY, model="qwen3-omni")
        await c.open()
        tags.add(c.session_id.split("_")[1])
        await c.send(TEXT)
        await c.until("response.created")
        c.drop()
        resumed = await c.resume()
        assert resumed.taken == 1
        await c.until("response.done")
        numbers = [event_number(e["event_id"]) for e in c.events]
        assert numbers == list(range(1, len(numbers) + 1)) and c.events[-1]["response"]["status"] == "completed"
        await c.close()
    assert tags == {"r1", "r2"}, tags
    stranger = ResumingClient("127.0.0.1", deployment.port, api_key=API_KEY)
    stranger.session_id, stranger.token = "sess_r9_00", "x"  # no such replica: a new session's route, and nobody holds it
    with pytest.raises(Refused) as refused:
        await stranger.resume()
    assert refused.value.status == 404
    assert await wait_until(lambda: _no_sessions(deployment), 10)


async def _no_sessions(c: Any) -> bool:
    return sum(await sessions_on(c)) == 0


async def test_redis_killed_under_sessions_through_the_balancer_loses_none_and_comes_back(engine):
    """Twelve sessions through nginx on both replicas answering on while Redis is killed for 5 s:
    none lost, every mint meanwhile a 503 (no 500); an empty Redis started again on its port, both
    replicas take keys and sessions again without a restart. (A deployment of its own: the shared
    one keeps its Redis.)"""
    with cluster(replica_config(engine.url), replicas=2) as c:
        keys = [await mint(c.http) for _ in range(12)]
        redis = c.redis_url.process  # (bench.cluster's redis_server yields its URL with its process)
        port = int(c.redis_url.rsplit(":", 1)[1].split("/")[0])
        async with contextlib.AsyncExitStack() as stack:
            conns = [await stack.enter_async_context(session(c.ws, key)) for key in keys]
            assert all(await sessions_on(c)), "least_conn put every session on one replica"
            redis.kill()
            await asyncio.to_thread(redis.wait, 10)
            minted: list[int] = []
            async with httpx.AsyncClient(headers=AUTH, timeout=10) as http:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 5:  # the sessions talk through the outage; keys are asked for meanwhile
                    dones = await asyncio.gather(*(answer(conn) for conn in conns))
                    assert all(d["response"]["status"] == "completed" for d in dones), dones
                    minted.append((await http.post(f"{c.http}/v1/realtime/client_secrets", json={})).status_code)
            assert set(minted) == {503}, minted
            with redis_server(port):
                async with httpx.AsyncClient() as http:
                    for r in c.replicas:
                        assert await wait_until(lambda: _healthy(http, r.http), 8), f"replica {r.port} stayed unhealthy"
                for key in [await mint(c.http) for _ in range(2)]:
                    async with session(c.ws, key) as conn:
                        assert (await answer(conn))["response"]["status"] == "completed"
                dones = await asyncio.gather(*(answer(conn) for conn in conns))
                assert all(d["response"]["status"] == "completed" for d in dones)
                await stack.aclose()
                assert await wait_until(lambda: _no_sessions(c), 10)


async def _healthy(http: httpx.AsyncClient, url: str) -> bool:
    return (await http.get(f"{url}/healthz")).status_code == 200


async def test_kill_9_of_one_replica_ends_only_its_own_sessions(engine):
    """Its clients see their connections close; the other replica's sessions go on answering, and
    keys still unspent (some minted by the dead replica) open sessions on the survivor."""
    with cluster(replica_config(engine.url), replicas=2) as c:
        keys = [await mint(c.http) for _ in range(4)]
        async with contextlib.AsyncExitStack() as stack:
            conns: list[tuple[int, Any]] = []
            for key in keys[:2] + [await mint(c.http) for _ in range(2)]:
                before = await sessions_on(c)
                conn = await stack.enter_async_context(session(c.ws, key))
                after = await sessions_on(c)
                conns.append(([b - a for a, b in zip(before, after)].index(1), conn))
            assert {where for where, _ in conns} == {0, 1}, "least_conn put every session on one replica"
            victim = c.replicas[0]
            os.kill(victim.process.pid, signal.SIGKILL)
            victim.process.wait(timeout=10)
            for where, conn in conns:
                if where == 0:  # told by the close: the stream ends (a timeout here fails the test)
                    with contextlib.suppress(websockets.ConnectionClosed):
                        async with asyncio.timeout(10):
                            async for _ in conn:
                                pass
                else:
                    done = await answer(conn)
                    assert done["response"]["status"] == "completed"
        for key in keys[2:]:  # unspent: redeemed through the balancer, now on the survivor
            async with session(c.ws, key) as conn:
                done = await answer(conn)
                assert done["response"]["status"] == "completed"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{c.replicas[1].http}/healthz")).status_code == 200
