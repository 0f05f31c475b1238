"""The interruption guard on a phone call: while the agent speaks, a short sound from the caller
(the agent's own echo, a cough, "no") does not interrupt it; speech that lasts does. Without the
guard the same short sound cuts the answer."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from openai import AsyncOpenAI

from dsp.resample import resample
from tests.conftest import synthetic_config
from tests.support.audio import spoken
from tests.support.server import ServerThread
from tests.support.sip import RawUac, RtpMic, sdp_offer

pytestmark = [pytest.mark.timeout(90)]


def server(min_speech_ms: int) -> ServerThread:
    # a long answer (40 words, 9.6 s) paced in real time: the agent is speaking when the caller talks
    config = synthetic_config(chunk_interval_ms=20, chunk_ms=20, reply=" ".join(["word"] * 40), server={"api_key": "test-key"})
    config["sip"] = {"port": 0, "interruption_guard": {"min_speech_ms": min_speech_ms}}
    return ServerThread(config).start()


def speech_8k(text: str) -> Any:
    return resample(spoken(text, 24000), 24000, 8000)


async def short_sound_interrupts(min_speech_ms: int) -> tuple[bool, list[str]]:
    """Call, ask, and while the answer plays say "no" (about 0.3 s); then, if that did not cut
    the answer, a long sentence. Returns whether "no" cut it, and the sideband's event types."""
    srv = server(min_speech_ms)
    uac = RawUac(tuple(srv.app.state.sip.address))
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    mic = None
    try:
        uac.send(uac.request("INVITE", "guard", body=sdp_offer(media.getsockname()[1])))
        ok = uac.final("guard")
        assert ok is not None and ok.status == 200
        from transports.sip.message import param

        uac.send(uac.request("ACK", "guard", to_tag=param(ok.get("To"), "tag")))
        mic = RtpMic(media, ("127.0.0.1", int(ok.body.decode().split("m=audio ")[1].split()[0])))
        call_id = next(iter(srv.server.calls))
        seen: list[str] = []
        sdk = AsyncOpenAI(api_key="test-key", base_url=f"{srv.http_url}/v1")
        async with sdk.realtime.connect(call_id=call_id) as sideband:

            async def until(kind: str, timeout: float) -> bool:
                try:
                    async with asyncio.timeout(timeout):
                        async for event in sideband:
                            seen.append(event.type)
                            if event.type == kind:
                                return True
                except TimeoutError:
                    return False
                return False

            mic.say(speech_8k("What is the weather like today?"))
            assert await until("output_audio_buffer.started", 10)
            await asyncio.sleep(1.0)  # the test's input: "no" comes a second into the answer
            mic.say(speech_8k("No."))
            cut_by_short = await until("output_audio_buffer.cleared", 2.5)
            if not cut_by_short:
                assert "input_audio_buffer.speech_started" not in seen[seen.index("output_audio_buffer.started") :]
                mic.say(speech_8k("Wait, stop, I have another question for you please."))
                assert await until("output_audio_buffer.cleared", 5), seen  # real speech does interrupt
        return cut_by_short, seen
    finally:
        if mic is not None:
            mic.close()
        media.close()
        uac.close()
        srv.stop()


@pytest.mark.slow
async def test_a_short_sound_does_not_interrupt_the_agent_but_speech_does() -> None:
    cut, seen = await short_sound_interrupts(min_speech_ms=400)
    assert not cut
    started = seen.index("input_audio_buffer.speech_started", seen.index("output_audio_buffer.started"))
    assert seen.index("output_audio_buffer.cleared") > started  # the barge-in is a turn like any other


async def test_without_the_guard_a_short_sound_interrupts() -> None:
    cut, _ = await short_sound_interrupts(min_speech_ms=0)
    assert cut
