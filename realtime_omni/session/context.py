"""What every part of a session shares: its settings as they stand, its lifecycle, its pipeline
session and background tasks, and the one way out for its events.

The parts of a session (session.py lists them) are each given this and the few other parts they
call, never the session itself. It holds no part, so nothing here leads back up to one: a closed
session's parts, its conversation and its audio are freed the moment the session is dropped,
without waiting for the cyclic garbage collector.

A session's lifecycle is a ``Lifecycle``: open, then ending (the server ends it: the client is told
why and the outbox drains) or at once closed (the connection is gone: everything is released).
"""

from __future__ import annotations

import enum
from typing import Any

from pipelines.base import Capabilities, PipelineSession

from ..config import Limits
from ..errors import RealtimeError
from ..ids import EventIds
from ..metrics import Metrics
from ..protocol import events as ev
from ..protocol.audio import samples_to_ms
from ..states import move
from ..tasks import TaskSet
from ..tracing import NO_SESSION, SessionTrace
from .config import SessionConfig
from .draft import Weight
from .outbox import EventOwner, Outbox


class Lifecycle(enum.Enum):
    OPEN = "open"
    ENDING = "ending"
    CLOSED = "closed"


LIFECYCLE_MOVES: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.OPEN: frozenset({Lifecycle.ENDING, Lifecycle.CLOSED}),
    Lifecycle.ENDING: frozenset({Lifecycle.CLOSED}),
    Lifecycle.CLOSED: frozenset(),
}


class SessionContext:
    def __init__(
        self,
        session_id: str,
        caps: Capabilities,
        config: SessionConfig,
        limits: Limits,
        metrics: Metrics,
        pipe: PipelineSession,
        *,
        timing_metadata: bool,
        trace: SessionTrace = NO_SESSION,
    ) -> None:
        self.id = session_id
        self.caps = caps
        self.config = config  # replaced whole by session.update
        self.limits = limits
        self.metrics = metrics
        self.pipe = pipe
        self.timing_metadata = timing_metadata
        self.trace = trace  # its spans (tracing.py): hooks that do nothing unless traces are on
        self.outbox = Outbox(limits.outbox_events)
        self.tasks = TaskSet(session_id)  # transcriptions, timers, events emitted from callbacks
        self.lifecycle = Lifecycle.OPEN
        self._event_id = EventIds()

    def move_to(self, state: Lifecycle) -> None:
        self.lifecycle = move(self.lifecycle, state, LIFECYCLE_MOVES, f"session {self.id}")

    @property
    def open(self) -> bool:
        return self.lifecycle is Lifecycle.OPEN

    @property
    def closed(self) -> bool:
        return self.lifecycle is Lifecycle.CLOSED

    def ms(self, samples: int) -> int:
        """Input samples (at the pipeline's input rate) in ms."""
        return samples_to_ms(samples, self.caps.input_rate)

    # ------------------------------------------------------------------ events out

    async def emit(self, event: Any, owner: EventOwner | None = None, weight: Weight | None = None) -> bool:
        if isinstance(event, ev.ServerEvent):
            event.event_id = self._event_id()
        if isinstance(event, ev.Error):
            self.metrics.errors.labels(event.error.code or "none").inc()
        return await self.outbox.put(event, owner, weight)

    def emit_soon(self, event: Any) -> None:
        """Emit from a callback that cannot wait (the playout's clock): in a task of its own,
        unless the session is closed."""
        if not self.closed:
            self.tasks.spawn(self.emit(event), "notify")

    def purge(self, owner: EventOwner) -> list[Weight]:
        return self.outbox.purge(owner)

    async def emit_error(
        self, message: str, *, code: str | None, param: str | None = None, type: str = "invalid_request_error", event_id: str | None = None
    ) -> None:
        await self.emit(ev.Error(error=ev.ErrorDetail(type=type, code=code, message=message, param=param, event_id=event_id)))

    async def report(self, err: RealtimeError) -> None:
        """A client mistake (or a transport's trouble with its input) as an ``error`` event."""
        await self.emit_error(err.message, code=err.code, param=err.param, type=err.type, event_id=err.event_id)
