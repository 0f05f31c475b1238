"""Voice-to-voice latency of a phone call through the SIP bridge, and what the bridge itself adds.

A caller (``bench/sip_caller.py``: SIP over UDP, PCMU RTP on a steady 20 ms clock) asks spoken
questions (espeak-ng) with silence between them. Voice-to-voice is measured at the caller, from
the moment the packet holding the end of the question's speech is sent to the arrival of the first
answer packet with sound in it. With ``server_vad`` at 500 ms of silence, about 500 ms of that is
the end-of-turn wait.

The bridge's own share (jitter buffer, G.711 and rate conversion, the 20 ms playout clock and
packetization) is the difference between the same questions to the same synthetic pipeline by
phone and over WebSocket (the replay harness, 20 ms appends): everything else is the same session.

    python -m bench.sip_latency [--pipelines synthetic cpu] [--turns 8]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np

from bench import replay
from bench.audio import espeak, speech_bounds_ms
from bench.client import Options
from bench.common import free_port, machine, save, server_process
from bench.dataset import RATE, Conversation, Turn
from bench.metrics import dist
from bench.sip_caller import FRAME, Media, Phone, pcm
from dsp.g711 import pcm_to_ulaw, ulaw_to_pcm
from dsp.resample import resample
from realtime_omni import config as config_file

QUESTIONS = [
    "Hi there, how are you today?",
    "What is the capital of France?",
    "Can you recommend a good book?",
    "How far away is the moon?",
    "What should I cook for dinner tonight?",
    "What time does the library open?",
    "Tell me a fun fact about cats.",
    "How do I reset my password?",
]
GAP_S = {"synthetic": 3.0, "cpu": 12.0}  # silence after each question: the answer plays in it
SOUND_RMS = 200.0


def config(pipeline: str, sip_port: int) -> dict[str, Any]:
    if pipeline == "synthetic":
        cfg: dict[str, Any] = {
            "pipeline": {"kind": "synthetic", "options": {"reply": "Sure, I can help with that.", "chunk_ms": 20, "chunk_interval_ms": 20}},
            "session": {"audio": {"input": {"transcription": None}}},
        }
    else:
        cfg = config_file.raw("cpu")
    cfg["sip"] = {"port": sip_port}
    return cfg


def by_phone(sip_port: int, questions: list[str], gap_s: float) -> list[float | None]:
    speech = [resample(espeak(q, RATE), RATE, 8000) for q in questions]
    parts, ends = [np.zeros(8000, np.int16)], []
    pos = 8000
    for question in speech:
        _, end_ms = speech_bounds_ms(question, 8000)
        ends.append((pos + end_ms * 8) // FRAME)  # the frame holding the last speech sample
        parts += [question, np.zeros(int(gap_s * 8000), np.int16)]
        pos += len(question) + int(gap_s * 8000)
    script = np.concatenate(parts)
    phone = Phone(("127.0.0.1", sip_port), f"lat{time.monotonic_ns()}")
    assert phone.dial() == 200, phone.status
    media = Media([phone], [script])
    media.start()
    time.sleep(len(script) / 8000 - 0.5)  # stop before the script loops
    media.stop()
    phone.hangup()
    latencies: list[float | None] = []
    for k, frame in enumerate(ends):
        t_end = media.started + frame * 0.02
        t_next = media.started + ends[k + 1] * 0.02 if k + 1 < len(ends) else float("inf")
        onset = next((t for t, _, p in phone.received if t_end < t < t_next and np.sqrt(np.mean(pcm(p).astype(np.float64) ** 2)) > SOUND_RMS), None)
        latencies.append(round((onset - t_end) * 1000, 1) if onset is not None else None)
    return latencies


def telephone(pcm: np.ndarray) -> np.ndarray:
    """What the phone path does to audio (8 kHz, G.711), back at the harness's rate: the WebSocket
    side hears exactly what the bridge hears, so its voice activity detector decides the same."""
    return resample(ulaw_to_pcm(pcm_to_ulaw(resample(pcm, RATE, 8000))), 8000, RATE)


def over_websocket(url: str, questions: list[str]) -> list[float | None]:
    conversation = Conversation("sip-compare", [Turn(q, telephone(espeak(q, RATE))) for q in questions])
    run = asyncio.run(replay.replay([conversation], Options(url=url)))
    return [t["voice_to_voice_ms"] for t in run["turns"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", nargs="+", default=["synthetic", "cpu"], choices=["synthetic", "cpu"])
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    questions = [QUESTIONS[k % len(QUESTIONS)] for k in range(args.turns)]
    result: dict[str, Any] = {"machine": machine(), "turns": args.turns, "pipelines": {}}
    for pipeline in args.pipelines:
        sip_port = free_port()
        print(f"{pipeline}: starting the server ...", flush=True)
        with server_process(config(pipeline, sip_port), startup_s=900) as url:
            phone = by_phone(sip_port, questions, GAP_S[pipeline])
            ws = over_websocket(url, questions)
        entry: dict[str, Any] = {"phone_v2v_ms": dist([v for v in phone if v is not None]), "phone_turns_ms": phone, "missed": phone.count(None)}
        if ws:
            entry["websocket_v2v_ms"] = dist([v for v in ws if v is not None])
            entry["websocket_turns_ms"] = ws
            entry["bridge_added_ms_p50"] = round(entry["phone_v2v_ms"]["p50"] - entry["websocket_v2v_ms"]["p50"], 1)
        result["pipelines"][pipeline] = entry
        print(f"{pipeline}: phone v2v {entry['phone_v2v_ms']}", flush=True)
        if ws:
            print(f"{pipeline}: websocket v2v {entry['websocket_v2v_ms']}; bridge adds {entry['bridge_added_ms_p50']} ms (p50 difference)", flush=True)
    print("saved", save("sip_latency", result))


if __name__ == "__main__":
    main()
