"""Background tasks someone owns (a session, a call, the SIP bridge): each kept referenced while it
runs (asyncio holds only weak references), named after its owner, and cancelled together when the
owner ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any


def create_task(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """``asyncio.create_task``, but a cancelled task lets go of its ``CancelledError`` once done.

    A cancelled task keeps the error it ended with until someone awaits it (``gather`` with
    ``return_exceptions`` never takes it), and the error's traceback keeps every frame's locals:
    usually the very objects that hold the task. That cycle would keep a closed session, its
    conversation and its audio, until the next full collection, minutes later under load."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_release)
    return task


def _release(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            task.exception()  # hands over (and so drops) the stored error


class TaskSet:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = create_task(coro, name=f"{name}:{self.owner}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def join(self) -> None:
        """Wait until no task is left, those spawned meanwhile too."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every task but the caller's own, and wait for them to finish."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
