"""The SIP bridge against bad and unusual input: malformed messages, requests for dialogs that do
not exist, unsupported offers and methods, retransmissions, RTP from a stranger, a caller that
vanishes, and a burst of INVITEs far beyond ``max_sessions``. Each gets the right SIP answer,
nothing crashes, and no call or session is left behind."""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

import pytest

from tests.conftest import synthetic_config
from tests.support.server import ServerThread
from tests.support.sip import RawUac, RtpMic, rtp_packet, sdp_offer, wait_until
from transports.sip.message import param

pytestmark = [pytest.mark.timeout(120)]

MAX_SESSIONS = 3


@pytest.fixture(scope="module")
def bridge() -> Any:
    config = synthetic_config(limits={"max_sessions": MAX_SESSIONS})
    config["sip"] = {"port": 0, "rtp_timeout_s": 1.5, "t1_ms": 100}
    server = ServerThread(config).start()
    yield server
    server.stop()


def clean(server: ServerThread) -> bool:
    return server.call(lambda: not server.server.calls and not server.app.state.sip.calls and not server.server.sessions)


def answer(uac: RawUac, request: str, call_id: str, method: str = "INVITE") -> int | None:
    uac.send(request)
    reply = uac.final(call_id, method)
    return reply.status if reply is not None else None


def establish(uac: RawUac, call_id: str, media_port: int) -> Any:
    """INVITE -> 200 -> ACK; returns the 200."""
    uac.send(uac.request("INVITE", call_id, body=sdp_offer(media_port)))
    ok = uac.final(call_id)
    assert ok is not None and ok.status == 200, ok
    uac.send(uac.request("ACK", call_id, to_tag=_tag(ok)))
    return ok


def _tag(msg: Any) -> str:
    return param(msg.get("To"), "tag") or ""


async def test_malformed_and_unsupported_requests_get_clear_answers(bridge: ServerThread, uac: RawUac) -> None:
    uac.send(b"\x00\x01garbage\xff\r\n\r\n")  # not SIP at all: dropped
    uac.send("INVITE sip:x SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKa\r\n\r\n")  # no From/To/Call-ID/CSeq
    reply = uac.recv(2, want=lambda m: not m.is_request)
    assert reply is not None and reply.status == 400 and "missing" in reply.reason
    bad_cseq = uac.request("OPTIONS", "c-bad-cseq").replace("CSeq: 1 OPTIONS", "CSeq: one OPTIONS")
    uac.send(bad_cseq)
    reply = uac.recv(2, want=lambda m: not m.is_request and m.call_id == "c-bad-cseq")
    assert reply is not None and reply.status == 400
    short = uac.request("INVITE", "c-short", body=sdp_offer(4000)).replace("Content-Length: ", "Content-Length: 9")
    uac.send(short)
    reply = uac.recv(2, want=lambda m: not m.is_request and m.call_id == "c-short")
    assert reply is not None and reply.status == 400
    v3 = uac.request("OPTIONS", "c-v3").replace("SIP/2.0\r\nVia", "SIP/3.0\r\nVia", 1)
    uac.send(v3)
    reply = uac.recv(2, want=lambda m: not m.is_request and m.call_id == "c-v3")
    assert reply is not None and reply.status == 505

    assert answer(uac, uac.request("OPTIONS", "c-options"), "c-options", "OPTIONS") == 200
    assert answer(uac, uac.request("REGISTER", "c-reg", extra="Expires: 60\r\n"), "c-reg", "REGISTER") == 200
    assert answer(uac, uac.request("MESSAGE", "c-msg"), "c-msg", "MESSAGE") == 405
    assert answer(uac, uac.request("BYE", "c-nodialog", to_tag="nope"), "c-nodialog", "BYE") == 481
    assert answer(uac, uac.request("INVITE", "c-reinv", to_tag="nope", body=sdp_offer(4000)), "c-reinv") == 481
    assert answer(uac, uac.request("CANCEL", "c-cancel"), "c-cancel", "CANCEL") == 481
    uac.send(uac.request("ACK", "c-ack", to_tag="nope"))  # never answered
    assert answer(uac, uac.request("INVITE", "c-g729", body=sdp_offer(4000, "18")), "c-g729") == 488
    assert answer(uac, uac.request("INVITE", "c-nosdp"), "c-nosdp") == 488
    assert answer(uac, uac.request("INVITE", "c-video", body=sdp_offer(4000).replace("m=audio", "m=video")), "c-video") == 488
    assert answer(uac, uac.request("INVITE", "c-require", extra="Require: 100rel\r\n", body=sdp_offer(4000)), "c-require") == 420
    assert not [m for m in uac.inbox if not m.is_request and m.call_id == "c-ack"]
    assert await wait_until(lambda: clean(bridge))
    assert bridge.app.state.sip.stats["malformed"] >= 3


async def test_retransmitted_invite_is_one_call_and_reinvite_moves_media(bridge: ServerThread, uac: RawUac) -> None:
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    moved = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    moved.bind(("127.0.0.1", 0))
    try:
        invite = uac.request("INVITE", "c-retrans", branch="z9hG4bKretrans", body=sdp_offer(media.getsockname()[1]))
        uac.send(invite)
        uac.send(invite)  # a retransmission (same branch): answered, not a second call
        first = uac.final("c-retrans")
        second = uac.final("c-retrans", timeout=1.5)  # the retransmitted 200 (no ACK yet)
        assert first is not None and second is not None and first.status == second.status == 200
        assert first.body == second.body and _tag(first) == _tag(second)
        assert len(bridge.server.calls) == 1
        tag = _tag(first)
        uac.send(uac.request("ACK", "c-retrans", to_tag=tag))
        reinvite = uac.request("INVITE", "c-retrans", cseq=2, to_tag=tag, body=sdp_offer(moved.getsockname()[1]))
        assert answer(uac, reinvite, "c-retrans") == 200
        uac.send(uac.request("ACK", "c-retrans", cseq=2, to_tag=tag))
        moved.settimeout(2)
        data, _ = moved.recvfrom(2048)  # our RTP now goes to the new address
        assert data[1] & 0x7F == 0
        assert answer(uac, uac.request("BYE", "c-retrans", cseq=3, to_tag=tag), "c-retrans", "BYE") == 200
    finally:
        media.close()
        moved.close()
    assert await wait_until(lambda: clean(bridge))


async def test_rtp_from_a_stranger_is_dropped_and_a_vanished_caller_is_hung_up(bridge: ServerThread, uac: RawUac) -> None:
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ok = establish(uac, "c-vanish", media.getsockname()[1])
        rtp_port = int(ok.body.decode().split("m=audio ")[1].split()[0])
        call = next(iter(bridge.app.state.sip.calls.values()))
        for seq in range(10):  # the caller's stream fixes its source
            media.sendto(rtp_packet(seq), ("127.0.0.1", rtp_port))
        assert await wait_until(lambda: call.jitter.received == 10, 3)  # all of it taken, before the stranger's
        for seq in range(10, 20):  # same port, someone else: dropped
            stranger.sendto(rtp_packet(seq, b"\x00" * 160, ssrc=0xBAD), ("127.0.0.1", rtp_port))
        stranger.sendto(b"\x01junk", ("127.0.0.1", rtp_port))
        assert await wait_until(lambda: call.endpoint.foreign == 11, 3)
        assert call.jitter.received == 10
        # now the caller goes silent without a BYE: after rtp_timeout_s we hang up with a BYE
        bye = uac.recv(6, want=lambda m: m.is_request and m.method == "BYE")
        assert bye is not None and bye.call_id == "c-vanish"
        assert call.end_reason == "rtp_timeout"
        from transports.sip.message import response

        uac.send(response(bye, 200).encode())
    finally:
        media.close()
        stranger.close()
    assert await wait_until(lambda: clean(bridge))


async def test_a_caller_silent_on_rtp_for_less_than_the_timeout_keeps_the_call(bridge: ServerThread, uac: RawUac) -> None:
    """A phone's dropped network, as a SIP call sees it: its RTP stops and comes back. Silent for less
    than ``sip.rtp_timeout_s`` (30 s by default, as ``resume.grace_s``; 1.5 s here) the call goes on:
    no BYE, and the audio after the gap is taken."""
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    try:
        ok = establish(uac, "c-gap", media.getsockname()[1])
        rtp_port = int(ok.body.decode().split("m=audio ")[1].split()[0])
        call = next(iter(bridge.app.state.sip.calls.values()))
        for seq in range(10):
            media.sendto(rtp_packet(seq), ("127.0.0.1", rtp_port))
        assert await wait_until(lambda: call.jitter.received == 10, 3)
        assert uac.recv(1.0, want=lambda m: m.is_request and m.method == "BYE") is None  # two thirds of the timeout, silent
        for seq in range(10, 20):
            media.sendto(rtp_packet(seq), ("127.0.0.1", rtp_port))
        assert await wait_until(lambda: call.jitter.received == 20, 3)
        assert call.end_reason is None and call in bridge.app.state.sip.calls.values()
        assert answer(uac, uac.request("BYE", "c-gap", cseq=2, to_tag=_tag(ok)), "c-gap", "BYE") == 200
    finally:
        media.close()
    assert await wait_until(lambda: clean(bridge))


@pytest.mark.slow
async def test_a_200_never_acked_is_resent_then_hung_up_with_a_bye_resent_until_answered(bridge: ServerThread, uac: RawUac) -> None:
    """RFC 3261 13.3.1.4: the 2xx is resent until the ACK; none in 64·T1 ends the call (BYE), and
    our BYE is itself resent until the caller answers it (17.1.2)."""
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    mic = None
    try:
        uac.send(uac.request("INVITE", "c-noack", body=sdp_offer(media.getsockname()[1])))
        ok = uac.final("c-noack")
        assert ok is not None and ok.status == 200
        rtp_port = int(ok.body.decode().split("m=audio ")[1].split()[0])
        mic = RtpMic(media, ("127.0.0.1", rtp_port))  # media flows: only the missing ACK can end the call
        call = next(iter(bridge.app.state.sip.calls.values()))
        copies, bye = 0, None
        while bye is None:
            msg = uac.recv(10, want=lambda m: m.call_id == "c-noack")
            assert msg is not None, f"no BYE after {copies} copies of the 200"
            if msg.is_request and msg.method == "BYE":
                bye = msg
            elif not msg.is_request and msg.status == 200:
                assert _tag(msg) == _tag(ok) and msg.body == ok.body
                copies += 1
        assert copies >= 3  # T1 = 100 ms: resent at 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s before giving up at 6.4 s
        assert call.end_reason == "no_ack"
        assert param(bye.get("From"), "tag") == _tag(ok)
        again = uac.recv(5, want=lambda m: m.is_request and m.method == "BYE")  # unanswered: resent
        assert again is not None and again.branch == bye.branch and again.cseq == bye.cseq
        from transports.sip.message import response

        uac.send(response(again, 200).encode())
    finally:
        if mic is not None:
            mic.close()
        media.close()
    assert await wait_until(lambda: clean(bridge))


async def test_a_burst_of_invites_beyond_max_sessions(bridge: ServerThread, uac: RawUac) -> None:
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    port = media.getsockname()[1]
    try:
        ids = [f"c-burst-{i}" for i in range(50)]
        for call_id in ids:
            uac.send(uac.request("INVITE", call_id, body=sdp_offer(port)))
        finals = {}
        for _ in ids:
            reply = uac.recv(10, want=lambda m: not m.is_request and m.status >= 200 and m.call_id not in finals)
            assert reply is not None, f"only {len(finals)} answers"
            finals[reply.call_id] = reply
            uac.send(uac.request("ACK", reply.call_id, to_tag=_tag(reply)))
        statuses = Counter(r.status for r in finals.values())
        assert statuses == {200: MAX_SESSIONS, 486: 50 - MAX_SESSIONS}, statuses
        assert len(bridge.server.sessions) == MAX_SESSIONS
        for call_id, reply in finals.items():
            if reply.status == 200:
                assert answer(uac, uac.request("BYE", call_id, cseq=2, to_tag=_tag(reply)), call_id, "BYE") == 200
        assert await wait_until(lambda: clean(bridge))
        assert answer(uac, uac.request("OPTIONS", "c-after"), "c-after", "OPTIONS") == 200  # still serving
    finally:
        media.close()


async def test_options_say_whether_a_call_is_held_and_whether_new_calls_are_taken(bridge: ServerThread, uac: RawUac) -> None:
    """What a balancer in front of several replicas asks (deploy/kamailio.cfg): a keep-alive OPTIONS
    in a call's dialog is 200 while the bridge holds the call and 481 once it does not (a replica
    restarted under the call); a probe outside any dialog is 200 while new calls are taken, 503
    while the server drains (tests/deploy/test_sip_balancer.py runs the balancer itself)."""
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    try:
        ok = establish(uac, "c-keepalive", media.getsockname()[1])
        tag = _tag(ok)
        assert answer(uac, uac.request("OPTIONS", "c-keepalive", cseq=2, to_tag=tag), "c-keepalive", "OPTIONS") == 200
        assert answer(uac, uac.request("OPTIONS", "c-keepalive-lost", to_tag="not-ours"), "c-keepalive-lost", "OPTIONS") == 481
        assert answer(uac, uac.request("BYE", "c-keepalive", cseq=3, to_tag=tag), "c-keepalive", "BYE") == 200
        assert await wait_until(lambda: clean(bridge))
        assert answer(uac, uac.request("OPTIONS", "c-keepalive", cseq=4, to_tag=tag), "c-keepalive", "OPTIONS") == 481
    finally:
        media.close()


def test_a_draining_server_answers_probes_503() -> None:
    config = synthetic_config()
    config["sip"] = {"port": 0}
    server = ServerThread(config).start()
    uac = RawUac(tuple(server.app.state.sip.address))
    try:
        assert answer(uac, uac.request("OPTIONS", "c-probe-1"), "c-probe-1", "OPTIONS") == 200
        server.call(server.server.stop_admitting)
        uac.send(uac.request("OPTIONS", "c-probe-2"))
        reply = uac.final("c-probe-2", "OPTIONS")
        assert reply is not None and reply.status == 503 and reply.get("Retry-After") == "5"
    finally:
        uac.close()
        server.stop()
