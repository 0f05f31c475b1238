"""The two engines behind ``pipelines/omni/pipeline.py``: one small interface, ``stream(body)``.

A request is a chat-completions body (``messages``, ``modalities``, ``max_tokens``, ``speaker``,
``cache_salt``...), the same for both engines, so a turn is the same request wherever it runs.
``stream`` yields the answer as it is produced: ``TextDelta``s (the Thinker's words),
``EngineAudio`` (Code2Wav's samples at the engine's rate) and, last, ``Usage``. Closing the stream
aborts the request; a failure is an ``EngineError``.

- ``RemoteOmni``: a vLLM-Omni deployment's ``/v1/chat/completions``, streamed over the pooled client
  of ``pipelines/remote.py`` (abort = the connection closes).
- ``LocalOmni``: vLLM-Omni's ``AsyncOmni`` in this process (a GPU host). The body is rendered the way
  vLLM-Omni's own chat serving renders it: the model's chat template over the messages, with one
  ``audio``/``image`` placeholder per part and the media in ``multi_modal_data`` in the same order;
  ``cache_salt`` and the speaker go into the engine prompt. Aborting = closing ``generate()``.

User audio travels inside a body as a ``Clip``: the base64 WAV the remote engine is sent, which
also holds its samples, so the in-process engine never decodes what it encoded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import importlib
import io
import logging
import sys
import time
import uuid
import wave
from collections import namedtuple
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np

from pipelines.base import TextDelta, ToolCall, Usage
from pipelines.remote import EngineError, RemoteEngine, RemoteOptions

log = logging.getLogger(__name__)


class Clip(str):
    """A mono 16-bit WAV as base64 (deterministic: the same samples are always the same bytes),
    carrying its samples for an engine that takes them directly."""

    pcm: np.ndarray
    rate: int

    def __new__(cls, pcm: np.ndarray, rate: int) -> Clip:
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(rate)
            w.writeframes(pcm.astype("<i2", copy=False).tobytes())
        clip = super().__new__(cls, base64.b64encode(out.getvalue()).decode())
        clip.pcm = pcm
        clip.rate = rate
        return clip


@dataclass(slots=True)
class EngineAudio:
    pcm: np.ndarray  # int16 mono
    rate: int


EngineOutput = TextDelta | EngineAudio | ToolCall | Usage


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


# ---------------------------------------------------------------------------------- remote


class RemoteOmni:
    def __init__(self, options: RemoteOptions, default_rate: int) -> None:
        self.engine = RemoteEngine(options)
        self.default_rate = default_rate

    @property
    def healthy(self) -> bool:
        return self.engine.healthy

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[EngineOutput, None]:
        usage = Usage()
        calls: dict[int, dict[str, str]] = {}  # tool calls as their deltas build them, by index
        chunks = self.engine.stream(body)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    content = delta.get("content")
                    if content:
                        if chunk.get("modality") == "audio":
                            said = (choice.get("audio_metadata") or {}).get("sample_rate_hz")
                            yield EngineAudio(*decode_audio(content, said or self.default_rate))
                        else:
                            yield TextDelta(content)
                    for call in delta.get("tool_calls") or ():
                        built = calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                        function = call.get("function") or {}
                        built["id"] = call.get("id") or built["id"]
                        built["name"] += function.get("name") or ""
                        built["arguments"] += function.get("arguments") or ""
                    if choice.get("finish_reason") == "length":
                        usage.hit_max_tokens = True
                    if choice.get("finish_reason") is not None:
                        for _, call in sorted(calls.items()):
                            yield ToolCall(call["id"], call["name"], call["arguments"] or "{}")
                        calls.clear()
                u = chunk.get("usage")
                if u:
                    usage.input_tokens = u.get("prompt_tokens") or 0
                    usage.output_tokens = u.get("completion_tokens") or 0
                    usage.cached_tokens = ((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        yield usage


# ---------------------------------------------------------------------------------- in-process


class InProcessOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str = ""  # what AsyncOmni loads: a local directory (no hub here) or a model name
    engine_args: dict[str, Any] = msgspec.field(default_factory=dict)  # AsyncOmni(**): deploy_config, async_chunk, ...
    engine_class: str = "vllm_omni.entrypoints.async_omni:AsyncOmni"  # module:attribute (tests: the fake)
    chat_template: str | None = None  # a Jinja chat template file; None: the model's own (its tokenizer's)
    stream_input: bool = True  # feed the open turn's audio into the Thinker while the user speaks
    stream_segment_s: float = 0.96  # audio per streamed segment


class ChatRenderer:
    """Messages -> the prompt text the model's chat template makes of them, with the media parts
    replaced by ``{"type": "audio"}`` / ``{"type": "image"}`` (what the Qwen-Omni and Ming templates
    turn into their placeholder tokens) and the media themselves listed in order."""

    def __init__(self, template: str) -> None:
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(template)

    @classmethod
    def for_model(cls, options: InProcessOptions) -> ChatRenderer:
        if options.chat_template is not None:
            with open(options.chat_template, encoding="utf-8") as f:
                return cls(f.read())
        from transformers import AutoProcessor, AutoTokenizer

        template = None
        with contextlib.suppress(Exception):
            template = AutoProcessor.from_pretrained(options.model).chat_template
        if not template:
            template = AutoTokenizer.from_pretrained(options.model).chat_template
        if not template:
            raise ValueError(f"{options.model} has no chat template; set in_process.chat_template")
        return cls(template)

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool = True) -> tuple[str, dict[str, list[Any]]]:
        conversation: list[dict[str, Any]] = []
        media: dict[str, list[Any]] = {}
        for message in messages:
            content = message["content"]
            if isinstance(content, str):
                conversation.append({"role": message["role"], "content": content})
                continue
            parts = []
            for part in content:
                kind = part.get("type")
                if kind == "input_audio":
                    media.setdefault("audio", []).append(_waveform(part["input_audio"]["data"]))
                    parts.append({"type": "audio"})
                elif kind == "image_url":
                    media.setdefault("image", []).append(_image(part["image_url"]["url"]))
                    parts.append({"type": "image"})
                else:
                    parts.append({"type": "text", "text": part.get("text", "")})
            conversation.append({"role": message["role"], "content": parts})
        text = self.template.render(messages=conversation, add_generation_prompt=generation_prompt)
        return text, media


def _raise(message: str) -> None:
    raise ValueError(message)


def _waveform(data: str) -> tuple[np.ndarray, int]:
    pcm, rate = (data.pcm, data.rate) if isinstance(data, Clip) else decode_audio(data, 16000)
    return (pcm.astype(np.float32) / 32768.0, rate)


def _image(url: str) -> Any:
    from PIL import Image

    raw = base64.b64decode(url.split(",", 1)[1]) if url.startswith("data:") else open(url, "rb").read()  # noqa: SIM115
    image = Image.open(io.BytesIO(raw))
    image.load()
    return image.convert("RGB")


def _load(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


class LocalOmni:
    """vLLM-Omni's ``AsyncOmni`` in this process."""

    def __init__(self, options: InProcessOptions) -> None:
        self.options = options
        self.engine: Any = None
        self.renderer: ChatRenderer | None = None
        self.last_error: str | None = None
        self.counts = {"engine_requests": 0, "engine_failures": 0, "engine_aborts": 0}
        self.streaming_input: Any = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        o = self.options
        self.renderer = await loop.run_in_executor(None, ChatRenderer.for_model, o)
        engine_class = _load(o.engine_class)
        self.engine = await loop.run_in_executor(None, lambda: engine_class(model=o.model, **o.engine_args))
        self.streaming_input = _streaming_input_class()

    async def stop(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.shutdown()

    @property
    def healthy(self) -> bool:
        e = self.engine
        return e is not None and not getattr(e, "errored", False) and getattr(e, "dead_error", None) is None

    def stats(self) -> dict[str, float]:
        return {**self.counts, "engine_healthy": float(self.healthy)}

    def prompt(self, body: dict[str, Any], messages: list[dict[str, Any]] | None = None, *, generation_prompt: bool = True) -> dict[str, Any]:
        """The engine prompt vLLM-Omni's chat serving would make of ``body``."""
        assert self.renderer is not None, "the engine is not started"
        text, media = self.renderer.render(body["messages"] if messages is None else messages, generation_prompt=generation_prompt)
        prompt: dict[str, Any] = {"prompt": text}
        if media:
            prompt["multi_modal_data"] = {k: v if len(v) > 1 else v[0] for k, v in media.items()}
        if body.get("cache_salt") is not None:
            prompt["cache_salt"] = body["cache_salt"]
        if body.get("speaker"):
            prompt["additional_information"] = {"speaker": [body["speaker"]]}
        return prompt

    def sampling_params(self, body: dict[str, Any], *, max_tokens: int | None = None) -> list[Any]:
        """The deployment's per-stage defaults with the Thinker's budget and temperature set, every
        stage streaming deltas (as vLLM-Omni's own streaming paths coerce them)."""
        stage0: dict[str, Any] = {"max_tokens": max_tokens or body.get("max_tokens")}
        if body.get("temperature") is not None:
            stage0["temperature"] = body["temperature"]
        defaults = list(getattr(self.engine, "default_sampling_params_list", None) or [])
        if not defaults:  # an engine without per-stage defaults (vLLM-Omni always has them): the Thinker's alone
            return [SimpleNamespace(**stage0)]
        out = []
        for index, params in enumerate(defaults):
            params = params.clone() if hasattr(params, "clone") else copy.copy(params)
            if index == 0:
                for key, value in stage0.items():
                    setattr(params, key, value)
            if hasattr(params, "output_kind"):
                params.output_kind = type(params.output_kind).DELTA  # vLLM's RequestOutputKind
            out.append(params)
        return out

    def open_turn(self, body: dict[str, Any], history: list[dict[str, Any]]) -> StreamedTurn:
        return StreamedTurn(self, body, history)

    async def stream(self, body: dict[str, Any], turn: StreamedTurn | None = None) -> AsyncGenerator[EngineOutput, None]:
        """``turn``: answer a streamed turn (its input, then its answer once ``finish``ed)."""
        if self.engine is None:
            raise EngineError("the in-process engine is not running")
        self.counts["engine_requests"] += 1
        modalities = list(body.get("modalities") or ["text", "audio"])
        outputs = self.engine.generate(
            self.prompt(body) if turn is None else turn.chunks(),
            request_id=f"ro-{uuid.uuid4().hex}",
            sampling_params_list=self.sampling_params(body),
            output_modalities=modalities,
        )
        reader = _OutputReader()
        prefill_tokens = 0
        answering = turn is None
        try:
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    if not answering:  # a streamed turn's prefill outputs (one sampled token each): dropped
                        if getattr(output, "final_output_type", "text") != "text":
                            continue
                        if not (turn is not None and turn.finished and prefill_tokens >= turn.prefill_chunks):
                            prefill_tokens += sum(len(c.token_ids or ()) for c in output.outputs or ())
                            continue
                        answering = True
                    for piece in reader.read(output):
                        yield piece
        except (GeneratorExit, asyncio.CancelledError):
            self.counts["engine_aborts"] += 1
            raise
        except EngineError:
            raise
        except Exception as exc:  # the engine's own failure: a dead stage, a bad prompt
            self.counts["engine_failures"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("in-process engine: %s", self.last_error)
            raise EngineError(f"the engine failed: {self.last_error}") from exc
        yield reader.usage


class _OutputReader:
    """``OmniRequestOutput``s (delta mode) -> text deltas, new audio samples and usage."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.audio_seen = 0  # list entries already relayed
        self.audio_samples = 0  # samples relayed from a waveform that grows in place
        self.started = time.perf_counter()

    def read(self, output: Any) -> list[EngineOutput]:
        if getattr(output, "error", None):
            raise EngineError(str(output.error), status=getattr(output, "error_status_code", None))
        pieces: list[EngineOutput] = []
        if getattr(output, "final_output_type", "text") == "text":
            for completion in output.outputs or ():
                if completion.text:
                    pieces.append(TextDelta(completion.text))
                self.usage.output_tokens += len(completion.token_ids or ())
                if completion.finish_reason == "length":
                    self.usage.hit_max_tokens = True
            if output.prompt_token_ids:
                self.usage.input_tokens = len(output.prompt_token_ids)
            if output.num_cached_tokens is not None:
                self.usage.cached_tokens = output.num_cached_tokens
            return pieces
        mm = output.multimodal_output
        if not isinstance(mm, Mapping) or mm.get("audio") is None:
            return pieces
        rate = _number(mm.get("sr") or mm.get("sample_rate") or 24000)
        audio = mm["audio"]
        if isinstance(audio, (list, tuple)):  # grows by one waveform per output
            fresh = [_numpy(a) for a in audio[self.audio_seen :]]
            self.audio_seen = len(audio)
        else:  # one waveform that grows in place
            whole = _numpy(audio)
            fresh = [whole[self.audio_samples :]]
            self.audio_samples = len(whole)
        for waveform in fresh:
            if len(waveform):
                pieces.append(EngineAudio(np.clip(np.rint(waveform * 32767.0), -32768, 32767).astype(np.int16), rate))
        return pieces


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _number(value: Any) -> int:
    if isinstance(value, (list, tuple)) and value:
        value = value[-1]
    if hasattr(value, "item"):
        value = value.item()
    return int(value)


# ---------------------------------------------------------------------------------- streamed input

_CUT = "\ue000"  # a private-use character no template writes: where a partial render is cut


class StreamedTurn:
    """The open user turn fed to the in-process Thinker while it is spoken (vLLM's ``StreamingInput``:
    one resumable request, stage 0 only, ``n == 1``, no stop strings).

    Chunk k is the prompt text that segment k adds (the first one also carries the history) with
    that segment's audio, and ``max_tokens=1``: a prefill (vLLM keeps a chunk's computed tokens and
    drops the one token it sampled, so nothing enters the prompt). ``finish`` sends the rest of the
    template (the end of the user turn, the assistant's header) with the answer's own sampling
    params and ends the input, and the answer streams. The text of chunk k is the template's render
    of the history and k audio parts, cut where the turn would go on; if a render does not extend
    the previous one the template cannot be streamed, and the turn is answered the ordinary way.
    """

    def __init__(self, engine: LocalOmni, body: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self.engine = engine
        self.body = body  # the request the turn was opened for (modalities, speaker, salt)
        self.history = history  # the messages before the turn
        self.segments: list[Clip] = []
        self.sent_text = ""
        self.valid = True
        self.finished = False
        self.prefill_chunks = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=256)
        self._streaming_input = engine.streaming_input
        self.output: AsyncIterator[EngineOutput] | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The request's messages once the turn ends here: the history and the segments sent."""
        return self._turn(len(self.segments), None)

    def _turn(self, k: int, tail: str | None) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = [{"type": "input_audio", "input_audio": {"data": c, "format": "wav"}} for c in self.segments[:k]]
        if tail is not None:
            parts.append({"type": "text", "text": tail})
        return [*self.history, {"role": "user", "content": parts}]

    def push(self, clip: Clip) -> bool:
        """Send one more segment of the turn's audio; False when the turn cannot be streamed."""
        if not self.valid or self.finished:
            return False
        self.segments.append(clip)
        text = self.engine.prompt(self.body, self._turn(len(self.segments), _CUT), generation_prompt=False)["prompt"]
        text = text.split(_CUT, 1)[0]
        if not text.startswith(self.sent_text) or self._queue.full():
            self.valid = False
            return False
        prompt = self._chunk(text[len(self.sent_text) :], clip, first=not self.sent_text)
        self.sent_text = text
        params = self.engine.sampling_params(self.body, max_tokens=1)[0]
        self._queue.put_nowait(self._streaming_input(prompt=prompt, sampling_params=params))
        self.prefill_chunks += 1
        return True

    def finish(self, body: dict[str, Any]) -> bool:
        """Close the turn and ask for the answer ``body`` wants; False when it cannot be (then
        ``abort`` it and answer the ordinary way)."""
        if not self.valid or self.finished or body.get("modalities") != self.body.get("modalities"):
            return False
        text = self.engine.prompt(body, self.messages())["prompt"]
        if not text.startswith(self.sent_text):
            return False
        self.finished = True
        prompt = self._chunk(text[len(self.sent_text) :], None, first=False)
        self._queue.put_nowait(self._streaming_input(prompt=prompt, sampling_params=self.engine.sampling_params(body)[0]))
        self._queue.put_nowait(None)  # the end of the input: the request finishes with this answer
        return True

    def _chunk(self, text: str, clip: Clip | None, *, first: bool) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt": text}
        if clip is not None:
            prompt["multi_modal_data"] = {"audio": _waveform(clip)}
        if first and self.body.get("cache_salt") is not None:
            prompt["cache_salt"] = self.body["cache_salt"]
        if first and self.body.get("speaker"):
            prompt["additional_information"] = {"speaker": [self.body["speaker"]]}
        return prompt

    async def chunks(self) -> AsyncIterator[Any]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk


def _streaming_input_class() -> Any:
    """vLLM's ``StreamingInput`` where vLLM is loaded (the real engine imports it); otherwise a
    record with the same two fields."""
    if "vllm" in sys.modules:
        with contextlib.suppress(ImportError):
            from vllm.engine.protocol import StreamingInput

            return StreamingInput
    return namedtuple("StreamingInput", ["prompt", "sampling_params"])
