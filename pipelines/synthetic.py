"""The synthetic pipeline: a deterministic stand-in for a model, with latencies you set.

It exists for load tests, for measuring the server itself, and for developing clients without a
model. It runs the same stage structure as a real pipeline (a "thinker" producing words, a
"talker" turning them into audio, joined by a bounded queue) and answers:

* text: ``reply`` with ``{heard}`` replaced by what the user last said (a text message, or the
  synthetic transcript of their audio), ``{n}`` by the response number;
* audio: per word, ``word_ms`` of a tone whose pitch follows the word (``audio: tone``), or the
  user's last audio played back (``audio: echo``; the transcript is then still ``reply``);
* a tool call when the request forces one (``tool_choice`` "required" or a function name), or, with
  ``tool_choice`` "auto", when the user's last words name a tool (a word of four letters or more
  of its name: "What's the weather in Paris?" calls ``get_weather``); its arguments satisfy the
  tool's JSON schema (``arguments_for``); after a tool result, a reply that quotes it. An MCP
  server's tools reach it as tools like the functions (the session runs their calls), so it calls
  one the same way: "What is the weather in Paris?" calls an MCP server's ``weather``.

Timing: the first chunk leaves ``first_chunk_ms`` after the request, then a chunk of ``chunk_ms``
audio every ``chunk_interval_ms`` (0: as fast as possible), on an absolute schedule (no drift), and
optionally one stall of ``stall_ms`` before chunk number ``stall_after_chunks``.
Input transcripts are synthetic too: ``transcript`` formatted with the audio's ``{seconds}``, after
``transcribe_ms``. Faults, for fault-injection tests: ``fail_after_chunks`` raises in the talker
stage after that many chunks (a crashing TTS), ``transcribe_fails`` raises in transcription.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec
import numpy as np

from dsp.resample import resample

from pipelines.base import (
    AudioChunk,
    Capabilities,
    FunctionResult,
    Message,
    OutputChunk,
    Pipeline,
    PipelineSession,
    ResponseRequest,
    StageTimes,
    TextDelta,
    Tool,
    ToolCall,
    Transcript,
    Usage,
)
from pipelines.stages import chain


class SyntheticOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reply: str = "You said {heard}."
    audio: Literal["tone", "echo"] = "tone"
    first_chunk_ms: float = 0.0
    chunk_ms: int = 40
    chunk_interval_ms: float = 0.0
    stall_after_chunks: int = 0
    stall_ms: float = 0.0
    fail_after_chunks: int = 0  # > 0: the talker stage raises after this many chunks
    transcribe_ms: float = 0.0
    transcribe_fails: bool = False
    word_ms: int = 240
    transcript: str = "{seconds:.1f} seconds of audio"
    input_rate: int = 16000
    output_rate: int = 24000
    context_tokens: int = 8192
    images: bool = False  # declare image input (reply with "{images}": images seen in the last user turn)


class SyntheticPipeline(Pipeline):
    def __init__(self, options: SyntheticOptions | None = None) -> None:
        self.options = options or SyntheticOptions()
        o = self.options
        self.capabilities = Capabilities(
            name="synthetic",
            input_rate=o.input_rate,
            output_rate=o.output_rate,
            tools=True,
            transcribes_input=True,
            transcription_model="synthetic",
            voices=("tone",),
            context_tokens=o.context_tokens,
            images=o.images,
        )
        self.sessions: set[SyntheticSession] = set()
        self.active_responses = 0
        self.responses_started = 0

    def open(self, session_id: str, tenant: str | None = None) -> "SyntheticSession":
        session = SyntheticSession(self, session_id, tenant)
        self.sessions.add(session)
        return session

    def stats(self) -> dict[str, float]:
        return {
            "open_sessions": len(self.sessions),
            "active_responses": self.active_responses,
            "responses_started": self.responses_started,
        }


class SyntheticSession(PipelineSession):
    def __init__(self, pipeline: SyntheticPipeline, session_id: str, tenant: str | None = None) -> None:
        self.pipeline = pipeline
        self.options = pipeline.options
        self.session_id = session_id
        self.tenant = tenant  # (it caches nothing: kept for tests)
        self.prepared: deque[tuple[str, list[str]]] = deque(maxlen=16)  # what prepare() was told: instructions, tool names
        self.responses = 0
        # what the session engine told us about the open input buffer (observable in tests)
        self.fed_samples = 0
        self.pauses = 0
        self.resumes = 0
        self.commits: list[tuple[str, int]] = []  # (item id, samples fed for it)
        self._open_samples = 0

    def feed(self, pcm: np.ndarray) -> None:
        self.fed_samples += len(pcm)
        self._open_samples += len(pcm)

    def pause(self, request: ResponseRequest | None, answer: bool) -> None:
        self.pauses += 1

    def resume(self) -> None:
        self.resumes += 1

    def prepare(self, request: ResponseRequest) -> None:
        self.prepared.append((request.instructions, [t.name for t in request.tools]))

    def commit(self, item_id: str) -> None:
        self.commits.append((item_id, self._open_samples))
        self._open_samples = 0

    def clear(self) -> None:
        self._open_samples = 0

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript:
        if self.options.transcribe_ms:
            await asyncio.sleep(self.options.transcribe_ms / 1000.0)
        if self.options.transcribe_fails:
            raise RuntimeError("synthetic fault: the recogniser failed")
        seconds = len(pcm) / self.pipeline.capabilities.input_rate
        return Transcript(self.options.transcript.format(seconds=seconds), seconds)

    async def close(self) -> None:
        self.pipeline.sessions.discard(self)

    # ------------------------------------------------------------------ responding

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        self.responses += 1
        self.pipeline.responses_started += 1
        self.pipeline.active_responses += 1
        t0 = time.perf_counter()
        try:
            tool = self._tool_to_call(request)
            if tool is not None:
                await self._wait_until(t0, 0)
                arguments = json.dumps(arguments_for(tool.parameters or {"type": "object"}, self._heard(request).split()))
                yield ToolCall(call_id="", name=tool.name, arguments=arguments)
                yield self._usage(request, words=1)
                return
            words = self._reply(request).split()
            if request.max_output_tokens is not None:
                words = words[: request.max_output_tokens]
            audio = "audio" in request.output_modalities
            talker = self._talk(request, t0) if audio else self._type_out(t0)
            first = 0.0
            async with chain(self._think(words), talker, maxsize=4) as stream:
                async for chunk in stream:
                    first = first or time.perf_counter()
                    yield chunk
            yield self._usage(request, words=len(words))
            if first:
                yield StageTimes({"first_output": round((first - t0) * 1000, 1)})
        finally:
            self.pipeline.active_responses -= 1

    async def _think(self, words: list[str]) -> AsyncIterator[str]:
        """The thinker stage: one word at a time."""
        for i, word in enumerate(words):
            yield word if i == 0 else " " + word

    async def _wait_until(self, t0: float, chunk_index: int) -> None:
        o = self.options
        due = t0 + (o.first_chunk_ms + chunk_index * o.chunk_interval_ms) / 1000.0
        if o.stall_after_chunks and chunk_index >= o.stall_after_chunks:
            due += o.stall_ms / 1000.0
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

    def _type_out(self, t0: float):
        async def stage(words: AsyncIterator[str]) -> AsyncIterator[OutputChunk]:
            index = 0
            async for word in words:
                await self._wait_until(t0, index)
                index += 1
                yield TextDelta(word)

        return stage

    def _talk(self, request: ResponseRequest, t0: float):
        o, rate = self.options, self.pipeline.capabilities.output_rate
        chunk = max(1, o.chunk_ms * rate // 1000)
        echo = self._last_user_audio(request) if o.audio == "echo" else None

        async def segments(words: AsyncIterator[str]) -> AsyncIterator[tuple[str, np.ndarray]]:
            if echo is None:
                async for word in words:
                    yield word, tone(word.strip(), o.word_ms, rate)
            else:
                yield "".join([w async for w in words]), echo

        async def stage(words: AsyncIterator[str]) -> AsyncIterator[OutputChunk]:
            index = 0
            async for text, pcm in segments(words):
                await self._wait_until(t0, index)
                yield TextDelta(text)
                for start in range(0, len(pcm), chunk):
                    await self._wait_until(t0, index)
                    if o.fail_after_chunks and index >= o.fail_after_chunks:
                        raise RuntimeError("synthetic fault: the talker failed")
                    index += 1
                    yield AudioChunk(pcm[start : start + chunk])

        return stage

    def _tool_to_call(self, request: ResponseRequest) -> Tool | None:
        """The tool this request calls: the one ``tool_choice`` forces, or with "auto" the first
        whose name the user's last words name, unless a tool's result is being answered."""
        choice, tools = request.tool_choice, request.tools
        if not tools or choice == "none" or (request.items and isinstance(request.items[-1], FunctionResult)):
            return None
        if choice == "required":
            return tools[0]
        if choice != "auto":
            return next((t for t in tools if t.name == choice), None)
        heard = {w.strip(".,!?;:'\"").lower() for w in self._heard(request).split()}
        for tool in tools:
            if any(len(part) >= 4 and part in heard for part in _name_words(tool.name)):
                return tool
        return None

    def _reply(self, request: ResponseRequest) -> str:
        last = request.items[-1] if request.items else None
        if isinstance(last, FunctionResult):
            return f"The tool returned {last.output}."
        return self.options.reply.format(heard=self._heard(request) or "nothing", n=self.responses, images=self._images(request))

    @staticmethod
    def _heard(request: ResponseRequest) -> str:
        for item in reversed(request.items):
            if isinstance(item, Message) and item.role == "user":
                return " ".join(p.text for p in item.parts if p.text)
        return ""

    @staticmethod
    def _images(request: ResponseRequest) -> int:
        for item in reversed(request.items):
            if isinstance(item, Message) and item.role == "user":
                return sum(p.kind == "image" for p in item.parts)
        return 0

    def _last_user_audio(self, request: ResponseRequest) -> np.ndarray:
        caps = self.pipeline.capabilities
        for item in reversed(request.items):
            if isinstance(item, Message) and item.role == "user":
                clips = [p.audio for p in item.parts if p.audio is not None and len(p.audio)]
                if clips:
                    return resample(np.concatenate(clips), caps.input_rate, caps.output_rate)
        return np.zeros(0, np.int16)

    def _usage(self, request: ResponseRequest, words: int) -> Usage:
        caps = self.pipeline.capabilities
        text_tokens = audio_tokens = 0
        for item in request.items:
            if isinstance(item, Message):
                for p in item.parts:
                    text_tokens += len((p.text or "").split())
                    if p.audio is not None:
                        audio_tokens += int(10 * len(p.audio) / caps.input_rate)
        text_tokens += len(request.instructions.split())
        return Usage(
            input_tokens=text_tokens + audio_tokens,
            input_audio_tokens=audio_tokens,
            output_tokens=words,
            hit_max_tokens=request.max_output_tokens is not None and words >= request.max_output_tokens,
        )


def _name_words(name: str) -> list[str]:
    """``get_weather`` and ``getWeather`` -> ["get", "weather"]."""
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)]


def arguments_for(schema: Any, words: list[str], depth: int = 0) -> Any:
    """A value that satisfies the JSON schema ``schema``, deterministically: an object gets its
    required properties (all of them when none are listed), a string the user's last capitalised
    word (a name: "Paris"), else the first enum value, a const, or a number its minimum.

    The schema is the client's, unchecked: whatever its shape (a list where an object belongs, a
    string for ``required``, a huge ``minItems``), this returns a value and never raises; what it
    cannot satisfy within bounds it answers as best it can (a synthetic pipeline, not a validator)."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        schema = {}
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return arguments_for(schema[key][0], words, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        names = required if isinstance(required, list) else list(props)
        return {name: arguments_for(props.get(name), words, depth + 1) for name in names[:MAX_ITEMS] if isinstance(name, str)}
    if kind == "array":
        return [arguments_for(schema.get("items"), words, depth + 1) for _ in range(_bounded(schema.get("minItems"), MAX_ITEMS))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 0)
        if "exclusiveMinimum" in schema and _number(schema["exclusiveMinimum"]):
            low = schema["exclusiveMinimum"] + 1
        low = max(low, 1) if _number(low) and abs(low) < 1e15 else 1
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    names = [w.strip(".,!?;:'\"") for w in words[1:] if w[:1].isupper() and w.strip(".,!?;:'\"") not in ("I", "")]
    text = names[-1] if names else "example"
    return text.ljust(_bounded(schema.get("minLength"), MAX_STRING), "x")


MAX_SCHEMA_DEPTH = 32  # deeper than any real tool's parameters
MAX_ITEMS = 64  # properties or array items made
MAX_STRING = 4096


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bounded(value: Any, most: int) -> int:
    return min(int(value), most) if _number(value) and value > 0 else 0


@functools.lru_cache(maxsize=256)
def tone(word: str, ms: int, rate: int) -> np.ndarray:
    """A short tone with a pitch derived from the word, faded in and out (no clicks)."""
    n = ms * rate // 1000
    freq = 200.0 + (zlib.crc32(word.encode()) % 24) * 25.0
    t = np.arange(n) / rate
    fade = np.minimum(1.0, np.minimum(np.arange(n), n - np.arange(n)) / (0.01 * rate))
    return (0.3 * 32767 * fade * np.sin(2 * math.pi * freq * t)).astype(np.int16)


def create(options: SyntheticOptions) -> SyntheticPipeline:
    return SyntheticPipeline(options)
