"""Stage graphs: each stage runs in its own task and hands chunks to the next through a bounded queue.

    async for chunk in chain(thinker(request), talker, code2wav, maxsize=4): ...

A stage is a function from an async iterator of its input to an async iterator of its output. A
full queue makes the producing stage wait (backpressure, never unbounded buffering). When the
consumer stops early or is cancelled, every stage task is cancelled and every stage generator is
closed, so their ``finally`` blocks (engine aborts) run before ``chain`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, TypeVar

T = TypeVar("T")

_END = object()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Handoff(AsyncIterator[T]):
    """Runs ``source`` in its own task; iterating the Handoff reads its items from a bounded queue."""

    def __init__(self, source: AsyncIterable[T], maxsize: int, name: str = "stage") -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)
        self._done = False
        self._task = asyncio.create_task(self._pump(source), name=name)

    async def _pump(self, source: AsyncIterable[T]) -> None:
        try:
            closing = contextlib.aclosing(source) if hasattr(source, "aclose") else contextlib.nullcontext(source)
            async with closing as items:
                async for item in items:
                    await self._queue.put(item)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which re-raises it
            await self._queue.put(_Failed(exc))
            return
        await self._queue.put(_END)

    def __aiter__(self) -> "Handoff[T]":
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            self._done = True
            raise StopAsyncIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.exc
        return item

    async def aclose(self) -> None:
        self._done = True
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def chain(
    source: AsyncIterable[Any],
    *stages: Callable[[AsyncIterator[Any]], AsyncIterator[Any]],
    maxsize: int = 4,
) -> AsyncIterator[Any]:
    handoffs: list[Handoff[Any]] = [Handoff(source, maxsize, name="stage-0")]
    for i, stage in enumerate(stages, 1):
        handoffs.append(Handoff(stage(handoffs[-1]), maxsize, name=f"stage-{i}"))
    try:
        async for item in handoffs[-1]:
            yield item
    finally:
        for h in reversed(handoffs):
            await h.aclose()
