"""The simulated user's microphone: audio leaves in 20 ms frames on a steady clock, queued speech
when there is some and silence otherwise, as a live microphone streams. ``FrameQueue`` is the
queue both microphones (this one over WebSocket appends, the WebRTC track in ``bench/rtc.py``)
take their frames from."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np

from .audio import speech_bounds
from .dataset import RATE

CHUNK = RATE // 50  # 20 ms of samples per append


class FrameQueue:
    """Audio waiting to be sent, taken a fixed-size frame at a time; silence fills a frame the
    queue cannot."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.queued = 0  # samples waiting

    def push(self, pcm: np.ndarray) -> None:
        self._parts.append(pcm)
        self.queued += len(pcm)

    def take(self, n: int) -> np.ndarray:
        frame = np.zeros(n, np.int16)
        filled = 0
        while filled < n and self._parts:
            head = self._parts[0]
            k = min(n - filled, len(head))
            frame[filled : filled + k] = head[:k]
            filled += k
            if k == len(head):
                self._parts.pop(0)
            else:
                self._parts[0] = head[k:]
        self.queued -= filled
        return frame


class Mic:
    """Streams to the server in real time, one 20 ms append per tick of a steady clock, through
    ``send`` (pcm16 bytes). Knows when each sample it sent had left."""

    def __init__(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.send = send
        self.frames = FrameQueue()
        self.sent = 0  # samples sent
        self.t0 = 0.0
        self.lag_ms: list[float] = []  # how late each append left (the harness's own health)

    def play(self, pcm: np.ndarray) -> tuple[int, int]:
        """Queue ``pcm``; returns the stream positions of its first and last speech sample."""
        start = self.sent + self.frames.queued
        first, last = speech_bounds(pcm) or (0, len(pcm) - 1)
        self.frames.push(pcm)
        return start + first, start + last

    def time_of(self, sample: int) -> float:
        """When ``sample`` had been sent: its 20 ms chunk leaves once fully 'recorded'."""
        return self.t0 + (sample // CHUNK + 1) * CHUNK / RATE

    async def run(self) -> None:
        self.t0 = time.perf_counter()
        n = 0
        while True:
            n += 1
            delay = self.t0 + n * CHUNK / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.lag_ms.append(max(0.0, -delay * 1000))
            await self.send(self.frames.take(CHUNK).astype("<i2").tobytes())
            self.sent += CHUNK
