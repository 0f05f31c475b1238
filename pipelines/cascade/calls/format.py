"""Function calling for a chat model that writes its calls as text (Hermes style, Qwen2.5's format):

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One parser for every engine that streams such text (the cascade's in-process and remote Thinker):
the prompt is rendered here with the model's own chat template (its ``tools=`` and its ``tool``
role), so vLLM's server-side tool parser never sees it.

* ``chat_messages``: the conversation's turns as the template's messages (a turn's calls as
  ``tool_calls``, a tool's output in the ``tool`` role), so a history with calls re-renders byte
  for byte as the model wrote it;
* ``forced_start``: what ``tool_choice`` "required" or a named function makes the answer start with
  (appended to the prompt: the model can only go on with a call);
* ``call_schema`` / ``parameters``: the JSON schemas the engine holds a call to as it is written
  (vLLM's structured outputs): a call of the tools offered when the client forces one, else the
  arguments of the tool the model named, so that a call's arguments always fit its tool's schema;
* ``CallParser``: streamed text -> the spoken text before a call (``Said``) and each call as it is
  written (``CallStarted``, its arguments' ``ArgumentsDelta``s, ``CallEnded``); the call itself is
  never spoken;
* ``SpokenLimit``: the Thinker's sentence cut, counting only the spoken text (a call may follow its
  preamble whatever its length), and stopping after the first call unless calls may be parallel;
* ``ToolStream``: one answer's text split in two streams, the speech (before the first call) for the
  talker, and the calls after it, as ``ToolCallDelta`` / ``ToolCall`` output chunks; where the
  engine can hold a call to its schema, the call's arguments are written by a request that does
  (``constrain``), from the moment the model has named a tool offered.

Where the engine does not hold a call to its schema (``CallOptions.constrain``), arguments
that break it (or are not JSON at all) are still emitted, as OpenAI does for a tool without
``strict``: the client sees what the model wrote and answers with an error output if it must.
``schema_errors`` says what is wrong, for logs, counts and the tool bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from pipelines.base import Tool, ToolCall, ToolCallDelta
from pipelines.cascade.calls.grounding import ungrounded
from pipelines.sentences import SentenceLimit

OPEN, CLOSE = "<tool_call>", "</tool_call>"

# the head of a call, up to where its arguments' JSON begins (the template's key order: name first)
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def tool_specs(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """``tools`` as chat templates take them (OpenAI's chat-completions shape)."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters or {"type": "object", "properties": {}}}}
        for t in tools
    ]


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders ``tools`` and ``tool_calls`` (Qwen2.5, Hermes)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tool_call" in template and "tools" in template


def token_texts(tokenizer: Any) -> list[str]:
    """Every token's text, by id (what the sets of tokens below are read from)."""
    return [tokenizer.decode([i]) for i in range(len(tokenizer))]


def call_start_ids(tokenizer: Any, texts: Sequence[str]) -> frozenset[int]:
    """Every token that could begin a call (``CallParser``'s starts: "{", a "`" fence, the
    ``<tool_call>`` tag): banned from an answer that must be said in words. ``texts``: the
    tokens' (``token_texts``)."""
    ids = {i for i, text in enumerate(texts) if any(ch in text for ch in "{`")}
    tag = tokenizer.convert_tokens_to_ids(OPEN)
    if isinstance(tag, int) and tag != getattr(tokenizer, "unk_token_id", None):
        ids.add(tag)
    return frozenset(ids)


def call_arguments(arguments: str) -> Any:
    """A call's arguments as the template renders them (it writes them with ``tojson``): the
    parsed object, so that the history shows what the model wrote; text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def chat_messages(turns: Sequence[Any]) -> list[dict[str, Any]]:
    """Turns (``thinker.Turn``) as chat-template messages: an assistant turn with ``calls`` carries
    them as ``tool_calls`` (after what it said), a ``tool`` turn is a tool's output."""
    messages: list[dict[str, Any]] = []
    for t in turns:
        message: dict[str, Any] = {"role": t.role, "content": t.text}
        if t.calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": call_arguments(a)}} for n, a in t.calls]
        messages.append(message)
    return messages


def call_head(name: str) -> str:
    """A call's JSON up to its arguments, as the template writes it."""
    return '{"name": ' + json.dumps(name) + ', "arguments": '


def forced_start(tool_choice: str, tools: Sequence[Tool], constrained: bool = False) -> str:
    """The text the answer must begin with: "required" a call, a function name a call of it.
    ``constrained``: "required"'s call is held to ``call_schema`` from its start (the grammar
    chooses among the names)."""
    if not tools or tool_choice in ("auto", "none"):
        return ""
    if tool_choice == "required":  # (up to the name: a small model may go on in prose after the tag alone)
        return OPEN + "\n" + ("" if constrained else '{"name": "')
    return OPEN + "\n" + call_head(tool_choice)


async def name_probabilities(
    top_next: Callable[[list[int]], Awaitable[dict[int, float]]], encode: Callable[[str], list[int]], prompt: list[int], names: Sequence[str]
) -> dict[str, float]:
    """The model's own probability of each of ``names`` as the name of a call it begins after
    ``prompt`` (the template's ``<tool_call>\n{"name": "``). The names' tokens are walked as a
    trie, one engine step per node (``top_next``: the likeliest next tokens and their logprobs,
    the prompt's prefix cached, so each step prefills a few tokens), the nodes of one depth at
    once; a token outside a step's top candidates makes its name improbable (0)."""
    head = OPEN + "\n" + '{"name": "'
    base = encode(head)
    lead: dict[str, list[int]] = {}  # each name's text's tokens as far as they are the head's
    rest: dict[str, list[int]] = {}  # and from there on: the tokens the model chooses
    for name in names:
        ids = encode(head + name)
        common = next((i for i, (a, b) in enumerate(zip(base, ids)) if a != b), min(len(base), len(ids)))
        lead[name], rest[name] = ids[:common], ids[common:]
    logprob = dict.fromkeys(names, 0.0)
    depth = 0
    while live := [n for n in names if depth < len(rest[n]) and logprob[n] > -math.inf]:
        node = {n: tuple(lead[n] + rest[n][:depth]) for n in live}
        keys = sorted(set(node.values()))
        tops = dict(zip(keys, await asyncio.gather(*(top_next(prompt + list(k)) for k in keys))))
        for n in live:
            step = tops[node[n]].get(rest[n][depth])
            logprob[n] = logprob[n] + step if step is not None else -math.inf
        depth += 1
    return {n: math.exp(lp) for n, lp in logprob.items()}


def parameters(tool: Tool) -> dict[str, Any]:
    """A tool's arguments' JSON schema (an object of nothing where it gave none)."""
    return tool.parameters or {"type": "object", "properties": {}}


def call_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    """The JSON schema of one call, as the template writes it after ``<tool_call>``:
    ``{"name": ..., "arguments": {...}}`` of one of ``tools``, its arguments held to that tool's
    ``parameters`` (the name first: the engine keeps the properties' order)."""
    calls = [
        {"type": "object", "properties": {"name": {"const": t.name}, "arguments": parameters(t)}, "required": ["name", "arguments"], "additionalProperties": False}
        for t in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def forced_schema(tool_choice: str, tools: Sequence[Tool]) -> dict[str, Any]:
    """What a forced answer (``forced_start``'s, constrained) is held to: "required", a call of any
    of ``tools``; a named function, its arguments (the prompt wrote its name)."""
    if tool_choice == "required":
        return call_schema(tools)
    return parameters(next(t for t in tools if t.name == tool_choice))


def schema_errors(arguments: str, tool: Tool | None) -> list[str]:
    """What is wrong with a call's arguments against its tool's JSON schema (empty: nothing)."""
    if tool is None:
        return ["no such tool"]
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return [f"not JSON ({exc})"]
    schema = tool.parameters or {"type": "object"}
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - installed with the cpu extra
        return [] if isinstance(value, dict) else ["not an object"]
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        return [e.message for e in validator.iter_errors(value)]
    except jsonschema.SchemaError as exc:
        return [f"the tool's schema is invalid ({exc.message})"]


# ---------------------------------------------------------------------------------------------
# Parsing the streamed text
# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Said:
    text: str


@dataclass(slots=True)
class CallStarted:
    call_id: str
    name: str


@dataclass(slots=True)
class ArgumentsDelta:
    call_id: str
    delta: str


@dataclass(slots=True)
class CallEnded:
    call_id: str
    name: str
    arguments: str
    complete: bool  # the model closed its arguments (False: cut off, at the token budget)


Event = Union[Said, CallStarted, ArgumentsDelta, CallEnded]


def _held(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class _Json:
    """Where a JSON value written character by character ends (strings and nesting followed)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False
        self.scalar = False
        self.done = False

    def feed(self, text: str) -> int:
        """Characters of ``text`` that belong to the value (all of them unless it ended)."""
        for i, ch in enumerate(text):
            if not self.started:
                if ch.isspace():
                    continue
                self.started = True
                self.scalar = ch not in '{["'
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        self.done = True
                        return i + 1
                continue
            if self.scalar:
                if ch in ",}]" or ch.isspace():
                    self.done = True
                    return i
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


def _bare_start(text: str) -> str | None:
    """Whether ``text`` (beginning at a "{" or a "`") opens a call written without its tags, as small
    models often write one: a JSON object whose first key is "name", alone or in a ```json fence.
    "call", "text", or None: not known yet."""
    s = text
    if s.startswith("`"):
        if not s.startswith("```"):
            return None if "```".startswith(s) else "text"
        line = s.find("\n")
        if line < 0:
            return None if len(s) < 12 else "text"
        s = s[line + 1 :].lstrip()
        if not s:
            return None
    if not s.startswith("{"):
        return "text"
    rest = s[1:].lstrip()
    if rest.startswith('"name"'):
        return "call"
    return None if '"name"'.startswith(rest) else "text"


class CallParser:
    """Streamed answer text -> events. Text before a call is said (a call's start split across
    deltas is held back until it is known); a call's name is known from its head and its arguments
    stream as written; text after the first call is never said. A call is the template's
    ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, or that JSON object without the
    tags, alone or in a ```json fence (how Qwen2.5-Coder-0.5B mostly writes it). ``prefix``: text
    the prompt forced the answer to begin with (``forced_start``), parsed as if the model wrote it."""

    def __init__(self, prefix: str = "", new_id: Any = None) -> None:
        self._new_id = new_id or (lambda: "call_" + secrets.token_hex(12))
        self._buffer = ""
        self._in_call = False
        self._tagged = False  # the call began with <tool_call> (else: a bare or fenced JSON object)
        self._call_id = ""
        self._name: str | None = None
        self._args = ""
        self._json: _Json | None = None
        self.calls = 0  # calls ended so far
        self.spoke = True  # still before the first call: text is said
        self.trailing = 0  # characters of text after a call (never said): the model is done calling
        self._pending: list[Event] = []
        self._pending = self.feed(prefix) if prefix else []

    def feed(self, text: str) -> list[Event]:
        events, self._pending = self._pending, []
        self._buffer += text
        while self._buffer:
            before = len(self._buffer), self._in_call
            events += self._call() if self._in_call else self._text()
            if (len(self._buffer), self._in_call) == before:
                break  # waiting for more text
        return events

    def _say(self, text: str) -> list[Event]:
        if not self.spoke:
            self.trailing += len(text.strip())
        return [Said(text)] if text and self.spoke else []

    def _text(self) -> list[Event]:
        buf = self._buffer
        tag = buf.find(OPEN)
        bare = next((i for i, ch in enumerate(buf) if ch in "{`"), -1)
        if bare >= 0 and (tag < 0 or bare < tag):
            verdict = _bare_start(buf[bare:])
            if verdict == "text":
                said, self._buffer = buf[: bare + 1], buf[bare + 1 :]
                return self._say(said)
            said, self._buffer = buf[:bare], buf[bare:]
            if verdict is None:
                return self._say(said)  # the rest waits
            self._buffer = self._buffer[self._buffer.index("{") :]
            return self._say(said) + self._begin(tagged=False)
        if tag < 0:
            keep = _held(buf, OPEN)
            said, self._buffer = buf[: len(buf) - keep], buf[len(buf) - keep :]
            return self._say(said)
        said, self._buffer = buf[:tag], buf[tag + len(OPEN) :]
        return self._say(said) + self._begin(tagged=True)

    def _begin(self, tagged: bool) -> list[Event]:
        self._in_call, self._tagged, self.spoke = True, tagged, False
        self._call_id, self._name, self._args, self._json = self._new_id(), None, "", None
        return []

    def _call(self) -> list[Event]:
        events: list[Event] = []
        if self._name is None:
            m = _HEAD.match(self._buffer)
            if m is None or m.end() == len(self._buffer):  # the head, and a character after it, not yet written
                span = self._closing()
                return self._whole(*span) if span is not None else []
            self._name = json.loads(f'"{m.group(1)}"')
            self._buffer = self._buffer[m.end() :]
            self._json = _Json()
            events.append(CallStarted(self._call_id, self._name))
        assert self._json is not None
        if not self._json.done:
            n = self._json.feed(self._buffer)
            part, self._buffer = self._buffer[:n], self._buffer[n:]
            if part:
                self._args += part
                events.append(ArgumentsDelta(self._call_id, part))
            if self._json.done:
                events.append(self._end(complete=True))
            return events
        close = self._buffer.find(CLOSE) if self._tagged else -1
        another = re.match(r"\s*\}\s*,", self._buffer)  # "}, {" : another call follows, whatever the tags
        if close >= 0 and (another is None or another.end() > close):  # the call's closing "}" and tag
            self._buffer = self._buffer[close + len(CLOSE) :]
            self._in_call = False
        elif self._tagged:
            if another is not None:
                self._buffer = self._buffer[another.end() :]
                self._in_call = False
        else:  # the object's closing "}", and a fence's end if there is one
            m = re.match(r"\s*\}(\s*```|\s*,)?", self._buffer)  # (a comma: another call follows)
            if m is not None and (m.group(1) or len(self._buffer) - m.end() >= 3 or "```".find(self._buffer[m.end() :].lstrip()) != 0):
                self._buffer = self._buffer[m.end() :]
                self._in_call = False
            elif self._buffer.strip() and not self._buffer.lstrip().startswith("}"):
                self._in_call = False  # not the end of a call after all: left unsaid
        return events

    def rewrite_arguments(self) -> None:
        """The open call's arguments are written again from their start (by a request held to its
        tool's schema): what was written of them is dropped; its ``ArgumentsDelta``s, the caller's."""
        assert self._in_call and self._name is not None
        self._buffer, self._args, self._json = "", "", _Json()

    def _closing(self) -> tuple[int, int] | None:
        """Where a call whose head did not stream ends: (its body's end, the text's resumption)."""
        if self._tagged:
            close = self._buffer.find(CLOSE)
            return None if close < 0 else (close, close + len(CLOSE))
        state = _Json()
        n = state.feed(self._buffer)
        return (n, n) if state.done else None

    def _whole(self, end: int, resume: int) -> list[Event]:
        """A call whose head the streaming path does not know (keys in another order): parsed whole."""
        body, self._buffer = self._buffer[:end], self._buffer[resume:]
        self._in_call = False
        try:
            call = json.loads(body)
            name = call["name"]
            arguments = call.get("arguments", call.get("parameters", {}))
        except (ValueError, KeyError, TypeError):
            return []  # not a call anyone could make: dropped
        if not isinstance(name, str):
            return []
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        self.calls += 1
        return [CallStarted(self._call_id, name), ArgumentsDelta(self._call_id, args), CallEnded(self._call_id, name, args, True)]

    def _end(self, complete: bool) -> CallEnded:
        self.calls += 1
        assert self._name is not None
        return CallEnded(self._call_id, self._name, self._args, complete)

    def finish(self) -> list[Event]:
        """The stream ended: held text is said, a call cut off mid-arguments ends as written."""
        events = self.feed("")
        if not self._in_call:
            events += self._say(self._buffer)
        elif self._name is not None and self._json is not None and not self._json.done:
            events.append(self._end(complete=False))
        elif self._name is None and self._buffer.strip():
            events += self._whole(len(self._buffer), len(self._buffer))
        self._buffer = ""
        return events


class SpokenLimit:
    """The Thinker's cut (``sentences.SentenceLimit``'s interface) for an answer that may call tools:
    ``most`` sentences of spoken text, none counted inside a call; and, unless ``parallel``, done
    at the end of the first call."""

    def __init__(self, most: int, parallel: bool, prefix: str = "") -> None:
        self.sentences = SentenceLimit(most)
        self.parser = CallParser(prefix)
        self.parallel = parallel
        self.done = False

    def finishing(self) -> None:
        """End at the end of the sentence under way."""
        self.sentences.finishing()

    def __call__(self, delta: str) -> str:
        for event in self.parser.feed(delta):
            if isinstance(event, Said):
                self.sentences(event.text)
                if self.sentences.done:
                    self.done = True  # (the part of the delta after the sentence's end is said by no one)
            elif isinstance(event, CallEnded) and not self.parallel:
                self.done = True
        if self.parser.calls and self.parser.trailing:  # talking after its calls: no more calls
            self.done = True
        return delta


# ---------------------------------------------------------------------------------------------
# One answer: its speech, then its calls
# ---------------------------------------------------------------------------------------------


async def _aclose(deltas: AsyncIterator[str]) -> None:
    """Close a stream of deltas (aborting its engine request), whatever it raises on the way."""
    with contextlib.suppress(Exception):
        await deltas.aclose()  # type: ignore[attr-defined]


class ToolStream:
    """An answer's text deltas split in two: ``speech()`` yields what is said before the first call
    and ends where the first call begins (so the talker finishes the preamble while the call is
    still being written); ``calls()`` then yields each call's output chunks as they are written.
    The text after ``speech`` ends is read by a task of its own; ``close`` ends it (aborting the
    engine request), and is safe to call twice.

    ``constrain``: where the engine can hold a call to its schema, (the text said before the call,
    the tool's name) -> the call's arguments' text, written by a request that holds them to that
    tool's schema (for the prompt, what was said and the call's head). When the model has named a
    tool offered, its request is closed and the arguments are read from that one instead (what it
    wrote of them dropped). The model chooses the tool: a call of one not offered is dropped as
    without ``constrain``. One call: the grammar ends the answer at its arguments' end."""

    QUEUE = 256  # chunks of calls read ahead of the consumer (a call's arguments are short)

    def __init__(
        self,
        deltas: AsyncIterator[str],
        tools: Sequence[Tool],
        prefix: str = "",
        parallel: bool = True,
        words: str | None = None,
        constrain: Callable[[str, str], AsyncIterator[str]] | None = None,
        fits: Callable[[Tool, str], Awaitable[list[str]]] | None = None,
    ) -> None:
        self._deltas = deltas
        self._constrain = constrain
        self._words = words  # the conversation's words: a call whose values are not in them is dropped (grounding.py)
        self._fits = fits  # with words: (tool, arguments) -> the values the thinker does not read as their parameter's (grounding.misfits)
        self._tools = {t.name: t for t in tools}
        self._parser = CallParser(prefix)
        self._parallel = parallel
        self._queue: asyncio.Queue[Any] = asyncio.Queue(self.QUEUE)
        self._reader: asyncio.Task[None] | None = None
        self._said = False
        self._closing: asyncio.Future[None] | None = None  # the first request's close, once the arguments come from another
        self.ended: list[CallEnded] = []  # the calls made, for accounting (``schema_errors``)
        self.unknown: list[str] = []  # names of tools not offered that the model called anyway
        self.ungrounded: list[tuple[str, list[str]]] = []  # calls dropped for values nobody said: (name, values)
        self.misfits: list[tuple[str, list[str]]] = []  # calls dropped for values said but not such a thing (``fits``)
        self.made = 0  # calls given to the client
        self._dropped: set[str] = set()
        self._held: dict[str, list[ToolCallDelta]] = {}  # with ``words``: a call's chunks until its values are checked

    async def _batches(self) -> AsyncGenerator[list[Event], None]:
        """The parser's events, a list per delta of text; with ``constrain``, from the head of the
        first call of a tool offered, the arguments from the request that holds them to its schema."""
        said: list[str] = []
        while True:
            switch: CallStarted | None = None
            async for delta in self._deltas:
                batch: list[Event] = []
                for event in self._parser.feed(delta):
                    if isinstance(event, Said):
                        said.append(event.text)
                    if switch is None:  # (after it, the arguments this request wrote are dropped)
                        batch.append(event)
                        if self._constrain is not None and isinstance(event, CallStarted) and event.name in self._tools:
                            switch = event
                yield batch
                if switch is not None:
                    break
            else:
                yield self._parser.finish()
                return
            assert self._constrain is not None
            first, self._deltas = self._deltas, self._constrain("".join(said), switch.name)
            self._constrain = None
            self._parser.rewrite_arguments()
            # (closed beside the second request's start: its abort need not reach the engine first)
            self._closing = asyncio.ensure_future(_aclose(first))

    async def speech(self) -> AsyncIterator[str]:
        batches = self._batches()
        try:
            async for batch in batches:
                for event in batch:
                    if isinstance(event, Said):
                        yield event.text
                    else:
                        await self._put(await self._chunk(event))
                if not self._parser.spoke:
                    break
            else:
                await self._queue.put(None)
                return
        except BaseException:
            with contextlib.suppress(Exception):
                await batches.aclose()
            await self.close()
            raise
        self._reader = asyncio.ensure_future(self._read_calls(batches))

    def _read_enough(self) -> bool:
        """Whether the rest of the answer is of no use: its calls are done, or it began with a call
        of a tool not offered (nothing said, no call made: the answer is said in words instead, and
        the sooner the better; measured, writing out such a call's arguments delayed that answer
        by ~0.6 s on two cores)."""
        if self._parser.calls and (not self._parallel or self._parser.trailing):
            return True
        return bool(self.unknown) and not self.made and not self._held and not self.ended

    async def _read_calls(self, batches: AsyncGenerator[list[Event], None]) -> None:
        try:
            if not self._read_enough():
                async for batch in batches:
                    for event in batch:
                        if not isinstance(event, Said):
                            await self._put(await self._chunk(event))
                    if self._read_enough():
                        break
        except Exception as exc:
            await self._queue.put(exc)
        finally:
            with contextlib.suppress(Exception):
                await batches.aclose()
            await _aclose(self._deltas)
        await self._queue.put(None)

    async def _put(self, chunks: list[Any]) -> None:
        for chunk in chunks:
            if isinstance(chunk, ToolCall):
                self.made += 1
            await self._queue.put(chunk)

    async def _chunk(self, event: Event) -> list[Any]:
        """The output chunks of a call's event: none for a call of a tool not offered (dropped:
        OpenAI calls only the functions it was given). With ``words``, a call's chunks are held
        until its arguments are whole and go out only if its values were said (``grounding.py``);
        the client acts on a call once it is done, so holding its deltas costs it nothing."""
        if isinstance(event, CallStarted) and event.name not in self._tools:
            self.unknown.append(event.name)
            self._dropped.add(event.call_id)
        if event.call_id in self._dropped:  # type: ignore[union-attr]
            return []
        if isinstance(event, CallStarted):
            chunk = ToolCallDelta(event.call_id, event.name, "")
        elif isinstance(event, ArgumentsDelta):
            chunk = ToolCallDelta(event.call_id, "", event.delta)
        else:
            assert isinstance(event, CallEnded)
            self.ended.append(event)
            held = self._held.pop(event.call_id, [])
            tool = self._tools[event.name]
            missing = ungrounded(event.arguments, tool.parameters, self._words) if self._words is not None else []
            if missing:
                self.ungrounded.append((event.name, missing))
                return []
            unfit = await self._fits(tool, event.arguments) if self._words is not None and self._fits is not None else []
            if unfit:
                self.misfits.append((event.name, unfit))
                return []
            return [*held, ToolCall(event.call_id, event.name, event.arguments)]
        if self._words is None:
            return [chunk]
        self._held.setdefault(event.call_id, []).append(chunk)
        return []

    async def calls(self) -> AsyncIterator[ToolCall | ToolCallDelta]:
        """The calls' chunks, after ``speech`` ended; the one call only, unless ``parallel``."""
        ended = 0
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if ended and not self._parallel:
                continue  # (read no further; the reader stops at the first call's end)
            if isinstance(item, ToolCall):
                ended += 1
            yield item

    @property
    def refused(self) -> list[tuple[str, list[str]]]:
        """The calls dropped for their values: nobody said them, or said them as something else."""
        return self.ungrounded + self.misfits

    def errors(self, call: CallEnded) -> list[str]:
        return schema_errors(call.arguments, self._tools.get(call.name))

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        await _aclose(self._deltas)
        if self._closing is not None:
            await asyncio.shield(self._closing)
