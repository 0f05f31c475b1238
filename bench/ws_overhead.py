"""Server overhead at one session: ``input_audio_buffer.commit`` -> first ``response.output_audio.delta``.

The synthetic pipeline runs at zero model latency, so what is measured is the server itself
(decode, commit, response envelope, first chunk, encode, send) plus loopback, as a client sees it.
The client is a bare ``websockets`` connection that does as little as possible per event.

    python -m bench.ws_overhead --turns 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.audio import espeak
from bench.client import append_message, first_audio, open_session
from bench.common import machine, save, server_process
from bench.metrics import dist

CONFIG = {
    "pipeline": {"kind": "synthetic", "options": {"reply": "One two three.", "first_chunk_ms": 0, "chunk_ms": 40}},
    "session": {"audio": {"input": {"turn_detection": None}}},
    "limits": {"max_sessions": 10},
}


async def run(url: str, turns: int) -> list[float]:
    speech = espeak("What time is it?")[: 24000 // 2]  # 500 ms of speech
    appends = [append_message(speech[i : i + 480].tobytes()) for i in range(0, len(speech), 480)]
    commit = json.dumps({"type": "input_audio_buffer.commit"})
    create = json.dumps({"type": "response.create"})
    out = []
    ws = await open_session(url, "bench")
    try:
        for turn in range(turns + 20):
            for msg in appends:
                await ws.send(msg)
            t0 = time.perf_counter()
            await ws.send(commit)
            await ws.send(create)
            first = await first_audio(ws)
            if turn >= 20:  # warm-up turns are not counted
                out.append((first - t0) * 1000)
            # keep the conversation short: the history is not what is measured here
            if turn % 10 == 9:
                await ws.close()
                ws = await open_session(url, "bench")
    finally:
        await ws.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1000)
    args = parser.parse_args()
    with server_process(CONFIG) as url:
        samples = asyncio.run(run(url, args.turns))
    result = {"metric": "commit_to_first_audio_delta_ms", "sessions": 1, **dist(samples), "machine": machine()}
    print(json.dumps(result, indent=2))
    print("saved", save("ws_overhead", result))


if __name__ == "__main__":
    main()
