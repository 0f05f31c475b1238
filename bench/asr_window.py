"""How much of Whisper's 30 s window the listener encodes at a pause, and what it costs in words.

At a pause the cascade transcribes the turn so far (pipelines/cascade/hearing.py); the decision
and the speculative answer wait for those words. ``WhisperListener`` (``window: fit``) encodes the
clip plus ``margin_s`` of silence instead of Whisper's whole 30 s window. This replays the
end-of-turn sets' complete utterances as the hearing gets them (the speech and then ``--pause-ms``
of silence) through the listener at each margin, interleaved item by item so that load on the
machine falls on every margin alike, and reports per margin:

* ``wer``: word error rate against the item's text (the synthetic set: the text spoken; the human
  set: what Whisper base heard when the set was labelled, bench/human_turns.py), case and
  punctuation aside;
* ``same_as_full``: the share of items whose words equal the full window's;
* ``ms``: the call's wall time, median and p90 (``--threads`` as the CPU config's ``asr_threads``).

    python -m bench asr_window --set all --limit 60 --margins full 5 2 1 0.5 --isa avx2
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any

import numpy as np

from bench.common import machine, save
from bench.isa import environment


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def percentile(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if values else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.turns import load_set
    from pipelines import models
    from pipelines.cascade.listener import WhisperListener

    items = [f for f in load_set(args.set, piper=False, seed=args.seed, limit=args.limit) if f.kind == "complete"]
    model_dir = str(models.ensure(args.model))
    listeners = {m: WhisperListener(model_dir, args.threads, window="full" if m == "full" else "fit", margin_s=0.0 if m == "full" else float(m)) for m in args.margins}
    listeners[args.margins[0]].transcribe(np.zeros(16000, np.int16))  # one-time costs
    pause = args.pause_ms * 16
    rows = []
    for f in items:
        end = f.end if f.end is not None else len(f.pcm)
        pcm = np.concatenate([f.pcm[:end], np.zeros(pause, np.int16)])
        row: dict[str, Any] = {"group": f.group, "text": f.text, "seconds": round(len(pcm) / 16000, 2)}
        for m, listener in listeners.items():
            t0 = time.perf_counter()
            heard = listener.transcribe(pcm)
            row[m] = {"ms": round((time.perf_counter() - t0) * 1000, 1), "text": heard}
        rows.append(row)
    summary: dict[str, Any] = {}
    for group in sorted({r["group"] for r in rows}) + ["all"]:
        mine = [r for r in rows if group in ("all", r["group"])]
        reference_words = sum(len(words(r["text"])) for r in mine)
        summary[group] = {
            m: {
                "wer": round(sum(edit_distance(words(r["text"]), words(r[m]["text"])) for r in mine) / max(1, reference_words), 4),
                "same_as_full": round(sum(words(r[m]["text"]) == words(r[args.margins[0]]["text"]) for r in mine) / max(1, len(mine)), 3)
                if args.margins[0] == "full"
                else None,
                "ms_p50": percentile([r[m]["ms"] for r in mine], 50),
                "ms_p90": percentile([r[m]["ms"] for r in mine], 90),
                "items": len(mine),
            }
            for m in args.margins
        }
    return {"machine": machine(), "args": vars(args), "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all", choices=["synthetic", "human", "all"])
    ap.add_argument("--limit", type=int, default=60, help="items per group (half of them complete: those are used)")
    ap.add_argument("--margins", nargs="+", default=["full", "5", "2", "1", "0.5"], help="'full' or seconds of silence after the clip")
    ap.add_argument("--model", default="whisper-tiny.en")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pause-ms", type=int, default=100, help="silence after the speech, as at the hearing's pause")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--isa", default=None, help="avx2: as on a CPU without AVX-512 (bench/isa.py)")
    args = ap.parse_args(argv)
    os.environ.update(environment(args.isa))  # before the models load (and for the server this starts)
    result = run(args)
    print(f"{'group':10} {'margin':>7} {'wer':>7} {'=full':>6} {'ms p50':>7} {'ms p90':>7}")
    for group, per in result["summary"].items():
        for m, s in per.items():
            same = "-" if s["same_as_full"] is None else f"{s['same_as_full']:.0%}"
            print(f"{group:10} {m:>7} {s['wer']:>7.1%} {same:>6} {s['ms_p50']:>7} {s['ms_p90']:>7}")
    print("saved", save("asr_window", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
