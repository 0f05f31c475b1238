"""Speech made locally at run time (espeak-ng), for benchmarks and tests: no downloads."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

from dsp.resample import resample


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono WAV")
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.int16), w.getframerate()


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())


@functools.lru_cache(maxsize=64)
def espeak(text: str, rate: int = 24000, voice: str = "en-us", wpm: int = 160) -> np.ndarray:
    """``text`` spoken by espeak-ng, as int16 at ``rate``."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(out), text], check=True, capture_output=True)
        pcm, native = read_wav(out)
    return resample(pcm, native, rate)


def silence(ms: int, rate: int = 24000) -> np.ndarray:
    return np.zeros(rate * ms // 1000, np.int16)


def utterance(text: str, lead_ms: int = 1000, tail_ms: int = 1500, rate: int = 24000) -> np.ndarray:
    """Digital silence, speech, digital silence (a clean fixture for VAD timing)."""
    return np.concatenate([silence(lead_ms, rate), espeak(text, rate), silence(tail_ms, rate)])


def speech_bounds(pcm: np.ndarray) -> tuple[int, int] | None:
    """Indices of the first and last non-silent sample; None when all of it is silence."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 64)
    return (int(loud[0]), int(loud[-1])) if len(loud) else None


def speech_bounds_ms(pcm: np.ndarray, rate: int = 24000) -> tuple[int, int]:
    """First and last non-silent sample, in ms."""
    bounds = speech_bounds(pcm)
    if bounds is None:
        raise ValueError("no speech in the audio")
    return bounds[0] * 1000 // rate, bounds[1] * 1000 // rate
