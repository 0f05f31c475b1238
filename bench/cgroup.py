"""CPU quotas for the processes a bench starts, with cgroup v1's ``cpu`` controller (and
``cpuacct``, where mounted, for their CPU time): a group per role under one folder of this run,
``/sys/fs/cgroup/cpu/realtime-omni-bench-<pid>/``, removed at the end.

A quota caps a group (``cpu.cfs_quota_us`` per ``cpu.cfs_period_us``); it guarantees nothing on
a shared box, so every group is also read back: its CPU time, and how many periods it was throttled
in (``cpu.stat``). ``cpu.shares`` weighs a group against the box's other processes when the cores
are all busy (1024: as one ordinary process). Needs root and a writable v1 ``cpu`` hierarchy
(cgroup v2's unified tree is another interface: not handled here).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

CPU = Path("/sys/fs/cgroup/cpu")
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PREFIX = "realtime-omni-bench-"


class Unavailable(RuntimeError):
    """No writable cgroup v1 ``cpu`` hierarchy here."""


def check(root: Path = CPU) -> None:
    """Raise ``Unavailable`` saying why when groups cannot be made under ``root``."""
    if not (root / "cpu.cfs_quota_us").is_file():
        raise Unavailable(f"no cgroup v1 cpu controller at {root} (cpu.cfs_quota_us missing; cgroup v2 alone is not supported): --quota cannot run here")
    if not os.access(root, os.W_OK):
        raise Unavailable(f"{root} is not writable (needs root, and a cgroup mount that is not read-only): --quota cannot run here")


@dataclass(frozen=True)
class Sample:
    """One reading of a group: when, its CPU time (ns; cpuacct.usage, else the sum over its
    processes from /proc), cpu.stat's counters, and the time its threads have waited runnable on
    a run queue (``/proc/<pid>/task/<tid>/schedstat``: for the CPU held by others, or throttled)."""

    at: float
    usage_ns: int
    nr_periods: int
    nr_throttled: int
    throttled_ns: int
    waited_ns: int


def _stat(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.strip())}


def _proc_cpu_ns(pid: int) -> int:
    """utime + stime of one process (all its threads), ns; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _waited_ns(pid: int) -> int:
    """The time the threads of ``pid`` have spent runnable but not running, ns (0 if it is gone)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int((task / "schedstat").read_text().split()[1])
    return total


@dataclass
class Group:
    name: str
    cpu: Path
    acct: Path | None
    quota_cores: float | None
    period_us: int

    def add(self, pid: int) -> None:
        """Move ``pid`` (the whole process) here; its children forked after it inherit the group."""
        (self.cpu / "cgroup.procs").write_text(str(pid))
        if self.acct is not None:
            (self.acct / "cgroup.procs").write_text(str(pid))

    def enter(self) -> Callable[[], None]:
        """A ``preexec_fn``: the child moves itself here before it runs the program."""
        return lambda: self.add(os.getpid())

    def pids(self) -> list[int]:
        return [int(p) for p in (self.cpu / "cgroup.procs").read_text().split()]

    def sample(self) -> Sample:
        stat = _stat(self.cpu / "cpu.stat")
        usage = int((self.acct / "cpuacct.usage").read_text()) if self.acct is not None else sum(_proc_cpu_ns(p) for p in self.pids())
        waited = sum(_waited_ns(p) for p in self.pids())
        return Sample(time.monotonic(), usage, stat.get("nr_periods", 0), stat.get("nr_throttled", 0), stat.get("throttled_time", 0), waited)


def used(before: Sample, after: Sample) -> dict[str, Any]:
    """What a group did between two samples: cores used on average, throttling, and the time its
    threads waited runnable (summed over threads, so it may pass the wall time)."""
    wall = max(after.at - before.at, 1e-9)
    periods = after.nr_periods - before.nr_periods
    throttled = after.nr_throttled - before.nr_throttled
    return {
        "cores": round((after.usage_ns - before.usage_ns) / 1e9 / wall, 3),
        "cpu_s": round((after.usage_ns - before.usage_ns) / 1e9, 3),
        "periods": periods,
        "throttled_periods": throttled,
        "throttled_fraction": round(throttled / periods, 3) if periods else 0.0,
        "throttled_ms": round((after.throttled_ns - before.throttled_ns) / 1e6, 1),
        "waited_ms": round(max(0, after.waited_ns - before.waited_ns) / 1e6, 1),
    }


def box_sample() -> tuple[float, int, int, int]:
    """(when, busy, idle, steal) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    return time.monotonic(), user + nice + system + irq + softirq, idle + iowait, steal


def box_used(before: tuple[float, int, int, int], after: tuple[float, int, int, int]) -> dict[str, float]:
    """The machine's cores busy, idle and stolen (by the hypervisor) on average between two samples."""
    wall = max(after[0] - before[0], 1e-9)
    tick = os.sysconf("SC_CLK_TCK")
    return {k: round((after[i] - before[i]) / tick / wall, 3) for i, k in ((1, "busy_cores"), (2, "idle_cores"), (3, "steal_cores"))}


def _remove_stale(root: Path) -> None:
    """Folders left by runs that were killed outright (their pid gone): emptied and removed."""
    for folder in root.glob(f"{PREFIX}*"):
        pid = folder.name.removeprefix(PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove(folder, root)


def _remove(folder: Path, root: Path) -> None:
    """Move what is still in ``folder``'s groups back to ``root``, then remove them (children first)."""
    for child in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [folder]:
        with contextlib.suppress(OSError):
            for pid in (child / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (root / "cgroup.procs").write_text(pid)
        for _ in range(50):  # a process just exited may linger a moment as a zombie in the group
            try:
                child.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


class Groups:
    """The groups of one run; a context manager that removes them all at its end (an exception,
    Ctrl-C and SIGTERM included; a SIGKILLed run's folder is removed by the next run)."""

    def __init__(self, *, shares: int = 1024, period_us: int = 100_000, cpu_root: Path = CPU, acct_root: Path = CPUACCT) -> None:
        check(cpu_root)
        self.shares, self.period_us = shares, period_us
        self.cpu_root = cpu_root
        self.acct_root = acct_root if (acct_root / "cpuacct.usage").is_file() and os.access(acct_root, os.W_OK) else None
        self.folder = f"{PREFIX}{os.getpid()}"
        self.groups: dict[str, Group] = {}

    def __enter__(self) -> Groups:
        for root in filter(None, (self.cpu_root, self.acct_root)):
            _remove_stale(root)
            (root / self.folder).mkdir()
        # both unwind through __exit__, which removes the groups; SIGINT raises at once even inside an
        # event loop (asyncio.run's own handler only cancels its task, which a level may outlive)
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + sig)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if os.getpid() in [g for group in self.groups.values() for g in group.pids()]:
                (self.cpu_root / "cgroup.procs").write_text(str(os.getpid()))
        for root in filter(None, (self.cpu_root, self.acct_root)):
            if (root / self.folder).exists():
                _remove(root / self.folder, root)
        self.groups.clear()

    def make(self, name: str, quota_cores: float | None = None) -> Group:
        """A group (``quota_cores`` of a core per period, or no cap), weighted ``shares``."""
        cpu = self.cpu_root / self.folder / name
        cpu.mkdir()
        (cpu / "cpu.shares").write_text(str(self.shares))
        (cpu / "cpu.cfs_period_us").write_text(str(self.period_us))
        (cpu / "cpu.cfs_quota_us").write_text(str(round(quota_cores * self.period_us)) if quota_cores else "-1")
        acct = None
        if self.acct_root is not None:
            acct = self.acct_root / self.folder / name
            acct.mkdir()
        group = self.groups[name] = Group(name, cpu, acct, quota_cores, self.period_us)
        # the run's folder is one entity beside the box's other processes: it weighs what its groups
        # would weigh each on its own (else all of them together would weigh as one process)
        (self.cpu_root / self.folder / "cpu.shares").write_text(str(min(self.shares * len(self.groups), 262144)))
        return group

    def samples(self) -> dict[str, Sample]:
        return {name: g.sample() for name, g in self.groups.items()}


def leftovers(root: Path = CPU) -> list[str]:
    """Folders of runs under ``root`` (what a test checks is gone after a run)."""
    return sorted(p.name for p in root.glob(f"{PREFIX}*"))
