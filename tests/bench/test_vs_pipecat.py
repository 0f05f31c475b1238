"""The Pipecat benchmark peer and the side-by-side comparison, end to end on a small input: this
server (configs/cpu.yaml) and the Pipecat agent on the same models (its own venv, a real
``vllm serve``, real Whisper / Silero / Smart Turn / Piper) each hear one two-turn conversation whose
second turn barges in, through the same replay harness; the report holds both sides. No latency is
asserted: the figures belong in docs/pipecat.md and bench/results/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peers, vs_pipecat

pytestmark = [pytest.mark.system, pytest.mark.timeout(1500)]


def test_the_peer_is_installed() -> None:
    # scripts/test runs bench/peers/setup: a missing peer is a broken setup, not a reason to skip
    assert peers.available(), "the Pipecat peer is not installed: run bench/peers/setup"


def turns_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "turns.jsonl").read_text().splitlines()]


@pytest.mark.engine
def test_both_sides_replayed_and_reported(tmp_path: Path) -> None:
    argv = ["--conversations", "1", "--turns", "2", "--concurrency", "1", "--barge-in-every", "1", "--out", str(tmp_path)]
    assert vs_pipecat.main(argv) == 0

    record = json.loads((tmp_path / "vs_pipecat.json").read_text())
    for side in vs_pipecat.SIDES:
        summary = record["summaries"][side]["1"]
        assert summary["turns"] == 2 and summary["errors"] == 0, summary["error_messages"]
        assert summary["cpu_s_per_turn"] > 0
        first, barge = turns_of(tmp_path / f"{side}-c1")
        # the first turn was heard, answered in words and spoken
        assert first["status"] in ("completed", "cancelled") and first["voice_to_voice_ms"] > 0, first
        assert first["heard"] and first["input_wer"] is not None and first["answer"], first
        assert first["audio_s"] > 0 and first["turn_end_detected_ms"] > 0
        # the second spoke over the first answer and got an answer of its own
        assert barge["barge_in"] and barge["status"] == "completed" and barge["audio_s"] > 0, barge
    assert record["v2v_p50_ratio_ours_over_pipecat"]["1"] > 0

    table = (tmp_path / "table.md").read_text()
    assert "| voice to voice p50 (ms) |" in table and "Pipecat c=1" in table
    assert "voice_to_voice_ms" in (tmp_path / "compare-c1.txt").read_text()
    assert (tmp_path / "v2v_cdf.png").stat().st_size > 0
