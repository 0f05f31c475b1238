"""Spoken test fixtures (espeak-ng, a real speech synthesizer) and audio measurements."""

from __future__ import annotations

import numpy as np

from bench.audio import espeak, read_wav, silence, speech_bounds_ms, utterance, write_wav

__all__ = ["espeak", "read_wav", "rms", "silence", "speech_bounds_ms", "utterance", "write_wav"]


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0
