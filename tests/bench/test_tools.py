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
