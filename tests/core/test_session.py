"""The session core driven directly, state by state: no socket, no server thread. Client events go
in through ``Session.handle`` and media through ``push_audio`` exactly as a transport hands them
over, the pipeline is a faithful fake that records what it was asked (tests/support/
fake_pipeline.py), and what the session emits is read straight from its outbox, so event orders a
socket makes racy are exact here. Speech is real (espeak-ng) and the voice activity detector is
the real one."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import numpy as np
import pytest

from realtime_omni.config import InterruptionGuard, Limits
from realtime_omni.metrics import Metrics
from realtime_omni.protocol import events as ev
from realtime_omni.session import Media, Session
from realtime_omni.session.config import MAX_KEYWORD_CHARS, MAX_KEYWORDS, SessionConfig
from tests.support.audio import silence, spoken
from tests.support.fake_pipeline import FakePipeline, FakeSession

RATE = 16000  # the fake pipeline's input rate: what push_audio takes
MANUAL = msgspec.json.decode(b'{"type": "realtime", "audio": {"input": {"turn_detection": null}}}', type=ev.SessionObject)
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def kind(event: Any) -> str:
    return event.__struct_config__.tag


class Opened:
    def __init__(self, session: Session, pipeline: FakePipeline) -> None:
        self.session = session
        self.pipeline = pipeline
        self.pipe: FakeSession = session.ctx.pipe  # type: ignore[assignment]
        self.events: list[Any] = []

    async def send(self, *events: dict[str, Any]) -> None:
        """Hand each event to the session back to back, as a transport's read loop would."""
        for event in events:
            await self.session.handle(json.dumps(event))

    async def speak(self, pcm: np.ndarray) -> None:
        """Media at the pipeline's rate, 20 ms at a time, as a media transport pushes it."""
        for i in range(0, len(pcm), RATE // 50):
            await self.session.push_audio(pcm[i : i + RATE // 50])

    async def until(self, tag: str, timeout: float = 5.0) -> list[Any]:
        """Everything emitted up to and including the next event of type ``tag``."""
        start = len(self.events)
        async with asyncio.timeout(timeout):
            while True:
                event = await self.session.outbox.get()
                assert event is not None, "the outbox closed"
                self.events.append(event)
                if kind(event) == tag:
                    return self.events[start:]

    async def first(self, tag: str, timeout: float = 5.0) -> Any:
        """The first event of type ``tag`` emitted so far, or the next one."""
        for event in self.events:
            if kind(event) == tag:
                return event
        return (await self.until(tag, timeout))[-1]

    def queued(self) -> list[str]:
        """Types of the events waiting in the outbox now, without taking them."""
        return [kind(e) for e, _, _ in self.session.outbox._items]


async def open_session(update: ev.SessionObject | None = None, media: Media = Media(), **fake: Any) -> Opened:
    pipeline = FakePipeline(**fake)
    caps = pipeline.capabilities
    config = SessionConfig.default(caps, "m")
    if update is not None:
        config = config.updated(update, caps)
    session = Session(pipeline, config, Limits(), Metrics(), media=media)
    await session.start()
    return Opened(session, pipeline)


@pytest.fixture
async def opened() -> AsyncIterator[Opened]:
    o = await open_session(MANUAL, reply=" ".join(["word"] * 40), word_interval_s=0.04)
    yield o
    await o.session.close()
    assert o.pipeline.stats()["active_responses"] == 0 and o.pipe.closed


@pytest.fixture
async def vad() -> AsyncIterator[Opened]:
    """Server VAD (the default turn detection) with input transcription, an answer of three words at once."""
    o = await open_session(msgspec.json.decode(b'{"audio": {"input": {"transcription": {"model": "fake"}}}}', type=ev.SessionObject))
    yield o
    await o.session.close()
    assert o.pipeline.stats()["active_responses"] == 0 and o.pipe.closed


QUESTION = spoken("What is the weather like today?", RATE)


# ------------------------------------------------------------------------------ listening


async def test_listening_silence_emits_nothing_and_keeps_only_a_preroll(vad):
    await vad.speak(silence(3000, RATE))
    assert vad.queued() == ["session.created", "conversation.created"]
    assert vad.pipe.pending == 0 and not vad.pipe.calls
    assert len(vad.session.user.buffer) <= RATE  # prefix padding + onset window, not 3 s


# ------------------------------------------------------------------------------ a turn


async def test_a_turn_feeds_every_sample_once_then_commits_transcribes_and_answers(vad):
    await vad.speak(np.concatenate([silence(500, RATE), QUESTION, silence(1000, RATE)]))
    events = await vad.until("response.done")
    types = [kind(e) for e in events]
    started, stopped = events[types.index("input_audio_buffer.speech_started")], events[types.index("input_audio_buffer.speech_stopped")]
    committed = events[types.index("input_audio_buffer.committed")]
    assert started.item_id == stopped.item_id == committed.item_id
    assert 150 <= started.audio_start_ms <= 260  # speech begins at 500 ms; the item starts prefix_padding_ms (300) before it
    assert started.audio_start_ms < stopped.audio_end_ms
    assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed") < types.index("response.created")
    commits = [c for c in vad.pipe.calls if c[0] == "commit"]
    assert commits == [("commit", committed.item_id, commits[0][2])]
    item = vad.session.conversation.get(committed.item_id)
    assert commits[0][2] == len(item.parts[0].audio)  # what was fed is exactly the item's audio
    assert events[-1].response.status == "completed"
    transcript = await vad.first("conversation.item.input_audio_transcription.completed")
    assert transcript.item_id == committed.item_id and transcript.transcript == f"{len(item.parts[0].audio)} samples"


async def test_a_pause_starts_speculation_with_the_history_before_the_turn_and_speech_voids_it(vad):
    await vad.send({"type": "conversation.item.create", "item": TEXT_ITEM})
    await vad.until("conversation.item.done")
    words = spoken("one two", RATE)
    await vad.speak(np.concatenate([silence(300, RATE), words, silence(300, RATE), words]))
    kinds = [c[0] for c in vad.pipe.calls]
    assert kinds[:2] == ["pause", "resume"], kinds
    request = vad.pipe.calls[0][1]
    assert [item.id for item in request.items] == [item.id for item in vad.session.conversation]  # the history before the turn
    await vad.speak(silence(1000, RATE))
    await vad.until("response.done")
    assert [c[0] for c in vad.pipe.calls].count("commit") == 1  # one turn, not two


async def test_barge_in_cuts_the_answer_before_speech_started_and_keeps_only_what_was_sent():
    o = await open_session(reply=" ".join(["word"] * 40), word_interval_s=0.05)
    try:
        await o.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"})
        await o.until("response.output_audio.delta")
        await o.speak(np.concatenate([silence(200, RATE), QUESTION[: RATE // 2]]))  # the user talks over it
        events = await o.until("response.done")
        types = [kind(e) for e in events]
        i = types.index("input_audio_buffer.speech_started")
        assert "response.output_audio.delta" not in types[i:]  # nothing of the old answer after speech_started
        done = events[-1]
        assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
        sent = sum(len(base64.b64decode(e.delta)) // 2 for e in o.events if kind(e) == "response.output_audio.delta")
        answer = o.session.conversation.get(done.response.output[0].id)
        assert len(answer.parts[0].audio) == sent  # the item keeps exactly the audio the client got
        assert answer.parts[0].text.split() == ["word"] * len(answer.parts[0].text.split())
        assert o.pipeline.stats()["active_responses"] == 0
    finally:
        await o.session.close()


# ------------------------------------------------------------------------------ manual turns


async def test_manual_commit_needs_100_ms_and_clear_discards(opened):
    pcm = base64.b64encode(bytes(24000 * 2 // 20)).decode()  # 50 ms at 24 kHz
    await opened.send({"type": "input_audio_buffer.append", "audio": pcm}, {"type": "input_audio_buffer.commit"})
    assert (await opened.until("error"))[-1].error.code == "input_audio_buffer_commit_empty"
    await opened.send({"type": "input_audio_buffer.clear"})
    await opened.until("input_audio_buffer.cleared")
    assert opened.pipe.calls[-1][0] == "clear" and len(opened.session.user.buffer) == 0
    await opened.send(*[{"type": "input_audio_buffer.append", "audio": pcm}] * 3, {"type": "input_audio_buffer.commit"})
    committed = (await opened.until("input_audio_buffer.committed"))[-1]
    assert opened.pipe.calls[-1][:2] == ("commit", committed.item_id)
    assert opened.pipe.calls[-1][2] == 2400  # 150 ms at 16 kHz, every sample fed before the commit


# ------------------------------------------------------------------------------ responses


async def test_one_in_band_response_at_a_time_and_cancel_needs_one(opened):
    await opened.send({"type": "response.cancel", "event_id": "c0"})
    error = (await opened.until("error"))[-1]
    assert (error.error.code, error.error.event_id) == ("response_cancel_not_active", "c0")
    await opened.send({"type": "response.create"}, {"type": "response.create", "event_id": "again"})
    error = (await opened.until("error"))[-1]
    assert (error.error.code, error.error.event_id) == ("conversation_already_has_active_response", "again")
    await opened.send({"type": "response.cancel"})
    assert (await opened.until("response.done"))[-1].response.status == "cancelled"
    await opened.send({"type": "response.create"})
    assert (await opened.until("response.created"))[-1].response.status == "in_progress"


@pytest.mark.parametrize("stop", [{"type": "response.cancel"}, {"type": "output_audio_buffer.clear"}])
async def test_a_response_cancelled_before_it_ran_still_reports_created_and_done(opened, stop):
    await opened.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"}, stop)
    events = await opened.until("response.done")
    types = [kind(e) for e in events]
    assert types.index("response.created") < types.index("response.done")
    done = events[-1]
    assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
    assert opened.session.runs.active is None
    await opened.send({"type": "response.create"})
    created = (await opened.until("response.created"))[-1]
    assert created.response.id != done.response.id
    await opened.send({"type": "response.cancel"})
    assert (await opened.until("response.done"))[-1].response.status == "cancelled"


async def test_an_out_of_band_response_cancelled_before_it_ran_reports_done(opened):
    await opened.send({"type": "response.create", "response": {"conversation": "none", "input": [TEXT_ITEM]}}, {"type": "response.cancel"})
    events = await opened.until("response.done")
    types = [kind(e) for e in events]
    assert types[types.index("response.created") + 1] == "rate_limits.updated"
    assert events[-1].response.status == "cancelled" and events[-1].response.conversation_id is None
    assert not opened.session.runs.out_of_band


MALFORMED = [
    b'{"type":"session.update","session":{"instructions":' + b"[" * 1000 + b"]" * 1000 + b"}}",
    b'{"type":"input_audio_buffer.clear","x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    b'{"type": 0x10}',
    b'{"type":"session.update","session":{"a":1}}}',
    b'{"type":"conversation.item.retrieve","item_id":5 x}',
    b'{"type":"\xff\xfe"}',
    '{"type":"\ud800"}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("data", MALFORMED, ids=range(len(MALFORMED)))
async def test_unreadable_messages_are_errors_not_exceptions(opened, data):
    await opened.session.handle(data)
    error = (await opened.until("error"))[-1]
    assert error.error.type == "invalid_request_error" and error.error.code in ("invalid_json", "invalid_event")
    await opened.send({"type": "input_audio_buffer.clear"})
    await opened.until("input_audio_buffer.cleared")


# ------------------------------------------------------------------------------ media sessions


async def drain(playout: Any, stop: asyncio.Event) -> None:
    """A media transport's clock: one frame every 20 ms until ``stop``."""
    while not stop.is_set():
        playout.frame()
        await asyncio.sleep(0.02)  # the clock is the test's input: frames leave in real time


async def test_a_media_session_plays_the_answer_paced_and_reports_it_instead_of_deltas():
    o = await open_session(MANUAL, media=Media(playout_rate=8000, playout_buffer_ms=100))
    stop = asyncio.Event()
    clock = asyncio.create_task(drain(o.session.playout, stop))
    try:
        await o.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"})
        events = await o.until("output_audio_buffer.stopped")
        types = [kind(e) for e in events]
        assert "response.output_audio.delta" not in types
        assert types.index("output_audio_buffer.started") < types.index("response.done")
        done = events[types.index("response.done")]
        answer = o.session.conversation.get(done.response.output[0].id)
        assert len(answer.parts[0].audio) == 3 * 24000 * 200 // 1000 and answer.parts[0].text == "one two three"
    finally:
        stop.set()
        await clock
        await o.session.close()


async def test_clearing_a_finished_answer_still_playing_truncates_it_to_what_was_played():
    o = await open_session(MANUAL, media=Media(playout_rate=8000, playout_buffer_ms=2000))
    try:
        await o.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"})
        done = (await o.until("response.done"))[-1]  # generated at once: it all waits in the playout
        for _ in range(10):  # 200 ms leave
            o.session.playout.frame()
        await o.send({"type": "output_audio_buffer.clear"})
        events = await o.until("conversation.item.truncated")
        assert "output_audio_buffer.cleared" in [kind(e) for e in events]
        truncated = events[-1]
        assert (truncated.item_id, truncated.audio_end_ms) == (done.response.output[0].id, 200)
        answer = o.session.conversation.get(truncated.item_id)
        assert len(answer.parts[0].audio) == 24000 * 200 // 1000 and answer.parts[0].text == "one"
        assert o.session.playout.frame() is None  # nothing more to play
    finally:
        await o.session.close()


@pytest.mark.parametrize("min_speech_ms,cut", [(400, False), (0, True)], ids=["guarded", "unguarded"])
async def test_the_interruption_guard_ignores_a_short_sound_over_the_agent(min_speech_ms, cut):
    guard = InterruptionGuard(min_speech_ms=min_speech_ms) if min_speech_ms else None
    o = await open_session(media=Media(playout_rate=8000, interruption_guard=guard), reply=" ".join(["word"] * 40), word_interval_s=0.02)
    stop = asyncio.Event()
    clock = asyncio.create_task(drain(o.session.playout, stop))
    try:
        await o.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"})
        await o.until("output_audio_buffer.started")
        answer = o.session.runs.active
        await o.speak(np.concatenate([spoken("No.", RATE), silence(800, RATE)]))
        # push_audio has judged all of it, the silence after "No." included: a barge-in has been
        # carried out (its cancel awaited), or the short sound was heard and let go
        assert answer is not None and (answer.status == "cancelled") is cut
        types = [kind(e) for e in o.events] + o.queued()
        assert ("input_audio_buffer.speech_started" in types) is cut
        if not cut:
            assert o.session.user.turn is None and o.pipe.calls[-1][0] == "clear"  # heard, held, dropped
        if not cut:  # real speech still interrupts
            await o.speak(np.concatenate([QUESTION, silence(800, RATE)]))
            done = (await o.until("response.done"))[-1]
            assert done.response.status_details.reason == "turn_detected"
    finally:
        stop.set()
        await clock
        await o.session.close()


async def test_closing_mid_answer_stops_the_pipeline_and_leaves_nothing_running(opened):
    await opened.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"})
    await opened.until("response.output_audio.delta")
    run = opened.session.runs.active
    await opened.session.close()
    assert run is not None and run.done and opened.session.runs.active is None
    assert opened.pipeline.stats()["active_responses"] == 0 and opened.pipe.closed
    assert not len(opened.session.ctx.tasks)


async def closed_and_freed_at_once(o: Opened) -> None:
    """Close ``o``'s session with the cyclic collector off and drop it: with no reference cycle,
    the session and its conversation are freed then and there. (``o`` must be the last reference:
    pass it straight from the call that made it.)"""
    gc.collect()
    gc.disable()
    try:
        await o.session.close()
        assert o.pipeline.stats()["active_responses"] == 0 and o.pipe.closed
        ref, history = weakref.ref(o.session), weakref.ref(o.session.conversation)
        del o
        kept = [type(r).__name__ for r in gc.get_referrers(ref())] if ref() is not None else []
        assert ref() is None and history() is None, f"a closed session is still held by {kept}"
    finally:
        gc.enable()


async def mid_answer_with_every_kind_of_task() -> Opened:
    """A spoken turn answered, an out-of-band answer running, and an in-band one barged in on."""
    vad = await open_session(msgspec.json.decode(b'{"audio": {"input": {"transcription": {"model": "fake"}}}}', type=ev.SessionObject))
    await vad.speak(np.concatenate([silence(300, RATE), QUESTION, silence(800, RATE)]))
    await vad.until("response.done")
    await vad.send(
        {"type": "conversation.item.create", "item": TEXT_ITEM},
        {"type": "response.create", "response": {"conversation": "none"}},
        {"type": "response.create"},
    )
    await vad.until("response.created")
    await vad.speak(QUESTION[: RATE // 2])  # barge in on it
    return vad


async def media_answer_playing() -> Opened:
    o = await open_session(MANUAL, media=Media(playout_rate=8000), reply=" ".join(["word"] * 40), word_interval_s=0.02)
    await o.send({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create"})
    await o.until("response.output_item.added")
    while o.session.playout.playing is None:  # the clock takes the first frame once there is one
        o.session.playout.frame()
        await asyncio.sleep(0)
    await o.until("output_audio_buffer.started")
    return o


async def test_a_closed_session_is_freed_at_once_not_at_the_next_full_garbage_collection():
    """No reference cycle keeps a closed session (its conversation, its audio) alive: with the
    cyclic collector off, dropping the last reference frees it. Closed mid-answer, with an
    out-of-band answer running and a spoken turn behind it, so every kind of task has run."""
    await closed_and_freed_at_once(await mid_answer_with_every_kind_of_task())


async def test_a_closed_media_session_is_freed_at_once_too():
    """The same for a media session closed while its answer plays: the playout reports started and
    stopped through the session's shared context, which leads back to no part of it."""
    await closed_and_freed_at_once(await media_answer_playing())


async def test_noise_reduction_reaches_the_pipeline_at_open_and_on_every_change():
    near = msgspec.json.decode(b'{"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}', type=ev.SessionObject)
    o = await open_session(near)
    try:
        assert o.pipe.noise_reduction == ["near_field"]
        await o.send({"type": "session.update", "session": {"type": "realtime", "instructions": "x"}})
        await o.until("session.updated")
        assert o.pipe.noise_reduction == ["near_field"]  # unchanged: not told again
        for value, expected in (({"type": "far_field"}, "far_field"), (None, None)):
            await o.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"noise_reduction": value}}}})
            updated = (await o.until("session.updated"))[-1]
            assert o.pipe.noise_reduction[-1] == expected
            nr = updated.session.audio.input.noise_reduction
            assert (nr.type if nr is not None else None) == expected
        assert o.pipe.noise_reduction == ["near_field", "far_field", None]
    finally:
        await o.session.close()
    plain = await open_session()
    assert plain.pipe.noise_reduction == []  # off by default: never called
    await plain.session.close()


async def test_keywords_reach_the_pipeline_at_open_and_on_every_change_and_bad_ones_are_refused():
    """``audio.input.transcription.keywords`` (words the ears are to expect): told to the session's
    pipeline at open and when they change, echoed in ``session.updated``; too many, an empty one or
    a long one is an ``invalid_value`` error naming it, and the session keeps what it had."""
    listed = msgspec.json.decode(b'{"audio": {"input": {"transcription": {"model": "fake", "keywords": ["Marco", "Lisbon"]}}}}', type=ev.SessionObject)
    o = await open_session(listed)
    try:
        assert o.pipe.keywords == [("Marco", "Lisbon")]
        await o.send({"type": "session.update", "session": {"type": "realtime", "instructions": "x"}})
        await o.until("session.updated")
        assert o.pipe.keywords == [("Marco", "Lisbon")]  # unchanged: not told again
        for bad, param in (
            (["x"] * (MAX_KEYWORDS + 1), "session.audio.input.transcription.keywords"),
            (["Marco", " "], "session.audio.input.transcription.keywords[1]"),
            (["y" * (MAX_KEYWORD_CHARS + 1)], "session.audio.input.transcription.keywords[0]"),
        ):
            await o.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"keywords": bad}}}}})
            error = (await o.until("error"))[-1]
            assert (error.error.type, error.error.code, error.error.param) == ("invalid_request_error", "invalid_value", param)
        assert o.pipe.keywords == [("Marco", "Lisbon")]
        await o.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "fake", "keywords": ["Jon"]}}}}})
        updated = (await o.until("session.updated"))[-1]
        assert updated.session.audio.input.transcription.keywords == ["Jon"]
        await o.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"transcription": None}}}})
        await o.until("session.updated")
        assert o.pipe.keywords == [("Marco", "Lisbon"), ("Jon",), ()]  # no transcription: no keywords
    finally:
        await o.session.close()
    plain = await open_session()
    assert plain.pipe.keywords == []  # none by default: never called
    await plain.session.close()


LONG = "I would like to know what the weather is going to be like in Paris tomorrow morning please"


async def test_live_captions_append_while_the_user_speaks_then_the_transcript_completes_them():
    transcription = b'{"audio": {"input": {"transcription": {"model": "fake"}}}}'
    o = await open_session(msgspec.json.decode(transcription, type=ev.SessionObject), script=LONG)
    try:
        speech = spoken(LONG, RATE)
        assert len(speech) > 4 * RATE
        pcm = np.concatenate([silence(300, RATE), speech, silence(800, RATE)])
        for i in range(0, len(pcm), RATE // 50):  # 20 ms at a time, letting the caption passes run between
            await o.session.push_audio(pcm[i : i + RATE // 50])
            await asyncio.sleep(0)
        await o.until("conversation.item.input_audio_transcription.completed")
        types = [kind(e) for e in o.events]
        stopped = types.index("input_audio_buffer.speech_stopped")
        item = o.events[types.index("input_audio_buffer.speech_started")].item_id
        deltas = [e for e in o.events if kind(e) == "conversation.item.input_audio_transcription.delta"]
        early = [e for e in deltas if o.events.index(e) < stopped]
        assert len(early) >= 2 and all(e.item_id == item and e.content_index == 0 for e in deltas)
        # a pass at least every second of speech (and at pauses), each on the turn so far
        passes = o.pipe.captions
        assert len(passes) >= len(speech) // RATE - 1 and passes == sorted(passes)
        completed = o.events[types.index("conversation.item.input_audio_transcription.completed")]
        assert "".join(e.delta for e in deltas) == completed.transcript == LONG  # appended, never rewritten
        assert LONG.startswith("".join(e.delta for e in early))
    finally:
        await o.session.close()


async def test_no_captions_without_input_transcription_and_a_rewritten_start_is_not_appended_to():
    o = await open_session(script=LONG)  # transcription off (the default)
    await o.speak(np.concatenate([spoken(LONG, RATE), silence(800, RATE)]))
    await o.until("input_audio_buffer.committed")
    assert o.pipe.captions == []
    await o.session.close()

    from realtime_omni.session.captions import Captions

    c = Captions()
    assert [c.hear(t) for t in ("what is", "what is the weather", "What is the weather like?")] == ["", "what is", " the weather"]
    assert c.hear("Watt is the weather like") == ""  # disagrees with what was shown: nothing more
    assert c.finish("What is the weather like today?") == " like today?"  # case and punctuation aside, it goes on
    assert Captions().finish("Hello.") == "Hello." and c.shown == "what is the weather like today?".split()
    d = Captions()
    d.hear("hello there")
    d.hear("hello there")
    assert d.finish("Yellow there") is None  # the final transcript differs from the shown words
