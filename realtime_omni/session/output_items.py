"""A response's output items on the wire, and the function calls it writes.

Every item (an assistant message, a function call) is announced when it opens
(``response.output_item.added``; in band, ``conversation.item.added`` too, once it is in the
conversation) and when it is done (``response.output_item.done``; in band, ``conversation.item.done``
while the conversation still holds it). A function call's item opens with its first chunk, its
arguments stream as ``response.function_call_arguments.delta``, and the complete call closes it;
one cut off while being written (cancel, barge-in, failure) closes incomplete, as written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pipelines.base import FunctionCall, Message, ToolCall, ToolCallDelta

from ..ids import new_id
from ..protocol import events as ev
from .conversation import Alignment, to_wire

if TYPE_CHECKING:
    from .port import Port


Before = Callable[[], Awaitable[None]]  # run before a call's item opens: the response closes the message it was writing


class OutputItems:
    """A response's items. It holds no reference to the response (a run is freed by reference
    counting alone when its session closes)."""

    def __init__(self, port: Port, response_id: str, *, in_band: bool) -> None:
        self.port = port
        self.response_id = response_id
        self.in_band = in_band
        self.items: list[Message | FunctionCall] = []  # the response's output, in order
        self._call: tuple[FunctionCall, int] | None = None  # the call being written now, and its output index

    def wire(self, item: Message | FunctionCall) -> ev.Item:
        return to_wire(item, self.port.caps)

    async def open(self, item: Message | FunctionCall, alignment: Alignment | None = None) -> int:
        """Append ``item`` to the output (and, in band, to the conversation); its output index."""
        port = self.port
        index = len(self.items)
        self.items.append(item)
        await port.emit(ev.ResponseOutputItemAdded(response_id=self.response_id, output_index=index, item=self.wire(item)))
        if self.in_band:
            previous = port.add_item(item, alignment)
            await port.emit(ev.ConversationItemAdded(previous_item_id=previous, item=self.wire(item)))
        return index

    async def done(self, item: Message | FunctionCall, index: int) -> None:
        port = self.port
        wire = self.wire(item)
        await port.emit(ev.ResponseOutputItemDone(response_id=self.response_id, output_index=index, item=wire))
        conversation = port.conversation
        if self.in_band and conversation.get(item.id) is item:
            await port.emit(ev.ConversationItemDone(previous_item_id=conversation.previous_id(item), item=wire))

    # ------------------------------------------------------------------ function calls

    async def _open_call(self, call_id: str, name: str, before: Before) -> tuple[FunctionCall, int]:
        await before()
        item = FunctionCall(new_id("item"), call_id or new_id("call"), name, "", status="in_progress")
        return item, await self.open(item)

    def _ids(self, item: FunctionCall, index: int) -> dict[str, Any]:
        return dict(response_id=self.response_id, item_id=item.id, output_index=index, call_id=item.call_id)

    async def call_delta(self, chunk: ToolCallDelta, before: Before) -> None:
        """A call being written: its item opens with the first chunk, its arguments stream."""
        open_call = self._call
        if open_call is None or open_call[0].call_id != chunk.call_id:
            open_call = self._call = await self._open_call(chunk.call_id, chunk.name, before)
        item, index = open_call
        if chunk.delta:
            item.arguments += chunk.delta
            await self.port.emit(ev.ResponseFunctionCallArgumentsDelta(**self._ids(item, index), delta=chunk.delta))

    async def call(self, call: ToolCall, before: Before) -> None:
        """A call complete: the one its deltas opened, or one that comes whole."""
        port = self.port
        open_call, self._call = self._call, None
        if open_call is not None and call.call_id and open_call[0].call_id == call.call_id:
            item, index = open_call
        else:
            item, index = await self._open_call(call.call_id, call.name, before)
            await port.emit(ev.ResponseFunctionCallArgumentsDelta(**self._ids(item, index), delta=call.arguments))
        item.arguments, item.status = call.arguments, "completed"
        await port.emit(ev.ResponseFunctionCallArgumentsDone(**self._ids(item, index), name=item.name, arguments=call.arguments))
        await self.done(item, index)

    async def close_call(self) -> None:
        """A call cut off while it was being written: incomplete, as written."""
        open_call, self._call = self._call, None
        if open_call is not None:
            open_call[0].status = "incomplete"
            await self.done(*open_call)
