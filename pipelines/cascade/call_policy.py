"""What follows an answer's tool calls, decided in one place (``CallPolicy``): the calls counted,
then, when the model's calls were all dropped (a tool not offered, values nobody said), the value
asked for again, the model's second choice of tool, or the answer said in words instead. The
production (production.py) streams what it decides; the calls themselves are ``calls/``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.base import ResponseRequest, ToolCall, ToolCallDelta
from pipelines.cascade.calls import grounding
from pipelines.cascade.calls.format import OPEN, SpokenLimit, ToolStream, call_head, name_probabilities, parameters, schema_errors
from pipelines.cascade.calls.grounding import ask_back, asked_for, misfits, named, unasked, ungrounded
from pipelines.cascade.shared import Models
from pipelines.cascade.thinker import Ask, Report
from pipelines.sentences import ends_sentence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolContext:
    """For an answer that may call tools: everything said in the conversation (a call's values must
    come from it: calls/grounding.py), the user's last words, the prompt without the tools (an answer
    in words, when the calls are dropped), and the agent's words before the user's last (``before``:
    whether they asked for a value)."""

    words: str
    asked: str
    plain: Callable[[], list[int]]
    before: str = ""


def held_call(tool: Any, thinking: Any) -> tuple[str, dict[str, Any]]:
    """A call of ``tool`` written with its name given: the head the prompt ends with, and the
    ``Ask`` fields that hold its arguments to the tool's schema."""
    head = OPEN + "\n" + call_head(tool.name)
    return head, {"schema": parameters(tool), "limit": SpokenLimit(thinking.max_sentences, False, head), "repetition_penalty": thinking.calls.repetition_penalty}


@dataclass(frozen=True)
class Then:
    """What follows an answer's calls: ``second``, the chunks of the model's second choice of tool
    (and ``spent``, its requests' prompt, cached and output tokens); ``words``, an answer in words
    to come, ``again`` its text when the value is asked for again (else the thinker's)."""

    second: list[ToolCallDelta | ToolCall]
    spent: tuple[int, int, int]
    words: bool
    again: str | None


class CallPolicy:
    """For one answer's calls: ``after(calls, said, steered)`` once they are all out."""

    def __init__(self, pipeline: Models, salt: str, request: ResponseRequest, prompt: list[int], offered: list[Any], context: ToolContext | None) -> None:
        self.pipeline = pipeline
        self.salt = salt
        self.request = request
        self.prompt = prompt
        self.offered = offered
        self.context = context

    async def fits(self, tool: Any, arguments: str) -> list[str]:
        """The values of a call of ``tool`` that were not asked for (``unasked``: the user's last
        words are the values and nothing else, and the agent asked for none) or that the thinker
        does not read as their parameter's (calls/grounding.py, ``misfits``); none when
        ``calls.fit`` is off, and no reading when the user's last words name what the tool does
        (``named``)."""
        thinker = self.pipeline.thinker
        if not thinker.options.calls.fit:
            return []
        words = ""
        if self.context is not None:
            alone = unasked(arguments, tool.parameters or {}, self.context.asked, self.context.before)
            if alone:
                return alone
            if named(tool.name, tool.description or "", self.context.asked):
                return []
            words = self.context.words
        return await misfits(arguments, tool.description or "", tool.parameters or {}, lambda context, text: thinker.likelihood(context, text, self.salt), words)

    async def after(self, calls: ToolStream, said: str, steered: bool) -> Then:
        """The calls counted; then, if none was made: the value asked for again when the user's
        last words asked for the dropped call's tool; else, after nothing said or words a call cut
        off ("You can call the" + a call: a small thinker's way of talking about its tools), the
        model's second choice, or failing it the answer in words: the user hears an answer, not
        silence or half a sentence (nothing said ends no sentence)."""
        self.count(calls, steered)
        again = self.ask_back(calls) if not calls.made else None
        instead = not again and not ends_sentence(said) and not calls.made and bool(calls.unknown or calls.refused)
        second, spent = await self.second_choice(calls) if instead and not said else ([], (0, 0, 0))
        words = bool(again) or instead and not second
        if again:
            self.pipeline.counts.answers_asking_back += 1
        elif words:
            self.pipeline.counts.answers_said_instead_of_calls += 1
        return Then(second, spent, words, again)

    def ask_back(self, calls: ToolStream) -> str | None:
        """What to say for a dropped call to a tool the user's last words asked for (calls/grounding.py)."""
        for name, values in calls.refused:
            if self.context is not None and asked_for(name, self.context.asked):
                return ask_back(values)
        return None

    async def second_choice(self, calls: ToolStream) -> tuple[list[ToolCallDelta | ToolCall], tuple[int, int, int]]:
        """(The chunks of) a call of another tool, and what its requests spent (prompt, cached and
        output tokens, made or not), when the model called none it could (its calls were of a tool not
        offered, or dropped for values nobody said) and said nothing: the tools it gave at least
        ``calls.second_choice_floor`` at the call's name (``name_probabilities``), the likeliest
        ``calls.second_choices`` of them, each written at once from the same prompt with its name given
        and its arguments held to its schema; the likeliest whose values were said is made. A small
        thinker reaches for the first tool it was shown ("What's 100 divided by 4?" ->
        ``get_weather`` for Paris, dropped) where the right one was its second or third choice.
        Nothing when none qualifies: the answer is then said in words. A candidate is given up as
        soon as a value it has written whole was not said (``grounding.settled``): the user waits for none
        of its remaining tokens."""
        thinker, thinking = self.pipeline.thinker, self.pipeline.thinker.options
        none: tuple[list[ToolCallDelta | ToolCall], tuple[int, int, int]] = ([], (0, 0, 0))
        if self.context is None or thinking.calls.second_choices <= 0 or self.request.tool_choice != "auto":
            return none
        words = self.context.words
        dropped = {name for name, _ in calls.refused}
        others = [t for t in self.offered if t.name not in dropped]
        if not others:
            return none
        chance = await name_probabilities(lambda ids: thinker.top_next(ids, self.salt), thinker.encode, self.prompt, [t.name for t in others])
        likely = sorted((t for t in others if chance[t.name] >= thinking.calls.second_choice_floor), key=lambda t: -chance[t.name])[: thinking.calls.second_choices]
        if not likely:
            return none

        spent: list[Report] = []  # every candidate's request, given up or not (the usage)

        async def write(tool: Any) -> tuple[str, Report] | None:
            head, held = held_call(tool, thinking)
            g = Report()
            spent.append(g)
            text = ""
            stream = thinker.stream(self.prompt + thinker.encode(head), self.salt, max_tokens=thinking.calls.second_choice_tokens, ask=Ask(**held), report=g)
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
        usage = (sum(g.prompt_tokens for g in spent), sum(g.cached_tokens for g in spent), sum(g.output_tokens for g in spent))
        made: tuple[Any, str] | None = None
        for tool, result in zip(likely, written):
            if result is None:
                continue
            text, g = result
            arguments = text.strip()
            if made is None and arguments and not g.hit_max_tokens and not schema_errors(arguments, tool) and not ungrounded(arguments, tool.parameters, words):
                unfit = await self.fits(tool, arguments)
                if unfit:
                    log.info("second choice %s(%s) not made: %s not such a thing", tool.name, arguments, ", ".join(unfit))
                    continue
                made = tool, arguments
        if made is None:
            return [], usage
        tool, arguments = made
        self.pipeline.counts.calls_second_choice += 1
        self.pipeline.counts.tool_calls += 1
        log.info("tool call %s(%s): the model's second choice (%.2f)", tool.name, arguments, chance[tool.name])
        call_id = "call_" + secrets.token_hex(12)
        return [ToolCallDelta(call_id, tool.name, ""), ToolCallDelta(call_id, "", arguments), ToolCall(call_id, tool.name, arguments)], usage

    def count(self, calls: ToolStream, steered: bool) -> None:
        """Calls whose arguments break their tool's schema are emitted all the same (OpenAI's way
        without ``strict``: the client judges them); they are counted and logged here."""
        counts = self.pipeline.counts
        counts.tool_calls_unknown += len(calls.unknown)
        counts.tool_calls_ungrounded += len(calls.ungrounded)
        counts.tool_calls_misfit += len(calls.misfits)
        for name, values in calls.ungrounded:
            log.info("tool call %s dropped: %s not said in the conversation", name, ", ".join(values))
        for name, values in calls.misfits:
            log.info("tool call %s dropped: %s said, but not read as such by the thinker", name, ", ".join(values))
        for call in calls.ended:
            counts.tool_calls += 1
            counts.tool_calls_steered += steered
            errors = calls.errors(call)
            if errors:
                counts.tool_calls_off_schema += 1
                log.info("tool call %s(%s) does not fit its schema: %s", call.name, call.arguments, "; ".join(errors))

