"""Conversation items: create, retrieve, delete, truncate; and what a cut of the paced audio
(barge-in, ``output_audio_buffer.clear``) does to the answer that was playing.

A part of ``Session`` (see session.py): the items live in ``Conversation`` (conversation.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pipelines.base import FunctionCall, Message

from ..errors import RealtimeError, invalid_value
from ..protocol import events as ev
from ..protocol.audio import ms_to_samples, samples_to_ms
from .conversation import from_wire, to_wire
from .playout import Cut

log = logging.getLogger(__name__)


class ItemHandling:
    async def _on_item_create(self, e: ev.ConversationItemCreate) -> None:
        cfg = self.config
        item = from_wire(e.item, self.caps, cfg.input_format, cfg.output_format)
        previous = self.add_item(item, previous_item_id=e.previous_item_id)
        wire = to_wire(item, self.caps)
        await self.emit(ev.ConversationItemAdded(previous_item_id=previous, item=wire))
        await self.emit(ev.ConversationItemDone(previous_item_id=previous, item=wire))
        if isinstance(item, Message) and item.role == "user":
            self._transcribe(item)

    def _item(self, item_id: str, verb: str) -> Message | FunctionCall | Any:
        item = self.conversation.get(item_id)
        if item is None:
            raise RealtimeError(
                f"Invalid 'item_id': no item with id {item_id!r} in the conversation.", code=f"item_{verb}_invalid_item_id", param="item_id"
            )
        return item

    async def _on_item_retrieve(self, e: ev.ConversationItemRetrieve) -> None:
        item = self._item(e.item_id, "retrieve")
        formats = (self.config.input_format, self.config.output_format)
        await self.emit(ev.ConversationItemRetrieved(item=to_wire(item, self.caps, formats)))

    async def _on_item_delete(self, e: ev.ConversationItemDelete) -> None:
        self._item(e.item_id, "delete")
        self.conversation.delete(e.item_id)
        await self.emit(ev.ConversationItemDeleted(item_id=e.item_id))

    async def _on_item_truncate(self, e: ev.ConversationItemTruncate) -> None:
        item = self._item(e.item_id, "truncate")
        if not (isinstance(item, Message) and item.role == "assistant"):
            raise invalid_value("item_id", "Invalid 'item_id': only assistant messages with audio can be truncated.")
        if e.content_index >= len(item.parts) or item.parts[e.content_index].kind != "audio":
            raise invalid_value("content_index", f"Invalid 'content_index': part {e.content_index} of this item is not audio.")
        if self.active is not None and item in self.active.output and item.status == "in_progress":
            await self.active.cancel("client_cancelled")  # the client stopped playing it
        part = item.parts[e.content_index]
        if part.audio is None:
            raise invalid_value("item_id", "Invalid 'item_id': this item's audio is no longer retained.")
        rate = self.caps.output_rate
        total = len(part.audio)
        end = ms_to_samples(e.audio_end_ms, rate)
        if end > total + rate // 1000:
            raise invalid_value(
                "audio_end_ms",
                f"Invalid 'audio_end_ms': {e.audio_end_ms} ms is past the end of the item's audio ({total * 1000 // rate} ms).",
            )
        self._truncate(item, e.content_index, end)
        await self.emit(ev.ConversationItemTruncated(item_id=item.id, content_index=e.content_index, audio_end_ms=e.audio_end_ms))

    def _truncate(self, item: Message, index: int, end: int) -> None:
        """Keep the first ``end`` samples of an assistant audio part, and the words of them."""
        part = item.parts[index]
        assert part.audio is not None
        total = len(part.audio)
        alignment = self.conversation.alignment.get(item.id)
        if part.text and alignment is not None:
            part.text = alignment.cut(part.text, end, total)
        elif part.text and end < total:
            part.text = ""  # no alignment known: keep no words the user may not have heard
        part.audio = part.audio[:end]

    def _notify(self, event: Any) -> None:
        if isinstance(event, ev.OutputAudioBufferStarted):
            self._agent_since = time.monotonic()
        if not self.closed:
            self.tasks.spawn(self.emit(event), "notify")

    def _cut_playout(self) -> Cut | None:
        """Silence the media stream now (barge-in, ``output_audio_buffer.clear``)."""
        return self.playout.clear() if self.playout is not None else None

    async def _report_cut(self, cut: Cut) -> None:
        """After a cut: say so, and truncate an answer that had finished generating but was still
        playing to what was heard (an answer still generating trims itself when cancelled)."""
        await self.emit(ev.OutputAudioBufferCleared(response_id=cut.owner.id))
        message = cut.message
        if cut.owner is not self.active and isinstance(message, Message) and self.conversation.get(message.id) is message:
            part = message.parts[0]
            if part.kind == "audio" and part.audio is not None and cut.played < len(part.audio):
                self._truncate(message, 0, cut.played)
                end_ms = samples_to_ms(cut.played, self.caps.output_rate)
                await self.emit(ev.ConversationItemTruncated(item_id=message.id, content_index=0, audio_end_ms=end_ms))
