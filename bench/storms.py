"""Storms: what a crowd of badly behaved clients does to the server, and whether it recovers.

* ``drops``: ``--waves`` waves of ``--per-wave`` connections, each opened, asked for an answer, and
  dropped (socket aborted, no close frame) as the first audio arrives: mid-response. Run
  ``--drop-rounds`` times: the allocator keeps what the first round needed (RSS rises once), a leak
  would grow it round after round.
* ``silent``: ``--silent`` clients that ask for long answers and never read a byte (small receive
  buffers, as a stalled phone). Each must be dropped about ``send_timeout_s`` later, while a
  well-behaved probe session is served on time.
* ``burst``: ``max_sessions`` sessions held open, then ``--burst`` more connects at once: each
  refused with ``max_sessions_reached`` and close 1013, none hanging.

After each storm: the server's sessions back to 0, RSS, fds and tasks against the baseline.

    python -m bench.storms --waves 10 --per-wave 100 --silent 100 --burst 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from bench.client import connect_websocket, open_session
from bench.common import machine, save, server_process
from bench.rawws import OP_TEXT, RawWebSocket
from bench.soak import Sampler

SEND_TIMEOUT_S = 3.0


def server_config(max_sessions: int) -> dict[str, Any]:
    return {
        "pipeline": {"kind": "synthetic", "options": {"reply": " ".join(["word"] * 200), "chunk_ms": 20, "chunk_interval_ms": 5}},
        "limits": {"max_sessions": max_sessions, "send_timeout_s": SEND_TIMEOUT_S},
        # a dropped connection's session ends at once, as the storms measure (kept for a resume,
        # waves of drops would fill max_sessions: bench resume measures that)
        "resume": {"grace_s": 0},
    }


async def drops(url: str, waves: int, per_wave: int) -> dict[str, Any]:
    mid_response = failed = 0

    async def one() -> None:
        nonlocal mid_response, failed
        try:
            ws = await open_session(url, "storm", open_timeout=60)
            await ws.send('{"type":"response.create"}')
            async with asyncio.timeout(30):
                async for message in ws:
                    if message.startswith('{"type":"response.output_audio.delta"'):
                        mid_response += 1
                        break
            ws.transport.abort()
        except Exception:  # noqa: BLE001 - counted: a connect the storm could not make
            failed += 1

    t0 = time.monotonic()
    for _ in range(waves):
        await asyncio.gather(*(one() for _ in range(per_wave)))
    return {"connections": waves * per_wave, "dropped_mid_response": mid_response, "failed_to_connect": failed, "seconds": round(time.monotonic() - t0, 1)}


async def silent(url: str, port: int, count: int) -> dict[str, Any]:
    sockets = []
    for _ in range(count):
        ws = await RawWebSocket.connect("127.0.0.1", port, "/v1/realtime?model=storm", rcvbuf=8192)
        await ws.send_frame(OP_TEXT, b'{"type":"response.create"}')
        sockets.append(ws)
    t0 = time.monotonic()
    probe_ms = []
    probe = await open_session(url, "probe")
    http = url.replace("ws://", "http://").removesuffix("/v1")
    dropped_after = None
    while time.monotonic() - t0 < SEND_TIMEOUT_S * 6:
        t = time.monotonic()
        await probe.send('{"type":"session.update","session":{"type":"realtime","instructions":"probe"}}')
        async for message in probe:
            if message.startswith('{"type":"session.updated"'):
                break
        probe_ms.append((time.monotonic() - t) * 1000)
        health = json.loads(await asyncio.to_thread(lambda: __import__("urllib.request").request.urlopen(f"{http}/healthz").read()))
        if health["sessions"] <= 1:
            dropped_after = round(time.monotonic() - t0, 1)
            break
        await asyncio.sleep(0.25)
    await probe.close()
    for ws in sockets:
        ws.abort()
    probe_ms.sort()
    return {
        "silent_clients": count,
        "all_dropped_after_s": dropped_after,
        "send_timeout_s": SEND_TIMEOUT_S,
        "probe_session_update_ms": {"p50": round(probe_ms[len(probe_ms) // 2], 1), "max": round(probe_ms[-1], 1)} if probe_ms else None,
    }


async def burst(url: str, max_sessions: int, extra: int) -> dict[str, Any]:
    held = [await open_session(url, "hold") for _ in range(max_sessions)]
    outcomes: dict[str, int] = {}

    async def one() -> None:
        key = "other"
        try:
            ws = await connect_websocket(url, "burst", open_timeout=60)
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            key = first.get("error", {}).get("code") or first["type"]
            try:
                await asyncio.wait_for(ws.recv(), 30)
            except Exception as exc:  # noqa: BLE001
                code = getattr(getattr(exc, "rcvd", None), "code", None)
                key += f" + close {code}"
            await ws.close()
        except Exception as exc:  # noqa: BLE001
            key = f"failed: {type(exc).__name__}"
        outcomes[key] = outcomes.get(key, 0) + 1

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(extra)))
    took = time.monotonic() - t0
    for ws in held:
        await ws.close()
    return {"held": max_sessions, "burst": extra, "outcomes": outcomes, "seconds": round(took, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--per-wave", type=int, default=100)
    parser.add_argument("--silent", type=int, default=100)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--max-sessions", type=int, default=120)
    parser.add_argument("--drop-rounds", type=int, default=3, help="the drops storm this many times: RSS levelling off is reuse, growing is a leak")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"command": "python -m bench.storms " + " ".join(argv if argv is not None else __import__("sys").argv[1:])}
    with server_process(server_config(args.max_sessions), startup_s=120) as url:
        http = url.replace("ws://", "http://").removesuffix("/v1")
        port = int(http.rsplit(":", 1)[1])
        sampler = Sampler(url.process.pid, http)
        time.sleep(2.5)
        base = sampler.sample("before")

        async def run() -> None:
            for name, storm in (
                *((f"drops{i + 1}", lambda: drops(url, args.waves, args.per_wave)) for i in range(args.drop_rounds)),
                ("silent", lambda: silent(url, port, args.silent)),
                ("burst", lambda: burst(url, args.max_sessions, args.burst)),
            ):
                print(f"{name} ...", flush=True)
                out = await storm()
                after = await asyncio.to_thread(sampler.settle)
                out["after"] = {k: after[k] for k in ("rss_mb", "fds", "tasks", "threads", "sessions")}
                result[name] = out
                print(json.dumps(out), flush=True)

        asyncio.run(run())
        result["before"] = {k: base[k] for k in ("rss_mb", "fds", "tasks", "threads", "sessions")}
        result["server_log_tracebacks"] = url.log.read_text().count("Traceback")
    result["samples"] = sampler.samples
    result["machine"] = machine()
    path = save("storms", result)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
