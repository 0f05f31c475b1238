"""Audio-native omni models (Qwen3-Omni, Qwen2.5-Omni, Ming-Omni: Thinker -> Talker -> Code2Wav) on a
vLLM-Omni deployment, behind the session engine: VAD, barge-in, response.create/cancel, WebRTC and
SIP come from this server; the model only hears and speaks.

**The engine.** ``engine: remote``: the deployment's OpenAI chat completions, streamed
(``pipelines/remote.py``; many frontends share one deployment, which scales on its own). The user's
audio goes to the Thinker as audio (no ASR in the loop); each streamed chunk is text (the Thinker's
words) or audio (Code2Wav's, base64 ``pcm`` or a WAV per chunk), and becomes a ``TextDelta`` or an
``AudioChunk`` as it arrives (async chunk end to end). Audio keeps the engine's rate (the session
converts it once to the client's format), unless a WAV chunk says otherwise.

**History and the prefix cache.** Every request re-sends the conversation as the same messages,
byte for byte (user turns as their audio, encoded once per item; assistant turns as the text that
was delivered, cut at barge-in or truncation), with this session's ``cache_salt``, so a deployment
with prefix caching prefills only the new turn and no session ever hits another's cache. Audio
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
now and in every later request's history.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import secrets
import time
import wave
from collections import OrderedDict
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import numpy as np

from dsp.resample import resample

from .base import (
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
    Usage,
)
from .remote import RemoteEngine, RemoteOptions
from .stages import Handoff

log = logging.getLogger(__name__)


class OmniOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str = "qwen3-omni"
    engine: Literal["remote"] = "remote"
    remote: RemoteOptions = msgspec.field(default_factory=RemoteOptions)
    model: str = "Qwen/Qwen3-Omni-30B-A3B-Instruct"  # the name the deployment serves it under
    output_rate: int = 24000  # the engine's audio rate (Ming 44100): chunks that say another are resampled to it
    audio_format: Literal["pcm", "wav"] = "pcm"  # how audio chunks come back
    voices: list[str] = msgspec.field(default_factory=lambda: ["Ethan", "Chelsie", "Aiden"])  # the first is the default
    system_prompt: str = ""  # put before the session's instructions (Qwen2.5-Omni speaks only with its own)
    images: bool = True
    max_tokens: int = 512
    temperature: float | None = None  # None: the deployment's default
    speculate: bool = True
    history_audio_s: float = 300.0
    context_tokens: int = 32768
    asr_model: str | None = None  # a Whisper from `realtime-omni models` for input transcripts; None: none
    buffer_chunks: int = 512  # answer chunks buffered ahead of the session, per response
    max_encoded_items: int = 256  # user audio kept encoded per session (re-sent byte for byte)


INPUT_RATE = 16000  # what the omni models' audio encoders take


def wav_base64(pcm: np.ndarray, rate: int) -> str:
    """A mono 16-bit WAV, base64: deterministic, so the same audio is always the same bytes."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2", copy=False).tobytes())
    return base64.b64encode(out.getvalue()).decode()


def decode_audio(data: str, default_rate: int) -> tuple[np.ndarray, int]:
    """An audio chunk's ``delta.content``: base64 of raw s16le at ``default_rate``, or of a WAV."""
    raw = base64.b64decode(data)
    if raw[:4] == b"RIFF":
        with wave.open(io.BytesIO(raw)) as w:
            frames = w.readframes(w.getnframes())
            pcm = np.frombuffer(frames, "<i2").astype(np.int16, copy=False)
            if w.getnchannels() > 1:
                pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1).astype(np.int16)
            return pcm, w.getframerate()
    return np.frombuffer(raw[: len(raw) // 2 * 2], "<i2").astype(np.int16, copy=False), default_rate


class OmniPipeline(Pipeline):
    def __init__(self, options: OmniOptions) -> None:
        self.options = options
        self.capabilities = Capabilities(
            name=options.name,
            input_rate=INPUT_RATE,
            output_rate=options.output_rate,
            images=options.images,
            transcribes_input=options.asr_model is not None,
            transcription_model=options.asr_model or "",
            voices=tuple(options.voices),
            context_tokens=options.context_tokens,
        )
        self.engine = RemoteEngine(options.remote)
        self.listener: Any = None
        self.asr_pool = ThreadPoolExecutor(1, thread_name_prefix="asr") if options.asr_model else None
        self.sessions: set[OmniSession] = set()
        self.counts = {"responses": 0, "speculations_started": 0, "speculations_adopted": 0, "speculations_discarded": 0}

    async def start(self) -> None:
        if self.options.asr_model is not None:
            from pipelines import models

            from .listener import WhisperListener

            directory = str(models.ensure(self.options.asr_model, log.info))
            loop = asyncio.get_running_loop()
            self.listener = await loop.run_in_executor(self.asr_pool, lambda: WhisperListener(directory, 2, 1, window="fit"))
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()
        if self.asr_pool is not None:
            self.asr_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def healthy(self) -> bool:
        return self.engine.healthy

    def open(self, session_id: str) -> OmniSession:
        session = OmniSession(self, session_id)
        self.sessions.add(session)
        return session

    def stats(self) -> dict[str, float]:
        live = sum(1 for s in self.sessions if s.speculation is not None)
        return {"open_sessions": len(self.sessions), "speculations_live": live, **self.counts, **self.engine.stats()}


@dataclass(eq=False)
class Speculation:
    body: dict[str, Any]
    production: Production
    pending: np.ndarray  # the turn's audio it sent
    item_id: str | None = None  # bound at commit


class Production:
    """One request's answer, produced by its own task into a bounded buffer (so it can start before
    anyone reads it) and read once by ``respond``."""

    def __init__(self, session: OmniSession, body: dict[str, Any]) -> None:
        self.session = session
        self.body = body
        self.sent_at = time.perf_counter()
        self.times: dict[str, float] = {}
        self.output: Handoff[OutputChunk] = Handoff(self._produce(), session.options.buffer_chunks, name=f"omni:{session.session_id}")

    async def _produce(self) -> AsyncIterator[OutputChunk]:
        o = self.session.options
        out_rate = self.session.pipeline.capabilities.output_rate
        usage = Usage()
        stream = self.session.pipeline.engine.stream(self.body)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if chunk.get("modality") == "audio":
                            said = (choice.get("audio_metadata") or {}).get("sample_rate_hz")
                            pcm, rate = decode_audio(content, said or o.output_rate)
                            if rate != out_rate:
                                pcm = resample(pcm, rate, out_rate)
                            self.times.setdefault("first_audio", time.perf_counter())
                            yield AudioChunk(pcm)
                        else:
                            self.times.setdefault("thinker_first_token", time.perf_counter())
                            yield TextDelta(content)
                    if choice.get("finish_reason") == "length":
                        usage.hit_max_tokens = True
                u = chunk.get("usage")
                if u:
                    usage.input_tokens = u.get("prompt_tokens") or 0
                    usage.output_tokens = u.get("completion_tokens") or 0
                    usage.cached_tokens = ((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        yield usage

    async def cancel(self) -> None:
        await self.output.aclose()


class OmniSession(PipelineSession):
    def __init__(self, pipeline: OmniPipeline, session_id: str) -> None:
        self.pipeline = pipeline
        self.options = pipeline.options
        self.session_id = session_id
        self.salt = secrets.token_hex(16)  # this session's prefix-cache namespace
        self.turn: list[np.ndarray] = []  # audio of the open user turn
        self.speculation: Speculation | None = None
        self._encoded: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._sent_as: dict[str, np.ndarray] = {}  # a committed turn's audio as its speculation sent it
        self._history_floor = 0  # items before this index of the conversation go without their audio
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ the open turn

    def feed(self, pcm: np.ndarray) -> None:
        self.turn.append(pcm)

    def pause(self, request: ResponseRequest | None) -> None:
        if not self.options.speculate or request is None or not self.turn:
            return
        self._drop_speculation()
        pending = np.concatenate(self.turn)
        body = self._body(request, pending=pending)
        self.speculation = Speculation(body, Production(self, body), pending)
        self.pipeline.counts["speculations_started"] += 1

    def resume(self) -> None:
        self._drop_speculation()

    def commit(self, item_id: str) -> None:
        self.turn = []
        spec = self.speculation
        if spec is not None and spec.item_id is None:
            spec.item_id = item_id
            self._sent_as[item_id] = spec.pending  # the turn ended at the pause: it goes as it was sent

    def clear(self) -> None:
        self.turn = []
        self._drop_speculation()

    def _drop_speculation(self) -> None:
        spec, self.speculation = self.speculation, None
        if spec is not None:
            self._discard(spec)

    def _discard(self, spec: Speculation) -> None:
        """Void a speculation in the background: closing its stream makes the engine abort it."""
        self.pipeline.counts["speculations_discarded"] += 1
        task = asyncio.ensure_future(spec.production.cancel())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ requests

    def _messages(self, request: ResponseRequest, pending: np.ndarray | None) -> list[dict[str, Any]]:
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
            elif isinstance(item, FunctionCall):
                messages.append({"role": "assistant", "content": f"(calling {item.name} with {item.arguments})"})
            elif isinstance(item, FunctionResult):
                messages.append({"role": "user", "content": [{"type": "text", "text": f"(the tool returned: {item.output})"}]})
        if pending is not None:
            messages.append({"role": "user", "content": [_audio_part(wav_base64(pending, INPUT_RATE))]})
        return messages

    def _content(self, item: Message, *, with_audio: bool) -> Any:
        if item.role == "assistant":  # what was delivered (cut at a barge-in or truncation)
            return " ".join(p.text for p in item.parts if p.text) or None
        parts: list[dict[str, Any]] = []
        for i, part in enumerate(item.parts):
            if part.kind == "audio" and part.audio is not None and with_audio:
                parts.append(_audio_part(self._encoded_audio(item.id, i, part.audio)))
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

    def _encoded_audio(self, item_id: str, index: int, pcm: np.ndarray) -> str:
        key = (item_id, index)
        data = self._encoded.get(key)
        if data is None:
            sent = self._sent_as.pop(item_id, None)
            if sent is not None and index == 0 and len(sent) <= len(pcm) and np.array_equal(pcm[: len(sent)], sent):
                pcm = sent  # what follows is the end-of-turn silence
            data = self._encoded[key] = wav_base64(pcm, INPUT_RATE)
            while len(self._encoded) > self.options.max_encoded_items:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(key)
        return data

    def _floor(self, items: list[Any], pending: np.ndarray | None) -> int:
        """Items before the returned index go without their audio. The floor only moves forward,
        and when it must (more audio than ``history_audio_s``), down to half the budget at once."""
        budget = self.options.history_audio_s
        seconds = [_audio_seconds(item) for item in items]
        total = sum(seconds[self._history_floor :]) + (len(pending) / INPUT_RATE if pending is not None else 0.0)
        if total > budget:
            floor = self._history_floor
            while floor < len(items) and total > budget / 2:
                total -= seconds[floor]
                floor += 1
            self._history_floor = floor
        return min(self._history_floor, len(items))

    def _body(self, request: ResponseRequest, pending: np.ndarray | None = None) -> dict[str, Any]:
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
        temperature = request.temperature if request.temperature is not None else o.temperature
        if temperature is not None:
            body["temperature"] = temperature
        return body

    # ------------------------------------------------------------------ responding

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        self.pipeline.counts["responses"] += 1
        t0 = time.perf_counter()
        body = self._body(request)
        production = self._adopt(request, body)
        speculated = production is not None
        if production is None:
            production = Production(self, body)
        try:
            async for chunk in production.output:
                yield chunk
            stages = {name: round((at - t0) * 1000, 1) for name, at in production.times.items()}
            yield StageTimes(stages, {"speculated": speculated})
        finally:
            await production.cancel()

    def _adopt(self, request: ResponseRequest, body: dict[str, Any]) -> Production | None:
        """The speculation's answer, if it is for exactly this request."""
        spec = self.speculation
        if spec is None or spec.item_id is None:
            return None
        last_user = next((i for i in reversed(request.items) if isinstance(i, Message) and i.role == "user"), None)
        if last_user is None or last_user.id != spec.item_id:
            return None
        # the committed turn is sent as its item's audio: the same bytes as the speculation's pending audio
        self.speculation = None
        if spec.body == body:
            self.pipeline.counts["speculations_adopted"] += 1
            return spec.production
        self._discard(spec)
        return None

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript | None:
        pipeline = self.pipeline
        if pipeline.listener is None:
            return None
        text = await asyncio.get_running_loop().run_in_executor(pipeline.asr_pool, pipeline.listener.transcribe, pcm)
        return Transcript(text, len(pcm) / INPUT_RATE)

    async def close(self) -> None:
        self.pipeline.sessions.discard(self)
        spec, self.speculation = self.speculation, None
        if spec is not None:
            await spec.production.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._encoded.clear()
        self._sent_as.clear()


def _audio_part(data: str) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def _audio_seconds(item: Any) -> float:
    if not isinstance(item, Message) or item.role != "user":
        return 0.0
    return sum(len(p.audio) / INPUT_RATE for p in item.parts if p.kind == "audio" and p.audio is not None)


def create(options: dict[str, Any]) -> OmniPipeline:
    return OmniPipeline(msgspec.convert(options, OmniOptions))
