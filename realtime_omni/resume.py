"""A WebSocket session that outlives its connection (docs/realtime-api.md#resuming-a-session).

A phone that changes networks drops its socket without a close frame. Rather than end the session
there, the server keeps it for ``resume.grace_s``: a response under way runs on, its events kept,
and a new connection that names the session, proves it holds the session's secret and says which
event it saw last gets every event after that one, then the live ones. What this needs, with no I/O:

* ``ReplayLog``: the session's server events as they go out (encoded, in order), bounded in events
  and bytes. Each connection reads it from a cursor. Events a connection was handed may be dropped
  from the front to make room (the client most likely has them); events no connection was handed
  never are: while a connection is attached, recording waits for it (as a full outbox makes a
  producer wait), and while none is, a full log is an overflow, which ends the session, so no event
  is ever lost without the session saying so.
* ``Hold``: one resumable session's secret, its log, and the client messages it has handled over
  all its connections (a resumed client re-sends the ones after that count, which nothing else
  could tell it: what was in flight when the socket died is gone).
* ``Holds``: the server's resumable sessions by id, the reasons of those that ended lately, and a
  resume's checks, each refused with its own status (``errors.http_status``).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import RealtimeError
from .pump import Sink


class ReplayLog:
    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max(1, max_events)
        self.max_bytes = max_bytes
        self._entries: deque[tuple[str, str]] = deque()  # (event_id, encoded event)
        self._bytes = 0
        self.start = 0  # the sequence number of the oldest event held
        self._before_start = ""  # the id of the event just before it (a client that has it resumes at ``start``)
        self.sent = 0  # every event before this one was handed to a connection (the current one's cursor when it attached)
        self.attached = False
        self.finished = False  # the session's outbox closed: nothing more will be recorded
        self._grown = asyncio.Event()
        self._room = asyncio.Event()

    @property
    def end(self) -> int:
        """The sequence number the next event recorded gets."""
        return self.start + len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    async def record(self, event_id: str, data: str) -> bool:
        """Append one event, making room by dropping handed-out ones; False (overflow) when the
        log is full of events no connection has had and none is attached to take them."""
        size = len(data)
        while self._entries and (len(self._entries) >= self.max_events or self._bytes + size > self.max_bytes):
            if self.start < self.sent:
                self._drop_oldest()
                continue
            if not self.attached:
                return False
            self._room.clear()
            await self._room.wait()
        self._entries.append((event_id, data))
        self._bytes += size
        self._grown.set()
        return True

    def _drop_oldest(self) -> None:
        event_id, data = self._entries.popleft()
        self._bytes -= len(data)
        self._before_start = event_id
        self.start += 1

    def position_after(self, event_id: str) -> int | None:
        """Where a client that last saw ``event_id`` goes on ("": it saw nothing); None when that
        event is no longer held (nor the one before the oldest held)."""
        if not event_id:
            return 0 if self.start == 0 else None
        if event_id == self._before_start:
            return self.start
        for back, (held_id, _) in enumerate(reversed(self._entries)):
            if held_id == event_id:
                return self.end - back
        return None

    async def next(self, seq: int) -> str | None:
        """The event at ``seq``, waiting for it to be recorded; None once the log is finished and
        ``seq`` is past its end."""
        while seq >= self.end:
            if self.finished:
                return None
            self._grown.clear()
            await self._grown.wait()
        return self._entries[seq - self.start][1]

    def handed(self, seq: int) -> None:
        """Every event before ``seq`` was handed to the attached connection."""
        if seq > self.sent:
            self.sent = seq
            self._room.set()

    def attach(self, cursor: int) -> None:
        """A connection takes over from ``cursor``: what comes before it, the client has."""
        self.attached = True
        self.sent = cursor
        self._room.set()

    def detach(self) -> None:
        self.attached = False
        self._room.set()  # a recorder waiting for room: it may overflow now

    def finish(self) -> None:
        self.finished = True
        self._grown.set()


class LogSink(Sink):
    """A session's replay log as the one essential sink of its pump (a WebSocket session's only
    sink; a WebRTC call's first, before its sidebands); refusing an event is an overflow."""

    def __init__(self, log: ReplayLog, *, beta: bool) -> None:
        super().__init__(self._unused, beta=beta, name="replay log", essential=True)
        self.log = log

    @staticmethod
    async def _unused(data: str) -> bool:
        raise AssertionError("the replay log takes events with their ids")

    async def take(self, event_id: str, data: str) -> bool:
        return await self.log.record(event_id, data)


class Hold:
    """One resumable session: the secret that resumes it, the key it was opened with (an
    ephemeral key's tag: the same spent key may resume it), its log, the count of client
    messages it has taken, and the transport it lives on (``kind``: a WebSocket session is
    resumed by a WebSocket, a WebRTC call by an SDP offer)."""

    def __init__(self, session_id: str, log: ReplayLog, grace_s: float, key_tag: str | None = None, kind: str = "websocket") -> None:
        self.id = session_id
        self.kind = kind
        self.log = log
        self.grace_s = grace_s
        self.key_tag = key_tag
        self.token = secrets.token_urlsafe(32)  # never logged: it is all a resume needs beyond the key
        self.received = 0  # client messages taken from any connection, counted as each is read
        self.handling = asyncio.Lock()  # one client message at a time, whichever connection it came on
        self.keeper: Any = None  # what keeps the session between its connections (the transport's)

    def opened_by(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self.token.encode())

    def __repr__(self) -> str:  # no token in a log line, a traceback or a debugger
        return f"Hold({self.id!r}, received={self.received})"


@dataclass(frozen=True)
class _Ended:
    token: str
    reason: str
    at: float


class Holds:
    """The resumable sessions of one server, and why the latest ones ended (a resume that comes
    too late learns it, if it holds the token)."""

    def __init__(self, remember_ended: int = 1024, clock: Callable[[], float] = time.monotonic) -> None:
        self._live: dict[str, Hold] = {}
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        self._remember = remember_ended
        self._clock = clock

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._live

    def add(self, hold: Hold) -> None:
        self._live[hold.id] = hold

    def ended(self, hold: Hold, reason: str) -> None:
        if self._live.get(hold.id) is hold:
            del self._live[hold.id]
        self._ended[hold.id] = _Ended(hold.token, reason, self._clock())
        while len(self._ended) > self._remember:
            self._ended.popitem(last=False)

    def claim(
        self, session_id: str, token: str, last_event_id: str | None, *, key_tag: str | None, authorized: bool, kind: str = "websocket"
    ) -> tuple[Hold, int]:
        """The session to resume and where its replay begins, or the ``RealtimeError`` that refuses
        it: 404 nobody holds it (or holds it on another transport than ``kind``), 403 the token is not its own, 401 the key is neither the server's
        nor the ephemeral key that opened it, 410 it ended (why), 409 the event the client saw last
        is no longer held. ``last_event_id`` None: the replay begins where the last connection's
        sending stopped. A refusal changes nothing in the session."""
        hold = self._live.get(session_id)
        if hold is not None and hold.kind != kind:
            hold = None  # (its token is not checked: nothing about it is told)
        if hold is None:
            ended = self._ended.get(session_id)
            if ended is not None and hmac.compare_digest(token.encode(), ended.token.encode()):
                raise RealtimeError(f"Session {session_id} has ended: {ended.reason}.", code="session_ended")
            raise RealtimeError(f"No session {session_id[:64]!r} can be resumed here.", code="session_not_found")
        if not hold.opened_by(token):
            raise RealtimeError("The resume token is not this session's.", code="invalid_resume_token", type="authentication_error")
        if not authorized and (key_tag is None or hold.key_tag is None or not hmac.compare_digest(key_tag, hold.key_tag)):
            raise RealtimeError("Resume with the key the session was opened with, or the server's API key.", code="invalid_api_key", type="authentication_error")
        cursor = hold.log.sent if last_event_id is None else hold.log.position_after(last_event_id)
        if cursor is None or cursor < hold.log.start:
            raise RealtimeError(
                f"The event {(last_event_id or '')[:64]!r} is no longer held for this session (the client fell too far behind); it cannot resume.",
                code="resume_gap",
            )
        return hold, cursor
