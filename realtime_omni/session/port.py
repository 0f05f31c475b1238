"""``Port``: all a response may do to its session (``responses.SessionPort`` is the one it gets)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from pipelines.base import Capabilities, FunctionCall, Message, OutputChunk, ResponseRequest

from ..protocol import events as ev
from .conversation import Alignment, Conversation
from .draft import Weight
from .mcp import McpItem, McpServers


class Port(Protocol):
    """All a response may do to its session."""

    caps: Capabilities
    conversation: Conversation  # read, and (in-band) items added through ``add_item``
    timing_metadata: bool

    async def emit(self, event: Any, owner: Any = None, weight: Weight | None = None) -> bool:
        """Queue an event; False when it was not queued (the owner was muted, the session closed)."""

    def purge(self, owner: Any) -> list[Weight]:
        """Drop the owner's events still queued; the weights of what was dropped."""

    mcp: McpServers  # the session's MCP servers: a response runs their tools' calls

    def add_item(self, item: Message | FunctionCall | McpItem, alignment: Alignment | None = None) -> str | None:
        """Add an item to the conversation; its previous item's id."""

    def rate_limits(self) -> ev.RateLimitsUpdated: ...

    def again(self, request: ResponseRequest, output: Sequence[object], in_band: bool) -> ResponseRequest:
        """``request`` asked again, its history holding the response's output so far (its MCP calls' outputs)."""

    def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        """The pipeline's answer to ``request``."""
