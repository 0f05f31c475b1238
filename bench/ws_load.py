"""Concurrent real-time sessions over WebSocket: how many can the server carry on time?

Each session is a user talking in real time: it appends 20 ms of 24 kHz audio every 20 ms (a
spoken sentence, then silence), server VAD ends each turn, and the synthetic pipeline answers with
audio paced in real time (a 20 ms chunk every 20 ms), as a voice model would stream it.

Measured per outgoing audio packet, at the client: *lateness* = arrival - (arrival of the
response's first packet + k x 20 ms), i.e. how far behind a real-time playback clock started at
the first packet each packet arrives (what a client without a jitter buffer would hear as gaps).
Also: turn latency (end of the user's speech in the sent audio -> first audio packet, which
includes the 500 ms VAD silence window), and the load generator's own send lag (if the client
cannot keep its 20 ms clock, the run says so instead of blaming the server).

    python -m bench.ws_load --sessions 25 50 100 150 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np
import websockets

from bench.audio import espeak, silence, speech_bounds_ms
from bench.client import append_message, open_session
from bench.common import machine, save, server_process
from bench.metrics import dist

FRAME_MS = 20
FRAME = 24000 * FRAME_MS // 1000


def config(sessions: int) -> dict:
    return {
        "pipeline": {
            "kind": "synthetic",
            "options": {"reply": "Sure, I can help with that.", "chunk_ms": FRAME_MS, "chunk_interval_ms": FRAME_MS, "word_ms": 240},
        },
        "limits": {"max_sessions": sessions + 10},
        "session": {"audio": {"input": {"transcription": None}}},
    }


def script() -> tuple[list[str], float]:
    """One cycle of the user's audio as ready-to-send append messages, and where speech ends (s)."""
    speech = espeak("Could you tell me what the weather will be like tomorrow?")
    _, end_ms = speech_bounds_ms(speech)
    cycle = np.concatenate([silence(300), speech, silence(3500)])
    frames = [cycle[i : i + FRAME] for i in range(0, len(cycle) - FRAME + 1, FRAME)]
    msgs = [append_message(f.tobytes()) for f in frames]
    return msgs, 0.3 + end_ms / 1000


class Stats:
    def __init__(self) -> None:
        self.lateness: list[float] = []
        self.turn_latency: list[float] = []
        self.send_lag: list[float] = []
        self.responses = 0
        self.errors = 0
        self.disconnects = 0


async def session(url: str, msgs: list[str], speech_end_s: float, until: float, stats: Stats, offset: float) -> None:
    try:
        async with await open_session(url, "load", compression=None) as ws:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(offset)  # spread sessions over the cycle
            t0 = loop.time()
            turn_end: list[float] = []

            async def send() -> None:
                k = 0
                while True:
                    due = t0 + k * FRAME_MS / 1000
                    if due > until:
                        return
                    delay = due - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    stats.send_lag.append(max(0.0, loop.time() - due) * 1000)
                    i = k % len(msgs)
                    if i == int(speech_end_s * 1000 / FRAME_MS):
                        turn_end.append(due)
                    await ws.send(msgs[i])
                    k += 1

            async def receive() -> None:
                first = 0.0
                k = 0
                async for msg in ws:
                    now = loop.time()
                    if msg.startswith('{"type":"response.output_audio.delta"'):
                        if k == 0:
                            first = now
                            if turn_end:
                                stats.turn_latency.append((now - turn_end[-1]) * 1000)
                        else:
                            stats.lateness.append((now - first - k * FRAME_MS / 1000) * 1000)
                        k += 1
                    elif msg.startswith('{"type":"response.done"'):
                        stats.responses += 1
                        k = 0
                    elif msg.startswith('{"type":"error"'):
                        stats.errors += 1

            receiver = asyncio.create_task(receive())
            await send()
            receiver.cancel()
    except (OSError, websockets.WebSocketException):
        stats.disconnects += 1


async def run_level(url: str, sessions: int, seconds: float) -> dict:
    msgs, speech_end_s = script()
    cycle_s = len(msgs) * FRAME_MS / 1000
    stats = Stats()
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds + cycle_s
    await asyncio.gather(*(session(url, msgs, speech_end_s, until, stats, cycle_s * i / sessions) for i in range(sessions)))
    return {
        "sessions": sessions,
        "seconds": seconds,
        "responses": stats.responses,
        "errors": stats.errors,
        "disconnects": stats.disconnects,
        "lateness_ms": dist(stats.lateness),
        "turn_latency_ms": dist(stats.turn_latency),
        "client_send_lag_ms": dist(stats.send_lag),
    }


def load_arguments(parser: argparse.ArgumentParser, sessions: list[int], seconds: float) -> None:
    """The flags of a run of levels (bench.cluster_load takes them too)."""
    parser.add_argument("--sessions", type=int, nargs="+", default=sessions)
    parser.add_argument("--seconds", type=float, default=seconds, help="measured time per level (after one warm-up cycle)")
    parser.add_argument("--budget-ms", type=float, default=20.0, help="p99 lateness the server must stay within")


def report(level: dict, prefix: str = "") -> None:
    late, turn, lag = level["lateness_ms"], level["turn_latency_ms"], level["client_send_lag_ms"]
    print(
        f"{prefix}{level['sessions']:4d} sessions: lateness p50 {late.get('p50')} p99 {late.get('p99')} ms | turn latency p50 "
        f"{turn.get('p50')} p99 {turn.get('p99')} ms | client send lag p99 {lag.get('p99')} ms | responses {level['responses']} "
        f"errors {level['errors']} disconnects {level['disconnects']}",
        flush=True,
    )


def most_held(levels: list[dict], budget_ms: float) -> int:
    """The most sessions of a level within the budget, with no error and no disconnect (0: none)."""
    ok = [lv["sessions"] for lv in levels if lv["lateness_ms"].get("p99", 1e9) <= budget_ms and not lv["errors"] and not lv["disconnects"]]
    return max(ok) if ok else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    load_arguments(parser, [25, 50, 100, 150], 20.0)
    args = parser.parse_args()
    levels = []
    for n in args.sessions:
        with server_process(config(n)) as url:
            level = asyncio.run(run_level(url, n, args.seconds))
        levels.append(level)
        report(level)
    result = {"budget_p99_ms": args.budget_ms, "max_sessions_within_budget": most_held(levels, args.budget_ms), "levels": levels, "machine": machine()}
    print(json.dumps({k: v for k, v in result.items() if k != "levels"}, indent=2))
    print("saved", save("ws_load", result))


if __name__ == "__main__":
    main()
