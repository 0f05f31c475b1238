"""Voice-to-voice latency through WebRTC vs WebSocket, same turns, same server.

1. The replay harness (bench/replay.py) replays the same conversations over WebSocket and over
   WebRTC (aiortc + the SDK's calls.create): v2v = end of the user's speech -> first answer audio
   at the client. The difference is what the WebRTC path adds (Opus, jitter buffers, 20 ms pacing);
   with the synthetic pipeline at zero latency it is the path's whole cost.
2. Headless Chromium runs the web demo with a fake microphone (bench/browser.py, loopback-only
   network namespace); the page measures each turn itself (last loud mic sample -> first loud
   sample of the answer).
3. The path: each turn's figure to the answer's first audible sample, less the server's own time
   from the turn's trigger to its first audio (response.done's ``timing.first_audio_ms``), so that
   transports compare whatever each answer cost to make (the page asks one question again and
   again, and Whisper may hear it otherwise than the replay's voices).

    python -m bench.webrtc_vs_ws --configs synthetic cpu --turns 4 --conversations 3 --browser-turns 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.audio import espeak as speak
from bench.audio import silence, speech_bounds_ms, write_wav
from bench.common import RESULTS, server_config, server_process
from bench.metrics import dist

QUESTION = "What is the capital of France?"
# tones, first audio at once: only the path is measured
SYNTHETIC: dict[str, Any] = {"pipeline": {"kind": "synthetic", "options": {}}, "session": {"audio": {"input": {"transcription": {"model": "synthetic"}}}}}


def replay(url: str, transport: str, turns: int, conversations: int, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench", "replay", "--url", url, "--turns", str(turns),
           "--conversations", str(conversations), "--transport", transport, "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def paths(out: Path) -> list[float]:
    """Per turn of a replay in ``out``: end of speech -> the answer's first audible sample, less the
    server's own time from the turn's trigger to its first audio (``timing.first_audio_ms``): the
    end of turn's wait and the way there and back, whatever the answer cost to make."""
    rows = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines() if line.strip()]
    return [r["voice_to_voice_audible_ms"] - r["server_timings_ms"]["first_audio"] for r in rows
            if r.get("voice_to_voice_audible_ms") is not None and "first_audio" in r["server_timings_ms"]]


def browser(config: dict[str, Any], turns: int, gap_ms: int, out: Path) -> list[tuple[float, float | None]]:
    """(the page's latency, the server's trigger -> first audio) per turn, in ms."""
    speech = speak(QUESTION, 48000)
    first, last = speech_bounds_ms(speech, 48000)
    speech = speech[first * 48 : (last + 1) * 48]
    wav = out / "question.wav"
    out.mkdir(parents=True, exist_ok=True)
    write_wav(wav, np.concatenate([silence(500, 48000), speech, silence(gap_ms, 48000)]), 48000)
    cmd = [sys.executable, "-m", "bench.browser", "--config", json.dumps(config), "--wav", str(wav), "--turns", str(turns),
           "--timeout", str(turns * (gap_ms / 1000 + 4) + 20), "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = json.loads((out / "result.json").read_text())
    return [
        (t["latencyMs"], float(t["timings"]["timing.first_audio_ms"]) if "timing.first_audio_ms" in t["timings"] else None)
        for t in state["demo"]["turns"]
        if t["latencyMs"] is not None and not t["interrupted"]
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["synthetic", "cpu"])
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--browser-turns", type=int, default=5)
    args = p.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = RESULTS / f"webrtc-vs-ws-{stamp}"
    rows: dict[str, Any] = {}
    for name in args.configs:
        config = server_config(name, SYNTHETIC)
        config["webrtc"] = {**config.get("webrtc", {}), "host_addresses": ["127.0.0.1"]}
        row: dict[str, Any] = {}
        with server_process(config) as url:
            for transport in ("websocket", "webrtc"):
                s = replay(url, transport, args.turns, args.conversations, root / f"{name}-{transport}")
                row[transport] = {"v2v": s["voice_to_voice_ms"], "v2v_audible": s["voice_to_voice_audible_ms"], "ttfp": s["audio_ttfp_ms"],
                                  "path": dist(paths(root / f"{name}-{transport}")), "errors": s["errors"]}
        gap = 5000 if name == "synthetic" else 9000
        heard = browser(config, args.browser_turns, gap, root / f"{name}-chromium")
        row["chromium"] = {"v2v": dist([v for v, _ in heard]), "path": dist([v - m for v, m in heard if m is not None])}
        rows[name] = row
        ws, rtc = row["websocket"]["v2v"], row["webrtc"]["v2v"]
        row["webrtc_added_ms"] = round(rtc["p50"] - ws["p50"], 1)
        heard = row["websocket"]["v2v_audible"] or {}  # to the first audible sample, as the WebRTC clients measure
        print(f"{name}: v2v p50 websocket {ws['p50']:.0f} (its first audible sample {heard.get('p50', float('nan')):.0f}) | webrtc (aiortc)"
              f" {rtc['p50']:.0f} | chromium {row['chromium']['v2v']['p50']:.0f} ms; webrtc adds {row['webrtc_added_ms']:.0f} ms", flush=True)
        # the answers differ from run to run (sampled; the page says one question again and again):
        # the path, less each answer's own making, compares the transports whatever was answered
        p50 = {t: (row[t]["path"] or {}).get("p50") for t in ("websocket", "webrtc", "chromium")}
        if p50["websocket"] is not None and p50["chromium"] is not None:
            row["chromium_path_added_ms"] = round(p50["chromium"] - p50["websocket"], 1)
            print(f"{name}: the path (v2v to the first audible sample, less the server's trigger -> first audio) p50 websocket"
                  f" {p50['websocket']:.0f} | webrtc (aiortc) {p50['webrtc'] or float('nan'):.0f} | chromium {p50['chromium']:.0f} ms;"
                  f" chromium adds {row['chromium_path_added_ms']:.0f} ms", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))
    print(f"wrote {root}/summary.json")


if __name__ == "__main__":
    main()
