"""Speculation, written once for every pipeline that answers ahead of the end of the turn.

At a pause in the user's speech a pipeline may start on the answer the turn would get (the cascade:
Whisper's transcript so far -> thinker -> talker; an omni model: the turn's audio so far), into a
bounded buffer nobody reads yet: a ``Production``. Each session holds at most one
``Speculation`` at a time, in its ``Ahead``:

    pause      ahead.start(spec)        the old one, if any, is voided
    resume     ahead.drop()             the user spoke on: voided (its prompt stays in the prefix cache)
    commit     ahead.bind(item_id)      the turn ended: the speculation is for that item now
    respond    spec = await ahead.claim(request)
               ahead.settle(spec, fits) the production if it made exactly this answer, else voided
    clear      ahead.drop()
    close      await ahead.close()

What "exactly this answer" means is the pipeline's business (the cascade compares token prompts,
an omni session whole request bodies); the moves, the counts (``speculations_started``,
``_adopted``, ``_discarded``) and the rule that a speculation is only ever adopted by the response
for the user item it was bound to are here. Voiding is done in the background (closing a
production's stream makes the engine abort it), so no caller waits on an engine to drop work.
Nothing speculative reaches a client before ``respond`` hands its production over.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pipelines.base import Message, OutputChunk, ResponseRequest
from pipelines.stages import Handoff


class Production:
    """One answer produced by its own task into a bounded buffer (a ``Handoff``), so it can start
    before anyone reads it and be handed to ``respond`` as it is. ``times``: perf_counter stamps of
    the answer's stage firsts (``first_audio``, ...), set by the producer."""

    def __init__(self, chunks: AsyncIterator[OutputChunk], buffer: int, name: str, times: dict[str, float] | None = None) -> None:
        self.times: dict[str, float] = {} if times is None else times
        self.output: Handoff[OutputChunk] = Handoff(chunks, buffer, name=name)

    async def cancel(self) -> None:
        await self.output.aclose()


P = TypeVar("P", bound=Production)


@dataclass(eq=False, kw_only=True)
class Speculation(Generic[P]):
    """An answer started ahead of the turn's end. ``production`` may come later than the
    speculation itself, made by ``task`` (the cascade's waits for the transcript first)."""

    production: P | None = None
    task: asyncio.Task[None] | None = None
    item_id: str | None = None  # the user item it answers, bound at commit

    def void(self) -> None:
        """Called at once when it is dropped, before its work is stopped in the background."""

    async def cancel(self) -> None:
        """Stop its work: the task that would make the production, then the production."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if self.production is not None:
            await self.production.cancel()

    async def settled(self) -> None:
        """Wait for the production to be made (or to fail to be)."""
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


S = TypeVar("S", bound=Speculation[Any])


@dataclass
class SpeculationCounts:
    """A pipeline's speculations, shared by its sessions: started, adopted (their production
    answered the response), discarded (voided)."""

    started: int = 0
    adopted: int = 0
    discarded: int = 0

    def stats(self, name: str = "speculations") -> dict[str, float]:
        return {f"{name}_started": self.started, f"{name}_adopted": self.adopted, f"{name}_discarded": self.discarded}


def last_user_item(request: ResponseRequest) -> Message | None:
    return next((i for i in reversed(request.items) if isinstance(i, Message) and i.role == "user"), None)


class Ahead(Generic[S]):
    """A session's one speculation at a time (the moves are in the module's docstring). ``counts``
    is the pipeline's, shared by its sessions; a start and an adoption may be counted under
    other counts (a kind of speculation of its own), a discard always under these."""

    def __init__(self, counts: SpeculationCounts) -> None:
        self.current: S | None = None
        self.counts = counts
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, spec: S, counts: SpeculationCounts | None = None) -> S:
        self.drop()
        self.current = spec
        (counts or self.counts).started += 1
        return spec

    def drop(self) -> None:
        spec, self.current = self.current, None
        if spec is not None:
            self.discard(spec)

    def bind(self, item_id: str) -> S | None:
        """The turn was committed as ``item_id``: the open speculation, if any, answers it."""
        spec = self.current
        if spec is None or spec.item_id is not None:
            return None
        spec.item_id = item_id
        return spec

    async def claim(self, request: ResponseRequest) -> S | None:
        """The speculation bound to the request's last user item, taken out of the slot once its
        production is made; None if there is none for that item."""
        spec = self.current
        if spec is None or spec.item_id is None:
            return None
        last_user = last_user_item(request)
        if last_user is None or last_user.id != spec.item_id:
            return None
        self.current = None
        await spec.settled()
        return spec

    def settle(self, spec: S, fits: bool, counts: SpeculationCounts | None = None) -> Production | None:
        """A claimed speculation's production if ``fits`` (it made exactly the answer asked for),
        counted as adopted (under ``counts`` if given); otherwise it is voided and None returned."""
        if fits and spec.production is not None:
            (counts or self.counts).adopted += 1
            return spec.production
        self.discard(spec)
        return None

    def discard(self, spec: S) -> None:
        self.counts.discarded += 1
        spec.void()
        self.background(spec.cancel())

    def background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop the open speculation and wait for every voided one's work to end."""
        spec, self.current = self.current, None
        if spec is not None:
            spec.void()
            await spec.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
