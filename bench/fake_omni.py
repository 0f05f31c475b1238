"""A fake vLLM-Omni 0.30.0 OpenAI server: the wire of a Qwen3-Omni / Qwen2.5-Omni / Ming-Omni
deployment, with no GPU and no model.

What it is: a Starlette app answering ``POST /v1/chat/completions`` (SSE when ``stream: true``,
one JSON body otherwise), ``GET /v1/models`` and ``GET /health`` the way ``vllm serve --omni``
does, over the engine fake in ``bench/fake_async_omni.py`` (so the in-process ``AsyncOmni`` fake
and this server say the same words and play the same tones). Tests and the replay harness use it
as the only stand-in for a GPU deployment.

Run it: ``python -m bench.fake_omni --port 8091 --profile qwen3-omni`` (``--help`` for knobs);
in a test, ``with FakeOmniServer(profile="ming-omni") as server: server.url, server.fake``.

How faithful. Read from vllm_omni 0.30.0 ``entrypoints/openai/serving_chat.py``
(``chat_completion_stream_generator``, ``_create_audio_choice``, ``chat_completion_full_generator``),
``protocol/chat_completion.py``, ``protocol/audio.py``, ``api_server.py`` and vLLM 0.32's protocol
models, and reproduced field for field (pydantic ``exclude_unset`` decides which keys appear):

- The first text chunk is the role chunk (``delta: {"role": "assistant", "content": ""}``,
  ``prompt_token_ids``/``prompt_text`` null). Text chunks carry ``delta.content`` (one word
  each), ``modality: "text"``, ``token_ids``/``logprobs`` null and ``metrics`` ({} until the
  Thinker has finished, then null: vLLM-Omni filters non-empty stage metrics unless
  ``return_stage_metrics`` is asked for). The Thinker's last output is an empty delta with
  ``stop_reason``.
- Audio chunks: ``modality: "audio"``, ``delta: {"role": "assistant", "content": <base64>}``
  where the base64 is of raw s16le when ``audio.format`` is ``"pcm"``/``"pcm16"`` and of a whole
  WAV per chunk otherwise (``"wav"``, the default), an ``audio_metadata`` object (format,
  ``sample_rate_hz``, ``frame_count``, ``channels``) and always a ``usage`` (prompt tokens,
  completion 0).
- ``finish_reason`` is null until every requested modality has finished; only the last chunk of
  the last modality carries ``"stop"`` (or ``"length"``). With
  ``stream_options.include_usage`` a usage chunk follows (``choices: []``, null fields left out,
  ``prompt_tokens_details.cached_tokens`` from the prefix cache simulation and
  ``multimodal_tokens.audio``), then ``data: [DONE]``. ``continuous_usage_stats`` adds usage to
  text chunks.
- Request: ``modalities`` (default ``["text", "audio"]``), ``audio.format``, ``speaker``/``voice``,
  ``cache_salt``, ``sampling_params_list``, ``max_tokens``/``max_completion_tokens``,
  ``return_token_ids``, ``X-Request-Id`` (``id`` becomes ``chatcmpl-<it>``). Unknown modalities
  and audio formats get vLLM-Omni's 400 messages. Errors are vLLM's OpenAI-shaped body:
  ``{"error": {"message", "type", "param", "code"}}``.
- Prompt tokens: each message costs 4 template tokens, ceil(utf8 bytes / 4) per text part and
  ``audio_tokens_per_second`` (25) per second of input audio (WAV, as ``input_audio`` or an
  ``audio_url`` data URL), plus 3 for the generation prompt. Each message's fake token ids are
  derived from its canonical JSON, so the prefix cache (vLLM's block hashing, 16-token blocks,
  salted by ``cache_salt``: different salts never share) reuses exactly the longest prefix of
  identical messages, rounded down to a block.

- Tools (a deployment started with ``--enable-auto-tool-choice --tool-call-parser ...``; the
  knob ``tool_parser=False`` is one without, which answers ``tool_choice`` "auto" with vLLM's 400):
  a request with ``tools`` whose last message is the user's (and ``tool_choice`` not "none") is
  answered with a call of the forced function or the first tool, arguments ``{"seconds": S}``
  (the seconds of audio it heard), streamed as vLLM does: the role chunk, ``delta.tool_calls``
  with the call's id, type and name, the arguments in pieces, ``finish_reason: "tool_calls"``;
  text only (no audio). ``role: "tool"`` messages are accepted as history.

Not reproduced: real tokenization and chat templates, sampling, ``n`` > 1, reasoning,
logprobs, images/video, flac/mp3/opus output, stage metrics contents, load-aware headers.

Test hooks (per app instance through ``Faults``, and per request through the header
``X-Fake-Fault: key=value; key=value``): ``status=503`` answers that status with vLLM's error
body; ``first-chunk-ms=N``/``chunk-ms=N`` delay the first engine output / each later one;
``stall-after=N`` sends N SSE events then waits until the client leaves; ``cut-after=N`` sends N
events then drops the connection (no ``[DONE]``); ``error-after=N`` sends N events then vLLM's
in-stream error event and ``[DONE]``. A client that closes a stream aborts its request. Every
request is recorded (``FakeOmni.requests``: id, parsed body, raw bytes, fault header, outcome;
``FakeOmni.aborted``), and served as JSON at ``GET /fake/requests`` (``POST /fake/reset`` clears).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import io
import json
import socket
import threading
import time
import uuid
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields, replace
from http import HTTPStatus
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bench.fake_async_omni import (
    PROFILES,
    AsyncOmni,
    FakeOmniConfig,
    OmniRequestOutput,
    Timing,
    audio_token_count,
    text_token_count,
    to_pcm16,
    token_id,
)

__all__ = [
    "PROFILES",
    "AsyncOmni",
    "FakeOmni",
    "FakeOmniConfig",
    "FakeOmniServer",
    "Faults",
    "RecordedRequest",
    "create_app",
    "parse_fault_header",
]

FAULT_HEADER = "x-fake-fault"
SUPPORTED_CHAT_AUDIO_FORMATS = frozenset({"wav", "pcm", "flac", "mp3", "opus", "pcm16"})  # protocol/audio.py
ENCODED_AUDIO_FORMATS = frozenset({"wav", "pcm", "pcm16"})  # what this fake can encode
GENERATION_PROMPT = [151644, 77091, 198]  # "<|im_start|>assistant\n"
MESSAGE_OVERHEAD_TOKENS = 4


@dataclass
class Faults:
    """Test hooks; each is also a key of the ``X-Fake-Fault`` header (``first-chunk-ms=50``)."""

    status: int | None = None
    first_chunk_ms: float = 0.0
    chunk_ms: float = 0.0
    stall_after: int | None = None
    cut_after: int | None = None
    error_after: int | None = None

    def merged(self, header: str | None) -> "Faults":
        return replace(self, **parse_fault_header(header)) if header else self


def parse_fault_header(value: str) -> dict[str, Any]:
    """``"cut-after=3; chunk-ms=5"`` -> ``{"cut_after": 3, "chunk_ms": 5.0}``; unknown keys raise."""
    kinds = {f.name: f for f in fields(Faults)}
    out: dict[str, Any] = {}
    for item in value.replace(",", ";").split(";"):
        if not item.strip():
            continue
        key, sep, raw = item.partition("=")
        name = key.strip().lower().replace("-", "_")
        if not sep or name not in kinds:
            raise ValueError(f"bad {FAULT_HEADER} item {item.strip()!r}; keys: {sorted(kinds)}")
        out[name] = float(raw) if name.endswith("_ms") else int(raw)
    return out


@dataclass
class RecordedRequest:
    request_id: str
    body: Any
    raw: bytes
    fault: str | None
    received_at: float
    outcome: str = "pending"  # done | aborted | cut | error-event | status <n> | rejected
    first_audio_at: float | None = None  # time.perf_counter() as the first audio chunk was handed to the socket
    headers: dict[str, str] = field(default_factory=dict)  # as received (a router's affinity header, say)

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "body": self.body,
            "raw": self.raw.decode("utf-8", "replace"),
            "fault": self.fault,
            "received_at": self.received_at,
            "outcome": self.outcome,
            "first_audio_at": self.first_audio_at,
            "headers": self.headers,
        }


class RequestRejected(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type


def error_body(message: str, status: int, err_type: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse.model_dump()``."""
    types = {
        400: "BadRequestError",
        404: "NotFoundError",
        422: "UnprocessableEntityError",
        500: "InternalServerError",
        501: "NotImplementedError",
        503: "ServiceUnavailableError",
    }
    kind = err_type or types.get(status) or HTTPStatus(status).phrase
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --- requests -> engine prompts --------------------------------------------------------------


def _decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data)) as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise RequestRejected(f"fake_omni decodes only WAV input audio: {e}") from e
    if width != 2:
        raise RequestRejected("fake_omni decodes only 16-bit WAV input audio")
    pcm = np.frombuffer(frames, dtype="<i2").reshape(-1, channels).mean(axis=1) / 32768.0
    return pcm.astype(np.float32), rate


def _b64(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestRejected(f"audio is not valid base64: {e}") from e


def _part_audio(part: dict[str, Any]) -> tuple[np.ndarray, int] | None:
    kind = part.get("type")
    if kind == "input_audio":
        payload = part.get("input_audio") or {}
        return _decode_wav(_b64(str(payload.get("data", ""))))
    if kind == "audio_url":
        url = str((part.get("audio_url") or {}).get("url", ""))
        if not url.startswith("data:") or ";base64," not in url:
            raise RequestRejected("fake_omni takes audio_url only as a base64 data URL")
        return _decode_wav(_b64(url.split(";base64,", 1)[1]))
    return None


@dataclass
class RenderedPrompt:
    prompt: dict[str, Any]
    audio_tokens: int


def render_messages(body: dict[str, Any], audio_tokens_per_second: float) -> RenderedPrompt:
    """The engine prompt for a chat request: fake token ids per message (from its canonical JSON,
    so identical messages give identical tokens), the audio clips, the cache salt."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestRejected("'messages' must be a non-empty list", 400)
    ids: list[int] = []
    clips: list[tuple[np.ndarray, int]] = []
    audio_tokens = 0
    for message in messages:
        if not isinstance(message, dict):
            raise RequestRejected("each message must be an object", 400)
        canonical = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        count = MESSAGE_OVERHEAD_TOKENS
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        for part in parts:
            if not isinstance(part, dict):
                raise RequestRejected("each content part must be an object", 400)
            if part.get("type") == "text":
                count += text_token_count(str(part.get("text", "")))
            clip = _part_audio(part)
            if clip is not None:
                clips.append(clip)
                n = audio_token_count(len(clip[0]) / clip[1], audio_tokens_per_second)
                audio_tokens += n
                count += n
        ids += [token_id("message", canonical, k) for k in range(count)]
    prompt: dict[str, Any] = {"prompt_token_ids": ids + GENERATION_PROMPT}
    if clips:
        prompt["multi_modal_data"] = {"audio": clips}
    if body.get("cache_salt") is not None:
        prompt["cache_salt"] = body["cache_salt"]
    return RenderedPrompt(prompt, audio_tokens)


# --- engine outputs -> chunks (serving_chat.py's stream generator, in miniature) --------------


def wav_bytes(pcm: bytes, rate: int) -> bytes:
    """A mono 16-bit WAV of raw s16le ``pcm``."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


def _waveform(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def _sample_rate(mm: dict[str, Any]) -> int:
    sr = mm.get("sr")
    if isinstance(sr, (list, tuple)):
        sr = next((s for s in sr if s is not None), None)
    if sr is None:
        return 24000  # what vLLM-Omni assumes when a talker does not say (Qwen)
    return int(sr.item()) if hasattr(sr, "item") else int(sr)


def encode_audio(waveform: np.ndarray, rate: int, fmt: str) -> tuple[str, dict[str, Any]]:
    """Base64 of one audio chunk, and its ``audio_metadata``."""
    pcm = to_pcm16(waveform)
    data = wav_bytes(pcm, rate) if fmt == "wav" else pcm
    meta = {"format": fmt, "sample_rate_hz": rate, "frame_count": int(len(waveform)), "channels": 1}
    return base64.b64encode(data).decode(), meta


@dataclass
class ChatRequest:
    request_id: str
    model: str
    body: dict[str, Any]
    modalities: list[str]
    audio_format: str
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    audio_tokens: int
    tool_call: str | None = None  # the function this answer calls, if it calls one
    created: int = field(default_factory=lambda: int(time.time()))


class StreamWriter:
    """Turns engine outputs into the chunk dicts vLLM-Omni writes, in its key order."""

    def __init__(self, req: ChatRequest, prompt_tokens_details: bool) -> None:
        self.req = req
        self.details = prompt_tokens_details
        self.first_text = True
        self.prompt_tokens = 0
        self.cached: int | None = None
        self.completion_tokens = 0
        self.seen: set[str] = set()
        self.finished: set[str] = set()
        self.stop_emitted = False
        self.last_metrics: Any = None

    def _head(self) -> dict[str, Any]:
        r = self.req
        return {"id": r.request_id, "object": "chat.completion.chunk", "created": r.created, "model": r.model}

    def _metrics(self, metrics: Any) -> Any:
        return metrics if not metrics or self.req.body.get("return_stage_metrics") else None

    def _usage(self, completion: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
        }

    def _gate(self, modality: str, finish_reason: str | None) -> str | None:
        """Only the last modality to finish carries finish_reason."""
        if finish_reason is None:
            return None
        self.finished.add(modality)
        if self.seen < set(self.req.modalities) or not self.seen <= self.finished:
            return None
        self.stop_emitted = True
        return finish_reason

    def chunks(self, res: OmniRequestOutput) -> list[dict[str, Any]]:
        kind = res.final_output_type
        if kind not in self.req.modalities:
            return []
        self.seen.add(kind)
        if res.metrics:
            self.last_metrics = res.metrics
        out: list[dict[str, Any]] = []
        if kind == "text":
            if self.first_text:
                self.first_text = False
                self.prompt_tokens = len(res.prompt_token_ids or [])
                self.cached = res.num_cached_tokens
                role = self._head() | {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                }
                if self.req.continuous_usage:
                    role["usage"] = self._usage(0)
                role |= {
                    "prompt_token_ids": res.prompt_token_ids if self.req.return_token_ids else None,
                    "prompt_text": None,
                    "modality": "text",
                }
                out.append(role)
            for o in res.outputs:
                self.completion_tokens += len(o.token_ids)
                choice: dict[str, Any] = {
                    "index": o.index,
                    "delta": {"content": o.text},
                    "logprobs": None,
                    "finish_reason": None,
                }
                if o.finish_reason is not None:
                    choice["finish_reason"] = self._gate("text", o.finish_reason)
                    choice["stop_reason"] = o.stop_reason
                choice["token_ids"] = list(o.token_ids) if self.req.return_token_ids else None
                chunk = self._head() | {"choices": [choice]}
                if self.req.continuous_usage:
                    chunk["usage"] = self._usage(self.completion_tokens)
                chunk |= {"metrics": self._metrics(res.metrics), "modality": "text"}
                out.append(chunk)
            return out
        # audio
        mm = res.multimodal_output or {}
        audio = mm.get("audio")
        waveform = audio[-1] if isinstance(audio, list) and audio else (None if isinstance(audio, list) else audio)
        choices = []
        for o in res.outputs:
            delta: dict[str, Any] = {"role": "assistant", "content": ""}
            choice = {"index": o.index, "delta": delta, "logprobs": None}
            meta = None
            if waveform is not None:
                delta["content"], meta = encode_audio(_waveform(waveform), _sample_rate(mm), self.req.audio_format)
            choice |= {
                "finish_reason": self._gate("audio", o.finish_reason),
                "stop_reason": o.stop_reason,
                "token_ids": list(o.token_ids) if self.req.return_token_ids else None,
            }
            if meta is not None:
                choice["audio_metadata"] = meta
            choices.append(choice)
        chunk = self._head() | {"choices": choices, "usage": self._usage(0)}
        chunk |= {"metrics": self._metrics(res.metrics), "modality": "audio"}
        return [chunk]

    def tool_call(self, name: str, arguments: str) -> list[dict[str, Any]]:
        """A call of ``name`` as vLLM's streaming tool parser writes it, once the Thinker is done."""
        self.stop_emitted = True
        call_id = f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"
        cut = len(arguments) // 2
        deltas = [
            {"tool_calls": [{"id": call_id, "type": "function", "index": 0, "function": {"name": name, "arguments": ""}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:cut]}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": arguments[cut:]}}]},
        ]
        out = [self._head() | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}], "modality": "text"}]
        for delta in deltas:
            out.append(self._head() | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}], "modality": "text"})
        out.append(self._head() | {"choices": [{"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "tool_calls", "stop_reason": None}], "modality": "text"})
        return out

    def tail(self) -> list[dict[str, Any]]:
        out = []
        if self.finished and not self.stop_emitted:
            out.append(self._head() | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if self.req.include_usage:
            usage = self._usage(self.completion_tokens)
            details: dict[str, Any] = {}
            if self.cached is not None:
                details["cached_tokens"] = self.cached
            if self.req.audio_tokens:
                details["multimodal_tokens"] = {"audio": self.req.audio_tokens}
            if self.details and details:
                usage["prompt_tokens_details"] = details
            chunk = self._head() | {"choices": [], "usage": usage}
            metrics = self._metrics(self.last_metrics)
            if metrics is not None:
                chunk["metrics"] = metrics
            out.append(chunk)
        return out


# --- the app ---------------------------------------------------------------------------------


class FakeOmni:
    """One fake deployment: its engine, its faults, and what it was asked."""

    def __init__(
        self,
        config: FakeOmniConfig | None = None,
        faults: Faults | None = None,
        *,
        prompt_tokens_details: bool = True,
        tool_parser: bool = True,
        **config_knobs: Any,
    ) -> None:
        self.tool_parser = tool_parser
        self.config = replace(config or FakeOmniConfig(), **config_knobs)
        self.config.deployment  # noqa: B018 - an unknown profile fails here, not on the first request
        timing = self.config.timing
        self.faults = faults or Faults(first_chunk_ms=timing.first_chunk_ms, chunk_ms=timing.chunk_ms)
        self.prompt_tokens_details = prompt_tokens_details
        self.engine = AsyncOmni(model=self.config.served_model, fake_config=self.config)
        self.requests: list[RecordedRequest] = []
        self._changed = threading.Condition()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/fake/requests", self.recorded, methods=["GET"]),
                Route("/fake/reset", self.reset_endpoint, methods=["POST"]),
            ]
        )
        self.app.state.fake = self

    # records

    @property
    def aborted(self) -> list[str]:
        return list(self.engine.aborted)

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    def request(self, request_id: str) -> RecordedRequest:
        return next(r for r in self.requests if r.request_id == request_id)

    def _set_outcome(self, record: RecordedRequest, outcome: str) -> None:
        with self._changed:
            record.outcome = outcome
            self._changed.notify_all()

    def wait_outcome(self, request_id: str, timeout: float = 30.0) -> str:
        """The request's outcome once it has one (from any thread); raises TimeoutError if none comes."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [r for r in self.requests if r.request_id == request_id and r.outcome != "pending"]
                if found:
                    return found[0].outcome
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"request {request_id} has no outcome")
                self._changed.wait(left)

    def reset(self) -> None:
        with self._changed:
            self.requests.clear()
            self.engine.aborted.clear()
            self.engine.completed.clear()
            self.engine.prompts.clear()
            self.engine.prefix_cache.clear()

    # endpoints

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "healthy"})

    async def models(self, request: Request) -> Response:
        model = self.config.served_model
        card = {
            "id": model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": 32768,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def recorded(self, request: Request) -> Response:
        return JSONResponse({"requests": [r.to_json() for r in self.requests], "aborted": self.aborted})

    async def reset_endpoint(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"ok": True})

    async def chat_completions(self, request: Request) -> Response:
        raw = await request.body()
        header = request.headers.get(FAULT_HEADER)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        record = RecordedRequest("", body, raw, header, time.time(), headers=dict(request.headers))
        with self._changed:
            self.requests.append(record)
        try:
            faults = self.faults.merged(header)
        except ValueError as e:
            self._set_outcome(record, "rejected")
            return JSONResponse(error_body(str(e), 400, "FakeFaultError"), status_code=400)
        if faults.status is not None:
            self._set_outcome(record, f"status {faults.status}")
            message = f"fake_omni: injected status {faults.status}"
            return JSONResponse(error_body(message, faults.status), status_code=faults.status)
        try:
            req, prompt = self._parse(body, request)
        except RequestRejected as e:
            self._set_outcome(record, "rejected")
            return JSONResponse(error_body(str(e), e.status, e.err_type), status_code=e.status)
        record.request_id = req.request_id
        timing = Timing(faults.first_chunk_ms, faults.chunk_ms)
        outputs = self.engine.fake_generate(
            prompt.prompt,
            request_id=req.request_id,
            sampling_params_list=body.get("sampling_params_list") or [{"max_tokens": _max_tokens(body)}],
            output_modalities=["text"] if req.tool_call else req.modalities,
            timing=timing,
        )
        if body.get("stream"):
            clips = (prompt.prompt.get("multi_modal_data") or {}).get("audio") or []
            return _EventStream(self, record, req, outputs, faults, clips)
        return await self._full(record, req, outputs)

    def _parse(self, body: Any, request: Request) -> tuple[ChatRequest, Any]:
        if not isinstance(body, dict):
            raise RequestRejected("request body must be a JSON object")
        modalities = body.get("modalities")
        if modalities is None:
            modalities = list(self.engine.output_modalities)
        if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities):
            raise RequestRejected("'modalities' must be a list of strings.")
        allowed = set(self.engine.output_modalities)
        unsupported = set(modalities) - allowed
        if unsupported:
            raise RequestRejected(
                f"Unsupported output modalities {', '.join(sorted(unsupported))} for this model. "
                f"Supported modalities: {', '.join(sorted(allowed))}"
            )
        audio = body.get("audio")
        fmt = audio.get("format", "wav") if isinstance(audio, dict) else "wav"
        if "audio" in modalities:
            if fmt not in SUPPORTED_CHAT_AUDIO_FORMATS:
                raise RequestRejected(
                    f"Invalid audio format '{fmt}'. Supported formats: {sorted(SUPPORTED_CHAT_AUDIO_FORMATS)}"
                )
            if fmt not in ENCODED_AUDIO_FORMATS:
                raise RequestRejected(f"fake_omni encodes only {sorted(ENCODED_AUDIO_FORMATS)}, not {fmt!r}")
        fmt = "pcm" if fmt == "pcm16" else fmt
        served = self.config.served_model
        if body.get("model") not in (None, served):  # vLLM's _check_model
            raise RequestRejected(f"The model `{body['model']}` does not exist.", 404, "NotFoundError")
        rendered = render_messages(body, self.config.audio_tokens_per_second)
        tool_call = self._tool_call(body)
        base = request.headers.get("x-request-id") or body.get("request_id") or uuid.uuid4().hex
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        req = ChatRequest(
            request_id=f"chatcmpl-{base}",
            model=served,
            body=body,
            modalities=modalities,
            audio_format=fmt,
            include_usage=include_usage,
            continuous_usage=include_usage and bool(options.get("continuous_usage_stats")),
            return_token_ids=bool(body.get("return_token_ids")),
            audio_tokens=rendered.audio_tokens,
            tool_call=tool_call,
        )
        return req, rendered

    def _tool_call(self, body: dict[str, Any]) -> str | None:
        """The function the answer calls, as vLLM's serving decides what to parse (see module doc)."""
        tools = body.get("tools")
        choice = body.get("tool_choice", "auto" if tools else "none")
        if not tools or choice == "none":
            return None
        if choice == "auto" and not self.tool_parser:
            raise RequestRejected('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        if body["messages"][-1].get("role") != "user":
            return None  # after a tool's result: the model answers in words
        if isinstance(choice, dict):
            return str(choice["function"]["name"])
        return str(tools[0]["function"]["name"])

    async def _full(
        self, record: RecordedRequest, req: ChatRequest, outputs: AsyncIterator[OmniRequestOutput]
    ) -> Response:
        """The non-streaming answer: chat_completion_full_generator's shape."""
        text: list[str] = []
        waves: list[np.ndarray] = []
        rate = 24000
        prompt_ids: list[int] = []
        cached: int | None = None
        completion = 0
        finish: str | None = None
        async with contextlib.aclosing(outputs) as stream:
            async for res in stream:
                for o in res.outputs:
                    if res.final_output_type == "text":
                        text.append(o.text)
                        completion += len(o.token_ids)
                        prompt_ids = res.prompt_token_ids or prompt_ids
                        cached = res.num_cached_tokens
                        finish = o.finish_reason or finish
                    elif res.finished:
                        mm = res.multimodal_output or {}
                        waves = [_waveform(w) for w in mm.get("audio") or []]
                        rate = _sample_rate(mm)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(text) if "text" in req.modalities else None,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish or "stop",
            "stop_reason": None,
            "token_ids": None,
        }
        if "audio" in req.modalities and waves:
            data, meta = encode_audio(np.concatenate(waves), rate, req.audio_format)
            message["audio"] = {
                "id": f"audio-{uuid.uuid4().hex[:16]}",
                "data": data,
                "expires_at": int(time.time()) + 24 * 3600,
                "transcript": "",
            }
            choice["audio_metadata"] = meta
        prompt_tokens = len(prompt_ids)
        details = None
        if self.prompt_tokens_details and (cached is not None or req.audio_tokens):
            details = {
                "cached_tokens": cached,
                "created_cache_tokens": None,
                "multimodal_tokens": {"audio": req.audio_tokens} if req.audio_tokens else None,
            }
        body = {
            "id": req.request_id,
            "object": "chat.completion",
            "created": req.created,
            "model": req.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
                "prompt_tokens_details": details,
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "metrics": None,
        }
        self._set_outcome(record, "done")
        return JSONResponse(body)


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return int(value) if isinstance(value, int) else None


class _EventStream:
    """The SSE answer as a bare ASGI response, so that it can watch for the client leaving (abort),
    stall, and drop the connection without finishing the body."""

    def __init__(
        self,
        fake: FakeOmni,
        record: RecordedRequest,
        req: ChatRequest,
        outputs: AsyncIterator[OmniRequestOutput],
        faults: Faults,
        clips: list[tuple[np.ndarray, int]] = (),  # type: ignore[assignment]
    ) -> None:
        self.fake = fake
        self.record = record
        self.req = req
        self.outputs = outputs
        self.faults = faults
        self.clips = clips

    async def _events(self) -> AsyncIterator[str]:
        writer = StreamWriter(self.req, self.fake.prompt_tokens_details)
        async with contextlib.aclosing(self.outputs) as stream:
            async for res in stream:
                if self.req.tool_call is None:
                    for chunk in writer.chunks(res):
                        yield f"data: {_dumps(chunk)}\n\n"
                elif res.final_output_type == "text":  # the Thinker writes the call; the parser streams it
                    writer.prompt_tokens = len(res.prompt_token_ids or []) or writer.prompt_tokens
                    writer.cached = res.num_cached_tokens if res.num_cached_tokens is not None else writer.cached
                    writer.completion_tokens += sum(len(o.token_ids) for o in res.outputs)
        if self.req.tool_call is not None:
            seconds = sum(len(w) / rate for w, rate in self.clips)
            for chunk in writer.tool_call(self.req.tool_call, json.dumps({"seconds": round(seconds, 1)})):
                yield f"data: {_dumps(chunk)}\n\n"
        for chunk in writer.tail():
            # the usage chunk is dumped with exclude_none; the fallback stop chunk has no None
            yield f"data: {_dumps(chunk)}\n\n"

    async def _produce(self, send: Send) -> str:
        f = self.faults
        sent = 0
        async with contextlib.aclosing(self._events()) as events:
            async for event in events:
                if f.cut_after is not None and sent >= f.cut_after:
                    return "cut"
                if f.stall_after is not None and sent >= f.stall_after:
                    await asyncio.Event().wait()
                if f.error_after is not None and sent >= f.error_after:
                    err = error_body("fake_omni: injected error mid-stream", 500)
                    await send({"type": "http.response.body", "body": f"data: {json.dumps(err)}\n\n".encode(), "more_body": True})
                    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
                    return "error-event"
                if self.record.first_audio_at is None and '"modality":"audio"' in event:
                    self.record.first_audio_at = time.perf_counter()
                await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
                sent += 1
        if f.cut_after is not None and sent >= f.cut_after:
            return "cut"
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        return "done"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        producer = asyncio.ensure_future(self._produce(send))
        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (producer, watcher):
                task.cancel()
            await asyncio.gather(producer, watcher, return_exceptions=True)
        if producer.done() and not producer.cancelled() and producer.exception() is None:
            outcome = producer.result()
        else:
            outcome = "aborted"
        self.fake._set_outcome(self.record, outcome)
        # "cut": returning without the final body makes uvicorn close the connection mid-stream


def create_app(config: FakeOmniConfig | None = None, faults: Faults | None = None, **knobs: Any) -> Starlette:
    """The fake's ASGI app; its ``FakeOmni`` is ``app.state.fake``."""
    return FakeOmni(config, faults, **knobs).app


class FakeOmniServer:
    """The fake on a real socket (127.0.0.1, a free port) in a thread; a context manager."""

    def __init__(
        self, config: FakeOmniConfig | None = None, faults: Faults | None = None, *, host: str = "127.0.0.1", **knobs: Any
    ) -> None:
        self.fake = FakeOmni(config, faults, **knobs)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.host = host
        self.port = self._sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.fake.app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._run, name=f"fake-omni-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self._sock]))

    def start(self) -> "FakeOmniServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fake_omni did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    def __enter__(self) -> "FakeOmniServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fake_omni", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--profile", choices=sorted(PROFILES), default="qwen3-omni")
    p.add_argument("--model", default=None, help="served model name (the profile's by default)")
    p.add_argument("--reply", default=FakeOmniConfig.reply, help="reply template: {seconds}, {last_seconds}")
    p.add_argument("--word-audio-ms", type=int, default=FakeOmniConfig.word_audio_ms)
    p.add_argument("--first-chunk-ms", type=float, default=0.0)
    p.add_argument("--chunk-ms", type=float, default=0.0)
    p.add_argument("--no-prefix-caching", action="store_true", help="as the stock deploy YAMLs run")
    p.add_argument("--fault", default="", help=f"default {FAULT_HEADER} for every request, e.g. 'cut-after=3'")
    a = p.parse_args(argv)
    config = FakeOmniConfig(
        profile=a.profile,
        model=a.model,
        reply=a.reply,
        word_audio_ms=a.word_audio_ms,
        prefix_caching=not a.no_prefix_caching,
    )
    faults = Faults(first_chunk_ms=a.first_chunk_ms, chunk_ms=a.chunk_ms).merged(a.fault)
    uvicorn.run(create_app(config, faults), host=a.host, port=a.port, log_level="info")


if __name__ == "__main__":
    main()
