"""The steady clock paced media is sent on (a call's playout, the SIP bridge's shared RTP tick)."""

from __future__ import annotations

import asyncio


class Ticker:
    """A steady clock: ``wait`` returns at start + k x ``period``, never drifting. A waiter that
    falls more than ``max_late`` behind starts over from now instead of catching up in a burst."""

    def __init__(self, period: float, max_late: float = 0.1) -> None:
        self.period = period
        self.max_late = max_late
        self.resyncs = 0
        self._next: float | None = None

    async def wait(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._next is None:
            self._next = now
            return
        self._next += self.period
        if self._next > now:
            await asyncio.sleep(self._next - now)
        elif now - self._next > self.max_late:
            self.resyncs += 1
            self._next = now
