"""JSON ``null`` in a client event's optional fields, as the official SDK's GA models define them.

Clients built on those models send ``null`` for "not given" (LiveKit's plugin sends
``"instructions": null`` in every ``response.create`` it makes without instructions). For every
field of a set of complete example events, the SDK's own pydantic model says whether it is optional;
the test sets that one field to ``null`` and decodes the event:

* optional in the SDK: the event decodes exactly as if the field were absent (or, where absence is
  itself an error here, is refused naming the same field), except where ``null`` means something of
  its own (``turn_detection: null`` is manual turns, ``transcription: null`` no transcripts, ...);
* required in the SDK: refused, with ``param`` naming exactly that field.

Then the same over a socket: LiveKit's and the Agents SDK's shapes get their answers.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from typing import Any

import pytest
from openai.types.realtime.realtime_client_event import RealtimeClientEvent
from pydantic import BaseModel

from realtime_omni.errors import RealtimeError
from realtime_omni.protocol.codec import decode_client_event
from tests.support.client import connect

# null has a meaning of its own in these fields (the last one or two names of a field's path)
NULL_MEANS_SOMETHING = {
    "event_id", "previous_item_id", "response", "response_id",  # none given
    "turn_detection", "transcription", "noise_reduction", "idle_timeout_ms",  # off
    "tracing", "include", "prompt", "reasoning", "metadata",  # none / off
    ("transcription", "model"), ("transcription", "language"),  # the server's model; the language unknown
    ("content", "audio"), ("content", "transcript"),  # of an audio part: none given (the server itself sends "transcript": null)
}  # fmt: skip


def null_means_something(path: tuple) -> bool:
    names = [p for p in path if isinstance(p, str)]
    return names[-1] in NULL_MEANS_SOMETHING or tuple(names[-2:]) in NULL_MEANS_SOMETHING


EXAMPLES: list[dict[str, Any]] = [
    {"type": "session.update", "event_id": "e1", "session": {
        "type": "realtime", "model": "gpt-realtime", "instructions": "Be brief.", "output_modalities": ["audio"],
        "max_output_tokens": 200, "tool_choice": "auto", "parallel_tool_calls": True,
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {}}}],
        "tracing": "auto", "truncation": "auto", "include": ["item.input_audio_transcription.logprobs"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "whisper-1", "language": "en", "prompt": "names"},
                "noise_reduction": {"type": "near_field"},
                "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
                                   "create_response": True, "interrupt_response": True, "idle_timeout_ms": 5000}},
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin", "speed": 1.0}}}},
    {"type": "session.update", "session": {
        "type": "realtime", "tool_choice": {"type": "function", "name": "get_weather"}, "tools": [{"type": "function", "name": "get_weather"}],
        "tracing": {"workflow_name": "w", "group_id": "g", "metadata": {}},
        "truncation": {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 100}},
        "audio": {"input": {"format": {"type": "audio/pcmu"},
                            "turn_detection": {"type": "semantic_vad", "eagerness": "low", "create_response": True, "interrupt_response": True}},
                  "output": {"voice": {"id": "v1"}}}}},
    {"type": "response.create", "event_id": "e2", "response": {
        "conversation": "none", "instructions": "Hi", "max_output_tokens": "inf", "metadata": {"a": "b"}, "output_modalities": ["text"],
        "tool_choice": "required", "parallel_tool_calls": False, "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {}}],
        "audio": {"output": {"format": {"type": "audio/pcma"}, "voice": "marin"}},
        "input": [{"type": "item_reference", "id": "item_1"}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}},
    {"type": "conversation.item.create", "previous_item_id": "root", "item": {
        "type": "message", "role": "user", "id": "item_a", "object": "realtime.item", "status": "completed",
        "content": [{"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": "AAAA", "transcript": "x"}]}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}, {"type": "output_audio", "audio": "AAAA", "transcript": "x"}]}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "conversation.item.create", "item": {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1", "id": "item_b", "object": "realtime.item", "status": "completed"}},
    {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "c1", "output": "42", "id": "item_c", "object": "realtime.item", "status": "completed"}},
    {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 10},
    {"type": "conversation.item.retrieve", "item_id": "i"},
    {"type": "conversation.item.delete", "item_id": "i"},
    {"type": "input_audio_buffer.append", "audio": "AAAA"},
    {"type": "response.cancel", "response_id": "r"},
]  # fmt: skip


def _members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _literals(annotation: Any) -> set[Any]:
    return {v for m in _members(annotation) if typing.get_origin(m) is typing.Literal for v in typing.get_args(m)}


def _model_for(annotation: Any, value: Any) -> type[BaseModel] | None:
    """The SDK model among ``annotation``'s that ``value`` is an instance of (its literal fields agree)."""
    if not isinstance(value, dict):
        return None
    models = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    for model in models:
        tags = {k: _literals(f.annotation) for k, f in model.model_fields.items() if k in ("type", "role")}
        if all(value.get(k) in allowed for k, allowed in tags.items() if allowed and k in value):
            return model
    return None


def sdk_fields(model: type[BaseModel], value: dict[str, Any], path: tuple = ()):
    """(path, optional in the SDK) for every field ``value`` sets, at any depth."""
    for key, v in value.items():
        field = model.model_fields[key]
        yield path + (key,), type(None) in _members(field.annotation)
        children = [(path + (key,), field.annotation, v)] if isinstance(v, dict) else []
        if isinstance(v, list):
            inner = [typing.get_args(m)[0] for m in _members(field.annotation) if typing.get_origin(m) is list]
            children = [(path + (key, i), inner[0], x) for i, x in enumerate(v) if inner and isinstance(x, dict)]
        for sub_path, annotation, sub in children:
            sub_model = _model_for(annotation, sub)
            if sub_model is not None:
                yield from sdk_fields(sub_model, sub, sub_path)


def _param(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def _with(event: dict[str, Any], path: tuple, value: Any = ...) -> dict[str, Any]:
    event = copy.deepcopy(event)
    node = event
    for p in path[:-1]:
        node = node[p]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return event


def _decode(event: dict[str, Any]) -> Any:
    try:
        return decode_client_event(json.dumps(event))
    except RealtimeError as err:
        return err


CASES = [
    (example, path, optional)
    for example in EXAMPLES
    for path, optional in sdk_fields(_model_for(RealtimeClientEvent, example), example)
    if path[-1] != "type" or len(path) == 1  # a union member's tag: null is no member (the SDK's "optional" tags are its laxity)
]


def test_the_examples_cover_every_optional_field_named_by_the_issue():
    optional = {_param(path) for _, path, opt in CASES if opt}
    for name in ("audio", "conversation", "input", "instructions", "max_output_tokens", "metadata", "output_modalities",
                 "parallel_tool_calls", "tool_choice", "tools"):  # fmt: skip
        assert f"response.{name}" in optional
    for name in ("model", "truncation", "tracing", "audio.input.format", "audio.output.format", "audio.output.speed", "audio.output.voice",
                 "instructions", "tools", "tool_choice", "output_modalities", "max_output_tokens"):  # fmt: skip
        assert f"session.{name}" in optional
    assert len(CASES) > 100


@pytest.mark.parametrize(("example", "path", "optional"), CASES, ids=[f"{e['type']}:{_param(p)}" for e, p, _ in CASES])
def test_null_in_a_field(example, path, optional):
    got = _decode(_with(example, path, None))
    if not optional:  # the SDK requires a value: refused, naming the field
        assert isinstance(got, RealtimeError), got
        assert got.param == _param(path), (got.param, got.message)
        return
    if null_means_something(path):
        assert not isinstance(got, RealtimeError), got.message
        return
    absent = _decode(_with(example, path))
    if isinstance(absent, RealtimeError):  # a value this server needs: null is refused like absence, same field
        assert isinstance(got, RealtimeError) and got.param == absent.param == _param(path), (got, absent)
    else:
        assert got == absent, f"null in {_param(path)} is not read as absent"


async def test_livekit_response_create_with_null_fields_is_answered(server):
    async with connect(server.ws_base) as c:
        await c.expect("session.created")
        # what livekit-plugins-openai 1.8.9 sends for generate_reply() without instructions, and its session.update
        await c.send({"type": "session.update", "session": {
            "type": "realtime", "model": "gpt-realtime", "instructions": None, "output_modalities": ["audio"], "tracing": None,
            "max_output_tokens": None, "tools": None, "tool_choice": None,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": None,
                                "transcription": {"model": "gpt-4o-mini-transcribe", "language": None, "prompt": None},
                                "turn_detection": {"type": "server_vad", "threshold": None, "prefix_padding_ms": None, "silence_duration_ms": None,
                                                   "create_response": True, "interrupt_response": True}},
                      "output": {"format": None, "voice": "marin", "speed": None}}}})  # fmt: skip
        updated = await c.expect("session.updated")
        td = updated.session.audio.input.turn_detection
        assert (td.threshold, td.prefix_padding_ms, td.silence_duration_ms) == (0.5, 300, 500)  # null kept the values
        assert updated.session.audio.output.speed == 1.0 and updated.session.audio.output.format.type == "audio/pcm"
        await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}})
        await c.expect("conversation.item.done")
        await c.send({"type": "response.create", "response": {"instructions": None, "metadata": None, "tools": None, "tool_choice": None,
                                                              "output_modalities": None, "conversation": None, "input": None}})  # fmt: skip
        events = await c.until("response.done")
        assert not [e for e in events if e.type == "error"]
        assert events[-1].response.status == "completed"
        # a required value stays required
        await c.send({"type": "conversation.item.truncate", "item_id": None, "content_index": 0, "audio_end_ms": 0, "event_id": "t1"})
        error = await c.expect("error")
        assert (error.error.param, error.error.event_id) == ("item_id", "t1")
