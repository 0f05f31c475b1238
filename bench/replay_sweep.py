"""The replay harness at several loads against a server it starts itself.

    python -m bench.replay_sweep --config synthetic --levels 1 10 25 50 100 --turns 2
    python -m bench.replay_sweep --config cpu --levels 1 4 --turns 4 --barge-in-every 3

Each level replays one conversation per concurrent user (built-in dataset) into a fresh server and
writes the usual replay output under ``bench/results/sweep-<config>-<time>/c<N>/``; a table of the
main figures per level is printed at the end. The synthetic server answers in real time (40 ms of
audio every 40 ms) after 300 ms, so what changes with load is the server, not the model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench import dataset, replay, report
from bench.common import server_config

SYNTHETIC: dict[str, Any] = {
    "pipeline": {
        "kind": "synthetic",
        "options": {"first_chunk_ms": 300, "chunk_ms": 40, "chunk_interval_ms": 40, "reply": "Sure, here is a short answer to that."},
    },
    "limits": {"max_sessions": 500},
    "session": {"audio": {"input": {"transcription": {"model": "synthetic"}}}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="synthetic")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 10, 25, 50, 100])
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--barge-in-every", type=int, default=0)
    args = parser.parse_args()
    root = Path(__file__).parent / "results" / f"sweep-{args.config}-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = []
    for level in args.levels:
        conversations = dataset.load("builtin", level, args.barge_in_every)
        result = replay.replay_into(server_config(args.config, SYNTHETIC), conversations, turns=args.turns, concurrency=level)
        meta = {"url": args.config, "conversations": level, "load": f"concurrency {level}", "concurrency": level}
        summary, _ = replay.write(root / f"c{level}", result, meta)
        rows.append((level, summary))
        print(report.table(summary), flush=True)
    print(f"\n{args.config}: medians / p99 in ms (harness mic lag p99 shows whether the client kept its own clock)")
    print(f"{'conc':>5} {'turns':>6} {'err':>4} {'v2v p50':>8} {'v2v p99':>8} {'ttfp p50':>8} {'ttfp p99':>8} {'rtf p50':>7} {'gaps':>5} {'barge p50':>9} {'wer':>6} {'lag p99':>7}")
    for level, s in rows:
        v, t, r, b = s["voice_to_voice_ms"] or {}, s["audio_ttfp_ms"] or {}, s["audio_rtf"] or {}, s["barge_in_ms"] or {}
        lag = s["harness_mic_lag_ms"].get("p99", float("nan"))
        print(
            f"{level:>5} {s['turns']:>6} {s['errors']:>4} {v.get('p50', float('nan')):>8.1f} {v.get('p99', float('nan')):>8.1f} "
            f"{t.get('p50', float('nan')):>8.1f} {t.get('p99', float('nan')):>8.1f} {r.get('p50', float('nan')):>7.3f} "
            f"{s['gaps_over_100ms']['total']:>5} {b.get('p50', float('nan')):>9.1f} {s.get('input_wer_overall', float('nan')):>6.3f} {lag:>7.1f}"
        )
    print("results in", root)


if __name__ == "__main__":
    main()
