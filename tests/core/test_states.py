"""The session's and a response's state machines, walked on the real objects: each legal move made
the way the product makes it, and moves the tables do not list refused (``IllegalMove``: a defect
of ours, never an ``error`` event). SIP calls have theirs in tests/transports/test_sip_call_states.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import numpy as np
import pytest

from pipelines.base import AudioChunk, TextDelta, Usage
from realtime_omni.config import Limits
from realtime_omni.metrics import Metrics
from realtime_omni.protocol import events as ev
from realtime_omni.protocol.audio import WireFormat
from realtime_omni.session import Session
from realtime_omni.session.audio_out import EventAudio
from realtime_omni.session.config import SessionConfig
from realtime_omni.session.context import LIFECYCLE_MOVES, Lifecycle
from realtime_omni.session.run import RUN_MOVES, ResponseRun, RunState
from realtime_omni.states import IllegalMove, move
from tests.core.test_run import WORD, ListPort, make_run
from tests.support.fake_pipeline import CAPS, FakePipeline

MANUAL = msgspec.json.decode(b'{"type": "realtime", "audio": {"input": {"turn_detection": null}}}', type=ev.SessionObject)


def test_move_takes_a_listed_move_and_refuses_the_rest_naming_both_states() -> None:
    for table in (LIFECYCLE_MOVES, RUN_MOVES):
        for current, allowed in table.items():
            for to in type(current):
                if to in allowed:
                    assert move(current, to, table, "x") is to
                else:
                    with pytest.raises(IllegalMove, match=f"x: {current.value} -> {to.value}"):
                        move(current, to, table, "x")


# ------------------------------------------------------------------------------ a session


def new_session() -> Session:
    pipeline = FakePipeline()
    return Session(pipeline, SessionConfig.default(pipeline.capabilities, "m").updated(MANUAL, pipeline.capabilities), Limits(), Metrics())


def refused(session: Session, to: Lifecycle) -> bool:
    try:
        session.ctx.move_to(to)
    except IllegalMove:
        return True
    return False


async def drained(session: Session) -> list[str]:
    """The types of everything the session queued, up to its outbox's end."""
    types = []
    while (event := await session.outbox.get()) is not None:
        types.append(event.__struct_config__.tag)
    return types


async def test_a_session_ended_by_the_server_goes_open_ending_closed() -> None:
    session = new_session()
    await session.start()
    assert session.ctx.lifecycle is Lifecycle.OPEN and refused(session, Lifecycle.OPEN)
    await session.end("The server is shutting down.", code="server_shutting_down")
    assert session.ctx.lifecycle is Lifecycle.ENDING
    assert refused(session, Lifecycle.OPEN) and refused(session, Lifecycle.ENDING)
    await session.end("again", code="server_shutting_down")  # already ending: nothing more is said
    assert await drained(session) == ["session.created", "conversation.created", "error"]
    await session.close()
    assert session.ctx.lifecycle is Lifecycle.CLOSED
    assert refused(session, Lifecycle.OPEN) and refused(session, Lifecycle.ENDING) and refused(session, Lifecycle.CLOSED)
    await session.close()  # closing twice is the transport's right: a no-op, not a move


async def test_a_session_whose_connection_went_goes_open_closed_and_cannot_end_after() -> None:
    session = new_session()
    await session.start()
    await session.close()
    assert session.ctx.lifecycle is Lifecycle.CLOSED
    await session.end("too late", code="server_shutting_down")  # no move to ending from closed
    assert session.ctx.lifecycle is Lifecycle.CLOSED and refused(session, Lifecycle.ENDING)
    assert await session.outbox.get() is None  # closed and emptied: nothing was queued after the close


# ------------------------------------------------------------------------------ a response


async def test_a_run_goes_created_streaming_finishing_done_and_cannot_run_again() -> None:
    seen: list[RunState] = []
    run: ResponseRun | None = None

    async def chunks() -> AsyncIterator[Any]:
        assert run is not None
        seen.append(run.state)  # while the pipeline streams
        yield TextDelta("hello")
        yield AudioChunk(np.ones(WORD, np.int16))
        yield Usage(output_tokens=1)

    port = ListPort()
    run = make_run(port, chunks())
    assert run.state is RunState.CREATED
    outcome = await run.run()
    assert seen == [RunState.STREAMING] and run.state is RunState.DONE and outcome.status == "completed"
    with pytest.raises(IllegalMove, match="response resp_1: done -> streaming"):
        await run.run()
    assert port.take()[-1] == "response.done"


async def test_a_run_cancelled_before_it_started_still_walks_to_done_and_says_so() -> None:
    started = asyncio.Event()

    async def never() -> AsyncIterator[Any]:
        started.set()
        yield TextDelta("never sent")

    port = ListPort()
    run = make_run(port, never())
    run.task = asyncio.create_task(run.run())
    await run.cancel("client_cancelled")  # the task has not run a line yet: cancel_reason, not task.cancel()
    assert run.state is RunState.DONE and run.status == "cancelled" and not started.is_set()
    assert port.take() == ["response.created", "rate_limits.updated", "response.done"]


async def test_a_finishing_run_is_no_longer_muted_or_cancelled() -> None:
    """Once the pipeline's stream is over, the answer is complete: a cut that comes while it is
    finishing (the last of its audio still being handed over) changes nothing of it."""
    gate = asyncio.Event()
    port = ListPort()

    class HeldAudio(EventAudio):
        async def finish(self, run: ResponseRun, message: Any, index: int) -> None:
            await gate.wait()  # the run is finishing, waiting on the way out
            await super().finish(run, message, index)

    async def one_word() -> AsyncIterator[Any]:
        yield TextDelta("hi")
        yield AudioChunk(np.ones(WORD, np.int16))

    run = make_run(port, one_word(), HeldAudio(port, CAPS.output_rate, WireFormat.PCM16))
    run.task = asyncio.create_task(run.run())
    while run.state is not RunState.FINISHING:
        await asyncio.sleep(0)
    assert run.mute() is None and not run.muted
    cancelling = asyncio.create_task(run.cancel("client_cancelled"))
    gate.set()
    await cancelling
    assert run.state is RunState.DONE and run.status == "completed" and run.cancel_reason is None
