"""The server's lifecycle (``realtime_omni.lifecycle``): its table of moves, the ``/healthz`` status
derived from it, and the moves ``Server`` makes, on a real server with the synthetic pipeline."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from realtime_omni.config import from_dict
from realtime_omni.lifecycle import PIPELINE_FAILED, SERVER_MOVES, STARTUP_FAILED, Lifecycle, ServerState, health_status
from realtime_omni.server import Server
from realtime_omni.states import IllegalMove, move
from tests.conftest import synthetic_config
from tests.support.fake_pipeline import CAPS, FakePipeline


def test_the_table_takes_its_moves_and_refuses_the_rest() -> None:
    for current, allowed in SERVER_MOVES.items():
        for to in ServerState:
            if to in allowed:
                assert move(current, to, SERVER_MOVES, "server") is to
            else:
                with pytest.raises(IllegalMove, match=f"server: {current.value} -> {to.value}"):
                    move(current, to, SERVER_MOVES, "server")
    assert not SERVER_MOVES[ServerState.FAILED]  # the end
    with pytest.raises(IllegalMove):
        Lifecycle(ServerState.DRAINING).to(ServerState.READY)  # a drain is never undone


def test_staying_is_no_move_and_a_failure_is_kept() -> None:
    failing = Lifecycle(ServerState.READY).to(ServerState.DRAINING, failure="engine died", exit_code=PIPELINE_FAILED)
    drained = failing.to(ServerState.DRAINED)
    assert (drained.state, drained.failure, drained.exit_code) == (ServerState.DRAINED, "engine died", PIPELINE_FAILED)
    assert failing.to(ServerState.DRAINING) == failing


@pytest.mark.parametrize(
    ("state", "pipeline_healthy", "store_error", "status"),
    [
        (ServerState.STARTING, True, None, "starting"),
        (ServerState.STARTING, True, "Redis down", "state_unavailable"),
        (ServerState.READY, True, None, "ok"),
        (ServerState.READY, False, None, "unhealthy"),
        (ServerState.READY, False, "Redis down", "state_unavailable"),
        (ServerState.DRAINING, True, "Redis down", "draining"),
        (ServerState.DRAINED, True, None, "draining"),
        (ServerState.FAILED, True, "Redis down", "failed"),
    ],
)
def test_healthz_status_is_derived_from_the_lifecycle_first(state: ServerState, pipeline_healthy: bool, store_error: str | None, status: str) -> None:
    assert health_status(Lifecycle(state), pipeline_healthy=pipeline_healthy, store_error=store_error) == status


@pytest.mark.slow  # the drain waits out shutdown_grace_s (5 s) for the open session
async def test_a_server_goes_starting_ready_draining_drained_and_a_second_drain_waits_for_the_first() -> None:
    server = Server(from_dict(synthetic_config()))
    assert server.lifecycle.state is ServerState.STARTING and server.status == "starting"
    await server.start()
    assert server.ready and server.healthy
    await server.open_session(beta=False, transport="test", model=None, admission=await server.admit(None))
    first = asyncio.create_task(server.drain())
    await asyncio.sleep(0)
    assert server.status == "draining" and not server.ready
    await server.drain()  # waits for the first: every session is closed when it returns
    assert not server.sessions and server.lifecycle.state is ServerState.DRAINED
    await first
    await server.stop()
    assert server.lifecycle.exit_code == 0


async def test_sigterm_before_the_pipeline_is_up_drains_and_the_start_does_not_make_it_ready() -> None:
    server = Server(from_dict(synthetic_config()))
    server.stop_admitting()
    assert server.status == "draining"
    await server.start()
    assert server.lifecycle.state is ServerState.DRAINING and not server.healthy
    await server.stop()
    assert server.lifecycle.state is ServerState.DRAINED


async def test_a_failed_start_in_the_background_says_failed_and_exits_1() -> None:
    server = Server(from_dict(synthetic_config(session={"audio": {"output": {"voice": "nobody"}}})))
    fatal = asyncio.Event()
    server.on_fatal = fatal.set
    server.start_in_background()
    await asyncio.wait_for(fatal.wait(), 10)
    assert server.status == "failed" and server.lifecycle.exit_code == STARTUP_FAILED
    assert "voice" in (server.lifecycle.failure or "")
    await server.stop()
    assert server.status == "failed"  # the drain keeps the failure


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather.", "parameters": {"type": "object", "properties": {}}}


class LearnsTools(FakePipeline):
    """A pipeline that knows whether it calls tools only once started (the cascade: its thinker's
    chat template)."""

    def __init__(self, tools: bool) -> None:
        super().__init__()
        self.capabilities = dataclasses.replace(CAPS, tools=False)
        self.tools = tools
        self.started = False

    async def start(self) -> None:
        self.started = True
        self.capabilities = dataclasses.replace(self.capabilities, tools=self.tools)


async def test_configured_default_tools_are_checked_once_the_pipeline_knows_it_calls_tools() -> None:
    server = Server(from_dict(synthetic_config(session={"tools": [WEATHER]})), pipeline=LearnsTools(tools=True))
    await server.start()
    assert server.ready and [t.name for t in server.defaults.tools] == ["get_weather"]
    await server.stop()
    # a pipeline that turns out not to call tools: the start fails and says why
    server = Server(from_dict(synthetic_config(session={"tools": [WEATHER]})), pipeline=LearnsTools(tools=False))
    with pytest.raises(ValueError, match="session.tools"):
        await server.start()
    await server.stop()
    # a wrong value beside them still fails before any model is loaded
    pipeline = LearnsTools(tools=True)
    server = Server(from_dict(synthetic_config(session={"tools": [WEATHER], "audio": {"output": {"voice": "nobody"}}})), pipeline=pipeline)
    with pytest.raises(ValueError, match="voice"):
        await server.start()
    assert not pipeline.started
    await server.stop()
