"""MCP tools run by the server itself: a session's ``type: "mcp"`` tools (OpenAI's GA semantics).

The server fetches URLs that clients name, so nothing is reached unless ``mcp.allowed_servers``
(URL prefixes; ``serve --mcp-allow``) covers it: a tool naming another server is refused before any
connection, and every request a connection makes (a redirect's too) is checked against the list
again. ``headers`` and ``authorization`` go to the MCP server only: the session keeps the tool
without them (what ``session.updated`` shows), and nothing here logs them.

One connection per server (``server_label``) per session, opened through the ``Connect`` port
(tool_servers.py; the ``mcp`` SDK's client is host/mcp_client.py) when a ``session.update`` or a
``response.create`` names it, kept for the session, closed with it; the servers of a session are
bounded in number.

The items this adds to a conversation (``McpListTools``, ``McpCall``, ``McpApprovalRequest``,
``McpApprovalResponse``) are the session's, not a pipeline's: a pipeline sees a finished call as
the function call and output it knows (``pipeline_view``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from msgspec import UNSET, structs

from pipelines.base import ContextItem, FunctionCall, FunctionResult, Message, Tool

from ..config import McpConfig
from ..errors import RealtimeError, invalid_value
from ..ids import new_id
from ..protocol import events as ev
from ..tasks import TaskSet
from .tool_servers import Connect, McpFailure, ToolServer, unreachable

log = logging.getLogger(__name__)

DECLINED = "The user declined this tool call."


# ---------------------------------------------------------------------------------------------
# The items
# ---------------------------------------------------------------------------------------------


@dataclass
class McpListTools:
    id: str
    server_label: str
    tools: list[ev.McpListedTool] = field(default_factory=list)


@dataclass
class McpCall:
    id: str
    server_label: str
    name: str
    arguments: str
    approval_request_id: str | None = None
    output: str | None = None
    error: ev.McpCallError | None = None
    status: Literal["in_progress", "completed", "failed", "incomplete"] = "in_progress"


@dataclass
class McpApprovalRequest:
    id: str
    server_label: str
    name: str
    arguments: str


@dataclass
class McpApprovalResponse:
    id: str
    approval_request_id: str
    approve: bool
    reason: str | None = None


McpItem = McpListTools | McpCall | McpApprovalRequest | McpApprovalResponse
MCP_ITEMS = (McpListTools, McpCall, McpApprovalRequest, McpApprovalResponse)


def to_wire(item: McpItem) -> ev.Item:
    if isinstance(item, McpListTools):
        return ev.McpListToolsItem(id=item.id, server_label=item.server_label, tools=item.tools)
    if isinstance(item, McpCall):
        return ev.McpCallItem(
            id=item.id, server_label=item.server_label, name=item.name, arguments=item.arguments,
            approval_request_id=item.approval_request_id, output=item.output, error=item.error,
        )  # fmt: skip
    if isinstance(item, McpApprovalRequest):
        return ev.McpApprovalRequestItem(id=item.id, server_label=item.server_label, name=item.name, arguments=item.arguments)
    return ev.McpApprovalResponseItem(id=item.id, approval_request_id=item.approval_request_id, approve=item.approve, reason=item.reason)


def from_wire(item: ev.Item, param: str) -> McpApprovalResponse:
    """An MCP item a client sends: only an approval response is the client's to write."""
    if not isinstance(item, ev.McpApprovalResponseItem):
        kind = item.__struct_config__.tag
        raise invalid_value(f"{param}.type", f"Invalid '{param}.type': {kind!r} items are written by the server, not the client.")
    reason = item.reason if isinstance(item.reason, str) else None
    return McpApprovalResponse(item.id if isinstance(item.id, str) else new_id("item"), item.approval_request_id, item.approve, reason)


def pipeline_view(items: Iterable[Any]) -> list[ContextItem]:
    """The history as a pipeline knows it: a finished MCP call (or a declined request) is a
    function call and its output; listings, open requests and approvals are left out."""
    items = list(items)
    declined = {i.approval_request_id: i for i in items if isinstance(i, McpApprovalResponse) and not i.approve}
    out: list[ContextItem] = []
    for item in items:
        if isinstance(item, (Message, FunctionCall, FunctionResult)):
            out.append(item)
        elif isinstance(item, McpCall) and item.status != "in_progress":
            text = item.output if item.output is not None else f"Error: {item.error.message if item.error else 'the call did not finish'}"
            out += [FunctionCall(item.id, item.id, item.name, item.arguments), FunctionResult(f"{item.id}_output", item.id, text)]
        elif isinstance(item, McpApprovalRequest) and item.id in declined:
            reason = declined[item.id].reason
            text = f"{DECLINED} {reason}" if reason else DECLINED
            out += [FunctionCall(item.id, item.id, item.name, item.arguments), FunctionResult(f"{item.id}_output", item.id, text)]
    return out


def approved_calls(items: Iterable[Any]) -> list[McpApprovalRequest]:
    """The requests of ``items`` the client approved that no call has run yet."""
    items = list(items)
    ran = {i.approval_request_id for i in items if isinstance(i, McpCall)}
    requests = {i.id: i for i in items if isinstance(i, McpApprovalRequest)}
    return [
        requests[i.approval_request_id]
        for i in items
        if isinstance(i, McpApprovalResponse) and i.approve and i.approval_request_id in requests and i.approval_request_id not in ran
    ]


# ---------------------------------------------------------------------------------------------
# The allow-list and the tools' checks
# ---------------------------------------------------------------------------------------------


def allowed(url: str, prefixes: Iterable[str]) -> bool:
    """``url`` is under one of ``prefixes``: the same scheme, host and port, and a path that
    starts with the prefix's (so ``http://a:1/x`` never allows ``http://a:1.evil/`` nor ``http://a:10/``)."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        return False
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password:
        return False
    for prefix in prefixes:
        try:
            p = urlsplit(prefix)
            p_port = p.port
        except ValueError:
            continue
        if (p.scheme, p.hostname, p_port) == (u.scheme, u.hostname, port) and u.path.startswith(p.path):
            return True
    return False


def check_tools(tools: list[ev.Tool], settings: McpConfig, param: str, *, beta: bool = False) -> None:
    """Refuse, before any connection, an MCP tool this server will not call."""
    labels: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, ev.McpTool):
            continue
        p = f"{param}[{i}]"
        if beta:  # the beta protocol has no MCP events nor items to report them with
            raise RealtimeError(f"Invalid '{p}.type': MCP tools need a GA connection (without 'OpenAI-Beta: realtime=v1').", code="unsupported_value", param=f"{p}.type")
        for name in ("connector_id", "tunnel_id"):
            if getattr(tool, name) is not UNSET:
                raise RealtimeError(f"Invalid '{p}.{name}': this server calls MCP servers by 'server_url' only.", code="unsupported_value", param=f"{p}.{name}")
        if not isinstance(tool.server_url, str):
            raise RealtimeError(f"Missing required parameter: '{p}.server_url'.", code="missing_required_parameter", param=f"{p}.server_url")
        if not allowed(tool.server_url, settings.allowed_servers):
            raise RealtimeError(
                f"Invalid '{p}.server_url': this server does not call the MCP server {tool.server_url!r}: it is not under any of the "
                "URL prefixes of its 'mcp.allowed_servers' setting (serve --mcp-allow PREFIX).",
                code="mcp_server_not_allowed",
                param=f"{p}.server_url",
            )
        if tool.server_label in labels:
            raise invalid_value(f"{p}.server_label", f"Invalid '{p}.server_label': duplicate server label {tool.server_label!r}.")
        labels.add(tool.server_label)
    if len(labels) > settings.max_servers:
        raise invalid_value(param, f"Invalid '{param}': at most {settings.max_servers} MCP servers per session (mcp.max_servers).")


def public(tool: ev.McpTool) -> ev.McpTool:
    """The tool as events show it: without its secrets."""
    return structs.replace(tool, headers=UNSET, authorization=UNSET)


def _matches(rule: ev.McpToolFilter | None, name: str, annotations: Any) -> bool:
    if rule is None:
        return False
    names, read_only = rule.tool_names, rule.read_only
    if isinstance(names, list) and name in names:
        return True
    hint = isinstance(annotations, dict) and annotations.get("readOnlyHint") is True
    return isinstance(read_only, bool) and read_only == hint


def _rule(value: ev.McpToolFilter | None | Any) -> ev.McpToolFilter | None:
    return value if isinstance(value, ev.McpToolFilter) else None


def offered(tool: ev.McpTool, listed: ev.McpListedTool) -> bool:
    """``allowed_tools``: a list of names, or a filter (names, or read-only by the server's hint)."""
    rule = tool.allowed_tools
    if isinstance(rule, list):
        return listed.name in rule
    if isinstance(rule, ev.McpToolFilter):
        return _matches(rule, listed.name, listed.annotations)
    return True


def needs_approval(tool: ev.McpTool, listed: ev.McpListedTool) -> bool:
    """``require_approval``: ``never``, ``always`` (OpenAI's default), or filters: a tool under
    ``never`` runs at once, any other waits for the client's approval."""
    rule = tool.require_approval
    if rule == "never":
        return False
    if isinstance(rule, ev.McpApprovalFilter):
        if _matches(_rule(rule.never), listed.name, listed.annotations):
            return False
    return True


def forced(choice: ev.ToolChoiceMcp, where: dict[str, tuple[ev.McpTool, ev.McpListedTool]], param: str) -> tuple[str, set[str] | None]:
    """``tool_choice: {type: "mcp", server_label, name}`` for one response, against what the server
    listed (``McpServers.offer``'s ``where``): the pipeline's tool_choice, a call of that tool (its
    name), or with no name a call of any of that server's tools ("required", and the names of the
    tools the response then offers: that server's only). Refused when the server offers no such tool
    (its listing failed or is under way, ``allowed_tools`` left the tool out, a function took its name)."""
    label = choice.server_label
    names = {name for name, (tool, _) in where.items() if tool.server_label == label}
    if isinstance(choice.name, str):
        if choice.name not in names:
            listed = ", ".join(sorted(names)) or "none"
            message = f"Invalid '{param}.name': MCP server {label!r} offers no tool {choice.name!r} to this response (its tools offered: {listed})."
            raise invalid_value(f"{param}.name", message)
        return choice.name, None
    if not names:
        raise invalid_value(f"{param}.server_label", f"Invalid '{param}.server_label': MCP server {label!r} offers no tools to this response (was its listing completed?).")
    return "required", names


# ---------------------------------------------------------------------------------------------
# A session's servers
# ---------------------------------------------------------------------------------------------


def _key(tool: ev.McpTool) -> tuple[Any, ...]:
    headers = tuple(sorted(tool.headers.items())) if isinstance(tool.headers, dict) else ()
    return (tool.server_url, headers, tool.authorization)


Emit = Callable[[Any], Awaitable[Any]]
AddItem = Callable[[McpListTools], Awaitable[None]]  # adds the item and says conversation.item.added


@dataclass
class Listing:
    tool: ev.McpTool
    tools: list[ev.McpListedTool]


class McpServers:
    """A session's MCP servers: connected and listed on demand, one connection per label."""

    def __init__(self, settings: McpConfig, session_id: str, *, beta: bool = False, connect: Connect = unreachable) -> None:
        self.settings = settings
        self.session_id = session_id
        self.beta = beta
        self._connect = connect
        self.connections: dict[str, ToolServer] = {}
        self.listings: dict[str, Listing] = {}  # label -> the tool (secrets kept) and its offered tools
        self._pending = TaskSet(session_id)  # the listings under way
        self._lock = asyncio.Lock()  # one ``ensure`` at a time: two updates in a row never race for a label
        self.closed = False  # the session closed: nothing connects any more

    async def ensure(self, tools: list[ev.Tool], emit: Emit, add_item: AddItem, item_done: AddItem, keep_others: bool = True) -> None:
        """Connect to and list every MCP server of ``tools`` not yet connected (with the same URL
        and secrets): an ``mcp_list_tools`` item each, ``mcp_list_tools.in_progress`` then
        ``.completed`` or ``.failed``. ``keep_others`` False (a session's tools replaced): the
        connections to servers no longer named are closed."""
        async with self._lock:
            await self._ensure(tools, emit, add_item, item_done, keep_others)

    async def _ensure(self, tools: list[ev.Tool], emit: Emit, add_item: AddItem, item_done: AddItem, keep_others: bool) -> None:
        wanted = {t.server_label: t for t in tools if isinstance(t, ev.McpTool)}
        if not keep_others:
            for label in [label for label in self.connections if label not in wanted]:
                await self._drop(label)
        for label, tool in wanted.items():
            if self.closed:  # (the session closed while an earlier server was listed)
                return
            current = self.connections.get(label)
            if current is not None and _key(current.tool) == _key(tool) and not current.closed:
                self.listings[label] = Listing(tool, self.listings[label].tools) if label in self.listings else Listing(tool, [])
                continue
            if current is not None:
                await self._drop(label)
            connection = self.connections[label] = self._connect(tool, self.settings, self.session_id)
            item = McpListTools(new_id("item"), label)
            await add_item(item)
            await emit(ev.McpListToolsInProgress(item_id=item.id))
            try:
                listed = await connection.listed()
            except McpFailure as failure:
                log.info("session %s: MCP server %r: listing failed: %s", self.session_id, label, failure)
                await emit(ev.McpListToolsFailed(item_id=item.id))
                await item_done(item)
                await emit(ev.Error(error=ev.ErrorDetail(
                    type="server_error", code="mcp_list_tools_failed", param=None, event_id=None,
                    message=f"Could not list the tools of MCP server {label!r}: {failure.error.message}",
                )))  # fmt: skip
                self.connections.pop(label, None)
                continue
            if self.closed:
                await self._drop(label)
                return
            item.tools = [t for t in listed if offered(tool, t)]
            self.listings[label] = Listing(tool, item.tools)
            await emit(ev.McpListToolsCompleted(item_id=item.id))
            await item_done(item)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._pending.spawn(coro, "mcp-list")

    async def ready(self) -> None:
        """Wait for the listings under way (a response offers what they find)."""
        await self._pending.join()

    def offer(self, tools: list[ev.Tool], taken: set[str]) -> tuple[list[Tool], dict[str, tuple[ev.McpTool, ev.McpListedTool]]]:
        """The pipeline's tools for the MCP servers of ``tools`` (listed), and each tool's server.
        A name already ``taken`` (a function, another server's tool) is not offered twice."""
        out: list[Tool] = []
        where: dict[str, tuple[ev.McpTool, ev.McpListedTool]] = {}
        for tool in tools:
            if not isinstance(tool, ev.McpTool) or tool.server_label not in self.listings:
                continue
            for listed in self.listings[tool.server_label].tools:
                if listed.name in taken:
                    continue
                taken.add(listed.name)
                schema = listed.input_schema if isinstance(listed.input_schema, dict) else {"type": "object"}
                out.append(Tool(listed.name, listed.description or "", schema))
                where[listed.name] = (tool, listed)
        return out, where

    def listed_tool(self, label: str, name: str) -> ev.McpListedTool | None:
        listing = self.listings.get(label)
        return next((t for t in listing.tools if t.name == name), None) if listing else None

    async def call(self, label: str, name: str, arguments: str) -> str:
        """Run a tool; its output (``McpFailure`` with the error to report otherwise)."""
        connection = self.connections.get(label)
        if connection is None or self.listed_tool(label, name) is None:
            raise McpFailure(ev.McpCallError(type="protocol_error", code=-32602, message=f"MCP server {label!r} offers no tool {name!r}."))
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise McpFailure(ev.McpCallError(type="protocol_error", code=-32602, message="The call's arguments are not a JSON object."))
        return await connection.call(name, args)

    async def _drop(self, label: str) -> None:
        self.listings.pop(label, None)
        connection = self.connections.pop(label, None)
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        self.closed = True
        await self._pending.cancel()
        for label in list(self.connections):
            await self._drop(label)

    @property
    def open_connections(self) -> int:
        return sum(not c.closed for c in self.connections.values())
