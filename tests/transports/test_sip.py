"""The SIP/RTP bridge with real SIP clients: sipp places calls (audio played from a pcap written
here, DTMF from sipp's own RFC 2833 pcaps), the test captures the server's RTP on the port its
SDP names and has Whisper listen to it; pyVoIP is a second, independent client."""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from pipelines import models
from dsp.resample import resample
from tests.conftest import synthetic_config
from tests.support.audio import rms, utterance
from tests.support.server import ServerThread
from tests.support.sip import (
    REFERRED,
    SIPP,
    RtpCapture,
    WebhookReceiver,
    cancel_scenario,
    free_udp_port,
    invite_scenario,
    play_pcap,
    sipp,
    wait_until,
    write_g711_pcap,
)
from tests.support.validation import validate

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]

DTMF_PCAPS = Path("/usr/share/sip-tester")  # Debian's sip-tester ships RFC 2833 and A-law pcaps


@pytest.fixture(scope="module", autouse=True)
def _need_sipp() -> None:
    if SIPP is None:
        pytest.fail("sipp is required (apt-get install sip-tester)")


@functools.lru_cache(maxsize=1)
def whisper():  # type: ignore[no-untyped-def]
    from faster_whisper import WhisperModel

    return WhisperModel(str(models.path("whisper-tiny.en")), device="cpu", compute_type="int8", cpu_threads=1)


def transcribe(pcm_8k: np.ndarray) -> str:
    audio = resample(pcm_8k, 8000, 16000).astype(np.float32) / 32768.0
    segments, _ = whisper().transcribe(audio, language="en", beam_size=1, condition_on_previous_text=False)
    return " ".join(s.text.strip() for s in segments).strip()


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


def sip_server(**options: Any) -> ServerThread:
    sip = {"port": 0, "rtp_timeout_s": options.pop("rtp_timeout_s", 10.0), **options.pop("sip", {})}
    limits = options.pop("limits", {})
    config = synthetic_config(limits=limits, **options)
    config["sip"] = sip
    return ServerThread(config).start()


def sip_target(server: ServerThread) -> str:
    host, port = server.app.state.sip.address
    return f"{host}:{port}"


@pytest.fixture(scope="module")
def echo_server() -> Any:
    """The synthetic pipeline answering with the caller's own last turn (audio: echo): an answer
    that is real speech, so Whisper can check what comes back over RTP."""
    server = sip_server(audio="echo", chunk_interval_ms=40)
    yield server
    server.stop()


def no_calls_left(server: ServerThread) -> bool:
    return server.call(lambda: not server.server.calls and not server.app.state.sip.calls and not server.server.sessions)


def spoken_pcap(tmp_path: Path, text: str, payload_type: int = 0) -> Path:
    """``text`` spoken by espeak-ng, as the RTP packets of a call (0: PCMU, 8: PCMA)."""
    pcm = resample(utterance(text, lead_ms=500, tail_ms=1500), 24000, 8000)
    path = tmp_path / f"spoken-{payload_type}.pcap"
    write_g711_pcap(path, pcm, payload_type=payload_type)
    return path


def check_stream(capture: RtpCapture, payload_type: int) -> None:
    """Our RTP is one well-formed stream: one SSRC, consecutive sequence numbers, timestamps
    160 apart, the marker bit on the first packet of each talkspurt only."""
    headers = capture.headers()
    assert len(headers) > 50
    assert {h[0] for h in headers} == {payload_type}
    assert len({h[3] for h in headers}) == 1
    seqs = [h[1] for h in headers]
    assert all((b - a) % 65536 == 1 for a, b in itertools.pairwise(seqs)), "sequence numbers not consecutive"
    stamps = [h[2] for h in headers]
    assert all((b - a) % 2**32 == 160 for a, b in itertools.pairwise(stamps))
    markers = [i for i, h in enumerate(headers) if h[4]]
    assert markers, "no talkspurt was marked"
    frames = capture.audio().reshape(-1, 160)
    loud = [i for i, f in enumerate(frames) if rms(f) > 50]  # A-law has no exact zero
    assert loud and markers[0] <= loud[0], "the answer's first packet was not marked"
    assert len(markers) <= 3  # one per answer, not per packet


def test_pcmu_call_gets_a_spoken_answer(echo_server: ServerThread, tmp_path: Path) -> None:
    capture = RtpCapture()
    try:
        pcap = spoken_pcap(tmp_path, "What is the weather like today?")
        scenario = invite_scenario(capture.port, after_ack=play_pcap(pcap, 8000))
        result = sipp(scenario, sip_target(echo_server), tmp_path)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    finally:
        capture.close()
    check_stream(capture, 0)
    audio = capture.audio()
    assert rms(audio) > 100, "the answer is silent"
    heard = transcribe(audio)
    assert {"weather", "today"} <= words(heard), heard
    assert asyncio.run(wait_until(lambda: no_calls_left(echo_server)))


def test_pcma_call_is_answered_in_pcma(echo_server: ServerThread, tmp_path: Path) -> None:
    capture = RtpCapture()
    try:
        scenario = invite_scenario(capture.port, codecs="8 0", rtpmap="a=rtpmap:8 PCMA/8000\na=rtpmap:0 PCMU/8000",
                                   after_ack=play_pcap(spoken_pcap(tmp_path, "Please call me back tomorrow.", 8), 7000))
        result = sipp(scenario, sip_target(echo_server), tmp_path, extra=["-trace_msg", "-message_file", str(tmp_path / "msg.log")])
        assert result.returncode == 0, result.stdout[-2000:]
    finally:
        capture.close()
    answer = (tmp_path / "msg.log").read_text()
    assert re.search(r"m=audio \d+ RTP/AVP 8\r?\n", answer), "the answer did not choose PCMA alone"
    check_stream(capture, 8)
    heard = transcribe(capture.audio())  # the caller's words, echoed back in A-law
    assert {"call", "back", "tomorrow"} & words(heard), heard


# ------------------------------------------------------------------------------ call control


@pytest.fixture(scope="module")
def hooked(webhook: WebhookReceiver) -> Any:
    """Calls announced to a webhook and left ringing until the test accepts or rejects them."""
    server = sip_server(audio="echo", chunk_interval_ms=40, sip={"webhook_url": webhook.url}, server={"api_key": "test-key"})
    yield server
    server.stop()


def run_sipp(scenario: str, server: ServerThread, tmp: Path, **kw: Any) -> asyncio.Task[Any]:
    return asyncio.ensure_future(asyncio.to_thread(sipp, scenario, sip_target(server), tmp, **kw))


async def control(server: ServerThread, call_id: str, action: str, body: dict[str, Any] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.http_url, headers={"Authorization": "Bearer test-key"}) as http:
        return await http.post(f"/v1/realtime/calls/{call_id}/{action}", json=body or {})


async def test_webhook_accept_dtmf_on_the_sideband_and_hangup_from_the_server(hooked: ServerThread, webhook: WebhookReceiver, tmp_path: Path) -> None:
    capture = RtpCapture()
    dtmf = '\n  <pause milliseconds="2000"/>' + play_pcap(DTMF_PCAPS / "dtmf_2833_1.pcap", 0)  # once the sideband is on
    caller = run_sipp(invite_scenario(capture.port, after_ack=dtmf, hangup="server"), hooked, tmp_path)
    try:
        event = await webhook.next()
        assert event["type"] == "realtime.call.incoming" and event["object"] == "event"
        call_id = event["data"]["call_id"]
        headers = {h["name"]: h["value"] for h in event["data"]["sip_headers"]}
        assert headers["X-Test"] == "sipp" and "caller@" in headers["From"]
        assert call_id in hooked.server.calls  # ringing, findable before it is answered
        r = await control(hooked, call_id, "accept", {"type": "realtime", "instructions": "Be brief."})
        assert r.status_code == 200, r.text
        sdk = AsyncOpenAI(api_key="test-key", base_url=f"{hooked.http_url}/v1")
        digits = []
        async with sdk.realtime.connect(call_id=call_id) as sideband:
            async with asyncio.timeout(15):
                async for ev in sideband:
                    data = ev.to_dict()
                    validate(data)
                    if data["type"] == "input_audio_buffer.dtmf_event_received":
                        assert abs(data["received_at"] - time.time()) < 30
                        digits.append(data["event"])
                        break
        assert digits == ["1"]
        assert hooked.server.calls[call_id].session.config.wire.instructions == "Be brief."
        r = await control(hooked, call_id, "hangup")
        assert r.status_code == 200
        result = await caller
        assert result.returncode == 0, result.stdout[-2000:]
    finally:
        capture.close()
        caller.cancel()
    assert await wait_until(lambda: no_calls_left(hooked))


async def test_reject_answers_603_by_default_and_the_status_given(hooked: ServerThread, webhook: WebhookReceiver, tmp_path: Path) -> None:
    for status, body in ((603, {}), (486, {"status_code": 486})):
        caller = run_sipp(invite_scenario(free_udp_port(), expect=str(status)), hooked, tmp_path)
        call_id = (await webhook.next())["data"]["call_id"]
        r = await control(hooked, call_id, "reject", body)
        assert r.status_code == 200, r.text
        result = await caller
        assert result.returncode == 0, result.stdout[-2000:]
        r = await control(hooked, call_id, "accept")  # it is gone
        assert r.status_code == 404
    assert await wait_until(lambda: no_calls_left(hooked))


async def test_refer_transfers_the_call_and_ends_it(hooked: ServerThread, webhook: WebhookReceiver, tmp_path: Path) -> None:
    log = tmp_path / "refer-msg.log"
    caller = run_sipp(invite_scenario(free_udp_port(), after_ack=REFERRED, hangup="server"), hooked, tmp_path, extra=["-trace_msg", "-message_file", str(log)])
    call_id = (await webhook.next())["data"]["call_id"]
    assert (await control(hooked, call_id, "refer", {"target_uri": "sip:human@example.com"})).status_code == 409  # not answered yet
    assert (await control(hooked, call_id, "accept")).status_code == 200
    assert await wait_until(lambda: hooked.call(lambda: hooked.server.calls[call_id].dialog.confirmed))  # the ACK came
    r = await control(hooked, call_id, "refer", {"target_uri": "sip:human@example.com"})
    assert r.status_code == 200, r.text  # the caller's side took it (202)
    result = await caller  # NOTIFY "200 OK" -> we hang up with a BYE
    assert result.returncode == 0, result.stdout[-2000:]
    assert "Refer-To: <sip:human@example.com>" in log.read_text()
    assert await wait_until(lambda: no_calls_left(hooked))


async def test_cancel_before_answer(hooked: ServerThread, webhook: WebhookReceiver, tmp_path: Path) -> None:
    result = await asyncio.to_thread(sipp, cancel_scenario(free_udp_port()), sip_target(hooked), tmp_path)
    assert result.returncode == 0, result.stdout[-2000:]
    call_id = (await webhook.next())["data"]["call_id"]
    assert await wait_until(lambda: no_calls_left(hooked))
    assert (await control(hooked, call_id, "accept")).status_code == 404


# ------------------------------------------------------------------------------ pyVoIP


def test_pyvoip_registers_calls_and_hangs_up(echo_server: ServerThread) -> None:
    """pyVoIP, a second SIP stack written independently of sipp: REGISTER, INVITE, audio both
    ways, BYE."""
    from pyVoIP.VoIP import CallState, VoIPPhone

    host, port = echo_server.app.state.sip.address
    rtp_low = free_udp_port()
    phone = VoIPPhone(host, port, "caller", "secret", myIP="127.0.0.1", sipPort=free_udp_port(), rtpPortLow=rtp_low, rtpPortHigh=rtp_low + 20)
    phone.start()
    try:
        call = phone.call("agent")
        deadline = time.monotonic() + 10
        while call.state != CallState.ANSWERED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert call.state == CallState.ANSWERED
        assert len(echo_server.server.calls) == 1
        speech = resample(utterance("Good morning, I would like to book a table.", lead_ms=300, tail_ms=1500), 24000, 8000)
        unsigned = ((speech.astype(np.int32) >> 8) + 128).astype(np.uint8).tobytes()  # pyVoIP's 8-bit linear audio
        for i in range(0, len(unsigned), 160):  # in real time, as a phone would
            call.write_audio(unsigned[i : i + 160])
            time.sleep(0.02)  # the test's input: audio paced in real time
        heard = []
        end = time.monotonic() + 6
        while time.monotonic() < end:
            heard.append(call.read_audio(160, blocking=False))
            time.sleep(0.02)  # read as the phone plays it, 20 ms at a time, for the answer's length
        audio = (np.frombuffer(b"".join(heard), np.uint8).astype(np.int16) - 128) << 8
        assert rms(audio) > 300, "no answer came back"
        assert {"morning", "table"} & words(transcribe(audio)), "the echoed answer is not the caller's words"
        call.hangup()
        assert asyncio.run(wait_until(lambda: no_calls_left(echo_server)))
    finally:
        phone.stop()


# ------------------------------------------------------------------------------ CPU pipeline


@pytest.mark.timeout(600)
def test_pcmu_call_to_the_cpu_pipeline_gets_a_spoken_answer(cpu_server: Any, tmp_path: Path) -> None:
    """A phone call to the real cascade (Whisper -> vLLM-CPU -> Piper): the answer that comes back
    over RTP is speech Whisper can transcribe."""
    capture = RtpCapture()
    try:
        pcap = spoken_pcap(tmp_path, "What is the weather like today?")
        result = sipp(invite_scenario(capture.port, after_ack=play_pcap(pcap, 20000)), f"127.0.0.1:{cpu_server.sip_port}", tmp_path, timeout_s=90)
        assert result.returncode == 0, result.stdout[-2000:]
    finally:
        capture.close()
    check_stream(capture, 0)
    heard = transcribe(capture.audio())
    assert len(words(heard)) >= 3, f"Whisper heard {heard!r} in the answer"
