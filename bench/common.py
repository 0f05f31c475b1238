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
from collections.abc import Iterator
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
    """The ws base URL of a server started by ``server_process``; ``.process`` is its process."""

    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def server_process(config: dict[str, Any], startup_s: float = 600.0) -> Iterator[ServerURL]:
    """``realtime-omni serve`` in a child process with ``config``; yields its ws base URL."""
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({**config, "port": port}, f)
        path = f.name
    log = open(Path(tempfile.gettempdir()) / f"realtime-omni-bench-{port}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "host", "serve", "--config", path, "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited during startup; see {log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.1)
        url = ServerURL(f"ws://127.0.0.1:{port}/v1")
        url.process = proc
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        os.unlink(path)


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(), "load_avg": os.getloadavg()}


def save(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    return path
