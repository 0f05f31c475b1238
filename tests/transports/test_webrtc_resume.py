"""Resuming a WebRTC call on a new peer connection (docs/realtime-api.md#resuming-a-session): an
aiortc caller whose network goes mid-response (its UDP sockets closed under it: the server hears
no close) offers again with the session's id, token and last event id, and gets the rest of the
answer's events once each and in order, then live ones, on a new data channel, with the same
conversation; refusals leave the session alone; a session nobody resumes ends after the grace."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import websockets

from tests.support.audio import rms
from tests.support.peers import RtcClient as _RtcClient
from tests.support.peers import event_number, offer_sdp
from tests.support.sip import wait_until
from tests.support.validation import validate

pytestmark = pytest.mark.timeout(90)

REPLY = " ".join(["word"] * 40)  # 9.6 s of answer, played in real time: still under way at the cut


def RtcClient(http_url: str, api_key: str = "test-key") -> _RtcClient:  # noqa: N802
    return _RtcClient(http_url, api_key, validate=validate)


@pytest.fixture(scope="module")
def slow(make_server):
    """A silent peer is lost after 1 s (``media_timeout_s``) and kept 10 s for a resume."""
    webrtc = {"host_addresses": ["127.0.0.1"], "media_timeout_s": 1.0}
    return make_server(chunk_interval_ms=40, reply=REPLY, server={"webrtc": webrtc, "resume": {"grace_s": 10.0}})


@pytest.fixture(scope="module")
def brief(make_server):
    """Kept 1 s only: nobody resumes in time."""
    webrtc = {"host_addresses": ["127.0.0.1"], "media_timeout_s": 1.0}
    return make_server(chunk_interval_ms=40, reply=REPLY, server={"webrtc": webrtc, "resume": {"grace_s": 1.0}, "api_key": "real-secret"})


def numbers(client: _RtcClient) -> list[int]:
    return [event_number(e["event_id"]) for _, e in client.log]


async def ask(client: _RtcClient) -> dict[str, Any]:
    """A user message and a response to it, on the data channel; the message's item."""
    client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}})
    added = await client.next("conversation.item.added")
    client.send({"type": "response.create"})
    return added["item"]


async def offer(srv, headers: dict[str, str], key: str = "test-key") -> httpx.Response:
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        return await http.post(
            "/v1/realtime/calls", content=await offer_sdp(), headers={"content-type": "application/sdp", "authorization": f"Bearer {key}", **headers}
        )


@pytest.mark.parametrize("lost", [False, True], ids=["old-peer-half-open", "old-peer-lost-first"])
async def test_a_call_cut_mid_response_resumes_on_a_new_peer_connection(slow, lost):
    first = RtcClient(slow.http_url)
    await first.connect()
    head = first.answer_headers
    resume = {"x-session-id": head["x-session-id"], "x-resume-token": head["x-resume-token"]}
    await first.next("session.created")
    item = await ask(first)
    for _ in range(3):
        await first.next("response.output_audio_transcript.delta")
    call = slow.server.calls[first.call_id]
    old_pc = call.pc
    first.cut_network()  # mid-response
    last = first.log[-1][1]["event_id"]
    if lost:  # the server notices the silence (media_timeout_s) and keeps the session, its peer connection closed
        assert await wait_until(lambda: call.parked_at is not None)
        assert await wait_until(lambda: old_pc.connectionState == "closed")
        assert first.call_id in slow.server.calls
    second = RtcClient(slow.http_url)
    await second.connect(headers={**resume, "last-event-id": last})
    assert second.call_id == first.call_id and second.answer_headers["x-session-id"] == resume["x-session-id"]
    assert "x-resume-token" not in second.answer_headers
    assert int(second.answer_headers["x-client-events-received"]) == 2  # the item and the response.create
    done = await second.next("response.done")
    assert done["response"]["status"] == "completed"
    assert done["response"]["output"][0]["content"][0]["transcript"] == REPLY
    # every event after the last one the first peer got, once each and in order; no second session.created
    assert numbers(second)[0] == event_number(last) + 1
    got = numbers(first)[: numbers(first).index(event_number(last)) + 1] + numbers(second)
    assert got == list(range(1, len(got) + 1)), got
    assert [e["type"] for _, e in first.log + second.log].count("session.created") == 1
    assert int(second.answer_headers["x-replayed-events"]) <= len(second.log)
    # the conversation is the same one
    second.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    retrieved = await second.next("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["text"] == "Tell me a story."
    # the answer's audio goes on on the new track; the old peer connection is closed, the call is one
    assert await wait_until(lambda: any(rms(pcm) > 300 for _, pcm in second.received))
    assert await wait_until(lambda: old_pc.connectionState == "closed")
    assert call.pc is not old_pc and len(slow.server.sessions) == 1
    second.send({"type": "response.create"})  # and it goes on live
    assert (await second.next("response.created"))["response"]["id"] != done["response"]["id"]
    await second.close()
    await first.close()
    assert await wait_until(lambda: not slow.server.calls and not slow.server.sessions)


async def test_refused_resumes_leave_the_call_alone(brief):
    first = RtcClient(brief.http_url, api_key="real-secret")
    await first.connect()
    head = first.answer_headers
    session_id, token = head["x-session-id"], head["x-resume-token"]
    await first.next("session.created")
    for headers, key, status, code in (
        ({"x-session-id": session_id, "x-resume-token": "not-its-token"}, "real-secret", 403, "invalid_resume_token"),
        ({"x-session-id": "sess_nobody", "x-resume-token": token}, "real-secret", 404, "session_not_found"),
        ({"x-session-id": session_id, "x-resume-token": token}, "wrong-key", 401, "invalid_api_key"),
        ({"x-session-id": session_id, "x-resume-token": token, "last-event-id": "event_never_sent"}, "real-secret", 409, "resume_gap"),
    ):
        r = await offer(brief, headers, key)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    # a call's session is resumed by an offer only, not by a WebSocket (nor a WebSocket's by an offer)
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(
            f"{brief.ws_base}/realtime?model=m",
            additional_headers={"authorization": "Bearer real-secret", "x-session-id": session_id, "x-resume-token": token},
        ):
            pass
    assert refused.value.response.status_code == 404
    async with websockets.connect(f"{brief.ws_base}/realtime?model=m", additional_headers={"authorization": "Bearer real-secret"}) as ws:
        answer = ws.response.headers
        r = await offer(brief, {"x-session-id": answer["x-session-id"], "x-resume-token": answer["x-resume-token"]}, "real-secret")
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found", r.text
        assert json.loads(await ws.recv())["type"] == "session.created"  # and the WebSocket session goes on
    # the call went on as it was: the same peer connection, its events, one session
    call = brief.server.calls[first.call_id]
    assert call.parked_at is None and call.pc.connectionState == "connected"
    assert await wait_until(lambda: len(brief.server.sessions) == 1)  # (the WebSocket's closed)
    first.send({"type": "response.create", "response": {"instructions": "Say hi."}})
    await first.next("response.created")
    await first.close()  # the peer closes: the call ends at once, no resume
    assert await wait_until(lambda: not brief.server.calls and not brief.server.sessions)
    r = await offer(brief, {"x-session-id": session_id, "x-resume-token": token}, "real-secret")
    assert r.status_code == 410 and r.json()["error"]["code"] == "session_ended", r.text
    assert "closed its peer connection" in r.json()["error"]["message"]


async def test_a_call_nobody_resumes_ends_after_the_grace(brief):
    first = RtcClient(brief.http_url, api_key="real-secret")
    await first.connect()
    head = first.answer_headers
    await first.next("session.created")
    await ask(first)
    await first.next("response.output_audio_transcript.delta")
    assert brief.server.pipeline.active_responses == 1
    first.cut_network()
    assert await wait_until(lambda: not brief.server.calls and not brief.server.sessions)  # media timeout, then the grace
    assert brief.server.pipeline.active_responses == 0
    r = await offer(brief, {"x-session-id": head["x-session-id"], "x-resume-token": head["x-resume-token"]}, "real-secret")
    assert r.status_code == 410 and "nobody resumed it within 1 s" in r.json()["error"]["message"], r.text
    await first.close()
