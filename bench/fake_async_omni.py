"""A stand-in for vLLM-Omni 0.30.0's ``AsyncOmni`` engine: the same constructor and methods, no GPU.

What it is: the engine half of the fake vLLM-Omni (``bench/fake_omni.py`` is the HTTP half and is
built on this one, so both give the same words and the same audio). ``AsyncOmni(model=...)``
answers ``generate(prompt, request_id=..., sampling_params_list=..., output_modalities=...)`` with
an async generator of ``OmniRequestOutput``-shaped objects and honours ``abort(request_id)``.

How faithful (read from vllm_omni 0.30.0: ``entrypoints/async_omni.py``, ``outputs/__init__.py``,
``entrypoints/openai/serving_chat.py`` ``_create_audio_choice``, ``deploy/*.yaml``):

- Outputs carry the attributes an engine user reads: ``request_id``, ``finished`` (per stage:
  the Thinker's last text output is ``finished`` while audio is still to come), ``stage_id``,
  ``final_output_type`` ("text" or "audio"), ``prompt_token_ids``, ``num_cached_tokens``,
  ``metrics``, ``outputs[0]`` (``index``, ``text``, ``token_ids``, ``finish_reason``,
  ``stop_reason``, ``multimodal_output``) and the ``multimodal_output`` property. Text comes as
  deltas (the output kind ``AsyncOmni`` coerces to when no sampling params are given); a
  stage-0 sampling params object whose ``output_kind`` is named ``FINAL_ONLY`` gets one
  cumulative output per modality instead. ``multimodal_output["audio"]`` is a list that grows by
  one float32 waveform per audio output (a consumer reads ``[-1]`` for the newest chunk or
  concatenates them all); Ming adds ``"sr"`` (44100), the Qwen models leave it out (24000).
  Waveforms are torch tensors when torch imports, numpy arrays otherwise.
- Order: text first, audio after. Qwen3-Omni deploys with ``async_chunk: true``, so its audio
  starts while text still streams (after ``audio_lag`` words, one chunk per word); Qwen2.5-Omni
  and Ming deploy with ``async_chunk: false`` (stages run one after another), so their audio
  comes after the last text output as one waveform. Only the requested output modalities are
  produced (text-only stops at the Thinker; audio-only yields no text outputs).
- Prefix caching is simulated the way vLLM's block hashing works: full blocks of 16 prompt
  tokens, chained hashes, the cache salt mixed into the first block (so different salts never
  share), at most ``len(prompt) - 1`` tokens reused. Note that the stock vLLM-Omni deploy YAMLs
  set ``enable_prefix_caching: false``; ``prefix_caching=False`` reproduces that.
- ``abort(request_id)`` (or closing/cancelling the generator) ends the request; the aborted ids
  are recorded in ``aborted``. An aborted request yields one last output for the stage it was in
  with ``finish_reason="abort"`` when it is aborted through ``abort()``.
- Streaming input: ``generate()`` also takes an async generator of ``StreamingInput``-shaped
  items (``.prompt``, ``.sampling_params``), as vLLM's ``StreamingInput`` dataclass defines them:
  one resumable request that runs a turn per input chunk, with that chunk's sampling params (or
  the request's), over everything sent so far (the prefix cache sees the earlier chunks), and
  ends when the input does. Difference: a chunk limited to one token (a prefill) gets that token
  as text only; what vLLM-Omni's Talker makes of it is not reproduced.

Not reproduced: real tokenization (a text part costs ceil(utf8 bytes / 4) tokens, audio
``audio_tokens_per_second`` tokens per second), sampling, n > 1, tools, reasoning, images/video,
stage metrics beyond a small dict, engine death, sleep/wake, LoRA.

Prompts it understands: a ``str``; a dict with ``prompt`` (text) and/or ``prompt_token_ids``,
optional ``multi_modal_data={"audio": (waveform, rate) | [(waveform, rate), ...]}`` and
``cache_salt``; a list of those (the first is used).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

EOS_TOKEN = 151645  # Qwen's <|im_end|>: the token a finished Thinker output ends with
VOCAB = 150000


@dataclass(frozen=True)
class Profile:
    """What a deployment looks like from outside: its rate, its stages, how its audio streams."""

    name: str
    model: str
    sample_rate: int
    async_chunk: bool  # deploy YAML: audio streams while text does (True) or after it (False)
    audio_stage_id: int
    reports_sr: bool  # whether multimodal_output carries "sr" (Ming does; Qwen relies on 24 kHz)


PROFILES: dict[str, Profile] = {
    "qwen3-omni": Profile("qwen3-omni", "Qwen/Qwen3-Omni-30B-A3B-Instruct", 24000, True, 2, False),
    "qwen2.5-omni": Profile("qwen2.5-omni", "Qwen/Qwen2.5-Omni-7B", 24000, False, 2, False),
    "ming-omni": Profile("ming-omni", "inclusionAI/Ming-flash-omni-2.0", 44100, False, 1, True),
}


@dataclass
class Timing:
    """Latencies of one request: before the first output, and between outputs."""

    first_chunk_ms: float = 0.0
    chunk_ms: float = 0.0


@dataclass
class FakeOmniConfig:
    """The answer and how it is delivered; shared by the engine fake and the HTTP fake."""

    profile: str = "qwen3-omni"
    model: str | None = None  # served model name; the profile's by default
    reply: str = "I heard {seconds} seconds of audio."  # {seconds}: all prompt audio; {last_seconds}: its last clip
    word_audio_ms: int = 240  # one tone per word, this long
    audio_lag: int = 2  # async-chunk profiles: text words before the first audio chunk
    audio_tokens_per_second: float = 25.0
    prefix_caching: bool = True
    block_size: int = 16
    timing: Timing = field(default_factory=Timing)

    @property
    def deployment(self) -> Profile:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; one of {sorted(PROFILES)}")
        return PROFILES[self.profile]

    @property
    def served_model(self) -> str:
        return self.model or self.deployment.model


# --- the shapes an engine user reads -------------------------------------------------------


@dataclass
class CompletionOutput:
    """vLLM's ``CompletionOutput`` as far as the serving layer reads it, plus the
    ``multimodal_output`` vLLM-Omni attaches to it."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None
    multimodal_output: dict[str, Any] = field(default_factory=dict)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class OmniRequestOutput:
    """``vllm_omni.outputs.OmniRequestOutput``'s attributes that an engine user reads."""

    request_id: str = ""
    prompt: Any = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: Any = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    metrics: Any = field(default_factory=dict)
    lora_request: Any = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None
    num_cached_tokens: int | None = None
    num_cache_creation_tokens: int | None = None
    kv_transfer_params: dict[str, Any] | None = None
    stage_id: int | None = None
    replica_id: int | None = None
    final_output_type: str = "text"
    _multimodal_output: dict[str, Any] = field(default_factory=dict)
    stage_durations: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    error_status_code: int | None = None
    error_type: str | None = None

    @property
    def multimodal_output(self) -> Any:
        for output in self.outputs:
            if mm := getattr(output, "multimodal_output", None):
                return mm
        return self._multimodal_output

    @property
    def is_pipeline_output(self) -> bool:
        return self.stage_id is not None


@dataclass
class StreamingInput:
    """vLLM's ``vllm.engine.protocol.StreamingInput``: one chunk of a streamed prompt."""

    prompt: Any
    sampling_params: Any = None


# --- the answer ------------------------------------------------------------------------------


@dataclass
class PromptInfo:
    """What the fake reads from a prompt."""

    token_ids: list[int]
    audio_clips_s: list[float]
    cache_salt: str | None
    audio_tokens: int

    @property
    def audio_seconds(self) -> float:
        return sum(self.audio_clips_s)


def token_id(*parts: object) -> int:
    """A deterministic fake token id for whatever identifies a token."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return 1000 + int.from_bytes(digest, "little") % VOCAB


def text_token_count(text: str) -> int:
    return math.ceil(len(text.encode()) / 4)


def audio_token_count(seconds: float, per_second: float) -> int:
    return math.ceil(seconds * per_second)


def reply_text(config: FakeOmniConfig, info: PromptInfo) -> str:
    clips = info.audio_clips_s
    return config.reply.format(
        seconds=f"{info.audio_seconds:.1f}",
        last_seconds=f"{clips[-1] if clips else 0.0:.1f}",
    )


def reply_words(text: str) -> list[str]:
    """The reply as the deltas it streams in: the first word bare, the rest with a leading space."""
    words = text.split()
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def word_tone(index: int, sample_rate: int, duration_ms: int) -> np.ndarray:
    """Word ``index``'s audio: a sine a semitone above the previous word's, faded in and out."""
    n = int(sample_rate * duration_ms / 1000)
    freq = 220.0 * 2 ** ((index % 24) / 12)
    t = np.arange(n, dtype=np.float64) / sample_rate
    tone = 0.25 * np.sin(2 * np.pi * freq * t)
    fade = min(n // 2, int(sample_rate * 0.005))
    if fade:
        ramp = np.linspace(0.0, 1.0, fade)
        tone[:fade] *= ramp
        tone[-fade:] *= ramp[::-1]
    return tone.astype(np.float32)


def reply_audio(config: FakeOmniConfig, words: Sequence[str]) -> list[np.ndarray]:
    """The audio chunks of a reply: one per word (async chunk) or the whole reply at once."""
    rate = config.deployment.sample_rate
    tones = [word_tone(i, rate, config.word_audio_ms) for i in range(len(words))]
    if config.deployment.async_chunk or not tones:
        return tones
    return [np.concatenate(tones)]


def to_pcm16(waveform: np.ndarray) -> bytes:
    """Float [-1, 1] to s16le the way libsndfile writes PCM_16 (scale by 32767, round)."""
    return np.clip(np.rint(np.asarray(waveform, dtype=np.float64) * 32767), -32768, 32767).astype("<i2").tobytes()


# --- prefix cache ----------------------------------------------------------------------------


class PrefixCache:
    """vLLM's automatic prefix caching in miniature: chained hashes of full blocks, the cache
    salt in the first block's hash, no reuse of the prompt's last token, LRU eviction."""

    def __init__(self, block_size: int = 16, enabled: bool = True, capacity_blocks: int = 1 << 20) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def _hashes(self, salt: str | None, tokens: Sequence[int]) -> list[bytes]:
        hashes: list[bytes] = []
        parent = b""
        for start in range(0, len(tokens) - len(tokens) % self.block_size, self.block_size):
            block = tuple(tokens[start : start + self.block_size])
            extra = (salt,) if start == 0 else ()
            parent = hashlib.sha256(parent + repr((block, extra)).encode()).digest()
            hashes.append(parent)
        return hashes

    def lookup(self, salt: str | None, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` already cached (a multiple of the block size)."""
        if not self.enabled:
            return 0
        hits = 0
        usable = (len(tokens) - 1) // self.block_size
        for h in self._hashes(salt, tokens)[:usable]:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hits += 1
        return hits * self.block_size

    def insert(self, salt: str | None, tokens: Sequence[int]) -> None:
        if not self.enabled:
            return
        for h in self._hashes(salt, tokens):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()


# --- prompts ---------------------------------------------------------------------------------


def _audio_clips(mm: Any) -> list[tuple[np.ndarray, int]]:
    if not mm:
        return []
    audio = mm.get("audio") if isinstance(mm, dict) else None
    if audio is None:
        return []
    if isinstance(audio, tuple) and len(audio) == 2 and np.isscalar(audio[1]):
        audio = [audio]
    clips = []
    for item in audio if isinstance(audio, list) else [audio]:
        if isinstance(item, tuple):
            clips.append((np.asarray(item[0]), int(item[1])))
        else:  # a bare waveform: the omni audio encoders' 16 kHz
            clips.append((np.asarray(item), 16000))
    return clips


def read_prompt(prompt: Any, audio_tokens_per_second: float) -> PromptInfo:
    """Token ids, audio and salt of an engine prompt (see the module docstring for shapes)."""
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    if isinstance(prompt, str):
        prompt = {"prompt": prompt}
    if not isinstance(prompt, dict):
        raise ValueError(f"unsupported prompt type {type(prompt).__name__}")
    clips = _audio_clips(prompt.get("multi_modal_data"))
    seconds = [len(w) / rate for w, rate in clips]
    audio_tokens = sum(audio_token_count(s, audio_tokens_per_second) for s in seconds)
    ids = prompt.get("prompt_token_ids")
    if ids is None:
        text = str(prompt.get("prompt", ""))
        ids = [token_id("text", text, k) for k in range(text_token_count(text))]
        for (w, rate), s in zip(clips, seconds):
            digest = hashlib.sha256(np.ascontiguousarray(w).tobytes() + str(rate).encode()).hexdigest()
            ids += [token_id("audio", digest, k) for k in range(audio_token_count(s, audio_tokens_per_second))]
    return PromptInfo(list(ids), seconds, prompt.get("cache_salt"), audio_tokens)


def _merge_prompts(infos: Sequence[PromptInfo]) -> PromptInfo:
    salt = next((i.cache_salt for i in infos if i.cache_salt is not None), None)
    return PromptInfo(
        [t for i in infos for t in i.token_ids],
        [s for i in infos for s in i.audio_clips_s],
        salt,
        sum(i.audio_tokens for i in infos),
    )


def _output_kind_name(sampling_params_list: Sequence[Any] | None) -> str:
    if not sampling_params_list:
        return "DELTA"
    kind = getattr(sampling_params_list[0], "output_kind", None)
    if kind is None and isinstance(sampling_params_list[0], dict):
        kind = sampling_params_list[0].get("output_kind")
    return str(getattr(kind, "name", kind or "DELTA")).upper()


def _max_tokens(sampling_params_list: Sequence[Any] | None) -> int | None:
    if not sampling_params_list:
        return None
    first = sampling_params_list[0]
    value = first.get("max_tokens") if isinstance(first, dict) else getattr(first, "max_tokens", None)
    return int(value) if value is not None else None


def _tensor(waveform: np.ndarray) -> Any:
    try:
        import torch
    except ImportError:
        return waveform
    return torch.from_numpy(waveform)


# --- the engine ------------------------------------------------------------------------------


@dataclass
class _Live:
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


class AsyncOmni:
    """``vllm_omni.entrypoints.async_omni.AsyncOmni`` with a deterministic answer and no GPU.

    ``AsyncOmni(model="Qwen/Qwen3-Omni-30B-A3B-Instruct")`` picks the profile from the model name;
    pass ``fake_config=FakeOmniConfig(...)`` (or ``profile="ming-omni"``) to choose. Every prompt
    it was given is in ``prompts`` (request id, ``PromptInfo``), every aborted id in ``aborted``.
    """

    def __init__(self, model: str = "", *args: Any, **kwargs: Any) -> None:
        config: FakeOmniConfig | None = kwargs.pop("fake_config", None)
        profile: str | None = kwargs.pop("profile", None)
        if config is None:
            config = FakeOmniConfig(profile=profile or _profile_for(model), model=model or None)
        elif profile is not None:
            config = replace(config, profile=profile)
        self.fake_config = config
        self.model = config.served_model
        self.engine_kwargs = kwargs
        self.output_modalities = ["text", "audio"]
        self.num_stages = 3 if config.deployment.audio_stage_id == 2 else 2
        self.default_sampling_params_list: list[Any] = []
        self.prefix_cache = PrefixCache(config.block_size, config.prefix_caching)
        self.prompts: list[tuple[str, PromptInfo]] = []
        self.inputs: list[tuple[str, Any]] = []  # every prompt as given (each chunk of a streamed one)
        self.aborted: list[str] = []
        self.completed: list[str] = []
        self._live: dict[str, _Live] = {}
        self.errored = False
        self.dead_error: BaseException | None = None

    @property
    def is_running(self) -> bool:
        return True

    @property
    def is_stopped(self) -> bool:
        return False

    async def check_health(self) -> None:
        return None

    def shutdown(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        self.shutdown()

    async def abort(self, request_id: str | Iterable[str], *, timeout: float | None = None) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            live = self._live.get(rid)
            if live is not None:
                live.aborted.set()

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        arrival_time: float | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        if sampling_params_list is None and sampling_params is not None:
            sampling_params_list = [sampling_params]
        inner = self.fake_generate(
            prompt,
            request_id=request_id,
            sampling_params_list=sampling_params_list,
            output_modalities=output_modalities,
        )
        async with contextlib.aclosing(inner):  # closing generate() closes (aborts) the request now
            async for output in inner:
                yield output

    async def fake_generate(
        self,
        prompt: Any,
        *,
        request_id: str = "",
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: list[str] | None = None,
        timing: Timing | None = None,
    ) -> AsyncGenerator[OmniRequestOutput, None]:
        """``generate`` with this request's latencies (the HTTP fake sets them per request)."""
        request_id = request_id or uuid.uuid4().hex
        timing = timing or self.fake_config.timing
        modalities = output_modalities or self.output_modalities
        live = _Live()
        self._live[request_id] = live
        try:
            if isinstance(prompt, AsyncGenerator):  # one resumable request: a turn per input chunk
                infos: list[PromptInfo] = []
                async for chunk in prompt:
                    self.inputs.append((request_id, chunk.prompt))
                    infos.append(read_prompt(chunk.prompt, self.fake_config.audio_tokens_per_second))
                    params = list(sampling_params_list or [None])
                    if chunk.sampling_params is not None:
                        params[0] = chunk.sampling_params
                    prefill = _max_tokens(params) == 1  # a segment's one sampled token: text only here
                    plan = self._plan(_merge_prompts(infos), request_id, ["text"] if prefill else modalities, params)
                    async for output in self._play(plan, live, timing):
                        yield output
                    if live.aborted.is_set():
                        return
            else:
                self.inputs.append((request_id, prompt))
                plan = self._plan(read_prompt(prompt, self.fake_config.audio_tokens_per_second), request_id, modalities, sampling_params_list)
                async for output in self._play(plan, live, timing):
                    yield output
                if live.aborted.is_set():
                    return
            self.completed.append(request_id)
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise
        finally:
            self._live.pop(request_id, None)

    def _plan(self, info: PromptInfo, request_id: str, modalities: Sequence[str], params: Sequence[Any] | None) -> _Plan:
        cached = self.prefix_cache.lookup(info.cache_salt, info.token_ids)
        self.prefix_cache.insert(info.cache_salt, info.token_ids)
        self.prompts.append((request_id, info))
        return _Plan(self.fake_config, info, cached, request_id, modalities, params)

    async def _play(self, plan: _Plan, live: _Live, timing: Timing) -> AsyncGenerator[OmniRequestOutput, None]:
        """A plan's outputs at the request's pace; an abort ends it with the stage's abort output."""
        first = True
        stage = 0
        for output in plan.outputs():
            delay = timing.first_chunk_ms if first else timing.chunk_ms
            first = False
            if delay > 0:
                try:
                    await asyncio.wait_for(live.aborted.wait(), delay / 1000)
                except TimeoutError:
                    pass
            if live.aborted.is_set():
                self.aborted.append(plan.request_id)
                yield plan.aborted(stage)
                return
            stage = output.stage_id or 0
            yield output


def _profile_for(model: str) -> str:
    name = model.lower()
    if "ming" in name:
        return "ming-omni"
    if "qwen2.5" in name or "qwen2_5" in name:
        return "qwen2.5-omni"
    return "qwen3-omni"


class _Plan:
    """The outputs of one request, in the order the deployment produces them."""

    def __init__(
        self,
        config: FakeOmniConfig,
        info: PromptInfo,
        cached: int,
        request_id: str,
        modalities: Sequence[str],
        sampling_params_list: Sequence[Any] | None,
    ) -> None:
        self.config = config
        self.info = info
        self.cached = cached
        self.request_id = request_id
        self.text = "text" in modalities
        self.audio = "audio" in modalities
        self.final_only = _output_kind_name(sampling_params_list) == "FINAL_ONLY"
        words = reply_words(reply_text(config, info))
        limit = _max_tokens(sampling_params_list)
        self.finish_reason = "stop"
        if limit is not None and limit <= len(words):
            words, self.finish_reason = words[:limit], "length"
        self.words = words
        self.word_tokens = [token_id("word", w.strip()) for w in words]
        self.chunks = reply_audio(config, words)
        self.thinker_done = False

    def _metrics(self) -> dict[str, Any]:
        # vLLM-Omni attaches stage metrics once a stage has finished; before that the dict is empty.
        if not self.thinker_done:
            return {}
        out = len(self.word_tokens) + (self.finish_reason == "stop")
        return {
            "stage_id": 0,
            "final_output_type": "text",
            "num_tokens_in": len(self.info.token_ids),
            "num_tokens_out": out,
        }

    def _text(self, text: str, tokens: list[int], finish_reason: str | None) -> OmniRequestOutput:
        if finish_reason is not None:
            self.thinker_done = True
        return OmniRequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.info.token_ids,
            outputs=[CompletionOutput(index=0, text=text, token_ids=tokens, finish_reason=finish_reason)],
            finished=finish_reason is not None,
            metrics=self._metrics(),
            num_cached_tokens=self.cached,
            stage_id=0,
            final_output_type="text",
        )

    def _audio(self, upto: int, last: bool) -> OmniRequestOutput:
        mm: dict[str, Any] = {"audio": [_tensor(c) for c in self.chunks[:upto]]}
        if self.config.deployment.reports_sr:
            mm["sr"] = _tensor(np.array(self.config.deployment.sample_rate, dtype=np.int64))
        return OmniRequestOutput(
            request_id=self.request_id,
            outputs=[CompletionOutput(index=0, finish_reason="stop" if last else None, multimodal_output=mm)],
            finished=last,
            metrics=self._metrics(),
            stage_id=self.config.deployment.audio_stage_id,
            final_output_type="audio",
        )

    def _text_end(self) -> OmniRequestOutput:
        eos = [EOS_TOKEN] if self.finish_reason == "stop" else []
        return self._text("", eos, self.finish_reason)

    def outputs(self) -> Iterable[OmniRequestOutput]:
        n_audio = len(self.chunks)
        if self.final_only:
            if self.text:
                eos = [EOS_TOKEN] if self.finish_reason == "stop" else []
                yield self._text("".join(self.words), self.word_tokens + eos, self.finish_reason)
            if self.audio and n_audio:
                yield self._audio(n_audio, True)
            return
        sent = 0
        lag = max(1, self.config.audio_lag)
        interleave = self.config.deployment.async_chunk
        if self.text:
            for k, (word, tok) in enumerate(zip(self.words, self.word_tokens)):
                yield self._text(word, [tok], None)
                if self.audio and interleave and k + 1 >= lag and sent < n_audio - 1:
                    sent += 1
                    yield self._audio(sent, False)
            yield self._text_end()
        if self.audio:
            while sent < n_audio:
                sent += 1
                yield self._audio(sent, sent == n_audio)

    def aborted(self, stage_id: int) -> OmniRequestOutput:
        kind = "audio" if stage_id else "text"
        return OmniRequestOutput(
            request_id=self.request_id,
            outputs=[CompletionOutput(index=0, finish_reason="abort")],
            finished=True,
            stage_id=stage_id,
            final_output_type=kind,
            num_cached_tokens=self.cached if kind == "text" else None,
        )
