"""SIP test clients: sipp scenarios (real calls placed by sipp), a PCMU pcap writer for sipp's
``play_pcap_audio``, and an RTP listener that captures what the server sends back."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsp.g711 import alaw_to_pcm, pcm_to_alaw, pcm_to_ulaw, ulaw_to_pcm
from dsp.resample import resample

SIPP = shutil.which("sipp")



# The first lines of a scenario's INVITE, in sipp's keywords (every scenario here sends the same)
INVITE_HEAD = """      INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 INVITE"""

def reply_to_last(status: str) -> str:
    """sipp XML: answer the request just received with ``status`` (its Via, From, To, Call-ID, CSeq)."""
    return f"""
  <send>
    <![CDATA[
      SIP/2.0 {status}
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0
    ]]>
  </send>"""


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_g711_pcap(path: Path, pcm_8k: np.ndarray, *, src_port: int = 7000, dst_port: int = 8000, payload_type: int = 0) -> None:
    """A pcap (Ethernet/IPv4/UDP/RTP) of ``pcm_8k`` as 20 ms PCMU (payload type 0) or PCMA (8) packets at 20 ms intervals:
    what sipp's ``play_pcap_audio`` replays (it rewrites addresses and ports, keeps the timing)."""
    frames = [pcm_8k[i : i + 160] for i in range(0, len(pcm_8k) - 159, 160)]
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]  # pcap header, linktype Ethernet
    ssrc, seq, ts = 0x1234ABCD, 1000, 160000
    for i, frame in enumerate(frames):
        rtp = struct.pack("!BBHII", 0x80, (0x80 if i == 0 else 0) | payload_type, seq + i, ts + 160 * i, ssrc) + (pcm_to_ulaw(frame) if payload_type == 0 else pcm_to_alaw(frame))
        udp = struct.pack("!HHHH", src_port, dst_port, 8 + len(rtp), 0) + rtp
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i & 0xFFFF, 0, 64, 17, 0, socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1")) + udp
        eth = b"\x00" * 12 + b"\x08\x00" + ip
        t = i * 0.02
        out.append(struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(eth), len(eth)) + eth)
    path.write_bytes(b"".join(out))


@dataclass
class RtpCapture:
    """Every RTP packet that reaches a UDP port, with its arrival time (a thread, so the test's
    own event loop does not disturb the timing)."""

    port: int = 0
    packets: list[tuple[float, bytes, tuple[str, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", self.port))
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
            except (TimeoutError, OSError):
                continue
            self.packets.append((time.monotonic(), data, addr))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()

    def headers(self) -> list[tuple[int, int, int, int, bool]]:
        """(payload type, seq, timestamp, ssrc, marker) of each packet."""
        out = []
        for _, data, _ in self.packets:
            _, b1, seq, ts, ssrc = struct.unpack_from("!BBHII", data)
            out.append((b1 & 0x7F, seq, ts, ssrc, bool(b1 & 0x80)))
        return out

    def audio(self) -> np.ndarray:
        """The received stream decoded to 8 kHz PCM, in arrival order."""
        chunks = []
        for _, data, _ in self.packets:
            pt = data[1] & 0x7F
            chunks.append(ulaw_to_pcm(data[12:]) if pt == 0 else alaw_to_pcm(data[12:]))
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


def sipp(scenario: str, target: str, tmp: Path, *, calls: int = 1, rate: int = 10, timeout_s: int = 60, extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a sipp scenario (XML text) against ``target`` (host:port); exit code 0 means every call
    went as the scenario says."""
    assert SIPP is not None
    path = tmp / f"scenario-{time.monotonic_ns()}.xml"
    path.write_text(scenario)
    for _ in range(3):
        # its ports are picked free, then released for sipp to bind: another process (or another
        # sipp started beside it) may take one first, and the media port, rounded down to even, may be
        # taken already; sipp then stops at once ("Unable to bind ..."), before any message, and is
        # started again on other ports (seen once in a full run: one of four concurrent callers)
        cmd = [
            SIPP, "-sf", str(path), "-nostdin", "-m", str(calls), "-r", str(rate), "-l", str(calls),
            "-i", "127.0.0.1", "-p", str(free_udp_port()), "-mp", str(free_udp_port() & ~1),
            "-timeout", f"{timeout_s}s", "-trace_err", "-error_file", str(tmp / "sipp-errors.log"), *(extra or []), target,
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 30, cwd=tmp, check=False)
        if "Unable to bind" not in result.stdout + result.stderr:
            break
    return result


def invite_scenario(media_port: int, *, codecs: str = "0 101", rtpmap: str = "a=rtpmap:0 PCMU/8000\na=rtpmap:101 telephone-event/8000\na=fmtp:101 0-15",
                    after_ack: str = "", hangup: str = "caller", expect: str = "200") -> str:
    """An INVITE with an SDP offer pointing at ``media_port`` (where the test captures our RTP);
    ``after_ack``: scenario steps in the call; ``hangup``: who ends it (caller: sipp sends BYE;
    server: sipp waits for our BYE); ``expect``: the final status (non-200: the call ends there)."""
    sdp = f"""v=0
o=sipp 53655765 2353687637 IN IP4 127.0.0.1
s=-
c=IN IP4 127.0.0.1
t=0 0
m=audio {media_port} RTP/AVP {codecs}
{rtpmap}
a=ptime:20
a=sendrecv"""
    invite = f"""
  <send retrans="500">
    <![CDATA[
{INVITE_HEAD}
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      X-Test: sipp
      Content-Type: application/sdp
      Content-Length: [len]

{sdp}
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>"""
    ack = """
  <send>
    <![CDATA[
      ACK sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>"""
    if expect != "200":
        return _wrap(invite + f'\n  <recv response="{expect}"/>' + ack)
    if hangup == "caller":
        end = caller_bye(2)
    else:
        end = """
  <recv request="BYE"/>""" + reply_to_last("200 OK")
    return _wrap(invite + '\n  <recv response="200" rtd="true"/>' + ack + after_ack + end)


def caller_bye(cseq: int) -> str:
    """sipp XML: the caller hangs up (a BYE in the call's dialog) and takes the 200."""
    return f"""
  <send retrans="500">
    <![CDATA[
      BYE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: {cseq} BYE
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="200"/>"""


REFERRED = """
  <recv request="REFER"/>""" + reply_to_last("202 Accepted") + """
  <send retrans="500">
    <![CDATA[
      NOTIFY sip:realtime-omni@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 NOTIFY
      Event: refer
      Subscription-State: terminated;reason=noresource
      Max-Forwards: 70
      Content-Type: message/sipfrag
      Content-Length: [len]

SIP/2.0 200 OK
    ]]>
  </send>
  <recv response="200"/>"""
"""After the answer: take our REFER (202), report the transfer done (NOTIFY, sipfrag 200); the
scenario then expects our BYE (``hangup="server"``)."""


def cancel_scenario(media_port: int) -> str:
    """INVITE, then CANCEL while it rings: 200 to the CANCEL, 487 to the INVITE, ACK."""
    sdp = f"v=0\no=sipp 1 1 IN IP4 127.0.0.1\ns=-\nc=IN IP4 127.0.0.1\nt=0 0\nm=audio {media_port} RTP/AVP 0\na=rtpmap:0 PCMU/8000"
    head = """      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]"""
    return _wrap(f"""
  <send retrans="500" start_txn="invite">
    <![CDATA[
      INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
{head}
      CSeq: 1 INVITE
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]

{sdp}
    ]]>
  </send>
  <recv response="100" optional="true" response_txn="invite"/>
  <recv response="180" response_txn="invite"/>
  <send retrans="500" start_txn="cancel">
    <![CDATA[
      CANCEL sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch-3]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      CSeq: 1 CANCEL
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
  <recv response="200" response_txn="cancel"/>
  <recv response="487" response_txn="invite"/>
  <send ack_txn="invite">
    <![CDATA[
      ACK sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch-6]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>""")


def authenticated_scenario(media_port: int, *, expect: str = "200") -> str:
    """An INVITE, its 401 challenge answered (sipp's ``[authentication]``, the user and password from
    ``-au``/``-ap``) in a second INVITE of the same call; ``expect``: that one's final status (200:
    the call is held for a second and the caller hangs up; else the call ends there)."""
    sdp = f"v=0\no=sipp 1 1 IN IP4 127.0.0.1\ns=-\nc=IN IP4 127.0.0.1\nt=0 0\nm=audio {media_port} RTP/AVP 0\na=rtpmap:0 PCMU/8000"
    head = """      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>
      Call-ID: [call_id]
      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Type: application/sdp
      Content-Length: [len]"""

    def ack(cseq: int, branch: str, txn: str) -> str:
        return f"""
  <send ack_txn="{txn}">
    <![CDATA[
      ACK sip:agent@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch={branch}
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: {cseq} ACK
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>"""

    body = f"""
  <send retrans="500" start_txn="first">
    <![CDATA[
      INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      CSeq: 1 INVITE
{head}

{sdp}
    ]]>
  </send>
  <recv response="100" optional="true" response_txn="first"/>
  <recv response="401" auth="true" response_txn="first"/>{ack(1, "[branch-3]", "first")}
  <send retrans="500" start_txn="second">
    <![CDATA[
      INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
      CSeq: 2 INVITE
      [authentication]
{head}

{sdp}
    ]]>
  </send>
  <recv response="100" optional="true" response_txn="second"/>"""
    if expect != "200":
        return _wrap(body + f'\n  <recv response="{expect}" response_txn="second"/>' + ack(2, "[branch-3]", "second"))
    return _wrap(body + f"""
  <recv response="200" response_txn="second"/>{ack(2, "[branch]", "second")}
  <pause milliseconds="1000"/>{caller_bye(3)}""")


def play_pcap(path: Path, pause_ms: int) -> str:
    return f"""
  <nop><action><exec play_pcap_audio="{path}"/></action></nop>""" + (f'\n  <pause milliseconds="{pause_ms}"/>' if pause_ms else "")


def _wrap(body: str) -> str:
    return f'<?xml version="1.0" encoding="ISO-8859-1" ?>\n<scenario name="realtime-omni test">{body}\n</scenario>\n'


def spoken_8k(pcm_24k: np.ndarray) -> np.ndarray:
    return resample(pcm_24k, 24000, 8000)


async def wait_until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


__all__ = ["SIPP", "RtpCapture", "cancel_scenario", "free_udp_port", "invite_scenario", "os", "play_pcap", "sipp", "spoken_8k", "wait_until", "write_g711_pcap"]


class WebhookReceiver:
    """The application's webhook endpoint: records each JSON event POSTed to it."""

    def __init__(self) -> None:
        import http.server
        import json
        import queue

        self.events: queue.Queue[dict] = queue.Queue(100)
        events = self.events

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                events.put_nowait(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    async def next(self, timeout: float = 10.0) -> dict:
        return await asyncio.to_thread(self.events.get, True, timeout)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RawUac:
    """A bare SIP caller over UDP for what real clients never send: hand-made requests,
    malformed ones, bursts, a caller that goes silent. Reads answers with the bridge's parser
    (parsing only: what is asserted is the status each request gets)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.05)
        self.inbox: list = []

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes | str) -> None:
        self.sock.sendto(data.encode() if isinstance(data, str) else data, self.target)

    def request(self, method: str, call_id: str, *, cseq: int = 1, branch: str | None = None, to_tag: str | None = None,
                body: str = "", extra: str = "", from_tag: str = "uac") -> str:
        branch = branch or f"z9hG4bK{time.monotonic_ns()}"
        to = f"<sip:agent@{self.target[0]}>" + (f";tag={to_tag}" if to_tag else "")
        ctype = "Content-Type: application/sdp\r\n" if body else ""
        return (f"{method} sip:agent@{self.target[0]}:{self.target[1]} SIP/2.0\r\n"
                f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch={branch}\r\n"
                f"From: <sip:uac@127.0.0.1>;tag={from_tag}\r\nTo: {to}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n"
                f"Contact: <sip:uac@127.0.0.1:{self.port}>\r\nMax-Forwards: 70\r\n{extra}{ctype}Content-Length: {len(body)}\r\n\r\n{body}")

    def recv(self, timeout: float = 3.0, *, want=None):  # type: ignore[no-untyped-def]
        """The next message (optionally the next that ``want`` accepts), or None on timeout."""
        from transports.sip.message import parse

        deadline = time.monotonic() + timeout
        while True:
            for i, msg in enumerate(self.inbox):
                if want is None or want(msg):
                    return self.inbox.pop(i)
            if time.monotonic() > deadline:
                return None
            try:
                data, _ = self.sock.recvfrom(65535)
            except (TimeoutError, OSError):
                continue
            self.inbox.append(parse(data))

    def final(self, call_id: str, method: str = "INVITE", timeout: float = 3.0):  # type: ignore[no-untyped-def]
        return self.recv(timeout, want=lambda m: not m.is_request and m.call_id == call_id and m.status >= 200 and m.cseq[1] == method)


def sdp_offer(port: int, codecs: str = "0 101", address: str = "127.0.0.1") -> str:
    return (f"v=0\r\no=uac 1 1 IN IP4 {address}\r\ns=-\r\nc=IN IP4 {address}\r\nt=0 0\r\nm=audio {port} RTP/AVP {codecs}\r\n"
            "a=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n")


def rtp_packet(seq: int, payload: bytes = b"\xff" * 160, pt: int = 0, ssrc: int = 0x5151) -> bytes:
    return struct.pack("!BBHII", 0x80, pt, seq & 0xFFFF, seq * 160, ssrc) + payload


class RtpMic:
    """A caller's microphone: one PCMU packet every 20 ms from its own thread, silence unless
    ``say`` queued audio (8 kHz), as a phone sends (voice activity detection needs the silence)."""

    def __init__(self, sock: socket.socket, target: tuple[str, int]) -> None:
        self.sock, self.target = sock, target
        self._queue: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def say(self, pcm_8k: np.ndarray) -> float:
        """Queue audio; returns how long it takes to play (s)."""
        frames = [pcm_8k[i : i + 160] for i in range(0, len(pcm_8k) - 159, 160)]
        with self._lock:
            self._queue.extend(frames)
            return len(self._queue) * 0.02

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        seq, start, silence = 0, time.monotonic(), np.zeros(160, np.int16)
        while not self._stop.is_set():
            with self._lock:
                frame = self._queue.pop(0) if self._queue else silence
            header = struct.pack("!BBHII", 0x80, 0, seq & 0xFFFF, (seq * 160) & 0xFFFFFFFF, 0xCA11)
            try:
                self.sock.sendto(header + pcm_to_ulaw(frame), self.target)
            except OSError:
                return
            seq += 1
            time.sleep(max(0.0, start + seq * 0.02 - time.monotonic()))


def routed_call_scenario(media_port: int, moved_port: int, *, hold_ms: int) -> str:
    """A call through a proxy that record-routes (a balancer in front of several replicas): every
    request after the INVITE goes to the Contact of the 200 OK along its Record-Route
    (``[next_url]``, ``[routes]``). INVITE (media at ``media_port``) -> 200 -> ACK; a re-INVITE that
    moves the media to ``moved_port`` -> 200 -> ACK; then the call is held ``hold_ms``: a BYE from
    the network in that time is answered 200 and ends it, else the caller's BYE ends it, answered
    200 (the replica holding the call), or 408/503 (the proxy: that replica is gone)."""

    def sdp(port: int, version: int) -> str:
        return (f"v=0\no=sipp 53655765 {version} IN IP4 127.0.0.1\ns=-\nc=IN IP4 127.0.0.1\nt=0 0\n"
                f"m=audio {port} RTP/AVP 0\na=rtpmap:0 PCMU/8000\na=ptime:20\na=sendrecv")

    dialog = """      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: "sipp" <sip:caller@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]"""
    tail = """      Contact: <sip:caller@[local_ip]:[local_port]>
      Max-Forwards: 70"""

    def in_dialog(method: str, cseq: int, body: str = "") -> str:
        content = "Content-Type: application/sdp\n      Content-Length: [len]\n\n" + body if body else "Content-Length: 0"
        return f"""
  <send retrans="500">
    <![CDATA[
      {method} [next_url] SIP/2.0
{dialog}
      CSeq: {cseq} {method}
      [routes]
{tail}
      {content}
    ]]>
  </send>"""

    def ack(cseq: int) -> str:
        return f"""
  <send>
    <![CDATA[
      ACK [next_url] SIP/2.0
{dialog}
      CSeq: {cseq} ACK
      [routes]
{tail}
      Content-Length: 0
    ]]>
  </send>"""

    return _wrap(f"""
  <send retrans="500">
    <![CDATA[
{INVITE_HEAD}
{tail}
      Content-Type: application/sdp
      Content-Length: [len]

{sdp(media_port, 1)}
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="200" rrs="true"/>{ack(1)}
  <pause milliseconds="500"/>{in_dialog("INVITE", 2, sdp(moved_port, 2))}
  <recv response="100" optional="true"/>
  <recv response="200"/>{ack(2)}
  <recv request="BYE" timeout="{hold_ms}" ontimeout="1"/>""" + reply_to_last("200 OK").replace("<send>", '<send next="2">') + f"""
  <label id="1"/>{in_dialog("BYE", 3)}
  <recv response="408" optional="true" next="2"/>
  <recv response="503" optional="true" next="2"/>
  <recv response="200"/>
  <label id="2"/>""")


def registrar_scenario(user: str, password: str, *, grant_s: int, refreshes: int) -> str:
    """sipp XML, as a provider's registrar: each REGISTER of one registration (one Call-ID) is
    challenged (401, MD5, qop=auth), its answer checked with sipp's own digest (``verifyauth``:
    a wrong one gets 403, and the registration then stalls, failing the run), and granted
    ``grant_s`` seconds; ``refreshes`` more after the first, then the removal (``Expires: 0``)."""

    def answer(status: str, extra: str = "", next_label: str = "") -> str:
        return f"""
  <send{f' next="{next_label}"' if next_label else ''}>
    <![CDATA[
      SIP/2.0 {status}
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]reg[call_number]
      [last_Call-ID:]
      [last_CSeq:]{extra}
      Content-Length: 0
    ]]>
  </send>"""

    def cycle(n: int, removal: bool) -> str:
        check = '\n    <action><ereg regexp="Expires: *0" search_in="msg" check_it="true" assign_to="removal"/></action>' if removal else ""
        challenge = '\n      WWW-Authenticate: Digest realm="trunk.example", nonce="[pid]n[call_number]c' + str(n) + '", qop="auth", algorithm=MD5'
        return f"""
  <recv request="REGISTER">{check}
  </recv>{answer("401 Unauthorized", challenge)}
  <recv request="REGISTER">
    <action><verifyauth assign_to="valid{n}" username="{user}" password="{password}"/></action>
  </recv>
  <nop hide="true" test="valid{n}" next="granted{n}"/>{answer("403 Forbidden")}
  <label id="granted{n}"/>{answer("200 OK", chr(10) + "      [last_Contact:];expires=" + ("0" if removal else str(grant_s)))}"""

    body = "".join(cycle(n, removal=False) for n in range(1 + refreshes)) + cycle(1 + refreshes, removal=True)
    return _wrap(body + '\n  <Reference variables="removal"/>')  # checked by its ereg, never read: sipp wants it named
