"""The soak harness, run short: sessions talk, barge in and drop, the server's resources are
sampled, and the report says what came back. The full runs (60 minutes at 50 sessions; the CPU
agent for 30 minutes) are benchmarks, their figures in docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import soak

pytestmark = pytest.mark.slow  # 45 s of soak by design


def test_a_short_soak_talks_barges_in_reconnects_and_leaves_nothing_behind(capsys):
    assert soak.main(["--sessions", "6", "--minutes", "0.75", "--sample-s", "10", "--seed", "3"]) == 0
    saved = capsys.readouterr().out.strip().splitlines()[-1]  # "saved <json> and <png>"
    path = Path(saved.split()[1])
    report = json.loads(path.read_text())
    assert path.with_suffix(".png").stat().st_size > 0
    assert report["turns_completed"] > 20 and report["responses_by_status"]["completed"] == report["turns_completed"]
    assert report["connections_lost"] == 0 and report["error_codes"] == {} and report["server_log_tracebacks"] == 0
    assert report["sessions_after"] == 0
    assert report["fds"]["after"] <= report["fds"]["before"] + 2 and report["tasks"]["after"] <= report["tasks"]["before"] + 2
    assert len([s for s in report["samples"] if s["label"] == "load"]) >= 3
