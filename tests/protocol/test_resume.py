"""Resuming a WebSocket session after its connection dropped (docs/realtime-api.md#resuming-a-session):
with the official SDK's own reconnection, and with a raw client that aborts TCP mid-response,
mid-append and on a connection still half-open; refusals at the upgrade that leave the session as
it was; the session's end after the grace and on a buffer overflow; a clean close ending at once."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from tests.conftest import synthetic_config
from tests.support.peers import RawWebSocket, Refused, ResumingClient, event_number, response_headers
from tests.support.server import ServerThread, wait_until
from tests.support.validation import validate

TONE_REPLY = " ".join(["word"] * 20)  # 20 words x 240 ms of tone: 4.8 s of audio, 120 deltas


@pytest.fixture(scope="module")
def paced():
    """A tone answer of 120 deltas paced 10 ms apart (1.2 s): a response is under way at a drop."""
    srv = ServerThread(synthetic_config(reply=TONE_REPLY, chunk_interval_ms=10)).start()
    yield srv
    srv.stop()


RATE = 24000


@pytest.fixture(scope="module")
def echo():
    """Manual turns answered with the user's own audio, sample for sample."""
    manual = {"audio": {"input": {"turn_detection": None, "transcription": None}}}
    srv = ServerThread(synthetic_config(audio="echo", reply="ok", input_rate=RATE, output_rate=RATE, session=manual)).start()
    yield srv
    srv.stop()


def _client(srv: ServerThread) -> ResumingClient:
    return ResumingClient("127.0.0.1", srv.port)


def _numbers(events: list[Any]) -> list[int]:
    return [event_number(e.event_id if hasattr(e, "event_id") else e["event_id"]) for e in events]


async def test_the_sdk_reconnects_through_a_drop_mid_response_and_gets_every_event_once(paced, caplog):
    """The SDK's own reconnection (``on_reconnecting``) with the resume headers: the answer goes on
    where it was cut, every event validated by the SDK's models, none twice, none missing."""
    caplog.set_level(logging.DEBUG)
    got: list[Any] = []
    resume: dict[str, str] = {}

    def on_reconnecting(event: Any) -> dict[str, Any]:
        return {"extra_headers": {**resume, "last-event-id": got[-1].event_id}}

    client = AsyncOpenAI(api_key="k", websocket_base_url=paced.ws_base)
    async with client.realtime.connect(model="m", on_reconnecting=on_reconnecting, initial_delay=0.01) as conn:
        head = conn._connection.response.headers  # the upgrade's answer (websockets' ClientConnection)
        resume = {"x-session-id": head["x-session-id"], "x-resume-token": head["x-resume-token"]}
        raw_recv = conn.recv_bytes

        async def recv_bytes() -> bytes:  # every event the SDK receives, validated by its models
            data = await raw_recv()
            got.append(validate(json.loads(data)))
            return data

        conn.recv_bytes = recv_bytes  # type: ignore[method-assign]
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
        await conn.response.create()
        dropped = 0
        async for event in conn:
            if event.type == "response.output_audio.delta" and dropped < 2 and len([e for e in got if e.type == event.type]) in (10, 60):
                conn._connection.transport.abort()  # the network goes: no close frame
                dropped += 1
            if event.type == "response.done":
                break
    assert dropped == 2
    types = [e.type for e in got]
    assert types.count("session.created") == 1
    numbers = _numbers(got)
    assert numbers == list(range(1, len(got) + 1)), numbers  # once each, in order
    audio = b"".join(base64.b64decode(e.delta) for e in got if e.type == "response.output_audio.delta")
    assert len(audio) == 20 * 240 * 24 * 2  # 20 words of 240 ms at 24 kHz, pcm16
    assert got[-1].response.status == "completed"
    server_side = [r for r in caplog.records if not r.name.startswith(("websockets.client", "openai"))]  # (a client logs its own headers)
    assert any(r.name == "transports.websocket" and "resumed" in r.getMessage() for r in server_side)
    assert not [r for r in server_side if resume["x-resume-token"] in r.getMessage()]  # the server never logs the token


async def test_appended_audio_survives_a_drop_and_what_was_lost_in_flight_is_sent_again(echo):
    """Appends before the drop are kept; those lost in flight are re-sent from the server's count;
    the answer (the echo of the committed audio) is every byte appended."""
    c = _client(echo)
    await c.open()
    await c.until("conversation.created")
    audio = bytes(range(256)) * (RATE * 2 * 3 // 10 // 256)  # 300 ms
    pieces = [audio[i : i + 960] for i in range(0, len(audio), 960)]  # 20 ms each
    for n, piece in enumerate(pieces[:10]):
        await c.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()}, lost=n >= 8)
    c.drop()
    resumed = await c.resume()
    assert resumed.replayed == 0 and resumed.taken == 8  # the two lost ones were sent again
    for piece in pieces[10:]:
        await c.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
    await c.send({"type": "input_audio_buffer.commit"})
    await c.send({"type": "response.create"})
    await c.until("response.done")
    echoed = b"".join(base64.b64decode(e["delta"]) for e in c.events if e["type"] == "response.output_audio.delta")
    assert echoed == audio
    assert [e["type"] for e in c.events].count("session.created") == 1
    await c.close()


async def test_a_raw_client_aborting_mid_response_gets_the_rest_replayed_then_live(paced):
    c = _client(paced)
    await c.open()
    await c.send({"type": "response.create"})
    while sum(e["type"] == "response.output_audio.delta" for e in c.events) < 5:
        await c.recv()
    c.drop()
    await asyncio.sleep(0.3)  # the response goes on meanwhile, into the session's log
    resumed = await c.resume()
    assert resumed.replayed > 0
    await c.until("response.done")
    numbers = [event_number(e["event_id"]) for e in c.events]
    assert numbers == list(range(1, len(numbers) + 1))
    assert sum(e["type"] == "response.output_audio.delta" for e in c.events) == 120
    for e in c.events:
        validate(e)
    await c.close()


async def test_refusals_at_the_upgrade_leave_the_session_alone(paced):
    a, b = _client(paced), _client(paced)
    await a.open()
    await b.open()
    await a.until("conversation.created")
    await b.until("conversation.created")
    a.drop()
    cases = [
        (dict(token="not-the-token"), 403, "invalid_resume_token"),
        (dict(token=b.token), 403, "invalid_resume_token"),  # another session's token opens nothing else
        (dict(last_event_id="event_unknown"), 409, "resume_gap"),
    ]
    for kw, status, code in cases:
        with pytest.raises(Refused) as refused:
            await a.resume(**kw)
        assert refused.value.status == status and f'"code":"{code}"' in refused.value.body, refused.value
    stranger = _client(paced)
    stranger.session_id, stranger.token = "sess_nobody", a.token
    with pytest.raises(Refused) as refused:
        await stranger.resume()
    assert refused.value.status == 404
    b.session_id = a.session_id  # b's key and token, a's id
    with pytest.raises(Refused) as refused:
        await b.resume()
    assert refused.value.status == 403
    await a.resume()  # and the session is still there, for its own client
    await a.send({"type": "response.create"})
    await a.until("response.done")
    assert [e["type"] for e in a.events].count("session.created") == 1
    await a.close()


async def test_a_resume_closes_the_connection_still_half_open(paced):
    old = _client(paced)
    await old.open()
    await old.until("conversation.created")
    new = _client(paced)
    new.session_id, new.token, new.events = old.session_id, old.token, list(old.events)
    await new.resume()
    assert old.ws is not None
    assert await old.ws.close_code(timeout=5) == 1001
    await new.send({"type": "response.create"})
    await new.until("response.done")
    await new.close()


async def test_after_the_grace_the_session_ends_its_response_cancelled(make_server):
    srv = make_server(reply=" ".join(["word"] * 200), chunk_interval_ms=40, server={"resume": {"grace_s": 0.5}})
    c = _client(srv)
    await c.open()
    await c.send({"type": "response.create"})
    await c.until("response.output_audio.delta")
    c.drop()
    pipeline = srv.server.pipeline

    async def freed() -> bool:
        return not await srv.acall(lambda: len(srv.server.sessions)) and (await srv.acall(pipeline.stats))["active_responses"] == 0

    assert await wait_until(freed, 10)
    with pytest.raises(Refused) as refused:
        await c.resume()
    assert refused.value.status == 410 and "nobody resumed it within 0.5 s" in refused.value.body


async def test_a_buffer_overflow_while_nobody_is_connected_ends_the_session_with_its_reason(make_server):
    # The answer begins 300 ms after the drop: its 240 events have no connection to go to.
    srv = make_server(reply=" ".join(["word"] * 40), first_chunk_ms=300, server={"resume": {"grace_s": 30, "buffer_events": 64}})
    c = _client(srv)
    await c.open()
    await c.until("conversation.created")
    await c.send({"type": "response.create"})
    c.drop()
    assert await wait_until(lambda: srv.acall(lambda: not srv.server.sessions), 10)
    with pytest.raises(Refused) as refused:
        await c.resume()
    assert refused.value.status == 410 and "overflowed" in refused.value.body


async def test_a_clean_close_ends_the_session_at_once(paced):
    c = _client(paced)
    await c.open()
    await c.until("conversation.created")
    await c.close()
    assert await wait_until(lambda: paced.acall(lambda: c.session_id not in paced.server.holds), 5)
    with pytest.raises(Refused) as refused:
        await c.resume()
    assert refused.value.status == 410 and "the client closed it" in refused.value.body


async def test_an_ephemeral_key_resumes_its_own_session_and_no_other_key_does():
    srv = ServerThread(synthetic_config(server={"api_key": "sekrit"})).start()
    try:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            mint = lambda: http.post("/v1/realtime/client_secrets", json={}, headers={"Authorization": "Bearer sekrit"})  # noqa: E731
            key, other = (await mint()).json()["value"], (await mint()).json()["value"]
        c = ResumingClient("127.0.0.1", srv.port, api_key=key)
        await c.open()
        await c.until("conversation.created")
        c.drop()
        c.auth = {"Authorization": f"Bearer {other}"}
        with pytest.raises(Refused) as refused:
            await c.resume()
        assert refused.value.status == 401
        c.auth = {"Authorization": f"Bearer {key}"}  # spent, but it opened this session
        await c.resume()
        await c.send({"type": "response.create"})
        await c.until("response.done")
        await c.close()
    finally:
        srv.stop()


async def test_without_a_grace_nothing_is_offered_and_a_drop_ends_the_session(make_server):
    srv = make_server(server={"resume": {"grace_s": 0}})
    ws = await RawWebSocket.connect("127.0.0.1", srv.port, "/v1/realtime?model=m")
    assert ws.status == 101 and "x-session-id" not in response_headers(ws.head) and "x-resume-token" not in response_headers(ws.head)
    assert await wait_until(lambda: srv.acall(lambda: len(srv.server.sessions) == 1), 5)
    ws.abort()
    assert await wait_until(lambda: srv.acall(lambda: not srv.server.sessions), 5)
