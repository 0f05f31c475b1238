"""Whether a call's values are the user's own: a call whose required values appear nowhere in the
conversation was made up by the model, not asked for.

A small thinker offered tools calls them on chit-chat with values of its own ("What color is the
sky?" -> ``get_weather {"city": "London"}``, "I'm feeling great" -> a forecast for New York), and
after a misheard request it fills the gap the same way ("book a table for four" heard as "look at
table for format" -> ``lookup_order {"order_number": "12345"}``). Its own probabilities do not tell
these apart from the calls it should make (a false call's first token is as likely as a right
one's: docs/tools.md), but their values do: they were never said. ``ungrounded`` names the values
of a call that are nowhere in ``words`` (the instructions and the conversation's turns, not the
tools' descriptions, whose example values a model copies):

* a required string argument's names (its capitalised words: "London", "New York") must each be
  among the words; values from an ``enum`` (the tool's own) are not checked;
* a required string that names something (``names``: a city, a person, a dish, a room; not a code,
  a number, a time, an expression or a message, which the model writes in its own form) and holds
  no digits must have every word said, lowercase ones too ("chicken" for "How many days are in a
  week?", "your-location" for "I'm feeling great"); the steered call copies such values from what
  was said (steering.py), so this holds there by construction and judges the model's own values
  and a remote thinker's;
* a required string with numbers in it ("8 pm", "7:30") must hold one the user said: "a table
  at nine pm" written "8 pm" was not asked for;
* a required string of digits (an order number) must hold, or be held in, a number the user said
  of three digits or more (digits spoken one by one are joined: "four five one two" is 4512), or
  be one of them;
* a required integer or number must be one the user said ("a table for five": 5).

Numbers are read from digits and from English number words ("twenty seven", "one hundred and
twenty"). English only, like the CPU cascade's ears. In the instructions only digits count
(``instructions``): their number words are their wording ("reply in one short sentence" is not a
party of one).

**Values that fit.** A word said is not always the value asked for: "What color are ripe bananas?"
with a forecast tool offered came back ``get_forecast {"city": "bananas"}``, and "Don katie for me"
(a misheard "Phone Katie") a forecast for "katie". ``misfits`` asks the thinker itself how the value
reads in its parameter's place: log P(value | the tool's description and the parameter's, "Get
today's weather forecast for a city. The city:") against log P(value | "Here is a word:"); below
``FIT_FLOOR`` the value is not one it takes for such a thing, and the call is dropped as one whose
value was not said. It costs two prefills of ~20 tokens that the call waits for (~0.2 s on two
cores, more beside the ears and the talker), so it is asked only of a value the user's words
spell in lowercase (the ears write a place or a person they know with a capital: "Lisbon",
"Marco"; "bananas", "week", "katie" they do not) of a call the user's words do not name (``named``: no word of the tool's name or
description among them, as "What color are ripe bananas?" names no forecast). The value is read in
title case, as a name is written ("rome" is -3.0 nats as a city, "Rome" a city). Measured with the
default thinker in its engine (docs/tools.md).

What the agent does with such a call (pipelines/cascade/production.py): when the user's last words
ask for what the tool does (``asked_for``: they share a word with its name, "the forecast for
Lisboa" and a forecast tool) the value was misheard or changed, and the agent asks for
it again (``ask_back``), as OpenAI's models do, instead of answering from what it does not know
("The forecast for Lisbon is sunny"); otherwise (chit-chat: "What color is the sky?" and a weather
tool) it answers in words.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"hundred": 100, "thousand": 1000}
_NUMBER_WORDS = frozenset([*_UNITS, *_TENS, *_SCALES])
_TOKEN = re.compile(r"[a-z]+|\d+")
# words that, in a property's name or description, say its value is written in a form of its own
# rather than named as the user says it (steering.names, ``ungrounded``'s lowercase words)
OWN_FORM = frozenset(
    "code codes iso id ids number numbers num amount count time times date dates day when hour minute duration "
    "expression formula equation math message body text content note notes comment description reason summary "
    "subject query prompt instructions email url link phone unit units currency symbol format language".split()
)
_NAME = re.compile(r"\b[A-Z][a-z]+(?:'[a-z]+)?\b")


def words_of(text: str) -> set[str]:
    return set(_TOKEN.findall(text.lower()))


def numbers_of(text: str) -> set[str]:
    """Every number ``text`` says, as digits: each one alone, the spoken ones joined as said
    ("twenty seven" -> 27, "one hundred and twenty" -> 120), and runs of single digits joined
    ("four five one two" -> 4512)."""
    found: set[str] = set()
    value: int | None = None  # the spoken number being read
    run = ""  # single digits said one after another
    for token in _TOKEN.findall(text.lower()):
        single = None  # the token is one digit
        if token.isdigit():
            value = None  # written digits stand alone
            found.add(str(int(token)))
            single = token if len(token) == 1 else None
        elif token in _UNITS or token in _TENS:
            n = _UNITS.index(token) if token in _UNITS else _TENS[token]
            after_scale = value is not None and value > 0 and value % 100 == 0
            after_tens = value is not None and value % 100 >= 20 and value % 10 == 0 and n < 10
            value = value + n if value is not None and (after_scale or after_tens) else n
            single = str(n) if n < 10 else None
        elif token in _SCALES and value is not None:
            value *= _SCALES[token]
        elif token == "and" and value is not None and value >= 100:
            continue  # one hundred and twenty
        else:
            value = None
        if value is not None:
            found.add(str(value))
        if single is not None:
            run += single
            if len(run) > 1:
                found.add(run)
        else:
            run = ""
    return found


def instructions(text: str) -> str:
    """The instructions as grounds for a call's values: their words and digits, not their number
    words."""
    return " ".join(t for t in _TOKEN.findall(text.lower()) if t not in _NUMBER_WORDS)


def _object(arguments: str, parameters: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A call's arguments and its schema's properties, both objects; else None (the schema check
    reports what is wrong)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return (value, properties) if isinstance(value, dict) and isinstance(properties, dict) else None


def ungrounded(arguments: str, parameters: dict[str, Any], words: str) -> list[str]:
    """The values of a call (its ``arguments`` JSON, against its tool's ``parameters`` schema) that
    appear nowhere in ``words``; empty when every required value was said (or the arguments are not
    an object: the schema check reports that)."""
    parsed = _object(arguments, parameters)
    if parsed is None:
        return []
    value, properties = parsed
    said_words, said_numbers = words_of(words), numbers_of(words)
    said_stems = {_stem(w) for w in said_words}
    missing: list[str] = []
    for name in parameters.get("required") or []:
        schema = properties.get(name)
        if name not in value or not isinstance(schema, dict) or "enum" in schema:
            continue
        v = value[name]
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            if float(v).is_integer() and str(int(v)) not in said_numbers:
                missing.append(f"{name}={v}")
        elif isinstance(v, str):
            digits = re.sub(r"[\s-]", "", v)
            numbers = {str(int(n)) for n in re.findall(r"\d+", v)} - {"0"}
            if digits.isdigit():
                long = [n for n in said_numbers if len(n) >= 3]
                if str(int(digits)) not in said_numbers and not any(n in digits or digits in n for n in long):
                    missing.append(f"{name}={v}")
            elif numbers and not numbers & said_numbers or any(n.lower() not in said_words for n in _NAME.findall(v)):
                missing.append(f"{name}={v}")
            elif not numbers and names(name, schema) and any(_stem(w) not in said_stems for w in words_of(v)):
                missing.append(f"{name}={v}")
    return missing


FIT_FLOOR = 0.0  # nats: a value read as likelier in its parameter's place than as any word fits
_ANY_WORD = "Here is a word:"


async def misfits(
    arguments: str, description: str, parameters: dict[str, Any], likelihood: Callable[[str, str], Awaitable[float | None]], words: str = ""
) -> list[str]:
    """The required values of a call (its ``arguments``, against its tool's ``description`` and
    ``parameters`` schema) that name something (``names``), are said in lowercase letters (in
    ``words``, what was said, else as written: a value the user's words give a capital, as the
    ears and a typist write a name, is taken as one; a value with digits is read by
    ``ungrounded``), and that the thinker does not read as such:
    ``likelihood(context, text)``, log P(text | context), the value in title case (as a name is
    written) in the parameter's place against after ``_ANY_WORD``, below ``FIT_FLOOR``. A value it
    cannot score fits."""
    parsed = _object(arguments, parameters)
    if parsed is None:
        return []
    value, properties = parsed

    async def lift(context: str, text: str) -> float | None:
        there, anywhere = await asyncio.gather(likelihood(context, text), likelihood(_ANY_WORD, text))
        return None if there is None or anywhere is None else there - anywhere

    checked: list[tuple[str, str, str]] = []  # (name, value, the parameter's place)
    for name in parameters.get("required") or []:
        spec, v = properties.get(name), value.get(name)
        if isinstance(spec, dict) and isinstance(v, str) and v.strip() and _said_as(v, words).islower() and names(name, spec):
            what = str(spec.get("description") or name.replace("_", " ")).strip().capitalize()
            checked.append((name, v, f"{description.strip()} {what}:".strip()))
    lifts = await asyncio.gather(*(lift(place, f" {v.strip().title()}") for _, v, place in checked))
    return [f"{name}={v}" for (name, v, _), up in zip(checked, lifts) if up is not None and up < FIT_FLOOR]


_FILLER = frozenset("um uh er erm ah oh hmm mm well so".split())


def unasked(arguments: str, parameters: dict[str, Any], asked: str, before: str) -> list[str]:
    """The string values of a call (its ``arguments``, against its ``parameters`` schema) when the
    user's last words (``asked``) are those values and nothing else (fillers aside), and the
    agent's words before them (``before``) asked nothing: no request was made. "Good morning." is
    a greeting, not a call to someone named "Good morning" (the 1.5B's, 2026-11-29: its reading of
    the value as a name was +0.8 nats, the 0.5B's +3.6, as high as a name's: no reading tells them
    apart); "Lisbon." after "Which city?" answers the question, and goes out. Any question of the
    agent's counts as asking ("How can I help?" too): a value given after one is never dropped
    here, at the cost of a greeting after one going out as before."""
    if "?" in before:
        return []
    parsed = _object(arguments, parameters)
    if parsed is None:
        return []
    value, _ = parsed
    strings = {name: v for name, v in value.items() if isinstance(v, str) and v.strip()}
    said = words_of(asked) - _FILLER
    if not strings or not said or not said <= {w for v in strings.values() for w in words_of(v)}:
        return []
    return [f"{name}={v}" for name, v in strings.items()]


def _said_as(value: str, words: str) -> str:
    """``value`` as ``words`` spell it (the first time they hold it, case aside), else as it is."""
    found = re.search(rf"(?<!\w){re.escape(value.strip())}(?!\w)", words, re.IGNORECASE) if value.strip() else None
    return found.group(0) if found else value


def names(name: str, spec: dict[str, Any]) -> bool:
    """Whether property ``name`` (its schema ``spec``) holds a string that names something the user
    says (a city, a person, a dish): a string with no enum, format or pattern whose name and
    description speak of no code, number, time, expression or message (``OWN_FORM``: those the
    model writes in its own form: "USD" for dollars, "8 pm", "12 * 7", a note's words)."""
    if spec.get("type") != "string" or any(k in spec for k in ("enum", "format", "pattern", "const")):
        return False
    about = set(re.findall(r"[a-z]+", (name.replace("_", " ") + " " + str(spec.get("description", ""))).lower()))
    return not about & OWN_FORM


def _stem(word: str) -> str:
    """A word with its plural folded ("apples" -> "apple")."""
    return word[:-1] if word.endswith("s") and len(word) > 3 else word


def settled(arguments: str) -> str | None:
    """Arguments being written, as far as their values are whole (a string closed, a number or
    anything else followed by its comma): that much closed as an object, if it parses, for
    ``ungrounded`` to check before the rest is written; else None."""
    text = arguments.rstrip()
    if text.endswith(","):
        text = text[:-1]
    elif not text.endswith('"'):
        return None
    try:
        value = json.loads(text + "}")
    except ValueError:
        return None
    return text + "}" if isinstance(value, dict) else None


_STOP = frozenset("the and for with from that this what which who how when where get set make give find current about into your".split())


def _stems(text: str) -> set[str]:
    """A text's content words, plurals folded ("orders" -> "order")."""
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words_of(text.replace("_", " ")) if len(w) > 2 and w not in _STOP}


def asked_for(name: str, said: str) -> bool:
    """Whether ``said`` (the user's last words) asks for what a tool named ``name`` does: a word of
    its name among them ("get_time" and "What time is it"). Not its description: "a given day"
    would take "How many days are in a week?" for a forecast."""
    return bool(_stems(name) & _stems(said))


def named(name: str, description: str, said: str) -> bool:
    """Whether ``said`` (the user's last words) names what a tool does: a content word of its name
    or its description among them ("Phone someone" and "Phone Katie for me"). Such a call's values
    are not second-guessed (``misfits``: it costs prefills the call waits for)."""
    return bool(_stems(f"{name} {description}") & _stems(said))


def ask_back(values: list[str]) -> str:
    """What the agent says for a call whose values (``ungrounded``'s "name=value") nobody said."""
    name = values[0].split("=", 1)[0].replace("_", " ")
    return f"Sorry, I didn't catch the {name}. Could you say it again?"
