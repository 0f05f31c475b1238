"""The MCP client: a session's MCP server reached with the official ``mcp`` SDK over its HTTP client
(``ToolServer``, realtime_omni/session/tool_servers.py, is the port it fills; the server is handed
``McpConnection`` in app.py).

One connection per server (``server_label``) per session, opened with the SDK (Streamable HTTP; the
older HTTP+SSE transport where a server refuses that with 404/405, or for the URL prefixes of
``mcp.sse_servers``) when a ``session.update`` or a ``response.create`` names it, kept for the
session, closed with it. Each connection lives in a task of its own (the SDK's transports are anyio
task groups, which must be left by the task that entered them); calls reach its ``ClientSession``
from the responses' tasks. Listing and each call are bounded in time, an output in size. Every
request a connection makes (a redirect's, SSE's message endpoint) is checked against
``mcp.allowed_servers`` again; ``headers`` and ``authorization`` go to the MCP server only, and
nothing here logs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from realtime_omni.config import McpConfig
from realtime_omni.protocol import events as ev
from realtime_omni.session.mcp import allowed
from realtime_omni.session.tool_servers import McpFailure

log = logging.getLogger(__name__)

SSE_IDLE_S = 24 * 3600.0  # the longest an SSE server's event stream may stay silent


class NotAllowed(Exception):
    """A request (a redirect's) to a URL off the allow-list."""


def _failure(exc: BaseException, what: str) -> McpFailure:
    if isinstance(exc, McpFailure):
        return exc
    if isinstance(exc, TimeoutError):
        return McpFailure(ev.McpCallError(type="protocol_error", code=-32001, message=f"The MCP server did not answer the {what} in time."))
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return McpFailure(ev.McpCallError(type="http_error", code=status, message=f"The MCP server answered the {what} with HTTP {status}."))
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    detail = str(getattr(error, "message", "") or exc) or type(exc).__name__
    if isinstance(exc, NotAllowed) or any(isinstance(e, NotAllowed) for e in _causes(exc)):
        detail = "a request went to a URL outside mcp.allowed_servers (a redirect?), so it was refused"
    return McpFailure(ev.McpCallError(type="protocol_error", code=code if isinstance(code, int) else -32603, message=f"The {what} failed: {detail}"))


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    stack = [exc]
    while stack and len(seen) < 32:
        e = stack.pop()
        seen.append(e)
        stack += [c for c in (e.__cause__, e.__context__) if c is not None]
        stack += list(getattr(e, "exceptions", ()))
    return seen


class McpConnection:
    """One MCP server of a session, held open by a task of its own."""

    def __init__(self, tool: ev.McpTool, settings: McpConfig, session_id: str) -> None:
        self.tool = tool
        self.settings = settings
        self._session: Any = None
        self._ready: asyncio.Future[list[ev.McpListedTool]] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self.off_list = False  # a request of this connection went to a URL off the allow-list (and was refused)
        self._task = asyncio.create_task(self._hold(), name=f"mcp:{session_id}:{tool.server_label}")

    @property
    def closed(self) -> bool:
        return self._task.done()

    async def listed(self) -> list[ev.McpListedTool]:
        """The server's tools, once connected (``McpFailure`` if it could not be reached in time)."""
        try:
            async with asyncio.timeout(self.settings.list_timeout_s):
                return await asyncio.shield(self._ready)
        except Exception as exc:
            await self.close()
            # (a refused request can surface as a timeout: the SSE client logs its send's failure and waits on)
            raise _failure(NotAllowed() if self.off_list else exc, "listing of its tools") from None

    async def _hold(self) -> None:
        url = str(self.tool.server_url)
        # Streamable HTTP first, then the older HTTP+SSE transport where the server refused the
        # first with 404/405 (the MCP spec's backwards-compatible client), or at once for a server
        # under ``mcp.sse_servers``
        transports = ["sse"] if allowed(url, self.settings.sse_servers) else ["streamable_http", "sse"]
        try:
            for transport in transports:
                refused: list[int] = []  # what a POST of Streamable HTTP got back, if it was 404 or 405
                try:
                    async with contextlib.AsyncExitStack() as stack:
                        session = await self._open(stack, transport, refused)
                        await session.initialize()
                        tools = await self._list(session)
                        self._session = session
                        if not self._ready.done():
                            self._ready.set_result(tools)
                        await self._closing.wait()
                        return
                except Exception:
                    if transport == "streamable_http" and refused and not self._ready.done() and not self._closing.is_set():
                        log.info("MCP server %r answered HTTP %d to Streamable HTTP: trying SSE", self.tool.server_label, refused[0])
                        continue
                    raise
        except BaseException as exc:  # (cancellation included: the session closed while connecting)
            if not self._ready.done():
                self._ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("closed"))
            if not isinstance(exc, Exception):
                raise  # (cancelled: the session closed while connecting)
            log.info("MCP server %r: connection ended: %s", self.tool.server_label, type(exc).__name__)
        finally:
            self._session = None

    async def _open(self, stack: contextlib.AsyncExitStack, transport: str, refused: list[int]) -> Any:
        """A ``ClientSession`` over ``transport`` (not yet initialized), its HTTP client checking
        every request (a redirect's, SSE's message endpoint) against the allow-list."""
        from mcp import ClientSession
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        prefixes = self.settings.allowed_servers
        headers = dict(self.tool.headers) if isinstance(self.tool.headers, dict) else {}
        if isinstance(self.tool.authorization, str):
            headers["Authorization"] = f"Bearer {self.tool.authorization}"

        async def check(request: Any) -> None:
            if not allowed(str(request.url), prefixes):
                self.off_list = True
                raise NotAllowed("a request to a URL outside mcp.allowed_servers")

        async def status(response: Any) -> None:
            if response.request.method == "POST" and response.status_code in (404, 405):
                refused.append(response.status_code)

        def client(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None) -> Any:
            http = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)  # (listing and calls are bounded here, with asyncio)
            http.event_hooks = {"request": [check], "response": [status]}
            return http

        url = str(self.tool.server_url)
        if transport == "sse":
            # (a session's connection may sit idle for long: the SDK's 300 s read timeout would drop it)
            sse = sse_client(url, headers=headers, timeout=self.settings.list_timeout_s, sse_read_timeout=SSE_IDLE_S, httpx_client_factory=client)
            read, write = await stack.enter_async_context(sse)
        else:
            http = await stack.enter_async_context(client(headers))
            read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        return await stack.enter_async_context(ClientSession(read, write, read_timeout_seconds=self.settings.call_timeout_s))

    @staticmethod
    async def _list(session: Any) -> list[ev.McpListedTool]:
        tools: list[ev.McpListedTool] = []
        cursor: str | None = None
        for _ in range(100):  # pages
            page = await session.list_tools(params=_page(cursor))
            tools += [_listed(t) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def call(self, name: str, arguments: dict[str, object]) -> str:
        session = self._session
        if session is None or self.closed:
            raise McpFailure(ev.McpCallError(type="protocol_error", code=-32000, message="The connection to the MCP server is closed."))
        try:
            async with asyncio.timeout(self.settings.call_timeout_s):
                result = await session.call_tool(name, arguments)
        except Exception as exc:
            raise _failure(NotAllowed() if self.off_list else exc, "call") from None
        text = _text(result)
        size = len(text.encode())
        if size > self.settings.max_output_bytes:
            message = f"The tool's output ({size} bytes) is over this server's limit of {self.settings.max_output_bytes} bytes (mcp.max_output_bytes)."
            raise McpFailure(ev.McpCallError(type="tool_execution_error", message=message))
        if getattr(result, "is_error", False):
            raise McpFailure(ev.McpCallError(type="tool_execution_error", message=text or "The tool failed."))
        return text

    async def close(self) -> None:
        self._closing.set()
        if not self._task.done():
            try:
                async with asyncio.timeout(5.0):
                    await asyncio.shield(self._task)
            except (TimeoutError, Exception):
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # (retrieved: a failed listing is reported, not logged as never read)


def _page(cursor: str | None) -> Any:
    if cursor is None:
        return None
    from mcp.types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _listed(tool: Any) -> ev.McpListedTool:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations is not None else None
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object"}
    return ev.McpListedTool(name=tool.name, input_schema=schema, description=tool.description, annotations=annotations)


def _text(result: Any) -> str:
    """A call's content as one string: its text parts, anything else as JSON."""
    parts = []
    for content in getattr(result, "content", None) or []:
        text = getattr(content, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(content.model_dump(mode="json", exclude_none=True)))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)
