"""Resampling: soxr for whole clips and unpaced streams (``resample``, ``Resampler``), and a
streaming polyphase filter with about a millisecond of delay for paced media (``PolyphaseResampler``).

soxr is excellent offline, but its streaming mode works in internal blocks:
fed 20 ms frames, 8 -> 16 kHz at HQ gives nothing for five frames and then 100 ms at once, and
24 -> 8 kHz releases 60 ms every fourth frame. For a phone call that is up to 100 ms added to
every turn, on each direction. This converts each 20 ms frame as it comes: a windowed-sinc
low-pass (Kaiser, ``taps`` periods of the lower rate long) evaluated only at the output instants
(polyphase), with the input history carried between calls. Its delay is half the filter: 1.5 ms
with 24 taps for 8 <-> 16/24 kHz, and G.711's 300-3400 Hz band is inside its pass band.
"""

from __future__ import annotations

from math import gcd

import numpy as np
import soxr


class Resampler:
    """Streaming int16 resampler (soxr); a no-op when the rates match.

    soxr holds back a few milliseconds of output until it has seen what follows; ``flush`` drains
    it at the end of a stream (a commit, the end of a response) and starts a fresh stream.
    Timing is exact: output sample n is input time n / out_rate, whatever the buffering.
    """

    __slots__ = ("in_rate", "out_rate", "_stream")

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = self._new() if in_rate != out_rate else None

    def _new(self) -> soxr.ResampleStream:
        return soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="int16", quality="HQ")

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        if self._stream is None:
            return pcm
        return self._stream.resample_chunk(pcm)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.int16)
        tail = self._stream.resample_chunk(np.zeros(0, np.int16), last=True)
        self._stream = self._new()
        return tail


def resample(pcm: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot resampling of a whole clip."""
    if in_rate == out_rate or len(pcm) == 0:
        return pcm
    return soxr.resample(pcm, in_rate, out_rate, quality="HQ")


MAX_BLOCK = 4800  # input samples converted per step (100 ms at 48 kHz)
MAX_PLANS = 64  # cached per resampler (frame size x phase); odd-sized calls beyond it are planned each time


class PolyphaseResampler:
    def __init__(self, in_rate: int, out_rate: int, *, taps: int = 24, beta: float = 8.0) -> None:
        g = gcd(in_rate, out_rate)
        self.up, self.down = out_rate // g, in_rate // g
        self.in_rate, self.out_rate = in_rate, out_rate
        n = taps * max(self.up, self.down)  # filter length on the upsampled grid: ``taps`` cycles of the lower rate
        self.taps = taps = -(-n // self.up)  # input samples each output uses
        n = taps * self.up
        cutoff = 0.5 / max(self.up, self.down) * 0.92  # of the upsampled rate; a little margin against aliasing
        t = np.arange(n) - (n - 1) / 2
        h = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(n, beta)
        h *= self.up / h.sum()  # unity gain at DC after zero-stuffing by ``up``
        # bank[phase, k]: the tap applied to input sample (i - k) for an output at phase ``phase``
        self.bank = np.stack([h[p::self.up][:taps] for p in range(self.up)]).astype(np.float32)
        self._history = np.zeros(taps - 1, np.float32)
        self._plans: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, int]] = {}
        self._pos = 0  # next output's position on the upsampled grid, relative to the history's end

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        if self.up == self.down:
            return pcm
        if len(pcm) > MAX_BLOCK:  # bounded work arrays, whatever a client sends at once
            return np.concatenate([self(pcm[i : i + MAX_BLOCK]) for i in range(0, len(pcm), MAX_BLOCK)])
        window, bank, self._pos = self._plan(len(pcm))
        x = np.concatenate([self._history, pcm.astype(np.float32)])
        out = np.einsum("ij,ij->i", x[window], bank)
        self._history = x[len(x) - (self.taps - 1) :]
        return np.clip(np.rint(out), -32768, 32767).astype(np.int16)

    def _plan(self, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Which inputs and taps each output of an ``n``-sample call uses, and the phase after it.
        Media arrives in same-sized frames, so the few (size, phase) plans are computed once."""
        key = (n, self._pos)
        plan = self._plans.get(key)
        if plan is None:
            available = n * self.up  # upsampled positions covered by the new input
            positions = np.arange(self._pos, available, self.down)
            after = int(positions[-1] + self.down - available) if len(positions) else self._pos - available
            inputs = positions // self.up + (self.taps - 1)  # index in x of the newest input each output uses
            window = inputs[:, None] - np.arange(self.taps)[None, :]
            plan = (window, np.ascontiguousarray(self.bank[positions % self.up]), after)
            if len(self._plans) < MAX_PLANS:
                self._plans[key] = plan
        return plan

    def flush(self) -> np.ndarray:
        """The end of a stream: what the filter's delay still holds, then a fresh start."""
        if self.up == self.down:
            return np.zeros(0, np.int16)
        tail = self(np.zeros(self.taps // 2, np.int16))
        self._history[:] = 0
        self._pos = 0
        return tail
