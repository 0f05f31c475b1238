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
from bench.ws_load import config, load_arguments, most_held, report, run_level


def layout(text: str) -> tuple[int, int]:
    replicas, _, workers = text.partition("x")
    return int(replicas), int(workers or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=["1", "2", "1x2"], help="R or RxW (replicas x workers each)")
    load_arguments(parser, [50, 100, 150, 200], 15.0)
    args = parser.parse_args()
    results = []
    for name in args.layouts:
        replicas, workers = layout(name)
        levels = []
        for n in args.sessions:
            with cluster(config(n), replicas, workers=workers) as c:
                level = asyncio.run(run_level(c.ws, n, args.seconds))
            levels.append(level)
            report(level, f"{name:>4}: ")
            if level["lateness_ms"].get("p99", 1e9) > args.budget_ms * 3:
                break  # far past the budget: the next level only costs time
        results.append({"layout": name, "replicas": replicas, "workers": workers, "max_sessions_within_budget": most_held(levels, args.budget_ms), "levels": levels})
    result = {"budget_p99_ms": args.budget_ms, "layouts": results, "machine": machine()}
    print(json.dumps([{k: v for k, v in r.items() if k != "levels"} for r in results], indent=2))
    print("saved", save("cluster_load", result))


if __name__ == "__main__":
    main()
