"""The embedded CPU voice pipeline: Whisper (listener) -> vLLM Thinker -> Piper (talker/code2wav).

A response is a chain of stages joined by bounded queues (async chunk): the Thinker streams text,
``clauses`` cuts it at the first clause boundary, and Piper speaks each clause while the Thinker goes
on, so the first audio leaves after the first few words rather than after the whole answer.

**Speculation (incremental prefill).** At every short pause in the user's speech (``pause``), the
session gets ahead of the end of the turn: Whisper transcribes the turn so far, the Thinker is
asked for the answer to (history + that transcript), and the talker speaks its first clause, all
into a bounded buffer nobody reads yet. If the user goes on speaking (``resume``) that work is
aborted; the prompt it sent stays in vLLM's prefix cache, so the next attempt (or the final turn)
only prefills what is new. If the turn ends instead (``commit``), the speculation becomes the
answer when ``respond`` asks for exactly the prompt it already used; otherwise it is dropped and the
answer starts fresh. Nothing speculative reaches the client before ``respond``. The moves and the
adoption rule are ``pipelines/speculation.py``'s, shared with the omni pipeline.
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
from dataclasses import dataclass, replace
from typing import Any, Literal

import msgspec
import numpy as np

from dsp.denoise import denoise

from pipelines.base import (
    AudioChunk,
    Capabilities,
    FunctionCall,
    FunctionResult,
    Heard,
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
from pipelines.speculation import Ahead, Production, Speculation
from pipelines.speed import Speed
from pipelines.stages import chain
from pipelines.cascade.talker import ClausePolicy, PiperTalker, Playback, clauses
from pipelines.cascade.thinker import Generation, StreamedPrompt, ThinkerOptions, Turn, thinker
from pipelines.cascade.tools import SpokenLimit, ToolStream, forced_start, template_takes_tools, tool_specs

log = logging.getLogger(__name__)

# semantic_vad: how long after the transcript the thinker's judgement of it is waited for (one
# engine step, ~75 ms on two AVX2 cores); later, the decision weighs the words without it
JUDGEMENT_WAIT_S = 0.5
# a typical spoken answer, for measuring the talker and how many thinker tokens a second of speech holds
SPEED_SENTENCE = "The capital of France is Paris, a city famous for its museums, its cafes and its long history."


class CascadeOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    asr_model: str = "whisper-tiny.en"  # or whisper-base
    asr_threads: int = 2
    asr_beam_size: int = 1
    asr_window: Literal["fit", "full"] = "fit"  # fit: encode the clip + 1 s, not Whisper's whole 30 s window
    thinker: ThinkerOptions = msgspec.field(default_factory=ThinkerOptions)
    voice: str = "piper-joe"
    tts_threads: int = 1
    denoise_keep: float = 0.5  # noise_reduction: RNNoise, with this share of the original mixed back (bench/noise.py)
    speculate: bool = True  # incremental prefill: work ahead at pauses (off: only after the turn ends)
    # offer the tools again in the answer to a tool's output (tool_choice "auto"): keeps the whole prompt
    # cached across the call, for a thinker that then answers in words; Qwen2.5-Coder-0.5B calls again
    # instead (bench/tools.py), so by default that answer's prompt has no tools (docs/tools.md)
    tools_after_output: bool = False
    async_chunk: bool = True  # speak clause by clause (off: the whole answer, then audio)
    first_clause_words: int = 1  # the first clause may be one word ("Sure,"): it sets the first audio
    first_clause_max_words: int = 2  # failing punctuation, the first clause ends here
    clause_words: int = 5  # later clauses end at punctuation after this many words ...
    hurry_words: int = 2  # ... or after this many once the audio made is less than low_water_ms ahead of playback
    low_water_ms: int = 800
    chunk_ms: int = 100  # audio per chunk sent on
    buffer_chunks: int = 256  # output buffered ahead of the consumer, per response


class CascadeProduction(Production):
    """One cascade answer: thinker -> clauses -> talker (``CascadeSession.stages``)."""

    def __init__(
        self, session: "CascadeSession", request: ResponseRequest, prompt: list[int], times: dict[str, float], streamed: StreamedPrompt | None = None
    ) -> None:
        self.session = session
        self.request = request
        self.prompt = prompt
        self.streamed = streamed  # the engine request its prompt's first part went into while the user spoke
        self.generation = Generation()
        self.calls: ToolStream | None = None  # the answer's tool calls, when tools are offered (``stages``)
        super().__init__(self._produce(), session.options.buffer_chunks, f"produce:{session.session_id}", times)

    async def _produce(self) -> AsyncIterator[OutputChunk]:
        try:
            async with chain(*self.session.stages(self)) as stream:
                async for chunk in stream:
                    yield chunk
            if self.calls is not None:  # after what was said before them
                async for call in self.calls.calls():
                    self.times.setdefault("first_call", time.perf_counter())
                    yield call
                self.session.pipeline.count_calls(self.calls)
        finally:
            if self.calls is not None:
                await self.calls.close()
        g = self.generation
        yield Usage(input_tokens=g.prompt_tokens, cached_tokens=g.cached_tokens, output_tokens=g.output_tokens, hit_max_tokens=g.hit_max_tokens)

    async def cancel(self) -> None:
        await super().cancel()
        if self.streamed is not None:  # never started answering (cancelled before its first step)
            await self.streamed.close()


@dataclass(eq=False, kw_only=True)
class CascadeSpeculation(Speculation[CascadeProduction]):
    """Made at a pause: the ASR pass over the turn so far, then (``task``) the answer to it."""

    request: ResponseRequest
    transcript: asyncio.Future[str]  # the ASR pass: the turn's item keeps it if the turn is committed
    samples: int  # of the turn it transcribes
    ends: asyncio.Future[float | None] | None = None  # semantic_vad: the thinker's judgement of the words

    def void(self) -> None:
        if self.item_id is None:  # nobody else needs its transcript
            self.transcript.cancel()
        if self.ends is not None:
            self.ends.cancel()


async def _heard(spec: CascadeSpeculation) -> str | None:
    """The transcript a speculation's ASR pass made, or None if the pass was voided meanwhile
    (waited on, never cancelled from here: the turn's item may still need it)."""
    await asyncio.wait([spec.transcript])
    voided = spec.transcript.cancelled() or spec.transcript.exception() is not None
    return None if voided else spec.transcript.result()


def _settings(request: ResponseRequest) -> tuple:
    return (request.output_modalities, request.voice, request.max_output_tokens, request.tool_choice, request.parallel_tool_calls)


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
            context_tokens=options.thinker.max_model_len,
        )
        self.thinker = thinker(options.thinker)
        self.listener = None
        self.talker: PiperTalker | None = None
        # one thread each: ASR and TTS never queue behind one another, and never run on the loop
        self.asr_pool = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self.tts_pool = ThreadPoolExecutor(1, thread_name_prefix="tts")
        self.asr_busy = 0  # ASR calls queued or running
        self.sessions: set[CascadeSession] = set()
        self.speed: Speed | None = None  # measured at start (_measure_speed)
        self.counts = {"prefix_warmups": 0, "speculations_started": 0, "speculations_adopted": 0, "speculations_discarded": 0, "responses": 0}
        self.counts.update(words_judged=0, words_judged_streamed=0, tool_calls=0, tool_calls_off_schema=0, tool_calls_unknown=0)

    async def start(self) -> None:
        from pipelines import models

        loop = asyncio.get_running_loop()
        o = self.options
        log.info("loading models (first start prepares them from their packages) ...")
        asr_dir = str(models.ensure(o.asr_model, log.info))
        voice_dir = models.ensure(o.voice, log.info)
        from pipelines.cascade.listener import WhisperListener

        t0 = time.monotonic()
        self.listener = await loop.run_in_executor(self.asr_pool, lambda: WhisperListener(asr_dir, o.asr_threads, o.asr_beam_size, window=o.asr_window))
        onnx = next(voice_dir.glob("*.onnx"))
        self.talker = await loop.run_in_executor(self.tts_pool, lambda: PiperTalker(str(onnx), str(onnx) + ".json", o.tts_threads))
        if self.talker.rate != self.capabilities.output_rate:
            self.capabilities = replace(self.capabilities, output_rate=self.talker.rate)
        log.info("Whisper %s and Piper %s loaded in %.1f s", o.asr_model, o.voice, time.monotonic() - t0)
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
        tokens = len(self.thinker.tokenizer.encode(SPEED_SENTENCE, add_special_tokens=False))
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

    def open(self, session_id: str) -> "CascadeSession":
        session = CascadeSession(self, session_id)
        self.sessions.add(session)
        return session

    def count_calls(self, calls: ToolStream) -> None:
        """Calls whose arguments break their tool's schema are emitted all the same (OpenAI's way
        without ``strict``: the client judges them); they are counted and logged here."""
        self.counts["tool_calls_unknown"] += len(calls.unknown)
        for call in calls.ended:
            self.counts["tool_calls"] += 1
            errors = calls.errors(call)
            if errors:
                self.counts["tool_calls_off_schema"] += 1
                log.info("tool call %s(%s) does not fit its schema: %s", call.name, call.arguments, "; ".join(errors))

    def stats(self) -> dict[str, float]:
        stats: dict[str, float] = {"open_sessions": len(self.sessions), **self.counts}
        stats["speculations_live"] = sum(1 for s in self.sessions if s.ahead.current is not None)
        stats["prompts_streaming"] = sum(1 for s in self.sessions if s.streamed is not None and not s.streamed.used)
        stats.update(self.thinker.stats())
        if self.speed is not None:
            stats.update(self.speed.stats())
        return stats

    async def transcribe(self, pcm: np.ndarray, clean: bool = False) -> str:
        """``clean``: the session asked for noise reduction; it runs on the ASR thread too."""
        listener = self.listener
        assert listener is not None
        keep = self.options.denoise_keep

        def run() -> str:
            return listener.transcribe(denoise(pcm, listener.rate, keep) if clean else pcm)

        self.asr_busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.asr_pool, run)
        finally:
            self.asr_busy -= 1

    async def speak(self, text: str) -> np.ndarray:
        assert self.talker is not None
        return await asyncio.get_running_loop().run_in_executor(self.tts_pool, self.talker.speak, text)


class CascadeSession(PipelineSession):
    MAX_TRANSCRIPTS = 64

    def __init__(self, pipeline: CascadePipeline, session_id: str) -> None:
        self.pipeline = pipeline
        self.options = pipeline.options
        self.session_id = session_id
        self.salt = secrets.token_hex(16)  # this session's prefix-cache namespace
        self.turn: list[np.ndarray] = []  # audio of the open user turn
        self.ahead: Ahead[CascadeSpeculation] = Ahead(pipeline.counts)  # the answer started at the last pause
        self.clean = False  # noise reduction on the audio the listener hears
        self.judging = False  # semantic_vad: the thinker judges the words' end at each pause
        self.warmed: list[int] = []  # the prompt prefix last prefilled while the user spoke (listen)
        self.streamed: StreamedPrompt | None = None  # the open turn's prompt, its first part prefilled (listen)
        self.listening: ResponseRequest | None = None  # the request listen() was given for the open turn
        self.transcripts: OrderedDict[str, asyncio.Future[str]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ the open turn

    def feed(self, pcm: np.ndarray) -> None:
        self.turn.append(pcm)

    def reduce_noise(self, kind: str | None) -> None:
        self.clean = kind is not None

    def listen(self, request: ResponseRequest | None) -> None:
        """The user began to speak: while they do, prefill the conversation up to where their words
        will go (the last answer as delivered, the next turn's header), in a request whose prompt
        the turn's words finish (``StreamedPrompt``), so that the answer prefills only the words.
        An engine that cannot (a remote one) gets a plain request for the prefix instead, which
        leaves its whole blocks in the prefix cache."""
        if not self.options.speculate or request is None:
            return
        self.listening = request
        prefix = self._prefix(request)
        if self.streamed is not None and not self.streamed.used and self.streamed.prefix == prefix and (self.streamed.logprobs is not None) == self.judging:
            return
        self._drop_streamed()
        self.pipeline.counts["prefix_warmups"] += 1
        self.streamed = self.pipeline.thinker.open_prompt(prefix, self.salt, self.judging)
        if self.streamed is None and prefix != self.warmed:
            self.warmed = prefix
            self._background(self._warm(prefix))

    async def _warm(self, prefix: list[int]) -> None:
        stream = self.pipeline.thinker.stream(prefix, self.salt, max_tokens=1)
        try:
            async with contextlib.aclosing(stream):
                async for _ in stream:
                    pass
        except Exception as exc:  # an optimisation only: the answer itself will meet any real failure
            log.debug("prefix warm-up failed: %s", exc)

    def _drop_streamed(self) -> None:
        streamed, self.streamed = self.streamed, None
        if streamed is not None and not streamed.used:
            self._background(streamed.close())

    def _take_streamed(self, prompt: list[int]) -> StreamedPrompt | None:
        """The streamed request, if ``prompt`` goes on from its prefix: it is the answer's now."""
        streamed = self.streamed
        if streamed is None or not streamed.fits(prompt):
            return None
        self.streamed = None
        return streamed

    def judge_words(self, on: bool) -> None:
        self.judging = on

    def pause(self, request: ResponseRequest | None) -> None:
        if not self.options.speculate or request is None or not self.turn:
            return
        audio = np.concatenate(self.turn)
        transcript = asyncio.ensure_future(self.pipeline.transcribe(audio, self.clean))
        ends = asyncio.get_running_loop().create_future() if self.judging else None
        spec = self.ahead.start(CascadeSpeculation(request=request, transcript=transcript, samples=len(audio), ends=ends))
        spec.task = asyncio.create_task(self._speculate(spec), name=f"speculate:{self.session_id}")

    def resume(self) -> None:
        self.ahead.drop()  # with it, the streamed prompt it had taken
        if self.listening is not None and self.streamed is None:
            self.listen(self.listening)  # for the next pause (the prefix's whole blocks are cached by now)

    async def heard(self) -> Heard | None:
        spec = self.ahead.current
        if spec is None:
            return None
        text = await _heard(spec)
        if text is None:
            return None
        ends = None
        if spec.ends is not None:  # a judgement later than this, the words go without it
            await asyncio.wait([spec.ends], timeout=JUDGEMENT_WAIT_S)
            ends = spec.ends.result() if spec.ends.done() and not spec.ends.cancelled() else None
        return Heard(text, ends)

    def commit(self, item_id: str) -> None:
        self.turn = []
        spec = self.ahead.bind(item_id)
        if spec is not None:
            self._remember(item_id, spec.transcript)

    def clear(self) -> None:
        self.turn = []
        self.listening = None
        self.ahead.drop()
        self._drop_streamed()

    def _background(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _speculate(self, spec: CascadeSpeculation) -> None:
        text = await asyncio.shield(spec.transcript)
        times = {"asr": time.perf_counter()}
        prompt = self._prompt(spec.request, pending=text)
        streamed = None
        try:
            if spec.ends is not None:  # semantic_vad: the thinker's judgement first, then the answer
                streamed = await self._judge(spec, text)
                times["judged"] = time.perf_counter()
            taken = streamed if streamed is not None and streamed.fits(prompt) else self._take_streamed(prompt)
            spec.production = CascadeProduction(self, spec.request, prompt, times, taken)
            if taken is streamed:
                streamed = None
        finally:
            if spec.ends is not None and not spec.ends.done():
                spec.ends.cancel()
            if streamed is not None:
                self._background(streamed.close())

    async def _judge(self, spec: CascadeSpeculation, text: str) -> StreamedPrompt | None:
        """Settle ``spec.ends``: the thinker's judgement of the words, made in the streamed request
        when it can be (the words are then prefilled there for the answer too: that request is
        returned, the caller's to use or close), else in a request of its own."""
        assert spec.ends is not None
        thinker = self.pipeline.thinker
        prefix = self._prefix(spec.request)
        streamed = self.streamed if self.streamed is not None and self.streamed.can_judge(prefix) else None
        if streamed is not None:
            self.streamed = None
        ends: float | None = None
        try:
            ends = await thinker.words_end(prefix, text, self.salt, streamed)
            self.pipeline.counts["words_judged"] += 1
            self.pipeline.counts["words_judged_streamed"] += streamed is not None
        except Exception as exc:  # the decision goes on without it (the audio alone)
            log.warning("session %s: the thinker's end-of-turn judgement failed: %s", self.session_id, exc)
            if streamed is not None:  # in an unknown state: not for the answer
                await streamed.close()
                streamed = None
        except BaseException:  # cancelled (the user spoke on): the request is dropped with the speculation
            if streamed is not None:
                self._background(streamed.close())
            raise
        if not spec.ends.done():  # (voided meanwhile)
            spec.ends.set_result(ends)
        return streamed

    # ------------------------------------------------------------------ transcripts

    def _remember(self, item_id: str, future: asyncio.Future[str]) -> None:
        self.transcripts[item_id] = future
        self.transcripts.move_to_end(item_id)
        while len(self.transcripts) > self.MAX_TRANSCRIPTS:
            self.transcripts.popitem(last=False)

    async def _transcript(self, item_id: str, pcm: np.ndarray) -> str:
        future = self.transcripts.get(item_id)
        if future is None or future.cancelled():
            future = asyncio.ensure_future(self.pipeline.transcribe(pcm, self.clean))
            self._remember(item_id, future)
        return await asyncio.shield(future)

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript:
        text = await self._transcript(item_id, pcm)
        return Transcript(text, len(pcm) / self.pipeline.capabilities.input_rate)

    async def caption(self, pcm: np.ndarray) -> str | None:
        spec = self.ahead.current
        if spec is not None and spec.samples == len(pcm):  # the pause's ASR pass already has it
            return await _heard(spec)
        if self.pipeline.asr_busy:
            return None  # never queue a caption ahead of a turn's transcript
        return await self.pipeline.transcribe(pcm, self.clean)

    # ------------------------------------------------------------------ prompts

    def _turns(self, request: ResponseRequest, known: dict[str, str]) -> list[Turn]:
        turns: list[Turn] = []
        for item in request.items:
            if isinstance(item, Message):
                text = " ".join(known.get(item.id, "") if p.kind == "audio" and p.text is None else (p.text or "") for p in item.parts)
                text = " ".join(text.split())
                if text:
                    turns.append(Turn(item.role, text))
            elif not self.pipeline.capabilities.tools:  # a model without a tool format: the calls told in words
                if isinstance(item, FunctionCall):
                    turns.append(Turn("assistant", f"(calling {item.name} with {item.arguments})"))
                else:
                    turns.append(Turn("user", f"(the tool returned: {item.output})"))
            elif isinstance(item, FunctionCall) and item.status == "completed":  # (one cut off was never made)
                call = (item.name, item.arguments)
                if turns and turns[-1].role == "assistant":  # what it said before the call, then the call
                    turns[-1].calls += (call,)
                else:
                    turns.append(Turn("assistant", "", (call,)))
            elif isinstance(item, FunctionResult):
                turns.append(Turn("tool", item.output))
        return turns

    def _prefix(self, request: ResponseRequest) -> list[int]:
        """Where the open turn's words go in its prompt: the conversation so far and the tools offered."""
        return self.pipeline.thinker.prefix(request.instructions, self._turns(request, {}), tool_specs(self._offered(request)))

    def _offered(self, request: ResponseRequest) -> list:  # type: ignore[type-arg]
        if not self.pipeline.capabilities.tools or request.tool_choice == "none":
            return []  # ("none": a small thinker shown tools calls them anyway)
        answering = bool(request.items) and isinstance(request.items[-1], FunctionResult)
        if answering and request.tool_choice == "auto" and not self.options.tools_after_output:
            return []  # the answer to a tool's output, in words (``CascadeOptions.tools_after_output``)
        return list(request.tools)

    def _prompt(self, request: ResponseRequest, pending: str | None = None, known: dict[str, str] | None = None) -> list[int]:
        """The prompt: the conversation, the tools offered (``_offered``), and what ``tool_choice``
        forces the answer to begin with."""
        turns = self._turns(request, known or {})
        if pending is not None and pending.strip():
            turns.append(Turn("user", " ".join(pending.split())))
        thinker, offered = self.pipeline.thinker, self._offered(request)
        ids = thinker.render(request.instructions, turns, tools=tool_specs(offered))
        forced = forced_start(request.tool_choice, offered)
        return ids + list(thinker.tokenizer.encode(forced, add_special_tokens=False)) if forced else ids

    # ------------------------------------------------------------------ responding

    def stages(self, production: CascadeProduction):  # type: ignore[no-untyped-def]
        """The stage chain of one answer: thinker -> (clauses -> talker) or thinker -> text."""
        o, pipeline, times = self.options, self.pipeline, production.times
        request = production.request
        offered = self._offered(request)
        thinking = pipeline.thinker.options
        budget = thinking.tool_max_tokens if offered else thinking.max_tokens
        if request.max_output_tokens is not None:
            budget = min(budget, request.max_output_tokens)
        forced = forced_start(request.tool_choice, offered)
        if offered:  # the sentences cut counts what is said, not the calls
            production.generation.limit = SpokenLimit(thinking.max_sentences, request.parallel_tool_calls, forced)
            production.generation.repetition_penalty = thinking.tool_repetition_penalty

        async def think() -> AsyncIterator[str]:
            if production.streamed is not None:
                stream = production.streamed.answer(production.prompt, budget, production.generation)
            else:
                stream = pipeline.thinker.stream(production.prompt, self.salt, max_tokens=budget, generation=production.generation)
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    times.setdefault("thinker_first_token", time.perf_counter())
                    yield delta

        said: AsyncIterator[str] = think()
        if offered:  # the text before a call is said; the calls follow it (``CascadeProduction._produce``)
            production.calls = ToolStream(said, offered, forced, request.parallel_tool_calls)
            said = production.calls.speech()

        if "audio" not in request.output_modalities:

            async def type_out(deltas: AsyncIterator[str]) -> AsyncIterator[OutputChunk]:
                async for delta in deltas:
                    yield TextDelta(delta)

            return [said, type_out]

        chunk = max(1, o.chunk_ms * pipeline.capabilities.output_rate // 1000)

        playback = Playback()
        policy = ClausePolicy(o.first_clause_words, o.first_clause_max_words, o.clause_words, o.hurry_words, o.low_water_ms / 1000)

        async def split(deltas: AsyncIterator[str]) -> AsyncIterator[str]:
            if o.async_chunk:
                async for clause in clauses(deltas, policy, playback.ahead):
                    times.setdefault("first_clause", time.perf_counter())
                    yield clause
            else:  # the ablation: the whole answer first
                text = "".join([d async for d in deltas])
                times.setdefault("first_clause", time.perf_counter())
                if text.strip():
                    yield text

        async def talk(texts: AsyncIterator[str]) -> AsyncIterator[OutputChunk]:
            first = True
            async for text in texts:
                if first:
                    text, first = text.lstrip(), False
                pcm = await pipeline.speak(text)
                times.setdefault("first_audio", time.perf_counter())
                playback.add(len(pcm) / pipeline.capabilities.output_rate)
                yield TextDelta(text)  # the transcript of the audio that follows
                for start in range(0, len(pcm), chunk):
                    yield AudioChunk(pcm[start : start + chunk])

        return [said, split, talk]

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        pipeline = self.pipeline
        pipeline.counts["responses"] += 1
        t0 = time.perf_counter()
        production: Production | None = None
        speculated = False
        try:
            known: dict[str, str] = {}
            asr_done = None
            for item in request.items:
                if isinstance(item, Message) and item.role == "user":
                    for part in item.parts:
                        if part.kind == "audio" and part.text is None and part.audio is not None:
                            known[item.id] = await self._transcript(item.id, part.audio)
                            asr_done = time.perf_counter()
            prompt = self._prompt(request, known=known)
            production = await self._adopt(request, prompt)
            speculated = production is not None
            if production is None:
                times = {"asr": asr_done} if asr_done else {}
                production = CascadeProduction(self, request, prompt, times, self._take_streamed(prompt))
            async for chunk in production.output:
                yield chunk
            stages = {name: round((at - t0) * 1000, 1) for name, at in production.times.items()}
            yield StageTimes(stages, {"speculated": speculated})
        finally:
            if production is not None:
                await production.cancel()

    async def _adopt(self, request: ResponseRequest, prompt: list[int]) -> Production | None:
        """The speculation's production, if it is working on exactly this answer."""
        spec = await self.ahead.claim(request)  # the transcript is in hand (we just used it): only the prompt is left
        if spec is None:
            return None
        made = spec.production
        return self.ahead.settle(spec, made is not None and made.prompt == prompt and _settings(spec.request) == _settings(request))

    async def close(self) -> None:
        self.pipeline.sessions.discard(self)
        self.listening = None
        await self.ahead.close()
        streamed, self.streamed = self.streamed, None
        if streamed is not None:
            await streamed.close()
        for future in self.transcripts.values():
            future.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.transcripts.clear()


def create(options: CascadeOptions) -> CascadePipeline:
    return CascadePipeline(options)
