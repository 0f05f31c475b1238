"""The SIP bridge's pure parts: SDP offer/answer, SIP message parsing, where a dialog's requests go,
the RTP jitter buffer, DTMF de-duplication, and the RTP sender's header state (the low-delay resampler: tests/dsp)."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest

from dsp.g711 import pcm_to_ulaw
from transports.sip import message as sipmsg
from transports.sip import rtp, sdp
from transports.sip.dialog import dialog_for


def offer(formats: str, rtpmap: str = "", proto: str = "RTP/AVP") -> str:
    return f"v=0\r\no=x 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\nm=audio 4000 {proto} {formats}\r\n{rtpmap}"


def test_sdp_picks_the_callers_first_g711_and_keeps_telephone_event() -> None:
    o = sdp.parse_offer(offer("18 8 0 101", "a=rtpmap:18 G729/8000\r\na=rtpmap:101 telephone-event/8000\r\n"))
    assert (o.address, o.port, o.codec, o.dtmf) == ("10.0.0.1", 4000, 8, 101)
    answer = sdp.answer(o, "127.0.0.1", 20000, session_id=1)
    assert "m=audio 20000 RTP/AVP 8 101\r\n" in answer and "a=rtpmap:8 PCMA/8000" in answer
    video = sdp.parse_offer(offer("0") + "m=video 5000 RTP/AVP 96\r\n")
    assert "m=video 0 RTP/AVP 96" in sdp.answer(video, "127.0.0.1", 20000, session_id=1)  # declined, not dropped


@pytest.mark.parametrize(
    ("text", "status"),
    [
        (offer("18", "a=rtpmap:18 G729/8000\r\n"), 488),
        (offer("0", proto="RTP/SAVP"), 488),
        ("v=0\r\nm=audio x RTP/AVP 0\r\n", 400),
        ("v=0\r\n", 488),
        # found by bench.fuzz_wire: an address the RTP clock would resolve (or choke on) every 20 ms,
        # which stopped every call's audio
        (offer("0").replace("10.0.0.1", "pbx.example.com"), 488),
        (offer("0").replace("10.0.0.1", "10.0.0.1\x00x"), 488),
        (offer("0").replace("10.0.0.1", "256.1.1.1"), 488),
    ],
)
def test_sdp_offers_we_cannot_take(text: str, status: int) -> None:
    with pytest.raises(sdp.SdpError) as err:
        sdp.parse_offer(text)
    assert err.value.status == status


def test_sip_parse_compact_folded_and_multi_via() -> None:
    raw = (
        b"BYE sip:a@b SIP/2.0\r\nv: SIP/2.0/UDP 1.2.3.4;branch=z9hG4bK1, SIP/2.0/UDP 5.6.7.8;branch=z9hG4bK2\r\n"
        b"f: <sip:x@y>;tag=1\r\nt: <sip:a@b>\r\n ;tag=2\r\ni: abc\r\nCSeq: 7 BYE\r\nl: 0\r\n\r\n"
    )
    msg = sipmsg.parse(raw)
    assert msg.method == "BYE" and msg.call_id == "abc" and msg.cseq == (7, "BYE")
    assert len(msg.get_all("Via")) == 2 and msg.branch == "z9hG4bK1"
    assert sipmsg.param(msg.get("To") or "", "tag") == "2"
    reply = sipmsg.parse(sipmsg.response(msg, 200).encode())
    assert reply.status == 200 and reply.get_all("Via") == msg.get_all("Via") and reply.cseq == (7, "BYE")


# RFC 3261 section 21's statuses: each answer carries its own phrase (a 401 challenge once read "401 Unknown")
@pytest.mark.parametrize(
    ("status", "phrase"),
    [(401, "Unauthorized"), (407, "Proxy Authentication Required"), (404, "Not Found"), (410, "Gone"), (484, "Address Incomplete"), (504, "Server Time-out")],
)
def test_every_answer_carries_its_reason_phrase(status: int, phrase: str) -> None:
    invite = sipmsg.parse(b"INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 1.2.3.4;branch=z9hG4bK1\r\nFrom: <sip:x@y>;tag=1\r\nTo: <sip:a@b>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n")
    reply = sipmsg.parse(sipmsg.response(invite, status, to_tag="t").encode())
    assert (reply.status, reply.reason) == (status, phrase)
    rfc3261 = [100, 180, 181, 182, 183, 200, 300, 301, 302, 305, 380, 400, 401, 402, 403, 404, 405, 406, 407, 408, 410, 413, 414, 415, 416, 420, 421, 423, 480, 481, 482, 483, 484, 485, 486, 487, 488, 491, 493, 500, 501, 502, 503, 504, 505, 513, 600, 603, 604, 606]
    assert [code for code in rfc3261 if code not in sipmsg.REASONS] == []


def test_jitter_buffer_reorders_conceals_and_adapts() -> None:
    jb = rtp.JitterBuffer(0, depth=2)
    def frame(v: int) -> bytes:
        return pcm_to_ulaw(np.full(160, v, np.int16))

    out = jb.put(100, frame(1000))
    assert len(out) == 1
    assert jb.put(102, frame(3000)) == []  # 101 missing: wait for it
    out = jb.put(101, frame(2000))  # it came: both, in order
    assert [abs(int(f[0]) - v) < 100 for f, v in zip(out, (2000, 3000))] == [True, True]  # (G.711 rounds)
    # 103 lost: after two later packets it is concealed (a fading copy of 102), then 104, 105 follow
    assert jb.put(104, frame(5000)) == []
    out = jb.put(105, frame(6000))
    assert len(out) == 3 and jb.lost == 1 and 0 < abs(int(out[0][0])) < 3000
    assert jb.put(103, frame(4000)) == [] and jb.late == 1 and jb.depth == 3  # too late: wait longer from now on
    assert jb.put(107, frame(8000)) == [] and jb.put(107, frame(8000)) == [] and jb.duplicates == 1  # held twice? once


def test_jitter_buffer_sequence_wraps() -> None:
    jb = rtp.JitterBuffer(8)
    got = sum(len(jb.put(seq & 0xFFFF, b"\xd5" * 160)) for seq in range(65530, 65545))
    assert got == 15 and jb.lost == 0


def test_dtmf_is_reported_once_per_event() -> None:
    rx = rtp.DtmfReceiver()
    packets = [rtp.Packet(101, s, 8000, 1, s == 0, bytes([5, 0x0A]) + struct.pack("!H", 160 * (s + 1))) for s in range(6)]
    assert [rx.put(p) for p in packets] == ["5", None, None, None, None, None]
    assert rx.put(rtp.Packet(101, 7, 9600, 1, True, bytes([11, 0x0A, 0, 160]))) == "#"


def test_sender_header_state() -> None:
    tx = rtp.Sender(0)
    silence, voice = np.zeros(160, np.int16), np.full(160, 1000, np.int16)
    packets = [rtp.parse(tx.packet(pcm, speech=speech)) for pcm, speech in ((silence, False), (voice, True), (voice, True), (silence, False), (voice, True))]
    assert all(p is not None for p in packets)
    assert [p.marker for p in packets] == [False, True, False, False, True]  # type: ignore[union-attr]
    assert [(b.seq - a.seq) % 65536 for a, b in itertools.pairwise(packets)] == [1, 1, 1, 1]  # type: ignore[union-attr]
    assert [(b.timestamp - a.timestamp) % 2**32 for a, b in itertools.pairwise(packets)] == [160] * 4  # type: ignore[union-attr]
    assert len({p.ssrc for p in packets}) == 1  # type: ignore[union-attr]


def test_rtp_parse_rejects_what_is_not_rtp() -> None:
    assert rtp.parse(b"\x01junk") is None
    assert rtp.parse(struct.pack("!BBHII", 0x80, 200, 1, 1, 1)) is None  # RTCP sender report
    assert rtp.parse(struct.pack("!BBHII", 0x40, 0, 1, 1, 1)) is None  # version 1


def test_advertised_address() -> None:
    """Bound to every interface, the bridge puts in its SDP the address that reaches the caller."""
    from realtime_omni.config import SipConfig
    from transports.sip import SipBridge

    bridge = SipBridge(None, SipConfig(host="0.0.0.0", port=5060))  # type: ignore[arg-type]
    bridge.address = ("0.0.0.0", 5060)
    assert bridge.advertised(("127.0.0.1", 5000)) == "127.0.0.1"
    assert SipBridge(None, SipConfig(host="0.0.0.0", advertise="203.0.113.7")).advertised(("127.0.0.1", 5000)) == "203.0.113.7"  # type: ignore[arg-type]


def _invite(*record_route: str) -> sipmsg.SipMessage:
    rr = "".join(f"Record-Route: {r}\r\n" for r in record_route)
    return sipmsg.parse(
        ("INVITE sip:agent@10.0.0.9 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.5:5060;branch=z9hG4bKx\r\n"
         f"From: <sip:caller@example.com>;tag=a\r\nTo: <sip:agent@10.0.0.9>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n{rr}"
         "Contact: <sip:caller@192.0.2.7:5070>\r\nContent-Length: 0\r\n\r\n").encode()
    )


def test_dialog_requests_go_to_the_proxy_that_record_routed_the_call() -> None:
    """Behind a balancer our BYE and REFER go along the route set (RFC 3261 12.2.1.1): to the first
    loose router's address, which may differ from the address the INVITE came from; with no route
    set, a strict router, a host name (not looked up on the event loop) or the other IP family,
    where the INVITE came from."""
    came_from = ("10.0.0.5", 5060)
    routed = dialog_for(_invite("<sip:10.0.0.6:5080;lr;ftag=a;did=1.2>", "<sip:203.0.113.1;lr>"), "ours", came_from)
    assert routed.next_hop == ("10.0.0.6", 5080) and routed.route[0].startswith("<sip:10.0.0.6:5080")
    bye = routed.request("BYE", "10.0.0.9", 5060)
    assert bye.uri == "sip:caller@192.0.2.7:5070" and bye.get_all("Route") == routed.route
    assert dialog_for(_invite("<sip:[2001:db8::1]:5090;lr>"), "ours", ("2001:db8::9", 5060)).next_hop == ("2001:db8::1", 5090)
    assert dialog_for(_invite("<sip:[2001:db8::1]:5090;lr>"), "ours", came_from).next_hop == came_from  # not on our IPv4 socket
    assert dialog_for(_invite("<sip:10.0.0.6;lr>"), "ours", came_from).next_hop == ("10.0.0.6", 5060)
    assert dialog_for(_invite(), "ours", came_from).next_hop == came_from
    assert dialog_for(_invite("<sip:10.0.0.6:5080>"), "ours", came_from).next_hop == came_from  # strict router
    assert dialog_for(_invite("<sip:proxy.example.com;lr>"), "ours", came_from).next_hop == came_from
