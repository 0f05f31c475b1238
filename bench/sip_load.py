"""How many concurrent phone calls the SIP bridge carries while its outgoing RTP stays on a
20 ms clock.

The server runs the synthetic pipeline in its own process. Each call (``bench/sip_caller.py``)
plays a spoken question followed by silence, looped, each call at its own offset, so answers are
always playing somewhere; every call receives a continuous 20 ms stream (answers and silence).
For each level of concurrency the caller records every packet's arrival time and reports the
deviation of each inter-arrival gap from 20 ms (p50/p99/max over all calls), lost or reordered
packets, and the answers heard. Levels go up until p99 exceeds the target (5 ms) or calls fail.

The measuring client shares the machine (and its cores) with the server, so the figures are an
upper bound on the server's own jitter.

    python -m bench.sip_load [--levels 10 25 50 100 150 200] [--seconds 15]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np

from bench.audio import espeak
from bench.common import free_port, machine, save, server_process
from bench.metrics import dist
from bench.sip_caller import Media, Phone, pcm
from dsp.resample import resample

TARGET_P99_MS = 5.0
WARMUP_S = 3.0


def config(sip_port: int, calls: int) -> dict[str, Any]:
    return {
        "pipeline": {"kind": "synthetic", "options": {"reply": "Sure, I can help with that.", "chunk_ms": 20, "chunk_interval_ms": 20}},
        "limits": {"max_sessions": calls + 10},
        "session": {"audio": {"input": {"transcription": None}}},
        "sip": {"port": sip_port, "rtp_timeout_s": 60},
    }


def script() -> np.ndarray:
    speech = resample(espeak("Could you tell me what the weather will be like tomorrow?"), 24000, 8000)
    return np.concatenate([np.zeros(2400, np.int16), speech, np.zeros(8000 * 4, np.int16)])


def run_level(calls: int, seconds: float) -> dict[str, Any]:
    sip_port = free_port()
    base = script()
    rng = random.Random(calls)
    with server_process(config(sip_port, calls)) as _url:
        phones = [Phone(("127.0.0.1", sip_port), f"load{calls}x{i}x{time.monotonic_ns()}") for i in range(calls)]
        statuses = [p.dial() for p in phones]
        scripts = [np.roll(base, rng.randrange(len(base))) for _ in phones]
        media = Media(phones, scripts)
        media.start()
        time.sleep(seconds)
        media.stop()
        for p in phones:
            p.hangup()
    deviations: list[float] = []
    lost = reordered = answered = 0
    for phone in phones:
        packets = [(t, s, p) for t, s, p in phone.received if t > media.started + WARMUP_S]
        if len(packets) < 2:
            continue
        times = np.array([t for t, _, _ in packets])
        deviations += list(np.abs(np.diff(times) * 1000 - 20.0))
        seqs = np.array([s for _, s, _ in packets], dtype=np.int64)
        steps = np.diff(seqs) % 65536
        lost += int(np.sum(steps[steps < 1000] - 1))
        reordered += int(np.sum(steps >= 32768))
        answered += any(np.abs(pcm(p)).max() > 1000 for _, _, p in packets[::5])
    expected = calls * (seconds - WARMUP_S) / 0.02
    received = sum(len([1 for t, _, _ in ph.received if t > media.started + WARMUP_S]) for ph in phones)
    return {
        "calls": calls,
        "answered_200": statuses.count(200),
        "calls_with_answers_heard": answered,
        "deviation_ms": dist(deviations),
        "packets_received_fraction": round(received / expected, 4) if expected else 0,
        "lost": lost,
        "reordered": reordered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", nargs="+", type=int, default=[10, 25, 50, 100, 150, 200])
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": machine(), "seconds": args.seconds, "target_p99_ms": TARGET_P99_MS, "levels": []}
    carried = 0
    for calls in args.levels:
        level = run_level(calls, args.seconds)
        result["levels"].append(level)
        d = level["deviation_ms"]
        print(f"{calls:4d} calls: 200 OK {level['answered_200']}, answers heard {level['calls_with_answers_heard']}, "
              f"gap deviation p50 {d.get('p50')} p99 {d.get('p99')} max {d.get('max')} ms, "
              f"received {level['packets_received_fraction']:.1%}, lost {level['lost']}", flush=True)
        ok = level["answered_200"] == calls and d.get("p99", 1e9) <= TARGET_P99_MS
        if not ok:
            break
        carried = calls
    result["max_calls_within_target"] = carried
    print(f"carried {carried} concurrent calls with p99 gap deviation <= {TARGET_P99_MS} ms")
    print("saved", save("sip_load", result))


if __name__ == "__main__":
    main()
