"""Requests for a call another replica holds, passed on to it.

Replicas behind one balancer share who holds which call (``Store.call_owner``: the URL of the
replica holding it). Call control (``POST /v1/realtime/calls/{id}/...``, ``DELETE``) and
sidebands (``GET /v1/realtime?call_id=``) that land on a replica without the call go to that URL:
an HTTP request is re-sent and its answer returned as it came; a sideband is proxied, frame by
frame both ways, until either side closes. The client's own credentials travel with it (the owner
checks them), and the forwarded request is marked, so it is never forwarded twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
import websockets
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_omni.errors import RealtimeError
from realtime_omni.server import Server

log = logging.getLogger(__name__)

FORWARDED = "x-realtime-omni-forwarded"  # names the replica that forwarded the request
PASSED_ON = ("authorization", "content-type", "openai-beta")
TIMEOUT_S = 10.0


def forwarded(headers: object) -> bool:
    return FORWARDED in headers  # type: ignore[operator]


async def owner_elsewhere(server: Server, call_id: str, headers: object) -> str | None:
    """The URL of the replica holding ``call_id`` when it is not this one and the request was not
    forwarded here already (None: answer it here)."""
    if call_id in server.calls or forwarded(headers):
        return None
    owner = await server.store.call_owner(call_id)
    return owner if owner and owner != server.url else None


def _gone(call_id: str) -> RealtimeError:
    return RealtimeError(f"No live call with id {call_id!r} (the replica that held it does not answer).", code="call_not_found", param="call_id")


async def forward_http(request: Request, server: Server, owner: str, call_id: str, body: bytes) -> Response:
    headers = {k: v for k, v in request.headers.items() if k in PASSED_ON}
    headers[FORWARDED] = server.replica
    url = owner.rstrip("/") + request.url.path + (f"?{request.url.query}" if request.url.query else "")
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            answer = await http.request(request.method, url, headers=headers, content=body)
    except httpx.HTTPError as exc:
        log.warning("call %s: its replica at %s does not answer (%s)", call_id, owner, exc)
        raise _gone(call_id) from None
    keep = {k: v for k, v in answer.headers.items() if k in ("content-type", "location", "retry-after")}
    return Response(answer.content, status_code=answer.status_code, headers=keep)


async def proxy_sideband(ws: WebSocket, server: Server, owner: str, call_id: str, subprotocols: list[str]) -> RealtimeError | tuple[int, bytes] | None:
    """Proxy this (not yet accepted) WebSocket to ``owner``. Returns what to deny the client with
    when the owner refused (its status and body) or did not answer; None once proxied to the end."""
    headers = {k: v for k, v in ws.headers.items() if k in PASSED_ON}
    headers[FORWARDED] = server.replica
    url = owner.replace("http", "ws", 1).rstrip("/") + "/v1/realtime?" + str(ws.url.query)
    limits = server.config.limits
    try:
        upstream = await websockets.connect(
            url,
            additional_headers=headers,
            subprotocols=subprotocols or None,  # type: ignore[arg-type]
            max_size=limits.max_message_bytes,
            open_timeout=TIMEOUT_S,
            compression=None,
        )
    except websockets.InvalidStatus as refused:
        return refused.response.status_code, refused.response.body or b""
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        log.warning("call %s: its replica at %s does not answer (%s)", call_id, owner, exc)
        return _gone(call_id)
    await ws.accept(upstream.subprotocol)

    async def down() -> None:  # owner -> client
        async for message in upstream:
            if isinstance(message, bytes):
                await ws.send_bytes(message)
            else:
                await ws.send_text(message)

    async def up() -> None:  # client -> owner
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text")
            await upstream.send(data if data is not None else message.get("bytes") or b"")

    tasks = [asyncio.create_task(down(), name=f"sideband-down:{call_id}"), asyncio.create_task(up(), name=f"sideband-up:{call_id}")]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        code = upstream.close_code or 1001
        await upstream.close()
        with contextlib.suppress(Exception, WebSocketDisconnect):
            await ws.close(code if code in (1000, 1001, 1008, 1011, 1013) else 1001, upstream.close_reason or "")
    return None
