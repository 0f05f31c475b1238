"""The tool-call parser (pipelines/cascade/tools.py) on the forms the thinker writes, streamed in every piece
size, and the history with calls rendered by the default thinker's own chat template."""

from __future__ import annotations

import json

import pytest

from pipelines import models
from pipelines.base import Tool
from pipelines.cascade.thinker import ThinkerOptions, Turn, VllmThinker
from pipelines.cascade.tools import ArgumentsDelta, CallEnded, CallParser, CallStarted, Said, forced_start, schema_errors, tool_specs

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

    thinker = VllmThinker(ThinkerOptions())
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
