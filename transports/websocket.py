"""``/v1/realtime``: the OpenAI Realtime API over WebSocket.

One connection opens one session. Auth is ``Authorization: Bearer <key>`` or, for browsers, the
``openai-insecure-api-key.<key>`` subprotocol; ``OpenAI-Beta: realtime=v1`` (or the
``openai-beta.realtime-v1`` subprotocol) selects beta event names.

A session may outlive its connection (``realtime_omni/resume.py``, docs/realtime-api.md#resuming-a-session):
its events go from the outbox into its replay log (one pump per session, for its whole life), and
each connection has a writer that sends the log from its cursor and a reader that hands each
message to the session. A connection that drops without a close frame leaves the session parked
for ``resume.grace_s``; a new connection with its id, token and last event id takes it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from starlette.responses import Response
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from realtime_omni.calls import live_call
from realtime_omni.errors import RealtimeError, http_status
from realtime_omni.keys import is_ephemeral
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.codec import encode_server_event
from realtime_omni.pump import EventPump, SinkGone
from realtime_omni.resume import Hold, LogSink, ReplayLog
from realtime_omni.server import Server
from realtime_omni.session import Session
from realtime_omni.tasks import create_task

from .forward import owner_elsewhere, proxy_sideband
from .http import LAST_EVENT_ID, RECEIVED, REPLAYED, RESUME_TOKEN, SESSION_ID, claim_resume, error_response, request_key

log = logging.getLogger(__name__)

KEY_PROTOCOL = "openai-insecure-api-key."
BETA_PROTOCOL = "openai-beta.realtime-v1"
CLOSE_GOING_AWAY = 1001
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_POLICY = 1008
CLOSE_INTERNAL_ERROR = 1011
# How uvicorn reports a connection lost without a closing handshake (1005 once open, 1006 before):
# the only ends a session is kept for. A client that closes (any code) or breaks the protocol ends it.
LOST = frozenset({1005, 1006})



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
    if SESSION_ID in ws.headers:
        await _resume(ws, server, key, subprotocol)
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
        # its ephemeral key spent meanwhile (401), or the shared state gone while redeeming it
        # (503): refused at the upgrade
        if err.code == "invalid_api_key" or (err.code == "server_unavailable" and admission.ephemeral_key is not None):
            await _deny(ws, http_status(err), err)
            return
        # full or draining: say so in the protocol, then hang up
        await ws.accept(subprotocol)
        error = ev.Error(event_id="event_rejected", error=ev.ErrorDetail(type=err.type, code=err.code, message=err.message, param=None, event_id=None))
        await ws.send_text(encode_server_event(error, beta_names=beta).decode())  # type: ignore[union-attr]
        await ws.close(CLOSE_TRY_AGAIN_LATER, "try again later")
        return
    resume = server.config.resume
    log_bytes = resume.buffer_bytes if resume.grace_s > 0 else 0  # not resumable: keep nothing once sent
    hold = Hold(session.id, ReplayLog(resume.buffer_events, log_bytes), resume.grace_s, key_tag=server.tenant(key) if is_ephemeral(key) else None)
    headers = [(SESSION_ID.encode(), session.id.encode()), (RESUME_TOKEN.encode(), hold.token.encode())] if resume.grace_s > 0 else []
    try:
        await ws.accept(subprotocol, headers=headers)
    except BaseException:
        await server.close_session(session)
        raise
    kept = _Kept(server, session, hold)
    connection = _Connection(ws, kept, 0)
    kept.attach(connection)
    await session.start()
    await kept.serve(connection)


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


async def _read(ws: WebSocket, session: Session) -> None:
    """A sideband's messages, to the call's session."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        await session.handle(data)


async def _resume(ws: WebSocket, server: Server, key: str | None, subprotocol: str | None) -> None:
    """A connection that names a session to resume: refused at the upgrade, leaving the session as
    it was, or attached to it (the connection it had, if any, is closed)."""
    started = time.perf_counter()
    try:
        hold, cursor = claim_resume(server, ws.headers, key, "websocket", ws.headers.get(LAST_EVENT_ID, ""))
    except RealtimeError as err:
        await _deny(ws, http_status(err), err)
        return
    kept: _Kept = hold.keeper
    connection = _Connection(ws, kept, cursor)
    kept.attach(connection)  # from here on no message of the old connection is taken: the count below is final
    server.metrics.resumes.labels("resumed").inc()
    took_ms = (time.perf_counter() - started) * 1000
    log.info("session %s resumed: %d events to replay", hold.id, hold.log.end - cursor)
    reply = [
        (SESSION_ID.encode(), hold.id.encode()),
        (RECEIVED.encode(), str(hold.received).encode()),
        (REPLAYED.encode(), str(hold.log.end - cursor).encode()),
        (b"server-timing", f"resume;dur={took_ms:.3f}".encode()),
    ]
    await kept.serve(connection, accept=(subprotocol, reply))


class _Kept:
    """A WebSocket session from its open to its end, across its connections: its events pumped into
    its replay log, the connection attached now (None: parked, waiting for a resume), the one
    message at a time it handles, and its end (the client closed it, the grace ran out, its log
    overflowed, the server ended it)."""

    def __init__(self, server: Server, session: Session, hold: Hold) -> None:
        self.server = server
        self.session = session
        self.hold = hold
        hold.keeper = self
        self.connection: _Connection | None = None
        self.parked_at: float | None = None  # since when no connection has been attached (None: one is)
        self.ending: str | None = None  # why a connection ended the session
        self._wake = asyncio.Event()
        if hold.grace_s > 0:
            server.holds.add(hold)
        self.task = create_task(self._keep(), name=f"ws-keep:{session.id}")

    # ------------------------------------------------------------------ connections

    def attach(self, connection: _Connection) -> None:
        old, self.connection = self.connection, connection
        self.parked_at = None
        self.hold.log.attach(connection.cursor)
        if old is not None:  # still open as far as we know (half-open): the resumed client is elsewhere
            old.kick(CLOSE_GOING_AWAY, "this session was resumed on another connection")
        self._wake.set()

    async def serve(self, connection: _Connection, accept: tuple[str | None, list[tuple[bytes, bytes]]] | None = None) -> None:
        """Run ``connection`` until it ends, then park, end or leave the session as its end says."""
        if self.connection is not connection:
            self.attach(connection)
        outcome = await connection.run(accept)
        if self.connection is not connection:  # another connection took over (or the session ended)
            await connection.finish()
            return
        self.connection = None
        self.hold.log.detach()
        if outcome == "dropped" and self.hold.grace_s > 0 and self.ending is None:
            self.parked_at = time.monotonic()
            log.info("session %s: its connection dropped; kept %g s for a resume", self.session.id, self.hold.grace_s)
            self._wake.set()
            await connection.finish()
            return
        if outcome != "finished":
            self.ending = self.ending or ("the client closed it" if outcome == "closed" else "its connection ended")
        self._wake.set()
        await asyncio.shield(self.task)  # the session is closed when the connection's handler returns, as without resumes
        await connection.finish()

    async def take(self, data: str | bytes) -> None:
        async with self.hold.handling:  # one message at a time, in order, whichever connection brought it
            await self.session.handle(data)

    # ------------------------------------------------------------------ the session's life

    async def _keep(self) -> None:
        hold, session = self.hold, self.session
        pump = EventPump(session, self.server.metrics)
        pump.add(LogSink(hold.log, beta=session.beta))
        pumping = create_task(pump.run(), name=f"ws-pump:{session.id}")
        reason = "it ended"
        try:
            while not pumping.done():
                if self.ending is not None:
                    reason = self.ending
                    break
                wait = None
                if self.parked_at is not None:
                    wait = hold.grace_s - (time.monotonic() - self.parked_at)
                    if wait <= 0:
                        reason = f"nobody resumed it within {hold.grace_s:g} s"
                        break
                self._wake.clear()
                woken = create_task(self._wake.wait(), name=f"ws-wake:{session.id}")
                await asyncio.wait((pumping, woken), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
            if pumping.done():
                reason = self._pump_ended(pumping)
                hold.log.finish()
                await self._let_connection_finish()
        finally:
            self.server.holds.ended(hold, reason)
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            if self.connection is not None:  # the session ends under its connection
                self.connection.kick(CLOSE_INTERNAL_ERROR if "overflow" in reason else CLOSE_GOING_AWAY, reason[:120])
            await self.server.close_session(session)

    def _pump_ended(self, pumping: asyncio.Task[None]) -> str:
        exc = None if pumping.cancelled() else pumping.exception()
        if isinstance(exc, SinkGone):
            log.warning("session %s: its resume buffer overflowed while no connection took its events; ending it", self.session.id)
            return (
                f"its resume buffer overflowed (more than {self.hold.log.max_events} events or {self.hold.log.max_bytes} bytes) while no connection took its events"
            )
        if exc is not None:
            log.error("session %s: its event pump failed", self.session.id, exc_info=exc)
            return "the server failed to send its events"
        return "the server ended it"

    async def _let_connection_finish(self) -> None:
        """The session ended from our side: the attached connection sends what is left, then closes."""
        deadline = time.monotonic() + self.server.config.limits.send_timeout_s
        while self.connection is not None and (left := deadline - time.monotonic()) > 0:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()


class _Connection:
    """One WebSocket of a session: a writer sending the replay log from ``cursor`` and a reader
    handing messages to the session, until either ends or another connection takes over."""

    def __init__(self, ws: WebSocket, kept: _Kept, cursor: int) -> None:
        self.ws = ws
        self.kept = kept
        self.cursor = cursor
        self._kicked: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self._reader: asyncio.Task[int] | None = None
        self._receiving = False

    def kick(self, code: int, reason: str) -> None:
        """Stop at once: a message still unread is never taken (the resumed client sends it again)."""
        if not self._kicked.done():
            self._kicked.set_result((code, reason))
        if self._reader is not None and self._receiving:
            self._reader.cancel()

    async def run(self, accept: tuple[str | None, list[tuple[bytes, bytes]]] | None) -> str:
        """How it ended: finished (the session ended and everything was sent), closed (with a close
        frame, either side's), dropped (lost, or a send that failed), kicked, or failed (a defect of ours)."""
        ws, session_id = self.ws, self.kept.session.id
        if accept is not None:
            try:
                await ws.accept(accept[0], headers=accept[1])
            except Exception:
                return "dropped"
        reader = self._reader = create_task(self._read(), name=f"ws-read:{session_id}")
        writer = create_task(self._write(), name=f"ws-write:{session_id}")
        if self._kicked.done():
            self.kick(*self._kicked.result())
        outcome = "failed"
        try:
            done, _ = await asyncio.wait((reader, writer, self._kicked), return_when=asyncio.FIRST_COMPLETED)
            if self._kicked in done:
                outcome = "kicked"
            elif reader in done:  # (its close code says more than a send that failed after it)
                exc = reader.exception()
                outcome = _loss(exc, session_id) if exc is not None else ("dropped" if reader.result() in LOST else "closed")
            else:
                outcome = "finished" if writer.exception() is None else _loss(writer.exception(), session_id)
        finally:
            writer.cancel()
            self.kick(CLOSE_GOING_AWAY, "")  # (a reader inside a message finishes it: ``finish``)
            await asyncio.gather(writer, return_exceptions=True)
        if outcome == "kicked":
            code, reason = self._kicked.result()
            with contextlib.suppress(Exception):
                await ws.close(code, reason)
        elif outcome == "failed":  # a defect of ours: tell the client so (1011), rather than drop the socket
            with contextlib.suppress(Exception):
                await ws.close(CLOSE_INTERNAL_ERROR, "internal error")
        elif outcome == "dropped":
            with contextlib.suppress(Exception):
                await ws.close(CLOSE_GOING_AWAY, "connection lost")
        return outcome

    async def finish(self) -> None:
        """Wait for the message being handled, if any (after the session was parked or ended: a
        handler waiting on a full log would otherwise wait for this connection's writer)."""
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> int:
        """Messages to the session until the client goes: the close code it went with."""
        ws, kept = self.ws, self.kept
        while not self._kicked.done():
            self._receiving = True
            try:
                message = await ws.receive()
            finally:
                self._receiving = False
            if message["type"] == "websocket.disconnect":
                return int(message.get("code", 1005))
            data = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            kept.hold.received += 1  # counted as it is read: a resume's count includes it even if it is still being handled
            await kept.take(data)
        return 1005

    async def _write(self) -> None:
        ws, kept = self.ws, self.kept
        log_, timeout, seq = kept.hold.log, kept.server.config.limits.send_timeout_s, self.cursor
        while (data := await log_.next(seq)) is not None:
            try:
                async with asyncio.timeout(timeout):
                    await ws.send_text(data)
            except TimeoutError:
                log.warning("session %s: client took no event for %.0f s; dropping it", kept.session.id, timeout)
                raise
            seq += 1
            log_.handed(seq)
        # The session ended from our side (shutdown) and everything was sent.
        with contextlib.suppress(Exception):
            await ws.close(CLOSE_GOING_AWAY, "server shutting down")


def _loss(exc: BaseException | None, session_id: str) -> str:
    """A connection task's failure: the client gone (dropped), or a defect of ours (failed)."""
    if isinstance(exc, (ConnectionError, TimeoutError, WebSocketDisconnect, RuntimeError, OSError)):
        return "dropped"
    log.error("session %s: connection task failed", session_id, exc_info=exc)
    return "failed"
