"""Bad input: each mistake gets an OpenAI-shaped ``error`` naming what was wrong, and the session
carries on (proved after each one by a normal round trip), with other sessions unaffected."""

from __future__ import annotations

import base64
import json

import pytest

from tests.support.client import connect

MANUAL = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


async def still_alive(c) -> None:
    await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "still here"}})
    updated = await c.expect("session.updated")
    assert updated.session.instructions == "still here"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


RAW_CASES = [
    ("{not json", "invalid_json", None),
    ("[1, 2, 3]", "invalid_event", None),
    ('"just a string"', "invalid_event", None),
    ("{}", "missing_required_parameter", "type"),
    ('{"type": 7}', "invalid_value", "type"),
    ('{"type": "conversation.frobnicate"}', "invalid_value", "type"),
    ('{"type": "input_audio_buffer.commit", "surprise": 1}', "unknown_parameter", "surprise"),
    ('{"type": "input_audio_buffer.append"}', "missing_required_parameter", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": 5}', "invalid_type", "audio"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}}', "invalid_value", "item.role"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "system", "content": [{"type": "input_audio", "audio": "AAAA"}]}}', "invalid_value", "item.content[0].type"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}}', "unsupported_value", "item.content[0]"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "%%%"}]}}', "invalid_value", "item.content[0].audio"),
    ('{"type": "conversation.item.truncate", "item_id": "x", "content_index": -1, "audio_end_ms": 0}', "invalid_value", "content_index"),
    ('{"type": "response.create", "response": {"conversation": "conv_other"}}', "invalid_value", "response.conversation"),
    ('{"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "item_nope"}]}}', "invalid_value", "response.input[0].id"),
    ('{"type": "response.create", "response": {"voice": "nobody"}}', "invalid_value", "response.voice"),
    ('{"type": "response.create", "response": {"metadata": {"k": 5}}}', "invalid_type", "response.metadata"),
]


@pytest.mark.parametrize("raw,code,param", RAW_CASES, ids=[c[0][:40] for c in RAW_CASES])
async def test_malformed_events(server, raw, code, param):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send_raw(raw)
        err = await c.expect("error")
        assert err.error.type == "invalid_request_error"
        assert (err.error.code, err.error.param) == (code, param), err.error.message
        assert err.error.message
        await still_alive(c)


# Messages that once ended the session (the decoder raised past the codec): nesting deep inside a
# field, JSON that breaks after a type error, invalid UTF-8 in a binary frame.
UNREADABLE = [
    b'{"type":"session.update","session":{"instructions":' + b"[" * 1000 + b"]" * 1000 + b"}}",
    b'{"type":"input_audio_buffer.clear","x":' + b"[" * 1000 + b"]" * 1000 + b"}",
    '{"type": 0x10}',
    '{"type":"session.update","session":{"a":1}}}',
    '{"type":"conversation.item.retrieve","item_id":5 x}',
    b'{"type":"\xff\xfe"}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("raw", UNREADABLE, ids=range(len(UNREADABLE)))
async def test_unreadable_messages_get_invalid_json_and_the_session_lives_on(server, raw):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send_raw(raw)
        err = await c.expect("error")
        assert (err.error.type, err.error.code) == ("invalid_request_error", "invalid_json" if raw[:1] != b"[" else "invalid_event")
        await still_alive(c)
    assert await server.acall(lambda: server.server.healthy)


SESSION_CASES = [
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 3}}}}, "invalid_value", "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": "long"}}}}, "invalid_type", "session.audio.input.turn_detection.silence_duration_ms"),
    ({"audio": {"input": {"turn_detection": {"type": "magic_vad"}}}}, "invalid_value", "session.audio.input.turn_detection.type"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "invalid_value", "session.audio.input.format.rate"),
    ({"audio": {"output": {"format": {"type": "audio/mp3"}}}}, "invalid_value", "session.audio.output.format.type"),
    ({"audio": {"output": {"voice": "nobody"}}}, "invalid_value", "session.audio.output.voice"),
    ({"audio": {"output": {"speed": 9}}}, "invalid_value", "session.audio.output.speed"),
    ({"output_modalities": []}, "invalid_value", "session.output_modalities"),
    ({"output_modalities": ["video"]}, "invalid_value", "session.output_modalities[0]"),
    ({"max_output_tokens": 0}, "invalid_value", "session.max_output_tokens"),
    ({"max_output_tokens": "lots"}, "invalid_value", "session.max_output_tokens"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "missing_required_parameter", "session.tools[0].server_url"),
    ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9/mcp"}]}, "mcp_server_not_allowed", "session.tools[0].server_url"),
    ({"tools": [{"type": "mcp", "server_label": "x", "connector_id": "connector_gmail"}]}, "unsupported_value", "session.tools[0].connector_id"),
    ({"tools": [{"type": "mcp", "server_url": "http://127.0.0.1:9/mcp"}]}, "missing_required_parameter", "session.tools[0].server_label"),
    ({"tools": [{"type": "function"}]}, "missing_required_parameter", "session.tools[0].name"),
    ({"tool_choice": {"type": "function", "name": "ghost"}}, "invalid_value", "session.tool_choice.name"),
    ({"type": "translation"}, "invalid_value", "session.type"),
    ({"prompt": {"id": "pmpt_1"}}, "unsupported_value", "session.prompt"),
    ({"colour": "blue"}, "unknown_parameter", "session.colour"),
    ({"turn_detection": {"type": "server_vad", "prefix_padding_ms": -5}}, "invalid_value", "session.turn_detection.prefix_padding_ms"),
    ({"input_audio_format": "mp3"}, "invalid_value", "session.input_audio_format"),
]


@pytest.mark.parametrize("session,code,param", SESSION_CASES, ids=[c[2] for c in SESSION_CASES])
async def test_invalid_session_values_change_nothing(server, session, code, param):
    async with connect(server.ws_base) as c:
        before = (await c.expect("session.created")).session
        await c.send({"type": "session.update", "event_id": "evt_bad", "session": {**session, "instructions": "changed"}})
        err = await c.expect("error")
        assert (err.error.code, err.error.param, err.error.event_id) == (code, param, "evt_bad"), err.error.message
        # A failed update changes nothing: the next update reports the old values plus its own.
        await c.send({"type": "session.update", "session": {"type": "realtime", "model": before.model}})
        after = (await c.expect("session.updated")).session
        assert after.model_dump() == before.model_dump()


async def test_audio_errors(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": MANUAL})
        await c.expect("session.updated")

        await c.send({"type": "input_audio_buffer.append", "audio": "not base64!", "event_id": "e1"})
        err = await c.expect("error")
        assert (err.error.code, err.error.param, err.error.event_id) == ("invalid_value", "audio", "e1")

        await c.send({"type": "input_audio_buffer.append", "audio": b64(b"\x00\x01\x02")})  # pcm16 needs whole samples
        err = await c.expect("error")
        assert (err.error.code, err.error.param) == ("invalid_value", "audio")
        assert "2-byte samples" in err.error.message

        big = b64(bytes(16 * 1024 * 1024))  # over the 15 MiB per append
        await c.send({"type": "input_audio_buffer.append", "audio": big})
        err = await c.expect("error")
        assert (err.error.code, err.error.param) == ("string_above_max_length", "audio")

        await c.send({"type": "input_audio_buffer.commit"})  # nothing valid was appended
        err = await c.expect("error")
        assert err.error.code == "input_audio_buffer_commit_empty"

        # The session still takes audio and answers.
        await c.send({"type": "input_audio_buffer.append", "audio": b64(bytes(24000 * 2))})
        await c.send({"type": "input_audio_buffer.commit"})
        committed = await c.expect("input_audio_buffer.committed")
        transcript = await c.expect("conversation.item.input_audio_transcription.completed")
        assert transcript.item_id == committed.item_id and transcript.transcript == "1.0 seconds of audio"


async def test_buffer_cap_in_manual_mode(make_server):
    srv = make_server(limits={"max_buffer_seconds": 2})
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": MANUAL})
        await c.send({"type": "input_audio_buffer.append", "audio": b64(bytes(24000 * 2 * 2))})  # 2 s: fits
        await c.send({"type": "input_audio_buffer.append", "audio": b64(bytes(4800))})  # 100 ms more: does not
        err = await c.expect("error")
        assert err.error.code == "input_audio_buffer_full"
        await c.send({"type": "input_audio_buffer.clear"})
        await c.expect("input_audio_buffer.cleared")
        await c.send({"type": "input_audio_buffer.append", "audio": b64(bytes(4800))})
        await c.send({"type": "input_audio_buffer.commit"})
        await c.expect("input_audio_buffer.committed")


async def test_response_while_one_is_active(slow_server):
    srv = slow_server
    async with connect(srv.ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "response.create"})
        created = await c.expect("response.created")
        await c.send({"type": "response.create", "event_id": "second"})
        err = await c.expect("error")
        assert (err.error.code, err.error.event_id) == ("conversation_already_has_active_response", "second")
        assert created.response.id in err.error.message
        # The first response is untouched and can still be cancelled.
        await c.send({"type": "response.cancel"})
        done = await c.expect("response.done")
        assert done.response.id == created.response.id and done.response.status == "cancelled"


async def test_errors_in_one_session_do_not_touch_another(server):
    async with connect(server.ws_base) as bad, connect(server.ws_base) as good:
        await bad.expect("session.created")
        await good.expect("session.created")
        await good.send({"type": "conversation.item.create", "item": TEXT_ITEM})
        for raw in ("{", "[]", '{"type": "x"}', json.dumps({"type": "input_audio_buffer.append", "audio": "!!"})) * 5:
            await bad.send_raw(raw)
        await good.send({"type": "response.create"})
        done = await good.expect("response.done")
        assert done.response.status == "completed"
        assert not good.of("error")
        assert len([e for e in await bad.quiet(0.5) if e.type == "error"]) + len(bad.of("error")) >= 20
