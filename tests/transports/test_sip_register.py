"""Outbound registration (``sip.register``) against sipp playing a provider's registrar: the
bridge registers, answers the digest challenge sipp checks, refreshes before the grant runs out,
and removes its binding when the server stops."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import synthetic_config
from tests.support.server import ServerThread
from tests.support.sip import SIPP, free_udp_port, registrar_scenario

pytestmark = [pytest.mark.system, pytest.mark.timeout(90)]


def registrar(tmp_path: Path, password: str, refreshes: int) -> tuple[subprocess.Popen[str], int]:
    if SIPP is None:
        pytest.fail("sipp is required (apt-get install sip-tester)")
    scenario = tmp_path / "registrar.xml"
    scenario.write_text(registrar_scenario("agent", password, grant_s=2, refreshes=refreshes))
    port = free_udp_port()
    cmd = [SIPP, "-sf", str(scenario), "-nostdin", "-m", "1", "-i", "127.0.0.1", "-p", str(port), "-mp", str(free_udp_port() & ~1),
           "-timeout", "30s", "-trace_err", "-error_file", str(tmp_path / "sipp-errors.log")]  # fmt: skip
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), port


def bridge(port: int, password: str, retry_s: float = 30.0) -> ServerThread:
    config = synthetic_config()
    config["sip"] = {"port": 0, "register": {"registrar": f"127.0.0.1:{port}", "user": "agent", "password": password, "domain": "trunk.example", "retry_s": retry_s}}
    return ServerThread(config).start()


def test_registers_answers_the_challenge_refreshes_and_unregisters_at_stop(tmp_path: Path) -> None:
    sipp, port = registrar(tmp_path, "secret", refreshes=2)
    server = bridge(port, "secret")
    try:
        registration = server.app.state.sip.registration
        deadline = time.monotonic() + 20
        while registration.registrations < 3 and time.monotonic() < deadline:  # the first and two refreshes, 2 s grants
            time.sleep(0.1)
        assert registration.registrations == 3 and registration.granted_s == 2
        assert server.call(lambda: server.app.state.sip.stats["registered"]) == 1
    finally:
        server.stop()  # removes the binding: sipp's last REGISTER must say Expires: 0
    out, _ = sipp.communicate(timeout=30)
    assert sipp.returncode == 0, out[-3000:]
    assert not registration.registered


def test_a_wrong_password_is_refused_and_not_counted_registered(tmp_path: Path) -> None:
    sipp, port = registrar(tmp_path, "secret", refreshes=0)
    server = bridge(port, "wrong", retry_s=60)
    try:
        registration = server.app.state.sip.registration
        deadline = time.monotonic() + 5
        while registration.cseq < 2 and time.monotonic() < deadline:  # the REGISTER and its answered challenge
            time.sleep(0.05)
        time.sleep(0.3)
        assert registration.cseq == 2 and registration.registrations == 0 and not registration.registered
        assert server.call(lambda: server.app.state.sip.stats["registered"]) == 0
    finally:
        server.stop()
        sipp.kill()
        sipp.wait(10)
