"""Every bench starts as its users start it, ``python -m bench NAME``.

- ``--help`` answers, exit 0, for every bench ``python -m bench`` lists;
- what a bench spawns exists: each ``[..., "-m", MODULE, ...]`` command in a bench's source names a
  module that is there, a ``bench`` or ``host`` subcommand that answers ``--help``, and flags that
  the module's parser has (``bench webrtc_vs_ws`` once spawned ``python -m host bench replay``, gone
  since the benches left the CLI, and failed at once);
- the benches that run at their smallest size in seconds on the synthetic pipeline (or the fake
  vLLM-Omni) do so, and write their result.

The others need an engine or minutes at any size (answers, noise, thinker, tools, turns,
voice_to_voice, vs_pipecat, human_turns), or are tested end to end elsewhere through the same
``main``: the replay harness and ``compare`` (test_replay.py), the soak (test_soak.py), the fuzzers'
runs (tests/protocol), the browser (tests/transports/test_browser.py). replay_sweep and sip_latency
take 20 s or more at their smallest, webrtc_vs_ws 35 s, and its Chromium step gives the browser a
fixed 29 s for one turn, which a loaded machine overran once here (load average 9 on two cores):
their spawned commands and ``--help`` are checked here, not a run.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.bench.test_cgroup import needs_cgroup
from bench.__main__ import benches

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PROJECT = ("bench", "host")  # modules of this checkout: their subcommands and flags are checked too


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@functools.cache
def help_text(*module_and_sub: str) -> subprocess.CompletedProcess[str]:
    return run("-m", *module_and_sub, "--help")


@pytest.mark.parametrize("name", sorted(benches()))
def test_every_bench_answers_help(name):
    answered = help_text("bench", name)
    assert answered.returncode == 0, answered.stderr[-2000:]
    assert answered.stdout.startswith("usage:") and "--help" in answered.stdout


@dataclass
class Spawn:
    """One ``-m`` command a bench's source builds: the module, its subcommand (for ``bench`` and
    ``host``), and the flags written beside it."""

    where: str
    module: str
    sub: str | None
    flags: list[str]


def spawns(source: str, where: str) -> list[Spawn]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.List):
            continue
        words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]
        for i, word in enumerate(words[:-1]):
            module = words[i + 1]
            if word != "-m" or module is None:
                continue
            rest = words[i + 2 :]
            sub = rest[0] if module in PROJECT and rest and rest[0] and not rest[0].startswith("-") else None
            flags = [w for w in rest if w and w.startswith("--")]
            found.append(Spawn(f"{where}:{node.lineno}", module, sub, flags))
    return found


def declared_flags(path: Path) -> set[str]:
    """Every ``--flag`` given to an ``add_argument`` in a module's source (hidden ones too)."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return flags


def module_exists(module: str) -> bool:
    """Whether ``python -m module`` finds it, without importing it (vllm's entry points import torch)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not rest:
        return True
    for folder in spec.submodule_search_locations or []:
        base = Path(folder, *rest.split("."))
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or (base / "__main__.py").is_file():
            return True
    return False


def problems(spawn: Spawn) -> list[str]:
    """What would fail at once in the command ``spawn`` describes."""
    if not module_exists(spawn.module):
        return [f"{spawn.where}: no module {spawn.module!r}"]
    if spawn.module.partition(".")[0] not in PROJECT:
        return []  # a module of another package: there, not its flags
    if spawn.module in PROJECT and spawn.sub is None:
        return [f"{spawn.where}: python -m {spawn.module} without a subcommand"]
    target = (spawn.module, spawn.sub) if spawn.sub else (spawn.module,)
    # python -m bench.NAME runs what python -m bench NAME runs (bench/__main__.py): one --help for both
    answered = help_text(*(("bench", spawn.module.removeprefix("bench.")) if spawn.module.startswith("bench.") else target))
    if answered.returncode != 0:
        return [f"{spawn.where}: python -m {' '.join(target)} --help exits {answered.returncode}: {answered.stderr.strip()[-300:]}"]
    if spawn.module == "bench":
        source = BENCH / f"{spawn.sub}.py"
    elif spawn.module.startswith("bench."):
        source = BENCH / f"{spawn.module.removeprefix('bench.')}.py"
    else:
        source = ROOT / "host" / "cli.py"
    known = declared_flags(source) | set(re.findall(r"--[a-z][a-z0-9-]*", answered.stdout))
    return [f"{spawn.where}: python -m {' '.join(target)} has no flag {flag}" for flag in spawn.flags if flag not in known]


def every_spawn() -> list[Spawn]:
    return [s for path in sorted(BENCH.glob("*.py")) for s in spawns(path.read_text(), path.name)]


def test_the_commands_the_benches_spawn_exist():
    found = every_spawn()
    # the scan sees what it must: the commands of webrtc_vs_ws, the servers, the fake engine
    seen = {(s.module, s.sub) for s in found}
    assert {("bench", "replay"), ("bench.browser", None), ("host", "serve"), ("bench.fake_omni", None)} <= seen, seen
    assert [p for s in found for p in problems(s)] == []


def test_the_spawn_check_fails_on_a_command_that_is_gone():
    """The bug it is for, and its kin: a CLI subcommand, a flag, a module that no longer exist."""
    gone = """
cmd = [sys.executable, "-m", "host", "bench", "replay", "--url", url]
cmd = [sys.executable, "-m", "bench", "replay", "--urls", url]
cmd = [sys.executable, "-m", "bench", "replays", "--url", url]
cmd = [sys.executable, "-m", "bench.nowhere", "--port", "1"]
"""
    found = [problems(s) for s in spawns(gone, "gone.py")]
    assert [len(p) for p in found] == [1, 1, 1, 1], found
    assert "host bench --help exits 2" in found[0][0]
    assert "has no flag --urls" in found[1][0]
    assert "no module 'bench.nowhere'" in found[3][0]


def quota_read_back(result: dict[str, Any]) -> bool:
    """Both workers and the supervisor were capped at the quota, and what they used was read back."""
    (level,) = result["layouts"][0]["levels"]
    cpu = level["cpu"]
    capped = {name for name in cpu if name.startswith("replica-0")}
    return (
        result["quota"]["cores_per_process"] == 0.5
        and capped == {"replica-0", "replica-0-worker-0", "replica-0-worker-1"}
        and all(cpu[name]["periods"] > 0 for name in capped - {"replica-0"})  # the workers ran in their groups
        and {"generator", "nginx", "redis"} <= set(cpu)
        and level["redis_calls_per_session"] > 0
        and not Path(result["quota"]["cgroups"]).exists()  # removed at the end
    )


@dataclass
class Small:
    args: list[str]
    check: Callable[[Any], bool]
    marks: tuple[pytest.MarkDecorator, ...] = ()


# the smallest run of each, its figures on the shared 2-core Xeon (wall, with the server's start)
SMALL = {
    "ws_overhead": Small(["--turns", "5"], lambda r: r["n"] == 5),  # 2 s
    "fuzz": Small(["--events", "50", "--connections", "1", "--batch", "25"], lambda r: r["frames"] == 50 and r["failures"] == 0),  # 2 s
    "input_model": Small(["--sequences", "3", "--connections", "1"], lambda r: r["sequences"] == 3 and r["mismatches"] == []),  # 3 s
    "resume": Small(["--drops", "8"], lambda r: r["all"]["mismatches"] == [] and sum(r["all"]["drops"].values()) == 8 and r["server"]["sessions_active_after"] == 0),  # 3 s
    "omni_overhead": Small(
        ["--sessions", "1", "--turns", "2", "--chunk-ms", "10", "--think-s", "0"], lambda r: len(r["levels"]) == 1, (pytest.mark.slow,)
    ),  # 4 s: the fake vLLM-Omni and the server, each in its process
    "fuzz_wire": Small(["--http", "20", "--sip", "40"], lambda r: r["healthz"] == 200, (pytest.mark.slow,)),  # 6 s
    "sip_load": Small(["--levels", "1", "--seconds", "4"], lambda r: len(r["levels"]) == 1, (pytest.mark.slow,)),  # 6 s
    "ws_load": Small(["--sessions", "1", "--seconds", "1"], lambda r: len(r["levels"]) == 1, (pytest.mark.slow,)),  # 9 s
    "storms": Small(
        ["--waves", "1", "--per-wave", "2", "--silent", "0", "--burst", "1", "--max-sessions", "2", "--drop-rounds", "1"],
        lambda r: r["server_log_tracebacks"] == 0,
        (pytest.mark.slow,),
    ),  # 13 s
    "cluster_load": Small(
        ["--layouts", "1", "--sessions", "1", "--seconds", "1"], lambda r: len(r["layouts"]) == 1, (pytest.mark.slow, pytest.mark.system)
    ),  # 12 s: nginx, redis-server
    # each worker in a cgroup of its own, capped (root and cgroup v1's cpu controller, else skipped)
    "cluster_load --quota": Small(
        ["--layouts", "1x2", "--sessions", "1", "--seconds", "1", "--quota", "0.5", "--retries", "0"], quota_read_back, (pytest.mark.slow, pytest.mark.system, needs_cgroup)
    ),  # 12 s
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=small.marks) for name, small in SMALL.items()])
def test_the_bench_runs_at_its_smallest_size(name):
    small = SMALL[name]
    ran = run("-m", "bench", name.split()[0], *small.args, timeout=240)
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-2000:])
    written = re.findall(r"^(?:saved|wrote) (\S+\.json)", ran.stdout, re.MULTILINE)
    assert written, ran.stdout[-2000:]
    assert small.check(json.loads(Path(written[-1]).read_text()))
