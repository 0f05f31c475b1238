"""Spoken test fixtures (espeak-ng, a real speech synthesizer) and audio measurements."""

from __future__ import annotations

import numpy as np

from bench.audio import (
    espeak,
    read_wav,
    silence,
    speech_bounds_ms,
    utterance,
    write_wav,
)

__all__ = ["espeak", "read_wav", "rms", "silence", "speech_bounds_ms", "spoken", "utterance", "write_wav"]


def spoken(text: str, rate: int = 24000) -> np.ndarray:
    """``text`` spoken by espeak-ng without the silence espeak pads it with."""
    pcm = espeak(text, rate)
    first, last = speech_bounds_ms(pcm, rate)
    return pcm[first * rate // 1000 : (last + 1) * rate // 1000]


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0
