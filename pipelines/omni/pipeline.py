"""Audio-native omni models (Qwen3-Omni, Qwen2.5-Omni, Ming-Omni: Thinker -> Talker -> Code2Wav) on a
vLLM-Omni deployment, behind the session engine: VAD, barge-in, response.create/cancel, WebRTC and
SIP come from this server; the model only hears and speaks.

**The engines** (``pipelines/omni/engine.py``, one interface). ``engine: remote``: the
deployment's OpenAI chat completions, streamed (``pipelines/remote.py``; many frontends share one
deployment, which scales on its own). ``engine: in_process``: vLLM-Omni's ``AsyncOmni`` in this
process (a GPU host), given the same request rendered as vLLM-Omni's chat serving renders it. The
user's audio goes to the Thinker as audio (no ASR in the loop); the answer's text and audio become
``TextDelta``s and ``AudioChunk``s as they are produced (async chunk end to end), resampled only
if the engine's rate is not ``output_rate``.

**History and the prefix cache.** Every request re-sends the conversation as the same messages,
byte for byte (user turns as their audio, encoded once per item; assistant turns as the text that
was delivered, cut at barge-in or truncation), with the session's ``cache_salt`` (its API key's: ``Pipeline.open``), so a deployment
with prefix caching prefills only the new turn and no session ever hits the cache of another key's. Audio
turns cost many tokens, so history is bounded: user audio older than ``history_audio_s`` (counted
from the newest turn back) goes as its transcript when one is known, otherwise the turn is left
out. The boundary moves in steps (down to half the budget at once), so the prefix stays stable
for several turns after it moves.

**Speculation.** At a pause in the user's speech the request the turn would make (history + the
turn's audio so far) is sent at once into a bounded buffer. If the user speaks on, it is aborted
(its prefix is cached by then); if the turn ends there, the answer is already under way and is
adopted when ``respond`` asks for exactly the same request. For that to be so, a turn that ends at
a pause goes to the model as the audio the speculation sent: its speech and the pause, without the
rest of the end-of-turn silence the item holds (silence by the VAD's judgement: no word is lost),
now and in every later request's history. The moves and the adoption rule are
``pipelines/speculation.py``'s, shared with the cascade.

**Streamed turns** (in process, ``in_process.stream_input``). When speech starts, the turn opens as
one resumable engine request (``omni_engine.StreamedTurn``): the history, then the turn's audio as
it comes, a segment every ``stream_segment_s`` and at each pause, each a prefill. A pause does not
end it and speech going on does not void it; at the end of the turn the answer is asked for with
only the assistant's header left to prefill. The turn then goes to the model as those segments,
in this request and every later one. If the history changed meanwhile (an item added, other
instructions) or the turn could not be streamed, it is dropped and the turn answered whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import numpy as np

from dsp.resample import resample

from pipelines.base import (
    AudioChunk,
    Capabilities,
    FunctionCall,
    FunctionResult,
    Message,
    OutputChunk,
    Pipeline,
    PipelineSession,
    ResponseRequest,
    StageTimes,
    TextDelta,
    Transcript,
)
from pipelines.omni.engine import Clip, EngineAudio, InProcessOptions, LocalOmni, RemoteOmni, StreamedTurn
from pipelines.remote import RemoteOptions
from pipelines.speculation import Ahead, Production, Speculation, SpeculationCounts

log = logging.getLogger(__name__)


class OmniOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str = "qwen3-omni"
    engine: Literal["remote", "in_process"] = "remote"
    remote: RemoteOptions = msgspec.field(default_factory=RemoteOptions)
    in_process: InProcessOptions = msgspec.field(default_factory=InProcessOptions)
    model: str = "Qwen/Qwen3-Omni-30B-A3B-Instruct"  # the name the deployment serves it under
    output_rate: int = 24000  # the engine's audio rate (Ming 44100): chunks that say another are resampled to it
    audio_format: Literal["pcm", "wav"] = "pcm"  # how audio chunks come back
    voices: list[str] = msgspec.field(default_factory=lambda: ["Ethan", "Chelsie", "Aiden"])  # the first is the default
    system_prompt: str = ""  # put before the session's instructions (Qwen2.5-Omni speaks only with its own)
    images: bool = True
    tools: bool = False  # function calling: the deployment runs a tool parser (--enable-auto-tool-choice); remote only
    max_tokens: int = 512
    temperature: float | None = None  # None: the deployment's default
    speculate: bool = True
    history_audio_s: float = 300.0
    context_tokens: int = 32768
    asr_model: str | None = None  # a Whisper from `realtime-omni models` for input transcripts; None: none
    buffer_chunks: int = 512  # answer chunks buffered ahead of the session, per response
    max_encoded_items: int = 256  # user audio kept encoded per session (re-sent byte for byte)


INPUT_RATE = 16000  # what the omni models' audio encoders take


class OmniPipeline(Pipeline):
    def __init__(self, options: OmniOptions) -> None:
        self.options = options
        self.capabilities = Capabilities(
            name=options.name,
            input_rate=INPUT_RATE,
            output_rate=options.output_rate,
            images=options.images,
            tools=options.tools and options.engine == "remote",
            transcribes_input=options.asr_model is not None,
            transcription_model=options.asr_model or "",
            voices=tuple(options.voices),
            context_tokens=options.context_tokens,
        )
        self.engine: RemoteOmni | LocalOmni = (
            LocalOmni(options.in_process) if options.engine == "in_process" else RemoteOmni(options.remote, options.output_rate)
        )
        self.listener: Any = None
        self.asr_pool = ThreadPoolExecutor(1, thread_name_prefix="asr") if options.asr_model else None
        self.sessions: set[OmniSession] = set()
        self.responses = 0
        self.speculations = SpeculationCounts()  # (every discard counted here)
        self.streamed_turns = SpeculationCounts()  # speculations whose turn was streamed in as spoken

    async def start(self) -> None:
        if self.options.asr_model is not None:
            from pipelines import models

            from pipelines.cascade.ears import open_listener

            name = self.options.asr_model
            directory = str(models.ensure(name, log.info))
            loop = asyncio.get_running_loop()
            self.listener = await loop.run_in_executor(self.asr_pool, lambda: open_listener(name, directory))
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()
        if self.asr_pool is not None:
            self.asr_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def healthy(self) -> bool:
        return self.engine.healthy

    def open(self, session_id: str, tenant: str | None = None) -> OmniSession:
        session = OmniSession(self, session_id, tenant)
        self.sessions.add(session)
        return session

    def stats(self) -> dict[str, float]:
        live = sum(1 for s in self.sessions if s.ahead.current is not None)
        streamed = {"streamed_turns": self.streamed_turns.started, "streamed_turns_adopted": self.streamed_turns.adopted}
        return {"open_sessions": len(self.sessions), "speculations_live": live, "responses": self.responses, **self.speculations.stats(), **streamed, **self.engine.stats()}


class OmniProduction(Production):
    """One request's answer from the engine, read once by ``respond``."""

    def __init__(self, session: OmniSession, body: dict[str, Any], streamed: StreamedTurn | None = None) -> None:
        self.session = session
        self.body = body
        self.streamed = streamed
        super().__init__(self._produce(), session.options.buffer_chunks, f"omni:{session.session_id}")

    async def _produce(self) -> AsyncIterator[OutputChunk]:
        out_rate = self.session.pipeline.capabilities.output_rate
        engine = self.session.pipeline.engine
        stream = engine.stream(self.body) if self.streamed is None else engine.stream(self.body, self.streamed)  # type: ignore[call-arg]
        async with contextlib.aclosing(stream):
            async for piece in stream:
                if isinstance(piece, EngineAudio):
                    pcm = piece.pcm if piece.rate == out_rate else resample(piece.pcm, piece.rate, out_rate)
                    self.times.setdefault("first_audio", time.perf_counter())
                    yield AudioChunk(pcm)
                else:
                    if isinstance(piece, TextDelta):
                        self.times.setdefault("thinker_first_token", time.perf_counter())
                    yield piece


@dataclass(eq=False, kw_only=True)
class OmniSpeculation(Speculation[OmniProduction]):
    """The request the turn would make, sent at a pause (or, streamed, when speech began)."""

    body: dict[str, Any]
    sent: list[Clip]  # the turn's audio as it went to the model (one clip, or a streamed turn's segments)
    streamed: StreamedTurn | None = None  # in-process: the turn fed to the Thinker as it is spoken


class OmniSession(PipelineSession):
    def __init__(self, pipeline: OmniPipeline, session_id: str, tenant: str | None = None) -> None:
        self.pipeline = pipeline
        self.options = pipeline.options
        self.session_id = session_id
        self.salt = tenant or secrets.token_hex(16)  # the prefix-cache namespace: its key's (Pipeline.open), else its own
        self.turn: list[np.ndarray] = []  # audio of the open user turn
        self.ahead: Ahead[OmniSpeculation] = Ahead(pipeline.speculations)  # the request sent ahead of the turn's end
        self._encoded: OrderedDict[tuple[str, int], list[Clip]] = OrderedDict()
        self._sent_as: dict[str, list[Clip]] = {}  # a committed turn's audio as its speculation sent it
        self.streams = isinstance(pipeline.engine, LocalOmni) and self.options.in_process.stream_input
        self.segment_samples = int(self.options.in_process.stream_segment_s * INPUT_RATE)
        self.unsent: list[np.ndarray] = []  # a streamed turn's audio not yet sent
        self.ended_at_pause = False
        self._history_floor = 0  # items before this index of the conversation go without their audio

    # ------------------------------------------------------------------ the open turn

    def feed(self, pcm: np.ndarray) -> None:
        self.turn.append(pcm)
        spec = self.ahead.current
        if spec is not None and spec.streamed is not None:
            self.unsent.append(pcm)
            if not self.ended_at_pause and sum(map(len, self.unsent)) >= self.segment_samples:
                self._push(spec)  # (not the silence after a pause: it may be the end of the turn)

    def listen(self, request: ResponseRequest | None, answer: bool) -> None:
        if self.streams and self.options.speculate and request is not None and answer:
            self._open_streamed(request)

    def pause(self, request: ResponseRequest | None, answer: bool) -> None:
        self.ended_at_pause = True
        if not self.options.speculate or request is None or not answer or not self.turn:
            return  # (it hears nothing apart from its answer: no words for the turn-end policy)
        spec = self.ahead.current
        if self.streams:
            if spec is not None and spec.streamed is not None and spec.item_id is None:
                self._push(spec)  # the turn so far is in the Thinker already
                return
            self._open_streamed(request)
            return
        clip = Clip(np.concatenate(self.turn), INPUT_RATE)
        body = self._body(request, pending=clip)
        self.ahead.start(OmniSpeculation(body=body, production=OmniProduction(self, body), sent=[clip]))

    def resume(self) -> None:
        self.ended_at_pause = False
        spec = self.ahead.current
        if spec is None or spec.streamed is None:  # a streamed turn goes on; a speculated request is void
            self.ahead.drop()

    def commit(self, item_id: str) -> None:
        self.turn = []
        spec = self.ahead.current
        if spec is not None and spec.item_id is None:
            if spec.streamed is not None:
                if not self.ended_at_pause:  # ended without a pause (a manual commit): the rest is speech
                    self._push(spec)
                self.unsent = []
                spec.sent = list(spec.streamed.segments)
            if spec.streamed is None or spec.streamed.valid:
                self.ahead.bind(item_id)
                self._sent_as[item_id] = spec.sent  # the turn ended at the pause: it goes as it was sent
            else:  # a turn that could not be streamed goes whole, the ordinary way
                self.ahead.drop()
        self.ended_at_pause = False

    def _open_streamed(self, request: ResponseRequest) -> None:
        engine = self.pipeline.engine
        assert isinstance(engine, LocalOmni)
        body = self._body(request)
        streamed = engine.open_turn(body, body["messages"])
        spec = self.ahead.start(OmniSpeculation(body=body, production=OmniProduction(self, body, streamed), sent=[], streamed=streamed), self.pipeline.streamed_turns)
        self.unsent = list(self.turn)
        self._push(spec)

    def _push(self, spec: OmniSpeculation) -> None:
        """The turn's audio not yet in the Thinker, as one more segment."""
        assert spec.streamed is not None
        if self.unsent:
            pcm, self.unsent = np.concatenate(self.unsent), []
            if not spec.streamed.push(Clip(pcm, INPUT_RATE)):
                self.unsent = []  # the turn cannot be streamed: it will be answered the ordinary way

    def clear(self) -> None:
        self.turn = []
        self.unsent = []
        self.ahead.drop()

    # ------------------------------------------------------------------ requests

    def _messages(self, request: ResponseRequest, pending: Clip | None) -> list[dict[str, Any]]:
        o = self.options
        messages: list[dict[str, Any]] = []
        system = "\n\n".join(t for t in (o.system_prompt, request.instructions) if t)
        if system:
            messages.append({"role": "system", "content": system})
        items = list(request.items)
        floor = self._floor(items, pending)
        for index, item in enumerate(items):
            if isinstance(item, Message):
                content = self._content(item, with_audio=index >= floor)
                if content:
                    messages.append({"role": item.role if item.role != "system" else "system", "content": content})
            elif isinstance(item, FunctionCall) and self.pipeline.capabilities.tools:
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionResult) and self.pipeline.capabilities.tools:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
            elif isinstance(item, FunctionCall):
                messages.append({"role": "assistant", "content": f"(calling {item.name} with {item.arguments})"})
            elif isinstance(item, FunctionResult):
                messages.append({"role": "user", "content": [{"type": "text", "text": f"(the tool returned: {item.output})"}]})
        if pending is not None:
            messages.append({"role": "user", "content": [_audio_part(pending)]})
        return messages

    def _content(self, item: Message, *, with_audio: bool) -> Any:
        if item.role == "assistant":  # what was delivered (cut at a barge-in or truncation)
            return " ".join(p.text for p in item.parts if p.text) or None
        parts: list[dict[str, Any]] = []
        for i, part in enumerate(item.parts):
            if part.kind == "audio" and part.audio is not None and with_audio:
                parts.extend(_audio_part(clip) for clip in self._encoded_audio(item.id, i, part.audio))
            elif part.kind == "audio":
                if part.text:  # older audio goes as its transcript
                    parts.append({"type": "text", "text": part.text})
            elif part.kind == "image" and part.image_url and self.options.images:
                parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
            elif part.text:
                parts.append({"type": "text", "text": part.text})
        if item.role == "system":
            return " ".join(p["text"] for p in parts if p.get("type") == "text") or None
        return parts or None

    def _encoded_audio(self, item_id: str, index: int, pcm: np.ndarray) -> list[Clip]:
        key = (item_id, index)
        clips = self._encoded.get(key)
        if clips is None:
            sent = self._sent_as.pop(item_id, None)
            said = np.concatenate([c.pcm for c in sent]) if sent and index == 0 else None
            if sent and said is not None and len(said) <= len(pcm) and np.array_equal(pcm[: len(said)], said):
                clips = sent  # as the model heard it; what follows is the end-of-turn silence
            else:
                clips = [Clip(pcm, INPUT_RATE)]
            self._encoded[key] = clips
            while len(self._encoded) > self.options.max_encoded_items:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(key)
        return clips

    def _floor(self, items: list[Any], pending: Clip | None) -> int:
        """Items before the returned index go without their audio. The floor only moves forward,
        and when it must (more audio than ``history_audio_s``), down to half the budget at once."""
        budget = self.options.history_audio_s
        seconds = [_audio_seconds(item) for item in items]
        total = sum(seconds[self._history_floor :]) + (len(pending.pcm) / INPUT_RATE if pending is not None else 0.0)
        if total > budget:
            floor = self._history_floor
            while floor < len(items) and total > budget / 2:
                total -= seconds[floor]
                floor += 1
            self._history_floor = floor
        return min(self._history_floor, len(items))

    def _body(self, request: ResponseRequest, pending: Clip | None = None) -> dict[str, Any]:
        o = self.options
        audio = "audio" in request.output_modalities
        body: dict[str, Any] = {
            "model": o.model,
            "messages": self._messages(request, pending),
            "stream": True,
            "stream_options": {"include_usage": True},
            "modalities": ["text", "audio"] if audio else ["text"],
            "max_tokens": min(o.max_tokens, request.max_output_tokens or o.max_tokens),
            "cache_salt": self.salt,
        }
        if audio:
            body["audio"] = {"format": o.audio_format}
            body["speaker"] = request.voice if request.voice in o.voices else o.voices[0]
        if request.tools and request.tool_choice != "none" and self.pipeline.capabilities.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters or {"type": "object", "properties": {}}}}
                for t in request.tools
            ]
            choice = request.tool_choice
            body["tool_choice"] = choice if choice in ("auto", "required") else {"type": "function", "function": {"name": choice}}
        temperature = request.temperature if request.temperature is not None else o.temperature
        if temperature is not None:
            body["temperature"] = temperature
        return body

    # ------------------------------------------------------------------ responding

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        self.pipeline.responses += 1
        t0 = time.perf_counter()
        body = self._body(request)
        production = await self._adopt(request, body)
        speculated = production is not None
        if production is None:
            production = OmniProduction(self, body)
        try:
            async for chunk in production.output:
                yield chunk
            stages = {name: round((at - t0) * 1000, 1) for name, at in production.times.items()}
            yield StageTimes(stages, {"speculated": speculated})
        finally:
            await production.cancel()

    async def _adopt(self, request: ResponseRequest, body: dict[str, Any]) -> Production | None:
        """The speculation's answer, if it is for exactly this request (the committed turn is sent
        as its item's audio: the same bytes as the speculation's pending audio)."""
        spec = await self.ahead.claim(request)
        if spec is None:
            return None
        if spec.streamed is not None:
            fits = body["messages"] == spec.streamed.messages() and spec.streamed.finish(body)
            return self.ahead.settle(spec, fits, self.pipeline.streamed_turns)
        return self.ahead.settle(spec, spec.body == body)

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript | None:
        pipeline = self.pipeline
        if pipeline.listener is None:
            return None
        text = await asyncio.get_running_loop().run_in_executor(pipeline.asr_pool, pipeline.listener.transcribe, pcm)
        return Transcript(text, len(pcm) / INPUT_RATE)

    async def close(self) -> None:
        self.pipeline.sessions.discard(self)
        await self.ahead.close()
        self._encoded.clear()
        self._sent_as.clear()


def _audio_part(data: Clip) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def _audio_seconds(item: Any) -> float:
    if not isinstance(item, Message) or item.role != "user":
        return 0.0
    return sum(len(p.audio) / INPUT_RATE for p in item.parts if p.kind == "audio" and p.audio is not None)


def create(options: OmniOptions) -> OmniPipeline:
    return OmniPipeline(options)
