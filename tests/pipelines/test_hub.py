"""Models from their official repositories where the network allows, else from PyPI, held to the
same sha256 either way (pipelines/models/hub.py). The hub is a fake on loopback (tests/support/fake_hub.py)
that ``realtime-omni models`` reaches through ``HF_ENDPOINT``, as huggingface_hub is told to."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines import models

from pipelines.models import hub
from tests.support.fake_hub import fake_hub

SMART_TURN = hub.OFFICIAL["smart-turn-v3.2"]
WHISPER = hub.OFFICIAL["whisper-tiny.en"]


def _official_files(name: str) -> dict[tuple[str, str], Path]:
    """The official repository's files, with the PyPI package's bytes (they are the pinned ones)."""
    source = hub.OFFICIAL[name]
    package = {p.name: p for p in models.MODELS[name].sources()}
    if name == "whisper-tiny.en":
        package = {p.name: p for p in package["model.bin"].parent.iterdir()}
    return {(source.repo, file): package[Path(file).name] for file in source.files}


def _models(home: Path, endpoint: str | None, *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(REALTIME_OMNI_HOME=str(home), HF_HOME=str(home / "hf"))
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run([sys.executable, "-m", "host", "models", *args], env=env, capture_output=True, text=True, timeout=300)


def test_a_model_comes_from_its_official_repository_when_the_hub_answers(tmp_path: Path):
    with fake_hub({**_official_files("smart-turn-v3.2"), **_official_files("whisper-tiny.en")}) as (endpoint, asked):
        run = _models(tmp_path, endpoint, "prepare", "smart-turn-v3.2", "whisper-tiny.en")
        listed = _models(tmp_path, endpoint, "list").stdout
    assert run.returncode == 0, run.stderr
    assert any(SMART_TURN.repo in a for a in asked) and any(WHISPER.repo in a and WHISPER.revision in a for a in asked)
    record = json.loads((tmp_path / "models" / "smart-turn-v3.2" / "prepared.json").read_text())
    assert record["origin"] == f"hub:{SMART_TURN.describe()}"
    assert models.sha256(tmp_path / "models" / "smart-turn-v3.2" / "smart-turn-v3.2-cpu.onnx") == SMART_TURN.files["smart-turn-v3.2-cpu.onnx"]
    # an in-place model fetched from its repository is used from the cache, not from its package
    for file, digest in WHISPER.files.items():
        assert models.sha256(tmp_path / "models" / "whisper-tiny.en" / file) == digest
    line = next(line for line in listed.splitlines() if line.startswith("whisper-tiny.en"))
    assert "ready" in line and f"hub:{WHISPER.describe()}" in line


def test_different_bytes_from_the_hub_are_refused_for_the_pypi_package(tmp_path: Path):
    files = {key: b"not the model" for key in _official_files("smart-turn-v3.2")}
    with fake_hub(files) as (endpoint, asked):
        run = _models(tmp_path, endpoint, "prepare", "smart-turn-v3.2")
    assert run.returncode == 0, run.stderr
    assert asked and "is not the pinned file (sha256 differs); using its PyPI package" in run.stdout
    record = json.loads((tmp_path / "models" / "smart-turn-v3.2" / "prepared.json").read_text())
    assert record["origin"] == "pypi:pipecat-ai"
    assert models.sha256(tmp_path / "models" / "smart-turn-v3.2" / "smart-turn-v3.2-cpu.onnx") == models.SMART_TURN_SHA256


@pytest.mark.parametrize("how", ["offline", "unreachable"])
def test_without_the_hub_the_packages_are_used(tmp_path: Path, how: str):
    with fake_hub(_official_files("smart-turn-v3.2")) as (endpoint, asked):
        if how == "offline":  # HF_HUB_OFFLINE=1: the hub is not even asked
            run = _models(tmp_path, endpoint, "prepare", "smart-turn-v3.2", offline=True)
        else:  # nothing listens there
            run = _models(tmp_path, "http://127.0.0.1:9", "prepare", "smart-turn-v3.2")
    assert run.returncode == 0, run.stderr
    assert asked == []
    assert json.loads((tmp_path / "models" / "smart-turn-v3.2" / "prepared.json").read_text())["origin"] == "pypi:pipecat-ai"
    if how == "unreachable":
        assert "not reachable" in run.stdout


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_is_checked_once_and_the_run_goes_offline_at_once(tmp_path: Path):
    """Without the check, huggingface_hub retried each file for about 25 s before the PyPI package
    was used (48 s for these two models on the 2-core development box): one quick check instead,
    then HF_HUB_OFFLINE=1 for the rest of the run."""
    t0 = time.monotonic()
    run = _models(tmp_path, f"http://127.0.0.1:{_closed_port()}", "prepare", "smart-turn-v3.2", "whisper-tiny.en")
    elapsed = time.monotonic() - t0
    assert run.returncode == 0, run.stderr
    assert elapsed < 10, f"models prepare took {elapsed:.1f} s with the hub unreachable"
    assert run.stdout.count("is not reachable within 2 s: offline for this run (HF_HUB_OFFLINE=1)") == 1, run.stdout
    assert "Retrying" not in run.stderr, run.stderr  # huggingface_hub was never asked
    assert json.loads((tmp_path / "models" / "smart-turn-v3.2" / "prepared.json").read_text())["origin"] == "pypi:pipecat-ai"
    assert "whisper-tiny.en: ready at" in run.stdout


def test_the_check_goes_where_huggingface_hub_connects_first(monkeypatch: pytest.MonkeyPatch):
    """Behind a proxy the hub itself is not reached directly, so the check connects to the proxy
    (unless NO_PROXY names the hub's host), as huggingface_hub's HTTP client would."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "all_proxy", "no_proxy", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert hub.endpoint() == ("huggingface.co", 443)
    monkeypatch.setenv("HTTPS_PROXY", "http://10.1.2.3:3128")
    assert hub.endpoint() == ("10.1.2.3", 3128)
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    assert hub.endpoint() == ("huggingface.co", 443)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.internal:8080")
    monkeypatch.setenv("HTTP_PROXY", "http://10.1.2.4:3128")
    assert hub.endpoint() == ("10.1.2.4", 3128)
