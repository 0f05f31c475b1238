"""What this server adds in front of a vLLM-Omni deployment: the first audio chunk out of the engine
-> the first ``response.output_audio.delta`` at the client.

The engine is the faithful fake (bench/fake_omni.py) in its own process, streaming as a model
would: the first chunk at once, then one word (240 ms of audio) every ``--chunk-ms``. It stamps the
moment it hands its first audio chunk to the socket (``time.perf_counter``: CLOCK_MONOTONIC, one
clock for every process of the machine) and the client stamps the first audio delta it receives;
the difference is the path through this server (HTTP/SSE read, decode, the session, the event
envelope, base64, WebSocket send) plus loopback. The server (configs/qwen3-omni.yaml pointed at
the fake) runs in a third process. Each session holds text turns (``conversation.item.create`` +
``response.create``) with a think time between them, sessions starting at random offsets, as
users do. Client, server and engine share the machine's cores: an upper bound.

    python -m bench.omni_overhead --sessions 1 50 --turns 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

from bench.client import first_audio, open_session
from bench.common import free_port, machine, save, server_process, stop, wait_ready
from bench.metrics import dist
from realtime_omni import config as config_file


def server_config(engine_url: str, sessions: int) -> dict[str, Any]:
    config = config_file.raw("qwen3-omni")
    config["pipeline"]["options"]["remote"]["url"] = engine_url
    config["limits"] = {"max_sessions": sessions + 10}
    return config


@contextlib.contextmanager
def engine_process(chunk_ms: float) -> Iterator[str]:
    """The fake deployment in its own process; yields its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.fake_omni", "--port", str(port), "--profile", "qwen3-omni", "--chunk-ms", str(chunk_ms)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health", 60, "the fake engine", every_s=0.1)
        yield url
    finally:
        stop(proc, grace_s=10.0)


def recorded(engine: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{engine}/fake/requests", timeout=30) as r:
        return json.loads(r.read())["requests"]


async def one_session(url: str, index: int, turns: int, think_s: float, firsts: dict[str, list[float]]) -> None:
    await asyncio.sleep(random.uniform(0, think_s))
    ws = await open_session(url, "bench")
    marker = f"bench session {index}"
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": marker}}))
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]}
    mine = firsts.setdefault(marker, [])
    try:
        for _ in range(turns):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            first = await first_audio(ws)
            mine.append(first if first is not None else float("nan"))
            await asyncio.sleep(random.uniform(0.5, 1.5) * think_s)
    finally:
        await ws.close()


async def run(url: str, sessions: int, turns: int, think_s: float) -> dict[str, list[float]]:
    firsts: dict[str, list[float]] = {}
    await asyncio.gather(*(one_session(url, i, turns, think_s, firsts) for i in range(sessions)))
    return firsts


def overheads(firsts: dict[str, list[float]], records: list[dict[str, Any]], warmup: int) -> list[float]:
    """Per turn: client first delta - engine first audio chunk, matched by session and order."""
    sent: dict[str, list[float | None]] = {}
    for r in records:
        marker = r["body"]["messages"][0]["content"]
        sent.setdefault(marker, []).append(r["first_audio_at"])
    out = []
    for marker, client in firsts.items():
        for turn, (got, at) in enumerate(zip(client, sent.get(marker, []))):
            if turn >= warmup and at is not None and got == got:
                out.append((got - at) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--turns", type=int, default=10, help="per session; the first is a warm-up")
    parser.add_argument("--chunk-ms", type=float, default=240.0, help="the engine's pace: one word of audio per chunk")
    parser.add_argument("--think-s", type=float, default=2.0, help="a user's pause between turns (mean)")
    args = parser.parse_args()
    results = []
    for sessions in args.sessions:
        with engine_process(args.chunk_ms) as engine, server_process(server_config(f"{engine}/v1", sessions)) as url:
            firsts = asyncio.run(run(url, sessions, args.turns, args.think_s))
            samples = overheads(firsts, recorded(engine), warmup=1)
        result = {"sessions": sessions, **dist(samples)}
        results.append(result)
        print(f"{sessions:4d} sessions: engine first audio -> client first audio delta p50 {result['p50']} p99 {result['p99']} ms (n={result['n']})")
    summary = {"metric": "engine_first_audio_to_client_first_delta_ms", "chunk_ms": args.chunk_ms, "levels": results, "machine": machine()}
    print("saved", save("omni_overhead", summary))


if __name__ == "__main__":
    main()
