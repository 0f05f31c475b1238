"""WebRTC calls with a real aiortc peer and the official SDK's ``client.realtime.calls.create``,
against a real server on 127.0.0.1 (ICE host candidates pinned to loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc.mediastreams import VideoStreamTrack
from openai import AsyncOpenAI

from tests.conftest import synthetic_config
from tests.support.audio import rms, spoken
from tests.support.peers import RtcClient as _RtcClient
from tests.support.server import ServerThread
from tests.support.sip import wait_until
from tests.support.validation import validate, validated_until

pytestmark = pytest.mark.timeout(90)



def RtcClient(http_url: str, api_key: str = "test-key") -> _RtcClient:  # noqa: N802
    """The client, with every data-channel event validated strictly against the SDK's models."""
    return _RtcClient(http_url, api_key, validate=validate)


LOOPBACK = {"webrtc": {"host_addresses": ["127.0.0.1"]}}
QUESTION = "Hello there, how are you today?"


@pytest.fixture(scope="module")
def echo(make_server):
    """Answers with the user's own audio (real speech back), as fast as the playout takes it."""
    return make_server(audio="echo", server=LOOPBACK)


@pytest.fixture(scope="module")
def slow(make_server):
    """A 9.6 s answer produced in real time: still playing when the test interrupts it."""
    return make_server(chunk_interval_ms=40, reply=" ".join(["word"] * 40), server=LOOPBACK)


def loud_frames(client: RtcClient, t0: float, t1: float = float("inf")) -> int:
    return sum(1 for t, pcm in client.received if t0 <= t < t1 and rms(pcm) > 300)


def frames_since(client: RtcClient, t0: float) -> int:
    """Frames the track delivered after ``t0``, loud or silent (it sends silence between answers)."""
    return sum(1 for t, _ in client.received if t >= t0)


async def silent_after(client: RtcClient, t0: float, seconds: float = 1.0) -> bool:
    """Whether the track, once it has delivered ``seconds`` of frames after ``t0``, kept them all
    silent: proof the track went on, not merely that nothing came."""
    assert await wait_until(lambda: frames_since(client, t0) >= 50 * seconds), "the track stopped"
    return loud_frames(client, t0) == 0


@contextlib.asynccontextmanager
async def call(srv, api_key: str = "test-key", **connect: Any) -> AsyncIterator[_RtcClient]:
    """A connected call; on the way out it is closed and the server must hold nothing of it."""
    client = RtcClient(srv.http_url, api_key)
    await client.connect(**connect)
    try:
        yield client
    finally:
        await client.close()
    await settle(srv)


async def settle(srv, timeout: float = 10.0) -> None:
    """Wait until the server holds no call and no session any more."""
    deadline = time.monotonic() + timeout
    while (srv.server.calls or srv.server.sessions) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not srv.server.calls and not srv.server.sessions, (srv.server.calls, srv.server.sessions)


@pytest.mark.slow
@pytest.mark.parametrize("strip_candidates", [False, True], ids=["with-candidates", "offer-without-candidates"])
async def test_a_spoken_turn_round_trips_over_webrtc(echo, strip_candidates):
    async with call(echo, strip_candidates=strip_candidates, session={"type": "realtime", "instructions": "Be brief."}) as client:
        created = await client.next("session.created")
        assert created["session"]["instructions"] == "Be brief."  # the multipart session part applied
        speech = spoken(QUESTION, 24000)
        client.mic.say(speech, 24000)
        started_speech = await client.next("input_audio_buffer.speech_started")
        stopped = await client.next("input_audio_buffer.speech_stopped")
        t_stop = time.monotonic()
        spoken_ms = len(speech) * 1000 // 24000
        assert stopped["item_id"] == started_speech["item_id"]
        transcript = await client.next("conversation.item.input_audio_transcription.completed")
        # the synthetic transcript is the committed turn's duration: the whole utterance, plus 300 ms
        # of prefix padding and the 500 ms of silence that ended it
        heard = float(transcript["transcript"].split()[0])
        assert abs(heard * 1000 - (spoken_ms + 800)) < 300, (heard, spoken_ms)
        started = await client.next("output_audio_buffer.started")
        done = await client.next("response.done")
        assert done["response"]["status"] == "completed"
        assert started["response_id"] == done["response"]["id"]
        stop = await client.next("output_audio_buffer.stopped")
        assert stop["response_id"] == done["response"]["id"]
        # the echo is the user's speech: at least as long as it was (its last frames may still be in
        # flight), and as loud as espeak
        assert await wait_until(lambda: loud_frames(client, t_stop) * 20 >= spoken_ms * 0.6)
        answer = client.audio_since(t_stop)
        assert rms(answer) > 500
        # audio travels on the track only: no audio deltas on the data channel
        types = [e["type"] for _, e in client.log]
        assert "response.output_audio.delta" not in types
        assert types.index("output_audio_buffer.started") < types.index("output_audio_buffer.stopped")
        assert types.index("response.done") < types.index("output_audio_buffer.stopped")


@pytest.mark.slow
async def test_sideband_watches_and_steers_a_call(echo):
    async with call(echo) as client:
        await client.next("session.created")
        client.mic.say(spoken(QUESTION, 24000), 24000)
        await client.next("output_audio_buffer.stopped")  # the first answer has played
        sdk = AsyncOpenAI(api_key="test-key", base_url=f"{echo.http_url}/v1")
        async with sdk.realtime.connect(call_id=client.call_id) as sideband:
            await sideband.send({"type": "response.create", "response": {"instructions": "Say hi."}})  # type: ignore[arg-type]
            seen = [e["type"] for e in await validated_until(sideband, "response.done")]
            assert "response.created" in seen and "output_audio_buffer.started" in seen
            # the same events reached the call's own data channel
            done = await client.next("response.done")
            assert done["response"]["status"] == "completed"
        assert client.call_id in echo.server.calls  # closing the sideband leaves the call up


@pytest.mark.slow
async def test_barge_in_silences_the_track_and_keeps_what_was_heard(slow):
    async with call(slow) as client:
        await client.next("session.created")
        client.mic.say(spoken("Tell me a long story please.", 24000), 24000)
        await client.next("output_audio_buffer.started")
        await asyncio.sleep(1.5)  # the test's input: the user barges in 1.5 s into the answer
        client.mic.say(spoken("Stop, stop, wait a moment.", 24000), 24000)
        await client.next("input_audio_buffer.speech_started")
        cleared = await client.next("output_audio_buffer.cleared")
        t_cleared = time.monotonic()
        done = await client.next("response.done")
        assert done["response"]["status"] == "cancelled"
        assert cleared["response_id"] == done["response"]["id"]
        heard = done["response"]["output"][0]["content"][0]["transcript"]
        assert 0 < len(heard.split()) < 40  # truncated to the words played
        # after the cut only the jitter buffer's last frames may still arrive
        assert await silent_after(client, t_cleared + 0.3)


async def test_output_audio_buffer_clear_cuts_the_track(slow):
    async with call(slow) as client:
        await client.next("session.created")
        client.mic.say(spoken("Tell me a long story please.", 24000), 24000)
        started = await client.next("output_audio_buffer.started")
        await asyncio.sleep(1.0)  # the test's input: it plays for a second, then the client clears it
        client.send({"type": "output_audio_buffer.clear", "event_id": "ev_clear"})
        cleared = await client.next("output_audio_buffer.cleared")
        t_cleared = time.monotonic()
        done = await client.next("response.done")
        assert cleared["response_id"] == started["response_id"] == done["response"]["id"]
        assert done["response"]["status"] == "cancelled"
        assert loud_frames(client, t_cleared - 1.0, t_cleared) > 10  # it was playing
        assert await silent_after(client, t_cleared + 0.3)  # and then it was not


async def test_peer_vanishing_mid_answer_ends_the_call(slow):
    client = RtcClient(slow.http_url)
    await client.connect()
    await client.next("session.created")
    client.mic.say(spoken("Tell me a long story please.", 24000), 24000)
    await client.next("output_audio_buffer.started")
    assert slow.server.pipeline.active_responses == 1
    await client.pc.close()  # gone, mid-answer, without a word on the data channel
    await settle(slow)
    assert slow.server.pipeline.active_responses == 0


async def test_silent_peer_is_dropped_after_the_media_timeout(make_server):
    srv = make_server(server={"webrtc": {"host_addresses": ["127.0.0.1"], "media_timeout_s": 1.0}})
    client = RtcClient(srv.http_url)
    await client.connect()
    await client.next("session.created")
    call = srv.server.calls[client.call_id]
    while not call.media.frames:  # media flows first (a call that never gets any hits connect_timeout_s)
        await asyncio.sleep(0.05)
    client.mic.stop()  # the peer connection stays up; no more RTP arrives
    await settle(srv, timeout=10)
    assert call.ended.is_set() and call.end_reason == "media_timeout"
    await client.close()


async def test_shutdown_tells_the_call_and_hangs_up():
    srv = ServerThread(synthetic_config(server=LOOPBACK)).start()
    client = RtcClient(srv.http_url)
    try:
        await client.connect()
        await client.next("session.created")
        await asyncio.to_thread(srv.stop)
        error = await client.next("error")
        assert error["error"]["code"] == "server_shutting_down"
        async with asyncio.timeout(10):
            while client.pc.connectionState != "closed" and client.channel.readyState != "closed":
                await asyncio.sleep(0.05)
        assert not srv.server.calls and not srv.server.sessions
    finally:
        await client.close()


async def test_hangup_and_unknown_calls(echo):
    client = RtcClient(echo.http_url)
    await client.connect()
    await client.next("session.created")
    async with httpx.AsyncClient(base_url=echo.http_url) as http:
        r = await http.delete(f"/v1/realtime/calls/{client.call_id}")
        assert r.status_code == 200
        await settle(echo)
        for method, path in (("DELETE", f"/v1/realtime/calls/{client.call_id}"), ("POST", "/v1/realtime/calls/rtc_nope/hangup")):
            r = await http.request(method, path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"
        r = await http.post(f"/v1/realtime/calls/{client.call_id}/accept", json={})
        assert r.status_code == 404
    await client.close()
    sdk = AsyncOpenAI(api_key="test-key", base_url=f"{echo.http_url}/v1")
    with pytest.raises(Exception) as info:
        async with sdk.realtime.connect(call_id="rtc_unknown") as conn:
            await conn.recv()
    assert "404" in str(info.value) or "call_not_found" in str(info.value)


async def test_accept_is_for_sip_calls_only(echo):
    async with call(echo) as client:
        async with httpx.AsyncClient(base_url=echo.http_url) as http:
            r = await http.post(f"/v1/realtime/calls/{client.call_id}/accept", json={"type": "realtime"})
            assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_call_action"


@pytest.mark.parametrize(
    "body,content_type,code",
    [
        (b"this is not sdp", "application/sdp", "invalid_offer"),
        (b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n", "application/sdp", "invalid_offer"),
        (b"v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n", "application/sdp", "invalid_offer"),
        (b"", "application/sdp", "missing_required_parameter"),
        (b"--x\r\nContent-Disposition: form-data; name=\"session\"\r\n\r\n{}\r\n--x--\r\n", "multipart/form-data; boundary=x", "missing_required_parameter"),
    ],
    ids=["garbage", "no-audio", "no-ice-or-dtls", "empty", "multipart-without-sdp"],
)
async def test_bad_offers_get_clean_errors(echo, body, content_type, code):
    async with httpx.AsyncClient(base_url=echo.http_url) as http:
        r = await http.post("/v1/realtime/calls", content=body, headers={"content-type": content_type})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["message"]
    await settle(echo)


async def test_invalid_session_in_the_offer_is_refused(echo):
    client = RtcClient(echo.http_url)
    with pytest.raises(Exception) as info:
        await client.connect(session={"type": "realtime", "audio": {"output": {"speed": 9}}})
    assert "400" in str(info.value)
    await client.close()
    await settle(echo)


async def test_video_track_without_image_input_is_reported(echo):
    async with call(echo, video=VideoStreamTrack()) as client:
        error = await client.next("error")
        assert error["error"]["code"] == "unsupported_video" and "image" in error["error"]["message"]


async def test_video_frames_reach_a_pipeline_that_takes_images(make_server):
    srv = make_server(images=True, reply="I saw {images} image.", server={"webrtc": {"host_addresses": ["127.0.0.1"], "video_fps": 2}})
    async with call(srv, video=VideoStreamTrack()) as client:
        await client.next("session.created")
        assert await wait_until(lambda: srv.server.calls[client.call_id].video_frames >= 1)  # a frame is sampled
        client.mic.say(spoken(QUESTION, 24000), 24000)
        done = await client.next("response.done")
        assert done["response"]["output"][0]["content"][0]["transcript"] == "I saw 1 image."
        assert srv.server.calls[client.call_id].video_frames >= 1


# ------------------------------------------------------------------------------ ephemeral keys


@pytest.fixture(scope="module")
def keyed(make_server):
    return make_server(audio="echo", server={**LOOPBACK, "api_key": "real-secret"})


async def mint(srv, key="real-secret", **body):
    async with httpx.AsyncClient(base_url=srv.http_url) as http:
        return await http.post("/v1/realtime/client_secrets", json=body, headers={"authorization": f"Bearer {key}"})


async def test_ephemeral_key_opens_one_call_with_its_session(keyed):
    r = await mint(keyed, expires_after={"anchor": "created_at", "seconds": 60}, session={"type": "realtime", "instructions": "From the key."})
    assert r.status_code == 200, r.text
    secret = r.json()
    from openai.types.realtime import ClientSecretCreateResponse

    ClientSecretCreateResponse.model_validate(secret)
    assert secret["value"].startswith("ek_") and secret["expires_at"] > time.time() + 50
    assert secret["session"]["instructions"] == "From the key."

    async with call(keyed, api_key=secret["value"]) as client:  # the page never sees "real-secret"
        created = await client.next("session.created")
        assert created["session"]["instructions"] == "From the key."
        reuse = RtcClient(keyed.http_url, api_key=secret["value"])
        with pytest.raises(Exception) as info:
            await reuse.connect()
        assert "401" in str(info.value)
        await reuse.close()


async def test_ephemeral_key_rules(keyed):
    assert (await mint(keyed, key="wrong")).status_code == 401
    for seconds in (5, 7201, "60"):
        r = await mint(keyed, expires_after={"anchor": "created_at", "seconds": seconds})
        assert r.status_code == 400 and r.json()["error"]["param"] == "expires_after.seconds"
    r = await mint(keyed, session={"type": "realtime", "audio": {"output": {"speed": 9}}})
    assert r.status_code == 400
    key = (await mint(keyed)).json()["value"]
    assert (await mint(keyed, key=key)).status_code == 401  # an ephemeral key cannot mint keys
    # a WebSocket session accepts it once, too
    sdk = AsyncOpenAI(api_key=key, base_url=f"{keyed.http_url}/v1")
    async with sdk.realtime.connect(model="m") as conn:
        assert (await conn.recv()).type == "session.created"
    with pytest.raises(Exception):
        async with sdk.realtime.connect(model="m") as conn:
            await conn.recv()


@pytest.mark.slow
async def test_expired_keys_are_refused(keyed):
    """A key minted with the shortest lifetime (10 s) and used after it: refused, on the real clock."""
    secret = (await mint(keyed, expires_after={"anchor": "created_at", "seconds": 10})).json()
    await asyncio.sleep(max(0.0, secret["expires_at"] - time.time()) + 0.5)  # the test's input: the key's lifetime passes
    client = RtcClient(keyed.http_url, api_key=secret["value"])
    with pytest.raises(Exception) as info:
        await client.connect()
    assert "401" in str(info.value)
    await client.close()
    await settle(keyed)


async def test_calls_beyond_max_sessions_get_429(make_server):
    srv = make_server(audio="echo", limits={"max_sessions": 1}, server=LOOPBACK)
    first = RtcClient(srv.http_url)
    await first.connect()
    try:
        second = RtcClient(srv.http_url)
        with pytest.raises(Exception) as info:
            await second.connect()
        assert "429" in str(info.value)
        await second.close()
    finally:
        await first.close()
    await settle(srv)


def test_beta_sdp_endpoint_answers_with_beta_names(echo):
    async def run() -> None:
        client = RtcClient(echo.http_url)
        client.pc.addTrack(client.mic)
        await client.pc.setLocalDescription(await client.pc.createOffer())
        async with httpx.AsyncClient(base_url=echo.http_url) as http:
            r = await http.post("/v1/realtime?model=m", content=client.pc.localDescription.sdp, headers={"content-type": "application/sdp"})
        assert r.status_code == 201 and r.headers["location"].startswith("/v1/realtime/calls/rtc_")
        from aiortc import RTCSessionDescription

        messages: asyncio.Queue[dict] = asyncio.Queue()
        client.channel.remove_all_listeners("message")
        client.channel.on("message", lambda m: messages.put_nowait(json.loads(m)))
        await client.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        await asyncio.wait_for(client.opened.wait(), 20)
        created = await asyncio.wait_for(messages.get(), 10)
        validate(created, beta=True)
        assert created["type"] == "session.created"
        await client.close()

    asyncio.run(run())
    asyncio.run(settle(echo))


def test_mono_mixing_of_decoded_frames():
    import av

    from transports.webrtc import _mono

    stereo = np.array([[100, 300, -100, -300]], np.int16)  # packed L R L R
    frame = av.AudioFrame.from_ndarray(stereo, format="s16", layout="stereo")
    assert _mono(frame).tolist() == [200, -200]


async def test_demo_page_and_its_key_endpoint(keyed, make_server):
    async with httpx.AsyncClient(base_url=keyed.http_url) as http:
        page = await http.get("/")
        assert page.status_code == 200 and 'id="mic"' in page.text
        config = (await http.get("/demo/config")).json()
        assert config["needs_key"] and not config["can_mint"]  # the page will ask for a key
        refused = await http.post("/demo/key")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    minting = make_server(audio="echo", server={**LOOPBACK, "api_key": "real-secret", "web_demo_mints_keys": True})
    async with httpx.AsyncClient(base_url=minting.http_url) as http:
        assert (await http.get("/demo/config")).json()["can_mint"]
        key = (await http.post("/demo/key")).json()["value"]
    assert key.startswith("ek_")
    async with call(minting, api_key=key) as client:
        assert (await client.next("session.created"))["type"] == "session.created"


async def test_transcription_session_over_webrtc(echo):
    """A call whose offer asks for a transcription session: the microphone's turns come back as
    transcripts on the data channel, and nothing is ever said back."""
    async with call(echo, session={"type": "transcription"}) as client:
        created = await client.next("session.created")
        assert created["session"]["type"] == "transcription" and set(created["session"]) <= {"type", "audio", "include"}
        client.mic.say(spoken(QUESTION, 24000), 24000)
        committed = await client.next("input_audio_buffer.committed")
        completed = await client.next("conversation.item.input_audio_transcription.completed")
        assert completed["item_id"] == committed["item_id"] and completed["transcript"]
        # A response would have begun at the commit. The answer to an update sent after the
        # transcript comes after every event of before it: none of them is a response's.
        t_update = time.monotonic()
        client.send({"type": "session.update", "session": {"type": "transcription"}})
        await client.next("session.updated")
        types = [e["type"] for _, e in client.log]
        assert not [t for t in types if t.startswith(("response.", "output_audio_buffer."))]
        assert loud_frames(client, 0.0, t_update) == 0 and await silent_after(client, t_update)  # the track stayed silent


def test_incoming_audio_is_passed_on_as_it_comes_and_a_reordered_packet_dropped():
    """``webrtc.jitter_frames: 0`` (the default): no packet waits for a later one; one a little behind
    what was passed on (reordered, duplicated; sequence numbers wrap at 2^16) is dropped. Random
    sequences against a small model of that rule."""
    import random
    from types import SimpleNamespace

    from transports.webrtc import InOrder

    def packet(seq: int) -> SimpleNamespace:
        return SimpleNamespace(sequence_number=seq & 0xFFFF, timestamp=seq * 960 & 0xFFFFFFFF, _data=seq.to_bytes(4, "big"))

    for seed in range(200):
        rng = random.Random(seed)
        start = rng.choice([0, 65530, rng.randrange(65536)])
        order = list(range(start, start + rng.randrange(1, 60)))
        for _ in range(rng.randrange(4)):  # reorder, duplicate, lose
            i = rng.randrange(len(order))
            kind = rng.choice(["swap", "dup", "lose"])
            if kind == "swap" and i + 1 < len(order):
                order[i], order[i + 1] = order[i + 1], order[i]
            elif kind == "dup":
                order.insert(rng.randrange(i, len(order) + 1), order[i])
            elif kind == "lose" and len(order) > 1:
                del order[i]
        buffer, out, expected, last = InOrder(), [], [], None
        for seq in order:
            pli, frame = buffer.add(packet(seq))
            assert pli is False
            if frame is not None:
                out.append(int.from_bytes(frame.data, "big"))
            if last is None or seq > last:  # the model, on sequence numbers that do not wrap
                expected.append(seq)
                last = seq
        assert out == expected, (seed, order)
        assert buffer.dropped == len(order) - len(expected)
    # a sender that restarts its numbering far behind (more than 100 packets) is heard from then on
    buffer = InOrder()
    passed = [buffer.add(packet(seq))[1] is not None for seq in [5000, 5001, 5002, 100, 101, 99, 102]]
    assert passed == [True, True, True, True, True, False, True]
