"""A client session of the CPU cascade: the open turn, hearing and answering ahead at its pauses.

**Speculation (incremental prefill).** When the user begins to speak (``listen``) the conversation
so far is prefilled in a streamed engine request that the turn's words will finish. At every short
pause (``pause``) the session's ``Hearing`` transcribes the turn so far (and, for semantic_vad, has
the thinker judge the words), and the answer to (history + those words) is started into a bounded
buffer nobody reads yet: the thinker, then the talker's first clause. If the user goes on speaking
(``resume``) that work is aborted; the prompt it sent stays in vLLM's prefix cache, so the next
attempt (or the final turn) only prefills what is new. If the turn ends instead (``commit``), the
speculation becomes the answer when ``respond`` asks for exactly the prompt it already used;
otherwise it is dropped and the answer starts fresh. Nothing speculative reaches the client before
``respond``. The moves and the adoption rule are ``pipelines/speculation.py``'s, shared with the
omni pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np

from pipelines.base import (
    Heard,
    Judge,
    Message,
    OutputChunk,
    PipelineSession,
    ResponseRequest,
    StageTimes,
    TextDelta,
    ToolCall,
    Transcript,
)
from pipelines.cascade.hearing import Hearing
from pipelines.cascade.listener import Words
from pipelines.cascade.overhearing import Overhearing
from pipelines.cascade.production import CascadeProduction, CascadeSpeculation
from pipelines.cascade.prompts import Prompts
from pipelines.cascade.shared import Models
from pipelines.cascade.thinker import Report, StreamedPrompt
from pipelines.cascade.words_ahead import WordsAhead
from pipelines.speculation import Ahead, Production

log = logging.getLogger(__name__)


def _settings(request: ResponseRequest) -> tuple[Any, ...]:
    return (request.output_modalities, request.voice, request.max_output_tokens, request.tool_choice, request.parallel_tool_calls)


class CascadeSession(PipelineSession):
    AHEAD_OF_OUTPUT_S = 0.05  # a call's output not back by then: the answer's prefix is prefilled (_ahead_of_output)

    def __init__(self, pipeline: Models, session_id: str, tenant: str | None = None) -> None:
        self.pipeline = pipeline
        self.options = pipeline.options
        self.session_id = session_id
        self.salt = tenant or secrets.token_hex(16)  # the prefix-cache namespace: its key's (Pipeline.open), else its own
        self.clean = False  # noise reduction on the audio the listener hears
        self.keywords: tuple[str, ...] = ()  # words the listener is to expect (this session's: keywords.py)
        self.transcribed = False  # the session wants its input transcribed (live captions)
        self.prompts = Prompts(pipeline.thinker, lambda: pipeline.capabilities.tools, self.options.tools_after_output)
        beside = self.options.asr_model.startswith("whisper")  # (the fusion's listener weight is Whisper's)
        self.hearing = Hearing(self._hear_turn, pipeline.thinker, self.salt, pipeline.counts, self._background, session_id, None, beside)
        self.ahead: Ahead[CascadeSpeculation] = Ahead(pipeline.counts.speculations)  # the answer started at the last pause
        self.warmed: list[int] = []  # the prompt prefix last prefilled while the user spoke (listen)
        self.responses = 0  # responses begun
        self.streamed: StreamedPrompt | None = None  # the open turn's prompt, its first part prefilled (listen)
        self.listening: tuple[ResponseRequest, bool] | None = None  # what listen() was given for the open turn
        # the open turn's audio, heard as it grows (with ears that go on from a pass: Moonshine), its
        # settled words given to the turn's streamed request between pauses (words_ahead.py)
        between = lambda: self.hearing.current is None and self.ahead.current is None  # noqa: E731
        self.words_ahead = WordsAhead(pipeline.thinker, pipeline.counts, self, self._background, between, self.options.words_ahead)
        self.overhearing = Overhearing(self._hear_pass, lambda: pipeline.asr_busy > 0, pipeline.capabilities.input_rate, self.options.hear_every_ms, self.words_ahead)
        self.transcripts = ItemTranscripts()
        self._tasks: set[asyncio.Future[Any]] = set()

    # ------------------------------------------------------------------ the open turn

    def feed(self, pcm: np.ndarray) -> None:
        self.overhearing.feed(pcm)

    def quiet(self) -> None:
        self.overhearing.quiet()

    def reduce_noise(self, kind: str | None) -> None:
        self.clean = kind is not None

    def expect(self, keywords: tuple[str, ...]) -> None:
        self.keywords = keywords

    def transcribing(self, on: bool) -> None:
        self.transcribed = on
        self._overhear()

    def _overhear(self) -> None:
        """The turn is heard as it grows when something will use the words: an answer or a
        judgement (``listening``), or live captions."""
        self.overhearing.on = self.listening is not None or self.transcribed

    def judge_words(self, judge: Judge | None) -> None:
        self.hearing.judge = judge  # the turn-end policy's (turn_end.judge)
        self.hearing.judging = judge is not None

    def listen(self, request: ResponseRequest | None, answer: bool) -> None:
        """The user began to speak: while they do, prefill the conversation up to where their words
        will go (the last answer as delivered, the next turn's header), in a request whose prompt
        the turn's words finish (``StreamedPrompt``), so that the words are judged and answered
        there with only themselves to prefill. An engine that cannot (a remote one) gets a plain
        request for the prefix instead, which leaves its whole blocks in the prefix cache."""
        if request is None or not self._hears(answer):
            return
        self.listening = (request, answer)
        self._overhear()
        prefix = self.prompts.prefix(request)
        judging = self.hearing.thinker_judges
        streamed = self.streamed
        if streamed is not None and not streamed.used and streamed.sent == prefix and (streamed.logprobs is not None) == judging:
            return  # (none of the user's words given to it yet)
        self._drop_streamed()
        self.pipeline.counts.prefix_warmups += 1
        self.streamed = self.pipeline.thinker.open_prompt(prefix, self.salt, judging)
        if self.streamed is None:
            self._warm_once(prefix)

    def prepare(self, request: ResponseRequest) -> None:
        """The instructions and tools every prompt begins with, prefilled now (off the turn's path):
        a fresh session's first turn finds them in the prefix cache (its key's sessions share it)."""
        self._warm_once(self.prompts.prefix(request), prepared=True)

    def _warm_once(self, prefix: list[int], prepared: bool = False) -> None:
        """Prefill ``prefix`` in the background, unless it was the last one prefilled."""
        if prefix != self.warmed:
            self.warmed = prefix
            self._background(self._warm(prefix, prepared))

    async def _warm(self, prefix: list[int], prepared: bool = False) -> None:
        g = Report()
        stream = self.pipeline.thinker.stream(prefix, self.salt, max_tokens=1, report=g)
        try:
            async with contextlib.aclosing(stream):
                async for _ in stream:
                    pass
        except Exception as exc:  # an optimisation only: the answer itself will meet any real failure
            log.debug("prefix warm-up failed: %s", exc)
            return
        if prepared:  # what a session's beginning cost, and how much of it its key's sessions had cached
            counts = self.pipeline.counts
            counts.prefix_prepares += 1
            counts.prefix_prepared_tokens += g.prompt_tokens
            counts.prefix_prepared_cached_tokens += g.cached_tokens

    def _drop_streamed(self) -> None:
        streamed, self.streamed = self.streamed, None
        if streamed is not None and not streamed.used:
            self._background(streamed.close())

    def _take_streamed(self, prompt: list[int]) -> StreamedPrompt | None:
        """The streamed request, if ``prompt`` goes on from its prefix: it is the answer's now."""
        streamed = self.streamed
        if streamed is None or not streamed.fits(prompt):
            if streamed is not None and streamed.ahead:  # the user's words given ahead, and these do not go on from them
                self.pipeline.counts.words_ahead_missed += 1
                self._drop_streamed()
            return None
        self.streamed = None
        return streamed

    def _ahead_of_output(self, request: ResponseRequest, known: dict[str, str], said: str, call: ToolCall) -> None:
        """The answer to a call's output, where its prompt hides the tools, shares with the call's
        prompt no more than the instructions' unfinished first block. Unless the output is back
        within ``AHEAD_OF_OUTPUT_S`` (a tool that answers at once: there a prefill beside the
        answer's only slows it), the conversation through the call (``Prompts.output_prefix``) is
        prefilled while the tool runs (the server's MCP call, the client's round trip), so that the
        answer finds its whole blocks in the prefix cache and prefills little more than the output.
        ``call``: the response's first."""
        prefix = self.prompts.output_prefix(request, known, said, call)
        if prefix is not None:
            self._background(self._warm_unless_answered(prefix, self.responses))

    async def _warm_unless_answered(self, prefix: list[int], responses: int) -> None:
        await asyncio.sleep(self.AHEAD_OF_OUTPUT_S)
        if self.responses == responses:  # (no response since the call's: its output is not back)
            self.pipeline.counts.prefills_ahead_of_output += 1
            await self._warm(prefix)

    def _hears(self, answer: bool) -> bool:
        """Whether the open turn is heard at its pauses: for semantic_vad's judgement, or for an
        answer made ahead."""
        return self.hearing.judging or (answer and self.options.speculate)

    def pause(self, request: ResponseRequest | None, answer: bool) -> None:
        if request is None or not self.overhearing.samples or not self._hears(answer):
            return
        prefix = self.prompts.prefix(request)
        streamed = None
        if self.hearing.thinker_judges and self.streamed is not None and self.streamed.can_judge(prefix):
            streamed, self.streamed = self.streamed, None  # the words are judged (then answered) in it
        heard = self.hearing.pause(self.overhearing.audio(), prefix, streamed)
        self.ahead.drop()
        if answer and self.options.speculate:
            spec = self.ahead.start(CascadeSpeculation(request=request, heard=heard, background=self._background))
            spec.task = asyncio.create_task(self._speculate(spec), name=f"speculate:{self.session_id}")

    def resume(self) -> None:
        self.overhearing.resumed()
        self.hearing.drop()
        self.ahead.drop()  # with it, the streamed prompt it had taken
        if self.listening is not None and self.streamed is None:
            self.listen(*self.listening)  # for the next pause (the prefix's whole blocks are cached by now)
        self.words_ahead.give()  # the words settled so far, in the turn's request again

    async def heard(self, within_s: float) -> Heard | None:
        return await self.hearing.heard(within_s)

    def commit(self, item_id: str) -> None:
        spec = self.ahead.bind(item_id)
        heard = self.hearing.keep()
        if heard is not None:  # (what came after the pause was silence, or the pause would be void)
            self.transcripts.remember(item_id, heard.words)
        elif self.overhearing.samples:  # no pause heard it all (manual turns): its words from the passes made as it grew
            words = self.overhearing.words_for(self.overhearing.audio(), ends=False)
            self.transcripts.remember(item_id, asyncio.ensure_future(_text_of(words)))
        if heard is not None and (spec is None or spec.heard is not heard):
            heard.void(self._background)  # no answer goes on from it: only its words are kept
        self.overhearing.reset()

    def clear(self) -> None:
        self.overhearing.reset()
        self.listening = None
        self._overhear()
        self.hearing.drop()
        self.ahead.drop()
        self._drop_streamed()

    def _background(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _speculate(self, spec: CascadeSpeculation) -> None:
        text = await asyncio.shield(spec.heard.words)  # (times["asr"] stamped as the words came)
        prompt = self.prompts.prompt(spec.request, pending=text)
        streamed = await spec.heard.claim()  # the request the words were judged in, if any
        times = dict(spec.heard.times)  # asr, and judged when they were
        try:
            taken = streamed if streamed is not None and streamed.fits(prompt) else self._take_streamed(prompt)
            spec.production = self._production(spec.request, prompt, times, taken, text=text)
            if taken is streamed:
                streamed = None
        finally:
            if streamed is not None:
                self._background(streamed.close())

    def _production(
        self,
        request: ResponseRequest,
        prompt: list[int],
        times: dict[str, float],
        streamed: StreamedPrompt | None,
        text: str | None = None,
        known: dict[str, str] | None = None,
    ) -> CascadeProduction:
        """The answer to ``prompt``: the conversation in ``request`` with the open turn's words
        (``text``) or the transcripts of its audio items (``known``)."""
        offered = self.prompts.offered(request)
        context = self.prompts.context(request, text, known) if offered else None
        # calls banned: tools shown but none offered; the answer to a tool's output (said in words: without
        # the ban, Qwen2.5-Coder-0.5B writes another call or an output of its own in half its samples, docs/tools.md)
        answering = self.prompts.answering(request)
        held = not offered and (bool(self.prompts.shown(request)) or answering)
        return CascadeProduction(self.pipeline, self.salt, request, prompt, offered, times, streamed, self.session_id, context, held, answering)

    # ------------------------------------------------------------------ transcripts

    async def _hear_turn(self, pcm: np.ndarray, ends: bool) -> Words:
        return await self.overhearing.words_for(pcm, ends)

    async def _hear_pass(self, pcm: np.ndarray, ends: bool, hint: tuple[int, ...]) -> Words:
        return await self.pipeline.hear(pcm, self.clean, ends, hint, self.keywords)

    async def transcribe(self, item_id: str, pcm: np.ndarray) -> Transcript:
        text = await self.transcripts.of(item_id, lambda: self.pipeline.transcribe(pcm, self.clean, self.keywords))
        return Transcript(text, len(pcm) / self.pipeline.capabilities.input_rate)

    async def caption(self, pcm: np.ndarray) -> str | None:
        if self.hearing.current is not None and self.hearing.current.samples == len(pcm):  # the pause's pass has it
            return await self.hearing.words_of(len(pcm))
        return await self.overhearing.caption(pcm)  # (never queued ahead of a turn's transcript)

    # ------------------------------------------------------------------ responding

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        self.pipeline.counts.responses += 1
        self.responses += 1
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
                            known[item.id] = (await self.transcribe(item.id, part.audio)).text
                            asr_done = time.perf_counter()
            prompt = self.prompts.prompt(request, known=known)
            production = await self._adopt(request, prompt)
            speculated = production is not None
            if production is None:
                times = {"asr": asr_done} if asr_done else {}
                production = self._production(request, prompt, times, self._take_streamed(prompt), known=known)
            said: list[str] | None = []  # what was said before the first call (None once it came)
            async for chunk in production.output:
                if said is not None and isinstance(chunk, TextDelta):
                    said.append(chunk.text)
                elif said is not None and isinstance(chunk, ToolCall):
                    self._ahead_of_output(request, known, "".join(said), chunk)
                    said = None
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
        self.overhearing.on = False
        self.overhearing.reset()
        await self.hearing.close()
        await self.ahead.close()
        streamed, self.streamed = self.streamed, None
        if streamed is not None:
            await streamed.close()
        self.transcripts.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class ItemTranscripts:
    """The transcripts of a session's committed audio items, by item: each heard once (the pause's
    words, the passes', or a pass of its own when first asked), the newest ``MAX`` kept."""

    MAX = 64

    def __init__(self) -> None:
        self._futures: OrderedDict[str, asyncio.Future[str]] = OrderedDict()

    def remember(self, item_id: str, future: asyncio.Future[str]) -> None:
        self._futures[item_id] = future
        self._futures.move_to_end(item_id)
        while len(self._futures) > self.MAX:
            self._futures.popitem(last=False)

    async def of(self, item_id: str, hear: Callable[[], Awaitable[str]]) -> str:
        """The item's transcript: the one remembered, else ``hear()``'s (remembered)."""
        future = self._futures.get(item_id)
        if future is None or future.cancelled():
            future = asyncio.ensure_future(hear())
            self.remember(item_id, future)
        return await asyncio.shield(future)

    def cancel(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


async def _text_of(words: Awaitable[Words]) -> str:
    return (await words).text
