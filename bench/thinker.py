"""The thinker's own speed on this machine: prefill ms and decode tokens/s, with nothing else running.

The CPU agent's answer is as fast as its thinker: prefill decides the first token, decode decides
whether the text stays ahead of the voice that speaks it (a spoken word is about 1.3 tokens, and a
listener hears about 2.5 words a second). This starts the thinker of a config (the same options
the server uses, in this process), warms it, and measures with the engine alone:

* ``prefill_cold_ms``: a conversation's whole prompt (instructions + 3 exchanges + a question;
  its length depends on the thinker's template, 124 tokens with the default's, and is in the
  result as ``prompt_tokens``) under a fresh cache salt, to its first token;
* ``prefill_turn_ms``: the next turn of that conversation (its history in the prefix cache, only
  the new question and answer header to compute), to its first token; what a turn costs;
* ``prefill_new_ms``: 8, 40 and 100 new tokens after a cached prefix (the cold prompt's whole
  blocks), to the first token: what a judgement at a pause or an answer to a tool's output costs
  (their new words, and the block the cache could not keep);
* ``decode_tokens_per_s``: 64 tokens generated past the end of an answer (``ignore_eos``), from the
  first token to the last.

Medians of ``--runs`` rounds. ``--isa avx2`` as on a CPU without AVX-512 (``bench/isa.py``; the
process re-executes itself under it). Several configs compare side by side, each a name in
configs/ or a YAML file (e.g. a copy of configs/cpu.yaml whose thinker ``model`` is
``qwen2.5-coder-0.5b-instruct``, the fp32 weights):

    python -m bench.thinker --configs cpu cpu-smollm2 --isa avx2
    python -m bench.thinker --configs cpu /tmp/cpu-fp32.yaml --isa avx2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.common import machine, save
from bench.isa import environment

HISTORY = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is it famous for?", "Paris is famous for the Eiffel Tower and its museums."),
    ("How far away is the moon?", "The moon is about 384,000 kilometres from Earth."),
]
NEW = (8, 40, 100)  # prefill_new_ms's sizes
FILLER = (
    "The old lighthouse keeper climbed the winding stairs every evening to light the lamp, "
    "watching ships pass through the narrow channel while storms gathered over the grey sea. "
) * 30  # ~930 tokens: every run's slices below are whole
QUESTIONS = ["Can you recommend a good book?", "What should I cook for dinner tonight?", "Tell me a fun fact about cats."]


async def measure(config: str, runs: int) -> dict[str, Any]:
    from pipelines.cascade.engines import Sampling
    from pipelines.cascade.thinker import Thinker, ThinkerOptions, Turn
    from realtime_omni import config as config_file

    import msgspec

    raw = config_file.raw(config)
    options = msgspec.convert(raw["pipeline"]["options"].get("thinker", {}), ThinkerOptions)
    instructions = raw.get("session", {}).get("instructions", "You are a helpful assistant.")
    thinker = Thinker(options)
    t0 = time.monotonic()
    await thinker.start(lambda m: print("  " + m, flush=True))
    startup_s = time.monotonic() - t0

    async def first_token(prompt: list[int], salt: str) -> float:
        t = time.perf_counter()
        async for _ in thinker.engine.request(prompt, salt, Sampling(max_tokens=1), uuid.uuid4().hex):
            pass
        return (time.perf_counter() - t) * 1000

    async def decode(prompt: list[int], salt: str, n: int = 64) -> float:
        stamps: list[float] = []
        async for out in thinker.engine.request(prompt, salt, Sampling(max_tokens=n, ignore_eos=True), uuid.uuid4().hex):
            stamps += [time.perf_counter()] * out.count
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    cold, turn, rate, sizes = [], [], [], []
    filler = list(thinker.tokenizer.encode(FILLER, add_special_tokens=False))
    block = options.block_size or 16
    new: dict[int, list[float]] = {n: [] for n in NEW}
    for r in range(runs):
        salt = uuid.uuid4().hex  # a fresh conversation: nothing of it cached
        turns = [Turn(role, text) for q, a in HISTORY for role, text in (("user", q), ("assistant", a))]
        question = QUESTIONS[r % len(QUESTIONS)]
        prompt = thinker.render(instructions, [*turns, Turn("user", question)])
        cold.append(await first_token(prompt, salt))
        sizes.append(len(prompt))
        cached = prompt[: len(prompt) // block * block]  # the whole blocks just computed: in the cache
        for i, n in enumerate(NEW):  # each from its own place in the text: no block of one is another's
            start = 150 * i + 11 * r
            tail = filler[start : start + n]
            assert len(tail) == n, f"the filler text is too short for {n} new tokens"
            new[n].append(await first_token(cached + tail, salt))
        # the next turn: the history is cached, the new question and the answer header are not
        nxt = thinker.render(instructions, [*turns, Turn("user", question), Turn("assistant", "Sure."), Turn("user", QUESTIONS[(r + 1) % len(QUESTIONS)])])
        turn.append(await first_token(nxt, salt))
        rate.append(await decode(nxt, salt))
    await thinker.stop()
    return {
        "config": config,
        "model": options.model,
        "dtype": options.dtype,
        "startup_s": round(startup_s, 1),
        "prompt_tokens": statistics.median(sizes),
        "prefill_cold_ms": round(statistics.median(cold), 1),
        "prefill_turn_ms": round(statistics.median(turn), 1),
        "prefill_new_ms": {str(n): round(statistics.median(ms), 1) for n, ms in new.items()},
        "decode_tokens_per_s": round(statistics.median(rate), 1),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["cpu"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--isa", default="native", choices=["native", "avx2"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one config in this process
    args = parser.parse_args()
    if args.one:
        result = asyncio.run(measure(args.one, args.runs))
        print("RESULT " + json.dumps(result), flush=True)
        return
    env = {**os.environ, **environment(args.isa)}
    rows = []
    for config in args.configs:  # each in a process of its own: vLLM is set up once per process
        print(f"{config}: starting its thinker ...", flush=True)
        out = subprocess.run([sys.executable, "-m", "bench.thinker", "--one", config, "--runs", str(args.runs)], env=env, capture_output=True, text=True)
        found = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode or not found:
            sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
            raise SystemExit(f"{config}: the measurement failed")
        rows.append(json.loads(found[-1][len("RESULT ") :]))
    m = machine()
    m["ran_as"] = args.isa
    print(f"\n{m['cpu']} ({', '.join(m['flags'])}), run as {args.isa}, {m['cores']} cores")
    heads = " ".join(f"{'+' + str(n) + ' ms':>8}" for n in NEW)
    print(f"{'config':18} {'model':34} {'dtype':9} {'prompt':>6} {'cold ms':>8} {'turn ms':>8} {heads} {'tok/s':>6}")
    for r in rows:
        news = " ".join(f"{r['prefill_new_ms'][str(n)]:>8}" for n in NEW)
        print(f"{r['config']:18} {r['model']:34} {r['dtype']:9} {r['prompt_tokens']:>6} {r['prefill_cold_ms']:>8} {r['prefill_turn_ms']:>8} {news} {r['decode_tokens_per_s']:>6}")
    print("saved", save("thinker", {"machine": m, "results": rows}))


if __name__ == "__main__":
    main()
