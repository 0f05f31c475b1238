"""The thinker's prompt for a response: the conversation, the tools offered, and what ``tool_choice``
forces the answer to begin with. The history is rendered the same way every turn, byte for byte,
so the engine's prefix cache reuses it (pipelines/cascade/thinker.py renders the chat template)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelines.base import FunctionCall, FunctionResult, Message, ResponseRequest, Tool
from pipelines.cascade.thinker import Turn
from pipelines.cascade.tools import forced_start, tool_specs


class Prompts:
    """``thinker`` renders (``Thinker``/``RemoteThinker``); ``tools``: whether it has a tool format
    (read at each call: it is known once the thinker has started); ``tools_after_output``: see
    ``CascadeOptions``."""

    def __init__(self, thinker: Any, tools: Callable[[], bool], tools_after_output: bool) -> None:
        self.thinker = thinker
        self.tools = tools
        self.tools_after_output = tools_after_output

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

    def prefix(self, request: ResponseRequest) -> list[int]:
        """Where the open turn's words go in its prompt: the conversation so far and the tools offered."""
        return list(self.thinker.prefix(request.instructions, self.turns(request, {}), tool_specs(self.offered(request))))

    def offered(self, request: ResponseRequest) -> list[Tool]:
        if not self.tools() or request.tool_choice == "none":
            return []  # ("none": a small thinker shown tools calls them anyway)
        answering = bool(request.items) and isinstance(request.items[-1], FunctionResult)
        if answering and request.tool_choice == "auto" and not self.tools_after_output:
            return []  # the answer to a tool's output, in words (``CascadeOptions.tools_after_output``)
        return list(request.tools)

    def words(self, request: ResponseRequest, pending: str | None = None, known: dict[str, str] | None = None) -> str:
        """Everything said in the conversation (the instructions, its turns, tool outputs, and
        ``pending``, the open turn's words), where the values of a call must come from
        (grounding.py); the tools' own descriptions are not in it."""
        texts = [request.instructions, *(t.text for t in self.turns(request, known or {})), pending or ""]
        return "\n".join(t for t in texts if t)

    def prompt(self, request: ResponseRequest, pending: str | None = None, known: dict[str, str] | None = None, tools: bool = True) -> list[int]:
        """The prompt: the conversation (``pending``: the open turn's words), the tools offered, and
        what ``tool_choice`` forces the answer to begin with. ``tools=False``: none offered (an
        answer in words, as ``tool_choice: "none"`` gets)."""
        turns = self.turns(request, known or {})
        if pending is not None and pending.strip():
            turns.append(Turn("user", " ".join(pending.split())))
        thinker, offered = self.thinker, self.offered(request) if tools else []
        ids = list(thinker.render(request.instructions, turns, tools=tool_specs(offered)))
        forced = forced_start(request.tool_choice, offered)
        return ids + list(thinker.tokenizer.encode(forced, add_special_tokens=False)) if forced else ids
