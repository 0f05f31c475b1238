"""The tool bench (bench/tools.py): its sets and its scoring. Its run end to end is the CPU agent's
own tool test (tests/pipelines/test_cpu_tools.py drives the same server path)."""

from __future__ import annotations

from bench import tools


def test_the_sets_are_as_large_as_asked():
    assert len(tools.REQUESTS) >= 40 and len(tools.NO_TOOL) >= 20 and len(tools.TWO_STEP) >= 10
    named = {r.tool for r in tools.REQUESTS}
    assert named == {t["name"] for t in tools.TOOLS} and len(named) >= 5
    assert all(t["parameters"]["required"] for t in tools.TOOLS)
    assert all(r.tool is None for r in tools.NO_TOOL) and all(t.request.tool for t in tools.TWO_STEP)


def test_arguments_are_scored_by_schema_and_value():
    weather, table, sums, order = tools.REQUESTS[0], tools.REQUESTS[16], tools.REQUESTS[24], tools.REQUESTS[32]
    assert tools.arguments_right(weather, "get_weather", '{"city": "Paris, France"}') == (True, True)
    assert tools.arguments_right(weather, "get_weather", '{"city": "Lyon"}') == (True, False)
    assert tools.arguments_right(weather, "get_weather", '{"city": "Saint-Parisot"}') == (True, False)  # (a word that holds it, not it)
    assert tools.arguments_right(weather, "get_time", '{"city": "Paris"}') == (False, False)  # the wrong tool
    assert tools.arguments_right(weather, "get_weather", '{"town": "Paris"}') == (False, False)  # its required city missing
    assert tools.arguments_right(table, "book_table", '{"people": 2, "time": "8 pm"}') == (True, True)
    assert tools.arguments_right(table, "book_table", '{"people": "two", "time": "8 pm"}') == (False, False)  # not an integer
    assert tools.arguments_right(sums, "calculate", '{"expression": "12 * 7"}') == (True, True)
    assert tools.arguments_right(sums, "calculate", '{"expression": "12 + 7"}') == (True, False)
    assert tools.arguments_right(order, "lookup_order", '{"order_number": "4512"}') == (True, True)
    assert tools.arguments_right(order, "lookup_order", '{"order_number": "4521"}') == (True, False)
    assert tools.evaluate("(100 - 20) / 4") == 20 and tools.evaluate("import os") is None


def test_the_answer_key_is_heard_in_words_or_digits():
    assert tools.heard_key("31", "It is thirty one degrees.") is False  # (Whisper writes numbers as digits)
    assert tools.heard_key("31", "It is 31 degrees in Madrid.")
    assert tools.heard_key("9|nine", "It's nine fifteen in Tokyo.")
    assert not tools.heard_key("snow|snowing", "It is sunny.")
    assert tools.heard_key("snow|snowing", "There is an expected snowfall in Denver.")  # a word it begins
    assert not tools.heard_key("5|five", "Set for 50 minutes.") and not tools.heard_key("cloud", "It is clear.")


def test_the_heldout_set_is_apart_and_complete():
    """Other tools, other requests: no name, request or no-tool request shared with the tuned set."""
    held = tools.TOOL_SETS["heldout"]
    names = {t["name"] for t in held.tools}
    assert not names & {t["name"] for t in tools.TOOLS} and {r.tool for r in held.requests} == names
    assert not {r.text for r in held.requests + held.no_tool} & {r.text for r in tools.REQUESTS + tools.NO_TOOL}
    assert all(t["parameters"]["required"] for t in held.tools) and all(t.request in held.requests for t in held.two_step)
    forecast, money = held.requests[0], held.requests[4]
    assert tools.arguments_right(forecast, "forecast", '{"location": "Denver", "day": "tomorrow"}', held.schemas) == (True, True)
    assert tools.arguments_right(forecast, "forecast", '{"location": "Denver", "day": "monday"}', held.schemas) == (False, False)  # not in its enum
    assert tools.arguments_right(money, "convert_currency", '{"amount": 50, "from_currency": "USD", "to_currency": "EUR"}', held.schemas) == (True, True)


def test_whose_miss_the_ears_heard_the_values_or_not():
    order, sums, table = tools.REQUESTS[32], tools.REQUESTS[25], tools.REQUESTS[16]
    assert tools.heard_right(order, "Where is my order number 4512?") is True
    assert tools.heard_right(order, "Where is my order number 4 5 1 2?") is True
    assert tools.heard_right(order, "Where is my order number 451?") is False  # (Whisper tiny.en, as heard)
    assert tools.heard_right(sums, "Calculate 15 plus 27.") is True
    assert tools.heard_right(sums, "Calculate fifteen plus twenty-seven.") is True
    assert tools.heard_right(sums, "Calculate fifty plus 27.") is False
    assert tools.heard_right(table, "Book a table for two people at 8pm.") is True
    assert tools.heard_right(table, "Book a table for two people at 18pm.") is False
    assert tools.heard_right(tools.HELDOUT_REQUESTS[4], "How much is $50 in euros?") is True
    assert tools.heard_right(order, None) is None  # no transcript came
    rows = [
        {"set": "requests", "right": False, "ears_right": False, "calls": [("lookup_order", "{}")], "tool": "lookup_order", "schema_valid": True, "call_ms": 1, "status": "completed"},
        {"set": "requests", "right": False, "ears_right": True, "calls": [], "tool": "get_weather", "schema_valid": False, "call_ms": None, "status": "completed"},
        {"set": "requests", "right": True, "ears_right": True, "calls": [("get_weather", "{}")], "tool": "get_weather", "schema_valid": True, "call_ms": 2, "status": "completed"},
        {"set": "no_tool", "calls": [], "said": " ", "status": "completed"},
        {"set": "no_tool", "calls": [], "said": "These tools can help users query the weather.", "status": "completed"},
    ]  # fmt: skip
    s = tools.summarize(rows)
    assert (s["wrong_after_misheard"], s["wrong_after_heard_right"], s["heard_right"], s["right_when_heard_right"]) == (1, 1, 0.667, 0.5)
    assert s["empty_answers"] == 1 and s["answers_about_tools"] == 1 and s["false_calls"] == 0


def test_the_said_set_asks_for_values_in_the_users_words_and_its_answers_and_copies_are_scored():
    said = tools.TOOL_SETS["said"]
    assert len(said.requests) == 10 and {r.tool for r in said.requests} == {t["name"] for t in said.tools}
    lisbon = said.requests[0]
    assert tools.arguments_right(lisbon, "get_forecast", '{"city": "Lisbon"}', said.schemas) == (True, True)
    assert tools.arguments_right(lisbon, "get_forecast", '{"city": "Lisboa"}', said.schemas) == (True, False)
    assert tools.copied([("get_forecast", '{"city": "Lisbon"}')], "What's the forecast for Lisbon?") is True
    assert tools.copied([("get_forecast", '{"city": "Lisboa"}')], "What's the forecast for Lisbon?") is False
    assert tools.copied([("book_table", '{"people": 2, "time": "8 pm"}')], "A table for two at eight.") is None  # (no such value)
    assert tools.copied([], "Hello") is None and tools.copied([("f", '{"a": "b"}')], None) is None
    assert tools.finished("The forecast is heavy hail.") and tools.finished('He said "stop!"')
    assert not tools.finished("The temperature will be 3 degrees Celsius and there will be") and not tools.finished("")


def test_an_answer_uses_the_output_by_its_words_apart_from_how_it_was_heard():
    """The thinker wrote "foggy" and the bench's ears heard the voice say "body": the answer used
    the output (its words) though it was not heard right; an exchange without a call is not counted."""
    def row(calls: list[list[str]], used: bool | None, right: bool) -> dict[str, object]:
        return {"set": "two_step", "calls": calls, "answer_right": right, "answer_uses_output": used, "status": "completed", "call_ms": None, "answer_ms": None}

    call = [["get_forecast", '{"city": "Cologne"}']]
    s = tools.summarize([row(call, True, False), row(call, False, False), row([], None, False)])
    assert s["answers_use_output"] == 0.5 and s["right_final_answers"] == 0.0 and s["two_step"] == 3
