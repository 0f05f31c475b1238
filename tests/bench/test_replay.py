"""The replay harness measured against ground truth: the synthetic pipeline with known latencies.

Known: the first chunk leaves 300 ms after the response is requested, then 40 ms of audio every
40 ms (real time), with one 250 ms stall before chunk 10; 20 words of 240 ms = 4.8 s of audio.
Tolerances: the server adds ~1-3 ms between its end-of-turn and the pipeline's start (measured by
bench/ws_overhead, p99 2.7 ms), loopback adds less, and the harness shares two cores with the
server, so its own clock readings can lag by a scheduler slice: 40 ms covers that with room.
The end-of-turn wait is the VAD's 500 ms of silence plus its 30 ms frames and our 20 ms appends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import websockets

from bench import dataset, metrics, replay
from bench.client import Options

KNOWN = dict(first_chunk_ms=300, chunk_ms=40, chunk_interval_ms=40, stall_after_chunks=10, stall_ms=250, reply=" ".join(["word"] * 20))
SLACK_MS = 40


@pytest.fixture(scope="module")
def known_server(make_server):
    return make_server(**KNOWN)


@pytest.fixture(scope="module")
def conversations():
    return dataset.builtin(1, piper=False)


@pytest.mark.slow
async def test_reports_known_latencies(known_server, conversations):
    result = await replay.replay(conversations, Options(url=known_server.ws_base, turns=2), progress=False)
    turns = result["turns"]
    assert [t["status"] for t in turns] == ["completed", "completed"] and not result["connection_errors"]
    for t in turns:
        assert 300 <= t["audio_ttfp_ms"] <= 300 + SLACK_MS, t
        assert 500 <= t["turn_end_detected_ms"] <= 500 + 30 + 20 + SLACK_MS, t
        assert t["voice_to_voice_ms"] == pytest.approx(t["turn_end_detected_ms"] + t["audio_ttfp_ms"], abs=1.0)
        assert abs(t["ttft_ms"] - t["voice_to_voice_ms"]) <= SLACK_MS  # the transcript leads its audio
        assert t["audio_s"] == pytest.approx(4.8, abs=0.01)
        assert t["gaps_over_100ms"] == 1 and 250 - SLACK_MS <= t["max_gap_ms"] <= 250 + SLACK_MS, t
        # last audio at 300 + 119 * 40 + 250 ms after the turn's end, for 4.8 s of audio
        assert t["audio_rtf"] == pytest.approx((0.3 + 119 * 0.04 + 0.25) / 4.8, abs=SLACK_MS / 1000 / 4.8)
        assert 300 <= t["server_timings_ms"]["first_output"] <= 300 + SLACK_MS
        assert t["input_wer"] is not None and t["heard"].endswith("seconds of audio")  # synthetic transcripts
    summary = metrics.summarize(result, {})
    assert summary["gaps_over_100ms"]["total"] == 2 and summary["errors"] == 0
    assert 300 <= summary["audio_ttfp_ms"]["p50"] <= 300 + SLACK_MS


@pytest.mark.slow
async def test_barge_in_turn_reports_its_latency(known_server, conversations):
    barging = dataset.builtin(1, barge_in_every=1, piper=False)
    result = await replay.replay(barging, Options(url=known_server.ws_base, turns=2), progress=False)
    first, second = result["turns"]
    assert first["status"] == "cancelled" and second["barge_in"]
    # onset of speech -> playback stopped (speech_started) and -> response.done(cancelled): the VAD
    # needs some speech to be sure, then the cancel is immediate; far less than the 4 s still to come
    assert 0 < second["barge_in_ms"] <= second["barge_in_cancel_ms"] < 600, second
    assert second["status"] == "completed"
    assert first["audio_s"] < 4.8  # the answer was cut
    assert not first["errors"] and not second["errors"]  # the truncate to what was heard was accepted


@pytest.mark.slow
async def test_barge_in_on_an_answer_still_playing(make_server):
    """The server is done generating (all audio arrives at once) but the user is still
    hearing it: the barge-in stops playback at speech_started; there is nothing left to cancel."""
    fast = make_server(**{**KNOWN, "chunk_interval_ms": 0, "stall_ms": 0, "stall_after_chunks": 0})
    barging = dataset.builtin(1, barge_in_every=1, piper=False)
    result = await replay.replay(barging, Options(url=fast.ws_base, turns=2), progress=False)
    first, second = result["turns"]
    assert first["status"] == "completed" and second["barge_in_cancel_ms"] is None
    assert 0 < second["barge_in_ms"] < 600 and not first["errors"] and not second["errors"], (first, second)


async def test_a_server_that_drops_the_connection_is_counted_not_fatal(conversations):
    async def rude(ws):
        await ws.send(json.dumps({"type": "session.created"}))
        for _ in range(10):
            await ws.recv()
        await ws.close()

    async with websockets.serve(rude, "127.0.0.1", 0) as srv:
        port = srv.sockets[0].getsockname()[1]
        result = await replay.replay(conversations, Options(url=f"ws://127.0.0.1:{port}/v1", turns=2), progress=False)
    summary = metrics.summarize(result, {})
    assert summary["errors"] >= 1 and "closed the connection" in " ".join(summary["error_messages"])


async def test_unreachable_server_is_an_error(conversations):
    result = await replay.replay(conversations, Options(url="ws://127.0.0.1:9/v1", turns=1), progress=False)
    assert result["turns"] == [] and result["connection_errors"][0].startswith("connect:")


def test_word_error_rate():
    assert metrics.wer("What is the capital of France?", "what is the capital of france") == 0.0
    assert metrics.wer("What is the capital of France?", "What is the capital and friends?") == pytest.approx(2 / 6)
    assert metrics.wer("one two three", "one three") == pytest.approx(1 / 3)
    assert metrics.wer("one two", "one two three four") == pytest.approx(1.0)


def test_recorded_dataset_directory(tmp_path: Path):
    from tests.support.audio import espeak, write_wav

    conv = tmp_path / "booking"
    conv.mkdir()
    for i, text in enumerate(["A table for two.", "At seven."], 1):
        write_wav(conv / f"{i:02d}.wav", espeak(text, 16000), 16000)
        (conv / f"{i:02d}.txt").write_text(text)
    (conv / "conversation.json").write_text('{"barge_in": [2]}')
    (convs,) = dataset.from_directory(tmp_path)
    assert [t.text for t in convs.turns] == ["A table for two.", "At seven."]
    assert [t.barge_in for t in convs.turns] == [False, True]
    assert convs.turns[0].audio.dtype.name == "int16"
    with pytest.raises(ValueError):
        dataset.from_directory(tmp_path / "booking")  # no conversation folders inside
    run = subprocess.run([sys.executable, "-m", "bench", "replay", "--url", "ws://127.0.0.1:9/v1", "--dataset", str(tmp_path / "nope")], capture_output=True, text=True)
    assert run.returncode == 2 and "dataset directory not found" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
async def test_cli_writes_summary_turns_plots_and_compares(known_server, tmp_path: Path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench", "replay", "--url", known_server.ws_base, "--dataset", "builtin-espeak", "--turns", "2", "--out", str(out)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    text = stdout.decode()
    assert "Realtime Replay Result" in text and "Median voice_to_voice (ms):" in text
    assert "2/2 turns" in stderr.decode()  # the progress bar
    summary = json.loads((out / "summary.json").read_text())
    for key in ("voice_to_voice_ms", "ttft_ms", "audio_ttfp_ms", "audio_rtf", "input_wer"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p99"}, key
    assert summary["gaps_over_100ms"]["total"] == 2 and summary["errors"] == 0 and summary["barge_in_ms"] is None
    assert len((out / "turns.jsonl").read_text().splitlines()) == 2
    for png in ("latency_cdf.png", "timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    compared = subprocess.run([sys.executable, "-m", "bench", "compare", str(out / "summary.json"), str(out / "summary.json")], capture_output=True, text=True, check=True)
    assert "voice_to_voice_ms" in compared.stdout and "1.00" in compared.stdout


def test_playback_is_simulated_in_real_time_from_the_first_packet():
    rec = metrics.TurnRecord("c", 0, "", False, deliveries=[(10.0, 0.5), (10.2, 0.5), (11.5, 0.25)])
    assert metrics.playback_schedule(rec.deliveries) == [(10.0, 0.5), (10.5, 0.5), (11.5, 0.25)]
    assert rec.playback_end() == 11.75
    assert rec.gaps() == pytest.approx([0.5])  # the third packet came 0.5 s after the second had played
    assert rec.played_s(10.75) == pytest.approx(0.75) and rec.played_s(20.0) == pytest.approx(1.25)
    assert metrics.TurnRecord("c", 0, "", False).playback_end() == 0.0


def test_the_first_audible_sample_is_timed_as_it_plays():
    rate = 1000  # 1 ms a sample
    rec = metrics.TurnRecord("c", 0, "", False, speech_end_t=9.0)

    def arrive(t: float, pcm: np.ndarray) -> None:  # what the client does with each delta
        rec.first_audio_t = rec.first_audio_t or t
        rec.audio_s += len(pcm) / rate
        rec.heard_from(t, pcm, rate)

    arrive(10.0, np.zeros(50, np.int16))  # 50 ms of lead-in
    assert rec.first_audible_t is None
    arrive(10.01, np.concatenate([np.full(20, metrics.AUDIBLE - 1, np.int16), np.full(5, -metrics.AUDIBLE, np.int16)]))
    assert rec.first_audible_t == pytest.approx(10.0 + 0.050 + 0.020)  # played from the first delta's arrival
    arrive(10.02, np.full(10, 30000, np.int16))  # later loud audio changes nothing
    m = rec.metrics()
    assert m["voice_to_voice_ms"] == 1000.0 and m["voice_to_voice_audible_ms"] == pytest.approx(1070.0)
    late = metrics.TurnRecord("c", 0, "", False, first_audio_t=10.0, audio_s=0.01)
    late.heard_from(12.0, np.full(10, 30000, np.int16), rate)  # it cannot play before it arrives
    assert late.first_audible_t == 12.0


def test_microphone_frames_and_speech_positions():
    from bench.microphone import CHUNK, FrameQueue, Mic

    queue = FrameQueue()
    queue.push(np.full(CHUNK + 10, 1000, np.int16))
    assert queue.queued == CHUNK + 10
    assert (queue.take(CHUNK) == 1000).all()
    tail = queue.take(CHUNK)  # 10 samples of speech, then silence
    assert (tail[:10] == 1000).all() and not tail[10:].any() and queue.queued == 0

    async def send(_: bytes) -> None: ...

    mic = Mic(send)
    speech = np.concatenate([np.zeros(100, np.int16), np.full(200, 1000, np.int16), np.zeros(50, np.int16)])
    assert mic.play(speech) == (100, 299)
    assert mic.play(speech) == (350 + 100, 350 + 299)  # after what is still queued


def test_both_command_lines_take_the_same_flags():
    def flags(*cmd: str) -> str:
        out = subprocess.run([sys.executable, *cmd, "--help"], capture_output=True, text=True, check=True).stdout
        return out[out.index("options:") :]

    assert "--barge-in-every" in flags("-m", "bench.replay")
    assert flags("-m", "bench.replay") == flags("-m", "bench", "replay")


def test_python_m_bench_lists_the_benches_and_refuses_an_unknown_one():
    listed = subprocess.run([sys.executable, "-m", "bench"], capture_output=True, text=True, check=True).stdout
    names = [line.split()[0] for line in listed.splitlines() if line.startswith("  ")]
    assert {"replay", "compare", "fuzz", "soak", "storms", "vs_pipecat"} <= set(names)
    assert not {"common", "metrics", "audio"} & set(names)  # modules without a command line are not benches
    unknown = subprocess.run([sys.executable, "-m", "bench", "nope"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "no bench named 'nope'" in unknown.stderr


def test_webrtc_vs_ws_compares_paths_less_each_answers_making(tmp_path: Path):
    from bench.webrtc_vs_ws import paths

    rows = [
        {"voice_to_voice_audible_ms": 700.0, "server_timings_ms": {"first_audio": 150.0}},
        {"voice_to_voice_audible_ms": 560.0, "server_timings_ms": {"first_audio": 20.0}},
        {"voice_to_voice_audible_ms": None, "server_timings_ms": {"first_audio": 20.0}},  # never heard: not a path
        {"voice_to_voice_audible_ms": 600.0, "server_timings_ms": {}},  # no server timing (a peer's server)
    ]
    (tmp_path / "turns.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert paths(tmp_path) == [550.0, 540.0]
