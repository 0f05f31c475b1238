"""Phone calls across replicas: Debian's kamailio, run from deploy/kamailio.cfg (its listen address,
list file and timers rewritten for loopback), in front of two ``realtime-omni serve`` replicas (the
synthetic pipeline), each with its own SIP bridge; sipp places the calls through kamailio.

New calls spread over both replicas; each call's re-INVITE and BYE reach the replica holding it
(its RTP moves to the re-INVITE's new address from the same replica, that replica answers the BYE
and logs the re-INVITE); a replica killed mid-call has its calls ended by a BYE from the balancer
(and an in-dialog request to it gets a 408, not silence) while the other replica's calls go on
to their own BYE; new calls after the kill go to the live replica. A replica that never answers
hands a new call on to the next; a draining one (SIGTERM) takes no new call and ends its own with
a BYE through the balancer; a call whose replica restarted under it is ended by the balancer's
in-dialog keepalive (slow: about 40 s)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import synthetic_config
from tests.support.processes import free_port, stop, wait_ready
from tests.support.sip import (
    SIPP,
    RtpCapture,
    free_udp_port,
    routed_call_scenario,
    sipp,
)
from transports.sip.message import SipMessage, parse, uri_of

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

KAMAILIO_CFG = Path(__file__).parents[2] / "deploy" / "kamailio.cfg"
KAMAILIO = shutil.which("kamailio") or (os.path.exists("/usr/sbin/kamailio") and "/usr/sbin/kamailio") or None
PROBE_INTERVAL_S = 1
RELAY_TIMEOUT_MS = 1500
REINVITE_LOGGED = ": re-INVITE (caller's media at"  # transports/sip/call.py, at info
BYE_LOGGED = "ended (caller_hangup)"  # realtime_omni/calls.py
RTP_PORTS = [(24000, 24998), (26000, 26998), (28000, 28998), (22000, 22998)]  # each replica's own RTP range: a packet's source says whose


@pytest.fixture(scope="module", autouse=True)
def _need_tools() -> None:
    if KAMAILIO is None:
        pytest.fail("kamailio is required (apt-get install kamailio; scripts/test installs it)")
    if SIPP is None:
        pytest.fail("sipp is required (apt-get install sip-tester)")


@dataclass
class SipReplica:
    index: int
    http_port: int
    sip_port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def holds(self, rtp_source_port: int) -> bool:
        low, high = RTP_PORTS[self.index]
        return low <= rtp_source_port <= high

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def sip_replica(index: int, tmp: Path, sip_port: int | None = None, name: str = "replica") -> Iterator[SipReplica]:
    """``realtime-omni serve`` with its SIP bridge on a port of its own (or ``sip_port``), logging
    at info, its RTP from ``RTP_PORTS[index]``."""
    http_port, sip_port = free_port(), sip_port or free_udp_port()
    low, high = RTP_PORTS[index]
    config = synthetic_config(audio="tone", chunk_interval_ms=40)
    config.update(port=http_port, shutdown_grace_s=1.0)
    config["sip"] = {"port": sip_port, "host": "127.0.0.1", "rtp_port_min": low, "rtp_port_max": high, "rtp_timeout_s": 60.0}
    path = tmp / f"{name}-{index}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp / f"{name}-{index}.log"
    with open(log, "w") as out:
        cmd = [sys.executable, "-m", "host", "serve", "--config", str(path), "--log-level", "info"]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_ready(proc, f"http://127.0.0.1:{http_port}/healthz", 120, f"replica {index}", log, every_s=0.1)
        yield SipReplica(index, http_port, sip_port, proc, log)
    finally:
        if proc.poll() is None:
            stop(proc)


def balancer_cfg(listen_port: int, list_file: Path, probe_interval_s: int = PROBE_INTERVAL_S) -> str:
    """deploy/kamailio.cfg with this test's address, list file and short timers: only the values
    the file says to set change."""
    text = KAMAILIO_CFG.read_text()
    rewrites = [
        (r'(#!substdef "!BALANCER_LISTEN!)[^!]*(!g")', rf"\g<1>udp:127.0.0.1:{listen_port}\g<2>"),
        (r'(#!substdef "!REPLICAS_LIST!)[^!]*(!g")', rf"\g<1>{list_file}\g<2>"),
        (r"(#!define PROBE_INTERVAL_S )\d+", rf"\g<1>{probe_interval_s}"),
        (r"(#!define RELAY_TIMEOUT_MS )\d+", rf"\g<1>{RELAY_TIMEOUT_MS}"),
        (r"log_stderror=no", "log_stderror=yes"),
    ]
    for pattern, value in rewrites:
        text, n = re.subn(pattern, value, text)
        assert n == 1, f"deploy/kamailio.cfg no longer has {pattern!r}"
    return text


def options_answer(port: int, timeout: float = 1.0) -> int | None:
    """The status a SIP OPTIONS to 127.0.0.1:``port`` gets, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(timeout)
        me = s.getsockname()[1]
        s.sendto(
            (f"OPTIONS sip:127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{me};branch=z9hG4bK{time.monotonic_ns()}\r\n"
             f"From: <sip:probe@127.0.0.1>;tag=p\r\nTo: <sip:127.0.0.1:{port}>\r\nCall-ID: probe-{time.monotonic_ns()}\r\n"
             "CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n").encode(),
            ("127.0.0.1", port),
        )
        with contextlib.suppress(OSError):
            return parse(s.recvfrom(65535)[0]).status
    return None


@dataclass
class Balancer:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def balancer(sip_ports: list[int], tmp: Path, probe_interval_s: int = PROBE_INTERVAL_S, name: str = "kamailio") -> Iterator[Balancer]:
    """kamailio on deploy/kamailio.cfg in front of the bridges at ``sip_ports``, answering OPTIONS."""
    list_file = tmp / f"{name}-replicas.list"
    list_file.write_text("".join(f"1 sip:127.0.0.1:{port}\n" for port in sip_ports))
    port = free_udp_port()
    cfg = tmp / f"{name}.cfg"
    cfg.write_text(balancer_cfg(port, list_file, probe_interval_s))
    log = tmp / f"{name}.log"
    assert KAMAILIO is not None
    with open(log, "w") as out:
        # -DD: stay in the foreground; -E: log to stderr; small memory; runtime files in tmp
        cmd = [KAMAILIO, "-f", str(cfg), "-DD", "-E", "-m", "64", "-M", "8", "-Y", str(tmp), "-P", str(tmp / f"{name}.pid")]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while options_answer(port, 0.2) != 200:
            assert proc.poll() is None, f"kamailio exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"kamailio did not answer: {log.read_text()[-3000:]}"
        yield Balancer(port, proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Balancer, list[SipReplica], Path]]:
    """kamailio in front of two replicas; their logs, configs and the callers' sipp message logs
    stay in the test's temporary folder."""
    tmp = tmp_path_factory.mktemp("sip-balancer")
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(sip_replica(i, tmp)) for i in range(2)]
        yield stack.enter_context(balancer([r.sip_port for r in replicas], tmp)), replicas, tmp


def sip_sessions(replica: SipReplica) -> float:
    """The SIP sessions this replica opened, from its own /metrics."""
    text = httpx.get(f"{replica.http}/metrics", timeout=5).text
    found = re.search(r'^realtime_sessions_total\{transport="sip"\} ([0-9.]+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def open_sessions(replica: SipReplica) -> int:
    return int(httpx.get(f"{replica.http}/healthz", timeout=5).json()["sessions"])


@dataclass
class Caller:
    """One call placed by its own sipp through the balancer, capturing the RTP sent to it at the
    first media address and at the one its re-INVITE moves it to."""

    first: RtpCapture
    moved: RtpCapture
    log: Path
    task: asyncio.Future[subprocess.CompletedProcess[str]]

    def source(self, capture: RtpCapture) -> int | None:
        ports = {addr[1] for _, _, addr in capture.packets}
        assert len(ports) <= 1, f"RTP from several sources: {ports}"
        return next(iter(ports), None)

    def messages(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def close(self) -> None:
        self.first.close()
        self.moved.close()


def place(target: str, tmp: Path, name: str, hold_ms: int) -> Caller:
    first, moved = RtpCapture(), RtpCapture()
    log = tmp / f"{name}-messages.log"
    scenario = routed_call_scenario(first.port, moved.port, hold_ms=hold_ms)
    run = asyncio.ensure_future(asyncio.to_thread(sipp, scenario, target, tmp, timeout_s=60, extra=["-trace_msg", "-message_file", str(log)]))
    return Caller(first, moved, log, run)


async def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def received_bye(caller: Caller) -> bool:
    """Whether the caller was sent a BYE (sipp logs each message it receives after "received")."""
    return bool(re.search(r"received \[\d+\] bytes :\s+BYE ", caller.messages()))


def bye_status(caller: Caller) -> int | None:
    """The status the caller's own BYE got."""
    found = re.findall(r"received \[\d+\] bytes :\s+SIP/2.0 (\d{3})[^\n]*\n(?:[^\n]+\n)*?CSeq: 3 BYE", caller.messages())
    return int(found[-1]) if found else None


async def test_calls_spread_and_their_reinvite_and_bye_reach_the_replica_holding_each(deployment: Any) -> None:
    lb, replicas, tmp = deployment
    before = [sip_sessions(r) for r in replicas]
    logged = [(r.log_text().count(REINVITE_LOGGED), r.log_text().count(BYE_LOGGED)) for r in replicas]
    callers = [place(lb.target, tmp, f"spread-{i}", hold_ms=2500) for i in range(4)]
    try:
        results = await asyncio.gather(*(c.task for c in callers))
    finally:
        for c in callers:
            c.close()
    for c, result in zip(callers, results):
        assert result.returncode == 0, result.stdout[-2000:] + c.messages()[-3000:]
        assert bye_status(c) == 200, c.messages()[-3000:]  # the holding replica answered it (another would say 481)
    taken = [sip_sessions(r) - b for r, b in zip(replicas, before)]
    assert taken[0] >= 1 and taken[1] >= 1 and sum(taken) == 4, f"calls per replica: {taken}"
    for c in callers:
        first, moved = c.source(c.first), c.source(c.moved)
        assert first is not None and moved is not None, "no RTP before or after the re-INVITE"
        holder = [r for r in replicas if r.holds(first)]
        assert len(holder) == 1 and holder[0].holds(moved), f"RTP from {first} then {moved}: the re-INVITE went elsewhere"
    for r, n, (reinvites, byes) in zip(replicas, taken, logged):  # each replica saw its own calls' re-INVITEs and BYEs, no other
        text = r.log_text()
        assert (text.count(REINVITE_LOGGED) - reinvites, text.count(BYE_LOGGED) - byes) == (n, n), text[-3000:]
    await wait_for(lambda: all(open_sessions(r) == 0 for r in replicas), 10, "sessions left open after the BYEs")


async def test_a_replica_that_does_not_answer_hands_the_new_call_to_the_next(deployment: Any) -> None:
    """Before any probe has found it gone (probes off here), a new call sent to a dead replica
    waits RELAY_TIMEOUT_MS for an answer, then goes to the next replica, and the dead one is
    taken out: the next call goes straight to a live one."""
    _, replicas, tmp = deployment
    live = replicas[1]  # (the other test kills replicas[0])
    with balancer([free_udp_port(), live.sip_port], tmp, probe_interval_s=0, name="kamailio-failover") as lb:
        before = sip_sessions(live)
        for i in range(2):  # round robin: one of the two is sent to the dead replica first
            caller = place(lb.target, tmp, f"failover-{i}", hold_ms=500)
            try:
                result = await caller.task
            finally:
                caller.close()
            assert result.returncode == 0, result.stdout[-2000:] + caller.messages()[-3000:]
            assert live.holds(caller.source(caller.first) or 0) and bye_status(caller) == 200
        assert sip_sessions(live) - before == 2
        assert lb.log.read_text().count("did not answer; taking it out") == 1, lb.log.read_text()[-3000:]


async def test_a_draining_replica_ends_its_calls_with_its_own_bye_through_the_balancer(deployment: Any) -> None:
    """SIGTERM: the replica's probe answer turns 503 (no new calls) and its calls end with its own
    BYE, which goes along the route set, through the balancer, to the caller; with no replica left,
    the balancer answers probes 503 itself."""
    _, _, tmp = deployment
    with sip_replica(2, tmp) as draining, balancer([draining.sip_port], tmp, name="kamailio-drain") as lb:
        caller = place(lb.target, tmp, "drained", hold_ms=20000)
        try:
            await wait_for(lambda: caller.source(caller.moved) is not None, 15, "the call was not answered and moved")
            draining.process.send_signal(signal.SIGTERM)
            await wait_for(lambda: options_answer(draining.sip_port, 0.3) == 503, 5, "the draining replica's probe answer never said 503")
            result = await caller.task
        finally:
            caller.close()
        assert result.returncode == 0, result.stdout[-2000:] + caller.messages()[-3000:]
        bye = re.search(r"received \[\d+\] bytes :\s+(BYE .*?)\n\n", caller.messages(), re.DOTALL)
        assert bye is not None, caller.messages()[-3000:]
        vias = re.findall(r"^Via: SIP/2.0/UDP ([0-9.]+:\d+)", bye.group(1), re.MULTILINE)
        assert vias[0] == lb.target and len(vias) == 2, f"the BYE did not come through the balancer: {vias}"
        assert draining.process.wait(30) in (0, -signal.SIGTERM)
        # its only replica gone, the balancer tells a trunk's probe it takes no calls
        await wait_for(lambda: options_answer(lb.port, 0.3) == 503, 10, "the balancer still says 200 with no replica")


@pytest.mark.slow
async def test_a_call_its_restarted_replica_lost_is_ended_by_the_keepalive(deployment: Any) -> None:
    """A replica restarted on the same address between two probes (none notices it gone: probes
    off here) has lost its calls. kamailio's in-dialog OPTIONS (every 30 s, the least its dialog
    module allows) gets 481 from the new bridge, and the dialog module ends the call with a BYE to
    the caller 10 s later: about 40 s after the call began."""
    _, _, tmp = deployment
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(sip_replica(3, tmp, name="restarted"))
        lb = stack.enter_context(balancer([first.sip_port], tmp, probe_interval_s=0, name="kamailio-keepalive"))
        caller = place(lb.target, tmp, "lost", hold_ms=90000)
        try:
            await wait_for(lambda: caller.source(caller.moved) is not None, 15, "the call was not answered and moved")
            began = time.monotonic()
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(10)
            again = stack.enter_context(sip_replica(3, tmp, sip_port=first.sip_port, name="restarted-again"))
            assert open_sessions(again) == 0
            await wait_for(lambda: received_bye(caller), 75, "the lost call was never ended")
            ended_after = time.monotonic() - began
            result = await caller.task
        finally:
            caller.close()
        assert result.returncode == 0, result.stdout[-2000:] + caller.messages()[-3000:]
        assert 25 < ended_after < 75, ended_after
        print(f"the call the restarted replica lost got its BYE {ended_after:.0f} s after the restart")


def in_dialog_request(caller: Caller, method: str = "OPTIONS") -> bytes:
    """A request in the caller's dialog, built from the 200 OK to its INVITE as sipp logged it
    (Request-URI the Contact, Route the Record-Route), from a socket of the test's own."""
    text = caller.messages()
    start = re.search(r"received \[\d+\] bytes :\s+(SIP/2.0 200 OK.*?CSeq: 1 INVITE.*?)\n\n", text, re.DOTALL)
    assert start is not None, text[-3000:]
    head = re.sub(r"(?m)^Content-Length:.*$", "Content-Length: 0", start.group(1))  # its headers, without the SDP
    ok: SipMessage = parse(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")
    routes = "".join(f"Route: {r}\r\n" for r in ok.get_all("Record-Route"))
    return (
        f"{method} {uri_of(ok.get('Contact') or '')} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{{port}};branch=z9hG4bK{time.monotonic_ns()}\r\n"
        f"From: {ok.get('From')}\r\nTo: {ok.get('To')}\r\nCall-ID: {ok.call_id}\r\nCSeq: 10 {method}\r\n{routes}"
        "Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def send_in_dialog(lb: Balancer, request: bytes, timeout: float) -> tuple[int | None, float]:
    """Send ``request`` to the balancer; the final status that comes back and how long it took."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(timeout)
        data = request.replace(b"{port}", str(s.getsockname()[1]).encode())
        t0 = time.monotonic()
        s.sendto(data, ("127.0.0.1", lb.port))
        with contextlib.suppress(OSError):
            while True:
                reply = parse(s.recvfrom(65535)[0])
                if reply.status >= 200:
                    return reply.status, time.monotonic() - t0
    return None, time.monotonic() - t0


async def test_a_killed_replica_ends_its_calls_the_other_carries_on_and_new_calls_go_to_it(deployment: Any) -> None:
    lb, replicas, tmp = deployment
    callers = [place(lb.target, tmp, f"kill-{i}", hold_ms=15000) for i in range(4)]
    try:
        await wait_for(lambda: all(c.source(c.moved) is not None for c in callers), 20, "not every call was answered and moved")
        victim, survivor = replicas
        on_victim = [c for c in callers if victim.holds(c.source(c.moved) or 0)]
        on_survivor = [c for c in callers if survivor.holds(c.source(c.moved) or 0)]
        assert on_victim and on_survivor and len(on_victim) + len(on_survivor) == 4
        survivor_before = sip_sessions(survivor)
        killed_at = time.monotonic()
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(10)

        # the balancer's probe finds it gone and ends its calls: each caller gets a BYE
        await wait_for(lambda: all(received_bye(c) for c in on_victim), 12, "the killed replica's callers got no BYE")
        ended_after = time.monotonic() - killed_at
        # an in-dialog request to the dead replica is answered (408 after the relay timeout), not lost
        status, took = await asyncio.to_thread(send_in_dialog, lb, in_dialog_request(on_victim[0]), RELAY_TIMEOUT_MS / 1000 + 5)
        assert status in (408, 503), f"an in-dialog request to the dead replica got {status} after {took:.1f} s"

        # new calls go to the live replica, and the calls it holds are still up
        newcomers = [place(lb.target, tmp, f"after-kill-{i}", hold_ms=1000) for i in range(2)]
        try:
            late = await asyncio.gather(*(c.task for c in newcomers))
            for c, result in zip(newcomers, late):
                assert result.returncode == 0, result.stdout[-2000:] + c.messages()[-3000:]
                assert survivor.holds(c.source(c.first) or 0) and bye_status(c) == 200
        finally:
            for c in newcomers:
                c.close()
        assert sip_sessions(survivor) - survivor_before == 2
        assert not any(received_bye(c) for c in on_survivor)
        assert open_sessions(survivor) == len(on_survivor)

        results = await asyncio.gather(*(c.task for c in callers))  # the survivor's calls run to their own BYE
    finally:
        for c in callers:
            c.close()
    for c, result in zip(callers, results):
        assert result.returncode == 0, result.stdout[-2000:] + c.messages()[-3000:]
    for c in on_survivor:
        assert bye_status(c) == 200, c.messages()[-3000:]
    print(f"the killed replica's {len(on_victim)} calls got their BYE {ended_after:.1f} s after the kill; "
          f"an in-dialog request to it got {status} in {took:.1f} s")
