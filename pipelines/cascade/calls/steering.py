"""Tool calls written by steering the engine: the model makes each choice, the server writes the JSON.

Left to itself, Qwen2.5-Coder-0.5B writes a call as ~30 tokens of pretty-printed JSON in a fence
(```` ```json\\n{\\n    "name": "get_weather",\\n    "arguments": {\\n ... ````), one engine step each
(~33 ms on two cores): the call is whole ~1 s after the answer began, though its only choices
are the tool and a value or two. Steered, the answer is one resumable engine request (vLLM's
streaming input: each part ends, its last sampled token is dropped, and the next part's tokens
are appended and prefilled in one step) written in parts:

    speech  the answer as the model writes it, until a token that may begin a call (a fence, "{",
            ``<tool_call>``): that token is dropped
    name    ``<tool_call>\\n{"name": "`` fed, the model writes the tool's name a token a step, taken
            once it is one tool's whole name and no other's beginning (else up to its quote)
    value   for each of the tool's required properties, in the schema's order, the JSON before it
            fed (``", "arguments": {"city": "``), the model writes the value alone: a string up
            to its closing quote, a number from digits only, a boolean as true or false, an
            enum's string from its values' tokens
    copy    a string that names something (``names``: a city, a person, a dish; not an enum, a
            code, a number, a time or a message) whose first token, the model's free choice,
            begins something said in the conversation (``Spans``: its words, spans of up to six
            in the user's spelling): then written a token a step, each held to what goes on
            toward a span said (a trie over the words said), and closed only where one ends; what
            streams out is that span as the user said it ("Lis" -> "Lisbon", never "Lisboa"). A
            first token that begins nothing said is the model's own value: written as any string,
            and the grounding check (grounding.py) judges it
    more    with optional properties left: one step choosing "," or "}" (after ",", the key up to
            its quote: one of those properties, or the object is closed without it)
    next    with parallel calls: one step choosing another ``<tool_call>`` or the end

Each part's end gives the text it makes whole (``Part.say``); what streams out is the call in
the template's own form, ``<tool_call>\\n{"name": "get_weather", "arguments": {"city":
"Paris"}}\\n</tool_call>``, which ``tools.ToolStream`` parses as any other (grounding included).
A tool whose schema has other kinds of values (arrays, objects) has its arguments written as the
model writes them, after ``"arguments": ``. ``CallWriter`` is the state machine (its ``Step`` and a move table, ``MOVES``), without an
engine (``thinker.Thinker._read`` drives a request with it); measured in docs/tools.md.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from pipelines.base import Tool
from pipelines.cascade.calls import grounding
from pipelines.cascade.calls.format import CLOSE, OPEN

NAME_TOKENS = 16  # a tool's name longer than this is not one
STRING_TOKENS = 32  # a string value is closed after this many (grounding judges what it holds)
NUMBER_TOKENS = 12
KEY_TOKENS = 12
SCALARS = ("string", "integer", "number", "boolean")


@dataclass(frozen=True)
class Vocab:
    """The tokens each kind of part is held to, found once per tokenizer (``vocab``)."""

    starts: frozenset[int]  # may begin a call: the speech part stops there
    quotes: frozenset[int]  # hold a '"' or a control character (a newline): a string (a name, a key, a value) ends there
    digits: frozenset[int]  # only "0-9", ".", "-": a number's
    ends: frozenset[int]  # "," / "}" / "]" (and spaces) only, one of them at least: a number ends there
    commas: frozenset[int]  # "," alone: another property follows
    closes: frozenset[int]  # "}" (one or more) alone: the object ends
    booleans: frozenset[int]  # the first tokens of "true" and "false"
    call: int  # <tool_call>
    eos: frozenset[int]  # the end of the answer
    pieces: Mapping[str, int]  # a token's text -> the token (none with a quote or a control character)
    closing: frozenset[int]  # begin with '"': a string closed where it is


def vocab(tokenizer: Any, texts: Sequence[str]) -> Vocab | None:
    """The ``Vocab`` of ``tokenizer``; None without a ``<tool_call>`` token (no steering).
    ``texts``: every token's text (``tools.token_texts``)."""
    call = tokenizer.convert_tokens_to_ids(OPEN)
    if not isinstance(call, int) or call == getattr(tokenizer, "unk_token_id", None):
        return None
    starts, quotes, digits, ends, commas, closes, closing = set(), set(), set(), set(), set(), set(), set()
    pieces: dict[str, int] = {}
    for i, text in enumerate(texts):
        if not text:
            continue
        bare = text.strip()
        if bare.startswith(("`", "{")):
            starts.add(i)
        if any(ch == '"' or ch < " " for ch in text):
            quotes.add(i)
            if text.startswith('"'):
                closing.add(i)
        elif "\ufffd" not in text:  # (a piece of a character: never a word's)
            pieces.setdefault(text, i)
        if all(ch in "0123456789.-" for ch in text):
            digits.add(i)
        if bare and all(ch in ",}] \t\n" for ch in text):
            ends.add(i)
        if bare == ",":
            commas.add(i)
        if bare and set(bare) == {"}"}:
            closes.add(i)
    starts.add(call)
    eos = {t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if isinstance(t, int)}
    booleans = {tokenizer.encode(word, add_special_tokens=False)[0] for word in ("true", "false")}
    return Vocab(
        frozenset(starts), frozenset(quotes), frozenset(digits), frozenset(ends), frozenset(commas), frozenset(closes), frozenset(booleans), call,
        frozenset(eos), pieces, frozenset(closing),
    )  # fmt: skip


@dataclass(frozen=True)
class Calls:
    """What an answer may call: its tools, whether it may make several calls, and what was said in
    the conversation (the words a value that names something is copied from: ``Spans``)."""

    tools: Sequence[Tool]
    parallel: bool
    said: str = ""


SPAN_WORDS = 6  # the longest run of words said that a value is copied as


class Spans:
    """The values a call may copy from ``text`` (what was said): every run of one to
    ``SPAN_WORDS`` words within a clause (not across ".", ",", "?" ...), in its spelling, the
    newest last. ``after(value)``: the spans that go on from ``value`` (case aside)."""

    def __init__(self, text: str) -> None:
        spans: dict[str, str] = {}  # lowercased -> as said (the newest spelling)
        for clause in re.split(r"[.,;:!?()\[\]\"]+(?:\s|$)|[\n!?;()\[\]\"]", text):
            words = [w.strip("'-.") for w in clause.split()]
            words = [w for w in words if w]
            for i in range(len(words)):
                for j in range(i + 1, min(len(words), i + SPAN_WORDS) + 1):
                    span = " ".join(words[i:j])
                    spans.pop(span.lower(), None)
                    spans[span.lower()] = span
        self.spans = spans

    def after(self, value: str) -> list[str]:
        """The spans that begin with ``value`` (case aside), as said."""
        v = value.lower()
        return [span for low, span in self.spans.items() if low.startswith(v)] if v else []

    def spelled(self, value: str) -> str | None:
        """``value`` as it was said, when it was (case aside); else None."""
        return self.spans.get(value.lower())


@dataclass(frozen=True)
class Part:
    """The next part of the request: ``say``, text that streams out now (the JSON a part's end
    made whole); ``feed``, the tokens' text given to the engine (None: the answer ends); the
    engine then writes at most ``max_tokens``, from ``allowed`` only if given, and the part ends
    at a token in ``stop`` (dropped; ``free``: as the answer's own part, with its stops)."""

    say: str
    feed: str | None = None
    max_tokens: int = 1
    allowed: frozenset[int] | None = None
    stop: frozenset[int] = frozenset()
    free: bool = False


def steerable(tool: Tool) -> bool:
    """Whether a call of ``tool`` can be steered: an object of scalar properties (an enum's strings)."""
    schema = tool.parameters or {}
    properties = schema.get("properties") or {}
    if schema.get("type", "object") != "object" or not isinstance(properties, dict):
        return False
    for spec in properties.values():
        if not isinstance(spec, dict) or spec.get("type") not in SCALARS:
            return False
        if "enum" in spec and (spec["type"] != "string" or not all(isinstance(v, str) and v for v in spec["enum"])):
            return False
    return True


def _string(text: str) -> str:
    """``text`` as a JSON string's content: as the model wrote it if that is valid JSON (its own
    escapes), else escaped whole."""
    try:
        json.loads('"' + text + '"')
        return text
    except ValueError:
        return json.dumps(text)[1:-1]


def _said_as(part: Part, given: str, said: str) -> Part:
    """``part``, whose text begins with ``given`` (what the engine is given), with ``said`` in its
    place in what streams out (a name or value as the JSON must hold it)."""
    return replace(part, say=said + part.say[len(given) :])


class Step(StrEnum):
    """Where a steered answer is: the part under way writes the speech, a name, a value ..."""

    SPEECH = "speech"  # the answer as the model writes it
    NAME = "name"  # a tool's name, a token a step
    STRING = "string"  # a string value, up to its quote
    COPY = "copy"  # a string value copied from what was said, a token a step
    NUMBER = "number"
    BOOLEAN = "boolean"
    MORE = "more"  # "," or "}": another optional property or the end
    KEY = "key"  # an optional property's key
    NEXT = "next"  # another call, or the end (parallel calls)
    FREE = "free"  # the arguments as the model writes them (a schema of other kinds)
    DONE = "done"


class CallWriter:
    """The parts of one steered answer. ``took(text)``: what of a part's text streams out;
    ``ended(reason, stop, last)``: the part ended (``reason``: the engine's finish reason,
    ``stop``: the stop token it ended at, if any, ``last``: its last sampled token, which the
    engine dropped) -> the next ``Part``, or None when the answer is over."""

    def __init__(self, calls: Calls, vocab: Vocab, tokenizer: Any) -> None:
        self.tools = {t.name: t for t in calls.tools}
        self.parallel = calls.parallel
        self.vocab = vocab
        self.tokenizer = tokenizer
        self.state = Step.SPEECH
        self.text = ""  # the open part's text
        self.tool: Tool | None = None
        self.left: list[str] = []  # the call's required properties not written yet
        self.optional: list[str] = []  # its optional ones not written yet
        self.property = ""  # the property whose value (or key) is being written
        self.name = ""  # the name written so far
        self.steps = 0  # the name's steps so far
        self.first = True  # no property written yet in the call's arguments
        self.said = Spans(calls.said) if calls.said else None
        self.value = ""  # a string value's text written so far, in the steps before its last part

    def took(self, text: str) -> str:
        self.text += text
        return text if self.state in (Step.SPEECH, Step.FREE) else ""  # (the call's own parts: at their end, as valid JSON)

    def ended(self, reason: str | None, stop: int | None, last: int | None) -> Part | None:
        text, self.text = self.text, ""
        move = MOVES.get(self.state)
        return move(self, text, stop, last) if move is not None else None  # (FREE: the model wrote the arguments; DONE)

    # ------------------------------------------------------------------ the moves: a part of each step ended

    def _after_speech(self, text: str, stop: int | None, last: int | None) -> Part | None:
        return self._call("") if stop in self.vocab.starts else None

    def _after_call(self, text: str, stop: int | None, last: int | None) -> Part | None:
        return self._call("\n") if last == self.vocab.call else None

    def _after_string(self, text: str, stop: int | None, last: int | None) -> Part | None:
        # the model's tokens but the last stay in the request: the stop's text before its
        # quote is given; at the cap, the last token (dropped by the engine) is given again
        again = self._before_quote(stop) if stop is not None else self._piece(last)
        return self._next(_string(self.value + text + (again if stop is not None else "")) + '"', again + '"')

    def _after_number(self, text: str, stop: int | None, last: int | None) -> Part | None:
        return self._next(self._number(text), "" if stop is not None else self._piece(last))

    def _after_boolean(self, text: str, stop: int | None, last: int | None) -> Part | None:
        value = self._piece(last)
        return self._next(value if value in ("true", "false") else "null", value)

    def _after_more(self, text: str, stop: int | None, last: int | None) -> Part | None:
        if last in self.vocab.commas:
            self.state = Step.KEY
            return Part("", ', "', KEY_TOKENS, stop=self.vocab.quotes)
        return self._close("")

    def _after_key(self, text: str, stop: int | None, last: int | None) -> Part | None:
        key = text + self._before_quote(stop)
        if stop is None or key not in self.optional:
            return self._close("")  # (the object closes without it: its ', "' was never said)
        return self._value(key, ", " + json.dumps(key) + ": ", self._before_quote(stop) + '": ')

    # ------------------------------------------------------------------ the parts

    def _call(self, before: str) -> Part:
        self.state, self.name, self.steps = Step.NAME, "", 0
        head = OPEN + '\n{"name": "'
        return Part(before + head, head, 1, stop=self.vocab.quotes)

    def _naming(self, text: str, stop: int | None, last: int | None) -> Part | None:
        """The name token by token (a step that gives one token costs what a decoded one does),
        while it is the beginning of a tool's name: once it is one tool's whole name and no other
        goes on from it, it is that tool's (the model's closing quote, a step more, not awaited);
        else up to the model's quote."""
        if stop is not None:
            return self._named(self.name + text + self._before_quote(stop), self._before_quote(stop))
        self.name += text
        self.steps += 1
        if self.steps >= NAME_TOKENS:
            return self._named(self.name, None)
        again = self._piece(last)  # (the step's token, dropped by the engine, is given again)
        if self.name in self.tools and not any(n != self.name and n.startswith(self.name) for n in self.tools):
            return self._named(self.name, again)
        if any(n.startswith(self.name) for n in self.tools):
            return Part("", again, 1, stop=self.vocab.quotes)
        left, self.steps = NAME_TOKENS - self.steps, NAME_TOKENS  # (a name of no tool: up to its quote, or given up at the cap)
        return Part("", again, left, stop=self.vocab.quotes)

    def _named(self, name: str, rest: str | None) -> Part:
        """The call of tool ``name`` (None ``rest``: no name came), after ``rest`` given."""
        tool = self.tools.get(name)
        name = _string(name)
        if rest is None or tool is None:  # a name too long, or a tool not offered: the call closes empty
            self.state = Step.DONE  # (and the ToolStream drops it as a call of a tool not offered)
            return Part(name + '", "arguments": {}}\n' + CLOSE)
        self.tool = tool
        if not steerable(tool):
            self.state = Step.FREE
            head = '", "arguments": '
            return Part(name + head, rest + head, free=True)
        schema = tool.parameters or {}
        properties = list((schema.get("properties") or {}).keys())
        required = set(schema.get("required") or [])
        self.left = [p for p in properties if p in required]
        self.optional = [p for p in properties if p not in required]
        self.first = True
        return _said_as(self._property(rest + '", "arguments": {'), rest, name)

    def _property(self, before: str) -> Part:
        """After ``before`` (said and given): the next required property's value, else the choice
        of an optional one, else the end of the call."""
        if self.left:
            name = self.left.pop(0)
            head = before + ("" if self.first else ", ") + json.dumps(name) + ": "
            return self._value(name, head, head)
        if self.optional:
            self.state = Step.MORE
            return Part(before, before, 1, allowed=self.vocab.commas | self.vocab.closes)
        return self._close(before)

    def _value(self, name: str, say: str, feed: str) -> Part:
        """The value of property ``name``, after ``say`` (said) and ``feed`` (given)."""
        assert self.tool is not None
        if name in self.optional:
            self.optional.remove(name)
        self.property, self.first = name, False
        spec = (self.tool.parameters.get("properties") or {})[name]
        kind = spec.get("type")
        self.value, self.steps = "", 0
        if kind == "string" and self.said is not None and grounding.names(name, spec):
            self.state = Step.COPY  # (the first token the model's own: _copying)
            return Part(say + '"', feed + '"', 1, stop=self.vocab.quotes)
        if kind == "string":
            self.state = Step.STRING
            allowed = self._pieces(spec["enum"]) | self.vocab.quotes if "enum" in spec else None  # (a few values: encoded each time, never cached per client)
            return Part(say + '"', feed + '"', STRING_TOKENS, allowed, self.vocab.quotes)
        if kind == "boolean":
            self.state = Step.BOOLEAN
            return Part(say, feed, 1, allowed=self.vocab.booleans)
        self.state = Step.NUMBER
        return Part(say, feed, NUMBER_TOKENS, allowed=self.vocab.digits | self.vocab.ends, stop=self.vocab.ends)

    def _copying(self, text: str, stop: int | None, last: int | None) -> Part | None:
        """A step of a value copied from what was said (``names``): after the model's first token,
        each token held to what goes on toward a span said, the value closed where one ends (its
        spelling as said streams out). A first token that begins nothing said: the model's own
        value, written on as any string (``STRING_TOKENS`` in all)."""
        assert self.said is not None
        if stop is not None:  # the model closed it
            again = self._before_quote(stop)
            value = self.value + text + again
            return self._next(_string(self.said.spelled(value.strip()) or value) + '"', again + '"')
        again = self._piece(last)
        self.value += text
        self.steps += 1
        going = self.said.after(self.value.lstrip())
        if not going and self.steps == 1:  # the model's own value
            self.state = Step.STRING
            return Part("", again, STRING_TOKENS - 1, stop=self.vocab.quotes)
        if not going or self.steps >= STRING_TOKENS:  # (a span left behind cannot be: at the cap, closed)
            return self._next(_string(self.said.spelled(self.value.strip()) or self.value) + '"', again + '"')
        done = self.value.lstrip().lower()
        allowed: set[int] = set(self.vocab.closing) if done in self.said.spans else set()
        for span in going:  # (what goes on in the spelling said: the engine holds the words as the user said them)
            rest = span[len(done) :]
            allowed.update(t for k in range(1, min(len(rest), 24) + 1) if (t := self.vocab.pieces.get(rest[:k])) is not None)
        return Part("", again, 1, allowed=frozenset(allowed), stop=self.vocab.quotes)

    def _number(self, text: str) -> str:
        """The number written, or null where the model wrote none (the schema check and the
        grounding see that)."""
        assert self.tool is not None
        kind = ((self.tool.parameters.get("properties") or {})[self.property]).get("type")
        try:
            value = float(text)
        except ValueError:
            return "null"
        if not math.isfinite(value) or kind == "integer" and not (value.is_integer() and "." not in text):
            return "null"
        return text

    def _next(self, say: str, feed: str) -> Part:
        """A value ended: ``say`` ends it in what streams out, ``feed`` in what the engine is given."""
        return _said_as(self._property(feed), feed, say)

    def _close(self, before: str) -> Part:
        end = before + "}}\n" + CLOSE
        if not self.parallel:
            self.state = Step.DONE
            return Part(end)
        self.state = Step.NEXT
        return Part(end, end + "\n", 1, allowed=frozenset({self.vocab.call}) | self.vocab.eos)

    # ------------------------------------------------------------------ tokens

    def _piece(self, token: int | None) -> str:
        return "" if token is None else str(self.tokenizer.decode([token]))

    def _before_quote(self, stop: int | None) -> str:
        """The stop token's text before its quote (or control character): ``."`` ends "8 pm."."""
        piece = self._piece(stop)
        for i, ch in enumerate(piece):
            if ch == '"' or ch < " ":
                return piece[:i]
        return piece

    def _pieces(self, values: Sequence[str]) -> frozenset[int]:
        return frozenset(t for v in values for t in self.tokenizer.encode(v, add_special_tokens=False))


# what follows the end of a part, by the step it wrote (``CallWriter.ended``)
MOVES: dict[Step, Callable[[CallWriter, str, int | None, int | None], Part | None]] = {
    Step.SPEECH: CallWriter._after_speech,
    Step.NEXT: CallWriter._after_call,
    Step.NAME: CallWriter._naming,
    Step.STRING: CallWriter._after_string,
    Step.COPY: CallWriter._copying,
    Step.NUMBER: CallWriter._after_number,
    Step.BOOLEAN: CallWriter._after_boolean,
    Step.MORE: CallWriter._after_more,
    Step.KEY: CallWriter._after_key,
}
