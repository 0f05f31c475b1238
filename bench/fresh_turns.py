"""A new user's first sentence: how soon a fresh session commits it, through the server.

Each complete utterance of the end-of-turn sets (bench/turns.py: synthetic voices, people's
recordings, phone audio) goes to a new WebSocket session of a real server, as a framework that
makes its own responses uses one: ``semantic_vad`` (``--eagerness``, auto by default) with
``create_response: false``, no conversation before it. The audio is streamed in real time (20 ms
appends), 300 ms of silence before the speech and ``--tail-ms`` after it. Reported, per group: the
time from the end of the speech to ``input_audio_buffer.committed`` (p50, p90, and the share within
300 ms), and the utterances never committed within the tail.

    python -m bench fresh_turns --config cpu --limit 20 --isa avx2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from typing import Any

import numpy as np

from bench.audio import resample
from bench.common import machine, save, server_config, server_process
from bench.isa import environment
from bench.metrics import dist

RATE = 24000  # the session's input: pcm16 at 24 kHz
STEP = RATE // 50  # 20 ms


async def one(url: str, pcm: np.ndarray, speech_end: int, eagerness: str) -> float | None:
    """ms from the end of the speech to the commit (None: no commit before the audio ran out)."""
    import websockets

    committed: float | None = None
    async with websockets.connect(f"{url}/realtime?model=bench", max_size=None) as ws:
        td = {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": td}}}}))
        t0 = time.perf_counter()

        async def read() -> None:
            nonlocal committed
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "input_audio_buffer.committed" and committed is None:
                    committed = time.perf_counter()
                elif event["type"] == "error":
                    raise RuntimeError(event["error"]["message"])

        reader = asyncio.create_task(read())
        for i in range(0, len(pcm), STEP):
            delay = t0 + i / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if committed is not None or reader.done():
                break
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + STEP].tobytes()).decode()}))
        await asyncio.sleep(0.2)
        reader.cancel()
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            raise reader.exception()  # type: ignore[misc]
    return None if committed is None else round((committed - (t0 + speech_end / RATE)) * 1000, 1)


async def run(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.turns import load_set

    rows = []
    for f in load_set(args.set, piper=True, seed=args.seed, limit=args.limit):
        if f.kind != "complete":
            continue
        end = f.end if f.end is not None else len(f.pcm)
        speech = resample(f.pcm[:end], 16000, RATE)
        pcm = np.concatenate([np.zeros(RATE * 3 // 10, np.int16), speech, np.zeros(RATE * args.tail_ms // 1000, np.int16)])
        delay = await one(url, pcm, RATE * 3 // 10 + len(speech), args.eagerness)
        rows.append({"group": f.group, "text": f.text, "voice": f.voice, "delay_ms": delay})
        print(f"{f.group:9} {str(delay):>8} ms  {f.text[:60]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu")
    ap.add_argument("--set", default="all", choices=["synthetic", "human", "all"])
    ap.add_argument("--limit", type=int, default=20, help="utterances per group (half of them complete: those are sent)")
    ap.add_argument("--eagerness", default="auto", choices=["low", "medium", "high", "auto"])
    ap.add_argument("--tail-ms", type=int, default=4500, help="silence streamed after the speech (auto's longest wait is 4 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--isa", default=None, help="avx2: as on a CPU without AVX-512 (bench/isa.py)")
    args = ap.parse_args(argv)
    os.environ.update(environment(args.isa))  # before the models load (and for the server this starts)
    with server_process(server_config(args.config, {})) as url:
        rows = asyncio.run(run(url, args))
    summary: dict[str, Any] = {}
    print(f"\n{'group':10} {'n':>3} {'p50':>7} {'p90':>7} {'<=300ms':>8} {'never':>6}")
    for group in sorted({r["group"] for r in rows}) + ["all"]:
        mine = [r for r in rows if group in ("all", r["group"])]
        delays = [r["delay_ms"] for r in mine if r["delay_ms"] is not None]
        d = dist(delays, 1)
        within = sum(x <= 300 for x in delays) / max(1, len(mine))
        never = sum(r["delay_ms"] is None for r in mine)
        summary[group] = {"delay_ms": d, "within_300ms": round(within, 3), "never": never, "n": len(mine)}
        print(f"{group:10} {len(mine):>3} {d.get('p50', '-'):>7} {d.get('p90', '-'):>7} {within:>8.0%} {never:>6}")
    print("saved", save("fresh_turns", {"machine": machine(), "args": vars(args), "summary": summary, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
