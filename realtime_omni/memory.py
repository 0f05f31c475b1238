"""``MemoryTrim``: memory that ended sessions freed, handed back to the system."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS)."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class MemoryTrim:
    """Hands memory that ended sessions freed back to the system (glibc keeps it otherwise: RSS
    would stay at the high-water mark of the busiest minute), at most every ``every_s``."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.closed_since = 0  # sessions closed since the last trim
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="memory-trim")

    def session_closed(self) -> None:
        self.closed_since += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        trim = _malloc_trim()
        while trim is not None:
            await asyncio.sleep(self.every_s)
            if self.closed_since:
                self.closed_since = 0
                trim(0)
