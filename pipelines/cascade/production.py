"""One cascade answer: thinker -> clauses -> talker, through bounded queues (async chunk).

The Thinker streams text, ``clauses`` cuts it at the first clause boundary, and Piper speaks each
clause while the Thinker goes on, so the first audio leaves after the first few words rather than
after the whole answer. With tools offered, what is said before a call is spoken and the calls
follow it. A production is made either for ``respond`` or ahead of it at a pause (a speculation,
pipelines/speculation.py), into a bounded buffer nobody reads until the answer is claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pipelines.base import AudioChunk, OutputChunk, ResponseRequest, TextDelta, ToolCall, ToolCallDelta, Usage
from pipelines.cascade import grounding, steering
from pipelines.cascade.grounding import ask_back, asked_for, ungrounded
from pipelines.cascade.hearing import Round
from pipelines.cascade.shared import Models
from pipelines.cascade.talker import ClausePolicy, Playback, clauses
from pipelines.cascade.thinker import Generation, StreamedPrompt
from pipelines.cascade.tools import OPEN, SpokenLimit, ToolStream, call_head, forced_schema, forced_start, name_probabilities, parameters, schema_errors
from pipelines.cascade.words_ahead import count_answer
from pipelines.sentences import ends_sentence
from pipelines.speculation import Production, Speculation
from pipelines.stages import chain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolContext:
    """For an answer that may call tools: everything said in the conversation (a call's values must
    come from it: grounding.py), the user's last words, and the prompt without the tools (an answer
    in words, when the calls are dropped)."""

    words: str
    asked: str
    plain: Callable[[], list[int]]


def held_call(tool: Any, thinking: Any) -> tuple[str, dict[str, Any]]:
    """A call of ``tool`` written with its name given: the head the prompt ends with, and the
    ``Generation`` fields that hold its arguments to the tool's schema."""
    head = OPEN + "\n" + call_head(tool.name)
    return head, {"schema": parameters(tool), "limit": SpokenLimit(thinking.max_sentences, False, head), "repetition_penalty": thinking.tool_repetition_penalty}


class CascadeProduction(Production):
    """``prompt`` rendered for ``request``; ``offered``: the tools offered in it; ``streamed``: the
    engine request its prompt's first part went into while the user spoke, if it fits."""

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
    ) -> None:
        self.pipeline = pipeline
        self.context = context  # with tools offered: what a call's values must come from, and the answer in words
        self.salt = salt
        self.request = request
        self.prompt = prompt
        self.offered = offered
        self.streamed = streamed
        self.generation = Generation(banned=pipeline.thinker.call_start_ids if words_only else frozenset())
        self._spent = (0, 0)  # prompt and cached tokens of an answer replaced by one in words
        self.calls: ToolStream | None = None  # the answer's tool calls, when tools are offered
        self.steered = False  # its calls written by steering the engine (steering.py)
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
                self._count_calls(calls)
                await calls.close()
                again = self._ask_back(calls) if not calls.made else None
                # its calls all dropped after nothing said, or after words cut off where the model
                # began a call ("You can call the" + a call: a small thinker's way of talking about
                # its tools): the user hears an answer, not silence or half a sentence (nothing
                # said ends no sentence)
                instead = not again and not ends_sentence(said) and not calls.made and bool(calls.unknown or calls.ungrounded)
                second = await self._second_choice(calls) if instead and not said else []  # the model's next choice of tool
                if second:
                    self.times.setdefault("first_call", time.perf_counter())
                for chunk in second:
                    yield chunk
                if again or instead and not second:
                    # it only called what it may not (a tool not offered, values nobody said): the
                    # user hears an answer, not silence (nor only its "Let me check."); asked for a
                    # value they asked for the tool with
                    self.pipeline.counts["answers_asking_back" if again else "answers_said_instead_of_calls"] += 1
                    async with chain(*self._stages(words_only=True, say=again, after=said)) as stream:
                        async for chunk in stream:
                            yield chunk
        finally:
            if self.calls is not None:
                await self.calls.close()
        g, (prompt, cached) = self.generation, self._spent
        yield Usage(input_tokens=prompt + g.prompt_tokens, cached_tokens=cached + g.cached_tokens, output_tokens=g.output_tokens, hit_max_tokens=g.hit_max_tokens)

    async def cancel(self) -> None:
        await super().cancel()
        if self.streamed is not None:  # never started answering (cancelled before its first step)
            await self.streamed.close()

    async def _think(self, ids: list[int], budget: int) -> AsyncGenerator[str, None]:
        """The thinker's answer to ``ids`` (``self.generation``'s); held to its ``schema`` if it has
        one, unless the engine refuses the schema (a tool's that its grammar cannot take): then the
        call is written as the model writes it, as with ``constrain_calls: never``."""
        thinker, g = self.pipeline.thinker, self.generation
        stream = thinker.stream(ids, self.salt, max_tokens=budget, generation=g)
        first = ""
        if g.schema is not None:
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                return
            except Exception as exc:
                self.pipeline.counts["tool_schemas_refused"] += 1
                log.warning("the engine refused to hold a call to its tool's schema (%s); the call is written as the model writes it", exc)
                g.schema = None
                stream = thinker.stream(ids, self.salt, max_tokens=budget, generation=g)
        async with contextlib.aclosing(stream):
            if first:
                yield first
            async for delta in stream:
                yield delta

    def _next_generation(self, **what: Any) -> None:
        """A second request for this answer (a call held to its schema, an answer in words): the
        usage is every request's."""
        first = self.generation
        prompt, cached = self._spent
        self._spent = (prompt + first.prompt_tokens, cached + first.cached_tokens)
        self.generation = Generation(output_tokens=first.output_tokens, **what)

    def _ask_back(self, calls: ToolStream) -> str | None:
        """What to say for a dropped call to a tool the user's last words asked for (grounding.py)."""
        for name, values in calls.ungrounded:
            if self.context is not None and asked_for(name, self.context.asked):
                return ask_back(values)
        return None

    async def _second_choice(self, calls: ToolStream) -> list[ToolCallDelta | ToolCall]:
        """A call of another tool, when the model called none it could (its calls were of a tool not
        offered, or dropped for values nobody said) and said nothing: the tools it gave at least
        ``second_choice_floor`` at the call's name (``name_probabilities``), the likeliest
        ``second_choices`` of them, each written at once from the same prompt with its name given
        and its arguments held to its schema; the likeliest whose values were said is made. A small
        thinker reaches for the first tool it was shown ("What's 100 divided by 4?" ->
        ``get_weather`` for Paris, dropped) where the right one was its second or third choice.
        Nothing when none qualifies: the answer is then said in words. A candidate is given up as
        soon as a value it has written whole was not said (``grounding.settled``): the user waits for none
        of its remaining tokens."""
        thinker, thinking = self.pipeline.thinker, self.pipeline.thinker.options
        if self.context is None or thinking.second_choices <= 0 or self.request.tool_choice != "auto":
            return []
        words = self.context.words
        dropped = {name for name, _ in calls.ungrounded}
        others = [t for t in self.offered if t.name not in dropped]
        if not others:
            return []
        encode = lambda text: list(thinker.tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
        chance = await name_probabilities(lambda ids: thinker.top_next(ids, self.salt), encode, self.prompt, [t.name for t in others])
        likely = sorted((t for t in others if chance[t.name] >= thinking.second_choice_floor), key=lambda t: -chance[t.name])[: thinking.second_choices]
        if not likely:
            return []

        spent: list[Generation] = []  # every candidate's request, given up or not (the usage)

        async def write(tool: Any) -> tuple[str, Generation] | None:
            head, held = held_call(tool, thinking)
            g = Generation(**held)
            spent.append(g)
            text = ""
            stream = thinker.stream(self.prompt + encode(head), self.salt, max_tokens=thinking.second_choice_tokens, generation=g)
            try:
                async with contextlib.aclosing(stream):
                    async for delta in stream:
                        text += delta
                        settled = grounding.settled(text)
                        if settled is not None and ungrounded(settled, tool.parameters, words):
                            return None  # (its request aborted)
            except Exception as exc:  # (a schema the engine's grammar refuses: that tool is not tried)
                log.info("second choice %s not written: %s", tool.name, exc)
                return None
            return text, g

        written = await asyncio.gather(*(write(t) for t in likely))
        for g in spent:
            prompt, cached = self._spent
            self._spent = (prompt + g.prompt_tokens, cached + g.cached_tokens)
            self.generation.output_tokens += g.output_tokens
        made: tuple[Any, str] | None = None
        for tool, result in zip(likely, written):
            if result is None:
                continue
            text, g = result
            arguments = text.strip()
            if made is None and arguments and not g.hit_max_tokens and not schema_errors(arguments, tool) and not ungrounded(arguments, tool.parameters, words):
                made = tool, arguments
        if made is None:
            return []
        tool, arguments = made
        self.pipeline.counts["calls_second_choice"] += 1
        self.pipeline.counts["tool_calls"] += 1
        log.info("tool call %s(%s): the model's second choice (%.2f)", tool.name, arguments, chance[tool.name])
        call_id = "call_" + secrets.token_hex(12)
        return [ToolCallDelta(call_id, tool.name, ""), ToolCallDelta(call_id, "", arguments), ToolCall(call_id, tool.name, arguments)]

    def _count_calls(self, calls: ToolStream) -> None:
        """Calls whose arguments break their tool's schema are emitted all the same (OpenAI's way
        without ``strict``: the client judges them); they are counted and logged here."""
        counts = self.pipeline.counts
        counts["tool_calls_unknown"] += len(calls.unknown)
        counts["tool_calls_ungrounded"] += len(calls.ungrounded)
        for name, values in calls.ungrounded:
            log.info("tool call %s dropped: %s not said in the conversation", name, ", ".join(values))
        for call in calls.ended:
            counts["tool_calls"] += 1
            counts["tool_calls_steered"] += self.steered
            errors = calls.errors(call)
            if errors:
                counts["tool_calls_off_schema"] += 1
                log.info("tool call %s(%s) does not fit its schema: %s", call.name, call.arguments, "; ".join(errors))

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
        budget = thinking.tool_max_tokens if offered else thinking.max_tokens
        if request.max_output_tokens is not None:
            budget = min(budget, request.max_output_tokens)
        constrained = bool(offered) and thinking.holds_calls  # a forced call held to its schema
        forced = forced_start(request.tool_choice, offered, constrained)
        if offered:  # the sentences cut counts what is said, not the calls
            self.generation.limit = SpokenLimit(thinking.max_sentences, request.parallel_tool_calls, forced)
            self.generation.repetition_penalty = thinking.tool_repetition_penalty
            if constrained and forced:  # the answer is a call from its first token
                self.generation.schema = forced_schema(request.tool_choice, offered)
        # a call the model makes on its own, written by steering the engine (steering.py)
        steered = self.steered = bool(offered) and not forced and pipeline.thinker.vocab is not None  # (a vocabulary only with steer_calls)
        if steered:
            self.generation.steer = steering.Calls(offered, request.parallel_tool_calls)
        prompt = self.prompt
        if words_only and say is None:  # a second request: the usage is both's
            self._next_generation(banned=pipeline.thinker.call_start_ids)
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
            if self.streamed is not None and not self.streamed.used and self.generation.schema is None:
                count_answer(pipeline.counts, self.streamed, prompt)
                stream = self.streamed.answer(prompt, budget, self.generation)
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
            self._next_generation(**held)
            ids = prompt + list(pipeline.thinker.tokenizer.encode(before + head, add_special_tokens=False))
            return self._think(ids, budget)

        said: AsyncIterator[str] = think()
        if offered:  # the text before a call is said; the calls follow it (``_produce``)
            ground = request.tool_choice == "auto" and thinking.ground_calls  # (a call the client demands is never dropped)
            words = self.context.words if ground and self.context is not None else None
            again = constrain if thinking.constrain_calls == "always" and not forced and not steered else None
            self.calls = ToolStream(said, offered, forced, request.parallel_tool_calls, words, again)
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
