"""semantic_vad over a real socket with the official SDK (GA and beta), every event strictly validated
against the SDK's models; the server loads its end-of-turn model from its config like any deployment."""

from __future__ import annotations

import numpy as np
import pytest

from dsp.resample import resample
from tests.support.audio import silence, speak
from tests.support.client import audio_of, connect

RATE = 24000
LEAD_MS = 800


def turn(td: dict) -> dict:
    return {"type": "realtime", "audio": {"input": {"turn_detection": td}}}


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return resample(speak("How far away is the moon?", "espeak-en-gb-170"), 16000, RATE)


@pytest.fixture(scope="module")
def semantic_server(server):
    assert server.server.turn_end.model is not None, "the end-of-turn model is not installed (./scripts/install)"
    return server


def said(pcm: np.ndarray, tail_ms: int) -> np.ndarray:
    return np.concatenate([silence(LEAD_MS, RATE), pcm, silence(tail_ms, RATE)])


async def test_semantic_vad_turns_and_a_switch_back_to_server_vad(semantic_server, question):
    spoken_ms = len(question) * 1000 // RATE
    async with connect(semantic_server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": turn({"type": "semantic_vad", "eagerness": "auto"})})
        td = (await c.expect("session.updated")).session.audio.input.turn_detection
        assert (td.type, td.eagerness, td.create_response, td.interrupt_response) == ("semantic_vad", "auto", True, True)
        ends = []
        for mode in ("semantic_vad", "server_vad"):
            if mode == "server_vad":
                await c.send({"type": "session.update", "session": turn({"type": "server_vad"})})
                assert (await c.expect("session.updated")).session.audio.input.turn_detection.type == "server_vad"
            await c.append(said(question, 1500))
            started = await c.expect("input_audio_buffer.speech_started")
            stopped = await c.expect("input_audio_buffer.speech_stopped")
            committed = await c.expect("input_audio_buffer.committed")
            assert started.item_id == stopped.item_id == committed.item_id
            response = await c.until("response.done")
            assert response[-1].response.status == "completed" and audio_of(response)
            ends.append(stopped.audio_end_ms - started.audio_start_ms - 300 - spoken_ms)  # less the prefix padding
    # audio_end_ms: 200 ms after the speech with semantic_vad (where the model judged it over), 500 with server_vad
    assert abs(ends[0] - 200) <= 80 and abs(ends[1] - 500) <= 80, ends


async def test_a_beta_client_sets_semantic_vad_flat(semantic_server, question):
    async with connect(semantic_server.ws_base, beta=True) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}})
        td = (await c.expect("session.updated")).session.turn_detection
        assert (td.type, td.eagerness) == ("semantic_vad", "high")
        await c.append(said(question, 1000))
        stopped = await c.expect("input_audio_buffer.speech_stopped")
        await c.expect("input_audio_buffer.committed")
        assert stopped.audio_end_ms > 0
        await c.until("response.done")
