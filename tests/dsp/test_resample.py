"""Resampling (dsp/resample.py): soxr for clips and unpaced streams, and the polyphase filter that
converts each 20 ms media frame as it comes. Measured as a filter: its gain across the pass band,
what it lets through above the lower rate's Nyquist frequency (aliases when decimating, images when
interpolating), its delay; and as a stream: frame by frame it gives exactly what one call over the
whole signal gives, and 20 ms in is always 20 ms out."""

from __future__ import annotations

import numpy as np
import pytest

from dsp.resample import PolyphaseResampler, Resampler, resample

PAIRS = [(8000, 16000), (8000, 24000), (16000, 8000), (24000, 8000), (48000, 8000), (48000, 16000), (16000, 48000)]
AMPLITUDE = 8000


def tone(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (AMPLITUDE * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def framed(r: PolyphaseResampler, pcm: np.ndarray, size: int) -> list[np.ndarray]:
    return [r(pcm[i : i + size]) for i in range(0, len(pcm), size)]


def gain_db(rate_in: int, rate_out: int, freq: float) -> float:
    """The polyphase filter's gain for a tone, fed as 20 ms frames, past its first 100 ms."""
    out = np.concatenate(framed(PolyphaseResampler(rate_in, rate_out), tone(freq, rate_in), rate_in // 50))
    steady = out[rate_out // 10 :].astype(np.float64)
    return float(20 * np.log10(np.sqrt(np.mean(steady**2)) / (AMPLITUDE / np.sqrt(2)) + 1e-12))


@pytest.mark.parametrize(("rate_in", "rate_out"), PAIRS)
def test_polyphase_pass_band_is_flat_over_telephone_speech(rate_in: int, rate_out: int) -> None:
    for freq in (300, 1000, 2000, 3000):
        assert abs(gain_db(rate_in, rate_out, freq)) < 0.1, freq
    assert -2.0 < gain_db(rate_in, rate_out, 3400) < 0  # G.711's upper edge: inside the roll-off's start


@pytest.mark.parametrize(("rate_in", "rate_out"), [p for p in PAIRS if p[0] > p[1]])
def test_polyphase_decimation_stops_what_would_alias(rate_in: int, rate_out: int) -> None:
    nyquist = rate_out / 2
    for freq in (1.1 * nyquist, 1.4 * nyquist):  # would fold back to 0.9 and 0.6 of the new Nyquist
        assert gain_db(rate_in, rate_out, freq) < -40, freq


@pytest.mark.parametrize(("rate_in", "rate_out"), [p for p in PAIRS if p[0] < p[1]])
def test_polyphase_interpolation_leaves_no_images(rate_in: int, rate_out: int) -> None:
    out = np.concatenate(framed(PolyphaseResampler(rate_in, rate_out), tone(1000, rate_in), rate_in // 50))
    steady = out[rate_out // 10 :].astype(np.float64)
    power = np.abs(np.fft.rfft(steady * np.hanning(len(steady)))) ** 2
    freqs = np.fft.rfftfreq(len(steady), 1 / rate_out)
    peak = freqs[np.argmax(power)]
    assert abs(peak - 1000) < 2
    above = power[freqs > rate_in / 2].sum() / power.sum()  # the images of 1 kHz: rate_in - 1000, ...
    assert 10 * np.log10(above) < -60


@pytest.mark.parametrize(("rate_in", "rate_out"), [(8000, 16000), (8000, 24000), (16000, 8000), (24000, 8000)])
def test_polyphase_delay_is_half_its_filter_about_a_millisecond_and_a_half(rate_in: int, rate_out: int) -> None:
    r = PolyphaseResampler(rate_in, rate_out)
    click = np.zeros(rate_in // 50, np.int16)
    click[0] = 20000
    out = np.concatenate([r(click), r(np.zeros(rate_in // 50, np.int16))]).astype(np.float64)
    delay_ms = np.argmax(out) * 1000 / rate_out
    assert 1.0 <= delay_ms <= 1.6  # soxr's stream would hold 20-100 ms back


@pytest.mark.parametrize(("rate_in", "rate_out"), PAIRS)
def test_polyphase_frames_of_any_size_give_exactly_the_one_call_result(rate_in: int, rate_out: int) -> None:
    pcm = (np.random.default_rng(1).standard_normal(rate_in // 2) * 5000).astype(np.int16)
    whole = PolyphaseResampler(rate_in, rate_out)(pcm)
    for size in (rate_in // 50, 137, 1):  # 20 ms frames, odd sizes, sample by sample
        frames = framed(PolyphaseResampler(rate_in, rate_out), pcm, size)
        assert np.array_equal(np.concatenate(frames), whole), size
    frames = framed(PolyphaseResampler(rate_in, rate_out), tone(1000, rate_in), rate_in // 50)
    assert {len(f) for f in frames} == {rate_out // 50}  # no block buffering: every 20 ms in, 20 ms out


def test_polyphase_flush_gives_the_delayed_tail_and_starts_afresh() -> None:
    r = PolyphaseResampler(8000, 16000)
    pcm = tone(1000, 8000, 0.1)
    first = np.concatenate([r(pcm), r.flush()])
    second = np.concatenate([r(pcm), r.flush()])
    assert np.array_equal(first, second)  # nothing of the first stream leaks into the next
    assert len(first) > 2 * len(pcm) and np.abs(first[2 * len(pcm) :]).max() > 0  # the tail the delay held


def test_streaming_soxr_keeps_time_exact_and_matches_the_one_shot_clip() -> None:
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal(24000 * 2) * 3000).astype(np.int16)
    r = Resampler(24000, 16000)
    out = np.concatenate([r(pcm[i : i + 480]) for i in range(0, len(pcm), 480)] + [r.flush()])
    assert len(out) == 32000  # 2 s in, 2 s out, nothing lost at the edges
    whole = resample(pcm, 24000, 16000)
    assert len(whole) == 32000
    assert np.max(np.abs(out.astype(int) - whole.astype(int))) < 200  # streamed == one-shot (up to filter edges)


@pytest.mark.parametrize(("rate_in", "rate_out"), [(24000, 16000), (16000, 24000), (48000, 8000)])
def test_soxr_keeps_a_tone_its_pitch_and_level(rate_in: int, rate_out: int) -> None:
    out = resample(tone(1000, rate_in), rate_in, rate_out).astype(np.float64)
    assert len(out) == rate_out
    steady = out[rate_out // 10 : -rate_out // 10]
    assert abs(20 * np.log10(np.sqrt(np.mean(steady**2)) / (AMPLITUDE / np.sqrt(2)))) < 0.05
    spectrum = np.abs(np.fft.rfft(steady * np.hanning(len(steady))))
    assert abs(np.fft.rfftfreq(len(steady), 1 / rate_out)[np.argmax(spectrum)] - 1000) < 2


def test_same_rates_are_passed_through_untouched() -> None:
    pcm = tone(440, 16000, 0.1)
    assert Resampler(16000, 16000)(pcm) is pcm and resample(pcm, 16000, 16000) is pcm
    assert PolyphaseResampler(16000, 16000)(pcm) is pcm
