"""The thinker's prompt for a response: the conversation, the tools offered, and what ``tool_choice``
forces the answer to begin with. The history is rendered the same way every turn, byte for byte,
so the engine's prefix cache reuses it (pipelines/cascade/thinker.py renders the chat template)."""

from __future__ import annotations

from collections.abc import Callable

from pipelines.base import FunctionCall, FunctionResult, Message, ResponseRequest, Tool, ToolCall
from pipelines.cascade.call_policy import ToolContext
from pipelines.cascade.calls import grounding
from pipelines.cascade.thinker import Thinker, Turn
from pipelines.cascade.calls.format import forced_start, tool_specs


class Prompts:
    """``thinker`` renders; ``tools``: whether it has a tool format
    (read at each call: it is known once the thinker has started); ``tools_after_output``: see
    ``CascadeOptions``."""

    def __init__(self, thinker: Thinker, tools: Callable[[], bool], tools_after_output: str | bool) -> None:
        self.thinker = thinker
        self.tools = tools
        # (true and false, its spellings before "shown": "offered" and "hidden")
        self.after_output = tools_after_output if isinstance(tools_after_output, str) else "offered" if tools_after_output else "hidden"

    def turns(self, request: ResponseRequest, known: dict[str, str]) -> list[Turn]:
        """The conversation as the thinker's turns; ``known``: transcripts of audio items by id."""
        turns: list[Turn] = []
        for item in request.items:
            if isinstance(item, Message):
                text = " ".join(known.get(item.id, "") if p.kind == "audio" and p.text is None else (p.text or "") for p in item.parts)
                text = " ".join(text.split())
                if text:
                    turns.append(Turn(item.role, text))
            elif not self.tools():  # a model without a tool format: the calls told in words
                if isinstance(item, FunctionCall):
                    turns.append(Turn("assistant", f"(calling {item.name} with {item.arguments})"))
                else:
                    turns.append(Turn("user", f"(the tool returned: {item.output})"))
            elif isinstance(item, FunctionCall) and item.status == "completed":  # (one cut off was never made)
                call = (item.name, item.arguments)
                if turns and turns[-1].role == "assistant":  # what it said before the call, then the call
                    turns[-1].calls += (call,)
                else:
                    turns.append(Turn("assistant", "", (call,)))
            elif isinstance(item, FunctionResult):
                turns.append(Turn("tool", item.output))
        return turns

    def output_prefix(self, request: ResponseRequest, known: dict[str, str], said: str, call: ToolCall) -> list[int] | None:
        """Where ``call``'s output will go in the answer to it: that answer's prompt (``request``
        asked again with what was ``said`` before the call, the call, and its output) up to the
        output. None unless that prompt hides the tools (``tools_after_output`` "hidden"): shown,
        it goes on from the call's own prompt, already in the cache."""
        if not self.tools() or self.after_output != "hidden":
            return None
        turns = [*self.turns(request, known), Turn("assistant", " ".join(said.split()), ((call.name, call.arguments),))]
        return list(self.thinker.prefix(request.instructions, turns, next_turn="tool"))

    def prefix(self, request: ResponseRequest) -> list[int]:
        """Where the open turn's words go in its prompt: the conversation so far and the tools shown."""
        return list(self.thinker.prefix(request.instructions, self.turns(request, {}), tool_specs(self.shown(request))))

    def shown(self, request: ResponseRequest) -> list[Tool]:
        """The tools in the prompt: those ``offered``, and in the answer to a tool's output the
        tools as before when ``tools_after_output`` is "shown" (the prompt then goes on from the
        cached conversation; ``offered`` says they may not be called)."""
        if not self.tools() or request.tool_choice == "none":
            return []  # ("none": a small thinker shown tools calls them anyway)
        if self.answering(request) and self.after_output == "hidden":
            return []
        return list(request.tools)

    def offered(self, request: ResponseRequest) -> list[Tool]:
        """The tools the answer may call."""
        if self.answering(request) and self.after_output != "offered":
            return []  # the answer to a tool's output, in words (``CascadeOptions.tools_after_output``)
        return self.shown(request)

    @staticmethod
    def answering(request: ResponseRequest) -> bool:
        """The answer to a tool's output, with tool_choice "auto"."""
        return bool(request.items) and isinstance(request.items[-1], FunctionResult) and request.tool_choice == "auto"

    def context(self, request: ResponseRequest, pending: str | None = None, known: dict[str, str] | None = None) -> ToolContext:
        """For an answer with tools offered: where a call's values must come from (``said``), and
        the prompt without the tools for an answer in words if its calls are dropped."""
        words, asked, before = self.said(request, pending, known)
        return ToolContext(words, asked, lambda: self.prompt(request, pending, known, tools=False), before)

    def said(self, request: ResponseRequest, pending: str | None = None, known: dict[str, str] | None = None) -> tuple[str, str, str]:
        """Everything said in the conversation (the instructions but their number words, its
        turns, tool outputs, and ``pending``, the open turn's words), where the values of a call
        must come from (calls/grounding.py; the tools' own descriptions are not in it), the user's
        last words (``pending``, else the last user turn's), and the agent's words before them (its
        last turn before those, "" if none)."""
        turns = self.turns(request, known or {})
        if pending is not None and pending.strip():
            last, earlier = pending, turns
        else:
            at = next((i for i in range(len(turns) - 1, -1, -1) if turns[i].role == "user"), -1)
            last, earlier = (turns[at].text, turns[:at]) if at >= 0 else ("", [])
        before = next((t.text for t in reversed(earlier) if t.role == "assistant" and t.text), "")
        texts = [grounding.instructions(request.instructions), *(t.text for t in turns), pending or ""]
        return "\n".join(t for t in texts if t), last, before

    def prompt(self, request: ResponseRequest, pending: str | None = None, known: dict[str, str] | None = None, tools: bool = True) -> list[int]:
        """The prompt: the conversation (``pending``: the open turn's words), the tools offered, and
        what ``tool_choice`` forces the answer to begin with. ``tools=False``: none offered (an
        answer in words, as ``tool_choice: "none"`` gets)."""
        turns = self.turns(request, known or {})
        if pending is not None and pending.strip():
            turns.append(Turn("user", " ".join(pending.split())))
        thinker, shown = self.thinker, self.shown(request) if tools else []
        ids = list(thinker.render(request.instructions, turns, tools=tool_specs(shown)))
        forced = forced_start(request.tool_choice, self.offered(request) if tools else [], thinker.options.calls.held)
        return ids + thinker.encode(forced) if forced else ids
