"""The one loop between a session's outbox and the wire.

Every transport sends a session's events the same way: an ``EventPump`` takes each event from the
outbox, encodes it once per spelling its sinks want (GA, or beta names), and hands it to every
``Sink`` listening: a WebSocket, a WebRTC ``oai-events`` data channel, any number of sidebands.
A sink that cannot keep up (its ``send`` returns False or raises) is detached and closed; when it
is the session's own connection (``essential``) the pump ends with ``SinkGone``, so the transport
hangs up instead of letting the session wait on a client that stopped reading.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .protocol.codec import encode_server_event

if TYPE_CHECKING:
    from .metrics import Metrics
    from .session import Session

log = logging.getLogger(__name__)


class Sink:
    """One consumer of a session's events. ``send`` gets each encoded event and says whether it
    was taken."""

    def __init__(self, send: Callable[[str], Awaitable[bool]], *, beta: bool = False, name: str = "sink", essential: bool = False) -> None:
        self.send = send
        self.beta = beta
        self.name = name
        self.essential = essential

    async def take(self, event_id: str, data: str) -> bool:
        """One event, with its id (a sink that keeps events by id overrides this)."""
        return await self.send(data)

    def close(self) -> None:
        """No more events will come."""


class SidebandQueue(Sink):
    """The bounded queue between a pump and one sideband WebSocket. Full means the socket fell
    ``maxsize`` events behind: it is dropped rather than let the call wait on it."""

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


class SinkGone(ConnectionError):
    """The session's own connection stopped taking events."""

    def __init__(self, sink: Sink) -> None:
        super().__init__(f"the {sink.name} stopped taking events")
        self.sink = sink


class EventPump:
    def __init__(self, session: Session, metrics: Metrics) -> None:
        self.session = session
        self.metrics = metrics
        self.sinks: list[Sink] = []
        self._sink_added = asyncio.Event()

    def add(self, sink: Sink) -> None:
        self.sinks.append(sink)
        self._sink_added.set()

    def remove(self, sink: Sink) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)

    async def run(self, *, wait_for_sink: float | None = None) -> None:
        """Pump until the outbox is closed and drained; raises ``SinkGone`` when an essential
        sink fails. With ``wait_for_sink``, the first event waits (up to that many seconds) for a
        sink to attach, so a data channel that opens a moment after the answer still gets
        ``session.created``."""
        if wait_for_sink and not self.sinks:
            try:
                await asyncio.wait_for(self._sink_added.wait(), wait_for_sink)
            except TimeoutError:
                pass
        outbox, metrics = self.session.outbox, self.metrics
        try:
            while (event := await outbox.get()) is not None:
                encoded: dict[bool, str | None] = {}
                for sink in self.sinks[:]:
                    if sink.beta not in encoded:
                        raw = encode_server_event(event, beta_names=sink.beta)
                        encoded[sink.beta] = raw.decode() if raw is not None else None
                    data = encoded[sink.beta]
                    if data is None:
                        continue  # no such event in the beta protocol
                    try:
                        ok = await sink.take(getattr(event, "event_id", ""), data)
                    except Exception:
                        log.debug("session %s: %s failed", self.session.id, sink.name, exc_info=True)
                        ok = False
                    if not ok:
                        self.remove(sink)
                        sink.close()
                        if sink.essential:  # the session's own connection: its transport says why
                            raise SinkGone(sink)
                        log.warning("session %s: its %s stopped taking events; detaching it", self.session.id, sink.name)
                metrics.event_out(event.__struct_config__.tag)
        finally:
            for sink in self.sinks:
                sink.close()
