"""The idle timeout (server VAD's ``idle_timeout_ms``): after an answer has played, a user silent
that long is prompted. The audio since the answer ended is committed as a user item
(``input_audio_buffer.timeout_triggered``) and answered.

A part of the session (see session.py). The responses part arms it when an in-band answer ends,
handing over how to start the prompt's response; starting a response, speech starting, a change of
turn detection and the session's end disarm it. That hand-over is held only by the armed timer's
task, so this part keeps no lasting reference to the responses part that uses it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from ..errors import RealtimeError
from ..ids import new_id
from ..protocol import events as ev
from .context import SessionContext
from .run import Outcome, Runs
from .user_input import UserInput


class StartResponse(Protocol):
    def __call__(self, params: ev.ResponseParams, started_at: float) -> Awaitable[Any]: ...


class IdleTimeout:
    def __init__(self, ctx: SessionContext, user: UserInput, runs: Runs) -> None:
        self.ctx = ctx
        self.user = user
        self.runs = runs
        self.since: int | None = None  # the buffer position the idle period started at, while armed
        self._timer: asyncio.Task[None] | None = None

    def arm(self, outcome: Outcome, respond: StartResponse) -> None:
        """The in-band answer ``outcome`` tells of has ended: count from the end of its playback."""
        ctx = self.ctx
        vad = ctx.config.vad
        if vad is None or not vad.idle_timeout_ms or not ctx.open:
            return
        playback_end = max(outcome.done_at, (outcome.first_audio_at or outcome.done_at) + outcome.audio_seconds)
        delay = playback_end - time.perf_counter() + vad.idle_timeout_ms / 1000.0
        self.since = self.user.buffer.end
        self._timer = ctx.tasks.spawn(self._expire(delay, respond), "idle")

    def cancel(self) -> None:
        self.since = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _expire(self, delay: float, respond: StartResponse) -> None:
        await asyncio.sleep(max(0.0, delay))
        since, self._timer, self.since = self.since, None, None
        ctx, user = self.ctx, self.user
        if user.turn is not None or self.runs.active is not None or ctx.closed:
            return
        item_id = new_id("item")
        start, end = max(user.buffer.start, since or 0), user.buffer.end
        await ctx.emit(ev.InputAudioBufferTimeoutTriggered(audio_start_ms=ctx.ms(start), audio_end_ms=ctx.ms(end), item_id=item_id))
        await user.commit(item_id, start, end)
        try:
            await respond(ev.ResponseParams(), started_at=time.perf_counter())
        except RealtimeError as err:  # e.g. the session's tool_choice no longer fits its tools
            await ctx.report(err)
