"""Media calls (WebRTC, SIP): a session whose audio travels as a media stream, addressed by a
``call_id`` the way OpenAI's calls are.

A call owns its session's outbox: one pump reads the session's events and hands each to every
*sink* listening to the call: the WebRTC ``oai-events`` data channel, and any number of WebSocket
sidebands (``GET /v1/realtime?call_id=``) an application attaches to watch and steer the call. A
sink that cannot keep up is detached (a sideband) or ends the call (its own data channel) instead
of stalling the others or growing memory.

Transports subclass ``Call`` and implement ``_teardown`` (close the media connection) and, for
SIP, the call-control verbs ``accept``/``reject``/``refer``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import RealtimeError
from .ids import new_id
from .protocol.codec import encode_server_event

if TYPE_CHECKING:
    from .server import Server
    from .session import Session

log = logging.getLogger(__name__)


class Sink:
    """One consumer of a call's events. ``send`` gets each encoded event; a sink that returns
    False (or raises) is detached and closed."""

    def __init__(self, send: Callable[[str], Awaitable[bool]], *, beta: bool = False, name: str = "sink") -> None:
        self.send = send
        self.beta = beta
        self.name = name

    def close(self) -> None:
        """No more events will come."""


class SidebandQueue(Sink):
    """The bounded queue between a call's pump and one sideband WebSocket. Full means the socket
    fell ``maxsize`` events behind: it is dropped rather than let the call wait on it."""

    def __init__(self, maxsize: int, *, beta: bool) -> None:
        super().__init__(self.put, beta=beta, name="sideband")
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize)

    async def put(self, data: str) -> bool:
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            return False
        return True

    def close(self) -> None:
        while True:  # make room for the end marker: the socket is going away anyway
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()


class Call:
    kind = "call"

    def __init__(self, server: Server, session: Session | None = None, call_id: str | None = None) -> None:
        self.server = server
        self.id = call_id or new_id("rtc")
        self.session: Session | None = session
        self.created_at = time.time()
        self.sinks: list[Sink] = []
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self._pump: asyncio.Task[None] | None = None
        self._hangup: asyncio.Task[None] | None = None
        self._sink_added = asyncio.Event()

    # ------------------------------------------------------------------ registry

    def register(self) -> None:
        self.server.calls[self.id] = self

    def start_events(self, *, wait_for_sink: float | None = None) -> None:
        """Start pumping the session's events. With ``wait_for_sink``, the first events wait (up
        to that many seconds) for a sink to attach, so a data channel that opens a moment after
        the answer still gets ``session.created``."""
        self._pump = asyncio.create_task(self._run_pump(wait_for_sink), name=f"call-events:{self.id}")

    def add_sink(self, sink: Sink) -> None:
        self.sinks.append(sink)
        self._sink_added.set()

    def attach_sideband(self, *, beta: bool) -> SidebandQueue:
        if self.ended.is_set():
            raise RealtimeError(f"Call {self.id!r} has ended.", code="call_not_found", param="call_id")
        if self.session is None:
            raise RealtimeError(f"Call {self.id!r} is still ringing: accept it first.", code="call_not_accepted", param="call_id")
        queue = SidebandQueue(self.server.config.limits.outbox_events, beta=beta)
        self.add_sink(queue)
        return queue

    def detach_sideband(self, queue: SidebandQueue) -> None:
        if queue in self.sinks:
            self.sinks.remove(queue)

    async def _run_pump(self, wait_for_sink: float | None) -> None:
        session = self.session
        assert session is not None
        if wait_for_sink:
            try:
                await asyncio.wait_for(self._sink_added.wait(), wait_for_sink)
            except TimeoutError:
                pass
        metrics = self.server.metrics
        while (event := await session.outbox.get()) is not None:
            encoded: dict[bool, str | None] = {}
            for sink in list(self.sinks):
                if sink.beta not in encoded:
                    data = encode_server_event(event, beta_names=sink.beta)
                    encoded[sink.beta] = data.decode() if data is not None else None
                data = encoded[sink.beta]
                if data is None:
                    continue
                try:
                    ok = await sink.send(data)
                except Exception:
                    log.debug("call %s: %s failed", self.id, sink.name, exc_info=True)
                    ok = False
                if not ok:
                    self._drop_sink(sink)
            metrics.event_out(event.__struct_config__.tag)
        for sink in self.sinks:
            sink.close()

    async def events_sent(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until the pump has handed out everything of a closed outbox."""
        if self._pump is not None:
            await asyncio.wait({self._pump}, timeout=timeout)

    def _drop_sink(self, sink: Sink) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)
        sink.close()
        log.warning("call %s: its %s stopped taking events; detaching it", self.id, sink.name)
        if sink.name == "data-channel":
            log.warning("call %s: the data channel stopped taking events; hanging up", self.id)
            self._hangup = asyncio.get_running_loop().create_task(self.hangup("client_gone"))

    # ------------------------------------------------------------------ control

    async def accept(self, session_update: Any) -> None:
        raise RealtimeError(f"Call {self.id!r} is a {self.kind} call; only SIP calls are accepted or rejected.", code="invalid_call_action")

    async def reject(self, status_code: int) -> None:
        raise RealtimeError(f"Call {self.id!r} is a {self.kind} call; only SIP calls are accepted or rejected.", code="invalid_call_action")

    async def refer(self, target_uri: str) -> None:
        raise RealtimeError(f"Call {self.id!r} is a {self.kind} call; only SIP calls can be referred.", code="invalid_call_action")

    async def hangup(self, reason: str = "hangup") -> None:
        """End the call: close the media connection, the session and every sideband. Idempotent."""
        if self.ended.is_set():
            return
        self.ended.set()
        self.end_reason = reason
        try:
            await self._teardown()
        except Exception:
            log.exception("call %s: teardown failed", self.id)
        if self.session is not None:
            self.session.outbox.close()
            await self.server.close_session(self.session)
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        for sink in self.sinks:
            sink.close()
        self.sinks.clear()
        self.server.calls.pop(self.id, None)
        log.info("call %s ended (%s)", self.id, reason)

    async def _teardown(self) -> None:
        """Close the transport's side (peer connection, SIP dialog)."""
