"""One cascade answer: thinker -> clauses -> talker, through bounded queues (async chunk).

The Thinker streams text, ``clauses`` cuts it at the first clause boundary, and Piper speaks each
clause while the Thinker goes on, so the first audio leaves after the first few words rather than
after the whole answer. With tools offered, what is said before a call is spoken and the calls
follow it. A production is made either for ``respond`` or ahead of it at a pause (a speculation,
pipelines/speculation.py), into a bounded buffer nobody reads until the answer is claimed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipelines.base import AudioChunk, OutputChunk, ResponseRequest, TextDelta, Usage
from pipelines.cascade.calls import steering
from pipelines.cascade.call_policy import CallPolicy, ToolContext, held_call
from pipelines.cascade.hearing import Round
from pipelines.cascade.shared import Models
from pipelines.cascade.talker import ClausePolicy, Playback, clauses
from pipelines.cascade.thinker import Ask, Report, StreamedPrompt
from pipelines.cascade.calls.format import SpokenLimit, ToolStream, forced_schema, forced_start
from pipelines.cascade.words_ahead import count_answer
from pipelines.speculation import Production, Speculation
from pipelines.stages import chain

log = logging.getLogger(__name__)


class CascadeProduction(Production):
    """``prompt`` rendered for ``request``; ``offered``: the tools offered in it; ``streamed``: the
    engine request its prompt's first part went into while the user spoke, if it fits;
    ``answering``: the answer to a tool's output."""

    def __init__(
        self,
        pipeline: Models,
        salt: str,
        request: ResponseRequest,
        prompt: list[int],
        offered: list[Any],
        times: dict[str, float],
        streamed: StreamedPrompt | None = None,
        name: str = "",
        context: ToolContext | None = None,
        words_only: bool = False,
        answering: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.context = context  # with tools offered: what a call's values must come from, and the answer in words
        self.salt = salt
        self.request = request
        self.prompt = prompt
        self.offered = offered
        self.streamed = streamed
        # the answer to a tool's output says its facts in the output's words: the answers' repetition
        # penalty (against loops) would push it off them ("heavy hail" said "heavy rain", docs/tools.md)
        penalty = pipeline.thinker.options.calls.repetition_penalty if answering else None
        self.ask = Ask(banned=pipeline.thinker.call_start_ids if words_only else frozenset(), repetition_penalty=penalty)
        self.report = Report()  # (the answer's request's; ``_spent``: those before it)
        self._spent = (0, 0)  # prompt and cached tokens of an answer replaced by one in words
        self.calls: ToolStream | None = None  # the answer's tool calls, when tools are offered
        self.policy = CallPolicy(pipeline, salt, request, prompt, offered, context)  # what follows them
        self.steered = False  # its calls written by steering the engine (calls/steering.py)
        super().__init__(self._produce(), pipeline.options.buffer_chunks, f"produce:{name}", times)

    async def _produce(self) -> AsyncIterator[OutputChunk]:
        said = ""
        try:
            async with chain(*self._stages()) as stream:
                async for chunk in stream:
                    if isinstance(chunk, TextDelta) and chunk.text.strip():
                        said = chunk.text  # (its last words)
                    yield chunk
            calls = self.calls
            if calls is not None:  # after what was said before them (``calls`` holds ``words``: grounding)
                async for call in calls.calls():
                    self.times.setdefault("first_call", time.perf_counter())
                    yield call
                await calls.close()
                then = await self.policy.after(calls, said, self.steered)
                prompt, cached, output = then.spent
                self._spent = (self._spent[0] + prompt, self._spent[1] + cached)
                self.report.output_tokens += output
                if then.second:
                    self.times.setdefault("first_call", time.perf_counter())
                for chunk in then.second:
                    yield chunk
                if then.words:  # (asked back, or said in words instead of the calls dropped)
                    async with chain(*self._stages(words_only=True, say=then.again, after=said)) as stream:
                        async for chunk in stream:
                            yield chunk
        finally:
            if self.calls is not None:
                await self.calls.close()
        r, (prompt, cached) = self.report, self._spent
        yield Usage(input_tokens=prompt + r.prompt_tokens, cached_tokens=cached + r.cached_tokens, output_tokens=r.output_tokens, hit_max_tokens=r.hit_max_tokens)

    async def cancel(self) -> None:
        await super().cancel()
        if self.streamed is not None:  # never started answering (cancelled before its first step)
            await self.streamed.close()

    async def _think(self, ids: list[int], budget: int) -> AsyncGenerator[str, None]:
        """The thinker's answer to ``ids`` (as ``self.ask`` asks); held to its ``schema`` if it has
        one, unless the engine refuses the schema (a tool's that its grammar cannot take): then the
        call is written as the model writes it, as with ``calls.constrain: never``."""
        thinker, a = self.pipeline.thinker, self.ask
        stream = thinker.stream(ids, self.salt, max_tokens=budget, ask=a, report=self.report)
        first = ""
        if a.schema is not None:
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                return
            except Exception as exc:
                self.pipeline.counts.tool_schemas_refused += 1
                log.warning("the engine refused to hold a call to its tool's schema (%s); the call is written as the model writes it", exc)
                a.schema = None
                stream = thinker.stream(ids, self.salt, max_tokens=budget, ask=a, report=self.report)
        async with contextlib.aclosing(stream):
            if first:
                yield first
            async for delta in stream:
                yield delta

    def _next_request(self, **what: Any) -> None:
        """A second request for this answer (a call held to its schema, an answer in words): the
        usage is every request's."""
        done = self.report
        prompt, cached = self._spent
        self._spent = (prompt + done.prompt_tokens, cached + done.cached_tokens)
        self.ask = Ask(finish=self.ask.finish, **what)
        self.report = Report(output_tokens=done.output_tokens)

    def _stages(self, words_only: bool = False, say: str | None = None, after: str = "") -> list[Any]:
        """The stage chain: thinker -> (clauses -> talker) or thinker -> text. ``words_only``: the
        conversation answered again without the tools (``plain``), every token that could begin a
        call banned (the calls the first answer made were dropped, and it said nothing; with the
        tools still in its prompt a small thinker talks about them instead); ``say``: these words
        instead of the thinker's; ``after``: the words said before these in the response (a space
        between them kept, or put there)."""
        pipeline, request, times = self.pipeline, self.request, self.times
        offered = [] if words_only else self.offered
        o = pipeline.options
        thinking = pipeline.thinker.options
        budget = thinking.calls.max_tokens if offered else thinking.max_tokens
        # the server's own budget lets a sentence under way end past it; a client's max_output_tokens is kept to the token
        self.ask.finish = request.max_output_tokens is None or request.max_output_tokens > budget
        if request.max_output_tokens is not None:
            budget = min(budget, request.max_output_tokens)
        constrained = bool(offered) and thinking.calls.held  # a forced call held to its schema
        forced = forced_start(request.tool_choice, offered, constrained)
        if offered:  # the sentences cut counts what is said, not the calls
            self.ask.limit = SpokenLimit(thinking.max_sentences, request.parallel_tool_calls, forced)
            self.ask.repetition_penalty = thinking.calls.repetition_penalty
            if constrained and forced:  # the answer is a call from its first token
                self.ask.schema = forced_schema(request.tool_choice, offered)
        # a call the model makes on its own, written by steering the engine (calls/steering.py): decided
        # here once (the thinker steers an answer whose ``steer`` is set)
        steered = self.steered = bool(offered) and not forced and pipeline.thinker.vocab is not None  # (a vocabulary only with calls.steer, a chat prompt)
        if steered:  # (values that name something copied from what was said, where calls are grounded)
            grounded = request.tool_choice == "auto" and thinking.calls.ground and self.context is not None
            self.ask.steer = steering.Calls(offered, request.parallel_tool_calls, self.context.words if grounded and self.context else "")
        prompt = self.prompt
        if words_only and say is None:  # a second request: the usage is both's
            self._next_request(banned=pipeline.thinker.call_start_ids)
            prompt = self.context.plain() if self.context is not None else prompt

        async def think() -> AsyncIterator[str]:
            gap = bool(after) and not after[-1].isspace()  # a space owed between ``after`` and these words
            async with contextlib.aclosing(thought()) as deltas:  # (closed with this: a barge-in ends the request at once)
                async for delta in deltas:
                    if gap and delta.strip():
                        delta, gap = delta if delta[0].isspace() else " " + delta, False
                    yield delta

        async def thought() -> AsyncGenerator[str, None]:
            if say is not None:
                yield say
                return
            if self.streamed is not None and not self.streamed.used and self.ask.schema is None:
                count_answer(pipeline.counts, self.streamed, prompt)
                stream = self.streamed.answer(prompt, budget, self.ask, self.report)
            else:
                if self.streamed is not None:  # (a request held to a schema is one of its own)
                    await self.streamed.close()
                stream = self._think(prompt, budget)
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    times.setdefault("thinker_first_token", time.perf_counter())
                    yield delta

        def constrain(before: str, name: str) -> AsyncIterator[str]:
            """The arguments of a call of ``name``, held to its schema: a request of its own for the
            prompt, what was said before the call and the call's head (all but the last block of
            the prompt found in the prefix cache)."""
            head, held = held_call(next(t for t in offered if t.name == name), thinking)
            self._next_request(**held)
            ids = prompt + pipeline.thinker.encode(before + head)
            return self._think(ids, budget)

        said: AsyncIterator[str] = think()
        if offered:  # the text before a call is said; the calls follow it (``_produce``)
            ground = request.tool_choice == "auto" and thinking.calls.ground  # (a call the client demands is never dropped)
            words = self.context.words if ground and self.context is not None else None
            again = constrain if thinking.calls.constrain == "always" and not forced and not steered else None
            self.calls = ToolStream(said, offered, forced, request.parallel_tool_calls, words, again, self.policy.fits)
            said = self.calls.speech()

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
            first = not after  # (a response's first words are trimmed; those after others keep their space)
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


@dataclass(eq=False, kw_only=True)
class CascadeSpeculation(Speculation[CascadeProduction]):
    """Made at a pause: what the session's hearing heard there, then (``task``) the answer to it."""

    request: ResponseRequest
    heard: Round  # the pause's hearing: its words are the turn's if the turn is committed
    background: Callable[[Awaitable[None]], None]  # the session's: closes what the round held

    def void(self) -> None:
        if self.item_id is not None:
            self.heard.kept = True  # (the item needs its words)
        self.heard.void(self.background)
