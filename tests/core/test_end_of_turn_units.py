"""The parts of semantic_vad's end-of-turn decision: the model's input window, what a transcript's last
words say, how the thinker's judgement is read and fused with the audio and the silence, and
preparing the model file out of its wheel (its Whisper features: tests/dsp)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipelines import models
from pipelines.base import Heard, TurnVerdict
from pipelines.cascade.listener import ends_sentence as listener_ends_sentence
from pipelines.sentences import piece_ends_sentence
from pipelines.turn_end import judgement
from pipelines.turn_end.fusion import Fusion, Weights, wait_s
from pipelines.turn_end.odds import logit
from pipelines.turn_end.text_rule import combine, odds_factor
from tests.support.audio import speak


def test_the_model_hears_the_last_8_s_at_16_khz():
    from pipelines.turn_end.smart_turn import SmartTurn

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


@pytest.mark.parametrize(
    "text, words",
    [
        ("What is the capital of France?", "What is the capital of France"),
        ("  I'd like   to book a table for... ", "I'd like to book a table for"),
        ("Sure.", "Sure"),
        ('He said "stop!"', "He said \"stop"),
        ("well -", "well"),
        ("...", ""),
        (None, ""),
    ],
)
def test_the_words_are_judged_without_their_final_punctuation(text, words):
    assert judgement.bare(text) == words


@pytest.mark.parametrize("piece, ends", [(".", True), ("?", True), (" !", True), ('."', True), ("?\n\n", True), ("!!", True),
                                         ("...", False), ("..", False), (",", False), (" the", False), ("", False), (").", False)])
def test_which_tokens_end_a_sentence(piece, ends):
    assert piece_ends_sentence(piece) is ends
    # the listener's own brackets close its asides ("(laughs)."): the same rule, with ")"
    assert listener_ends_sentence(piece) is (ends or piece == ").")


def test_the_judgement_sums_the_candidates_that_end_the_sentence():
    import math

    top = {1: math.log(0.5), 2: math.log(0.2), 3: math.log(0.3)}
    assert judgement.probability(top, frozenset({1, 2})) == pytest.approx(0.7)
    assert judgement.probability(list(top.items()), frozenset({3, 99})) == pytest.approx(0.3)
    assert judgement.probability({}, frozenset({1})) == 0.0


def test_a_verdict_says_how_much_more_silence_finishes_the_turn():
    at_once = TurnVerdict(0.7, 1.0, logit_per_s=2.0)
    assert wait_s(at_once, 0.5) == 0.0
    later = TurnVerdict(0.1, 1.0, logit_per_s=2.0)  # logit -2.197: 1.1 s of silence brings it to 0.5
    assert wait_s(later, 0.5) == pytest.approx(2.1972 / 2, abs=1e-3)
    assert wait_s(later, 0.8) > wait_s(later, 0.5) > wait_s(later, 0.2) > 0
    assert wait_s(TurnVerdict(0.1, 1.0), 0.5) is None  # silence adds nothing: the longest wait decides


def test_the_fusion_weighs_the_thinkers_judgement_when_there_is_one():
    fusion = Fusion(with_words=Weights(bias=0.5, audio=0.5, words=1.0, silence_per_s=3.0), audio_only=Weights())
    judged = fusion.verdict(0.9, 30.0, Heard("How far away is the", ends=0.002))
    z = 0.5 + 0.5 * logit(0.9) + logit(0.002)
    assert judged.probability == pytest.approx(1 / (1 + np.exp(-z)))
    assert (judged.audio_probability, judged.words_probability, judged.transcript, judged.logit_per_s) == (0.9, 0.002, "How far away is the", 3.0)
    assert wait_s(judged, 0.5) == pytest.approx(-z / 3.0)
    # the words end a sentence and the audio agrees: finished at once
    assert wait_s(fusion.verdict(0.9, 30.0, Heard("How far away is the moon?", ends=0.7)), 0.5) == 0.0
    # no judgement: the audio alone, shifted by the transcript's last words as before, no silence term
    assert fusion.verdict(0.9, 30.0, Heard("How far away is the")).probability == pytest.approx(combine(0.9, "How far away is the"))
    assert fusion.verdict(0.9, 30.0, None).probability == pytest.approx(0.9) and fusion.verdict(0.9, 30.0, None).logit_per_s == 0.0
    fitted_audio = Fusion(audio_only=Weights(bias=-1.0, audio=2.0, silence_per_s=1.0)).verdict(0.5, 30.0, None)
    assert fitted_audio.probability == pytest.approx(1 / (1 + np.exp(1.0))) and fitted_audio.logit_per_s == 1.0


def test_the_listeners_judgement_has_weights_of_its_own_and_the_text_rule_beside_it():
    listener = Weights(bias=-1.0, audio=0.5, words=1.0, silence_per_s=2.0)
    fusion = Fusion(with_listener=listener, with_words=Weights(bias=9.0, audio=0.0))
    heard = fusion.verdict(0.6, 30.0, Heard("I want to go to the", ends=0.3, judge="listener"))
    z = -1.0 + 0.5 * logit(0.6) + logit(0.3) + math.log(odds_factor("I want to go to the"))
    assert heard.probability == pytest.approx(1 / (1 + math.exp(-z)))
    assert (heard.words_probability, heard.logit_per_s) == (0.3, 2.0)
    off = Fusion(with_listener=listener, text_rule=False).verdict(0.6, 30.0, Heard("I want to go to the", ends=0.3, judge="listener"))
    assert off.probability == pytest.approx(1 / (1 + math.exp(-(-1.0 + 0.5 * logit(0.6) + logit(0.3)))))
    # the thinker's judgement: its own weights, no text rule (it read the words itself)
    thinker = fusion.verdict(0.6, 30.0, Heard("I want to go to the", ends=0.3, judge="thinker"))
    assert thinker.probability == pytest.approx(1 / (1 + math.exp(-9.0)))


def test_the_listeners_judgement_beside_the_thinkers_has_a_weight_of_its_own():
    w = Weights(bias=-1.0, audio=0.5, words=0.5, silence_per_s=2.0, listener=0.75)
    both = Fusion(with_words=w).verdict(0.6, 30.0, Heard("Where is it", ends=0.2, judge="thinker", listener=0.9))
    z = -1.0 + 0.5 * logit(0.6) + 0.5 * logit(0.2) + 0.75 * logit(0.9)
    assert both.probability == pytest.approx(1 / (1 + math.exp(-z)))
    assert (both.words_probability, both.listener_probability) == (0.2, 0.9)
    alone = Fusion(with_words=w).verdict(0.6, 30.0, Heard("Where is it", ends=0.2, judge="thinker"))  # none beside it: no term
    assert alone.probability == pytest.approx(1 / (1 + math.exp(-(-1.0 + 0.5 * logit(0.6) + 0.5 * logit(0.2)))))


def test_the_text_rule_is_a_setting_whatever_the_weights():
    """No hidden mode: the transcript's last words shift any audio-only weights (not only the
    defaults), and ``text_rule: false`` turns that off."""
    fitted = Weights(bias=-1.0, audio=2.0)
    with_rule = Fusion(audio_only=fitted).verdict(0.5, 30.0, Heard("I want to go to the"))
    z = -1.0 + math.log(odds_factor("I want to go to the"))
    assert with_rule.probability == pytest.approx(1 / (1 + math.exp(-z)))
    without = Fusion(audio_only=fitted, text_rule=False).verdict(0.5, 30.0, Heard("I want to go to the"))
    assert without.probability == pytest.approx(1 / (1 + math.exp(1.0)))


def test_prepare_copies_the_checked_file_out_of_the_wheel_once(tmp_path, monkeypatch):
    source = models.MODELS["smart-turn-v3.2"].sources()[0]  # scripts/install installs its package
    monkeypatch.setenv("REALTIME_OMNI_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the package's copy, not the hub's (tests/pipelines/test_hub.py)
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
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setitem(models.SOURCES, "smart-turn-v3.2", lambda: [fake])
    with pytest.raises(models.ModelUnavailable, match="sha256"):
        models.ensure("smart-turn-v3.2", progress=lambda _: None)
    assert not (tmp_path / "home" / "models" / "smart-turn-v3.2").exists()


async def test_the_policy_asks_for_the_sound_at_the_check_before_it_waits_for_the_words():
    """The sound is judged at the check, while the pause's hearing (begun at ``pause_ms``) finishes;
    then the words are awaited: the verdict comes with the judgement, and the answer that starts
    there runs with nothing beside it (docs/turn-taking.md: 28 ms sooner voice-to-voice on two
    cores than with the sound after the words, which ran beside the answer's first step)."""
    import asyncio

    import numpy as np

    from pipelines.base import Heard, TurnModel, TurnVerdict
    from pipelines.turn_end.policy import TurnEndConfig, TurnEndPolicy

    order: list[str] = []

    class Sound(TurnModel):
        max_seconds = 8.0

        def load(self) -> None:
            pass

        async def judge(self, pcm: np.ndarray, rate: int) -> TurnVerdict:
            order.append("sound")
            return TurnVerdict(0.9, 1.0)

    async def hear(within_s: float) -> Heard:
        order.append("hearing")
        await asyncio.sleep(0.05)
        order.append("heard")
        return Heard("What time is it?", 0.9)

    decision = await TurnEndPolicy(TurnEndConfig(), Sound()).decide(np.zeros(16000, np.int16), 16000, "auto", hear)
    assert order == ["sound", "hearing", "heard"]
    assert decision.verdict is not None and decision.verdict.words_probability == 0.9
