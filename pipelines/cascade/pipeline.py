"""The embedded CPU voice pipeline: Moonshine or Whisper (listener) -> vLLM Thinker -> Piper (talker/code2wav).

The pipeline holds what every session shares: the models, one worker thread each for the listener and
Piper (they never queue behind one another, and never run on the loop), the thinker's engine, the
accounting, and the speed it measured at start. A client session is a ``CascadeSession``
(``session.py``: the open turn, hearing and answering ahead at its pauses); an answer is a
``CascadeProduction`` (``production.py``: thinker -> clauses -> talker through bounded queues).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dsp.denoise import denoise
from pipelines.base import Capabilities, Pipeline
from pipelines.cascade.session import CascadeSession
from pipelines.cascade.shared import CascadeOptions, Counts
from pipelines.cascade.talker import PiperTalker
from pipelines.cascade.thinker import thinker
from pipelines.cascade.calls.format import template_takes_tools
from pipelines.speed import Speed

if TYPE_CHECKING:
    from pipelines.cascade.listener import Listener, Words

log = logging.getLogger(__name__)

# a typical spoken answer, for measuring the talker and how many thinker tokens a second of speech holds
SPEED_SENTENCE = "The capital of France is Paris, a city famous for its museums, its cafes and its long history."


class CascadePipeline(Pipeline):
    def __init__(self, options: CascadeOptions) -> None:
        self.options = options
        self.capabilities = Capabilities(
            name="cpu-cascade",
            input_rate=16000,
            output_rate=22050,  # Piper's; the session converts to the client's format once
            transcribes_input=True,
            transcription_model=options.asr_model,
            voices=("joe",),
            caption_every_ms=options.hear_every_ms or 1000,
            context_tokens=options.thinker.max_model_len,
        )
        self.thinker = thinker(options.thinker)
        self.listener: Listener | None = None  # (made at start: it loads its runtime)
        self.talker: PiperTalker | None = None
        # one thread each: ASR and TTS never queue behind one another, and never run on the loop
        self.asr_pool = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self.tts_pool = ThreadPoolExecutor(1, thread_name_prefix="tts")
        self.asr_busy = 0  # ASR calls queued or running
        self.sessions: set[CascadeSession] = set()
        self.speed: Speed | None = None  # measured at start (_measure_speed)
        self.counts = Counts()

    async def start(self) -> None:
        from pipelines import models

        loop = asyncio.get_running_loop()
        o = self.options
        log.info("loading models (first start prepares them from their packages) ...")
        # preparing the models (at a first start) off the loop, so that the server answers meanwhile
        asr_dir = str(await asyncio.to_thread(models.ensure, o.asr_model, log.info))
        voice_dir = await asyncio.to_thread(models.ensure, o.voice, log.info)
        from pipelines.cascade.ears import open_listener

        t0 = time.monotonic()
        make = lambda: open_listener(o.asr_model, asr_dir, o.asr_threads, o.asr_beam_size, o.asr_window)  # noqa: E731
        self.listener = await loop.run_in_executor(self.asr_pool, make)
        onnx = next(voice_dir.glob("*.onnx"))
        self.talker = await loop.run_in_executor(self.tts_pool, lambda: PiperTalker(str(onnx), str(onnx) + ".json", o.tts_threads))
        if self.talker.rate != self.capabilities.output_rate:
            self.capabilities = replace(self.capabilities, output_rate=self.talker.rate)
        log.info("listener %s and Piper %s loaded in %.1f s", o.asr_model, o.voice, time.monotonic() - t0)
        await self.thinker.start(log.info)
        if self.options.thinker.prompt_format == "chat" and template_takes_tools(self.thinker.tokenizer):
            self.capabilities = replace(self.capabilities, tools=True)  # function calling in the model's own format
        # warm the listener and the talker too: their first calls pay one-time costs
        await loop.run_in_executor(self.asr_pool, self.listener.transcribe, np.zeros(16000, np.int16))
        await loop.run_in_executor(self.tts_pool, self.talker.speak, "Hello.")
        self.speed = await self._measure_speed()
        warning = self.speed.warning()
        if warning:
            log.warning(warning)
        log.info(
            "CPU cascade ready: thinker %.1f tokens/s, talker real-time factor %.2f, %.2f s of work per second of answer",
            self.speed.thinker_tokens_per_s,
            self.speed.talker_rtf,
            self.speed.load,
        )

    async def _measure_speed(self) -> Speed:
        """The thinker's and the talker's speed on this machine, each measured alone (pipelines/speed.py)."""
        t0 = time.perf_counter()
        pcm = await self.speak(SPEED_SENTENCE)
        synthesis = time.perf_counter() - t0
        audio_s = max(len(pcm) / self.capabilities.output_rate, 1e-3)
        tokens = len(self.thinker.encode(SPEED_SENTENCE))
        rate = await self.thinker.decode_rate()
        if self.options.thinker.model == "smollm2-135m-instruct":
            faster = "the thinker on a faster machine (thinker.engine: remote, docs/cpu-agent.md)"
        else:
            faster = (
                "--config cpu-smollm2 (SmolLM2-135M: about a quarter of the work per token, fewer answers right), "
                "or the thinker on a faster machine (thinker.engine: remote); docs/cpu-agent.md"
            )
        return Speed(round(rate, 2), round(synthesis / audio_s, 3), round(tokens / audio_s, 2), faster)

    def self_check(self) -> dict[str, Any] | None:
        return None if self.speed is None else self.speed.report()

    async def stop(self) -> None:
        await self.thinker.stop()
        self.asr_pool.shutdown(wait=False, cancel_futures=True)
        self.tts_pool.shutdown(wait=False, cancel_futures=True)

    @property
    def healthy(self) -> bool:
        return self.thinker.healthy

    @property
    def failed(self) -> str | None:
        return self.thinker.failed

    def open(self, session_id: str, tenant: str | None = None) -> CascadeSession:
        session = CascadeSession(self, session_id, tenant)
        self.sessions.add(session)
        return session

    def stats(self) -> dict[str, float]:
        stats: dict[str, float] = {"open_sessions": len(self.sessions), **self.counts.stats()}
        stats["speculations_live"] = sum(1 for s in self.sessions if s.ahead.current is not None)
        stats["prompts_streaming"] = sum(1 for s in self.sessions if s.streamed is not None and not s.streamed.used)
        stats.update(self.thinker.stats())
        if self.speed is not None:
            stats.update(self.speed.stats())
        return stats

    async def transcribe(self, pcm: np.ndarray, clean: bool = False, keywords: tuple[str, ...] = ()) -> str:
        """``clean``: the session asked for noise reduction; it runs on the ASR thread too."""
        return (await self.hear(pcm, clean, ends=False, keywords=keywords)).text

    async def hear(self, pcm: np.ndarray, clean: bool = False, ends: bool = True, hint: tuple[int, ...] = (), keywords: tuple[str, ...] = ()) -> Words:
        """The words, and with ``ends`` the listener's probability that they end a sentence there;
        ``hint``: an earlier pass's tokens over the clip's beginning; ``keywords``: the session's
        words to expect."""
        listener = self.listener
        assert listener is not None
        keep = self.options.denoise_keep

        def run() -> Words:
            return listener.hear(denoise(pcm, listener.rate, keep) if clean else pcm, ends, hint, keywords)

        self.asr_busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.asr_pool, run)
        finally:
            self.asr_busy -= 1

    async def speak(self, text: str) -> np.ndarray:
        assert self.talker is not None
        return await asyncio.get_running_loop().run_in_executor(self.tts_pool, self.talker.speak, text)


def create(options: CascadeOptions) -> CascadePipeline:
    return CascadePipeline(options)
