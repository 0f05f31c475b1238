"""Function calling on the embedded CPU cascade: the real thinker (Qwen2.5's own tool format, parsed
as it streams), Whisper and Piper, through the official SDK with every event validated. The shared
``cpu_server`` serves every test here."""

from __future__ import annotations

import asyncio
import json
import re
import secrets

import pytest

from tests.pipelines.test_cpu_pipeline import RESPONSE_TIMEOUT, text_turn, transcribe, words
from tests.support.audio import utterance
from tests.support.client import audio_of, connect
from tests.support.server import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}}, "required": ["city"]},
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the current local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
THERMOSTAT = {
    "type": "function",
    "name": "set_thermostat",
    "description": "Set the thermostat.",
    "parameters": {
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": 10, "maximum": 30}, "room": {"type": "string", "enum": ["living_room", "bedroom", "kitchen"]}},
        "required": ["celsius", "room"],
    },
}
TABLE = {
    "type": "function",
    "name": "book_table",
    "description": "Book a table.",
    "parameters": {
        "type": "object",
        "properties": {"party_size": {"type": "integer", "minimum": 1}, "when": {"type": "string"}},
        "required": ["party_size", "when"],
    },
}
MESSAGE = {
    "type": "function",
    "name": "send_message",
    "description": "Send a text message to one of the user's contacts.",
    "parameters": {
        "type": "object",
        "properties": {"to": {"type": "string"}, "text": {"type": "string", "description": "The message, word for word"}},
        "required": ["to", "text"],
    },
}
LONG_MESSAGE = (
    "Send a message to Anna saying: I will be late for dinner tonight because the train from the city is delayed "
    "by almost an hour, so please start without me and keep a bowl of the soup warm for when I get home."
)
INSTRUCTIONS = "You are a helpful voice assistant. Use the tools when they help. Reply in one short sentence."


def user(text: str) -> dict:
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def calls_of(events: list) -> list:  # type: ignore[type-arg]
    return [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]


def streamed_arguments(events: list, item_id: str) -> str:  # type: ignore[type-arg]
    return "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta" and e.item_id == item_id)


async def setup(c, **session) -> None:  # type: ignore[no-untyped-def]
    await c.expect("session.created")
    await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS, "tools": [WEATHER, TIME], **session}})
    await c.expect("session.updated")


async def test_a_spoken_request_calls_the_tool_and_the_output_is_answered_aloud(cpu_server):
    before = cpu_server.stats()
    async with connect(cpu_server.ws_base) as c:
        await setup(c)
        await c.speak(utterance("What is the weather in Paris?", lead_ms=500, tail_ms=1200))
        first = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert first.status == "completed", first.status_details
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert call.name == "get_weather" and call.status == "completed" and call.call_id
        assert json.loads(call.arguments)["city"].lower() == "paris"
        # the arguments streamed as the thinker wrote them, and add up to the call's
        assert len(c.of("response.function_call_arguments.delta")) >= 2
        assert streamed_arguments(c.events, call.id) == call.arguments == c.of("response.function_call_arguments.done")[0].arguments
        # whatever was said before the call, the call itself was never said
        said = " ".join(e.transcript for e in c.of("response.output_audio_transcript.done"))
        assert "tool_call" not in said and "get_weather" not in said and "{" not in said

        start = len(c.events)
        await asyncio.sleep(0.3)  # the client runs the tool (a weather service's round trip)
        output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"city": "Paris", "sky": "snowing", "celsius": -3})}
        await c.send({"type": "conversation.item.create", "item": output})
        await c.send({"type": "response.create"})
        answer = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert answer.status == "completed", answer.status_details
        assert [o.type for o in answer.output] == ["message"]
        heard = transcribe(audio_of(c.events[start:]))
        assert words(heard) & {"snow", "snowing", "snowy", "minus", "three", "3"}, heard
    after = cpu_server.stats()
    assert after["tool_calls"] == before["tool_calls"] + 1 and after["tool_calls_off_schema"] == before["tool_calls_off_schema"]
    # the conversation through the call was prefilled while the client ran the tool
    # (CascadeSession._ahead_of_output), and the answer found it in the prefix cache
    assert after["prefills_ahead_of_output"] == before["prefills_ahead_of_output"] + 1
    assert answer.usage.input_token_details.cached_tokens >= 32, answer.usage


async def test_tool_choice_required_named_and_none(cpu_server):
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"])
        # required: a call even for words that need none
        await c.send(user("Hello there!"))
        await c.send({"type": "response.create", "response": {"tool_choice": "required"}})
        required = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert [o.type for o in required.output][-1:] == ["function_call"], required.output
        assert required.output[-1].name in ("get_weather", "get_time")
        # a named function: that one, whatever was asked
        await c.send(user("What is the weather in Rome?"))
        named = {"type": "function", "name": "get_time"}
        await c.send({"type": "response.create", "response": {"tool_choice": named, "conversation": "none"}})
        forced = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        (call,) = [o for o in forced.output if o.type == "function_call"]
        assert call.name == "get_time" and isinstance(json.loads(call.arguments), dict)
        # none: no call, a spoken (here: written) answer
        await c.send({"type": "response.create", "response": {"tool_choice": "none"}})
        plain = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert plain.status == "completed" and [o.type for o in plain.output] == ["message"]
        assert plain.output[0].content[0].text.strip()


async def test_parallel_calls_only_when_allowed(cpu_server):
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"], parallel_tool_calls=False)
        await c.send(user("What is the weather in Paris, and in London?"))
        await c.send({"type": "response.create", "response": {"tool_choice": "required"}})
        one = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert [o.type for o in one.output].count("function_call") == 1, one.output


async def test_a_call_the_model_makes_is_steered(cpu_server):
    """The model chooses the tool and the value, the server writes the JSON around them
    (pipelines/cascade/calls/steering.py): the call in the template's own compact form, from a handful of
    sampled tokens where the model alone writes 16-30 (its fence, its indentation, its keys); and
    with parallel calls allowed, the step that chooses the end instead of a second call."""
    before = cpu_server.stats()
    for parallel in (False, True):
        async with connect(cpu_server.ws_base) as c:
            await setup(c, output_modalities=["text"], parallel_tool_calls=parallel)
            await c.send(user("What is the weather in Paris?"))
            await c.send({"type": "response.create"})
            done = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
            assert done.status == "completed", done.status_details
            (call,) = [o for o in done.output if o.type == "function_call"]
            assert call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
            assert done.usage.output_tokens <= 10, done.usage
    after = cpu_server.stats()
    assert after["tool_calls_steered"] == before["tool_calls_steered"] + 2


async def test_cancel_while_a_call_is_written(cpu_server):
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"])
        await c.send(user("What is the weather in Paris?"))
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "get_weather"}}})
        added = await c.expect("response.output_item.added", timeout=RESPONSE_TIMEOUT)
        assert added.item.type == "function_call" and added.item.status == "in_progress"
        await c.send({"type": "response.cancel"})
        done = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert done.status == "cancelled"
        (call,) = done.output
        assert call.type == "function_call" and call.status == "incomplete"
        assert not c.of("response.function_call_arguments.done")
        # the session goes on: the cut-off call is not in the next prompt, the next answer comes
        await c.send({"type": "response.create", "response": {"tool_choice": "none"}})
        after = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert after.status == "completed" and after.output[0].content[0].text.strip()


async def test_barge_in_while_a_call_is_written(cpu_server):
    """The user speaks over a response that is writing its call: the call is cut (incomplete, never
    done) and the user's new turn is answered. The call is a long one (a message of some forty
    tokens, over a second of writing on two cores), and the user starts once its arguments have
    begun: a short call (``{"city": "Paris"}``, ~7 tokens) could be written whole before the turn
    detector hears the user, on a fast machine."""
    async with connect(cpu_server.ws_base) as c:
        await setup(c)
        await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER, MESSAGE]}})
        await c.expect("session.updated")
        await c.send(user(LONG_MESSAGE))
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "send_message"}}})
        added = await c.expect("response.output_item.added", timeout=RESPONSE_TIMEOUT)
        assert added.item.type == "function_call"
        await c.expect("response.function_call_arguments.delta", timeout=RESPONSE_TIMEOUT)
        await c.append(utterance("Hello, can you hear me?", lead_ms=0, tail_ms=1200))  # faster than real time: heard at once
        cut = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert cut.status == "cancelled" and cut.status_details.reason == "turn_detected"
        assert [(o.type, o.status) for o in cut.output] == [("function_call", "incomplete")]
        assert not c.of("response.function_call_arguments.done")
        assert c.of("input_audio_buffer.speech_started")
        after = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response  # the new turn's answer
        assert after.status == "completed" and after.output


async def test_bad_tools_are_refused_and_the_session_survives(cpu_server):
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"])
        bad = {**WEATHER, "parameters": {"type": "string"}}
        await c.send({"type": "session.update", "event_id": "evt_bad", "session": {"type": "realtime", "tools": [bad]}})
        error = (await c.expect("error")).error
        assert error.code == "invalid_function_parameters" and error.param == "session.tools[0].parameters" and error.event_id == "evt_bad"
        await c.send({"type": "response.create", "response": {"tool_choice": {"type": "function", "name": "book_flight"}}})
        error = (await c.expect("error")).error
        assert error.param == "response.tool_choice.name"
        await c.send(user("What is the weather in Oslo?"))
        await c.send({"type": "response.create", "response": {"tool_choice": "required"}})
        done = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert done.status == "completed" and done.output[-1].type == "function_call"


async def test_sessions_of_one_key_share_the_tools_prefix_and_two_keys_do_not(cpu_server):
    """The instructions and tools are prefilled when the session starts and when session.update
    brings them (``prepare``), in the key's prefix-cache namespace: a second session of one key
    finds them in vLLM's cache (its ``num_cached_tokens``), a session of another key finds none of
    them; either way the first answer finds them prefilled."""
    run = secrets.token_hex(4)  # keys no other test used: nothing of theirs is cached yet

    async def session(key: str) -> tuple[float, float, int, int]:
        before = await asyncio.to_thread(cpu_server.stats)

        async def prepared() -> bool:  # the start's (the defaults) and the update's (the tools)
            return (await asyncio.to_thread(cpu_server.stats))["prefix_prepares"] >= before["prefix_prepares"] + 2

        async with connect(cpu_server.ws_base, api_key=key) as c:
            await setup(c, output_modalities=["text"])
            assert await wait_until(prepared, 120), "the session's beginning was never prefilled"
            after = await asyncio.to_thread(cpu_server.stats)
            answer = (await text_turn(c, "Say hello.")).response
        assert answer.status == "completed", answer.status_details
        tokens = after["prefix_prepared_tokens"] - before["prefix_prepared_tokens"]
        cached = after["prefix_prepared_cached_tokens"] - before["prefix_prepared_cached_tokens"]
        return tokens, cached, answer.usage.input_tokens, answer.usage.input_token_details.cached_tokens

    first = await session(f"key-a-{run}")
    again = await session(f"key-a-{run}")
    other = await session(f"key-b-{run}")
    tools_prefix = first[0]
    assert tools_prefix > 200, (first, again, other)  # the defaults' few tokens, then two tools' definitions and the instructions
    assert first[1] == 0  # the key's first session computed them
    assert again[1] >= tools_prefix - 2 * 32  # all but each prefix's partial last block, from the first session
    assert other[1] == 0  # another key's session shares nothing
    for _, _, prompt, cached in (first, again, other):  # the first answer found the beginning prefilled
        assert cached >= prompt - 64 - 32 and cached > 200, (first, again, other)


async def answered_in_words(cpu_server, question: str, **session) -> str:  # type: ignore[no-untyped-def]
    """What a fresh session with ``session``'s tools answers to a typed ``question``: a completed
    response of one message and no call (no call's arguments streamed either)."""
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"], **session)
        done = (await text_turn(c, question)).response  # type: ignore[attr-defined]
        assert done.status == "completed", done.status_details
        assert [o.type for o in done.output] == ["message"], done.output
        assert not c.of("response.function_call_arguments.delta")
        return str(done.output[0].content[0].text)


DROPPED = ("tool_calls_ungrounded", "tool_calls_unknown", "tool_calls_misfit")  # the server's counts of calls it dropped


def assert_words_after_a_dropped_call(before: dict, after: dict) -> None:  # type: ignore[type-arg]
    """Between two ``stats()``: a dropped call was followed by an answer in words (and only then is
    one made)."""
    dropped = sum(after[k] - before[k] for k in DROPPED)
    assert after["answers_said_instead_of_calls"] - before["answers_said_instead_of_calls"] == min(dropped, 1), (before, after)


@pytest.mark.parametrize("question", ["What color is the sky on a clear day?", "How many legs does a spider have?", "I'm feeling great today."])
async def test_a_plain_question_with_tools_offered_gets_an_answer_and_no_call(cpu_server, question):
    """With tools offered, chit-chat and facts are answered in words. The thinker alone calls tools on
    them with values of its own (bench tools: the sky -> get_weather London; a spider -> a
    get_legs nobody offered): such a call never reaches the client, and the same prompt is then
    answered with calls banned, so the user hears an answer, not silence."""
    before = cpu_server.stats()
    said = await answered_in_words(cpu_server, question)
    assert said.strip() and "{" not in said and "get_" not in said and "function" not in said.lower(), said
    after = cpu_server.stats()
    assert_words_after_a_dropped_call(before, after)  # not a question back: none of these asks for the weather or the time
    assert after["answers_asking_back"] == before["answers_asking_back"]


RECIPE = {
    "type": "function",
    "name": "find_recipe",
    "description": "Find a recipe that uses an ingredient.",
    "parameters": {"type": "object", "properties": {"ingredient": {"type": "string"}}, "required": ["ingredient"]},
}


async def test_a_plain_question_makes_no_call_with_a_value_nobody_said(cpu_server):
    """A lowercase value nobody said ("How many days are in a week?" -> ``find_recipe`` chicken, as the
    thinker alone writes it) is never written into a call: the answer is words. (A word said that
    the model takes for a value is another matter: "How much is a dollar in euros?" ->
    ``find_recipe`` dollar; docs/tools.md.)"""
    said = await answered_in_words(cpu_server, "How many days are in a week?", tools=[RECIPE])
    assert said.strip() and "{" not in said and "recipe" not in said.lower(), said


FORECAST = {
    "type": "function",
    "name": "get_forecast",
    "description": "Get today's weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}}, "required": ["city"]},
}


async def test_a_word_said_that_is_no_such_thing_makes_no_call(cpu_server):
    """"What color are ripe bananas?" with a forecast tool: the thinker alone calls it for "bananas"
    (a word said, so grounding lets it through; bench tools' said set), but reads "Bananas" as less
    likely as a city than as any word: the call is dropped and the question answered in words."""
    before = cpu_server.stats()
    said = await answered_in_words(cpu_server, "What color are ripe bananas?", tools=[FORECAST])
    assert "banana" in said.lower() and "{" not in said and "forecast" not in said.lower(), said  # (words about bananas: "Bananas are red." is the 0.5B's own fact)
    after = cpu_server.stats()
    # the call the thinker wrote (it does on the Zen 3 of these runs: bench tools' said set) was read and
    # dropped as no city, not as a value nobody said; then the answer in words
    dropped = {k: after[k] - before[k] for k in DROPPED}
    assert dropped["tool_calls_misfit"] == sum(dropped.values()) <= 1, dropped
    assert after["answers_said_instead_of_calls"] - before["answers_said_instead_of_calls"] == dropped["tool_calls_misfit"]


CALL_PERSON = {
    "type": "function",
    "name": "call_person",
    "description": "Phone someone.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string", "description": "Who to call"}}, "required": ["name"]},
}


async def test_a_greeting_makes_no_call_to_someone_named_as_it(cpu_server):
    """"Good morning." with a tool that phones someone: the 1.5B calls it for "Good morning" (bench
    tools' said set), a call dropped unread (``grounding.unasked``: the user's words are the value
    alone and the agent asked nothing); the 0.5B, typed, answers in words or calls a tool nobody
    offered (dropped). Either way no call reaches the client and the greeting is answered."""
    before = cpu_server.stats()
    said = await answered_in_words(cpu_server, "Good morning.", tools=[CALL_PERSON])
    assert said.strip() and "{" not in said and "call_person" not in said, said
    after = cpu_server.stats()
    assert after["calls_second_choice"] == before["calls_second_choice"]
    assert_words_after_a_dropped_call(before, after)


async def test_a_name_alone_is_called_only_after_the_agent_asked_for_one(cpu_server):
    """"Katie." out of the blue, with a tool that phones someone: the thinker calls her (a name said,
    its capital read as a name's), but nothing was asked for: no call, words. The same "Katie."
    after the agent's "Who should I call?" answers the question: the call goes out, for her."""
    before = cpu_server.stats()
    said = await answered_in_words(cpu_server, "Katie.", tools=[CALL_PERSON])
    assert said.strip() and "{" not in said, said
    assert_words_after_a_dropped_call(before, cpu_server.stats())
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"], tools=[CALL_PERSON])
        await c.send(user("I need to phone someone."))
        asked = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure. Who should I call?"}]}
        await c.send({"type": "conversation.item.create", "item": asked})
        done = (await text_turn(c, "Katie.")).response  # type: ignore[attr-defined]
        assert done.status == "completed", done.status_details
        assert [(o.name, json.loads(o.arguments)) for o in done.output if o.type == "function_call"] == [("call_person", {"name": "Katie"})], done.output


WEATHER_FORECAST = {"city": "Lisbon", "conditions": "heavy hail", "temperature_c": 3, "wind": "strong", "advice": "stay indoors"}


async def test_a_city_named_the_users_way_reaches_the_call_and_the_answer_to_its_output_is_whole(cpu_server):
    """The thinker alone writes "Lisboa" for the Lisbon the user said (and the call was then dropped
    as nobody said it): the call holds the city as said. The answer to the output is whole
    sentences that say its key fact in its words (the answers' repetition penalty once made it
    "heavy rain")."""
    async with connect(cpu_server.ws_base) as c:
        await setup(c)
        first = (await text_turn(c, "What is the weather forecast for Lisbon today?")).response  # type: ignore[attr-defined]
        assert first.status == "completed", first.status_details
        (call,) = [o for o in first.output if o.type == "function_call"]
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Lisbon"}, call.arguments
        output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(WEATHER_FORECAST)}
        await c.send({"type": "conversation.item.create", "item": output})
        await c.send({"type": "response.create"})
        answer = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert answer.status == "completed", answer.status_details
        said = " ".join(e.transcript for e in c.of("response.output_audio_transcript.done")[-1:])
        assert re.search(r"[.!?]\s*$", said), said  # a whole sentence, not "... and there will be"
        assert "hail" in said.lower(), said


CALCULATOR = {
    "type": "function",
    "name": "calculate",
    "description": "Calculate the result of an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 12 * 7"}}, "required": ["expression"]},
}


@pytest.mark.parametrize("question, numbers", [("What's 100 divided by 4?", {"100", "4"}), ("What is 42 divided by 6?", {"42", "6"})])
async def test_a_request_for_the_second_tool_shown_gets_its_call(cpu_server, question, numbers):
    """The thinker writes a weather call for a division (the first tool it was shown, for a city
    nobody said: dropped); its second choice of tool, the calculator, is made, with the user's
    numbers (``CascadeProduction._second_choice``)."""
    before = cpu_server.stats()
    async with connect(cpu_server.ws_base) as c:
        await setup(c, output_modalities=["text"], tools=[WEATHER, TIME, CALCULATOR])
        done = (await text_turn(c, question)).response  # type: ignore[attr-defined]
        assert done.status == "completed", done.status_details
        (call,) = calls_of(c.events)
        assert call.name == "calculate" and set(re.findall(r"\d+", json.loads(call.arguments)["expression"])) == numbers, call.arguments
        assert streamed_arguments(c.events, call.id) == call.arguments
    after = cpu_server.stats()
    assert after["calls_second_choice"] - before["calls_second_choice"] == sum(after[k] - before[k] for k in DROPPED)


# (tool, request, what the call must hold); written free (calls.constrain: never), each of these forced
# calls came out as its first value alone ("21", "4"), not an object (docs/tools.md)
HELD = [
    (THERMOSTAT, "Set the bedroom to twenty one degrees.", {"celsius": 21, "room": "bedroom"}),
    (THERMOSTAT, "Make the living room warmer, 23 degrees.", {"celsius": 23, "room": "living_room"}),
    (TABLE, "Book for four tomorrow at 7.", {"party_size": 4}),
    (TABLE, "A table for a couple tonight at eight.", {"party_size": 2}),
]


async def held_call(ws_base: str, tool: dict, request: str, tool_choice: object) -> tuple[dict, object]:  # type: ignore[type-arg]
    """The call one response makes to ``request`` with ``tool`` offered; its arguments, checked
    against the tool's schema, and the call item."""
    import jsonschema

    async with connect(ws_base) as c:
        await c.expect("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": INSTRUCTIONS, "output_modalities": ["text"], "tools": [tool]}})
        await c.expect("session.updated")
        await c.send(user(request))
        await c.send({"type": "response.create", "response": {"tool_choice": tool_choice}})
        done = (await c.expect("response.done", timeout=RESPONSE_TIMEOUT)).response
        assert done.status == "completed", done.status_details
        (call,) = calls_of(c.events)
        assert call.name == tool["name"] and streamed_arguments(c.events, call.id) == call.arguments
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, tool["parameters"])
    return arguments, call


@pytest.mark.parametrize("tool, request_text, held", HELD, ids=[r for _, r, _ in HELD])
async def test_a_forced_calls_arguments_are_held_to_its_tools_schema(cpu_server, tool, request_text, held):
    """A call the client forces is written under vLLM's structured outputs from its first token, held
    to the tool's JSON schema (``thinker.calls.constrain``, "forced" by default): an object with every
    required value, each of its type and inside its enum and bounds. The thinker chooses the tool
    under ``required``, the client under a named ``tool_choice``."""
    before = cpu_server.stats()
    for choice in ({"type": "function", "name": tool["name"]}, "required"):
        arguments, _ = await held_call(cpu_server.ws_base, tool, request_text, choice)
        assert {k: arguments[k] for k in held} == held, (choice, arguments)
    after = cpu_server.stats()
    assert after["tool_calls_off_schema"] == before["tool_calls_off_schema"] and after["tool_schemas_refused"] == before["tool_schemas_refused"]
