"""Stage graphs: each stage runs in its own task and hands chunks to the next through a bounded queue.

    async with chain(thinker(request), talker, code2wav, maxsize=4) as stream:
        async for chunk in stream: ...

A stage is a function from an async iterator of its input to an async iterator of its output. A
full queue makes the producing stage wait (backpressure, never unbounded buffering). When the
consumer leaves the ``async with`` (done, stopped early or cancelled), every stage task is cancelled
and every stage generator is closed, so their ``finally`` blocks (engine aborts) run before it
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

_END = object()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


@runtime_checkable
class _Closable(Protocol):
    def aclose(self) -> Awaitable[object]: ...


async def _pump(source: AsyncIterable[Any], queue: asyncio.Queue[Any]) -> None:
    try:
        async with contextlib.AsyncExitStack() as closing:
            if isinstance(source, _Closable):
                closing.push_async_callback(source.aclose)
            async for item in source:
                await queue.put(item)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # handed to the consumer, which re-raises it
        await queue.put(_Failed(exc))
        return
    await queue.put(_END)


class Handoff(AsyncIterator[T]):
    """Runs ``source`` in its own task; iterating the Handoff reads its items from a bounded queue."""

    def __init__(self, source: AsyncIterable[T], maxsize: int, name: str = "stage") -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)
        self._done = False
        # the pump sees the queue, never the Handoff: a cancelled task keeps its traceback, whose
        # frame would otherwise hold the Handoff holding the task (a cycle only a full GC frees)
        self._task = asyncio.create_task(_pump(source, self._queue), name=name)

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


class chain(AsyncIterator[Any]):
    """Stages joined by bounded queues. Use it as ``async with chain(...) as stream`` (or call
    ``aclose``): leaving the block cancels every stage, even when the consumer stopped mid-way.

    ``async for`` alone does not close an iterator it leaves early (that is left to the garbage
    collector), which would let stage tasks run on; the context manager makes the end explicit.
    """

    def __init__(
        self,
        source: AsyncIterable[Any],
        *stages: Callable[[AsyncIterator[Any]], AsyncIterator[Any]],
        maxsize: int = 4,
    ) -> None:
        self._handoffs: list[Handoff[Any]] = [Handoff(source, maxsize, name="stage-0")]
        for i, stage in enumerate(stages, 1):
            self._handoffs.append(Handoff(stage(self._handoffs[-1]), maxsize, name=f"stage-{i}"))

    def __aiter__(self) -> "chain":
        return self

    async def __anext__(self) -> Any:
        return await self._handoffs[-1].__anext__()

    async def aclose(self) -> None:
        for h in reversed(self._handoffs):
            await h.aclose()

    async def __aenter__(self) -> "chain":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
