"""A response's output items on the wire, and the function calls it writes.

Every item (an assistant message, a function call) is announced when it opens
(``response.output_item.added``; in band, ``conversation.item.added`` too, once it is in the
conversation) and when it is done (``response.output_item.done``; in band, ``conversation.item.done``
while the conversation still holds it). A function call's item opens with its first chunk, its
arguments stream as ``response.function_call_arguments.delta``, and the complete call closes it;
one cut off while being written (cancel, barge-in, failure) closes incomplete, as written.

A call of an MCP server's tool (mcp.py) is the server's to run, never the client's: an ``mcp_call``
item whose arguments stream as ``response.mcp_call_arguments.delta`` / ``.done``, then
``response.mcp_call.in_progress`` while it runs and ``.completed`` (its ``output``) or ``.failed``
(its ``error``). A tool that needs the client's approval gets an ``mcp_approval_request`` item
instead, once its arguments are complete; the call waits for the client's ``mcp_approval_response``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pipelines.base import FunctionCall, Message, ToolCall, ToolCallDelta

from ..ids import new_id
from ..protocol import events as ev
from ..tracing import NO_CALL, NO_RESPONSE, CallTrace, ResponseTrace
from .conversation import Alignment, to_wire
from .mcp import McpApprovalRequest, McpCall, McpItem, needs_approval
from .tool_servers import McpFailure

if TYPE_CHECKING:
    from .port import Port


Before = Callable[[], Awaitable[None]]  # run before a call's item opens: the response closes the message it was writing
OutputItem = Message | FunctionCall | McpItem


class OutputItems:
    """A response's items. It holds no reference to the response (a run is freed by reference
    counting alone when its session closes)."""

    def __init__(self, port: Port, response_id: str, *, in_band: bool, trace: ResponseTrace = NO_RESPONSE) -> None:
        self.port = port
        self.trace = trace  # the response's span: a span per call under it
        self._call_trace: CallTrace = NO_CALL  # the span of the call being written
        self.response_id = response_id
        self.in_band = in_band
        self.items: list[OutputItem] = []  # the response's output, in order
        self._call: tuple[FunctionCall, int] | None = None  # the call being written now, and its output index
        self.mcp_tools: dict[str, tuple[ev.McpTool, ev.McpListedTool]] = {}  # the request's MCP tools by name (mcp.McpServers.offer)
        self._mcp: tuple[McpCall, int] | None = None  # the MCP call being written or run now
        self._mcp_writing: tuple[str, McpCall, int] | None = None  # the pipeline's call_id of the one being written
        self._mcp_names: dict[str, str] = {}  # call_id -> tool, for MCP calls being written (only a call's first delta names it)
        self._held: dict[str, str] = {}  # arguments of a call that waits for approval, by call_id, held back until complete
        self.mcp_calls_run = 0

    def wire(self, item: OutputItem) -> ev.Item:
        return to_wire(item, self.port.caps)

    async def open(self, item: OutputItem, alignment: Alignment | None = None) -> int:
        """Append ``item`` to the output (and, in band, to the conversation); its output index."""
        port = self.port
        index = len(self.items)
        self.items.append(item)
        await port.emit(ev.ResponseOutputItemAdded(response_id=self.response_id, output_index=index, item=self.wire(item)))
        if self.in_band:
            previous = port.add_item(item, alignment)
            await port.emit(ev.ConversationItemAdded(previous_item_id=previous, item=self.wire(item)))
        return index

    async def done(self, item: OutputItem, index: int) -> None:
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
        self._call_trace = self.trace.tool_call(item.id, item.call_id, name)
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
        self._call_trace.end()
        await port.emit(ev.ResponseFunctionCallArgumentsDone(**self._ids(item, index), name=item.name, arguments=call.arguments))
        await self.done(item, index)

    async def close_call(self) -> None:
        """A call cut off while it was being written (or run): incomplete, as written."""
        open_call, self._call = self._call, None
        if open_call is not None:
            open_call[0].status = "incomplete"
            self._call_trace.end("cut off while being written")
            await self.done(*open_call)
        mcp_call, self._mcp = self._mcp, None
        if mcp_call is not None:
            mcp_call[0].status = "incomplete"
            await self.done(*mcp_call)

    # ------------------------------------------------------------------ MCP calls (run here)

    def is_mcp(self, name: str, call_id: str = "") -> bool:
        """A call of an MCP tool: by its name, or (a delta after its first) by its ``call_id``."""
        return name in self.mcp_tools or (bool(call_id) and call_id in self._mcp_names)

    def _approval(self, name: str) -> bool:
        tool, listed = self.mcp_tools[name]
        return needs_approval(tool, listed)

    def _mcp_ids(self, item: McpCall, index: int) -> dict[str, Any]:
        return dict(response_id=self.response_id, item_id=item.id, output_index=index)

    async def mcp_delta(self, chunk: ToolCallDelta, before: Before) -> None:
        name = self._mcp_names.setdefault(chunk.call_id, chunk.name)
        if chunk.call_id in self._held or self._approval(name):
            self._held[chunk.call_id] = self._held.get(chunk.call_id, "") + chunk.delta
            return
        if self._mcp_writing is None or self._mcp_writing[0] != chunk.call_id:
            await before()
            tool, _ = self.mcp_tools[name]
            item = McpCall(new_id("item"), tool.server_label, name, "")
            self._mcp = (item, await self.open(item))
            self._mcp_writing = (chunk.call_id, *self._mcp)
        _, item, index = self._mcp_writing
        if chunk.delta:
            item.arguments += chunk.delta
            await self.port.emit(ev.ResponseMcpCallArgumentsDelta(**self._mcp_ids(item, index), delta=chunk.delta))

    async def mcp_call(self, call: ToolCall, before: Before) -> bool:
        """A complete call of an MCP tool: run it now (True), or ask the client's approval (False)."""
        self._held.pop(call.call_id, None)
        self._mcp_names.pop(call.call_id, None)
        writing, self._mcp_writing = self._mcp_writing, None
        tool, _ = self.mcp_tools[call.name]
        if self._approval(call.name):
            await before()
            request = McpApprovalRequest(new_id("item"), tool.server_label, call.name, call.arguments)
            await self.done(request, await self.open(request))
            return False
        if writing is not None and call.call_id and writing[0] == call.call_id:
            _, item, index = writing
        else:
            await before()
            item = McpCall(new_id("item"), tool.server_label, call.name, "")
            index = await self.open(item)
            await self.port.emit(ev.ResponseMcpCallArgumentsDelta(**self._mcp_ids(item, index), delta=call.arguments))
        item.arguments = call.arguments
        await self.port.emit(ev.ResponseMcpCallArgumentsDone(**self._mcp_ids(item, index), arguments=call.arguments))
        await self.run_mcp(item, index)
        return True

    async def approved(self, request: McpApprovalRequest, before: Before) -> None:
        """Run a call the client approved: its item names the request."""
        await before()
        item = McpCall(new_id("item"), request.server_label, request.name, request.arguments, approval_request_id=request.id)
        index = await self.open(item)
        await self.port.emit(ev.ResponseMcpCallArgumentsDelta(**self._mcp_ids(item, index), delta=request.arguments))
        await self.port.emit(ev.ResponseMcpCallArgumentsDone(**self._mcp_ids(item, index), arguments=request.arguments))
        await self.run_mcp(item, index)

    async def run_mcp(self, item: McpCall, index: int) -> None:
        port = self.port
        self._mcp = (item, index)  # a cancel while it runs closes it incomplete
        ids: dict[str, Any] = dict(item_id=item.id, output_index=index)
        await port.emit(ev.ResponseMcpCallInProgress(**ids))
        span = self.trace.mcp_call(item.id, item.server_label, item.name)
        try:
            item.output = await port.mcp.call(item.server_label, item.name, item.arguments)
            item.status = "completed"
            span.end()
            await port.emit(ev.ResponseMcpCallCompleted(**ids))
        except McpFailure as failure:
            item.error, item.status = failure.error, "failed"
            span.end(failure.error.message or "failed")
            await port.emit(ev.ResponseMcpCallFailed(**ids))
        except BaseException:  # cancelled (barge-in, response.cancel) while it ran
            span.end("cancelled")
            raise
        self._mcp = None
        self.mcp_calls_run += 1
        await self.done(item, index)
