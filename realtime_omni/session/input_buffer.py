"""The input audio buffer: audio appended since the last commit or clear, addressed by absolute
sample position since the session began (the time base of ``audio_start_ms`` / ``audio_end_ms``)."""

from __future__ import annotations

from collections import deque

import numpy as np


class InputBuffer:
    def __init__(self, rate: int, max_seconds: float) -> None:
        self.rate = rate
        self.max_samples = int(max_seconds * rate)
        self._chunks: deque[np.ndarray] = deque()
        self.start = 0  # absolute position of the first buffered sample
        self.end = 0  # absolute position after the last appended sample

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def duration_ms(self) -> float:
        return len(self) * 1000.0 / self.rate

    def room(self) -> int:
        return self.max_samples - len(self)

    def append(self, pcm: np.ndarray) -> None:
        if len(pcm):
            self._chunks.append(pcm)
            self.end += len(pcm)

    def slice(self, a: int, b: int) -> np.ndarray:
        """Samples [a, b) (absolute positions, clipped to what is buffered)."""
        a, b = max(a, self.start), min(b, self.end)
        if b <= a:
            return np.zeros(0, np.int16)
        # Walk from the newest chunk: slices are almost always of the most recent audio.
        out, hi = [], self.end
        for chunk in reversed(self._chunks):
            lo = hi - len(chunk)
            if lo < b:
                out.append(chunk[max(a - lo, 0) : min(b, hi) - lo])
            if lo <= a:
                break
            hi = lo
        return out[0] if len(out) == 1 else np.concatenate(out[::-1])

    def drop_before(self, pos: int) -> None:
        pos = min(pos, self.end)
        while self._chunks and self.start + len(self._chunks[0]) <= pos:
            self.start += len(self._chunks.popleft())
        if self._chunks and self.start < pos:
            self._chunks[0] = self._chunks[0][pos - self.start :]
        self.start = max(self.start, pos)

    def clear(self) -> None:
        self._chunks.clear()
        self.start = self.end
