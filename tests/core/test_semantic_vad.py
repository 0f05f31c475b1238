"""semantic_vad with its real end-of-turn model (Smart Turn v3.2 on ONNX Runtime), driven through the
session core as test_session.py drives it: media pushed 20 ms at a time, real webrtcvad, real
speech (espeak-ng), a faithful fake pipeline. Positions are stream positions: a verdict is applied
before the next frame is judged, so where a turn ends does not depend on how fast the test pushes.

The fake pipeline makes no transcript, so these verdicts are the audio model's alone."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import numpy as np
import pytest

from dsp.g711 import pcm_to_ulaw, ulaw_to_pcm
from dsp.resample import resample
from pipelines import models
from pipelines.base import Heard, TurnModel
from pipelines.turn_end.policy import TurnEndConfig, TurnEndPolicy
from realtime_omni.config import Limits
from realtime_omni.metrics import Metrics
from realtime_omni.protocol import events as ev
from realtime_omni.session import Session
from realtime_omni.session.config import SessionConfig
from tests.core.test_session import Opened, kind
from tests.support.audio import silence, speak
from tests.support.fake_pipeline import FakePipeline

RATE = 16000
FRAME = RATE // 50


@pytest.fixture(scope="module")
def turn_model() -> TurnModel:
    from pipelines.turn_end.smart_turn import SmartTurn

    # scripts/install installs its package: a missing or altered model fails here, it is not skipped
    model = SmartTurn(models.ensure("smart-turn-v3.2", progress=lambda _: None) / "smart-turn-v3.2-cpu.onnx")
    model.load()
    return model


def vad(td: dict[str, Any] | None) -> ev.SessionObject:
    return msgspec.convert({"type": "realtime", "audio": {"input": {"turn_detection": td}}}, ev.SessionObject)


SEMANTIC = {"type": "semantic_vad"}
SERVER = {"type": "server_vad"}


class Run:
    """A session fed audio 20 ms at a time; every event with the stream position (samples pushed)
    at which it was emitted."""

    def __init__(self, opened: Opened) -> None:
        self.o = opened
        self.pushed = 0
        self.log: list[tuple[int, Any]] = []

    async def speak(self, pcm: np.ndarray) -> None:
        for i in range(0, len(pcm), FRAME):
            frame = pcm[i : i + FRAME]
            await self.o.session.push_audio(frame)
            self.pushed += len(frame)
            await self._drain()

    async def _drain(self) -> None:
        while len(self.o.session.outbox):
            event = await self.o.session.outbox.get()
            self.log.append((self.pushed, event))

    async def send(self, *events: dict[str, Any]) -> None:
        await self.o.send(*events)
        await self._drain()

    async def until(self, tag: str, timeout: float = 10.0) -> Any:
        """The next event of type ``tag`` (waiting for it), logged at the current position."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.o.session.outbox.get()
                self.log.append((self.pushed, event))
                if kind(event) == tag:
                    return event

    def at(self, tag: str) -> list[tuple[int, Any]]:
        return [(pos, e) for pos, e in self.log if kind(e) == tag]

    def ms(self, samples: int) -> int:
        return samples * 1000 // RATE


async def run(turn_end: TurnModel | TurnEndPolicy | None, td: dict[str, Any] | None, **fake: Any) -> Run:
    """A session whose turns end by ``turn_end``: a policy, or the default policy around a model (or none)."""
    pipeline = FakePipeline(**fake)
    caps = pipeline.capabilities
    config = SessionConfig.default(caps, "m").updated(vad(td), caps)
    policy = turn_end if isinstance(turn_end, TurnEndPolicy) else TurnEndPolicy(TurnEndConfig(), turn_end)
    session = Session(pipeline, config, Limits(), Metrics(), turn_end=policy)
    await session.start()
    r = Run(Opened(session, pipeline))
    await r._drain()
    return r


LEAD = 500  # ms of silence before the speech
QUESTION = speak("How far away is the moon?", "espeak-en-gb-170")  # the model: finished (p ~0.9)
FRAGMENT = speak("I need to buy some,", "espeak-en-gb-170")  # unfinished (p ~0.02)
REST = speak("milk and bread.", "espeak-en-gb-170")  # the whole turn then: finished (p ~0.97)
BORDERLINE = speak("How do I reset my password?", "espeak-en-us-160")  # p ~0.4: high (0.2) says finished, low (0.8) does not


def said(pcm: np.ndarray, tail_ms: int) -> np.ndarray:
    return np.concatenate([silence(LEAD, RATE), pcm, silence(tail_ms, RATE)])


def speech_end(pcm: np.ndarray) -> int:
    return LEAD * RATE // 1000 + len(pcm)


async def close(r: Run) -> None:
    await r.o.session.close()
    assert r.o.pipeline.stats()["active_responses"] == 0


# ------------------------------------------------------------------------------ when a turn ends


async def test_a_complete_question_commits_sooner_than_server_vad_would(turn_model):
    delays = {}
    for name, td in (("server", SERVER), ("semantic", SEMANTIC)):
        r = await run(turn_model, td)
        await r.speak(said(QUESTION, 1500))
        [(pos, committed)] = r.at("input_audio_buffer.committed")
        [(_, stopped)] = r.at("input_audio_buffer.speech_stopped")
        assert stopped.item_id == committed.item_id
        delays[name] = r.ms(pos - speech_end(QUESTION))
        item = r.o.session.conversation.get(committed.item_id)
        fed = [c for c in r.o.pipe.calls if c[0] == "commit"][0][2]
        assert fed == len(item.parts[0].audio)  # the item is exactly the audio the pipeline was fed
        if name == "semantic":  # the turn ends 200 ms after the speech, where the model was asked
            assert abs(stopped.audio_end_ms - (LEAD + r.ms(len(QUESTION)) + 200)) <= 60
            assert r.o.session.ctx.metrics.end_of_turn_decisions.labels("finished")._value.get() == 1
        await close(r)
    assert delays["semantic"] <= 300 and delays["semantic"] + 250 <= delays["server"], delays


async def test_a_mid_sentence_pause_is_held_and_the_turn_commits_when_the_sentence_ends(turn_model):
    r = await run(turn_model, SEMANTIC)
    await r.speak(np.concatenate([silence(LEAD, RATE), FRAGMENT, silence(800, RATE), REST, silence(1000, RATE)]))
    commits = r.at("input_audio_buffer.committed")
    assert len(commits) == 1, [kind(e) for _, e in r.log]
    end = LEAD * RATE // 1000 + len(FRAGMENT) + 800 * RATE // 1000 + len(REST)
    assert commits[0][0] > end  # not before the sentence was over
    assert r.ms(commits[0][0] - end) <= 300
    calls = [c[0] for c in r.o.pipe.calls]
    assert calls.index("pause") < calls.index("resume") < calls.index("commit")  # speculation at the pause, voided
    decisions = r.o.session.ctx.metrics.end_of_turn_decisions
    assert decisions.labels("unfinished")._value.get() == 1 and decisions.labels("finished")._value.get() == 1
    item = r.o.session.conversation.get(commits[0][1].item_id)
    assert len(item.parts[0].audio) >= end - 8000  # both halves of the sentence are one item
    await close(r)


@pytest.mark.parametrize("eagerness, commits_at_pause", [("high", True), ("low", False)])
async def test_eagerness_decides_a_borderline_turn(turn_model, eagerness, commits_at_pause):
    r = await run(turn_model, {"type": "semantic_vad", "eagerness": eagerness})
    await r.speak(said(BORDERLINE, 3000))
    commits = r.at("input_audio_buffer.committed")
    assert bool(commits) == commits_at_pause
    if commits:
        assert r.ms(commits[0][0] - speech_end(BORDERLINE)) <= 300
    else:  # low waits up to 8 s of silence for more words, then ends the turn where the speech ended
        await r.speak(silence(5500, RATE))
        [(pos, committed)] = r.at("input_audio_buffer.committed")
        [(_, stopped)] = r.at("input_audio_buffer.speech_stopped")
        assert 7800 <= r.ms(pos - speech_end(BORDERLINE)) <= 8300
        assert abs(stopped.audio_end_ms - (LEAD + r.ms(len(BORDERLINE)) + 200)) <= 60
    await close(r)


@pytest.mark.parametrize("eagerness, wait_ms", [("high", 2000), ("auto", 4000)])
async def test_an_unfinished_turn_ends_after_the_eagerness_longest_wait(turn_model, eagerness, wait_ms):
    r = await run(turn_model, {"type": "semantic_vad", "eagerness": eagerness})
    await r.speak(said(FRAGMENT, wait_ms + 500))
    [(pos, stopped)] = r.at("input_audio_buffer.speech_stopped")
    assert abs(r.ms(pos - speech_end(FRAGMENT)) - wait_ms) <= 100
    assert abs(stopped.audio_end_ms - (LEAD + r.ms(len(FRAGMENT)) + 200)) <= 60  # where the speech ended, not 2-4 s later
    await r.until("response.done")
    await close(r)


async def test_phone_audio_8khz_ulaw_is_judged_too(turn_model):
    phone = resample(ulaw_to_pcm(pcm_to_ulaw(resample(QUESTION, RATE, 8000))), 8000, RATE)
    r = await run(turn_model, SEMANTIC)
    await r.speak(said(phone, 1000))
    [(pos, _)] = r.at("input_audio_buffer.committed")
    assert r.ms(pos - speech_end(phone)) <= 300
    await close(r)


# ------------------------------------------------------------------------------ what a turn does


async def test_create_response_false_commits_without_answering(turn_model):
    r = await run(turn_model, {"type": "semantic_vad", "create_response": False})
    await r.speak(said(QUESTION, 1000))
    assert len(r.at("input_audio_buffer.committed")) == 1
    # A response of the turn's own would hold the conversation's one in-band slot, from the commit
    # on: the client's response.create is then the only response, and nothing refused it.
    await r.send({"type": "response.create"})
    await r.until("response.done")
    assert len(r.at("response.created")) == 1 and not r.at("error")
    await close(r)


@pytest.mark.parametrize("interrupt", [True, False])
async def test_interrupt_response_decides_whether_speech_cuts_the_answer(turn_model, interrupt):
    r = await run(turn_model, {"type": "semantic_vad", "interrupt_response": interrupt}, reply=" ".join(["word"] * 60), word_interval_s=0.05)
    await r.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
    await r.send({"type": "response.create"})
    await r.speak(said(QUESTION[: RATE // 2], 0))  # the user talks over the answer
    [(_, started)] = r.at("input_audio_buffer.speech_started")
    done = r.at("response.done")[0][1] if r.at("response.done") else await r.until("response.done")
    status = done.response.status
    assert started.audio_start_ms > 0
    if interrupt:
        assert status == "cancelled" and done.response.status_details.reason == "turn_detected"
    else:
        assert status == "completed"
    await close(r)


async def test_session_update_switches_between_server_and_semantic_vad(turn_model):
    r = await run(turn_model, SERVER)
    delays = []
    for td in (SERVER, SEMANTIC, SERVER):
        await r.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": td}}}})
        assert kind(r.at("session.updated")[-1][1].session.audio.input.turn_detection) == td["type"]
        before = r.pushed
        await r.speak(said(QUESTION, 1200))
        pos = r.at("input_audio_buffer.committed")[-1][0]
        delays.append(r.ms(pos - before - speech_end(QUESTION)))
        await r.until("response.done")
    assert len(r.at("input_audio_buffer.committed")) == 3
    assert delays[1] + 250 <= min(delays[0], delays[2]), delays
    await close(r)


async def test_without_a_model_semantic_vad_waits_a_fixed_silence_per_eagerness():
    r = await run(None, {"type": "semantic_vad", "eagerness": "high"})
    await r.speak(said(FRAGMENT, 1000))
    [(pos, _)] = r.at("input_audio_buffer.committed")
    assert abs(r.ms(pos - speech_end(FRAGMENT)) - 400) <= 60  # the policy's eagerness "high": silence_ms
    await close(r)


@pytest.mark.parametrize("words, held", [("How far away is the", True), ("How far away is the moon?", False), (None, False)])
async def test_the_pipelines_transcript_is_weighed_with_the_audio(turn_model, words, held):
    """Without the thinker's judgement: the audio alone says finished (p ~0.9); a transcript
    stopping on "the" holds the turn."""
    r = await run(turn_model, SEMANTIC)

    async def heard(within_s: float) -> Heard | None:
        return None if words is None else Heard(words)

    r.o.pipe.heard = heard  # what the cascade's speculative ASR would say
    await r.speak(said(QUESTION, 1000))
    assert bool(r.at("input_audio_buffer.committed")) is not held
    decisions = r.o.session.ctx.metrics.end_of_turn_decisions
    assert decisions.labels("unfinished" if held else "finished")._value.get() == 1
    await close(r)


async def test_a_pipeline_that_hears_too_slowly_leaves_the_decision_to_the_sound(turn_model):
    """The policy waits for the words at most ``hearing_wait_ms``: a hearing that hangs (and
    ignores the bound it is given) is cut off, and the sound alone (p ~0.9) ends the turn."""
    r = await run(TurnEndPolicy(TurnEndConfig(hearing_wait_ms=300), turn_model), SEMANTIC)

    async def hangs(within_s: float) -> Heard:
        await asyncio.sleep(60)
        return Heard("How far away is the", 0.001)

    r.o.pipe.heard = hangs
    t0 = asyncio.get_running_loop().time()
    await r.speak(said(QUESTION, 1000))
    assert asyncio.get_running_loop().time() - t0 < 30  # not the 60 s the hearing would have taken
    [(pos, _)] = r.at("input_audio_buffer.committed")
    assert r.ms(pos - speech_end(QUESTION)) <= 260
    await close(r)


@pytest.mark.parametrize("text_rule, held", [(True, True), (False, False)])
async def test_the_text_rule_is_the_policys_setting(turn_model, text_rule, held):
    from pipelines.turn_end.fusion import Fusion

    r = await run(TurnEndPolicy(TurnEndConfig(fusion=Fusion(text_rule=text_rule)), turn_model), SEMANTIC)

    async def heard(within_s: float) -> Heard:
        return Heard("How far away is the")  # no judgement: the words' last one is "the"

    r.o.pipe.heard = heard
    await r.speak(said(QUESTION, 1000))
    assert bool(r.at("input_audio_buffer.committed")) is not held
    await close(r)


# ------------------------------------------------------------------------------ the thinker's judgement


@pytest.fixture
def fused(turn_model: TurnModel) -> TurnEndPolicy:
    """The policy with known fusion weights: logit = 0.5 logit(audio) + logit(words) + 2/s of silence."""
    from pipelines.turn_end.fusion import Fusion, Weights

    return TurnEndPolicy(TurnEndConfig(fusion=Fusion(with_words=Weights(bias=0.0, audio=0.5, words=1.0, silence_per_s=2.0))), turn_model)


def heard_as(words: str, ends: float):  # type: ignore[no-untyped-def]
    async def heard(within_s: float) -> Heard:
        return Heard(words, ends)

    return heard


async def test_semantic_vad_asks_the_pipeline_to_judge_the_words_and_server_vad_does_not(turn_model):
    r = await run(turn_model, SERVER)
    await r.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": SEMANTIC}}}})
    await r.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": SERVER}}}})
    assert [c for c in r.o.pipe.calls if c[0] == "judge_words"] == [("judge_words", "thinker"), ("judge_words", None)]
    await close(r)


async def test_words_that_end_a_sentence_end_the_turn_at_the_check(fused):
    r = await run(fused, SEMANTIC)
    r.o.pipe.heard = heard_as("How far away is the moon?", 0.6)  # 0.5 logit(0.9) + logit(0.6) = 1.5: p 0.82
    await r.speak(said(QUESTION, 1000))
    [(pos, _)] = r.at("input_audio_buffer.committed")
    assert r.ms(pos - speech_end(QUESTION)) <= 260
    await close(r)


async def test_words_that_do_not_end_one_wait_the_silence_the_fusion_names(fused):
    """The audio says finished (p ~0.9), the words do not (0.002): logit -5.1, so 2.56 s more
    silence after the 200 ms check brings it to 0.5; the turn ends there, not at the 4 s longest
    wait, and its audio still ends 200 ms after the speech."""
    r = await run(fused, SEMANTIC)
    r.o.pipe.heard = heard_as("How far away is the", 0.002)
    await r.speak(said(QUESTION, 2400))
    assert not r.at("input_audio_buffer.committed")  # 2.4 s of silence: not yet
    await r.speak(silence(1600, RATE))
    [(pos, stopped)] = r.at("input_audio_buffer.speech_stopped")
    assert 2500 <= r.ms(pos - speech_end(QUESTION)) <= 3100  # (the audio's own probability is ~0.9, not exactly)
    assert abs(stopped.audio_end_ms - (LEAD + r.ms(len(QUESTION)) + 200)) <= 60
    await close(r)


async def test_speech_after_a_pause_forgets_the_wait_it_was_given(fused):
    r = await run(fused, SEMANTIC)
    r.o.pipe.heard = heard_as("I need to buy some", 0.001)  # a long wait named at the pause ...
    await r.speak(np.concatenate([silence(LEAD, RATE), FRAGMENT, silence(800, RATE)]))
    r.o.pipe.heard = heard_as("I need to buy some milk and bread.", 0.8)  # ... and the sentence's end at the next
    await r.speak(np.concatenate([REST, silence(1000, RATE)]))
    commits = r.at("input_audio_buffer.committed")
    assert len(commits) == 1
    end = LEAD * RATE // 1000 + len(FRAGMENT) + 800 * RATE // 1000 + len(REST)
    assert 0 < r.ms(commits[0][0] - end) <= 300
    await close(r)
