"""``/v1/realtime``: the OpenAI Realtime API over WebSocket.

One connection is one session. Auth is ``Authorization: Bearer <key>`` or, for browsers, the
``openai-insecure-api-key.<key>`` subprotocol; ``OpenAI-Beta: realtime=v1`` (or the
``openai-beta.realtime-v1`` subprotocol) selects beta event names. A reader task hands each
message to the session; a writer task pumps the session's outbox to the socket (pump.py), and
drops a client that does not take an event within the send timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.responses import Response
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_omni.calls import live_call
from realtime_omni.errors import RealtimeError, http_status
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.codec import encode_server_event
from realtime_omni.pump import EventPump, Sink
from realtime_omni.server import Server
from realtime_omni.session import Session

from .forward import owner_elsewhere, proxy_sideband
from .http import error_response, request_key

log = logging.getLogger(__name__)

KEY_PROTOCOL = "openai-insecure-api-key."
BETA_PROTOCOL = "openai-beta.realtime-v1"
CLOSE_GOING_AWAY = 1001
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_POLICY = 1008
CLOSE_INTERNAL_ERROR = 1011


def routes() -> list[WebSocketRoute]:
    return [WebSocketRoute("/v1/realtime", realtime)]


def _credentials(ws: WebSocket) -> tuple[str | None, bool, str | None]:
    """(api key, beta names wanted, subprotocol to accept)."""
    key = request_key(ws)
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    for proto in offered:
        if proto.startswith(KEY_PROTOCOL):
            key = key or proto[len(KEY_PROTOCOL) :]
    beta = "realtime=v1" in ws.headers.get("openai-beta", "") or BETA_PROTOCOL in offered
    accept = "realtime" if "realtime" in offered else None
    return key, beta, accept


async def _deny(ws: WebSocket, status: int, err: RealtimeError) -> None:
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(error_response(err, status))
    else:
        await ws.close(CLOSE_POLICY, err.message[:120])


async def realtime(ws: WebSocket) -> None:
    server: Server = ws.app.state.server
    key, beta, subprotocol = _credentials(ws)
    try:
        server.check_origin(ws.headers.get("origin"))
    except RealtimeError as err:
        await _deny(ws, 403, err)
        return
    if "call_id" in ws.query_params:  # a sideband: the application's own API key, never an ephemeral one
        if not server.authorized(key):
            await _deny(ws, 401, RealtimeError("A sideband needs the server's API key.", code="invalid_api_key", type="authentication_error"))
            return
        await _sideband(ws, server, ws.query_params["call_id"], beta, subprotocol)
        return
    try:
        admission = await server.admit(key)
    except RealtimeError as err:
        await _deny(ws, http_status(err), err)  # 401, or 503 while the shared state is unreachable
        return
    try:
        intent = (ev.SessionObject(type="transcription"),) if ws.query_params.get("intent") == "transcription" else ()
        session = await server.open_session(beta=beta, transport="websocket", model=ws.query_params.get("model"), admission=admission, updates=intent)
    except RealtimeError as err:
        if err.code == "invalid_api_key":  # its ephemeral key was spent meanwhile
            await _deny(ws, 401, err)
            return
        # full or draining: say so in the protocol, then hang up
        await ws.accept(subprotocol)
        error = ev.Error(event_id="event_rejected", error=ev.ErrorDetail(type=err.type, code=err.code, message=err.message, param=None, event_id=None))
        await ws.send_text(encode_server_event(error, beta_names=beta).decode())  # type: ignore[union-attr]
        await ws.close(CLOSE_TRY_AGAIN_LATER, "try again later")
        return
    await ws.accept(subprotocol)
    try:
        await session.start()
        await _serve(ws, server, session)
    finally:
        await server.close_session(session)


async def _sideband(ws: WebSocket, server: Server, call_id: str, beta: bool, subprotocol: str | None) -> None:
    """``?call_id=``: watch and steer a live WebRTC or SIP call. The socket gets every event of
    the call's session from now on, and what it sends goes to that session. A call another replica
    holds is reached through it (forward.py)."""
    try:
        owner = await owner_elsewhere(server, call_id, ws.headers)
    except RealtimeError as err:
        await _deny(ws, http_status(err), err)
        return
    if owner is not None:
        offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        denied = await proxy_sideband(ws, server, owner, call_id, offered)
        if isinstance(denied, RealtimeError):
            await _deny(ws, http_status(denied), denied)
        elif denied is not None and "websocket.http.response" in ws.scope.get("extensions", {}):
            status, body = denied
            await ws.send_denial_response(Response(body, status_code=status, media_type="application/json"))
        elif denied is not None:
            await ws.close(CLOSE_POLICY, "refused by the replica holding the call")
        return
    try:
        call = live_call(server, call_id)
        queue = call.attach_sideband(beta=beta)
    except RealtimeError as err:
        await _deny(ws, 404, err)
        return
    session = call.session
    assert session is not None
    await ws.accept(subprotocol)

    async def write() -> None:
        timeout = server.config.limits.send_timeout_s
        while (data := await queue.queue.get()) is not None:
            async with asyncio.timeout(timeout):
                await ws.send_text(data)
        with contextlib.suppress(Exception):
            await ws.close(CLOSE_GOING_AWAY, "call ended")

    tasks = [asyncio.create_task(_read(ws, session), name=f"sideband-read:{call_id}"), asyncio.create_task(write(), name=f"sideband-write:{call_id}")]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        call.detach_sideband(queue)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _serve(ws: WebSocket, server: Server, session: Session) -> None:
    reader = asyncio.create_task(_read(ws, session), name=f"ws-read:{session.id}")
    writer = asyncio.create_task(_write(ws, server, session), name=f"ws-write:{session.id}")
    failed = False
    try:
        done, _ = await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
        if writer in done and writer.exception() is None:
            # The session ended from our side (shutdown) and everything queued was sent.
            with contextlib.suppress(Exception):
                await ws.close(CLOSE_GOING_AWAY, "server shutting down")
    finally:
        for task in (reader, writer):
            task.cancel()
        for result in await asyncio.gather(reader, writer, return_exceptions=True):
            if isinstance(result, Exception) and not isinstance(result, (ConnectionError, TimeoutError, WebSocketDisconnect)):
                log.error("session %s: connection task failed", session.id, exc_info=result)
                failed = True
    if failed:  # a defect of ours: tell the client so (1011), rather than drop the socket
        with contextlib.suppress(Exception):
            await ws.close(CLOSE_INTERNAL_ERROR, "internal error")


async def _read(ws: WebSocket, session: Session) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        await session.handle(data)


async def _write(ws: WebSocket, server: Server, session: Session) -> None:
    timeout = server.config.limits.send_timeout_s

    async def send(data: str) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await ws.send_text(data)
        except TimeoutError:
            log.warning("session %s: client took no event for %.0f s; dropping it", session.id, timeout)
            return False
        except (WebSocketDisconnect, RuntimeError, OSError):
            return False  # the client is gone
        return True

    pump = EventPump(session, server.metrics)
    pump.add(Sink(send, beta=session.beta, name="websocket", essential=True))
    await pump.run()
