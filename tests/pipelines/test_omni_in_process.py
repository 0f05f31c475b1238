"""The omni pipeline with its in-process engine (``engine: in_process``: vLLM-Omni's ``AsyncOmni`` in
the server's process). No GPU here, so the engine is the faithful fake ``AsyncOmni``
(bench/fake_async_omni.py: the real constructor, ``generate()``/``abort()`` signatures, output shapes
and resumable streaming input), and the chat template a ChatML one with Qwen3-Omni's placeholders
(tests/support/qwen_omni_chat_template.jinja) where the model's own would be. The stock openai SDK
talks to the server; every server event is validated strictly against its models."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.omni.engine import InProcessOptions, LocalOmni
from realtime_omni import config as config_file
from tests.support.audio import silence, spoken, utterance
from tests.support.client import audio_of, connect
from tests.support.fake_omni import ENGINE_CLASS, AsyncOmni, Timing
from tests.support.server import ServerThread

TEMPLATE = str(Path(__file__).parents[1] / "support" / "qwen_omni_chat_template.jinja")
QUESTION = utterance("What is the capital of France?", lead_ms=500, tail_ms=1200)
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}
AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>"


def local_config(*, stream_input: bool = True, model: str = "Qwen/Qwen3-Omni-30B-A3B-Instruct") -> dict[str, Any]:
    """The shipped in-process config (configs/qwen3-omni-local.yaml) with the fake engine in it."""
    config = config_file.raw("qwen3-omni-local")
    config["pipeline"]["options"]["in_process"].update(
        model=model, engine_class=ENGINE_CLASS, chat_template=TEMPLATE, stream_input=stream_input
    )
    config["session"]["instructions"] = "Be brief."
    return config


def engine_of(srv: ServerThread) -> AsyncOmni:
    engine = srv.server.pipeline.engine
    assert isinstance(engine, LocalOmni)
    return engine.engine


@pytest.fixture(scope="module")
def streamed() -> Iterator[ServerThread]:
    srv = ServerThread(local_config()).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def whole() -> Iterator[ServerThread]:
    srv = ServerThread(local_config(stream_input=False)).start()
    yield srv
    srv.stop()


def texts(engine: AsyncOmni, request_id: str) -> list[str]:
    return [p["prompt"] for rid, p in engine.inputs if rid == request_id]


@pytest.mark.slow
async def test_the_turn_streams_into_the_thinker_while_it_is_spoken(streamed):
    engine = engine_of(streamed)
    counts = streamed.server.pipeline.streamed_turns
    async with connect(streamed.ws_base) as c:
        await c.expect("session.created")
        await c.speak(QUESTION)
        first = await c.expect("response.done", timeout=15)
        await c.speak(QUESTION)
        second = await c.expect("response.done", timeout=15)
    assert counts.adopted == 2
    for done in (first, second):
        assert done.response.status == "completed"
        assert done.response.output[0].content[0].transcript.startswith("I heard")
    # one resumable request per turn: the history and the first segment, more segments, then the
    # end of the user turn and the assistant's header with the answer's own sampling params
    turns = list(dict.fromkeys(rid for rid, _ in engine.inputs))
    assert len(turns) == 2
    one, two = texts(engine, turns[0]), texts(engine, turns[1])
    assert one[0].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + AUDIO)
    assert one[-1] == "<|im_end|>\n<|im_start|>assistant\n"
    assert all(t == AUDIO for t in one[1:-1])
    # the answer was prefilled up to its last segment: only the tail was new
    usage = first.response.usage
    assert usage.input_token_details.cached_tokens >= usage.input_tokens - 32
    # the second turn re-sends the first byte for byte (the same segments), then the answer as delivered
    transcript = first.response.output[0].content[0].transcript
    assert "".join(two).startswith("".join(one) + transcript + "<|im_end|>\n<|im_start|>user\n")
    heard = [p["multi_modal_data"]["audio"] for rid, p in engine.inputs if rid == turns[0] and "multi_modal_data" in p]
    assert all(rate == 16000 for _, rate in heard)
    spoken = sum(len(w) for w, _ in heard) / 16000
    assert 1.5 < spoken < 3.5 and spoken == pytest.approx(float(transcript.split()[2]), abs=0.06)
    audio = np.frombuffer(audio_of(c.events), "<i2")
    assert len(audio) > 0


@pytest.mark.slow
async def test_a_turn_with_a_pause_in_it_streams_on_and_a_changed_history_is_answered_whole(streamed):
    engine = engine_of(streamed)
    counts = streamed.server.pipeline.streamed_turns
    adopted = counts.adopted
    # a pause long enough to be a pause (150 ms) but not the end of the turn (500 ms): one turn
    speech = np.concatenate([silence(500), spoken("What is the capital"), silence(350), spoken("of Italy?"), silence(1200)])
    async with connect(streamed.ws_base) as c:
        await c.expect("session.created")
        await c.speak(speech)
        done = await c.expect("response.done", timeout=15)
        assert counts.adopted == adopted + 1
        request = [rid for rid, _ in engine.inputs][-1]
        heard = float(done.response.output[0].content[0].transcript.split()[2])
        sent = sum(len(p["multi_modal_data"]["audio"][0]) for rid, p in engine.inputs if rid == request and "multi_modal_data" in p)
        assert heard == pytest.approx(sent / 16000, abs=0.06) and heard > 1.6  # both halves, the pause between
        # the conversation changes while the user speaks: the streamed turn is void, the answer whole
        task = asyncio.create_task(c.speak(speech))
        await asyncio.sleep(1.0)  # the test's input: the conversation changes a second into the turn
        await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
        await task
        again = await c.expect("response.done", timeout=15)
    assert again.response.status == "completed" and counts.adopted == adopted + 1
    whole = engine.inputs[-1][1]["prompt"]  # one request, all of it (the turn as the segments it was heard in)
    assert whole.startswith("<|im_start|>system\n")
    assert re.search(r"Hello there\.<\|im_end\|>\n<\|im_start\|>user\n(" + re.escape(AUDIO) + r")+<\|im_end\|>\n<\|im_start\|>assistant\n$", whole)


async def test_barge_in_aborts_the_in_process_request(streamed):
    engine = engine_of(streamed)
    engine.fake_config.timing = Timing(chunk_ms=60)
    try:
        async with connect(streamed.ws_base) as c:
            await c.expect("session.created")
            await c.send({"type": "conversation.item.create", "item": TEXT_ITEM})
            await c.send({"type": "response.create"})
            await c.expect("response.output_audio.delta", timeout=10)
            answering = [rid for rid, _ in engine.inputs][-1]
            await c.speak(QUESTION[: 24000 * 3 // 2])  # the user talks over it
            done = await c.expect("response.done")
            assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    finally:
        engine.fake_config.timing = Timing()
    assert answering in engine.aborted and answering not in engine.completed


async def test_a_whole_request_carries_the_salt_the_speaker_and_the_answer_budget(whole):
    engine = engine_of(whole)
    async with connect(whole.ws_base, api_key="key-a") as a, connect(whole.ws_base, api_key="key-b") as b:
        for c in (a, b):
            await c.expect("session.created")
        await a.send({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "Chelsie"}}}})
        await a.send({"type": "conversation.item.create", "item": TEXT_ITEM})
        await a.send({"type": "response.create", "response": {"max_output_tokens": 3}})
        done = await a.expect("response.done", timeout=15)
        assert done.response.status == "incomplete" and done.response.output[0].content[0].transcript == "I heard 0.0"
        await b.send({"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"], "input": [TEXT_ITEM]}})
        text = await b.expect("response.done", timeout=15)
        assert text.response.output[0].content[0].text.startswith("I heard") and not b.of("response.output_audio.delta")
    (_, first), (_, second) = engine.inputs[-2:]
    assert first["prompt"] == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\n"
    assert first["additional_information"] == {"speaker": ["Chelsie"]}
    assert first["cache_salt"] != second["cache_salt"]  # two keys, two cache namespaces


async def test_ming_reports_its_rate_and_the_audio_is_resampled_once():
    engine = LocalOmni(InProcessOptions(model="inclusionAI/Ming-flash-omni-2.0", engine_class=ENGINE_CLASS, chat_template=TEMPLATE))
    await engine.start()
    body = {"messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"], "max_tokens": 64, "cache_salt": "s"}
    pieces = [p async for p in engine.stream(body)]
    audio = [p for p in pieces if type(p).__name__ == "EngineAudio"]
    assert audio and {a.rate for a in audio} == {44100}
    words = "".join(p.text for p in pieces if type(p).__name__ == "TextDelta").split()
    assert sum(len(a.pcm) for a in audio) == pytest.approx(len(words) * 0.240 * 44100, rel=0.01)
    usage = pieces[-1]
    assert type(usage).__name__ == "Usage" and usage.input_tokens > 0
