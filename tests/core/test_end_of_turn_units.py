"""The parts of semantic_vad's end-of-turn model: the model's input window, what a transcript's last
words say, and preparing the model file out of its wheel (its Whisper features: tests/dsp)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines import models
from pipelines.turn_text import combine, odds_factor
from tests.support.audio import speak


def test_the_model_hears_the_last_8_s_at_16_khz():
    from pipelines.smart_turn import SmartTurn

    turn = speak("I need to book a table for two people tomorrow evening at eight, please.", "espeak-en-us-160")
    long = np.concatenate([turn, turn, turn])  # longer than 8 s
    assert len(long) > 8 * 16000
    features = SmartTurn.features(long, 16000)
    assert features.shape == (1, 80, 800)
    assert np.array_equal(features, SmartTurn.features(long[-8 * 16000 :], 16000))
    # a turn at 8 kHz (a phone call) or 24 kHz is resampled to 16 kHz first
    from dsp.resample import resample

    at8 = SmartTurn.features(resample(turn, 16000, 8000), 8000)
    at16 = SmartTurn.features(turn, 16000)
    assert at8.shape == at16.shape
    assert np.corrcoef(at8.ravel(), at16.ravel())[0, 1] > 0.8  # the same speech, less its top octave


@pytest.mark.parametrize(
    "text, factor",
    [
        ("I'd like to book a table for", 1 / 1000),
        ("My name is...", 1 / 1000),
        ("I need to buy some,", 1 / 1000),
        ("When I was a child I", 1 / 1000),
        ("Is it possible to?", 1 / 1000),
        ("Um", 1 / 1000),
        ("The reason I'm calling is", 1 / 20),
        ("Yes, I can.", 1 / 20),
        ("What is the capital of France?", 10.0),
        ("Yes.", 10.0),
        ("Paris", 1.0),
        ("", 1.0),
        (None, 1.0),
    ],
)
def test_what_the_last_words_say(text, factor):
    assert odds_factor(text) == pytest.approx(factor)


def test_words_shift_the_audio_verdict_and_no_words_leave_it():
    assert combine(0.9, None) == 0.9 and combine(0.9, "Paris") == 0.9
    assert combine(0.9, "I want to go to the") < 0.2
    assert combine(0.3, "What time is it?") > 0.8


def test_prepare_copies_the_checked_file_out_of_the_wheel_once(tmp_path, monkeypatch):
    source = models.MODELS["smart-turn-v3.2"].sources()[0]  # scripts/install installs its package
    monkeypatch.setenv("REALTIME_OMNI_HOME", str(tmp_path))
    folder = models.ensure("smart-turn-v3.2", progress=lambda _: None)
    onnx = folder / "smart-turn-v3.2-cpu.onnx"
    assert folder == tmp_path / "models" / "smart-turn-v3.2" and models.sha256(onnx) == models.SMART_TURN_SHA256
    record = json.loads((folder / "prepared.json").read_text())
    assert record["sources"] == {source.name: models.SMART_TURN_SHA256}
    mtime = onnx.stat().st_mtime_ns
    assert models.ensure("smart-turn-v3.2", progress=lambda _: None) == folder and onnx.stat().st_mtime_ns == mtime  # idempotent
    with open(onnx, "r+b") as f:  # damaged in place, same size: only a verify finds it
        f.seek(1000)
        f.write(b"\0" * 16)
    assert models.is_ready("smart-turn-v3.2") and not models.is_ready("smart-turn-v3.2", verify=True)
    models.ensure("smart-turn-v3.2", progress=lambda _: None, verify=True)
    assert models.sha256(onnx) == models.SMART_TURN_SHA256


def test_prepare_refuses_a_model_file_that_is_not_the_released_one(tmp_path, monkeypatch):
    fake = tmp_path / "smart-turn-v3.2-cpu.onnx"
    fake.write_bytes(b"not the model")
    monkeypatch.setenv("REALTIME_OMNI_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(models.SOURCES, "smart-turn-v3.2", lambda: [fake])
    with pytest.raises(models.ModelUnavailable, match="sha256"):
        models.ensure("smart-turn-v3.2", progress=lambda _: None)
    assert not (tmp_path / "home" / "models" / "smart-turn-v3.2").exists()
