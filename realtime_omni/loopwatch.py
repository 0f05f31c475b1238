"""A watch on the event loop itself: how late a timer fires is how long the loop was blocked.

Every session, call and connection shares one loop; a blocking call anywhere (a stage that runs
model work on the loop, a slow disk write) stalls them all. The watch sleeps ``interval`` at a time
and measures how late it wakes: published as ``realtime_event_loop_lag_seconds`` (the worst in the
last interval) and a histogram, and logged as a warning when over ``warn_s``. It changes nothing:
it is how an operator (and the fault-injection test) sees a stall that the server survived.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Gauge, Histogram

log = logging.getLogger(__name__)


class LoopWatch:
    def __init__(self, registry: object, interval: float = 0.25, warn_s: float = 1.0) -> None:
        self.interval = interval
        self.warn_s = warn_s
        self.worst = 0.0  # the longest stall seen since start
        self.lag = Gauge("realtime_event_loop_lag_seconds", "How late the event loop woke a timer, last interval", registry=registry)  # type: ignore[arg-type]
        self.stalls = Histogram(
            "realtime_event_loop_stall_seconds", "Event loop timer lateness", buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0), registry=registry  # type: ignore[arg-type]
        )
        self.tasks = Gauge("realtime_event_loop_tasks", "Tasks alive on the event loop (a leak grows it)", registry=registry)  # type: ignore[arg-type]
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loop-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        n = 0
        while True:
            n += 1
            if n % 8 == 0:  # every 2 s
                self.tasks.set(len(asyncio.all_tasks()))
            t0 = time.monotonic()
            await asyncio.sleep(self.interval)
            lag = max(0.0, time.monotonic() - t0 - self.interval)
            self.lag.set(lag)
            self.stalls.observe(lag)
            self.worst = max(self.worst, lag)
            if lag > self.warn_s:
                log.warning("the event loop was blocked for %.2f s: every session waited", lag)
