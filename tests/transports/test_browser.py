"""Headless Chromium talks to the server over WebRTC through the web demo, with a fake microphone
playing an espeak-ng WAV; server and browser share a network namespace that has only loopback
(``bench.browser``). The page's own state and a screenshot are checked."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import cpu_config, synthetic_config
from tests.support.audio import silence, spoken, wer, write_wav

QUESTION = "What is the capital of France?"


def _private_network_allowed() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# The browser and the server share a network namespace of their own; creating one needs root (or
# user namespaces). Where that is not allowed, the test cannot run here.
pytestmark = [pytest.mark.system, pytest.mark.skipif(not _private_network_allowed(), reason="cannot create a network namespace here (unshare --net)")]


def question_wav(path: Path, gap_ms: int = 5000) -> float:
    """The question after 0.5 s of silence, then ``gap_ms`` of silence (the fake mic loops it).
    Returns the question's length in seconds."""
    speech = spoken(QUESTION, 48000)
    write_wav(path, np.concatenate([silence(500, 48000), speech, silence(gap_ms, 48000)]), 48000)
    return len(speech) / 48000


def talk(tmp_path: Path, config: dict, *, turns: int, timeout: float, gap_ms: int = 5000, startup: float = 120) -> tuple[dict, float]:
    wav = tmp_path / "question.wav"
    seconds = question_wav(wav, gap_ms)
    out = tmp_path / "browser"
    cmd = [sys.executable, "-m", "bench.browser", "--config", json.dumps(config), "--wav", str(wav), "--turns", str(turns),
           "--timeout", str(timeout), "--startup", str(startup), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + startup + 60)
    result = out / "result.json"
    assert result.exists(), f"the browser run wrote nothing:\n{proc.stdout}\n{proc.stderr}\n{_tail(out / 'chromium.log')}"
    state = json.loads(result.read_text())
    assert not state["demo"]["errors"], state["demo"]["errors"]
    return state, seconds


def _tail(path: Path) -> str:
    return path.read_text()[-3000:] if path.exists() else ""


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def check_page(state: dict, out: Path, turns: int) -> list[dict]:
    demo, dom = state["demo"], state["dom"]
    heard = [t for t in demo["turns"] if t["latencyMs"] is not None]
    assert len(heard) >= turns, demo["turns"]
    assert demo["maxRemoteRms"] > 0.02  # the answer's audio really played in the page
    # the key elements of the page, in the DOM and in the picture
    assert dom["mic"] and dom["micOn"] and dom["status"].startswith("live")
    assert dom["latency"].isdigit() and int(dom["latency"]) > 0
    assert dom["timelineRows"] >= 1
    assert len(dom["userBubbles"]) >= turns and len(dom["assistantBubbles"]) >= turns
    width, height = png_size(out / "screenshot.png")
    assert (width, height) == (1280, 800) or width >= 800
    assert (out / "screenshot.png").stat().st_size > 20_000  # a rendered page, not a blank one
    return heard


def test_chromium_conversation_with_the_synthetic_pipeline(tmp_path):
    config = synthetic_config()
    state, seconds = talk(tmp_path, config, turns=2, timeout=45)
    heard = check_page(state, tmp_path / "browser", 2)
    for turn in heard[:2]:
        # the server received the whole question: the synthetic transcript is the committed turn's
        # duration, the speech plus 300 ms of prefix padding and the 500 ms of silence that ended it
        got = float(turn["user"].split()[0])
        assert abs(got - (seconds + 0.8)) < 0.3, (got, seconds)
        assert turn["assistant"] == f"You said {turn['user']}."
        assert any(k.startswith("timing.") for k in turn["timings"])
    dom = state["dom"]
    assert dom["userBubbles"][0] == heard[0]["user"]
    assert dom["assistantBubbles"][0] == heard[0]["assistant"]


def test_chromium_barge_in_cuts_the_answer(tmp_path):
    # a 9.6 s answer in real time; the looping mic asks again 2.5 s into it
    config = synthetic_config(chunk_interval_ms=40, reply=" ".join(["word"] * 40))
    state, _ = talk(tmp_path, config, turns=2, timeout=45, gap_ms=2500)
    demo = state["demo"]
    assert demo["cleared"] >= 1
    assert demo["turns"][0]["interrupted"]
    first = demo["turns"][0]["assistant"].split()
    assert 0 < len(first) < 40  # the page shows the words of the answer that were played


@pytest.mark.engine
def test_chromium_conversation_with_the_cpu_pipeline(tmp_path):
    state, _ = talk(tmp_path, cpu_config(), turns=1, timeout=60, startup=900)
    heard = check_page(state, tmp_path / "browser", 1)
    # Whisper heard the question (tiny.en through Opus may slip a word: "capital and friends")
    assert wer(QUESTION, heard[0]["user"]) <= 0.4, heard[0]["user"]
    assert heard[0]["assistant"].strip()


def test_a_page_on_another_origin_calls_over_webrtc_with_an_ephemeral_key(tmp_path):
    """A page of your own (not the demo), served from another loopback origin, posts its offer with
    an ephemeral key: from an origin `allowed_origins` does not list, the browser stops it at the
    preflight (the key stays unspent); from the listed one the whole call runs (CORS)."""
    script = 'ip link set lo up && exec "$@"'
    cmd = ["unshare", "--net", "sh", "-c", script, "sh", sys.executable, "-m", "tests.support.cross_origin", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    result_file = tmp_path / "result.json"
    assert result_file.exists(), f"{proc.stdout}\n{proc.stderr}\n{_tail(tmp_path / 'chromium.log')}"
    result = json.loads(result_file.read_text())
    refused, page = result["unlisted"], result["listed"]
    assert "Failed to fetch" in refused.get("error", ""), refused  # the preflight's 403: the offer never left
    assert "status" not in refused
    assert "error" not in page, page
    assert page["status"] == 201
    assert page["location"].startswith("/v1/realtime/calls/")  # Location is exposed to the page
    assert page["events"][0] == "session.created"
    assert page["response"]["status"] == "completed"
    transcript = page["response"]["output"][0]["content"][0]["transcript"]
    assert "hello from another origin" in transcript, transcript
    assert page["remoteTrack"]
    assert result["sessions_after"] == 0  # the page's close ended the call
