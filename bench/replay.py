"""The latency replay harness: replays spoken conversations into any OpenAI-Realtime-compatible
server at real-time pace and measures what a caller feels.

    python -m bench replay --url ws://127.0.0.1:8000/v1 --dataset builtin --concurrency 4 --turns 4 --out DIR
    python -m bench.replay --url ws://127.0.0.1:8000/v1 ...     (the same)
    python -m bench compare A/summary.json B/summary.json

This is the driver: conversations (``bench/dataset.py``) go to simulated users (``bench/client.py``),
one per conversation, many at once; their turn records become metrics (``bench/metrics.py``) and
the run's report (``bench/report.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from . import dataset, metrics, report
from .client import TRANSPORTS, Options, SimulatedUser
from .common import server_process
from .dataset import Conversation


class Progress:
    def __init__(self, total: int, stream: Any = sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.t0 = time.perf_counter()

    def step(self) -> None:
        self.done += 1
        width = 30
        filled = width * self.done // max(1, self.total)
        elapsed = time.perf_counter() - self.t0
        self.stream.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} turns  {elapsed:5.0f} s")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


async def replay(
    conversations: list[Conversation],
    options: Options,
    concurrency: int = 1,
    rate: float | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Replay every conversation: at most ``concurrency`` at once, or started at ``rate`` per
    second (Poisson arrivals). Returns the per-turn metrics and the harness's own health."""
    total = sum(len(c.turns[: options.turns or None]) for c in conversations)
    bar = Progress(total) if progress else None
    users = [SimulatedUser(c, options, bar.step if bar else None) for c in conversations]
    rng = random.Random(options.seed)
    limit = asyncio.Semaphore(concurrency if rate is None else len(users))
    t0 = time.perf_counter()

    async def one(user: SimulatedUser, delay: float) -> None:
        await asyncio.sleep(delay)
        async with limit:
            await user.run()

    delays, at = [], 0.0
    for _ in users:
        delays.append(at if rate else 0.0)
        at += rng.expovariate(rate) if rate else 0.0
    await asyncio.gather(*(one(u, d) for u, d in zip(users, delays)))
    lag = [x for user in users for x in user.mic_lag_ms]
    return {
        # timelines in seconds from the conversation's start
        "turns": [rec.metrics(origin=user.t0) for user in users for rec in user.records],
        "connection_errors": [e for user in users for e in user.errors],
        "wall_s": round(time.perf_counter() - t0, 2),
        "mic_lag_ms": {"p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99))} if lag else {},
    }


def replay_into(config: dict[str, Any], conversations: list[Conversation], turns: int = 0, concurrency: int = 1) -> dict[str, Any]:
    """``replay`` into a server of its own, started with ``config`` (the CPU pipeline's may take
    minutes to load) and stopped after; ``self_check`` in the result is what the server measured of
    this machine at warm-up (``/healthz``'s ``speed``), where its pipeline does."""
    with server_process(config, startup_s=900) as url:
        health = url.replace("ws://", "http://").removesuffix("/v1") + "/healthz"
        with urllib.request.urlopen(health, timeout=10) as response:
            speed = json.loads(response.read()).get("speed")
        result = asyncio.run(replay(conversations, Options(url=url, turns=turns), concurrency=concurrency))
        return {**result, "self_check": speed}


def write(out: Path, result: dict[str, Any], meta: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    """A replay's summary, and the files it wrote under ``out`` (``bench/report.py``)."""
    summary = metrics.summarize(result, meta)
    return summary, report.write(out, result, summary)


# ------------------------------------------------------------------------------ command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``python -m bench replay`` (and ``python -m bench.replay``)."""
    parser.add_argument("--url", required=True, help="ws base URL, e.g. ws://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="realtime-omni")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--dataset", default="builtin", help="builtin, builtin-espeak, or a directory of recorded conversations")
    parser.add_argument("--conversations", type=int, default=0, help="how many conversations (default: one per concurrent user)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=1, help="conversations at once")
    load.add_argument("--rate", type=float, default=None, help="conversations started per second (Poisson)")
    parser.add_argument("--turns", type=int, default=0, help="turns per conversation (default: all)")
    parser.add_argument("--barge-in-every", type=int, default=0, help="every Nth turn interrupts the answer before it")
    parser.add_argument("--session", default=None, help="JSON for a session.update sent first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transport", default="websocket", choices=list(TRANSPORTS), help="how the simulated users connect")
    parser.add_argument("--out", default=None, help="output folder (default bench/results/replay-<time>)")


def run(args: argparse.Namespace) -> int:
    """Replay as ``args`` say, print the table and write the report; the exit status."""
    try:
        conversations = dataset.load(args.dataset, args.conversations or max(args.concurrency, 1), args.barge_in_every)
    except (OSError, ValueError) as exc:
        print(f"python -m bench replay: {exc}", file=sys.stderr)
        return 2
    options = Options(
        url=args.url,
        model=args.model,
        api_key=args.api_key,
        turns=args.turns,
        seed=args.seed,
        session=json.loads(args.session) if args.session else None,
        transport=args.transport,
    )
    load = f"rate {args.rate}/s" if args.rate else f"concurrency {args.concurrency}"
    print(f"replaying {len(conversations)} conversations from {args.dataset!r} into {args.url} ({load})", file=sys.stderr)
    result = asyncio.run(replay(conversations, options, concurrency=args.concurrency, rate=args.rate))
    meta = {"url": args.url, "model": args.model, "dataset": args.dataset, "conversations": len(conversations), "load": load,
            "concurrency": args.concurrency, "rate": args.rate, "transport": args.transport, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    summary, files = write(Path(args.out or f"bench/results/replay-{time.strftime('%Y%m%d-%H%M%S')}"), result, meta)
    print(report.table(summary))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
