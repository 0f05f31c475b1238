"""A stock OpenAI Realtime client (the official SDK) holding conversations over a real socket.

Every server event received in these tests is validated against the SDK's own models
(``tests/support/validation.py``): an unknown type, a missing field or an extra one fails.
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from realtime_omni.protocol.audio import WireFormat
from tests.support.audio import espeak, rms, silence, speech_bounds_ms, utterance
from tests.support.client import audio_of, connect

MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
WORD_BYTES = 240 * 24 * 2  # one synthetic word: 240 ms of pcm16 at 24 kHz

# The non-delta events of an audio response, in the order a client relies on.
AUDIO_RESPONSE_ORDER = [
    "response.created",
    "rate_limits.updated",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]
DELTAS = {"response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta"}


def skeleton(events):
    return [e.type for e in events if e.type not in DELTAS]


async def test_session_created_reports_the_full_effective_session(server):
    async with connect(server.ws_base, model="my-model") as c:
        created = await c.recv()
        assert created.type == "session.created"
        s = created.session
        assert type(s).__name__ == "RealtimeSessionCreateRequest"
        assert s.type == "realtime" and s.model == "my-model"
        assert s.output_modalities == ["audio"]
        assert s.audio.input.format.type == "audio/pcm" and s.audio.input.format.rate == 24000
        assert s.audio.output.format.type == "audio/pcm" and s.audio.output.voice == "tone"
        td = s.audio.input.turn_detection
        assert (td.type, td.threshold, td.prefix_padding_ms, td.silence_duration_ms) == ("server_vad", 0.5, 300, 500)
        assert td.create_response is True and td.interrupt_response is True
        assert s.audio.input.transcription.model == "synthetic"
        assert s.tool_choice == "auto" and s.tools == [] and s.max_output_tokens == "inf"
        conv = await c.recv()
        assert conv.type == "conversation.created" and conv.conversation.id.startswith("conv_")


async def test_manual_turn_full_envelope(server):
    pcm = utterance("What is the weather like in Paris today?")
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": MANUAL})
        updated = await c.expect("session.updated")
        assert updated.session.audio.input.turn_detection is None
        await c.append(pcm)
        await c.send({"type": "input_audio_buffer.commit"})
        committed = await c.expect("input_audio_buffer.committed")
        added = await c.expect("conversation.item.added")
        assert added.item.id == committed.item_id and added.item.role == "user"
        assert added.item.content[0].type == "input_audio"
        done = await c.expect("conversation.item.done")
        assert done.item.id == committed.item_id
        transcript = await c.expect("conversation.item.input_audio_transcription.completed")
        seconds = len(pcm) / 24000
        assert transcript.item_id == committed.item_id
        assert transcript.transcript == f"{seconds:.1f} seconds of audio"
        assert transcript.usage.type == "duration" and transcript.usage.seconds == pytest.approx(seconds, abs=0.05)

        await c.send({"type": "response.create"})
        events = await c.until("response.done")
        assert skeleton(events) == AUDIO_RESPONSE_ORDER
        reply = f"You said {seconds:.1f} seconds of audio."
        created, done = events[0], events[-1]
        assert created.response.status == "in_progress" and created.response.conversation_id.startswith("conv_")
        assert done.response.status == "completed" and done.response.id == created.response.id
        deltas = [e.delta for e in events if e.type == "response.output_audio_transcript.delta"]
        assert "".join(deltas) == reply
        assert c.of("response.output_audio_transcript.done")[-1].transcript == reply
        audio = audio_of(events)
        assert len(audio) == len(reply.split()) * WORD_BYTES
        item = done.response.output[0]
        assert item.role == "assistant" and item.status == "completed" and item.content[0].transcript == reply
        assert item.content[0].type == "output_audio"
        usage = done.response.usage
        assert usage.output_tokens == len(reply.split()) and usage.total_tokens == usage.input_tokens + usage.output_tokens
        assert usage.input_token_details.audio_tokens == int(10 * seconds)


async def test_server_vad_turn_timing_and_incremental_feed(server):
    pcm = utterance("Please book a table for two at eight.", lead_ms=1000, tail_ms=1500)
    onset, speech_end = speech_bounds_ms(pcm)
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.append(pcm)
        started = await c.expect("input_audio_buffer.speech_started")
        stopped = await c.expect("input_audio_buffer.speech_stopped")
        committed = await c.expect("input_audio_buffer.committed")
        # audio_start_ms includes the 300 ms prefix padding; audio_end_ms the 500 ms silence.
        assert abs(started.audio_start_ms - (onset - 300)) <= 60, (started.audio_start_ms, onset)
        assert abs(stopped.audio_end_ms - (speech_end + 500)) <= 80, (stopped.audio_end_ms, speech_end)
        assert started.item_id == stopped.item_id == committed.item_id
        response = await c.until("response.done")  # create_response defaults to true
        assert response[-1].response.status == "completed"
        assert audio_of(response)

        def fed():  # what the pipeline was told while the user spoke
            for s in server.server.pipeline.sessions:
                for item_id, samples in s.commits:
                    if item_id == committed.item_id:
                        return samples, s.pauses
            return None

        samples, pauses = await server.acall(fed)
    expected = (stopped.audio_end_ms - started.audio_start_ms) * 16
    assert abs(samples - expected) <= 16 * 20, (samples, expected)
    assert pauses >= 1  # the short silence before the end of the turn was reported


async def test_barge_in_cancels_at_once_and_keeps_only_sent_audio(slow_server):
    srv = slow_server
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story."}]}})
        await c.send({"type": "response.create"})
        created = await c.expect("response.created")
        for _ in range(10):
            await c.expect("response.output_audio.delta")
        await c.append(utterance("Stop, stop please.", lead_ms=200, tail_ms=800))
        events = await c.until("response.done")
        done = events[-1]
        mark = len(c.events)
        assert done.response.id == created.response.id
        assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
        types = [e.type for e in events]
        after = types[types.index("input_audio_buffer.speech_started") :]
        assert "response.output_audio.delta" not in after, "audio of the cancelled response arrived after speech_started"
        item = done.response.output[0]
        assert item.status == "incomplete"
        heard = audio_of(c.events)
        await c.send({"type": "conversation.item.retrieve", "item_id": item.id})
        retrieved = await c.expect("conversation.item.retrieved")
        kept = base64.b64decode(retrieved.item.content[0].audio)
        assert kept == heard  # exactly the audio the client received, no more
        words = item.content[0].transcript.split()
        whole = len(heard) // WORD_BYTES
        # A cut exactly at the end of a word whose successor's text has not come yet cannot tell
        # whether that word's audio was all of it (the last segment's length is estimated); the
        # transcript then keeps only what was surely heard, as truncation must (never more).
        at_boundary = len(heard) % WORD_BYTES == 0
        assert 0 < len(words) < 40 and (len(words) == whole or (at_boundary and len(words) == whole - 1)), (len(words), len(heard) / WORD_BYTES)
        # The user's interrupting turn is then answered normally.
        await c.first("input_audio_buffer.committed", since=mark)
        nxt = await c.first("response.created", since=mark)
        assert nxt.response.id != created.response.id
        await c.send({"type": "response.cancel"})
        assert (await c.expect("response.done")).response.status == "cancelled"


async def test_response_cancel(slow_server):
    srv = slow_server
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "response.create"})
        await c.expect("response.output_audio.delta")
        await c.send({"type": "response.cancel", "event_id": "cancel-1"})
        done = await c.expect("response.done")
        assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
        await c.send({"type": "response.cancel", "event_id": "cancel-2"})
        err = await c.expect("error")
        assert err.error.code == "response_cancel_not_active" and err.error.event_id == "cancel-2"
    stats = await srv.acall(srv.server.pipeline.stats)
    assert stats["active_responses"] == 0


async def test_truncate_trims_audio_and_transcript_to_what_was_heard(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": MANUAL})
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "the weather"}]}})
        await c.send({"type": "response.create"})
        done = await c.expect("response.done")
        item = done.response.output[0]
        assert item.content[0].transcript == "You said the weather."
        await c.send({"type": "conversation.item.truncate", "item_id": item.id, "content_index": 0, "audio_end_ms": 500})
        truncated = await c.expect("conversation.item.truncated")
        assert (truncated.item_id, truncated.content_index, truncated.audio_end_ms) == (item.id, 0, 500)
        await c.send({"type": "conversation.item.retrieve", "item_id": item.id})
        got = (await c.expect("conversation.item.retrieved")).item
        assert len(base64.b64decode(got.content[0].audio)) == 500 * 24 * 2
        assert got.content[0].transcript == "You said"  # two 240 ms words fit in 500 ms
        # The next response sees the truncated history.
        await c.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        assert (await c.expect("response.done")).response.status == "completed"

        await c.send({"type": "conversation.item.truncate", "item_id": item.id, "content_index": 0, "audio_end_ms": 5000})
        err = await c.expect("error")
        assert err.error.code == "invalid_value" and err.error.param == "audio_end_ms"
        await c.send({"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0, "audio_end_ms": 10})
        err = await c.expect("error")
        assert err.error.code == "item_truncate_invalid_item_id" and err.error.param == "item_id"


async def test_items_create_retrieve_delete_and_ordering(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")

        async def create(item, **kw):
            await c.send({"type": "conversation.item.create", "item": item, **kw})
            return await c.expect("conversation.item.added")

        a = await create({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]})
        assert a.previous_item_id is None and a.item.content[0].text == "first"
        b = await create({"id": "item_custom_b", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "second"}]})
        assert b.item.id == "item_custom_b" and b.previous_item_id == a.item.id
        s = await create({"type": "message", "role": "system", "content": [{"type": "input_text", "text": "be brief"}]}, previous_item_id="root")
        assert s.previous_item_id is None
        mid = await create({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "between"}]}, previous_item_id=a.item.id)
        assert mid.previous_item_id == a.item.id
        call = await create({"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"q\": 1}"})
        assert call.item.type == "function_call" and call.item.call_id == "call_1"
        out = await create({"type": "function_call_output", "call_id": "call_1", "output": "42"})
        assert out.previous_item_id == call.item.id

        audio = base64.b64encode(espeak("hello").astype("<i2").tobytes()).decode()
        voiced = await create({"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]})
        assert voiced.item.content[0].transcript is None  # the transcript arrives by event
        done = await c.expect("conversation.item.input_audio_transcription.completed")
        assert done.item_id == voiced.item.id

        await c.send({"type": "conversation.item.retrieve", "item_id": voiced.item.id})
        got = (await c.expect("conversation.item.retrieved")).item
        back = np.frombuffer(base64.b64decode(got.content[0].audio), "<i2")
        assert abs(len(back) - len(espeak("hello"))) <= 2  # 24 kHz -> 16 kHz -> 24 kHz
        assert got.content[0].transcript == done.transcript

        await c.send({"type": "conversation.item.delete", "item_id": b.item.id})
        assert (await c.expect("conversation.item.deleted")).item_id == b.item.id
        for verb in ("retrieve", "delete"):
            await c.send({"type": f"conversation.item.{verb}", "item_id": b.item.id})
            err = await c.expect("error")
            assert err.error.code == f"item_{verb}_invalid_item_id" and err.error.param == "item_id"
        await c.send({"type": "conversation.item.create", "previous_item_id": "item_missing", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}})
        err = await c.expect("error")
        assert err.error.code == "item_create_invalid_previous_item_id" and err.error.param == "previous_item_id"
        # A response now answers the function result in the history (the last item).
        await c.send({"type": "response.create", "response": {"input": [{"type": "item_reference", "id": out.item.id}], "conversation": "none", "output_modalities": ["text"]}})
        done = await c.expect("response.done")
        assert done.response.output[0].content[0].text == "The tool returned 42."


async def test_out_of_band_response_stays_out_of_the_conversation(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": MANUAL})
        await c.send({
            "type": "response.create",
            "response": {
                "conversation": "none",
                "metadata": {"purpose": "classify"},
                "output_modalities": ["text"],
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "out of band"}]}],
            },
        })
        events = await c.until("response.done")
        created, done = c.of("response.created")[0], events[-1]
        assert created.response.conversation_id is None and done.response.conversation_id is None
        metadata = done.response.metadata
        assert metadata["purpose"] == "classify"  # the client's keys, and the server's timings beside them
        assert set(metadata) - {"purpose"} == {"timing.first_output_ms"}  # text only: no audio delta
        assert 0 <= float(metadata["timing.first_output_ms"]) < 1000
        assert "conversation.item.added" not in [e.type for e in events]
        assert done.response.output[0].content[0].text == "You said out of band."
        item_id = done.response.output[0].id
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        assert (await c.expect("error")).error.code == "item_retrieve_invalid_item_id"


async def test_out_of_band_runs_beside_an_in_band_response(slow_server):
    srv = slow_server
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "response.create"})
        first = await c.expect("response.created")
        await c.send({"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"]}})
        second = await c.expect("response.created")
        assert second.response.conversation_id is None
        await c.send({"type": "response.create"})
        err = await c.expect("error")
        assert err.error.code == "conversation_already_has_active_response"
        await c.send({"type": "response.cancel", "response_id": first.response.id})
        done = [e for e in await c.until("response.done") if e.type == "response.done"]
        await c.send({"type": "response.cancel", "response_id": second.response.id})
        while len(done) < 2:
            done.append(await c.expect("response.done"))
        assert {d.response.id for d in done} == {first.response.id, second.response.id}


@pytest.mark.parametrize("fmt", ["audio/pcmu", "audio/pcma"])
async def test_g711_round_trip(make_server, fmt):
    srv = make_server(audio="echo", reply="echo")
    wire = WireFormat.from_mime(fmt)
    speech = utterance("Testing the telephone line.", lead_ms=500, tail_ms=1000, rate=8000)
    onset, _ = speech_bounds_ms(speech, rate=8000)
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": fmt}}, "output": {"format": {"type": fmt}}}}})
        s = (await c.expect("session.updated")).session
        assert s.audio.input.format.type == fmt and s.audio.output.format.type == fmt
        await c.append(wire.encode(speech), rate=8000, sample_bytes=1)
        started = await c.expect("input_audio_buffer.speech_started")
        assert abs(started.audio_start_ms - (onset - 300)) <= 60
        committed = await c.expect("input_audio_buffer.committed")
        done_events = await c.until("response.done")
        echoed = wire.decode(audio_of(done_events))
        await c.send({"type": "conversation.item.retrieve", "item_id": committed.item_id})
        sent = wire.decode(base64.b64decode((await c.expect("conversation.item.retrieved")).item.content[0].audio))
    # The user's audio came back through G.711 -> 16 kHz -> 24 kHz -> G.711: same speech.
    n = min(len(sent), len(echoed))
    assert abs(len(sent) - len(echoed)) <= 80 and n > 8000
    a, b = sent[:n].astype(float), echoed[:n].astype(float)
    assert np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)) > 0.9
    assert rms(echoed) > 500


async def test_beta_client_gets_beta_names_and_shapes(server):
    """The SDK's beta client (header ``OpenAI-Beta: realtime=v1``), validated against the SDK's beta models."""
    async with connect(server.ws_base, beta=True) as c:
        created = await c.expect("session.created")
        assert created.session.modalities == ["text", "audio"] and created.session.input_audio_format == "pcm16"
        assert created.session.turn_detection.type == "server_vad"
        await c.send({
            "type": "session.update",
            "session": {
                "modalities": ["text", "audio"],
                "voice": "alloy",
                "input_audio_format": "pcm16",
                "output_audio_format": "g711_ulaw",
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
                "input_audio_transcription": {"model": "whisper-1"},
                "instructions": "Be brief.",
                "temperature": 0.7,
                "max_response_output_tokens": 50,
            },
        })
        s = (await c.expect("session.updated")).session
        assert (s.voice, s.output_audio_format, s.instructions, s.max_response_output_tokens) == ("alloy", "g711_ulaw", "Be brief.", 50)
        assert s.turn_detection.silence_duration_ms == 400 and s.turn_detection.threshold == 0.5
        assert s.input_audio_transcription.model == "whisper-1"
        await c.append(utterance("Hello from an old client."))
        events = await c.until("response.done")
        types = {e.type for e in c.events}
        assert {"conversation.item.created", "response.audio.delta", "response.audio_transcript.delta", "response.audio.done", "response.audio_transcript.done"} <= types
        assert not {t for t in types if t.startswith("response.output_audio") or t == "conversation.item.added"}
        item = events[-1].response.output[0]
        words = len(item.content[0].transcript.split())
        assert len(audio_of(events, "response.audio.delta")) == words * 240 * 8  # g711: 1 byte a sample at 8 kHz
        assert item.content[0].type == "audio" and events[-1].response.output_audio_format == "g711_ulaw"


async def test_beta_shaped_events_on_a_ga_connection(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"modalities": ["text"], "turn_detection": None, "input_audio_format": "g711_alaw"}})
        s = (await c.expect("session.updated")).session
        assert s.output_modalities == ["text"] and s.audio.input.turn_detection is None
        assert s.audio.input.format.type == "audio/pcma"
        await c.send({"type": "response.create", "response": {"modalities": ["text"], "max_response_output_tokens": 2}})
        done = await c.expect("response.done")
        assert done.response.status == "incomplete" and done.response.status_details.reason == "max_output_tokens"
        assert done.response.output[0].content[0].text == "You said"


async def test_text_output_modality(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await c.expect("session.updated")
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await c.send({"type": "response.create"})
        events = await c.until("response.done")
        assert not [e for e in events if "audio" in e.type]
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "You said hi."
        part = next(e for e in events if e.type == "response.content_part.added").part
        assert part.type == "text"
        assert c.of("response.output_text.done")[-1].text == "You said hi."
        assert events[-1].response.output[0].content[0].type == "output_text"


async def test_function_calling_round_trip(server):
    tool = {"type": "function", "name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [tool], "tool_choice": "auto"}})
        assert (await c.expect("session.updated")).session.tools[0].name == "get_weather"
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "get_weather"}}})
        events = await c.until("response.done")
        assert skeleton(events) == [
            "response.created", "rate_limits.updated", "response.output_item.added", "conversation.item.added",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done", "conversation.item.done", "response.done",
        ]
        call = events[-1].response.output[0]
        assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
        assert json.loads(call.arguments) == {"city": "example"}  # fits the schema (no user words to take a name from)
        await c.send({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}})
        await c.expect("conversation.item.added")
        await c.send({"type": "response.create"})
        done = await c.expect("response.done")
        assert done.response.output[0].content[0].transcript == "The tool returned sunny."
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "nope"}}})
        err = await c.expect("error")
        assert err.error.param == "response.tool_choice.name"
        # tool_choice "auto": words that name no tool get an answer; words that name one, a call
        for text, called in (("Tell me a joke.", None), ("What is the weather like in Paris today?", {"city": "Paris"})):
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
            await c.expect("conversation.item.done")
            await c.send({"type": "response.create"})
            out = (await c.expect("response.done")).response.output[0]
            assert (json.loads(out.arguments) if out.type == "function_call" else None) == called


@pytest.mark.slow
async def test_idle_timeout_prompts_the_user(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 500}}}}})
        assert (await c.expect("session.updated")).session.audio.input.turn_detection.idle_timeout_ms == 500
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        await c.send({"type": "response.create"})
        done = await c.expect("response.done")
        playback = len(audio_of(c.events)) / 48000  # seconds of audio the client now plays
        loop = asyncio.get_running_loop()
        t_done = loop.time()

        async def silence_stream():  # the user stays silent (in real time)
            while True:
                await c.append(silence(20))
                await asyncio.sleep(0.02)  # the test's input: 20 ms of silence every 20 ms

        streamer = asyncio.create_task(silence_stream())
        try:
            fired = await c.expect("input_audio_buffer.timeout_triggered", timeout=playback + 5)
            waited = loop.time() - t_done
            assert playback + 0.4 <= waited <= playback + 1.5, (waited, playback)
            assert fired.audio_end_ms > fired.audio_start_ms
            committed = await c.expect("input_audio_buffer.committed")
            assert committed.item_id == fired.item_id
            assert (await c.expect("response.created")).response.id != done.response.id
        finally:
            streamer.cancel()


async def test_output_audio_buffer_clear_cuts_the_response(slow_server):
    srv = slow_server
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "response.create"})
        created = await c.expect("response.created")
        await c.expect("response.output_audio.delta")
        await c.send({"type": "output_audio_buffer.clear"})
        events = await c.until("output_audio_buffer.cleared")
        done = next(e for e in events if e.type == "response.done")
        assert done.response.id == created.response.id and done.response.status == "cancelled"
        assert events[-1].response_id == created.response.id
        assert not [e for e in events[events.index(done):] if e.type == "response.output_audio.delta"]


TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


@pytest.mark.parametrize(
    "stop,conversation", [("response.cancel", "auto"), ("response.cancel", "none"), ("output_audio_buffer.clear", "auto")]
)
async def test_create_then_cancel_at_once_ends_the_response_and_the_session_responds_again(slow_server, stop, conversation):
    """create + cancel back to back (the cancel lands before the response's task first runs):
    response.created, then response.done cancelled, and the next response.create works."""
    async with connect(slow_server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": MANUAL})
        await c.expect("session.updated")
        response = {"conversation": conversation}
        for raw in ({"type": "conversation.item.create", "item": TEXT_ITEM}, {"type": "response.create", "response": response}, {"type": stop}):
            await c.send_raw(json.dumps(raw))
        created = await c.expect("response.created")
        done = await c.expect("response.done")
        assert done.response.id == created.response.id
        assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
        await c.send({"type": "response.create", "response": {"conversation": conversation}})
        created2 = await c.expect("response.created")
        assert created2.response.id != created.response.id
        await c.send({"type": "response.cancel"})
        done2 = await c.expect("response.done")
        assert done2.response.id == created2.response.id and done2.response.status == "cancelled"
    stats = await slow_server.acall(slow_server.server.pipeline.stats)
    assert stats["active_responses"] == 0


async def test_transcription_session_transcribes_each_turn_and_never_answers(server):
    """``?intent=transcription`` (or ``session.type: "transcription"``): VAD turns are committed and
    transcribed, no response is ever created, and session objects have the transcription shape."""
    async with connect(server.ws_base, extra_query={"intent": "transcription"}) as c:
        created = await c.expect("session.created")
        assert created.session.type == "transcription"
        assert created.session.audio.input.transcription.model  # on by default: it is the point
        for text in ("Please book a table for two at eight.", "And a taxi at ten."):
            await c.append(utterance(text, lead_ms=500, tail_ms=1200))
            await c.first("conversation.item.input_audio_transcription.completed", since=len(c.events))
        await c.send({"type": "response.create"})
        refused = await c.expect("error")
        assert refused.error.code == "unsupported_value" and refused.error.param == "session.type"
        await c.quiet(0.5)
        # the GA session.update can turn it back into a voice agent
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        updated = await c.expect("session.updated")
        assert updated.session.type == "realtime" and updated.session.instructions == "Be brief."
        await c.append(utterance("What now?", lead_ms=300, tail_ms=1200))
        done = await c.first("response.done", since=len(c.events))
    types = [e.type for e in c.events]
    third_turn = [i for i, t in enumerate(types) if t == "input_audio_buffer.speech_started"][2]
    assert not [t for t in types[:third_turn] if t.startswith("response.")]
    assert types[:third_turn].count("conversation.item.input_audio_transcription.completed") == 2
    assert types[:third_turn].count("input_audio_buffer.committed") == 2
    assert done.response.status == "completed"


async def test_session_update_to_transcription_mid_session(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}}})
        updated = await c.expect("session.updated")
        assert updated.session.type == "transcription"
        assert updated.session.audio.input.turn_detection.silence_duration_ms == 400
        await c.append(utterance("Please book a table for two at eight.", lead_ms=500, tail_ms=1200))
        await c.first("conversation.item.input_audio_transcription.completed")
        await c.quiet(0.8)
    assert not [e for e in c.events if e.type.startswith("response.")]


async def test_beta_transcription_session_update(server):
    """A beta client's ``transcription_session.update`` makes a transcription session (answered with
    the beta ``session.updated``: the SDK's beta TranscriptionSession needs a client secret and
    OpenAI's own model names, which this server has not got)."""
    async with connect(server.ws_base, beta=True) as c:
        await c.expect("session.created")
        await c.conn.transcription_session.update(session={"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}})
        updated = await c.expect("session.updated")
        assert updated.session.turn_detection.silence_duration_ms == 400
        await c.append(utterance("Please book a table for two at eight.", lead_ms=500, tail_ms=1200))
        completed = await c.first("conversation.item.input_audio_transcription.completed")
        assert completed.transcript
        await c.send({"type": "response.create"})
        assert (await c.expect("error")).error.code == "unsupported_value"
    assert not [e for e in c.events if e.type.startswith("response.")]
