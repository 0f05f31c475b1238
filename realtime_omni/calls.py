"""Media calls (WebRTC, SIP): a session whose audio travels as a media stream, addressed by a
``call_id`` the way OpenAI's calls are.

A call's session events go out through an ``EventPump`` (pump.py) to every sink listening: the
WebRTC ``oai-events`` data channel, and any number of WebSocket sidebands (``GET
/v1/realtime?call_id=``) an application attaches to watch and steer the call. A sink that cannot
keep up is detached (a sideband) or ends the call (its own data channel) instead of stalling the
others or growing memory.

Incoming audio takes one path for every media transport (``MediaInput``: resampled frame by frame
to the pipeline's rate, pushed into the session, refusals reported as ``error`` events), and one
watchdog (``watch_media``) hangs up a call whose media never starts or stops arriving.

A call is held by the server (``Server.calls.add``: by its id, and in the shared store for the
other replicas); the call reports its end to whoever listens (``on_end``) and writes no owner's
table itself. Transports subclass ``Call`` and implement ``_teardown`` (close the media connection) and, for
SIP, the call-control verbs ``accept``/``reject``/``refer``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from dsp.resample import PolyphaseResampler

from .errors import RealtimeError
from .ids import new_id
from .pump import EventPump, SidebandQueue, Sink, SinkGone
from .tasks import create_task

if TYPE_CHECKING:
    from .server import Server
    from .session import Session

log = logging.getLogger(__name__)


def live_call(server: Server, call_id: str) -> Call:
    """The live call ``call_id``, or ``RealtimeError`` ``call_not_found``."""
    call = server.calls.get(call_id)
    if not isinstance(call, Call):
        raise RealtimeError(f"No live call with id {call_id!r}.", code="call_not_found", param="call_id")
    return call


class Call:
    kind = "call"

    def __init__(self, server: Server, session: Session | None = None, call_id: str | None = None) -> None:
        self.server = server
        self.id = call_id or new_id("rtc")
        self.session: Session | None = session
        self.created_at = time.time()
        self.pump: EventPump | None = None
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self._pump: asyncio.Task[None] | None = None
        self._hangup: asyncio.Task[None] | None = None
        self._end_listeners: list[Callable[[Call], Awaitable[None]]] = []  # the owners holding it

    def on_end(self, listener: Callable[[Call], Awaitable[None]]) -> None:
        """Have ``listener`` awaited once the call has ended (its media, session and sinks closed)."""
        self._end_listeners.append(listener)

    def start_events(self, *, wait_for_sink: float | None = None) -> None:
        """Start pumping the session's events (see ``EventPump.run`` for ``wait_for_sink``)."""
        assert self.session is not None and self.pump is None
        self.pump = EventPump(self.session, self.server.metrics)
        self._pump = create_task(self._run_pump(self.pump, wait_for_sink), name=f"call-events:{self.id}")

    async def _run_pump(self, pump: EventPump, wait_for_sink: float | None) -> None:
        try:
            await pump.run(wait_for_sink=wait_for_sink)
        except SinkGone as gone:
            # a resumable call's replay log refuses an event only when it overflowed with no peer to take it
            reason = "resume_buffer_overflow" if gone.sink.name == "replay log" else "client_gone"
            log.warning("call %s: %s stopped taking events; hanging up", self.id, gone.sink.name)
            self._hangup = create_task(self.hangup(reason), name=f"hangup:{self.id}")

    def add_sink(self, sink: Sink) -> None:
        assert self.pump is not None
        self.pump.add(sink)

    def attach_sideband(self, *, beta: bool) -> SidebandQueue:
        if self.ended.is_set():
            raise RealtimeError(f"Call {self.id!r} has ended.", code="call_not_found", param="call_id")
        if self.session is None or self.pump is None:
            raise RealtimeError(f"Call {self.id!r} is still ringing: accept it first.", code="call_not_accepted", param="call_id")
        queue = SidebandQueue(self.server.config.limits.outbox_events, beta=beta)
        self.add_sink(queue)
        return queue

    def detach_sideband(self, queue: SidebandQueue) -> None:
        if self.pump is not None:
            self.pump.remove(queue)

    async def events_sent(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until the pump has handed out everything of a closed outbox."""
        if self._pump is not None:
            await asyncio.wait({self._pump}, timeout=timeout)

    async def watch_media(self, media: MediaInput, *, timeout: float, reason: str, connect_timeout: float | None = None) -> None:
        """Hang up when no audio came for ``timeout`` s (``reason``), or, with ``connect_timeout``,
        when none came at all that long after the watch began."""
        started = time.monotonic()
        while not self.ended.is_set():
            await asyncio.sleep(min(0.5, timeout / 4))
            now = time.monotonic()
            if not media.last_at:
                if connect_timeout is not None and now - started > connect_timeout:
                    reason = "connect_timeout"
                    break
            elif now - media.last_at > timeout:
                break
        else:
            return
        self._media_lost(reason)

    def _media_lost(self, reason: str) -> None:
        """No media (``reason``): hang up (a transport that keeps calls for a resume overrides it)."""
        log.info("call %s: %s; hanging up", self.id, reason)
        self._hangup = create_task(self.hangup(reason), name=f"hangup:{self.id}")  # (hangup cancels this task)

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
            await self.server.close_session(self.session)
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        if self.pump is not None:
            for sink in self.pump.sinks:
                sink.close()
            self.pump.sinks.clear()
        for listener in self._end_listeners:
            await listener(self)
        log.info("call %s ended (%s)", self.id, reason)

    async def _teardown(self) -> None:
        """Close the transport's side (peer connection, SIP dialog)."""


class MediaInput:
    """A call's incoming audio, the one path for every media transport: each frame, at whatever
    rate it comes, is resampled on its own (a polyphase filter: soxr's stream would hold 20-36 ms
    of each 20 ms frame, delaying every turn's end that much) and pushed into the session; a frame
    the session refuses becomes an ``error`` event. ``last_at`` (when media last arrived) is what
    ``Call.watch_media`` reads."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.frames = 0
        self.last_at = 0.0
        self._resample: PolyphaseResampler | None = None

    def arrived(self) -> None:
        """Media arrived (a frame, or any packet that shows the peer is there)."""
        self.last_at = time.monotonic()

    async def push(self, pcm: np.ndarray, rate: int) -> None:
        self.frames += 1
        if self._resample is None or self._resample.in_rate != rate:
            self._resample = PolyphaseResampler(rate, self.session.caps.input_rate)
        try:
            await self.session.push_audio(self._resample(pcm))
        except RealtimeError as err:
            await self.session.report(err)
