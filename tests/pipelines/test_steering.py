"""Steered tool calls (pipelines/cascade/calls/steering.py): the ``CallWriter``'s parts driven by a scripted
model through an engine that keeps vLLM's rules for a resumable request's parts (a part's tokens held to
``allowed``; it ends at a token in ``stop``, whose text is not returned, or after ``max_tokens``; the last
sampled token is dropped from the request, the next part's tokens appended), with the default thinker's
own tokenizer. What streams out must be the call as the template writes it, and what the engine was
given must be the same text (the model sees the call it is writing); a seeded run of random schemas and
random choices checks that every call made is JSON that fits its schema's keys and kinds."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from pipelines import models
from pipelines.base import Tool
from pipelines.cascade.calls.grounding import ungrounded
from pipelines.cascade.calls.steering import NAME_TOKENS, STRING_TOKENS, CallWriter, Calls, Part, Spans, Vocab, steerable, vocab
from pipelines.cascade.calls.format import CLOSE, OPEN, CallEnded, CallParser, Said, token_texts

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TABLE = Tool(
    "book_table",
    "",
    {"type": "object", "properties": {"people": {"type": "integer"}, "time": {"type": "string"}}, "required": ["people", "time"]},
)
FORECAST = Tool(
    "forecast",
    "",
    {
        "type": "object",
        "properties": {"location": {"type": "string"}, "day": {"type": "string", "enum": ["today", "tomorrow"]}, "celsius": {"type": "boolean"}},
        "required": ["location", "day"],
    },
)
LIST = Tool("add_items", "", {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}, "required": ["items"]})


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(models.path("qwen2.5-coder-0.5b-instruct-w8")))


@pytest.fixture(scope="module")
def words(tokenizer: Any) -> Vocab:
    found = vocab(tokenizer, token_texts(tokenizer))
    assert found is not None
    return found


class Engine:
    """One steered answer through vLLM's rules for a resumable request. ``model(part, context)`` is the
    scripted model: the token it samples next given the part and all the text of the request so far."""

    def __init__(self, tokenizer: Any, writer: CallWriter, model: Any, first_stop: frozenset[int]) -> None:
        self.tokenizer, self.writer, self.model = tokenizer, writer, model
        self.context = ""  # everything the request holds after its prompt
        self.said = ""
        self.sampled: list[int] = []  # every token the model sampled (one engine step each)
        self.first = Part("", "", 64, stop=first_stop)

    def run(self, parts: int = 40) -> str:
        part: Part | None = self.first
        while part is not None and parts:
            parts -= 1
            kept, text, reason, stop, last = [], "", None, None, None
            for _ in range(64 if part.free else part.max_tokens):  # (a free part: the answer's budget, its stops)
                token = self.model(part, self.context + "".join(self.tokenizer.decode([t]) for t in kept))
                assert part.allowed is None or token in part.allowed, f"token {token!r} outside the part's allowed tokens"
                self.sampled.append(token)
                last = token
                if token in part.stop:
                    reason, stop = "stop", token
                    break
                if token in self.writer.vocab.eos:
                    reason = "stop"
                    break
                piece = self.tokenizer.decode([token])
                text += piece
                kept.append(token)
            else:
                reason = "length"
                kept = kept[:-1]  # (the last sampled token is dropped: its text was returned)
            self.context += "".join(self.tokenizer.decode([t]) for t in kept)
            self.said += self.writer.took(text) if text else ""
            state = self.writer.state
            part = self.writer.ended(reason, stop, last)
            moved = self.writer.state != state and (state, self.writer.state) != ("copy", "string")  # (a copied value gone on as the model's own: the same value)
            if (reason == "stop" or moved) and hasattr(self.model, "advance"):
                self.model.advance()  # (the writer moved on: the rest of what the model meant there is not written)
            if part is not None:
                self.said += part.say
                if part.feed is None:
                    break
                self.context += part.feed
        return self.said


class Scripted:
    """A model that writes ``script``'s texts in turn, each as its tokens (an empty text: the end
    of the answer), one for each thing the writer asks of it (the speech, the name, each value);
    once the writer moves on, the rest of the text is not written (``advance``)."""

    def __init__(self, tokenizer: Any, script: list[str]) -> None:
        self.queue = [list(tokenizer.encode(text, add_special_tokens=False)) or [tokenizer.convert_tokens_to_ids("<|im_end|>")] for text in script]

    def __call__(self, part: Part, context: str) -> int:
        while self.queue and not self.queue[0]:
            self.queue.pop(0)
        return self.queue[0].pop(0)

    def advance(self) -> None:
        if self.queue:
            self.queue.pop(0)


class Meaning(Scripted):
    """A model that means ``script``'s texts but, where a part holds it to some tokens, writes the
    allowed token likeliest for what it means: the one that goes furthest along it (case aside),
    else a string's close, else the first allowed (as a real model's best allowed token would)."""

    def __init__(self, tokenizer: Any, script: list[str]) -> None:
        super().__init__(tokenizer, script)
        self.tokenizer = tokenizer
        self.meant = list(script)

    def __call__(self, part: Part, context: str) -> int:
        while self.queue and not self.queue[0]:
            self.queue.pop(0)
            self.meant.pop(0)
        token = self.queue[0][0]
        if part.allowed is None or token in part.allowed:
            self.queue[0].pop(0)
            self.meant[0] = self.meant[0][len(self.tokenizer.decode([token])) :]
            return int(token)
        rest = self.meant[0].lower()

        def along(t: int) -> int:
            text = self.tokenizer.decode([t]).lower()
            return len(text) if rest.startswith(text) else 0

        best = max(sorted(part.allowed), key=lambda t: (along(t), self.tokenizer.decode([t]).startswith('"')))
        self.meant[0] = self.meant[0][along(best) :]
        self.queue[0] = list(self.tokenizer.encode(self.meant[0], add_special_tokens=False)) if along(best) else self.queue[0]
        return best

    def advance(self) -> None:
        super().advance()
        if self.meant:
            self.meant.pop(0)


def steer(tokenizer: Any, words: Vocab, tools: list[Tool], script: list[str], parallel: bool = False, heard: str = "", meaning: bool = False) -> tuple[str, str]:
    writer = CallWriter(Calls(tools, parallel, heard), words, tokenizer)
    engine = Engine(tokenizer, writer, (Meaning if meaning else Scripted)(tokenizer, script), words.starts)
    return engine.run(), engine.context


def calls_in(text: str) -> tuple[str, list[tuple[str, Any]]]:
    parser = CallParser()
    events = parser.feed(text) + parser.finish()
    said = "".join(e.text for e in events if isinstance(e, Said))
    return said, [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, CallEnded)]


def test_a_call_is_written_in_the_templates_form_from_the_models_choices(tokenizer: Any, words: Vocab) -> None:
    # the model would go on with a fence and pretty JSON: only its name and value are its own here
    said, context = steer(tokenizer, words, [WEATHER, TABLE], ["Let me check.```", 'get_weather",\n', 'Paris"\n }'])
    assert said == 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' + CLOSE
    assert context == said[: -len('"}}\n' + CLOSE)]  # the engine holds the call as written (its end is never needed)
    assert calls_in(said) == ("Let me check.", [("get_weather", {"city": "Paris"})])


def test_a_name_is_taken_once_it_is_one_tools_and_no_others(tokenizer: Any, words: Vocab) -> None:
    time_zone = Tool("get_time_zone", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    time = Tool("get_time", "", time_zone.parameters)
    for tools, name, steps in (([WEATHER, time], "get_weather", 2), ([time, time_zone], "get_time", 3), ([time, time_zone], "get_time_zone", 3)):
        writer = CallWriter(Calls(tools, False), words, tokenizer)
        engine = Engine(tokenizer, writer, Scripted(tokenizer, ["```", name + '",', 'Paris"']), words.starts)
        assert calls_in(engine.run())[1] == [(name, {"city": "Paris"})]
        # the fence, the name's tokens (and its quote only where another name goes on from it), the value and its quote
        assert len(engine.sampled) == 1 + steps + 2, [tokenizer.decode([t]) for t in engine.sampled]


def test_an_integer_and_a_string_in_the_schemas_order(tokenizer: Any, words: Vocab) -> None:
    said, context = steer(tokenizer, words, [WEATHER, TABLE], ["<tool_call>", 'book_table"', "4,", '8 pm."}'])
    assert calls_in(said)[1] == [("book_table", {"people": 4, "time": "8 pm."})]
    assert context == OPEN + '\n{"name": "book_table", "arguments": {"people": 4, "time": "8 pm'


def test_a_number_the_model_does_not_write_is_null(tokenizer: Any, words: Vocab) -> None:
    said, _ = steer(tokenizer, words, [TABLE], ["{", 'book_table"', ",", 'noon"'])
    assert calls_in(said)[1] == [("book_table", {"people": None, "time": "noon"})]


def test_a_tool_not_offered_is_closed_empty(tokenizer: Any, words: Vocab) -> None:
    said, _ = steer(tokenizer, words, [WEATHER], ["```", 'divide", "arguments'])
    assert calls_in(said)[1] == [("divide", {})]  # (the ToolStream drops a call of a tool not offered)


def test_an_answer_without_a_call_is_the_models_own(tokenizer: Any, words: Vocab) -> None:
    said, context = steer(tokenizer, words, [WEATHER], ["Bees make honey.", ""])
    assert said == context == "Bees make honey."


def test_a_name_that_never_ends_is_not_a_call(tokenizer: Any, words: Vocab) -> None:
    said, _ = steer(tokenizer, words, [WEATHER], ["```", "weather_" * NAME_TOKENS])
    assert calls_in(said)[1] and calls_in(said)[1][0][1] == {}  # a name of no tool offered, closed empty


def test_an_enums_value_is_written_from_its_values_tokens(tokenizer: Any, words: Vocab) -> None:
    writer = CallWriter(Calls([FORECAST], False), words, tokenizer)
    assert writer.ended("stop", next(iter(words.starts)), None) is not None
    writer.took("forecast")
    location = writer.ended("stop", tokenizer.encode('",', add_special_tokens=False)[0], None)
    assert location is not None and location.say.endswith('"location": "') and location.allowed is None
    writer.took("Oslo")
    day = writer.ended("stop", tokenizer.encode('",', add_special_tokens=False)[0], None)
    assert day is not None and day.say == 'Oslo", "day": "' and day.allowed is not None
    for value in ("today", "tomorrow"):
        assert set(tokenizer.encode(value, add_special_tokens=False)) <= day.allowed
    assert not {tokenizer.encode(" Paris", add_special_tokens=False)[0]} & day.allowed


def test_an_optional_property_chosen_and_one_left(tokenizer: Any, words: Vocab) -> None:
    said, _ = steer(tokenizer, words, [FORECAST], ["```", 'forecast"', 'Oslo"', 'today"', ",", 'celsius"', "true"])
    assert calls_in(said)[1] == [("forecast", {"location": "Oslo", "day": "today", "celsius": True})]
    said, _ = steer(tokenizer, words, [FORECAST], ["```", 'forecast"', 'Oslo"', 'today"', "}"])
    assert calls_in(said)[1] == [("forecast", {"location": "Oslo", "day": "today"})]
    said, _ = steer(tokenizer, words, [FORECAST], ["```", 'forecast"', 'Oslo"', 'today"', ",", 'wind"'])
    assert calls_in(said)[1] == [("forecast", {"location": "Oslo", "day": "today"})]  # a key not in the schema: closed without it


def test_parallel_calls_then_the_end(tokenizer: Any, words: Vocab) -> None:
    said, context = steer(tokenizer, words, [WEATHER], ["```", 'get_weather"', 'Paris"', "<tool_call>", 'get_weather"', 'Rome"', ""], parallel=True)
    assert calls_in(said)[1] == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert context.count(OPEN) == 2 and context.endswith(CLOSE + "\n")


def test_a_schema_with_other_kinds_of_values_is_written_by_the_model(tokenizer: Any, words: Vocab) -> None:
    assert not steerable(LIST) and steerable(FORECAST) and steerable(Tool("ping", "", {}))
    said, _ = steer(tokenizer, words, [LIST], ["```", 'add_items"', '{"items": ["milk"]}}\n</tool_call>', ""])
    assert calls_in(said)[1] == [("add_items", {"items": ["milk"]})]


def test_a_capped_string_is_closed_and_its_last_token_given_again(tokenizer: Any, words: Vocab) -> None:
    said, context = steer(tokenizer, words, [WEATHER], ["```", 'get_weather"', " a" * STRING_TOKENS, ""], parallel=True)
    (name, arguments), = calls_in(said)[1]
    assert name == "get_weather" and set(arguments["city"]) == {"a", " "}
    assert context.endswith(arguments["city"] + '"}}\n' + CLOSE + "\n")  # the request holds the value as it was said


def test_random_schemas_and_choices_always_give_calls_that_parse(tokenizer: Any, words: Vocab) -> None:
    """Seeded: random tools (scalar properties, some required, enums), a model sampling random
    tokens within each part's rules (now and then one that ends it); every call made parses, holds
    every required key, no key outside the schema, and values of their kinds (or null)."""
    rng = random.Random(20261128)
    pool = [t for t in range(2000)] + sorted(words.starts)[:20] + sorted(words.quotes)[:200] + sorted(words.digits) + sorted(words.ends)
    kinds = ["string", "integer", "number", "boolean", "enum"]
    checked: Counter[str] = Counter()
    for trial in range(200):
        tools = []
        for n in range(rng.randint(1, 3)):
            props: dict[str, Any] = {}
            for k in range(rng.randint(0, 4)):
                kind = rng.choice(kinds)
                props[f"p{k}"] = {"type": "string", "enum": ["red", "green"]} if kind == "enum" else {"type": kind}
            required = [p for p in props if rng.random() < 0.6]
            tools.append(Tool(f"tool_{n}", "", {"type": "object", "properties": props, "required": required}))
        names = [t.name for t in tools]

        pending: list[int] = []  # a name being written

        def model(part: Part, context: str) -> int:
            if '"arguments"' in context[context.rfind('{"name": "') :]:
                pending.clear()  # (past the name: the writer took it whole before its quote)
            if pending:
                return pending.pop(0)
            if context.endswith('{"name": "') and rng.random() < 0.8:  # a tool's name, then its quote
                pending.extend(tokenizer.encode(rng.choice(names) + '",', add_special_tokens=False))
                return pending.pop(0)
            if part.allowed is not None:
                return rng.choice(sorted(part.allowed))
            if part.stop == words.starts and rng.random() < 0.3:  # the speech: a call begins
                return rng.choice(sorted(words.starts))
            return rng.choice(pool)

        heard = rng.choice(["", "Book a table at Luigi's for Anna, in New York tonight."])  # (values copied from it: steps held to spans)
        writer = CallWriter(Calls(tools, rng.random() < 0.5, heard), words, tokenizer)
        said = Engine(tokenizer, writer, model, words.starts).run(parts=60)
        parser = CallParser()
        for event in parser.feed(said) + parser.finish():
            if not isinstance(event, CallEnded) or event.name not in names:
                continue
            arguments = json.loads(event.arguments)  # parses
            checked["calls"] += 1
            checked["values"] += len(arguments)
            schema = next(t for t in tools if t.name == event.name).parameters
            assert set(schema["required"]) <= set(arguments) <= set(schema["properties"]), (trial, said)
            for key, value in arguments.items():
                kind = schema["properties"][key]["type"]
                ok = {"string": str, "integer": int, "number": (int, float), "boolean": bool}[kind]
                assert value is None or isinstance(value, ok) and (kind != "integer" or not isinstance(value, bool)), (trial, key, value, said)
    assert checked["calls"] >= 150 and checked["values"] >= 200, checked  # (the run made calls to check)


# ------------------------------------------------------------------ values copied from what was said

RECIPE = Tool("find_recipe", "", {"type": "object", "properties": {"ingredient": {"type": "string"}}, "required": ["ingredient"]})
FLIGHTS = Tool(
    "find_flights", "", {"type": "object", "properties": {"origin": {"type": "string"}, "destination": {"type": "string"}}, "required": ["origin", "destination"]}
)


def test_a_city_said_one_way_is_copied_as_said_where_the_model_would_spell_it_another(tokenizer: Any, words: Vocab) -> None:
    heard = "What is the weather forecast for Lisbon today?"
    said, context = steer(tokenizer, words, [WEATHER], ["```", 'get_weather"', 'Lisboa"'], heard=heard, meaning=True)
    assert calls_in(said)[1] == [("get_weather", {"city": "Lisbon"})]
    assert context.endswith('"city": "Lisbon')  # the engine was held to it: the model sees the city as said
    assert not ungrounded(json.dumps({"city": "Lisbon"}), WEATHER.parameters, heard)


def test_a_value_is_written_in_the_users_spelling_and_may_run_over_several_words(tokenizer: Any, words: Vocab) -> None:
    heard = "Find me flights from new york city to San Francisco, please."
    said, _ = steer(tokenizer, words, [FLIGHTS], ["```", 'find_flights"', 'New York"', 'san francisco"'], heard=heard, meaning=True)
    assert calls_in(said)[1] == [("find_flights", {"origin": "new york", "destination": "San Francisco"})]


def test_a_value_nobody_said_is_the_models_own_and_the_grounding_drops_it(tokenizer: Any, words: Vocab) -> None:
    heard = "How many days are in a week?"
    said, _ = steer(tokenizer, words, [RECIPE], ["```", 'find_recipe"', 'chicken"'], heard=heard, meaning=True)
    ((name, arguments),) = calls_in(said)[1]
    assert arguments == {"ingredient": "chicken"}  # (its first token began nothing said: written on as the model's)
    assert ungrounded(json.dumps(arguments), RECIPE.parameters, heard) == ["ingredient=chicken"]


def test_values_of_their_own_form_are_the_models(tokenizer: Any, words: Vocab) -> None:
    # a time is written as the model writes times, though "eight pm" was said
    said, _ = steer(tokenizer, words, [TABLE], ["<tool_call>", 'book_table"', "4,", '8 pm"}'], heard="A table for four at eight pm.", meaning=True)
    assert calls_in(said)[1] == [("book_table", {"people": 4, "time": "8 pm"})]


def test_spans_stay_within_a_clause_and_keep_the_newest_spelling() -> None:
    heard = Spans("I live in paris. No, I mean Paris, France; then Rome!")
    assert heard.spelled("paris") == "Paris" and heard.spelled("paris france") is None
    assert heard.spelled("i mean paris") == "I mean Paris" and heard.spelled("no i mean") is None and heard.spelled("rome") == "Rome"
    assert set(heard.after("fra")) == {"France"} and heard.after("") == []


def test_copied_values_are_always_spans_said_or_judged_by_the_grounding(tokenizer: Any, words: Vocab) -> None:
    """Seeded: random things said and a model writing random allowed tokens in a copied value (now
    and then a closing quote): every value is a span said (case aside), or its first token began
    nothing said and the grounding check drops it unless every word of it was said."""
    rng = random.Random(20261129)
    pool = "paris rome new york anna luigi's the market tomorrow chicken rice bob san jose garden kitchen".split()
    checked = copied = 0
    for trial in range(150):
        heard = " ".join(rng.choice(pool) for _ in range(rng.randint(1, 10))) + rng.choice([".", "?", ", and", ""]) + " " + rng.choice(pool)

        name = list(tokenizer.encode("get_weather", add_special_tokens=False))

        def model(part: Part, context: str) -> int:
            written = context[context.rfind('{"name": "') + len('{"name": "') :] if '{"name": "' in context else None
            if written is not None and '"' not in written:  # the tool's name, token by token
                done = [tokenizer.decode(name[:k]) for k in range(len(name) + 1)]
                return int(name[done.index(written)]) if written in done[:-1] else int(sorted(words.closing)[0])
            if part.allowed is not None:
                allowed = sorted(part.allowed)
                closing = [t for t in allowed if t in words.closing]
                return rng.choice(closing) if closing and rng.random() < 0.3 else rng.choice(allowed)
            if context.endswith('"city": "'):
                first = rng.choice(pool + ["zurich", "mad", "x"])
                return int(tokenizer.encode(first, add_special_tokens=False)[0])
            if part.stop == words.starts:
                return sorted(words.starts)[0]
            return rng.choice(sorted(words.closing))

        writer = CallWriter(Calls([WEATHER], False, heard), words, tokenizer)
        text = Engine(tokenizer, writer, model, words.starts).run(parts=60)
        calls = calls_in(text)[1]
        if not calls or calls[0][0] != "get_weather":
            continue
        city = calls[0][1]["city"]
        spans = Spans(heard).spans
        copied += city.lower() in spans
        if city.lower() not in spans:
            assert not Spans(heard).after(tokenizer.decode(tokenizer.encode(city, add_special_tokens=False)[:1]).lower()) or len(city) == 0, (heard, city)
            assert ungrounded(json.dumps({"city": city}), WEATHER.parameters, heard) or all(w in heard.lower() for w in city.lower().split()), (heard, city)
        checked += 1
    assert checked >= 100 and 30 <= copied <= checked - 10, (checked, copied)  # (both ways taken)
