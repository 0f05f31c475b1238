"""The human end-of-turn set (bench/human_turns.py): it builds from the packages the tests' setup
installs (bench/human_turns_setup, run by scripts/test: a missing package fails here, it is not
skipped), its labels say what they claim, and bench.turns reports it per group."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import human_turns, turns
from bench.turn_fixtures import RATE, Fixture

pytestmark = [pytest.mark.system, pytest.mark.timeout(1800)]  # the first build transcribes ~370 recordings (cached after)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def items() -> list[Fixture]:
    return human_turns.load()


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0


def loudest_frame(pcm: np.ndarray) -> float:
    n = RATE // 100
    frames = pcm[: len(pcm) // n * n].astype(np.float64).reshape(-1, n)
    return float(np.sqrt((frames**2).mean(1)).max()) if len(frames) else 0.0


def quiet_level(pcm: np.ndarray) -> float:
    """The 10th percentile of 10 ms frame levels."""
    n = RATE // 100
    frames = pcm[: len(pcm) // n * n].astype(np.float64).reshape(-1, n)
    return float(np.percentile(np.sqrt((frames**2).mean(1)), 10))


def test_the_sources_are_installed():
    human_turns.check_sources()  # raises, naming the package, when the setup did not run


@pytest.mark.engine
def test_every_group_and_source_is_there_in_numbers(items):
    counts = human_turns.counts(items)
    assert set(counts) == {"human", "phone"}
    for group in ("human", "phone"):
        assert counts[group]["complete"] >= 50 and counts[group]["unfinished"] >= 50, counts[group]
    assert counts["human"]["asterisk:complete"] >= 50 and counts["phone"]["asterisk:complete"] >= 50
    assert counts["human"]["librivox:complete"] == 5 and counts["human"]["librivox:unfinished"] == 5
    assert counts["phone"]["codec2:complete"] >= 6 and counts["human"]["codec2:complete"] >= 3
    # the pyannote conversation is telephone speech (nothing above 4 kHz): its turn ends count as phone
    assert counts["phone"]["conversation:complete"] >= 4


@pytest.mark.engine
def test_groups_follow_the_recordings_bandwidth(items):
    """8 kHz recordings are phone; so is a 16 kHz one with nothing above 4 kHz (the conversation, and
    a few Asterisk prompts whose G.722 copy was made from a narrowband recording)."""
    wideband = [f for f in items if f.voice.endswith(".g722") or f.source == "librivox"]
    for f in wideband:
        assert f.group == "human" or human_turns.narrowband(f.pcm), f.voice
    assert sum(f.group == "human" for f in wideband) >= 0.9 * len(wideband)
    for f in items:
        if f.voice.endswith(".wav") or f.voice in {f"codec2/{n}" for n in human_turns.CODEC2_SENTENCES} or f.source == "conversation":
            assert f.group == "phone", f.voice


@pytest.mark.engine
def test_unfinished_items_pause_inside_their_speech(items):
    unfinished = [f for f in items if f.kind == "unfinished"]
    assert unfinished
    for f in unfinished:
        assert f.pause is not None and f.end is not None
        a, b = f.pause
        assert 0 < a < b < f.end <= len(f.pcm), (f.voice, f.pause, f.end)
        before, pause, after = f.pcm[:a], f.pcm[a:b], f.pcm[b : f.end]
        assert min(loudest_frame(before), loudest_frame(after)) > 4 * loudest_frame(pause), (f.voice, f.text)  # speech on both sides
        # quiet between: no louder than the recording's own quiet moments (its noise floor)
        assert rms(pause) <= 2 * quiet_level(np.concatenate([before, after])) + 2, (f.voice, f.text)
        if f.source == "conversation":
            assert b - a >= human_turns.MIN_PAUSE
        else:
            assert 400 * RATE // 1000 <= b - a <= 900 * RATE // 1000
            first, rest = f.text.split(" ... ")
            assert len(first.split()) >= 2 and len(rest.split()) >= 2 and not re.search(r"[.?!,]$", first), f.text


@pytest.mark.engine
def test_complete_items_end_in_silence(items):
    complete = [f for f in items if f.kind == "complete"]
    assert complete
    for f in complete:
        assert f.pause is None and f.end is not None and 0 < f.end <= len(f.pcm)
        last = f.pcm[max(0, f.end - RATE // 10) : f.end]
        assert loudest_frame(last) > 0, f.voice  # speech (or its tail) just before the end
        tail = f.pcm[f.end :]
        if len(tail) >= RATE // 100:
            assert loudest_frame(tail) < 0.5 * loudest_frame(f.pcm[: f.end]), (f.voice, f.text)
        if f.source != "conversation":
            assert f.text.rstrip().endswith((".", "?", "!")) and len(f.text.split()) >= 4, f.text


@pytest.mark.engine
def test_the_same_seed_labels_the_same_way(items):
    """Rebuilt from the recordings (Whisper's words from the cache), a few recordings give the
    cached set's items again, sample for sample."""
    chosen = {"codec2/hts1a", "codec2/speech_orig_16k", "librivox/sense_and_sensibility_01_austen_64kb-0870", "conversation/sample"}
    transcriber = human_turns.Transcriber()
    again = [f for rec, how in human_turns.recordings() if rec.key in chosen for f in human_turns.items_of(rec, how, transcriber, 0)]
    cached = [f for f in items if f.voice in chosen]
    assert len(again) == len(cached) >= 10
    for a, b in zip(again, cached):
        assert (a.voice, a.kind, a.pause, a.end, a.text, a.group) == (b.voice, b.kind, b.pause, b.end, b.text, b.group)
        assert np.array_equal(a.pcm, b.pcm)


@pytest.mark.engine
def test_take_draws_every_source_in_turn(items):
    taken = turns.take(items, 6, seed=0)
    for group in ("human", "phone"):
        mine = [f for f in taken if f.group == group]
        assert sum(f.kind == "complete" for f in mine) == 3 and sum(f.kind == "unfinished" for f in mine) == 3
    assert {f.source for f in taken if f.group == "phone" and f.kind == "complete"} == {"asterisk", "codec2", "conversation"}
    assert turns.take(items, 6, seed=0) == taken


@pytest.mark.engine
def test_bench_turns_reports_human_and_phone_apart(items):
    """``python -m bench.turns --set human``, two items per group, server_vad, semantic_auto and
    semantic_auto+listener (the cascade's Hearing with the real Whisper judging its own words)."""
    modes = ("server_vad", "semantic_auto", "semantic_auto+listener")
    run = subprocess.run(
        [sys.executable, "-m", "bench.turns", "--set", "human", "--limit", "2", "--modes", *modes],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    saved = Path(run.stdout.strip().splitlines()[-1].removeprefix("saved "))
    result = json.loads(saved.read_text())
    assert result["set"] == "human" and result["fixtures"] == {"human": {"complete": 1, "unfinished": 1}, "phone": {"complete": 1, "unfinished": 1}}
    for mode in modes:
        groups = result["modes"][mode]["groups"]
        assert set(groups) == {"human", "phone"}
        for summary in groups.values():
            assert summary["complete"] == 1 and summary["unfinished"] == 1
            assert summary["cut_share"] in (0.0, 1.0) and summary["split_share"] in (0.0, 1.0)
            assert summary["delay_ms"]["n"] == 1  # the complete item was committed after its speech
        assert f"{mode} / human" in run.stdout and f"{mode} / phone" in run.stdout
    decisions = [d for r in result["modes"]["semantic_auto"]["rows"] for d in r["decisions"]]
    assert decisions and all(0.0 <= d["p"] <= 1.0 for d in decisions)  # the model judged the human items
    heard = [d for r in result["modes"]["semantic_auto+listener"]["rows"] for d in r["decisions"]]
    judged = [d for d in heard if d["words_p"] is not None]
    assert judged and all(0.0 <= d["words_p"] <= 1.0 and d["text"] for d in judged)  # the listener's words and judgement weighed
    assert all(d["words_p"] is None for d in decisions)  # the sound alone: nobody judged words there
