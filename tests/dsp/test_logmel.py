"""Whisper's log-mel spectrogram (dsp/logmel.py), the end-of-turn model's input: compared with an
independent computation, Hugging Face's ``WhisperFeatureExtractor`` (transformers' own numpy
implementation of Whisper's recipe), on speech, noise and a tone; then what the recipe promises on
its own: the mel filters' shape and area, where a tone and a click land, and the 80 dB range."""

from __future__ import annotations

import numpy as np
import pytest

from dsp.logmel import HOP, N_MELS, RATE, _hz_to_mel, _mel_to_hz, log_mel, mel_filters
from tests.support.audio import spoken

SAMPLES = 8 * RATE  # the end-of-turn model's window


def speech_8s() -> np.ndarray:
    pcm = spoken("What is the capital of France? I would like to know.", RATE).astype(np.float32) / 32768
    out = np.zeros(SAMPLES, np.float32)
    out[-len(pcm) - 3200 : -3200] = pcm  # padded in front, as a short turn is
    return out


def signal(kind: str) -> np.ndarray:
    t = np.arange(SAMPLES) / RATE
    if kind == "speech":
        return speech_8s()
    if kind == "noise":
        return (0.1 * np.random.default_rng(0).standard_normal(SAMPLES)).astype(np.float32)
    return (0.5 * np.sin(2 * np.pi * 440 * t) * (t > 2)).astype(np.float32)


def band_centres() -> np.ndarray:
    return _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(RATE / 2), N_MELS + 2))[1:-1]


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("kind", ["speech", "noise", "tone"])
def test_matches_whisper_feature_extractor(kind: str, normalize: bool) -> None:
    import transformers  # the reference; the [cpu] extra installs it
    audio = signal(kind)
    fe = transformers.WhisperFeatureExtractor(feature_size=80, sampling_rate=RATE, hop_length=HOP, chunk_length=8, n_fft=400)
    ref = fe(audio, sampling_rate=RATE, padding="max_length", max_length=SAMPLES, truncation=True, do_normalize=normalize, return_tensors="np")
    ref = ref.input_features[0]
    ours = log_mel(audio, normalize=normalize)
    assert ours.shape == ref.shape == (80, 800) and ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 1e-4


def test_mel_filters_are_triangles_of_unit_area_on_the_slaney_scale() -> None:
    filters = mel_filters()
    assert filters.shape == (N_MELS, 201) and filters.min() == 0
    bin_hz = RATE / 400
    areas = filters.sum(axis=1) * bin_hz  # Slaney normalisation: each triangle has area 1 in Hz,
    assert abs(areas.mean() - 1) < 0.01 and np.allclose(areas, 1.0, atol=0.1)  # sampled every 40 Hz here
    peaks = np.argmax(filters, axis=1) * bin_hz
    assert np.all(np.diff(peaks) >= 0) and np.all(np.abs(peaks - band_centres()) <= bin_hz)
    # linear below 1 kHz (200/3 Hz a mel), logarithmic above
    assert np.allclose(_hz_to_mel(np.array([0.0, 500.0, 1000.0])), [0.0, 7.5, 15.0])
    assert np.isclose(_hz_to_mel(np.array([6400.0]))[0], 15.0 + 27.0)  # 6.4x the frequency: 27 mels more
    assert np.allclose(_mel_to_hz(_hz_to_mel(np.array([60.0, 999.0, 1000.0, 4321.0]))), [60.0, 999.0, 1000.0, 4321.0])


@pytest.mark.parametrize("freq", [250, 1000, 3000, 6000])
def test_a_tone_lands_in_the_band_around_its_frequency(freq: int) -> None:
    t = np.arange(RATE) / RATE
    features = log_mel((0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32))
    band = int(np.argmax(features[:, 10:-10].mean(axis=1)))
    assert abs(band - int(np.argmin(np.abs(band_centres() - freq)))) <= 1
    assert mel_filters()[band, round(freq / (RATE / 400))] > 0  # the band's triangle covers the tone


def test_frames_are_centred_every_10_ms_and_the_range_is_80_db() -> None:
    click = np.zeros(RATE, np.float32)
    click[8000] = 1.0
    features = log_mel(click)
    assert features.shape == (N_MELS, RATE // HOP)
    assert int(np.argmax(features.mean(axis=0))) == 8000 // HOP  # frame n is centred on sample n * 160
    assert np.isclose(features.max() - features.min(), 2.0)  # floored 8 (log10) below the peak, scaled by 1/4
    speech = log_mel(speech_8s())
    assert speech.max() - speech.min() <= 2.0 + 1e-6
