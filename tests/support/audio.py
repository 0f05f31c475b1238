"""Spoken test fixtures (espeak-ng, a real speech synthesizer), audio measurements, and the word
error rate of what was heard.

The benchmarks speak and measure with the same functions, so those live in ``bench/`` (``audio.py``;
``turn_fixtures.speak``, the end-of-turn fixtures' voices; ``metrics.wer``) and the tests take them
from here: bench never imports the tests (the tests test the benches), and a test of the product
names no bench module."""

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
from bench.metrics import wer
from bench.turn_fixtures import speak

__all__ = ["espeak", "read_wav", "rms", "silence", "speak", "speech_bounds_ms", "spoken", "utterance", "wer", "write_wav"]


def spoken(text: str, rate: int = 24000) -> np.ndarray:
    """``text`` spoken by espeak-ng without the silence espeak pads it with."""
    pcm = espeak(text, rate)
    first, last = speech_bounds_ms(pcm, rate)
    return pcm[first * rate // 1000 : (last + 1) * rate // 1000]


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0
