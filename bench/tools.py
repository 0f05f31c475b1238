"""Function calling of a voice agent: does it call the right tool, with the right arguments, only
when it should, and say the tool's answer?

Spoken requests (espeak-ng, as bench/answers.py makes them; ``--voice piper``: Piper's joe, a
voice Whisper hears more as it hears people) go to the real server over the
official openai SDK, one fresh session per request, with five tools offered (weather, time in a
city, a table booking, a calculator, an order lookup; every one with required parameters), under
server VAD and the config's own instructions. Three sets:

    requests    40 requests that need a tool: right when the first call names the expected tool and
                its arguments fit the tool's JSON schema and hold the expected values
    no tool     20 requests that need none (facts, greetings): a call there is a false call
    two-step    10 exchanges: the call, the tool's output sent back (function_call_output +
                response.create), and the spoken answer, right when Whisper base hears the
                output's key word in the answer *audio*

Times, from the end of the user's speech: to the call (its response.function_call_arguments.done)
and, in the two-step exchanges, to the first audio of the spoken answer (the tool answered at once).

Whose miss: each exchange records what the ears heard (the server's transcript of the request, the
words the thinker was given), and a wrong call after a request misheard (a value it needs not in the
transcript) is counted apart from a wrong call after a request heard right.

--tool-set heldout: five other tools (other names, schemas with enums, numbers and several
arguments, other phrasing) with their own requests, never used to tune the prompts. --tool-set said:
two tools whose values are names as users say them (cities a model writes its own way, Lisbon /
Lisboa, and people's names), 10 requests, 5 plain questions, 3 two-step. Every set also reports
``answers_finished`` (each answer to a tool's output ends a sentence), ``answers_use_output`` (of
the two-step answers after a call, those whose words, as the server wrote them, hold the output's
key word: the thinker's part of a right answer, without the talker's voice and Whisper's reading of
it) and ``values_copied`` (a call's letter-only string values are words the ears heard). --keys: every
session with one API key (default: they share the tools' prefix in the cache, as one application's
sessions do) or each with a key of its own (every session's tools prefilled cold).

--mcp: the same tools served by an MCP server (loopback, in this process: the same names,
descriptions and JSON schemas), offered as one ``type: "mcp"`` tool (``require_approval: never``),
so the server runs each call and the agent answers from its output in the same response. The same
scoring of the calls; times: to the call (``response.mcp_call_arguments.done``), the tool's own time
as the client sees it (``response.mcp_call.in_progress`` -> ``.completed``), and the spoken answer's
first audio after it. ``answer_after_call_ms``: answer - (call + the tool's time), in both modes
(a function's tool time is nil: the client answers at once, so there it is the client's round trip).
--tool-ms N: the MCP tool answers after N ms, as one that calls out to a service does (0: at once).

--keywords: each config run a second time on the same server (reported as ``NAME+keywords``), its
sessions' ears told ``KEYWORDS`` (``audio.input.transcription.keywords``: a contact list of 30 names
and 30 towns, the sets' people and places among them), as a deployment that phones people would.

--prefill N: the thinker alone, in this process: a fresh session's first token with the tools cold
and with them prepared (prefilled first, as a session does when session.update brings them), N
requests' prompts.

    python -m bench.tools [--configs qwen2.5-coder-0.5b-w8 ...] [--limit N] [--tool-set heldout] [--keys each] [--mcp]
    python -m bench.tools --prefill 12

Results go to bench/results/tools-*.json with every exchange.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import secrets
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.audio import espeak, speech_bounds_ms
from bench.common import free_port, machine, save, server_process, vllm_serve
from bench.metrics import audible_at, dist
from bench.said import NUMBERS, normalise
from dsp.resample import resample
from realtime_omni import config as config_file

RATE = 24000
TURN_TIMEOUT_S = 60.0


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": description, "parameters": {"type": "object", "properties": properties, "required": required}}


TOOLS = [
    _fn("get_weather", "Get the current weather in a city.", {"city": {"type": "string", "description": "The city, e.g. Paris"}}, ["city"]),
    _fn("get_time", "Get the current local time in a city.", {"city": {"type": "string", "description": "The city, e.g. Tokyo"}}, ["city"]),
    _fn(
        "book_table",
        "Book a table at a restaurant.",
        {"people": {"type": "integer", "description": "How many people"}, "time": {"type": "string", "description": "When, e.g. 8 pm"}},
        ["people", "time"],
    ),
    _fn("calculate", "Calculate the result of an arithmetic expression.", {"expression": {"type": "string", "description": "e.g. 12 * 7"}}, ["expression"]),
    _fn("lookup_order", "Look up the status of an order by its number.", {"order_number": {"type": "string", "description": "The order number"}}, ["order_number"]),
]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}


@dataclass(frozen=True)
class Request:
    text: str
    tool: str | None  # the tool it needs (None: none)
    args: dict[str, str] = field(default_factory=dict)  # argument -> what its value must hold ("a|b": either)


R = Request
REQUESTS: list[Request] = [
    R("What is the weather in Paris?", "get_weather", {"city": "paris"}),
    R("What's the weather like in London today?", "get_weather", {"city": "london"}),
    R("Is it raining in Berlin right now?", "get_weather", {"city": "berlin"}),
    R("How warm is it in Madrid?", "get_weather", {"city": "madrid"}),
    R("Tell me the weather in Tokyo.", "get_weather", {"city": "tokyo"}),
    R("What's the forecast for Rome?", "get_weather", {"city": "rome"}),
    R("Is it sunny in Sydney?", "get_weather", {"city": "sydney"}),
    R("How cold is it in Oslo?", "get_weather", {"city": "oslo"}),
    R("What time is it in Tokyo?", "get_time", {"city": "tokyo"}),
    R("What's the time in New York?", "get_time", {"city": "new york"}),
    R("Tell me the current time in London.", "get_time", {"city": "london"}),
    R("What time is it in Sydney right now?", "get_time", {"city": "sydney"}),
    R("What is the local time in Paris?", "get_time", {"city": "paris"}),
    R("Do you know what time it is in Dubai?", "get_time", {"city": "dubai"}),
    R("What's the time in Chicago?", "get_time", {"city": "chicago"}),
    R("What time is it now in Berlin?", "get_time", {"city": "berlin"}),
    R("Book a table for two people at eight pm.", "book_table", {"people": "2", "time": "8"}),
    R("Please book a table for four at seven tonight.", "book_table", {"people": "4", "time": "7"}),
    R("I'd like a table for three people at six pm.", "book_table", {"people": "3", "time": "6"}),
    R("Can you reserve a table for five at nine pm?", "book_table", {"people": "5", "time": "9"}),
    R("Book a table for two at seven thirty.", "book_table", {"people": "2", "time": "7"}),
    R("Reserve a table for six people at eight.", "book_table", {"people": "6", "time": "8"}),
    R("Get me a table for four people at noon.", "book_table", {"people": "4", "time": "noon|12"}),
    R("We need a table for two at six thirty.", "book_table", {"people": "2", "time": "6"}),
    R("What is twelve times seven?", "calculate", {"=": "84"}),
    R("Calculate fifteen plus twenty seven.", "calculate", {"=": "42"}),
    R("What's one hundred divided by four?", "calculate", {"=": "25"}),
    R("Can you work out nine times nine?", "calculate", {"=": "81"}),
    R("What is three hundred minus one hundred and twenty?", "calculate", {"=": "180"}),
    R("Calculate eighteen times three.", "calculate", {"=": "54"}),
    R("What is forty two divided by six?", "calculate", {"=": "7"}),
    R("Add sixty five and thirty five.", "calculate", {"=": "100"}),
    R("Where is my order number four five one two?", "lookup_order", {"order_number": "4512"}),
    R("Can you check order one two three four?", "lookup_order", {"order_number": "1234"}),
    R("What's the status of order nine eight seven?", "lookup_order", {"order_number": "987"}),
    R("Look up my order, number five five five.", "lookup_order", {"order_number": "555"}),
    R("Has order two zero two four shipped?", "lookup_order", {"order_number": "2024"}),
    R("Track order number seven seven one.", "lookup_order", {"order_number": "771"}),
    R("Check the status of order three one four.", "lookup_order", {"order_number": "314"}),
    R("Where is order eight six two?", "lookup_order", {"order_number": "862"}),
]
NO_TOOL: list[Request] = [
    R(text, None)
    for text in (
        "What is the capital of Japan?",
        "Who wrote Romeo and Juliet?",
        "What color is the sky on a clear day?",
        "How many legs does a spider have?",
        "What do bees make?",
        "Hello!",
        "Thank you very much.",
        "Good morning!",
        "How are you today?",
        "Goodbye!",
        "Tell me a joke.",
        "What is the largest planet in our solar system?",
        "Which planet is known as the red planet?",
        "What language do people speak in Brazil?",
        "What animal says moo?",
        "Nice to meet you.",
        "What is frozen water called?",
        "Can a dog fly?",
        "What is the opposite of hot?",
        "How do I boil an egg?",
    )
]


@dataclass(frozen=True)
class TwoStep:
    request: Request
    output: dict[str, Any]  # what the tool answers
    key: str  # a word the spoken answer must hold ("a|b": either)


TWO_STEP: list[TwoStep] = [
    TwoStep(R("What is the weather in Paris?", "get_weather", {"city": "paris"}), {"city": "Paris", "sky": "snowing", "celsius": -3}, "snow|snowing|snowy"),
    TwoStep(R("How warm is it in Madrid?", "get_weather", {"city": "madrid"}), {"city": "Madrid", "celsius": 31, "sky": "sunny"}, "31"),
    TwoStep(R("Is it raining in London?", "get_weather", {"city": "london"}), {"city": "London", "sky": "heavy rain", "celsius": 12}, "rain|raining"),
    TwoStep(R("What time is it in Tokyo?", "get_time", {"city": "tokyo"}), {"city": "Tokyo", "time": "9:15 pm"}, "9|nine|915"),
    TwoStep(R("What's the time in New York?", "get_time", {"city": "new york"}), {"city": "New York", "time": "7:40 am"}, "7|seven|740"),
    TwoStep(R("Book a table for two people at eight pm.", "book_table", {"people": "2", "time": "8"}), {"booked": True, "table": 14}, "14|booked|book|reserved"),
    TwoStep(R("What is twelve times seven?", "calculate", {"=": "84"}), {"result": 84}, "84"),
    TwoStep(R("Add sixty five and thirty five.", "calculate", {"=": "100"}), {"result": 100}, "100"),
    TwoStep(R("Where is my order number four five one two?", "lookup_order", {"order_number": "4512"}), {"order": "4512", "status": "shipped"}, "shipped|ship"),
    TwoStep(R("Can you check order one two three four?", "lookup_order", {"order_number": "1234"}), {"order": "1234", "status": "delivered"}, "delivered"),
]


# A held-out set: other names, schemas (enums, numbers, several arguments) and phrasing. Never used to
# tune the prompts: its figures say whether what was tuned on the set above generalises.
HELDOUT_TOOLS = [
    _fn(
        "forecast",
        "Weather forecast for a place on a given day.",
        {"location": {"type": "string"}, "day": {"type": "string", "enum": ["today", "tomorrow"]}},
        ["location", "day"],
    ),
    _fn(
        "convert_currency",
        "Convert an amount of money from one currency to another.",
        {"amount": {"type": "number"}, "from_currency": {"type": "string", "description": "ISO code"}, "to_currency": {"type": "string", "description": "ISO code"}},
        ["amount", "from_currency", "to_currency"],
    ),
    _fn("set_timer", "Start a countdown timer.", {"minutes": {"type": "integer", "minimum": 1}}, ["minutes"]),
    _fn("find_flights", "Search flights between two cities.", {"origin": {"type": "string"}, "destination": {"type": "string"}}, ["origin", "destination"]),
    _fn("call_contact", "Phone someone from the user's contacts.", {"name": {"type": "string", "description": "Who to call"}}, ["name"]),
]
HELDOUT_REQUESTS: list[Request] = [
    R("Will it snow in Denver tomorrow?", "forecast", {"location": "denver", "day": "tomorrow"}),
    R("What's the forecast for Lisbon today?", "forecast", {"location": "lisbon", "day": "today"}),
    R("Is it going to be windy in Chicago tomorrow?", "forecast", {"location": "chicago", "day": "tomorrow"}),
    R("Should I take an umbrella in Dublin today?", "forecast", {"location": "dublin", "day": "today"}),
    R("How much is fifty dollars in euros?", "convert_currency", {"amount": "50", "from_currency": "usd|dollar", "to_currency": "eur"}),
    R("Convert twenty pounds to dollars.", "convert_currency", {"amount": "20", "from_currency": "gbp|pound", "to_currency": "usd|dollar"}),
    R("What are one hundred euros in yen?", "convert_currency", {"amount": "100", "from_currency": "eur", "to_currency": "jpy|yen"}),
    R("Change ten dollars into pounds.", "convert_currency", {"amount": "10", "from_currency": "usd|dollar", "to_currency": "gbp|pound"}),
    R("Set a timer for five minutes.", "set_timer", {"minutes": "5"}),
    R("Start a ten minute timer, please.", "set_timer", {"minutes": "10"}),
    R("Time three minutes for my eggs.", "set_timer", {"minutes": "3"}),
    R("Can you count down twenty minutes?", "set_timer", {"minutes": "20"}),
    R("Find flights from Boston to Miami.", "find_flights", {"origin": "boston", "destination": "miami"}),
    R("Are there flights from London to Rome?", "find_flights", {"origin": "london", "destination": "rome"}),
    R("I need to fly from Seattle to Denver.", "find_flights", {"origin": "seattle", "destination": "denver"}),
    R("Search for a flight from Paris to Berlin.", "find_flights", {"origin": "paris", "destination": "berlin"}),
    R("Call my mother.", "call_contact", {"name": "mother|mom|mum"}),
    R("Please phone Anna.", "call_contact", {"name": "anna"}),
    R("Can you ring David for me?", "call_contact", {"name": "david"}),
    R("Give Sarah a call.", "call_contact", {"name": "sarah"}),
]
HELDOUT_NO_TOOL: list[Request] = [
    R(text, None)
    for text in (
        "What is the tallest mountain in the world?",
        "How many days are in a week?",
        "What sound does a cat make?",
        "Good evening!",
        "What's your name?",
        "Who painted the Mona Lisa?",
        "I'm feeling great today.",
        "What is two plus two?",
        "What fruit is yellow and curved?",
        "See you later!",
    )
]
HELDOUT_TWO_STEP: list[TwoStep] = [
    TwoStep(HELDOUT_REQUESTS[0], {"location": "Denver", "day": "tomorrow", "snow": True, "celsius": -5}, "snow|snowing"),
    TwoStep(HELDOUT_REQUESTS[4], {"amount": 50, "from": "USD", "to": "EUR", "result": 46}, "46"),
    TwoStep(HELDOUT_REQUESTS[8], {"timer": "started", "minutes": 5}, "5|five|started|timer"),
    TwoStep(HELDOUT_REQUESTS[12], {"flights": 3, "cheapest_dollars": 129}, "129|3|three"),
    TwoStep(HELDOUT_REQUESTS[17], {"calling": "Anna", "status": "ringing"}, "anna|ringing|calling"),
]


# Values in the user's words (issue 50): cities a model tends to write its own way (Lisboa, München,
# Köln, Firenze, Praha) and people's names it tends to respell (Jon -> John). Right: the call's value
# is the one expected; ``copied`` (every set): each string value of the call is among the words the
# ears heard (the user's own, as the server was given them).
SAID_TOOLS = [
    _fn("get_forecast", "Get today's weather forecast for a city.", {"city": {"type": "string", "description": "The city"}}, ["city"]),
    _fn("call_person", "Phone someone.", {"name": {"type": "string", "description": "Who to call"}}, ["name"]),
]
SAID_REQUESTS: list[Request] = [
    R("What's the forecast for Lisbon?", "get_forecast", {"city": "lisbon"}),
    R("Will it rain in Munich today?", "get_forecast", {"city": "munich"}),
    R("How cold is it in Cologne?", "get_forecast", {"city": "cologne"}),
    R("What's the weather like in Florence?", "get_forecast", {"city": "florence"}),
    R("Is it sunny in Prague?", "get_forecast", {"city": "prague"}),
    R("Please call Jon.", "call_person", {"name": "jon"}),
    R("Phone Katie for me.", "call_person", {"name": "katie"}),
    R("Can you ring Marco?", "call_person", {"name": "marco"}),
    R("Call Grandma.", "call_person", {"name": "grandma"}),
    R("Give Peter a call.", "call_person", {"name": "peter"}),
]
SAID_NO_TOOL: list[Request] = [
    R(text, None) for text in ("How many days are in a week?", "What is the capital of France?", "Good morning!", "What color are ripe bananas?", "How much is a dollar in euros?")
]
SAID_TWO_STEP: list[TwoStep] = [
    TwoStep(SAID_REQUESTS[0], {"city": "Lisbon", "conditions": "heavy hail", "temperature_c": 3, "wind": "strong", "advice": "stay indoors"}, "hail"),
    TwoStep(SAID_REQUESTS[2], {"city": "Cologne", "sky": "foggy", "celsius": -2}, "fog|foggy"),
    TwoStep(SAID_REQUESTS[5], {"calling": "Jon", "status": "no answer", "voicemail": True}, "voicemail|answer|message"),
]


# --keywords: what a deployment that phones people and serves towns would tell the ears to expect
# (``audio.input.transcription.keywords``): a contact list of 30 first names and 30 towns, holding
# the people and places the sets' requests name and as many that no request says.
KEYWORD_NAMES = "Jon Katie Marco Peter Anna David Sarah Grandma Tom Lucy Maria Ahmed Priya Chen Olga Liam Emma Noah Sofia Lucas Mia Ethan Zoe Omar Hannah Ben Chloe Max Ella Leo".split()
KEYWORD_PLACES = (
    "Lisbon Munich Cologne Florence Prague Denver Boston Miami Seattle Paris Berlin London Rome Tokyo Madrid Vienna Oslo Dublin Chicago Austin "
    "Zurich Milan Athens Warsaw Budapest Toronto Sydney Cairo Mumbai Seoul"
).split()
KEYWORDS = KEYWORD_NAMES + KEYWORD_PLACES


@dataclass(frozen=True)
class ToolSet:
    tools: list[dict[str, Any]]
    requests: list[Request]
    no_tool: list[Request]
    two_step: list[TwoStep]

    @property
    def schemas(self) -> dict[str, Any]:
        return {t["name"]: t["parameters"] for t in self.tools}


TOOL_SETS = {
    "default": ToolSet(TOOLS, REQUESTS, NO_TOOL, TWO_STEP),  # the set the prompts were tuned on
    "heldout": ToolSet(HELDOUT_TOOLS, HELDOUT_REQUESTS, HELDOUT_NO_TOOL, HELDOUT_TWO_STEP),
    "said": ToolSet(SAID_TOOLS, SAID_REQUESTS, SAID_NO_TOOL, SAID_TWO_STEP),  # values in the user's words (issue 50)
}


def copied(calls: list[tuple[str, str]], heard: str | None) -> bool | None:
    """Whether every letter-only string value of the first call is among the words heard (case
    aside); None without a call, a transcript or such a value."""
    if not calls or heard is None:
        return None
    try:
        arguments = json.loads(calls[0][1])
    except ValueError:
        return False
    values = [v for v in arguments.values() if isinstance(v, str) and v.strip() and not re.search(r"\d", v)] if isinstance(arguments, dict) else []
    if not values:
        return None
    words = set(normalise(heard).split())
    return all(set(normalise(v).split()) <= words for v in values)


def finished(said: str) -> bool:
    """Whether what the agent said last ends a sentence (not "... and there will be")."""
    return bool(re.search(r"[.!?][\"')\]]*\s*$", said.strip()))


# ------------------------------------------------------------------------------------- scoring


def evaluate(expression: str) -> float | None:
    """The value of a plain arithmetic expression (digits or number words, + - * / and their words,
    parentheses), else None."""
    text = f" {expression.lower()} "
    for word in sorted(NUMBERS, key=len, reverse=True):
        text = re.sub(rf"\b{word}\b", NUMBERS[word], text)
    for word, op in (("times", "*"), ("x", "*"), ("multiplied by", "*"), ("divided by", "/"), ("over", "/"), ("plus", "+"), ("minus", "-")):
        text = re.sub(rf"\b{word}\b", op, text)
    expr = "".join(text.split())
    if not expr or not re.fullmatch(r"[0-9.+\-*/()]+", expr):
        return None
    try:
        return float(eval(expr, {"__builtins__": {}}, {}))  # only digits and operators reach here
    except (SyntaxError, ZeroDivisionError, TypeError, ValueError):
        return None


def arguments_right(request: Request, name: str, arguments: str, schemas: dict[str, Any] = SCHEMAS) -> tuple[bool, bool]:
    """(schema-valid, right values) of a call's arguments for ``request``."""
    import jsonschema

    if name != request.tool:
        return False, False
    try:
        value = json.loads(arguments)
        jsonschema.validate(value, schemas[name])
    except (ValueError, jsonschema.ValidationError):
        return False, False
    for key, want in request.args.items():
        if key == "=":  # the calculator: the expression's value
            got = evaluate(str(value.get("expression", "")))
            if got is None or abs(got - float(want)) > 1e-6:
                return True, False
            continue
        have = normalise(str(value.get(key, "")))
        if key == "order_number":  # (its digits anywhere: "order 12 34")
            if not any(normalise(alt) in have.replace(" ", "") for alt in want.split("|")):
                return True, False
        elif not any(re.search(rf"\b{re.escape(normalise(alt))}(?:e?s)?\b", have) for alt in want.split("|")):  # (a word, or its plural: "dollars" for "dollar", not "Hannah" for "Anna")
            return True, False
    return True, True


_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}


def _numbers(text: str) -> list[int]:
    """The numbers in ``text``, written in digits or words ("one hundred and twenty" is 120)."""
    out: list[int] = []
    value: int | None = None
    last = ""  # what the last word added: "tens", "hundred", "n" (a unit or digits)

    def flush() -> None:
        nonlocal value, last
        if value is not None:
            out.append(value)
        value, last = None, ""

    for w in re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split():
        if w.isdigit() or w in _UNITS:
            n = int(w) if w.isdigit() else _UNITS.index(w)
            if value is not None and ((last == "tens" and n < 10) or (last == "hundred" and n < 100)):
                value += n
            else:
                flush()
                value = n
            last = "n"
        elif w in _TENS:
            if value is not None and last == "hundred":
                value += _TENS[w]
            else:
                flush()
                value = _TENS[w]
            last = "tens"
        elif w == "hundred":
            value, last = (value or 1) * 100, "hundred"
        elif not (w == "and" and last == "hundred"):
            flush()
    flush()
    return out


def heard_right(request: Request, heard: str | None) -> bool | None:
    """Whether the ears (the server's transcript of the request) heard what the call needs: every
    expected value in it (an order number's digits together; the calculator: the same numbers as
    were said). None: no transcript came."""
    if heard is None:
        return None
    heard = heard.replace("$", " dollars ").replace("£", " pounds ").replace("€", " euros ")
    said = normalise(heard)
    digits = re.sub(r"(?<=\d) (?=\d)", "", said)
    for key, want in request.args.items():
        if key == "=":
            if _numbers(heard) != _numbers(request.text):
                return False
            continue
        text = digits if key == "order_number" else said
        if not any(re.search(rf"(?<![a-z0-9]){re.escape(normalise(alt))}" + (r"(?!\d)" if alt[-1:].isdigit() else ""), text) for alt in want.split("|")):
            return False
    return True


def heard_key(key: str, heard: str) -> bool:
    """Whether an alternative of ``key`` was heard as a word, or (a word of four letters or more)
    as the beginning of one: "snowfall" says "snow" (since 2026-11-28; "5" never passes as "50")."""
    said = f" {normalise(heard)} "
    for alt in key.split("|"):
        word = normalise(alt)
        if f" {word} " in said or len(word) >= 4 and word.isalpha() and f" {word}" in said:
            return True
    return False


# ------------------------------------------------------------------------------------- the client


@dataclass
class Exchange:
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)
    call_ids: list[str] = field(default_factory=list)
    said: str = ""  # the server's transcript of what it said
    heard: str | None = None  # the server's transcript of the request: what the thinker was given
    audio: bytearray = field(default_factory=bytearray)
    call_ms: float | None = None  # end of speech -> the first call's arguments.done
    answer_ms: float | None = None  # end of speech -> the spoken answer's first audio (two-step; --mcp: after a call)
    answer_heard_ms: float | None = None  # the same -> its first audible sample, played from its first delta
    tool_ms: float | None = None  # --mcp: the first call's response.mcp_call.in_progress -> .completed
    status: str = ""
    mcp_names: dict[str, str] = field(default_factory=dict)  # --mcp: item id -> the tool its mcp_call names
    mcp_started: float | None = None
    mcp_done: float | None = None  # --mcp: when the first call's output came (audio after it is the answer)


async def _until_done(conn: Any, ex: Exchange, speech_end: float, answering: bool) -> None:
    async with asyncio.timeout(TURN_TIMEOUT_S):
        async for event in conn:
            kind = event.type
            if kind == "response.function_call_arguments.done":
                ex.calls.append((event.name, event.arguments))
                ex.call_ids.append(event.call_id)
                if ex.call_ms is None:
                    ex.call_ms = (time.perf_counter() - speech_end) * 1000
            elif kind == "response.output_item.added" and event.item.type == "mcp_call":
                ex.mcp_names[event.item.id] = event.item.name
            elif kind == "response.mcp_call_arguments.done":
                ex.calls.append((ex.mcp_names.get(event.item_id, ""), event.arguments))
                if ex.call_ms is None:
                    ex.call_ms = (time.perf_counter() - speech_end) * 1000
            elif kind == "response.mcp_call.in_progress" and ex.mcp_started is None:
                ex.mcp_started = time.perf_counter()
            elif kind in ("response.mcp_call.completed", "response.mcp_call.failed") and ex.mcp_done is None:
                ex.mcp_done = time.perf_counter()
                ex.tool_ms = (ex.mcp_done - (ex.mcp_started or ex.mcp_done)) * 1000
            elif kind == "response.output_audio.delta":
                after_call = ex.mcp_done is not None  # (--mcp: the answer to the call's output, in the same response)
                if (answering or after_call) and ex.answer_ms is None:
                    ex.answer_ms = (time.perf_counter() - speech_end) * 1000
                if answering or after_call:
                    raw = base64.b64decode(event.delta)
                    if ex.answer_heard_ms is None and ex.answer_ms is not None:
                        first = speech_end + ex.answer_ms / 1000
                        heard = audible_at(np.frombuffer(raw, "<i2"), RATE, first, len(ex.audio) / 2 / RATE, time.perf_counter())
                        ex.answer_heard_ms = None if heard is None else (heard - speech_end) * 1000
                    ex.audio += raw
            elif kind == "response.output_audio_transcript.done":
                ex.said += event.transcript
            elif kind == "conversation.item.input_audio_transcription.completed" and ex.heard is None:
                ex.heard = event.transcript
            elif kind == "error":
                ex.status = f"error: {event.error.message}"
            elif kind == "response.done":
                ex.status = event.response.status
                return


async def _heard(conn: Any, ex: Exchange, within_s: float = 3.0) -> None:
    """The request's transcript, if it had not come by the response's end."""
    if ex.heard is not None:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            async for event in conn:
                if event.type == "conversation.item.input_audio_transcription.completed":
                    ex.heard = event.transcript
                    return


def espeak_voice(text: str) -> np.ndarray:
    return espeak(text, RATE)


def piper_voice() -> Callable[[str], np.ndarray]:
    """The requests said by Piper's "joe" (the CPU agent's own voice, from a PyPI package): a voice
    nearer a person's than espeak's for Whisper (tiny.en heard 37 of the 40 requests right in it,
    29 in espeak's, 2026-11-28).

    Each text is synthesised once and its clip kept: the voice draws noise in every synthesis
    (Moonshine heard five of eight syntheses of "Phone Katie for me." as "Don Katie for me.",
    2026-11-30), so a run's arms, with and without keywords, hear the same clips: what differs
    between them is the arm's, not the draw's."""
    from bench.dataset import _piper

    talker = _piper()
    if talker is None:
        raise SystemExit("--voice piper needs piper-tts and the piper-joe model (./scripts/install)")
    return functools.lru_cache(maxsize=None)(lambda text: resample(talker.speak(text), talker.rate, RATE))


def expecting(keywords: list[str] | None) -> dict[str, Any]:
    """The part of a session.update that gives the ears ``keywords`` (none: nothing)."""
    return {"audio": {"input": {"transcription": {"keywords": keywords}}}} if keywords else {}


async def exchange(
    url: str,
    request: Request,
    output: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] = TOOLS,
    key: str = "bench",
    mcp: McpTools | None = None,
    speak: Callable[[str], np.ndarray] = espeak_voice,
    keywords: list[str] | None = None,
) -> Exchange:
    """One fresh session (opened with API key ``key``): the request spoken in real time, its
    response, and with ``output`` the tool's answer sent back and the spoken answer to it. With
    ``mcp``, the tools are its server's (listed before the request is spoken), the server runs the
    call and answers from its output in the same response: ``output`` is what the tool returns.
    ``keywords``: the session's words for the ears to expect."""
    from openai import AsyncOpenAI

    pcm = speak(request.text)
    silence = np.zeros(RATE * 20 // 1000, np.int16)
    client = AsyncOpenAI(api_key=key, websocket_base_url=url)
    ex = Exchange()
    async with client.realtime.connect(model="bench") as conn:
        if mcp is not None:
            mcp.output = output if output is not None else TOOL_OUTPUTS.get(request.tool or "", {"ok": True})
            tool = {"type": "mcp", "server_label": "bench", "server_url": mcp.url, "require_approval": "never"}
            await conn.session.update(session={"type": "realtime", "tools": [tool], **expecting(keywords)})  # type: ignore[typeddict-item]
            async with asyncio.timeout(TURN_TIMEOUT_S):  # listed (and prefilled) off the turn's path, as a function's tools are
                async for event in conn:
                    if event.type in ("mcp_list_tools.completed", "mcp_list_tools.failed"):
                        break
            output = None  # (the server sends it back, not this client)
        else:
            await conn.session.update(session={"type": "realtime", "tools": tools, **expecting(keywords)})  # type: ignore[typeddict-item]
        step = RATE * 20 // 1000
        t0 = time.perf_counter()
        lead = 15  # 300 ms of quiet before the speech, 1.2 s after it
        frames = [silence] * lead + [pcm[i : i + step] for i in range(0, len(pcm), step)] + [silence] * 60
        # the end of the speech, not of the clip: espeak pads its clips with 350 ms of silence, Piper
        # with 100-200 ms (until 2026-11-28 the times here ran from the clip's end, 350 ms late)
        _, last_ms = speech_bounds_ms(pcm, RATE)
        speech_end = t0 + lead * 0.02 + (last_ms + 1) / 1000

        async def send() -> None:
            for n, frame in enumerate(frames):
                await conn.input_audio_buffer.append(audio=base64.b64encode(frame.astype("<i2").tobytes()).decode())
                await asyncio.sleep(max(0.0, t0 + (n + 1) * 0.02 - time.perf_counter()))

        sender = asyncio.create_task(send())
        try:
            while time.perf_counter() < speech_end:
                await asyncio.sleep(0.01)
            await _until_done(conn, ex, speech_end, answering=output is None and request.tool is None)
            await _heard(conn, ex)
            if output is not None and ex.call_ids:
                item = {"type": "function_call_output", "call_id": ex.call_ids[0], "output": json.dumps(output)}
                await conn.conversation.item.create(item=item)  # type: ignore[arg-type]
                await conn.response.create()
                first = Exchange()
                await _until_done(conn, first, speech_end, answering=True)
                ex.said, ex.audio, ex.answer_ms, ex.answer_heard_ms, ex.status = first.said, first.audio, first.answer_ms, first.answer_heard_ms, first.status
        except TimeoutError:
            ex.status = "timeout"
        finally:
            sender.cancel()
    return ex


# ------------------------------------------------------------------------------------- --mcp

# what each tool returns to a request outside the two-step set (the two-step set has its own outputs)
TOOL_OUTPUTS: dict[str, dict[str, Any]] = {
    "get_weather": {"sky": "cloudy", "celsius": 14},
    "get_time": {"time": "3:20 pm"},
    "book_table": {"booked": True, "table": 7},
    "calculate": {"result": "computed"},
    "lookup_order": {"status": "in transit"},
    "forecast": {"sky": "clear"},
    "convert_currency": {"result": "converted"},
    "set_timer": {"timer": "started"},
    "find_flights": {"flights": 2},
    "call_contact": {"status": "ringing"},
}


class McpTools:
    """A tool set served by an MCP server (Streamable HTTP on loopback, the ``mcp`` SDK's low-level
    server, in a thread of this process): the function tools' names, descriptions and JSON schemas
    as they are; each call answered at once with ``output`` (the exchange under way sets it: one at
    a time), after ``delay_s``."""

    def __init__(self, tools: list[dict[str, Any]], delay_s: float = 0.0) -> None:
        import uvicorn
        from mcp import types
        from mcp.server.lowlevel import Server

        self.tools = [types.Tool(name=t["name"], description=t["description"], input_schema=t["parameters"]) for t in tools]
        self.output: dict[str, Any] = {}
        self.calls = 0

        async def listed(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult(tools=self.tools)

        async def call(ctx: Any, params: Any) -> Any:
            self.calls += 1
            await asyncio.sleep(delay_s)
            return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(self.output))])

        port = free_port()
        self.url = f"http://127.0.0.1:{port}/mcp"
        app = Server("bench-tools", on_list_tools=listed, on_call_tool=call).streamable_http_app(host="127.0.0.1")
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="bench-mcp", daemon=True)

    def __enter__(self) -> "McpTools":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the bench's MCP server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True  # (after the realtime server: its sessions' connections are gone)
        self.thread.join(timeout=10)


# ------------------------------------------------------------------------------------- the run


def config(name: str) -> dict[str, Any]:
    base, thinker, cascade = VARIANTS.get(name, (name, {}, {}))
    cfg = config_file.raw(base)
    cfg["pipeline"]["options"].update(cascade)
    cfg["pipeline"]["options"]["thinker"].update(thinker)
    return cfg


# a name -> (config file, thinker options over it, cascade options over it)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen2.5-coder-0.5b-w8": ("cpu", {}, {}),  # the default
    "qwen2.5-coder-0.5b-w8-rp1.2": ("cpu", {"calls": {"repetition_penalty": 1.2}}, {}),  # the answers' penalty on tool answers too
    "qwen2.5-coder-0.5b-w8-tools-after-output": ("cpu", {}, {"tools_after_output": "offered"}),  # the tools offered when answering an output
    "qwen2.5-coder-0.5b-w8-tools-shown-after-output": ("cpu", {}, {"tools_after_output": "shown"}),  # the answer to an output with them in its prompt, calls banned
    "qwen2.5-coder-0.5b-w8-ungrounded": ("cpu", {"calls": {"ground": False}}, {}),  # calls with values nobody said go out (before 2026-11-26)
    "qwen2.5-coder-0.5b-w8-unfit": ("cpu", {"calls": {"fit": False}}, {}),  # a value said is called whatever the thinker reads it as (before 2026-11-29 15:30)
    "qwen2.5-coder-0.5b-w8-free-calls": ("cpu", {"calls": {"constrain": "never"}}, {}),  # every call as the model writes it (before 2026-11-27)
    "qwen2.5-coder-0.5b-w8-held-calls": ("cpu", {"calls": {"constrain": "always"}}, {}),  # a call the model makes on its own held to its schema too
    "qwen2.5-coder-0.5b-w8-first-choice": ("cpu", {"calls": {"second_choices": 0}}, {}),  # no second choice of tool after a dropped call (before 2026-11-28)
    "qwen2.5-coder-0.5b-w8-unsteered": ("cpu", {"calls": {"steer": False}}, {}),  # every call written by the model token by token (before steering)
    "qwen2.5-coder-0.5b": ("cpu", {"model": "qwen2.5-coder-0.5b-instruct"}, {}),  # fp32 weights
    "qwen2.5-coder-1.5b-w8": ("cpu-1.5b", {}, {}),  # the larger thinker (./scripts/install larger-thinker)
    "qwen2.5-coder-0.5b-w8-whisper-base": ("cpu", {}, {"asr_model": "whisper-base"}),  # the agent hears better
    "qwen2.5-coder-0.5b-w8-greedy-ears": ("cpu", {}, {"asr_beam_size": 1}),  # Moonshine decoded greedily (before 2026-11-29)
    # the thinker on a ``vllm serve`` of the same model, started for the run on the same machine
    # (thinker.engine: remote): its calls steered as in process, a completions request a step
    "qwen2.5-coder-0.5b-w8-remote": ("cpu", {"engine": "remote", "served_model": "qwen"}, {}),
    "qwen2.5-coder-0.5b-w8-remote-unsteered": ("cpu", {"engine": "remote", "served_model": "qwen", "calls": {"steer": False}}, {}),  # (before 2026-11-29)
}


async def run(
    url: str,
    limit: int,
    ears: Any,
    tool_set: str = "default",
    keys: str = "one",
    mcp: McpTools | None = None,
    speak: Callable[[str], np.ndarray] = espeak_voice,
    keywords: list[str] | None = None,
) -> dict[str, Any]:
    """``keys``: "one", every session opened with one API key (a deployment's app: its sessions share
    the tools' prefix), or "each", every session with a key of its own (each its key's first: the
    tools prefilled cold). ``keywords``: every session's words for the ears to expect."""
    ts = TOOL_SETS[tool_set]
    requests = ts.requests[:limit] if limit else ts.requests
    no_tool = ts.no_tool[: max(1, limit // 2)] if limit else ts.no_tool
    two_step = ts.two_step[: max(1, limit // 4)] if limit else ts.two_step
    run_key = "bench-" + secrets.token_hex(4)  # no earlier run's cache: the first session is cold

    def key() -> str:
        return run_key if keys == "one" else "bench-" + secrets.token_hex(8)

    rows: list[dict[str, Any]] = []
    for r in requests + no_tool:
        ex = await exchange(url, r, tools=ts.tools, key=key(), mcp=mcp, speak=speak, keywords=keywords)
        name, args = ex.calls[0] if ex.calls else ("", "")
        valid, right = arguments_right(r, name, args, ts.schemas) if r.tool else (False, False)
        rows.append(
            {"set": "requests" if r.tool else "no_tool", "request": r.text, "tool": r.tool, "ears": ex.heard, "ears_right": heard_right(r, ex.heard) if r.tool else None,
             "calls": ex.calls, "said": ex.said, "schema_valid": valid, "right": right, "call_ms": ex.call_ms, "tool_ms": ex.tool_ms,
             "copied": copied(ex.calls, ex.heard), "finished": finished(ex.said) if mcp is not None and ex.calls else None,
             "answer_ms": ex.answer_ms if mcp is not None and ex.calls else None,
             "answer_heard_ms": ex.answer_heard_ms if mcp is not None and ex.calls else None, "status": ex.status,
             "plain_ms": ex.answer_ms if not r.tool and not ex.calls else None}
        )  # fmt: skip
        print(f"  {'+' if right or (not r.tool and not ex.calls) else '-'} {r.text[:44]:44} heard {ex.heard!r:46.46} {ex.calls or ex.said[:60]!r}", flush=True)
    for t in two_step:
        ex = await exchange(url, t.request, t.output, tools=ts.tools, key=key(), mcp=mcp, speak=speak, keywords=keywords)
        pcm = np.frombuffer(bytes(ex.audio), "<i2")
        heard = await asyncio.to_thread(ears.transcribe, resample(pcm, RATE, 16000)) if len(pcm) else ""
        name, args = ex.calls[0] if ex.calls else ("", "")
        valid, right = arguments_right(t.request, name, args, ts.schemas)
        ok = bool(ex.calls) and heard_key(t.key, heard)
        used = heard_key(t.key, ex.said) if ex.calls else None  # (what the thinker wrote: the talker and this bench's ears aside)
        rows.append(
            {"set": "two_step", "request": t.request.text, "ears": ex.heard, "ears_right": heard_right(t.request, ex.heard), "calls": ex.calls, "said": ex.said,
             "heard": heard, "schema_valid": valid, "right": right, "answer_right": ok, "answer_uses_output": used, "call_ms": ex.call_ms, "tool_ms": ex.tool_ms, "answer_ms": ex.answer_ms,
             "copied": copied(ex.calls, ex.heard), "finished": finished(ex.said) if ex.calls else None,
             "answer_heard_ms": ex.answer_heard_ms, "status": ex.status}
        )  # fmt: skip
        print(f"  {'+' if ok else '-'} {t.request.text[:44]:44} {ex.calls} -> {heard[:60]!r}", flush=True)
    return {"tool_set": tool_set, "keys": keys, "tools": "mcp" if mcp is not None else "function", "summary": summarize(rows), "exchanges": rows}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    asked = [r for r in rows if r["set"] == "requests"]
    none = [r for r in rows if r["set"] == "no_tool"]
    two = [r for r in rows if r["set"] == "two_step"]

    def share(xs: list[bool]) -> float | None:
        return round(sum(xs) / len(xs), 3) if xs else None

    wrong = [r for r in asked if not r["right"]]
    return {
        "requests": len(asked),
        "right_tool_and_arguments": share([r["right"] for r in asked]),
        "right_tool": share([bool(r["calls"]) and r["calls"][0][0] == r["tool"] for r in asked]),
        "schema_valid": share([r["schema_valid"] for r in asked]),
        # whose miss: the ears' (the request was misheard: its values were not in the transcript) or the thinker's
        "heard_right": share([bool(r["ears_right"]) for r in asked]),
        "wrong_after_misheard": sum(1 for r in wrong if r["ears_right"] is False),
        "wrong_after_heard_right": sum(1 for r in wrong if r["ears_right"]),
        "right_when_heard_right": share([r["right"] for r in asked if r["ears_right"]]),
        "no_tool": len(none),
        "false_calls": share([bool(r["calls"]) for r in none]),
        "empty_answers": sum(1 for r in none if not r["calls"] and not r["said"].strip()),
        # a plain question answered about the tools instead ("These tools can help users...")
        "answers_about_tools": sum(1 for r in none if not r["calls"] and re.search(r"\b(tools?|functions?)\b", r["said"].lower())),
        "two_step": len(two),
        "right_final_answers": share([r["answer_right"] for r in two]),
        # of the answers to an output (a call made), those whose words hold its key fact: what the
        # thinker wrote, before the talker's voice and this bench's ears ("foggy" heard "body")
        "answers_use_output": share([r["answer_uses_output"] for r in two if r.get("answer_uses_output") is not None]),
        # every answer to a tool's output (the two-step set; --mcp: every answered call) ends a sentence
        "answers_finished": share([r["finished"] for r in rows if r.get("finished") is not None]),
        # the calls' letter-only string values among the words heard (the user's own words)
        "values_copied": share([r["copied"] for r in rows if r.get("copied") is not None]),
        "voice_to_voice_call_ms": dist([r["call_ms"] for r in asked + two if r["call_ms"] is not None]),
        "first_call_ms": next((r["call_ms"] for r in asked if r["call_ms"] is not None), None),  # the run's first session's
        "voice_to_voice_answer_ms": dist([r["answer_ms"] for r in two if r["answer_ms"] is not None]),
        # end of speech -> the first audio of an answer in words to a request that needed no tool
        # (what tools on offer cost chit-chat: a call written and dropped comes before it)
        "voice_to_voice_plain_ms": dist([r["plain_ms"] for r in none if r.get("plain_ms") is not None]),
        # the spoken answer after the call and the tool's own time (--mcp: every answered call; functions: the two-step set)
        "tool_ms": dist([r["tool_ms"] for r in rows if r.get("tool_ms") is not None]),
        "answer_after_call_ms": dist(
            [r["answer_ms"] - r["call_ms"] - (r.get("tool_ms") or 0.0) for r in rows if r.get("answer_ms") is not None and r["call_ms"] is not None]
        ),
        # the same to the answer's first audible sample (its lead-in counted, as a caller hears it)
        "answer_heard_after_call_ms": dist(
            [r["answer_heard_ms"] - r["call_ms"] - (r.get("tool_ms") or 0.0) for r in rows if r.get("answer_heard_ms") is not None and r["call_ms"] is not None]
        ),
        "errors": sum(1 for r in rows if r["status"] != "completed"),
    }


async def prefill(config_name: str, tool_set: str, rounds: int) -> dict[str, Any]:
    """A fresh session's first answer, the thinker alone (in this process): ms to its first token
    with the instructions and tools cold (a cache salt of its own) and with them prefilled first
    (what ``prepare`` does when session.update brings them, or what a key's earlier session left)."""
    import statistics

    import msgspec

    from pipelines.base import Tool
    from pipelines.cascade.thinker import Report, Thinker, ThinkerOptions, Turn
    from pipelines.cascade.calls.format import tool_specs

    cfg = config(config_name)
    thinker = Thinker(msgspec.convert(cfg["pipeline"]["options"]["thinker"], ThinkerOptions))
    instructions = cfg["session"]["instructions"]
    await thinker.start(print)
    ts = TOOL_SETS[tool_set]
    specs = tool_specs([Tool(t["name"], t["description"], t["parameters"]) for t in ts.tools])

    async def first_token(ids: list[int], salt: str) -> tuple[float, int]:
        g = Report()
        t0 = time.perf_counter()
        async for _ in thinker.stream(ids, salt, max_tokens=1, report=g):
            pass
        return (time.perf_counter() - t0) * 1000, g.cached_tokens

    cold: list[float] = []
    prepared: list[float] = []
    try:
        prefix = thinker.prefix(instructions, [], tools=specs)
        for r in ts.requests[:rounds]:
            ids = thinker.render(instructions, [Turn("user", r.text)], tools=specs)
            ms, _ = await first_token(ids, secrets.token_hex(8))
            salt = secrets.token_hex(8)
            await first_token(prefix, salt)  # prepare
            ms_prepared, cached = await first_token(ids, salt)
            cold.append(ms)
            prepared.append(ms_prepared)
            print(f"  {len(ids)} tokens: cold {ms:.0f} ms, prepared {ms_prepared:.0f} ms ({cached} cached)", flush=True)
    finally:
        await thinker.stop()
    return {"prompt_tokens": len(ids), "prefix_tokens": len(prefix), "cold_ms_p50": round(statistics.median(cold), 1), "prepared_ms_p50": round(statistics.median(prepared), 1), "cold_ms": cold, "prepared_ms": prepared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["qwen2.5-coder-0.5b-w8"], help=f"{', '.join(VARIANTS)} or config names (configs/NAME.yaml)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests (N/2 without a tool, N/4 two-step)")
    parser.add_argument("--tool-set", choices=list(TOOL_SETS), default="default", help="heldout: other tools and requests, never tuned on")
    parser.add_argument(
        "--keys", choices=["one", "each"], default="one", help="one API key for every session (they share the tools' prefix), or a key each (cold)"
    )
    parser.add_argument("--mcp", action="store_true", help="the tools served by an MCP server (loopback, in the bench) instead of function tools")
    parser.add_argument("--tool-ms", type=int, default=0, help="with --mcp: each call answered after this many ms (a tool's own time)")
    parser.add_argument("--keywords", action="store_true", help="each config run again on the same server, its sessions' ears told KEYWORDS (a contact list and towns)")
    parser.add_argument("--voice", choices=["espeak", "piper"], default="espeak", help="who says the requests: espeak-ng (hard for Whisper), or Piper's joe (nearer a person)")
    parser.add_argument("--prefill", type=int, metavar="N", default=0, help="only the thinker: a fresh session's first token, tools cold and prepared, N rounds")
    args = parser.parse_args()
    if args.prefill:
        out = {"machine": machine(), "configs": {n: asyncio.run(prefill(n, args.tool_set, args.prefill)) for n in args.configs}}
        for name, data in out["configs"].items():
            print(f"{name}: {data['prompt_tokens']} tokens, first token p50 cold {data['cold_ms_p50']} ms, tools prepared {data['prepared_ms_p50']} ms")
        print("saved", save("tools-prefill", out))
        return
    from pipelines import models
    from pipelines.cascade.listener import WhisperListener

    ears = WhisperListener(str(models.ensure("whisper-base", print)), 2, 1)
    speak = piper_voice() if args.voice == "piper" else espeak_voice
    result: dict[str, Any] = {"machine": machine(), "configs": {}, "tool_delay_ms": args.tool_ms if args.mcp else None, "voice": args.voice}
    for name in args.configs:
        print(f"{name} ...", flush=True)
        with contextlib.ExitStack() as stack:
            cfg = config(name)
            mcp = stack.enter_context(McpTools(TOOL_SETS[args.tool_set].tools, args.tool_ms / 1000)) if args.mcp else None
            if mcp is not None:
                cfg["mcp"] = {"allowed_servers": [mcp.url]}
            thinker = cfg["pipeline"]["options"]["thinker"]
            if thinker.get("engine") == "remote":  # (its own deployment, as tests/pipelines/test_cpu_remote_tools.py starts it)
                thinker["remote"] = {"url": stack.enter_context(vllm_serve(thinker["model"], thinker["served_model"]))}
            url = stack.enter_context(server_process(cfg, startup_s=900))
            result["configs"][name] = asyncio.run(run(url, args.limit, ears, args.tool_set, args.keys, mcp, speak))
            if args.keywords:  # the same server, its sessions told the contact list and towns
                result["configs"][f"{name}+keywords"] = asyncio.run(run(url, args.limit, ears, args.tool_set, args.keys, mcp, speak, KEYWORDS))
    print(f"\ntool set {args.tool_set}, voice: {args.voice}, keys: {args.keys}, tools: {'MCP' if args.mcp else 'function'}{f', answered after {args.tool_ms} ms' if args.mcp and args.tool_ms else ''}")
    head = (
        f"{'config':42} {'right':>6} {'valid':>6} {'false':>6} {'empty':>5} {'answers':>7} {'heard':>6} {'miss e/t':>8} {'call p50':>8} {'answer p50':>10}"
        f" {'after p50':>9} {'heard':>6} {'plain p50':>9} {'errors':>6} {'finished':>8} {'uses':>5} {'copied':>6}"
    )
    print(head)
    for name, data in result["configs"].items():
        s = data["summary"]
        call, answer = s["voice_to_voice_call_ms"], s["voice_to_voice_answer_ms"]
        misses = f"{s['wrong_after_misheard']}/{s['wrong_after_heard_right']}"
        print(
            f"{name:42} {s['right_tool_and_arguments']!s:>6} {s['schema_valid']!s:>6} {s['false_calls']!s:>6} {s['empty_answers']!s:>5}"
            f" {s['right_final_answers']!s:>7} {s['heard_right']!s:>6} {misses:>8} {call.get('p50', '-')!s:>8} {answer.get('p50', '-')!s:>10}"
            f" {s['answer_after_call_ms'].get('p50', '-')!s:>9} {s['answer_heard_after_call_ms'].get('p50', '-')!s:>6}"
            f" {s['voice_to_voice_plain_ms'].get('p50', '-')!s:>9} {s['errors']:>6} {s['answers_finished']!s:>8} {s['answers_use_output']!s:>5} {s['values_copied']!s:>6}"
        )
    print("saved", save("tools-mcp" if args.mcp else "tools", result))


if __name__ == "__main__":
    main()
