"""Sessions a deployment holds on time, through the balancer: ``bench.ws_load``'s real-time users
against nginx (deploy/nginx.conf) in front of one replica, two replicas, or one replica of
``--workers 2``, all sharing a redis-server on this machine.

For each layout and each number of sessions, a fresh deployment is started and loaded for
``--seconds`` (after a warm-up cycle); a level is held when the p99 lateness of the answers' audio
packets is within ``--budget-ms`` with no error and no disconnect.

    python -m bench cluster_load --layouts 1 2 1x2 --sessions 50 100 150 200 --seconds 15

A layout is ``R`` (R replicas of one process) or ``RxW`` (R replicas of W workers each).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from bench.cluster import cluster
from bench.common import machine, save
from bench.ws_load import config, run_level


def layout(text: str) -> tuple[int, int]:
    replicas, _, workers = text.partition("x")
    return int(replicas), int(workers or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=["1", "2", "1x2"], help="R or RxW (replicas x workers each)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[50, 100, 150, 200])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured time per level (after one warm-up cycle)")
    parser.add_argument("--budget-ms", type=float, default=20.0, help="p99 lateness a level must stay within")
    args = parser.parse_args()
    results = []
    for name in args.layouts:
        replicas, workers = layout(name)
        levels = []
        for n in args.sessions:
            with cluster(config(n), replicas, workers=workers) as c:
                level = asyncio.run(run_level(c.ws, n, args.seconds))
            levels.append(level)
            late = level["lateness_ms"]
            print(
                f"{name:>4}: {n:4d} sessions: lateness p50 {late.get('p50')} p99 {late.get('p99')} ms | client send lag p99 "
                f"{level['client_send_lag_ms'].get('p99')} ms | responses {level['responses']} errors {level['errors']} "
                f"disconnects {level['disconnects']}",
                flush=True,
            )
            if late.get("p99", 1e9) > args.budget_ms * 3:
                break  # far past the budget: the next level only costs time
        held = [lv["sessions"] for lv in levels if lv["lateness_ms"].get("p99", 1e9) <= args.budget_ms and not lv["errors"] and not lv["disconnects"]]
        results.append({"layout": name, "replicas": replicas, "workers": workers, "max_sessions_within_budget": max(held) if held else 0, "levels": levels})
    result = {"budget_p99_ms": args.budget_ms, "layouts": results, "machine": machine()}
    print(json.dumps([{k: v for k, v in r.items() if k != "levels"} for r in results], indent=2))
    print("saved", save("cluster_load", result))


if __name__ == "__main__":
    main()
