"""The tool-call parser (pipelines/cascade/calls/format.py) on the forms the thinker writes, streamed in every piece
size, the history with calls rendered by the default thinker's own chat template, and the check that a call's
values were said (pipelines/cascade/calls/grounding.py)."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from pipelines import models
from pipelines.base import AudioChunk, Capabilities, ResponseRequest, TextDelta, Tool, ToolCall, ToolCallDelta
from pipelines.cascade.calls.grounding import ask_back, asked_for, instructions, numbers_of, ungrounded
from pipelines.cascade.production import CascadeProduction, ToolContext
from pipelines.cascade.shared import CascadeOptions, Counts
from pipelines.cascade.thinker import Ask, CallOptions, Report, Thinker, ThinkerOptions, Turn
from pipelines.cascade.calls.format import (
    OPEN,
    ArgumentsDelta,
    CallEnded,
    CallParser,
    CallStarted,
    Said,
    ToolStream,
    call_head,
    call_schema,
    call_start_ids,
    forced_schema,
    forced_start,
    name_probabilities,
    schema_errors,
    token_texts,
    tool_specs,
)

WEATHER = Tool("get_weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def parse(text: str, prefix: str = "") -> tuple[str, list[tuple[str, str, bool]]]:
    """What is said and the calls, the same whatever pieces the text streams in."""
    seen = set()
    for size in (1, 2, 3, 7, len(text) or 1):
        parser = CallParser(prefix)
        events = [e for i in range(0, len(text), size) for e in parser.feed(text[i : i + size])] + parser.finish()
        said = "".join(e.text for e in events if isinstance(e, Said))
        calls = [(e.name, e.arguments, e.complete) for e in events if isinstance(e, CallEnded)]
        for started, ended in zip([e for e in events if isinstance(e, CallStarted)], [e for e in events if isinstance(e, CallEnded)]):
            streamed = "".join(e.delta for e in events if isinstance(e, ArgumentsDelta) and e.call_id == started.call_id)
            assert started.call_id == ended.call_id and streamed == ended.arguments
        seen.add((said, json.dumps(calls)))
    assert len(seen) == 1, seen
    said, calls = seen.pop()
    return said, [tuple(c) for c in json.loads(calls)]


@pytest.mark.parametrize(
    "text, said, calls",
    [
        ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "Let me check.\n", [("get_weather", '{"city": "Paris"}', True)]),
        ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', "", [("get_weather", '{"city": "Oslo"}', True)]),
        ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Rome"\n  }\n}\n```\nThis returns', "", [("get_weather", '{\n    "city": "Rome"\n  }', True)]),
        ('{"name": "a", "arguments": {"x": "}{\\""}}\n{"name": "b", "arguments": {}}', "", [("a", '{"x": "}{\\""}', True), ("b", "{}", True)]),
        ('<tool_call>\n{"arguments": {"n": 1}, "name": "c"}\n</tool_call>', "", [("c", '{"n": 1}', True)]),
        ('<tool_call>\n{"name": "a", "arguments": {"x": "cut', "", [("a", '{"x": "cut', False)]),
        ("Sure! Use {braces}, `code` and a < sign.", "Sure! Use {braces}, `code` and a < sign.", []),
        ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    ],
)
def test_calls_and_speech_are_told_apart(text, said, calls):
    assert parse(text) == (said, calls)


def test_forced_starts_parse_as_the_model_wrote_them():
    assert parse('get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome"}}', forced_start("required", [WEATHER])) == (
        "",
        [("get_weather", '{"city": "Paris"}', True), ("get_weather", '{"city": "Rome"}', True)],
    )
    assert parse(' {"city": "Rome"}}', forced_start("get_weather", [WEATHER])) == ("", [("get_weather", '{"city": "Rome"}', True)])
    assert forced_start("auto", [WEATHER]) == forced_start("none", [WEATHER]) == forced_start("required", []) == ""


def test_schema_errors_say_what_is_wrong():
    assert schema_errors('{"city": "Paris"}', WEATHER) == []
    assert schema_errors('{"city": 3}', WEATHER) == ["3 is not of type 'string'"]
    assert schema_errors("{}", WEATHER) == ["'city' is a required property"]
    assert schema_errors('{"city": "Par', WEATHER)[0].startswith("not JSON")
    assert schema_errors("{}", None) == ["no such tool"]


def test_a_history_with_a_call_renders_as_the_model_wrote_it():
    """The follow-up's prompt begins with the call's prompt and the call as generated: byte for byte,
    in the model's own template (tools in its system block, the output in its tool role)."""
    from transformers import AutoTokenizer

    thinker = Thinker(ThinkerOptions())
    thinker.tokenizer = AutoTokenizer.from_pretrained(str(models.path("qwen2.5-coder-0.5b-instruct-w8")))
    tools = tool_specs([WEATHER])
    asked = [Turn("user", "Weather in Paris?")]
    prompt = thinker.render("Be brief.", asked, tools=tools)
    written = 'Let me see.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    history = [*asked, Turn("assistant", "Let me see.", (("get_weather", '{"city": "Paris"}'),)), Turn("tool", '{"sky": "clear"}')]
    follow_up = thinker.render("Be brief.", history, tools=tools)
    generated = prompt + thinker.tokenizer.encode(written, add_special_tokens=False)
    assert follow_up[: len(generated)] == generated
    tail = thinker.tokenizer.decode(follow_up[len(generated) :])
    assert tail == '<|im_start|>user\n<tool_response>\n{"sky": "clear"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    assert '"name": "get_weather"' in thinker.tokenizer.decode(prompt)  # the tool, offered in the system block


# ------------------------------------------------------------------ whose values a call holds (grounding.py)

BOOK = Tool(
    "book_table",
    "Book a table.",
    {"type": "object", "properties": {"people": {"type": "integer"}, "time": {"type": "string"}, "note": {"type": "string"}}, "required": ["people", "time"]},
)
ORDER = Tool("lookup_order", "An order's status.", {"type": "object", "properties": {"order_number": {"type": "string"}}, "required": ["order_number"]})
FORECAST = Tool(
    "forecast",
    "The forecast.",
    {"type": "object", "properties": {"location": {"type": "string"}, "day": {"type": "string", "enum": ["today", "tomorrow"]}}, "required": ["location", "day"]},
)


RECIPE = Tool("find_recipe", "A recipe.", {"type": "object", "properties": {"ingredient": {"type": "string"}}, "required": ["ingredient"]})
CONTACT = Tool("call_contact", "Phone someone.", {"type": "object", "properties": {"name": {"type": "string", "description": "Who to call"}}, "required": ["name"]})
CURRENCY = Tool(
    "convert_currency",
    "Money.",
    {
        "type": "object",
        "properties": {"amount": {"type": "number"}, "from_currency": {"type": "string", "description": "ISO code"}, "to_currency": {"type": "string", "description": "ISO code"}},
        "required": ["amount", "from_currency", "to_currency"],
    },
)


@pytest.mark.parametrize(
    "said, tool, arguments, missing",
    [
        # the values said, in the model's own wording
        ("What is the weather in Paris?", WEATHER, '{"city": "Paris"}', []),
        ("What's the time in New York?", WEATHER, '{"city": "New York"}', []),
        ("Book a table for two at seven thirty.", BOOK, '{"people": 2, "time": "7:30 PM"}', []),
        ("Please book a table for four at seven tonight.", BOOK, '{"people": 4, "time": "7 pm", "note": "Window"}', []),  # (not required)
        ("Where is my order number four five one two?", ORDER, '{"order_number": "4512"}', []),
        ("Look up my order, number five five five.", ORDER, '{"order_number": "55555555"}', []),  # (a repetition holding it)
        ("Has order 2024 shipped?", ORDER, '{"order_number": "2024"}', []),
        ("Will it snow in Denver tomorrow?", FORECAST, '{"location": "Denver", "day": "tomorrow"}', []),
        ("What's three hundred minus one hundred and twenty?", BOOK, '{"people": 120, "time": "noon"}', []),
        # values nobody said: chit-chat and mishearings answered with a call (bench tools' misses)
        ("What color is the sky on a clear day?", WEATHER, '{"city": "London"}', ["city=London"]),
        ("I'm feeling great today.", FORECAST, '{"location": "New York", "day": "today"}', ["location=New York"]),
        ("Please look at table for format 7 to hide.", ORDER, '{"order_number": "12345"}', ["order_number=12345"]),
        ("A table at eight.", BOOK, '{"people": 2, "time": "8 pm"}', ["people=2"]),
        ("What's the forecast for Lisbon today?", FORECAST, '{"location": "Lisboa", "day": "today"}', ["location=Lisboa"]),
        ("Can you reserve a table for five at nine pm?", BOOK, '{"people": 5, "time": "8 pm"}', ["time=8 pm"]),  # (the tool's example)
        ("Can not fly.", BOOK, '{"people": 1, "time": "8 pm"}', ["people=1", "time=8 pm"]),
        # lowercase values that name something are held to what was said too; values of their own
        # form (a code, a time, an expression) are not
        ("How many days are in a week?", RECIPE, '{"ingredient": "chicken"}', ["ingredient=chicken"]),
        ("I'm feeling great today.", FORECAST, '{"location": "your-location", "day": "today"}', ["location=your-location"]),
        ("Find me something with apples.", RECIPE, '{"ingredient": "apple"}', []),
        ("Call my mom.", CONTACT, '{"name": "Mom"}', []),
        ("Convert fifty dollars to euros.", CURRENCY, '{"amount": 50, "from_currency": "USD", "to_currency": "eur"}', []),
        # nothing to say about: not JSON, not an object, a value missing (the schema check's)
        ("Hi", WEATHER, '{"city": "Par', []),
        ("Hi", WEATHER, "[1]", []),
        ("Hi", WEATHER, "{}", []),
    ],
)
def test_a_calls_values_must_have_been_said(said, tool, arguments, missing):
    assert ungrounded(arguments, tool.parameters, "You are a helpful assistant.\n" + said) == missing


async def test_only_values_that_name_something_are_read_for_their_fit():
    """An enum, a number, a code or a message is the model's own form, and a value with a capital
    is written as a name is: not read; a lowercase value read as less likely in its place than as
    any word is named with its parameter; one that cannot be scored fits."""
    from pipelines.cascade.calls.grounding import misfits, named

    asked: list[tuple[str, str]] = []

    async def likelihood(context: str, text: str) -> float | None:
        asked.append((context, text))
        return {" Paris": 1.0, " Chicken": -5.0}.get(text, -3.0) if context != "Here is a word:" else -2.0

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "dish": {"type": "string", "description": "Main ingredient"}, "day": {"type": "string", "enum": ["today"]},
                       "currency": {"type": "string", "description": "ISO code"}, "people": {"type": "integer"}, "note": {"type": "string"}, "extra": {"type": "string"}},
        "required": ["city", "dish", "day", "currency", "people", "note"],
    }  # fmt: skip
    arguments = json.dumps({"city": "Paris", "dish": "chicken", "day": "today", "currency": "EUR", "people": 2, "note": "window seat", "extra": "x"})
    assert await misfits(arguments, "Book a table.", schema, likelihood) == ["dish=chicken"]
    assert sorted(asked) == sorted([("Book a table. Main ingredient:", " Chicken"), ("Here is a word:", " Chicken")])  # (Paris: written as a name)
    asked.clear()
    assert await misfits(arguments.replace("Paris", "paris"), "Book a table.", schema, likelihood) == ["dish=chicken"]
    assert ("Book a table. City:", " Paris") in asked  # (read as a name is written; 1.0 against -2.0: fits)
    asked.clear()  # the user's spelling rules: "paris" said, "Paris" written (a second choice's own capital) is read
    assert await misfits(arguments, "Book a table.", schema, likelihood, "A table in paris, for chicken.") == ["dish=chicken"]
    assert ("Book a table. City:", " Paris") in asked
    asked.clear()
    assert await misfits(arguments.replace("Paris", "paris"), "Book a table.", schema, likelihood, "A table in Paris.") == ["dish=chicken"]
    assert ("Book a table. City:", " Paris") not in asked

    async def nothing(context: str, text: str) -> float | None:
        return None

    assert await misfits(arguments, "Book a table.", schema, nothing) == [] and await misfits("not json", "", schema, likelihood) == []
    assert named("call_contact", "Phone someone from the user's contacts.", "Phone Katie for me.")
    assert not named("get_forecast", "Get today's weather forecast for a city.", "What color are ripe bananas?")


def test_the_instructions_ground_names_and_digits_not_their_number_words():
    grounds = instructions("Reply in one short sentence. The user lives in Lyon; their order is 4512.")
    assert ungrounded('{"people": 1, "time": "at once"}', BOOK.parameters, grounds + "\nCan not fly.") == ["people=1"]
    assert ungrounded('{"city": "Lyon"}', WEATHER.parameters, grounds + "\nHow warm is it?") == []
    assert ungrounded('{"order_number": "4512"}', ORDER.parameters, grounds + "\nWhere is my order?") == []
    assert ungrounded('{"people": 1, "time": "1 pm"}', BOOK.parameters, grounds + "\nOne person at one.") == []


def test_spoken_numbers_are_read_as_said():
    assert {"4", "5", "1", "2", "45", "451", "4512"} <= numbers_of("order four five one two")
    assert {"27", "120", "300"} <= numbers_of("twenty seven or three hundred or one hundred and twenty")
    assert {"7", "30"} <= numbers_of("at seven thirty") and "37" not in numbers_of("at seven thirty")
    assert "12" in numbers_of("12 people") and "45" not in numbers_of("four, then five")


async def _stream(*deltas: str):
    for d in deltas:
        yield d


async def _answer(text: str, words: str | None, parallel: bool = True) -> tuple[str, list[object], ToolStream]:
    stream = ToolStream(_stream(*[text[i : i + 3] for i in range(0, len(text), 3)]), [WEATHER, ORDER], parallel=parallel, words=words)
    said = "".join([d async for d in stream.speech()])
    chunks = [c async for c in stream.calls()]
    await stream.close()
    return said, chunks, stream


async def test_a_call_with_values_nobody_said_is_dropped_before_the_client_sees_any_of_it():
    text = '{"name": "get_weather", "arguments": {"city": "London"}}'
    said, chunks, stream = await _answer(text, "What color is the sky?")
    assert said == "" and chunks == [] and stream.made == 0 and stream.ungrounded == [("get_weather", ["city=London"])]
    # the same call after a request that named the city goes out whole, deltas first
    said, chunks, stream = await _answer(text.replace("London", "Oslo"), "How cold is it in Oslo?")
    assert [type(c) for c in chunks][-1] is ToolCall and stream.made == 1 and stream.ungrounded == []
    deltas = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert deltas[0].name == "get_weather" and "".join(d.delta for d in deltas) == '{"city": "Oslo"}'
    # without words (grounding off, or a call the client demanded) nothing is checked
    said, chunks, stream = await _answer(text, None)
    assert stream.made == 1 and stream.ungrounded == []


async def test_of_two_calls_only_the_one_with_the_users_values_goes_out():
    text = '{"name": "lookup_order", "arguments": {"order_number": "12345"}}\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    _, chunks, stream = await _answer(text, "Is it cold in Oslo?")
    calls = [c for c in chunks if isinstance(c, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    assert stream.ungrounded == [("lookup_order", ["order_number=12345"])]


def test_an_answer_held_to_words_cannot_begin_a_call():
    """The tokens banned from an answer in words: every one that could begin a call the parser
    knows, and none of a plain sentence's."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(models.path("qwen2.5-coder-0.5b-instruct-w8")))
    banned = call_start_ids(tokenizer, token_texts(tokenizer))
    for start in ('{"', "{\n", "```", "<tool_call>", " {"):
        assert tokenizer.encode(start, add_special_tokens=False)[0] in banned, start
    plain = tokenizer.encode("The sky is blue, and it's 7 pm in Oslo (Norway).", add_special_tokens=False)
    assert not set(plain) & banned


# ------------------------------------------------------------------ what the answer does with a dropped call


class ScriptedThinker:
    """The thinker's side of a production: each request streams the next scripted text (in pieces).
    ``constrain``: ``CallOptions.constrain``; a request held to a schema is scripted like any
    other, its schema recorded."""

    def __init__(
        self,
        *texts: str,
        constrain: str = "never",
        refuse: bool = False,
        names: dict[str, float] | None = None,
        held: list[str] | None = None,
        reads: dict[str, tuple[float, float]] | None = None,
        fit: bool = True,
    ) -> None:
        self.options = ThinkerOptions(calls=CallOptions(constrain=constrain, fit=fit))  # type: ignore[arg-type]
        # a value's log probability in its parameter's place and after "Here is a word:", by its
        # text as scored (``likelihood``), or by "<the place>|<text>" for one place alone; a text
        # not here cannot be scored (None)
        self.reads = reads or {}
        self.scored: list[tuple[str, str]] = []
        self.names = names or {}  # the probability of each tool's name once a call has begun (``top_next``)
        self.held = held  # if given, the texts of the requests held to a schema, scripted apart from the others
        self.steps = 0  # ``top_next`` requests
        self.refuse = refuse  # a request with a schema fails as vLLM's does for one its grammar cannot take
        self.texts = list(texts)
        self.prompts: list[list[int]] = []
        self.budgets: list[int | None] = []
        self.banned: list[frozenset[int]] = []
        self.schemas: list[object] = []
        self.call_start_ids = frozenset({1, 2})
        self.vocab = None  # (no steered calls: the scripted texts are the calls as written)
        self.closed = 0  # requests closed before their text ran out (aborted)

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(models.path("qwen2.5-coder-0.5b-instruct-w8")))

    def encode(self, text: str) -> list[int]:  # (as Thinker.encode)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def top_next(self, prompt: list[int], salt: str) -> dict[int, float]:
        """After the production's prompt ([10, 11]), a call's head and part of a name: the next
        token's logprobs as ``names`` make them (the mass of the names that go on with it over the
        mass of those that the part begins; every name goes on from the head's own tokens)."""
        self.steps += 1
        encode = self.tokenizer.encode
        head, written = encode(OPEN + "\n" + '{"name": "', add_special_tokens=False), prompt[2:]
        mass: Counter[int] = Counter()
        for name, p in self.names.items():
            ids = encode(OPEN + "\n" + '{"name": "' + name, add_special_tokens=False)
            if ids[: len(written)] == written and len(ids) > len(written):
                mass[ids[len(written)]] += p
        below = 1.0 if len(written) <= len(head) and written == head[: len(written)] else sum(
            p for n, p in self.names.items() if encode(OPEN + "\n" + '{"name": "' + n, add_special_tokens=False)[: len(written)] == written
        )
        return {token: math.log(m / below) for token, m in mass.items()}

    async def likelihood(self, context: str, text: str, salt: str) -> float | None:
        self.scored.append((context, text))
        read = self.reads.get(f"{context}|{text.strip()}") or self.reads.get(text.strip())
        return None if read is None else read[1] if context == "Here is a word:" else read[0]

    async def stream(self, prompt: list[int], salt: str, *, max_tokens: int | None = None, ask: Ask | None = None, report: Report | None = None):  # type: ignore[no-untyped-def]
        self.prompts.append(prompt)
        self.budgets.append(max_tokens)
        self.banned.append(ask.banned if ask is not None else frozenset())
        self.schemas.append(ask.schema if ask is not None else None)
        if self.refuse and self.schemas[-1] is not None:
            raise ValueError("The provided JSON schema contains features not supported by xgrammar.")
        text = self.held.pop(0) if self.held is not None and self.schemas[-1] is not None else self.texts.pop(0)
        i = 0
        try:
            for i in range(0, len(text), 4):
                yield text[i : i + 4]
            i = len(text)
        finally:
            self.closed += i < len(text)


class Scripted:
    """A cascade pipeline (``Models``) whose thinker is scripted; text answers only."""

    def __init__(self, thinker: ScriptedThinker) -> None:
        self.options = CascadeOptions()
        self.capabilities = Capabilities(name="scripted", tools=True)
        self.thinker = thinker
        self.counts = Counts()


FORECAST_TOOL = Tool("forecast", "Weather forecast for a place on a given day.", FORECAST.parameters)


CALCULATE = Tool("calculate", "Calculate an arithmetic expression.", {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})


async def _produce(
    thinker: ScriptedThinker, asked: str, tool_choice: str = "auto", tools: tuple[Tool, ...] = (FORECAST_TOOL,), before: str = ""
) -> tuple[str, list[ToolCall], Scripted]:
    pipeline = Scripted(thinker)
    request = ResponseRequest("resp_1", [], "Be brief.", output_modalities=("text",), tools=list(tools), tool_choice=tool_choice)
    context = ToolContext(f"Be brief.\n{before}\n{asked}", asked, lambda: [10], before)
    production = CascadeProduction(pipeline, "salt", request, [10, 11], list(tools), {}, context=context)  # type: ignore[arg-type]
    chunks = [c async for c in production.output]
    said = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    return said, [c for c in chunks if isinstance(c, ToolCall)], pipeline


async def test_a_request_heard_with_a_value_the_call_changed_is_asked_again():
    """"The forecast for Lisbon" and a call for "Lisboa": the agent asks for the place again rather
    than answering from nothing ("The forecast for Lisbon is sunny", what a second answer said)."""
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Lisboa", "day": "today"}}', "unused")
    said, calls, pipeline = await _produce(thinker, "What's the forecast for Lisbon today?")
    assert calls == [] and said == "Sorry, I didn't catch the location. Could you say it again?"
    assert pipeline.counts.tool_calls_ungrounded == 1 and pipeline.counts.answers_asking_back == 1
    assert len(thinker.prompts) == 1  # no second request


async def test_a_preamble_then_a_call_with_a_value_the_user_did_not_say_is_followed_by_the_question():
    thinker = ScriptedThinker('Let me check. {"name": "forecast", "arguments": {"location": "Lisboa", "day": "today"}}')
    said, calls, _ = await _produce(thinker, "What's the forecast for Lisbon today?")
    assert calls == [] and said == "Let me check. Sorry, I didn't catch the location. Could you say it again?"


async def test_spoken_the_question_after_a_preamble_keeps_the_space_between_them():
    """In audio the talker trims a response's first words: the question after words already said
    is not its first ("You can call theSorry, ..." was heard in a run of bench.tools)."""

    class Spoken(Scripted):
        async def speak(self, text: str) -> np.ndarray:
            return np.zeros(240, np.int16)

    thinker = ScriptedThinker('Let me check.{"name": "forecast", "arguments": {"location": "Lisboa", "day": "today"}}')
    pipeline = Spoken(thinker)
    asked = "What's the forecast for Lisbon today?"
    request = ResponseRequest("resp_1", [], "Be brief.", tools=[FORECAST_TOOL])
    production = CascadeProduction(pipeline, "salt", request, [10, 11], [FORECAST_TOOL], {}, context=ToolContext(f"Be brief.\n{asked}", asked, lambda: [10]))  # type: ignore[arg-type]
    chunks = [c async for c in production.output]
    said = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    assert said == "Let me check. Sorry, I didn't catch the location. Could you say it again?"
    assert any(isinstance(c, AudioChunk) for c in chunks) and pipeline.counts.answers_asking_back == 1


async def test_words_cut_off_by_a_dropped_call_are_followed_by_an_answer_in_words():
    """"You can call the" + a call nobody asked for (a small thinker talking about its tools, as in
    bench.answers with tools offered): dropped, and the answer said in words after the fragment
    rather than leaving the user with half a sentence."""
    thinker = ScriptedThinker('You can call the{"name": "forecast", "arguments": {"location": "New York", "day": "today"}}', "Boil water and add a tea bag.")
    said, calls, pipeline = await _produce(thinker, "How do I make a cup of tea?")
    assert calls == [] and said == "You can call the Boil water and add a tea bag."
    assert pipeline.counts.answers_said_instead_of_calls == 1 and len(thinker.prompts) == 2


async def test_a_finished_sentence_before_a_dropped_call_is_the_answer():
    thinker = ScriptedThinker('It is sunny today. {"name": "forecast", "arguments": {"location": "New York", "day": "today"}}', "unused")
    said, calls, pipeline = await _produce(thinker, "I'm feeling great today.")
    assert calls == [] and said == "It is sunny today. " and len(thinker.prompts) == 1
    assert pipeline.counts.answers_said_instead_of_calls == 0


async def test_chit_chat_answered_with_a_call_is_answered_in_words_without_the_tools():
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "New York", "day": "today"}}', "Glad to hear it!")
    said, calls, pipeline = await _produce(thinker, "I'm feeling great today.")
    assert calls == [] and said == "Glad to hear it!"
    assert pipeline.counts.answers_said_instead_of_calls == 1
    assert thinker.prompts == [[10, 11], [10]]  # the second without the tools (``plain``) ...
    assert thinker.banned == [frozenset(), frozenset({1, 2})]  # ... and no call can begin it


async def test_a_call_with_the_users_values_goes_out_and_nothing_is_said_again():
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Denver", "day": "tomorrow"}}')
    said, calls, pipeline = await _produce(thinker, "Will it snow in Denver tomorrow?")
    assert said == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("forecast", {"location": "Denver", "day": "tomorrow"})]
    assert pipeline.counts.tool_calls_ungrounded == 0 and len(thinker.prompts) == 1


async def test_a_value_said_that_the_thinker_does_not_read_as_its_parameters_is_not_called():
    """"What color are ripe bananas?" and a forecast for "bananas": the word was said, but the
    thinker reads it as less likely as a place than as any word: the call is dropped and the
    question answered in words (a plain question: nothing asked back)."""
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "bananas", "day": "today"}}', "Ripe bananas are yellow.", reads={"Bananas": (-8.0, -7.0)})
    said, calls, pipeline = await _produce(thinker, "What color are ripe bananas?")
    assert calls == [] and said == "Ripe bananas are yellow."
    assert pipeline.counts.tool_calls_misfit == 1 and pipeline.counts.tool_calls_ungrounded == 0 and pipeline.counts.answers_said_instead_of_calls == 1
    context = "Weather forecast for a place on a given day. Location:"  # (the day is an enum: not read; lowercase read as a name is written)
    assert sorted(thinker.scored) == sorted([(context, " Bananas"), ("Here is a word:", " Bananas")])


async def test_a_value_that_fits_in_one_spelling_goes_out_as_said():
    """A name heard in lowercase ("rome") is read as "Rome": the call goes out, its value as the
    user's words had it; so does every call with ``calls.fit`` off, or a value that cannot be scored."""
    for reads, fit in (({"Rome": (-3.0, -7.5)}, True), ({"Rome": (-9.0, -6.0)}, False), ({}, True)):
        thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "rome", "day": "today"}}', reads=reads, fit=fit)
        said, calls, pipeline = await _produce(thinker, "Is it sunny in rome today?")
        assert said == "" and [json.loads(c.arguments)["location"] for c in calls] == ["rome"], (reads, fit)
        assert pipeline.counts.tool_calls_misfit == 0 and bool(thinker.scored) == fit


async def test_a_call_the_users_words_name_is_not_second_guessed():
    """"What's the forecast for Bananas?": a word of the tool's name or description was said, so
    the call goes out without the prefills of the check."""
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Bananas", "day": "today"}}', reads={"Bananas": (-9.0, -6.0)})
    said, calls, pipeline = await _produce(thinker, "What's the forecast for Bananas today?")
    assert said == "" and [json.loads(c.arguments)["location"] for c in calls] == ["Bananas"]
    assert thinker.scored == [] and pipeline.counts.tool_calls_misfit == 0


CALL_CONTACT = Tool("call_contact", "Phone someone.", {"type": "object", "properties": {"name": {"type": "string", "description": "Who to call"}}, "required": ["name"]})


@pytest.mark.parametrize(
    "asked, before, arguments, dropped",
    [
        ("Good morning.", "", {"name": "Good morning"}, ["name=Good morning"]),  # a greeting, not a request
        ("Um, good morning!", "Hello!", {"name": "Good morning"}, ["name=Good morning"]),  # (fillers aside; the agent asked nothing)
        ("Lisbon.", "", {"location": "Lisbon", "day": "today"}, ["location=Lisbon", "day=today"]),  # a word alone, out of the blue
        ("Lisbon.", "Which city?", {"location": "Lisbon", "day": "today"}, []),  # the answer to the agent's question
        ("Call Katie.", "", {"name": "Katie"}, []),  # a request: a word beside the value
        ("Good morning, Katie.", "", {"name": "Katie"}, []),
        ("Katie, five minutes.", "", {"name": "Katie", "minutes": 5}, []),  # (a number said beside: not the values alone)
        ("", "", {"name": "Katie"}, []),
        ("Hello.", "", {"minutes": 5}, []),  # no string value
        ("Good morning.", "", "not json", []),
    ],
)
def test_a_call_whose_values_are_all_the_user_said_was_not_asked_for(asked, before, arguments, dropped):
    from pipelines.cascade.calls.grounding import unasked

    schema = {"type": "object", "properties": {k: {"type": "string"} for k in ("name", "location", "day")} | {"minutes": {"type": "integer"}}}
    assert unasked(arguments if isinstance(arguments, str) else json.dumps(arguments), schema, asked, before) == dropped


async def test_a_greeting_read_as_someone_to_call_is_answered_in_words():
    """"Good morning." and a call to "Good morning" (the 1.5B's, in every run of the said set): the
    value was said, and written with a capital (so not read for its fit), but the user's words are
    the value and nothing else and the agent asked for nothing: the call is dropped, with no
    reading of it, and the greeting answered in words. The same word after the agent's question
    ("Who should I call?") answers it: the call goes out."""
    text = '{"name": "call_contact", "arguments": {"name": "Good morning"}}'
    thinker = ScriptedThinker(text, "Good morning! How can I help?")
    said, calls, pipeline = await _produce(thinker, "Good morning.", tools=(CALL_CONTACT,))
    assert calls == [] and said == "Good morning! How can I help?"
    assert pipeline.counts.tool_calls_misfit == 1 and pipeline.counts.answers_said_instead_of_calls == 1 and thinker.scored == []
    thinker = ScriptedThinker(text.replace("Good morning", "Katie"), reads={"Katie": (-9.0, -6.0)})
    said, calls, pipeline = await _produce(thinker, "Katie.", tools=(CALL_CONTACT,), before="Sure. Who should I call?")
    assert said == "" and [json.loads(c.arguments) for c in calls] == [{"name": "Katie"}] and pipeline.counts.tool_calls_misfit == 0


# ------------------------------------------------------------------ the model's second choice of tool


async def test_a_dropped_call_gives_way_to_the_models_next_choice_of_tool_when_its_values_were_said():
    """"What's 100 divided by 4?": the small thinker reaches for the first tool it was shown (a
    forecast for Paris, dropped: nobody said Paris); its second choice, calculate, is written with
    its name given and its arguments held to its schema, and made: its values were said."""
    thinker = ScriptedThinker(
        '{"name": "forecast", "arguments": {"location": "Paris", "day": "today"}}',
        "That is twenty five.",  # an answer in words, had the second choice not been made
        names={"forecast": 0.6, "calculate": 0.1},
        held=['{"expression": "100 / 4"}'],
    )
    said, calls, pipeline = await _produce(thinker, "What's 100 divided by 4?", tools=(FORECAST_TOOL, CALCULATE))
    assert said == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("calculate", {"expression": "100 / 4"})]
    assert thinker.schemas == [None, CALCULATE.parameters] and thinker.texts == ["That is twenty five."]  # (never asked for)
    assert thinker.prompts[1] == [10, 11, *thinker.tokenizer.encode(OPEN + "\n" + call_head("calculate"), add_special_tokens=False)]
    assert thinker.budgets[1] == CallOptions().second_choice_tokens  # (a value rambling on is not waited for)
    assert pipeline.counts.calls_second_choice == 1 and pipeline.counts.tool_calls_ungrounded == 1
    assert pipeline.counts.answers_said_instead_of_calls == 0


async def test_a_call_of_a_tool_not_offered_gives_way_to_the_models_next_choice():
    thinker = ScriptedThinker('{"name": "add", "arguments": {"a": 65, "b": 35}}', "One hundred.", names={"calculate": 0.08}, held=['{"expression": "65 + 35"}'])
    _, calls, pipeline = await _produce(thinker, "Add 65 and 35.", tools=(FORECAST_TOOL, CALCULATE))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("calculate", {"expression": "65 + 35"})]
    assert pipeline.counts.tool_calls_unknown == 1 and pipeline.counts.calls_second_choice == 1


@pytest.mark.parametrize(
    "names, second, words",
    [
        ({"forecast": 0.9, "calculate": 0.01}, None, "Glad to hear it!"),  # below the floor: not written
        ({"calculate": 0.3}, '{"expression": "7 * 24", "unit": "hours"}', "Glad to hear it!"),  # written, values nobody said: dropped
    ],
)
async def test_chit_chat_gets_no_second_choice_of_call(names, second, words):
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "New York", "day": "today"}}', words, names=names, held=[second] if second else [])
    said, calls, pipeline = await _produce(thinker, "I'm feeling great today.", tools=(FORECAST_TOOL, CALCULATE))
    assert calls == [] and said == words
    assert pipeline.counts.calls_second_choice == 0 and pipeline.counts.answers_said_instead_of_calls == 1
    assert len(thinker.prompts) == 2 + bool(second) and [10] in thinker.prompts  # the answer in words, without the tools
    assert thinker.held == []  # (the second choice written when over the floor) ...
    assert thinker.closed == bool(second)  # ... and given up once its expression was whole: nobody said 7 or 24


async def test_a_second_choice_the_thinker_does_not_read_so_is_not_made():
    """"Don katie for me" (a misheard "Phone Katie"): a forecast for "katie" is dropped (not read as
    a place) and the next choice, a call to her, is made; had it not read as a person either, the
    answer is in words."""
    call = Tool("call_contact", "Phone someone from the user's contacts.", {"type": "object", "properties": {"name": {"type": "string", "description": "Who to call"}}, "required": ["name"]})
    for person, made in ((-3.0, True), (-8.0, False)):  # (its log probability as who to call; -6.0 as any word)
        thinker = ScriptedThinker(
            '{"name": "forecast", "arguments": {"location": "katie", "day": "today"}}', "Sorry, I can't.", names={"forecast": 0.5, "call_contact": 0.4}, held=['{"name": "katie"}'],
            reads={"Katie": (-9.0, -6.0), "Phone someone from the user's contacts. Who to call:|Katie": (person, -6.0)},
        )  # fmt: skip
        said, calls, pipeline = await _produce(thinker, "Don katie for me.", tools=(FORECAST_TOOL, call))
        assert [(c.name, json.loads(c.arguments)) for c in calls] == ([("call_contact", {"name": "katie"})] if made else [])
        assert said == ("" if made else "Sorry, I can't.") and pipeline.counts.tool_calls_misfit == 1
        assert pipeline.counts.calls_second_choice == made


def test_a_value_is_checked_once_it_is_written_whole():
    from pipelines.cascade.calls.grounding import settled as _settled

    assert _settled('{"city": "Lon') is None and _settled('{"city"') is None and _settled('{"people": 1') is None
    assert _settled('{"city": "London"') == '{"city": "London"}'
    assert _settled('{"people": 12, ') == '{"people": 12}'  # (a number is whole at its comma: "1" of "120" is not)
    assert _settled('{"a": {"b": "c"') is None  # (an object left open: not checked until it closes)


async def test_no_second_choice_with_second_choices_zero():
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Paris", "day": "today"}}', "Twenty five.", names={"calculate": 0.5})
    thinker.options = ThinkerOptions(calls=CallOptions(second_choices=0))
    said, calls, _ = await _produce(thinker, "What's 100 divided by 4?", tools=(FORECAST_TOOL, CALCULATE))
    assert calls == [] and said == "Twenty five." and thinker.steps == 0


async def test_the_names_probabilities_are_the_models_walked_over_their_shared_tokens():
    """``name_probabilities`` against a model whose next-token table is known: each name's
    probability is the product of its tokens', a token outside a step's candidates makes its name
    improbable, and every node of the names' trie is asked once (one engine step each)."""
    # a "tokenizer" of one token per character, the head's own characters included
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    head = encode(OPEN + "\n" + '{"name": "')
    table = {  # what follows each written part of a name (after the head)
        "": {ord("g"): math.log(0.5), ord("c"): math.log(0.25)},
        "g": {ord("e"): 0.0},
        "ge": {ord("t"): 0.0},
        "get": {ord("_"): 0.0},
        "get_": {ord("w"): math.log(0.8), ord("t"): math.log(0.2)},
    }
    asked: list[str] = []

    async def top_next(ids: list[int]) -> dict[int, float]:
        assert ids[:3] == [1, 2, 3] and ids[3 : 3 + len(head)] == head
        part = "".join(map(chr, ids[3 + len(head) :]))
        asked.append(part)
        return table.get(part, dict.fromkeys(range(128), 0.0))  # (past these: whatever the name goes on with, certainly)

    chance = await name_probabilities(top_next, encode, [1, 2, 3], ["get_weather", "get_time", "calculate", "lookup"])
    assert chance["get_weather"] == pytest.approx(0.4) and chance["get_time"] == pytest.approx(0.1)
    assert chance["calculate"] == pytest.approx(0.25) and chance["lookup"] == 0.0  # ("l" never a candidate)
    assert sorted(asked) == sorted(set(asked)) and asked[0] == ""  # each node once, the root first
    assert "get_w" in asked and "get_t" in asked and "c" in asked and "l" not in asked


# ------------------------------------------------------------------ a call held to its schema


def test_the_schema_a_call_is_held_to_takes_the_calls_of_the_tools_offered_and_no_other():
    import jsonschema

    schema = call_schema([WEATHER, FORECAST_TOOL])
    ok = [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "forecast", "arguments": {"location": "Oslo", "day": "today"}}]
    wrong = [
        {"name": "get_time", "arguments": {"city": "Oslo"}},  # a tool not offered
        {"name": "forecast", "arguments": {"location": "Oslo", "day": "Monday"}},  # off its enum
        {"name": "get_weather", "arguments": {}},  # a required value missing
        {"name": "get_weather", "arguments": {"city": 7}},  # of the wrong type
        {"name": "get_weather", "arguments": {"city": "Oslo"}, "note": "extra"},
        {"arguments": {"city": "Oslo"}},
    ]
    for call in ok:
        jsonschema.validate(call, schema)
    for call in wrong:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(call, schema)
    assert list(call_schema([WEATHER])["properties"]) == ["name", "arguments"]  # (the name first, as the template writes it)
    # a forced call: "required" chooses its tool under the grammar; a named one's prompt names it
    assert forced_start("required", [WEATHER, FORECAST_TOOL], constrained=True) == "<tool_call>\n"
    assert forced_schema("required", [WEATHER, FORECAST_TOOL]) == call_schema([WEATHER, FORECAST_TOOL])
    assert forced_start("forecast", [WEATHER, FORECAST_TOOL], constrained=True) == '<tool_call>\n{"name": "forecast", "arguments": '
    assert forced_schema("forecast", [WEATHER, FORECAST_TOOL]) == FORECAST_TOOL.parameters


async def test_once_the_model_names_a_tool_its_arguments_are_written_held_to_the_tools_schema():
    """The first request is closed when the model has named a tool offered (its made-up "day" never
    reaches anyone); the second goes on from the prompt, what was said and the call's head, its
    arguments held to the tool's schema."""
    thinker = ScriptedThinker(
        'Let me check. {"name": "forecast", "arguments": {"location": "Denver", "day": "Tuesday", "and more": "text the model would have written"}}',
        '{"location": "Denver", "day": "tomorrow"}',
        constrain="always",
    )
    said, calls, pipeline = await _produce(thinker, "Will it snow in Denver tomorrow?")
    assert said == "Let me check. " and [(c.name, json.loads(c.arguments)) for c in calls] == [("forecast", {"location": "Denver", "day": "tomorrow"})]
    assert thinker.schemas == [None, FORECAST_TOOL.parameters] and thinker.closed == 1
    head = 'Let me check. <tool_call>\n{"name": "forecast", "arguments": '
    assert thinker.prompts[1] == [10, 11, *thinker.tokenizer.encode(head, add_special_tokens=False)]
    assert pipeline.counts.tool_calls == 1 and pipeline.counts.tool_calls_off_schema == 0


@pytest.mark.parametrize("mode", ["forced", "always"])
async def test_a_call_of_a_tool_not_offered_is_dropped_at_its_name_and_answered_in_words(mode):
    """The model chooses the tool: held to the schema of the tools offered, "divide" became a call
    for the weather in London (bench tools); it is dropped once its name is known (the request
    closed before its arguments are written), and the answer said in words."""
    thinker = ScriptedThinker('{"name": "divide", "arguments": {"dividend": 100, "divisor": 4}}', "That is twenty five.", constrain=mode)
    said, calls, pipeline = await _produce(thinker, "What's one hundred divided by four?")
    assert calls == [] and said == "That is twenty five." and thinker.schemas == [None, None]
    assert pipeline.counts.tool_calls_unknown == 1 and thinker.closed == 1


@pytest.mark.parametrize("mode", ["forced", "always"])
async def test_an_answer_in_words_is_one_request_and_a_forced_call_is_held_from_its_first_token(mode):
    thinker = ScriptedThinker("It will snow, so dress warmly.", constrain=mode)
    said, calls, _ = await _produce(thinker, "Should I wear a coat?")
    assert said == "It will snow, so dress warmly." and calls == [] and thinker.schemas == [None]
    thinker = ScriptedThinker('{"location": "Denver", "day": "today"}', constrain=mode)
    _, calls, _ = await _produce(thinker, "Will it snow in Denver today?", tool_choice="forecast")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("forecast", {"location": "Denver", "day": "today"})]
    assert thinker.schemas == [FORECAST_TOOL.parameters]
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Denver", "day": "today"}}', constrain=mode)
    _, calls, _ = await _produce(thinker, "Will it snow in Denver today?", tool_choice="required")
    assert [c.name for c in calls] == ["forecast"] and thinker.schemas == [call_schema([FORECAST_TOOL])]


async def test_by_default_a_call_the_model_makes_on_its_own_is_written_as_it_writes_it():
    """``forced`` (the default): a call ``tool_choice: auto`` lets the model make costs no second request."""
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Denver", "day": "today"}}')
    thinker.options = ThinkerOptions()
    _, calls, _ = await _produce(thinker, "Will it snow in Denver today?")
    assert [c.name for c in calls] == ["forecast"] and thinker.schemas == [None] and thinker.closed == 0


async def test_a_schema_the_engine_refuses_leaves_the_call_as_the_model_writes_it():
    thinker = ScriptedThinker('{"name": "forecast", "arguments": {"location": "Denver", "day": "tomorrow"}} and on', '{"location": "Denver", "day": "tomorrow"}', constrain="always", refuse=True)
    said, calls, pipeline = await _produce(thinker, "Will it snow in Denver tomorrow?")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("forecast", {"location": "Denver", "day": "tomorrow"})]
    assert thinker.schemas == [None, FORECAST_TOOL.parameters, None] and pipeline.counts.tool_schemas_refused == 1


def test_a_request_asks_for_a_tool_when_it_names_what_the_tool_does():
    assert asked_for("forecast", "What's the forecast for Lisbon today?")
    assert asked_for("get_time", "What time is it instantly right now?")
    assert asked_for("lookup_order", "Where are my orders?")
    assert not asked_for("get_weather", "What color is the sky on a clear day?")
    assert not asked_for("forecast", "I'm feeling great today.")
    assert not asked_for("forecast", "How many days are in a week?")  # (its description says "a given day")
    assert ask_back(["order_number=12345"]) == "Sorry, I didn't catch the order number. Could you say it again?"


@pytest.mark.parametrize("after_output", ["hidden", "shown", "offered", False, True])
def test_the_tools_in_the_answer_to_a_tools_output(after_output):
    """``tools_after_output``: "hidden" (false) renders them out of that answer's prompt, "shown"
    keeps them in it (the prompt goes on from the conversation's, cached) but offers none to call,
    "offered" (true) offers them again."""
    from transformers import AutoTokenizer

    from pipelines.base import FunctionCall, FunctionResult, Message, Part
    from pipelines.cascade.prompts import Prompts

    thinker = Thinker(ThinkerOptions())
    thinker.tokenizer = AutoTokenizer.from_pretrained(str(models.path("qwen2.5-coder-0.5b-instruct-w8")))
    prompts = Prompts(thinker, lambda: True, after_output)
    asked = [Message("item_1", "user", [Part("text", text="Weather in Paris?")])]
    call = FunctionCall("item_2", "call_1", "get_weather", '{"city": "Paris"}', status="completed")
    answering = ResponseRequest("resp_2", [*asked, call, FunctionResult("item_3", "call_1", '{"sky": "clear"}')], "Be brief.", tools=[WEATHER])
    before = prompts.prompt(ResponseRequest("resp_1", asked, "Be brief.", tools=[WEATHER]))
    after = prompts.prompt(answering)
    mode = {False: "hidden", True: "offered"}.get(after_output, after_output)  # type: ignore[call-overload]
    assert prompts.offered(answering) == ([WEATHER] if mode == "offered" else [])
    assert prompts.shown(answering) == ([] if mode == "hidden" else [WEATHER])
    assert (after[: len(before)] == before) == (mode != "hidden")  # shown: the conversation's prompt goes on


def test_the_words_before_the_users_last_are_the_agents_last_that_said_any():
    """``Prompts.said``: everything said, the user's last words, and the agent's words before them
    (a call's turn with no words passes over to the words before it; the open turn's words come
    after the conversation's last turn)."""
    from pipelines.base import FunctionCall, FunctionResult, Message, Part
    from pipelines.cascade.prompts import Prompts

    prompts = Prompts(Thinker(ThinkerOptions()), lambda: True, "hidden")

    def message(n: int, role: str, text: str) -> Message:
        return Message(f"item_{n}", role, [Part("text", text=text)])  # type: ignore[arg-type]

    items = [message(1, "user", "Call someone."), message(2, "assistant", "Who should I call?"), message(3, "user", "Katie.")]
    assert prompts.said(ResponseRequest("resp_1", items, "Be brief."))[1:] == ("Katie.", "Who should I call?")
    assert prompts.said(ResponseRequest("resp_1", items[:2], "Be brief."), pending="Anna.")[1:] == ("Anna.", "Who should I call?")
    assert prompts.said(ResponseRequest("resp_1", items[:1], "Be brief."), pending="Anna.")[1:] == ("Anna.", "")
    assert prompts.said(ResponseRequest("resp_1", items[:1], "Be brief."))[1:] == ("Call someone.", "")
    call = FunctionCall("item_4", "call_1", "call_contact", '{"name": "Katie"}', status="completed")
    later = [*items, call, FunctionResult("item_5", "call_1", "ringing"), message(6, "user", "Hang up.")]
    assert prompts.said(ResponseRequest("resp_2", later, "Be brief."))[1:] == ("Hang up.", "Who should I call?")
