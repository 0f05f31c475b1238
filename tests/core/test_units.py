"""The engine's building blocks on their own: wire audio input, turn detection, stage graphs,
transcript alignment, the input buffer and the outbox (the signal processing under them:
tests/dsp)."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest

from pipelines.stages import chain
from dsp import g711
from realtime_omni.protocol.audio import InputConverter, WireFormat
from realtime_omni.session.conversation import Alignment
from realtime_omni.session.input_buffer import InputBuffer
from realtime_omni.session.outbox import Outbox
from realtime_omni.session.config import SERVER_VAD_DEFAULTS, _vad_settings
from realtime_omni.session.turns import Paused, SpeechStarted, SpeechStopped, TurnDetector
from realtime_omni.tasks import TaskSet
from tests.support.audio import espeak, silence, speech_bounds_ms

# ------------------------------------------------------------------ wire audio (G.711 and resampling themselves: tests/dsp)


def test_input_converter_decodes_each_wire_format():
    tone = (np.sin(np.arange(8000) * 2 * np.pi * 440 / 8000) * 8000).astype(np.int16)
    conv = InputConverter(WireFormat.PCMU, 16000)
    out = np.concatenate([conv(g711.pcm_to_ulaw(tone)), conv.flush()])
    assert len(out) == 16000
    spectrum = np.abs(np.fft.rfft(out.astype(float)))
    assert abs(np.argmax(spectrum) * 16000 / len(out) - 440) < 2


# ------------------------------------------------------------------ turn detection


def detect(pcm, rate=16000, **vad):
    settings = _vad_settings(SERVER_VAD_DEFAULTS.__class__(**{**{f: getattr(SERVER_VAD_DEFAULTS, f) for f in SERVER_VAD_DEFAULTS.__struct_fields__}, **vad}))
    det = TurnDetector(settings, rate, pause_ms=200)
    events = []
    for i in range(0, len(pcm), 320):
        events += det.process(pcm[i : i + 320])
    return events


def test_turn_detector_on_real_speech():
    speech = np.concatenate([silence(1000, 16000), espeak("Turn detection on real speech.", 16000), silence(1200, 16000)])
    onset, end = speech_bounds_ms(speech, 16000)
    events = detect(speech)
    kinds = [type(e) for e in events]
    assert kinds[0] is SpeechStarted and kinds[-1] is SpeechStopped and kinds.count(SpeechStarted) == 1
    assert Paused in kinds  # the short silence before the end of the turn
    started, stopped = events[0], events[-1]
    assert abs(started.onset / 16 - onset) <= 60 and started.start == started.onset - 300 * 16
    assert abs(stopped.speech_end / 16 - end) <= 60
    assert stopped.end - stopped.speech_end == 500 * 16


def test_turn_detector_pause_then_resume_is_one_turn():
    words = espeak("one two", 16000)
    first, last = speech_bounds_ms(words, 16000)
    words = words[first * 16 : last * 16]  # espeak pads its output with silence: cut it
    speech = np.concatenate([silence(500, 16000), words, silence(300, 16000), words, silence(800, 16000)])
    events = detect(speech)
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("SpeechStarted") == 1 and kinds.count("SpeechStopped") == 1
    i = kinds.index("Paused")
    assert kinds[i + 1] == "Resumed"


def test_turn_detector_ignores_clicks_and_silence():
    click = np.zeros(16000, np.int16)
    click[8000:8080] = 20000  # 5 ms click
    assert detect(np.concatenate([silence(1000, 16000), click, silence(1000, 16000)])) == []
    quiet = (np.random.default_rng(1).standard_normal(32000) * 30).astype(np.int16)  # -60 dBFS noise floor
    assert detect(quiet) == []


def test_turn_detector_threshold_raises_the_floor():
    soft = (espeak("soft voice", 16000).astype(float) * 0.01).astype(np.int16)  # about -60 dBFS speech
    speech = np.concatenate([silence(500, 16000), soft, silence(800, 16000)])
    assert detect(speech, threshold=0.9) == []
    assert any(isinstance(e, SpeechStarted) for e in detect(speech, threshold=0.1))


def test_turn_detector_at_8khz_and_24khz():
    for rate in (8000, 24000):
        speech = np.concatenate([silence(800, rate), espeak("telephone", rate), silence(900, rate)])
        events = detect(speech, rate=rate)
        assert isinstance(events[0], SpeechStarted) and isinstance(events[-1], SpeechStopped), rate


# ------------------------------------------------------------------ stage graphs


async def test_chain_cancels_every_stage_and_runs_their_cleanup():
    cleaned = []
    produced = 0

    async def source():
        nonlocal produced
        try:
            while True:
                produced += 1
                yield produced
        finally:
            cleaned.append("source")

    def double(items):
        async def gen():
            try:
                async for x in items:
                    yield 2 * x
            finally:
                cleaned.append("double")

        return gen()

    stuck = asyncio.Event()

    async def consume():
        async with chain(source(), double, maxsize=2) as stream:
            async for x in stream:
                if x >= 10:
                    stuck.set()
                    await asyncio.Event().wait()  # stuck downstream for good: the stages must stay bounded

    task = asyncio.create_task(consume())
    await stuck.wait()
    ahead = await settled(lambda: produced) - 5  # consumed 5; every stage has run as far as it can
    assert 0 < ahead <= 2 * 3  # the stages ran ahead, at most maxsize+1 per handoff in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(cleaned) == ["double", "source"]
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("stage-")]


async def settled(value, rounds: int = 20) -> int:  # type: ignore[no-untyped-def]
    """``value()`` once it has not changed for ``rounds`` turns of the event loop: every task that
    could run has run, and every one left waits on something (here: a full queue)."""
    last, same = value(), 0
    while same < rounds:
        await asyncio.sleep(0)  # one turn of the loop, not a span of time
        now = value()
        same, last = (same + 1 if now == last else 0), now
    return last


async def test_chain_propagates_stage_errors():
    async def source():
        yield 1
        raise ValueError("engine failed")

    with pytest.raises(ValueError, match="engine failed"):
        async with chain(source(), maxsize=1) as stream:
            async for _ in stream:
                pass


# ------------------------------------------------------------------ alignment, buffer, outbox


def test_alignment_cuts_transcript_at_the_playback_position():
    a = Alignment(rate=1000)
    text = "Hello there. How are you today?"
    a.mark(0, 0)
    a.mark(1000, 13)  # "How are you today?" starts at 1 s and lasts 2 s
    assert a.cut(text, 3000, 3000) == text
    assert a.cut(text, 1000, 3000) == "Hello there."
    assert a.cut(text, 2000, 3000) == "Hello there. How are"  # half of the second clause's 4 words
    assert a.cut(text, 500, 3000) == "Hello"
    assert a.cut(text, 0, 3000) == ""
    # Still producing: the last clause's length is estimated from the rate so far.
    assert a.cut(text, 1000, 1000, final=False) == "Hello there."


def test_input_buffer_slices_by_absolute_position():
    buf = InputBuffer(rate=1000, max_seconds=10)
    for i in range(5):
        buf.append(np.full(100, i, np.int16))
    assert buf.slice(150, 320).tolist() == [1] * 50 + [2] * 100 + [3] * 20
    buf.drop_before(250)
    assert (buf.start, buf.end, len(buf)) == (250, 500, 250)
    assert buf.slice(0, 260).tolist() == [2] * 10
    buf.clear()
    assert len(buf) == 0 and buf.start == 500
    assert buf.room() == 10_000


class _Owner:
    muted = False


async def test_outbox_is_bounded_and_purges_an_owners_events():
    box = Outbox(maxsize=3)
    owner = _Owner()
    for i in range(3):
        assert await box.put(f"delta{i}", owner, weight=i)
    blocked = asyncio.create_task(box.put("late", owner, weight=3))
    await asyncio.sleep(0)  # one turn of the loop: the put runs up to where it waits
    assert len(box._putters) == 1 and not blocked.done() and len(box) == 3  # full: the producer waits
    assert await box.get() == "delta0"
    assert await blocked is True  # a slot freed: it is queued
    assert box.purge(owner) == [1, 2, 3]  # delta1, delta2, late: their weights
    assert await box.put("control")
    assert await box.get() == "control"
    owner.muted = True
    assert not await box.put("after mute", owner)  # a muted owner's events are not queued
    box.close()
    assert await box.get() is None
    assert not await box.put("after close")


def test_transcription_sessions_only_where_the_pipeline_transcribes():
    from pipelines.base import Capabilities
    from realtime_omni.errors import RealtimeError
    from realtime_omni.protocol import events as ev
    from realtime_omni.session.config import SessionConfig

    hears = Capabilities(name="hears", transcribes_input=True, transcription_model="whisper-tiny.en")
    config = SessionConfig.default(hears, "m").updated(ev.SessionObject(type="transcription"), hears)
    assert not config.responds and config.transcription is not None and config.transcription.model == "whisper-tiny.en"
    assert config.public.type == "transcription" and config.public.instructions is msgspec.UNSET
    assert config.updated(ev.SessionObject(type="realtime"), hears).responds
    deaf = Capabilities(name="deaf")
    with pytest.raises(RealtimeError) as err:
        SessionConfig.default(deaf, "m").updated(ev.SessionObject(type="transcription"), deaf)
    assert err.value.code == "unsupported_value" and err.value.param == "session.type"


async def test_a_task_set_joins_the_tasks_spawned_while_it_waits():
    tasks = TaskSet("owner")
    done: list[str] = []

    async def later() -> None:
        await asyncio.sleep(0.01)
        done.append("later")

    async def first() -> None:
        await asyncio.sleep(0.01)
        tasks.spawn(later(), "later")  # spawned while join waits on this one
        done.append("first")

    tasks.spawn(first(), "first")
    await tasks.join()
    assert done == ["first", "later"] and len(tasks) == 0
