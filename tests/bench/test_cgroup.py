"""bench.cgroup, the quotas of ``bench cluster_load --quota``: on this machine's own cgroup v1 ``cpu``
hierarchy (as root), a group caps what it holds, reads back what its processes used, and is gone
after the run however the run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import cgroup

ROOT = Path(__file__).resolve().parents[2]


def writable() -> str | None:
    try:
        cgroup.check()
    except cgroup.Unavailable as e:
        return str(e)
    return None


needs_cgroup = pytest.mark.skipif(writable() is not None, reason=f"cannot run here: {writable()}")

def mine(pid: int | None = None) -> str:
    """The folder of the run of ``pid`` (this process by default)."""
    return f"{cgroup.PREFIX}{pid or os.getpid()}"


BUSY = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end: pass\n"


def test_a_tree_without_the_cpu_controller_is_refused_saying_why(tmp_path):
    with pytest.raises(cgroup.Unavailable, match=f"no cgroup v1 cpu controller at {tmp_path}"):
        cgroup.check(tmp_path)


@needs_cgroup
def test_a_quota_caps_a_busy_process_and_is_read_back():
    with cgroup.Groups(period_us=20_000) as groups:
        capped = groups.make("capped", 0.25)
        assert (capped.cpu / "cpu.cfs_quota_us").read_text().strip() == "5000"
        before = capped.sample()
        proc = subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=capped.enter())
        assert capped.pids() == [proc.pid]
        proc.wait(timeout=30)
        used = cgroup.used(before, capped.sample())
    # 3 s of a busy loop (and Python's start) under a quarter of a core: at most about 0.8 s of CPU
    # (a busy box may give it less), throttled in most periods
    assert 0.3 < used["cpu_s"] <= 0.9, used
    assert used["throttled_fraction"] > 0.5 and used["throttled_ms"] > 1000, used
    assert mine() not in cgroup.leftovers()


@needs_cgroup
def test_the_groups_are_removed_on_an_error_and_their_processes_go_back_to_the_root():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match="the bench failed"), cgroup.Groups() as groups:
            groups.make("replica-0", 0.5).add(sleeper.pid)
            assert (groups.cpu_root / groups.folder / "replica-0").is_dir()
            raise RuntimeError("the bench failed")
        assert mine() not in cgroup.leftovers()
        assert str(sleeper.pid) in (cgroup.CPU / "cgroup.procs").read_text().split()
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_cgroup
def test_sigterm_and_ctrl_c_remove_the_groups_and_a_killed_runs_folder_goes_at_the_next_run():
    run = (
        "import sys, time\nfrom bench import cgroup\n"
        "with cgroup.Groups() as g:\n    g.make('replica-0', 0.5)\n    print('ready', flush=True)\n    time.sleep(30)\n"
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        proc = subprocess.Popen([sys.executable, "-c", run], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert mine(proc.pid) in cgroup.leftovers()
        proc.send_signal(sig)
        proc.wait(timeout=10)
        if sig != signal.SIGKILL:
            # SIGTERM: SystemExit(143); SIGINT: KeyboardInterrupt, which Python ends by its signal
            assert proc.returncode == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGINT), proc.returncode
            assert mine(proc.pid) not in cgroup.leftovers()
    assert mine(proc.pid) in cgroup.leftovers()  # SIGKILL: nothing ran
    with cgroup.Groups():
        assert mine(proc.pid) not in cgroup.leftovers()
        assert mine() in cgroup.leftovers()
    assert mine() not in cgroup.leftovers()
