"""Conversation items: adding one (whoever adds it), and the client's create, retrieve, delete and
truncate.

A part of the session (see session.py): the items live in ``Conversation`` (conversation.py); this
part says what adding, removing and cutting one means on the wire. Truncating the answer still
being generated cancels its response: this part reads the runs, and starts none.
"""

from __future__ import annotations

from typing import Any

from pipelines.base import ContextItem, FunctionCall, Message

from ..errors import RealtimeError, invalid_value
from ..protocol import events as ev
from ..protocol.audio import ms_to_samples
from .context import SessionContext
from .conversation import Alignment, Conversation, Item, from_wire, to_wire
from .mcp import McpApprovalRequest, McpApprovalResponse
from .run import Runs
from .transcription import Transcriber


class Items:
    def __init__(self, ctx: SessionContext, conversation: Conversation, transcriber: Transcriber, runs: Runs) -> None:
        self.ctx = ctx
        self.conversation = conversation
        self.transcriber = transcriber
        self.runs = runs

    def add(self, item: ContextItem | Item, alignment: Alignment | None = None, previous_item_id: str | None = None) -> str | None:
        """Add an item; the id of the item before it. Items evicted to stay within the
        conversation's bounds are announced as deleted."""
        previous, evicted = self.conversation.add(item, previous_item_id)
        if alignment is not None:
            self.conversation.alignment[item.id] = alignment
        for item_id in evicted:
            self.ctx.tasks.spawn(self.ctx.emit(ev.ConversationItemDeleted(item_id=item_id)), "evict")
        return previous

    # ------------------------------------------------------------------ client events

    async def on_create(self, e: ev.ConversationItemCreate) -> Item:
        ctx, cfg = self.ctx, self.ctx.config
        item = from_wire(e.item, ctx.caps, cfg.input_format, cfg.output_format)
        if isinstance(item, McpApprovalResponse):
            self._check_approval(item)
        previous = self.add(item, previous_item_id=e.previous_item_id)
        wire = to_wire(item, ctx.caps)
        await ctx.emit(ev.ConversationItemAdded(previous_item_id=previous, item=wire))
        await ctx.emit(ev.ConversationItemDone(previous_item_id=previous, item=wire))
        if isinstance(item, Message) and item.role == "user":
            self.transcriber.transcribe(item)
        return item

    def _check_approval(self, item: McpApprovalResponse) -> None:
        """An approval answers a request of this conversation, once."""
        request = self.conversation.get(item.approval_request_id)
        if not isinstance(request, McpApprovalRequest):
            raise invalid_value("item.approval_request_id", f"Invalid 'item.approval_request_id': no MCP approval request with id {item.approval_request_id!r}.")
        if any(isinstance(i, McpApprovalResponse) and i.approval_request_id == request.id for i in self.conversation):
            raise invalid_value("item.approval_request_id", f"Invalid 'item.approval_request_id': the request {request.id!r} was already answered.")

    def _item(self, item_id: str, verb: str) -> Message | FunctionCall | Any:
        item = self.conversation.get(item_id)
        if item is None:
            raise RealtimeError(
                f"Invalid 'item_id': no item with id {item_id!r} in the conversation.", code=f"item_{verb}_invalid_item_id", param="item_id"
            )
        return item

    async def on_retrieve(self, e: ev.ConversationItemRetrieve) -> None:
        item = self._item(e.item_id, "retrieve")
        cfg = self.ctx.config
        await self.ctx.emit(ev.ConversationItemRetrieved(item=to_wire(item, self.ctx.caps, (cfg.input_format, cfg.output_format))))

    async def on_delete(self, e: ev.ConversationItemDelete) -> None:
        self._item(e.item_id, "delete")
        self.conversation.delete(e.item_id)
        await self.ctx.emit(ev.ConversationItemDeleted(item_id=e.item_id))

    async def on_truncate(self, e: ev.ConversationItemTruncate) -> None:
        item = self._item(e.item_id, "truncate")
        if not (isinstance(item, Message) and item.role == "assistant"):
            raise invalid_value("item_id", "Invalid 'item_id': only assistant messages with audio can be truncated.")
        if e.content_index >= len(item.parts) or item.parts[e.content_index].kind != "audio":
            raise invalid_value("content_index", f"Invalid 'content_index': part {e.content_index} of this item is not audio.")
        active = self.runs.active
        if active is not None and item in active.output and item.status == "in_progress":
            await active.cancel("client_cancelled")  # the client stopped playing it
        part = item.parts[e.content_index]
        if part.audio is None:
            raise invalid_value("item_id", "Invalid 'item_id': this item's audio is no longer retained.")
        rate = self.ctx.caps.output_rate
        total = len(part.audio)
        end = ms_to_samples(e.audio_end_ms, rate)
        if end > total + rate // 1000:
            raise invalid_value(
                "audio_end_ms",
                f"Invalid 'audio_end_ms': {e.audio_end_ms} ms is past the end of the item's audio ({total * 1000 // rate} ms).",
            )
        self.conversation.truncate(item, e.content_index, end)
        await self.ctx.emit(ev.ConversationItemTruncated(item_id=item.id, content_index=e.content_index, audio_end_ms=e.audio_end_ms))
