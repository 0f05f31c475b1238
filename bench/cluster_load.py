"""Sessions a deployment holds on time, through the balancer: ``bench.ws_load``'s real-time users
against nginx (deploy/nginx.conf) in front of one replica, two replicas, or one replica of
``--workers 2``, all sharing a redis-server on this machine.

For each layout and each number of sessions, a fresh deployment is started and loaded for
``--seconds`` (after a warm-up cycle); a level is held when the p99 lateness of the answers' audio
packets is within ``--budget-ms`` with no error and no disconnect.

    python -m bench cluster_load --layouts 1 2 1x2 --sessions 50 100 150 200 --seconds 15

A layout is ``R`` (R replicas of one process) or ``RxW`` (R replicas of W workers each).

``--quota CORES`` measures it the way capacity is planned: every replica process (for ``RxW``, every
worker, and the supervisor beside them) runs in a cgroup of its own capped at CORES of a core
(cgroup v1 ``cpu.cfs_quota_us`` per ``--period-ms``; needs root), while the load generator (this
process), nginx and Redis run uncapped in groups of their own, so their CPU time is read too. A
quota caps and guarantees nothing on a shared machine: every group weighs ``--cpu-shares`` (8192, as
eight ordinary processes) against the rest of the box, and each level reports every group's cores
used, throttled periods and time waited runnable, the machine's busy and idle cores (and what the
processes outside these groups took), and Redis's commands per session (INFO commandstats). A level
whose load generator missed its own 20 ms clock is run again (``--retries``). The groups are removed
at the end, on Ctrl-C, SIGTERM and failure as well (a SIGKILLed run's, by the next run).

    python -m bench cluster_load --quota 0.5 --layouts 1 2 1x2 --sessions 20 40 60 80 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import cgroup
from bench.cluster import Cluster, Preexec, cluster
from bench.common import machine, save
from bench.ws_load import config, load_arguments, most_held, report, run_level

GENERATOR = "generator"  # this process: the load generator


def layout(text: str) -> tuple[int, int]:
    replicas, _, workers = text.partition("x")
    return int(replicas), int(workers or 1)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def spawned_workers(pid: int, count: int, timeout_s: float = 10.0) -> list[int]:
    """The ``count`` worker processes ``realtime-omni serve --workers`` (``pid``) spawned
    (multiprocessing's spawn_main, not its resource tracker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [c for c in children(pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        if len(found) >= count or time.monotonic() > deadline:
            return sorted(found)
        time.sleep(0.1)


def redis_calls(url: str) -> dict[str, int]:
    """Redis's calls so far per command (INFO commandstats), without INFO itself."""
    with redis.Redis.from_url(url) as client:
        stats: dict[str, Any] = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"}


class Quota:
    """The cgroups of a ``--quota`` run: one per replica process (capped), and uncapped ones for
    the generator, nginx and Redis."""

    def __init__(self, groups: cgroup.Groups, cores: float) -> None:
        self.groups, self.cores = groups, cores
        groups.make(GENERATOR).add(os.getpid())

    def group(self, name: str, capped: bool) -> cgroup.Group:
        return self.groups.groups.get(name) or self.groups.make(name, self.cores if capped else None)

    def place(self, role: str) -> Preexec:
        return self.group(role, capped=role.startswith("replica")).enter()

    def place_workers(self, c: Cluster, workers: int) -> None:
        """Each worker of an RxW replica into a capped group of its own (the supervisor stays in
        the replica's)."""
        if workers == 1:
            return
        for i, r in enumerate(c.replicas):
            found = spawned_workers(r.process.pid, workers)
            if len(found) != workers:
                raise RuntimeError(f"replica {i}: {len(found)} worker processes found, {workers} expected")
            for k, pid in enumerate(found):
                self.group(f"replica-{i}-worker-{k}", capped=True).add(pid)

    def capped(self, names: list[str]) -> list[str]:
        return [n for n in names if self.groups.groups[n].quota_cores]


def run_measured(c: Cluster, n: int, seconds: float, quota: Quota | None) -> dict[str, Any]:
    calls_before = redis_calls(c.redis_url)
    cpu_before = quota.groups.samples() if quota else {}
    box_before = cgroup.box_sample()
    t0, self_before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    level = asyncio.run(run_level(c.ws, n, seconds))
    wall, self_after = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_SELF)
    box = cgroup.box_used(box_before, cgroup.box_sample())
    calls_after = redis_calls(c.redis_url)
    delta = {k: v - calls_before.get(k, 0) for k, v in calls_after.items() if v - calls_before.get(k, 0)}
    level["redis_calls"] = delta
    level["redis_calls_per_s"] = round(sum(delta.values()) / wall, 1)
    level["redis_calls_per_session"] = round(sum(delta.values()) / n, 2)
    level["generator_cores"] = round((self_after.ru_utime + self_after.ru_stime - self_before.ru_utime - self_before.ru_stime) / wall, 3)
    level["box"] = box
    if quota:
        live = {name for name, g in quota.groups.groups.items() if g.pids()} | {GENERATOR}  # this layout's (the groups outlive a deployment)
        if os.getpid() not in quota.groups.groups[GENERATOR].pids():
            print(f"        this process left its group {GENERATOR!r} (moved by something else?): its CPU there is not all of it", flush=True)
        active = {name: cgroup.used(cpu_before[name], s) for name, s in quota.groups.samples().items() if name in cpu_before and name in live}
        level["cpu"] = active
        level["quota_cores"] = quota.cores
        ours = sum(u["cores"] for u in active.values())
        level["box"]["others_cores"] = round(max(0.0, box["busy_cores"] - ours), 3)
    return level


def cpu_line(level: dict[str, Any], quota: Quota | None) -> str:
    parts = [f"generator {level['generator_cores']:.2f} cores", f"redis {level['redis_calls_per_session']} calls/session"]
    if quota and "cpu" in level:
        cpu = level["cpu"]
        # the server processes: a replica's own group, or for RxW its workers' (not the supervisor's)
        supervisors = {name for name in cpu if any(other.startswith(f"{name}-worker-") for other in cpu)}
        capped = [u for name, u in cpu.items() if name in quota.capped(list(cpu)) and name not in supervisors]
        parts.insert(
            0,
            "replicas "
            + " ".join(f"{u['cores']:.2f}" for u in capped)
            + f" cores (quota {quota.cores:g} each; throttled in "
            + " ".join(f"{u['throttled_fraction']:.0%}" for u in capped)
            + " of periods; waited runnable "
            + " ".join(f"{u['waited_ms']:.0f}" for u in capped)
            + " ms)",
        )
        parts[1] += f" (waited {cpu[GENERATOR]['waited_ms']:.0f} ms)"
        parts += [f"{name} {cpu[name]['cores']:.2f} cores" for name in ("nginx", "redis") if name in cpu]
    box = level["box"]
    parts.append(f"box busy {box['busy_cores']:.2f} idle {box['idle_cores']:.2f}" + (f" others {box['others_cores']:.2f}" if "others_cores" in box else "") + " cores")
    return "        " + " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", nargs="+", default=["1", "2", "1x2"], help="R or RxW (replicas x workers each)")
    load_arguments(parser, [50, 100, 150, 200], 15.0)
    parser.add_argument("--quota", type=float, help="cores per replica process (per worker for RxW), as a cgroup v1 CPU quota (needs root)")
    parser.add_argument("--period-ms", type=float, default=100.0, help="the quota's period (cpu.cfs_period_us; 100 ms is the kernel's default)")
    parser.add_argument("--retries", type=int, default=1, help="runs again of a level whose load generator missed its own clock (send lag p99 over the budget)")
    parser.add_argument(
        "--cpu-shares",
        type=int,
        default=8192,
        help="cpu.shares of every group of a --quota run: its weight against the rest of the box when every core is busy (1024: as one "
        "ordinary process, or one login session's processes together where the kernel groups them, sched_autogroup). The default, 8192, "
        "lets the capped replicas have their quota on a busy shared box; they cannot take more than it",
    )
    args = parser.parse_args()
    if args.quota is not None and not 0.01 <= args.quota <= (os.cpu_count() or 1):
        parser.error(f"--quota: between 0.01 and {os.cpu_count() or 1} cores")
    groups: cgroup.Groups | contextlib.nullcontext[None] = contextlib.nullcontext()
    if args.quota is not None:
        try:
            groups = cgroup.Groups(shares=args.cpu_shares, period_us=round(args.period_ms * 1000))
        except cgroup.Unavailable as e:
            print(f"python -m bench cluster_load --quota: {e}", file=sys.stderr)
            sys.exit(2)
    with groups as g:
        quota = Quota(g, args.quota) if g is not None else None
        results = []
        for name in args.layouts:
            replicas, workers = layout(name)
            levels = []
            for n in args.sessions:
                disturbed: list[dict[str, Any]] = []
                while True:
                    with cluster(config(n), replicas, workers=workers, place=quota.place if quota else None) as c:
                        if quota:
                            quota.place_workers(c, workers)
                        level = run_measured(c, n, args.seconds, quota)
                    report(level, f"{name:>4}: ")
                    print(cpu_line(level, quota), flush=True)
                    # the generator missed its own 20 ms clock: the box, not the server, made it late
                    level["disturbed"] = level["client_send_lag_ms"].get("p99", 0) > args.budget_ms
                    if not level["disturbed"] or len(disturbed) >= args.retries:
                        break
                    print(f"        the load generator lagged (send lag p99 over {args.budget_ms:g} ms): the level again", flush=True)
                    disturbed.append(level)
                level["disturbed_tries"] = disturbed
                levels.append(level)
                if all(lv["lateness_ms"].get("p99", 1e9) > args.budget_ms * 3 for lv in levels[-2:]) and len(levels) >= 2:
                    break  # two levels in a row far past the budget (one alone may be the shared box): the next only costs time
            results.append({"layout": name, "replicas": replicas, "workers": workers, "max_sessions_within_budget": most_held(levels, args.budget_ms), "levels": levels})
    quota_info = None
    if quota is not None:
        quota_info = {"cores_per_process": args.quota, "period_ms": args.period_ms, "cpu_shares": args.cpu_shares, "cgroups": str(quota.groups.cpu_root / quota.groups.folder)}
    result = {"budget_p99_ms": args.budget_ms, "quota": quota_info, "command": sys.argv, "layouts": results, "machine": machine()}
    print(json.dumps([{k: v for k, v in r.items() if k != "levels"} for r in results], indent=2))
    print("saved", save("cluster_load", result))


if __name__ == "__main__":
    main()
