"""Server overhead at one session: ``input_audio_buffer.commit`` -> first ``response.output_audio.delta``.

The synthetic pipeline runs at zero model latency, so what is measured is the server itself
(decode, commit, response envelope, first chunk, encode, send) plus loopback, as a client sees it.
The client is a bare ``websockets`` connection that does as little as possible per event.

    python -m bench ws_overhead --turns 1000
    python -m bench ws_overhead --turns 1000 --traces compare

``--traces on`` exports every span (OpenTelemetry over OTLP/HTTP, every session sampled) to a
receiver on loopback, in this process, that takes each request and drops it; ``--traces compare``
runs a server without traces and one with them side by side, their turns interleaved in rounds
(the box's other load falls on both alike), and reports both and the ratio of their medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.audio import espeak
from bench.client import append_message, first_audio, open_session
from bench.common import machine, save, server_process
from bench.metrics import dist

CONFIG = {
    "pipeline": {"kind": "synthetic", "options": {"reply": "One two three.", "first_chunk_ms": 0, "chunk_ms": 40}},
    "session": {"audio": {"input": {"turn_detection": None}}},
    "limits": {"max_sessions": 10},
}


class Receiver:
    url = ""
    exports = 0  # requests taken
    bytes = 0


@contextlib.contextmanager
def dropping_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP endpoint on loopback that reads each export and drops it (200, empty answer),
    counting what it was sent."""
    got = Receiver()

    class Drop(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector would

        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            got.bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            got.exports += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drop)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    got.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


def traced(endpoint: str) -> dict[str, Any]:
    return {**CONFIG, "tracing": {"endpoint": endpoint, "sample_ratio": 1.0}}


async def run(url: str, turns: int, warmup: int = 20) -> list[float]:
    speech = espeak("What time is it?")[: 24000 // 2]  # 500 ms of speech
    appends = [append_message(speech[i : i + 480].tobytes()) for i in range(0, len(speech), 480)]
    commit = json.dumps({"type": "input_audio_buffer.commit"})
    create = json.dumps({"type": "response.create"})
    out = []
    ws = await open_session(url, "bench")
    try:
        for turn in range(turns + warmup):
            for msg in appends:
                await ws.send(msg)
            t0 = time.perf_counter()
            await ws.send(commit)
            await ws.send(create)
            first = await first_audio(ws)
            if turn >= warmup:  # warm-up turns are not counted
                out.append((first - t0) * 1000)
            # keep the conversation short: the history is not what is measured here
            if turn % 10 == 9:
                await ws.close()
                ws = await open_session(url, "bench")
    finally:
        await ws.close()
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Side:
    def __init__(self, url: Any) -> None:
        self.url = url
        self.samples: list[float] = []
        self.cpu_s = 0.0  # the server's CPU time during its own blocks of turns
        self.turns = 0  # in those blocks, warm-up turns included


async def compare(off: Side, on: Side, turns: int, rounds: int) -> None:
    """The same turns against both servers, in ``rounds`` alternating blocks (which goes first
    alternates too), with each server's CPU time over its own blocks."""
    per = max(1, turns // rounds)
    for r in range(rounds):
        for side in (off, on) if r % 2 == 0 else (on, off):
            warmup = 20 if r == 0 else 2
            before = cpu_seconds(side.url.process.pid)
            side.samples += await run(side.url, per, warmup=warmup)
            side.cpu_s += cpu_seconds(side.url.process.pid) - before
            side.turns += per + warmup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--traces", choices=["off", "on", "compare"], default="off", help="export OpenTelemetry spans to a loopback receiver that drops them")
    parser.add_argument("--rounds", type=int, default=10, help="with --traces compare: blocks of turns alternating between the two servers")
    args = parser.parse_args()
    base = {"metric": "commit_to_first_audio_delta_ms", "sessions": 1}
    if args.traces == "compare":
        with dropping_receiver() as receiver:
            with server_process(CONFIG) as off_url, server_process(traced(receiver.url)) as on_url:
                off, on = Side(off_url), Side(on_url)
                asyncio.run(compare(off, on, args.turns, args.rounds))
        a, b = dist(off.samples), dist(on.samples)
        cpu = [round(side.cpu_s / side.turns * 1e6) for side in (off, on)]  # (clock ticks: 10 ms each, summed over ~500 turns a side)
        result = {
            **base,
            "traces_off": a,
            "traces_on": b,
            "p50_ratio": round(b["p50"] / a["p50"], 3),
            "p99_ratio": round(b["p99"] / a["p99"], 3),
            "server_cpu_us_per_turn": {"traces_off": cpu[0], "traces_on": cpu[1]},
        }
    else:
        with dropping_receiver() as receiver:
            with server_process(traced(receiver.url) if args.traces == "on" else CONFIG) as url:
                samples = asyncio.run(run(url, args.turns))
        result = {**base, "traces": args.traces, **dist(samples)}
    result.update(exports=receiver.exports, exported_bytes=receiver.bytes, machine=machine())  # (the server's last spans go when it stops)
    print(json.dumps(result, indent=2))
    print("saved", save("ws_overhead", result))


if __name__ == "__main__":
    main()
