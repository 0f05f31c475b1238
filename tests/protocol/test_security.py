"""Security: ephemeral keys single-use under a crowd of racing redemptions, key minting rate-limited,
Origin checked against an allow-list, /metrics behind the key, and sessions that race the same
item ids never seeing each other's events, items or audio."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import websockets

from tests.conftest import synthetic_config
from tests.support.client import connect
from tests.support.peers import offer_sdp
from tests.support.server import ServerThread

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def _mint(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/realtime/client_secrets", json={}, headers=AUTH)


async def test_an_ephemeral_key_opens_exactly_one_session_whatever_races_for_it():
    """Eight WebSocket connections and two WebRTC offers redeem one key at once: one session opens."""
    srv = ServerThread(synthetic_config(server={"api_key": KEY})).start()
    offer = await offer_sdp()

    async def by_websocket(key: str) -> str:
        try:
            async with websockets.connect(f"{srv.ws_base}/realtime?model=m", additional_headers={"Authorization": f"Bearer {key}"}) as ws:
                return json.loads(await ws.recv())["type"]
        except websockets.InvalidStatus as refused:
            return str(refused.response.status_code)

    async def by_webrtc(key: str, http: httpx.AsyncClient) -> str:
        r = await http.post("/v1/realtime/calls", content=offer, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"})
        if r.status_code == 201:
            await http.delete(r.headers["location"], headers=AUTH)
            return "session.created"
        return str(r.status_code)

    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for _ in range(3):
                key = (await _mint(http)).json()["value"]
                results = await asyncio.gather(*[by_websocket(key) for _ in range(8)], by_webrtc(key, http), by_webrtc(key, http))
                assert sorted(results) == ["401"] * 9 + ["session.created"], results
    finally:
        srv.stop()


async def test_minting_keys_is_rate_limited():
    srv = ServerThread(synthetic_config(server={"api_key": KEY}, limits={"key_mints_per_s": 2.0, "key_mint_burst": 3})).start()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            statuses = [(await _mint(http)).status_code for _ in range(3)]
            assert statuses == [200, 200, 200]  # the burst
            refused = await _mint(http)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert int(refused.headers["retry-after"]) >= 1
            beta = await http.post("/v1/realtime/sessions", json={}, headers=AUTH)  # the beta route shares the bucket
            assert beta.status_code == 429
            await asyncio.sleep(0.6)  # the test's input: time refills the bucket (2 a second: one more token)
            assert (await _mint(http)).status_code == 200
    finally:
        srv.stop()


async def test_origin_allow_list_for_websocket_and_webrtc():
    srv = ServerThread(synthetic_config(server={"allowed_origins": ["https://good.example"]})).start()
    offer = await offer_sdp()
    try:
        async with websockets.connect(f"{srv.ws_base}/realtime?model=m", origin="https://good.example") as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with websockets.connect(f"{srv.ws_base}/realtime?model=m") as ws:  # no Origin: not a browser
            assert json.loads(await ws.recv())["type"] == "session.created"
        try:
            async with websockets.connect(f"{srv.ws_base}/realtime?model=m", origin="https://evil.example"):
                raise AssertionError("a disallowed Origin connected")
        except websockets.InvalidStatus as refused:
            assert refused.response.status_code == 403
            assert json.loads(refused.response.body)["error"]["code"] == "origin_not_allowed"
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            headers = {"Content-Type": "application/sdp", "Authorization": "Bearer k"}
            r = await http.post("/v1/realtime/calls", content=offer, headers={**headers, "Origin": "https://evil.example"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
            r = await http.post("/v1/realtime/calls", content=offer, headers={**headers, "Origin": "https://good.example"})
            assert r.status_code == 201
            await http.delete(r.headers["location"])
        assert await srv.acall(lambda: srv.server.sessions == set())
    finally:
        srv.stop()


async def test_metrics_can_require_the_key_and_keys_compare_whole():
    srv = ServerThread(synthetic_config(server={"api_key": KEY, "metrics_need_key": True})).start()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            assert (await http.get("/metrics")).status_code == 401
            assert (await http.get("/metrics", headers={"Authorization": "Bearer sekri"})).status_code == 401
            ok = await http.get("/metrics", headers=AUTH)
            assert ok.status_code == 200 and "realtime_sessions_active" in ok.text
            assert (await http.get("/healthz")).status_code == 200  # health stays open
        server = srv.server
        # hmac.compare_digest on the whole key: prefixes, extensions and other lengths all fail
        for wrong in ("", "s", "sekri", "sekritt", "SEKRIT", "ek_sekrit", "sekrit\x00"):
            assert not server.authorized(wrong), wrong
        assert server.authorized(KEY)
    finally:
        srv.stop()


async def test_sessions_racing_the_same_item_ids_never_see_each_other(server):
    """Two sessions create, retrieve, answer from and delete items with the *same* ids at the same
    time. Each sees only its own: items, transcripts, responses and audio."""
    rounds = 12

    async def user(name: str) -> tuple[list, set[str]]:
        async with connect(server.ws_base) as c:
            await c.expect("session.created")
            await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
            await c.expect("session.updated")
            mine: set[str] = set()
            for n in range(rounds):
                item = {"id": f"item_shared{n % 3}", "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"{name} {n}"}]}
                await c.send({"type": "conversation.item.delete", "item_id": item["id"]})
                await c.send({"type": "conversation.item.create", "item": item})
                await c.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
                await c.send({"type": "response.create", "response": {"metadata": {"who": name}}})
                created = await c.expect("response.created")
                mine.add(created.response.id)
                await c.expect("response.done")
            await c.quiet(0.2)
            return c.events, mine

    (events_a, mine_a), (events_b, mine_b) = await asyncio.gather(user("alpha"), user("bravo"))
    assert not mine_a & mine_b
    for events, mine, me, other in ((events_a, mine_a, "alpha", "bravo"), (events_b, mine_b, "bravo", "alpha")):
        text = json.dumps([e.model_dump() for e in events if e.type != "response.output_audio.delta"])
        assert other not in text and me in text
        retrieved = [e for e in events if e.type == "conversation.item.retrieved"]
        assert len(retrieved) == rounds and all(e.item.content[0].text.startswith(me) for e in retrieved)
        for e in events:
            if hasattr(e, "response_id"):
                assert e.response_id in mine, e.type
            if e.type in ("response.created", "response.done"):
                assert e.response.id in mine and e.response.metadata["who"] == me
        transcripts = [e.transcript for e in events if e.type == "response.output_audio_transcript.done"]
        assert len(transcripts) == rounds and all(me in t for t in transcripts)  # each answer heard its own words
        audio = [e for e in events if e.type == "response.output_audio.delta"]
        assert audio and all(e.response_id in mine and base64.b64decode(e.delta) for e in audio)


async def test_sessions_share_a_prefix_cache_namespace_per_key_and_never_across_keys():
    """``Pipeline.open``'s tenant: one for every session of an API key and of the ephemeral keys it
    minted, another for another key, none without a key; never the key itself. The pipeline is told
    what every response begins with at the start and at each session.update (``prepare``)."""
    srv = ServerThread(synthetic_config(server={"api_key": KEY})).start()
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}

    async def tenant_of(key: str, update: bool = False) -> tuple[str | None, list]:  # type: ignore[type-arg]
        async with connect(srv.ws_base, api_key=key) as c:
            await c.expect("session.created")
            if update:
                await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.", "tools": [tool]}})
                await c.expect("session.updated")
            (session,) = await srv.acall(lambda: list(srv.server.sessions))
            pipe = session.ctx.pipe
            return pipe.tenant, list(pipe.prepared)

    try:
        first, prepared = await tenant_of(KEY, update=True)
        second, _ = await tenant_of(KEY)
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            ephemeral = (await _mint(http)).json()["value"]
        minted, _ = await tenant_of(ephemeral)
        assert first is not None and first == second == minted
        assert KEY not in first and ephemeral not in first
        assert prepared[-1] == ("Be brief.", ["get_weather"]) and len(prepared) == 2  # at the start, then the update's
    finally:
        srv.stop()
    srv = ServerThread(synthetic_config()).start()  # no API key: any key opens a session, each its own namespace
    try:
        a, _ = await tenant_of("key-a")
        b, _ = await tenant_of("key-b")
        again, _ = await tenant_of("key-a")
        assert a is not None and b is not None and a != b and again == a
        assert srv.server.tenant(None) is None  # an anonymous client: the session's own
    finally:
        srv.stop()
