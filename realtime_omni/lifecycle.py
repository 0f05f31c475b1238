"""The server's lifecycle: one value, moved only by ``Server``, that ``/healthz`` and the process's
exit status are derived from.

    starting -> ready -> draining -> drained
    starting -> draining                      (SIGTERM, or a stop, before the pipeline was up)
    starting | draining | drained -> failed   (the start failed: nothing will be served)

``draining`` begins the moment new sessions are refused (SIGTERM turns it on at once, before the
drain itself runs); ``drained`` is reached once every session has been ended. A pipeline that fails
for good with ``on_pipeline_failure: exit`` drains the server the same way, and the value records
why and the exit status 3 a supervisor restarts it on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .states import move


class ServerState(enum.Enum):
    STARTING = "starting"  # loading the pipeline; HTTP answers meanwhile
    READY = "ready"  # serving
    DRAINING = "draining"  # no new sessions; the open ones run on, then are told and ended
    DRAINED = "drained"  # every session ended: the server stops
    FAILED = "failed"  # the start failed


SERVER_MOVES: dict[ServerState, frozenset[ServerState]] = {
    ServerState.STARTING: frozenset({ServerState.READY, ServerState.DRAINING, ServerState.FAILED}),
    ServerState.READY: frozenset({ServerState.DRAINING}),
    ServerState.DRAINING: frozenset({ServerState.DRAINED, ServerState.FAILED}),
    ServerState.DRAINED: frozenset({ServerState.FAILED}),
    ServerState.FAILED: frozenset(),
}

STARTUP_FAILED = 1  # the exit status of a server whose start failed
PIPELINE_FAILED = 3  # ... whose pipeline failed for good (``on_pipeline_failure: exit``)


@dataclass(frozen=True)
class Lifecycle:
    """Where the server is, and, once something failed, why and what the process exits with."""

    state: ServerState = ServerState.STARTING
    failure: str | None = None
    exit_code: int = 0

    def to(self, state: ServerState, *, failure: str | None = None, exit_code: int | None = None) -> Lifecycle:
        """The lifecycle after moving to ``state`` (staying where it is is no move), recording a
        failure's reason and exit status; ``IllegalMove`` for a move ``SERVER_MOVES`` does not list."""
        if state is not self.state:
            move(self.state, state, SERVER_MOVES, "server")
        return Lifecycle(state, failure or self.failure, self.exit_code if exit_code is None else exit_code)

    @property
    def admitting(self) -> bool:
        """New sessions may be opened (given capacity, a healthy pipeline and store)."""
        return self.state is ServerState.READY


def health_status(lifecycle: Lifecycle, *, pipeline_healthy: bool, store_error: str | None) -> str:
    """``/healthz``'s ``status``: ``ok`` (200) or why not (503): ``failed``, ``draining``,
    ``state_unavailable`` (the shared store is unreachable), ``unhealthy`` (the pipeline reports a
    failure, e.g. its engine died) or ``starting``."""
    state = lifecycle.state
    if state is ServerState.FAILED:
        return "failed"
    if state in (ServerState.DRAINING, ServerState.DRAINED):
        return "draining"
    if store_error is not None:
        return "state_unavailable"
    if state is ServerState.READY:
        return "ok" if pipeline_healthy else "unhealthy"
    return "starting"
