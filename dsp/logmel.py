"""Whisper's log-mel spectrogram in numpy: the input features of Whisper-encoder models (e.g. the
Smart Turn end-of-turn classifier).

The recipe is Whisper's: 16 kHz audio, a 25 ms periodic Hann window every 10 ms (400 / 160
samples), centred frames (reflection padding of half a window at both ends), the power spectrum
projected onto 80 triangular mel bands of the Slaney scale with Slaney area normalisation
(0 to 8 kHz), log10 floored at 1e-10, the last frame dropped, a dynamic range of 8 (80 dB) below
the loudest value, then scaled by (x + 4) / 4. ``normalize`` first brings the waveform to zero
mean and unit variance, as Hugging Face's extractor does with ``do_normalize``.

tests/dsp/test_logmel.py checks it against transformers' ``WhisperFeatureExtractor``.
"""

from __future__ import annotations

from functools import cache

import numpy as np

RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 80


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear (200/3 Hz a mel) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, np.float64)
    linear = hz / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz < 1000.0, linear, log)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, np.float64)
    linear = mel * (200.0 / 3)
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel < 15.0, linear, log)


@cache
def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = RATE) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular filters, each of unit area in Hz (Slaney norm)."""
    bins = np.linspace(0.0, rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(rate / 2), n_mels + 2))
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - low) / (centre - low)
    falling = (high - bins) / (high - centre)
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (high - low))


@cache
def _window(n: int = N_FFT) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)  # periodic Hann


def log_mel(audio: np.ndarray, *, normalize: bool = False) -> np.ndarray:
    """(80, len(audio) // 160) float32 features of float audio at 16 kHz."""
    x = np.asarray(audio, np.float32)
    if normalize:
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    power = np.abs(np.fft.rfft(frames * _window(), axis=1)) ** 2  # (frames, bins)
    mel = np.log10(np.maximum(mel_filters() @ power.T, 1e-10))[:, :-1]
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)
