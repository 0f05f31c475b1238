"""A minimal SIP phone for the benchmarks: INVITE/ACK/BYE over UDP and G.711 RTP both ways.

Media runs in threads of its own (one sender clock for all calls, one receiver with a selector), not
on an event loop, so the measurements see the server's timing rather than the client's. Arrival
times are ``time.monotonic()``.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from dsp.g711 import pcm_to_ulaw, ulaw_to_pcm

FRAME = 160  # 20 ms at 8 kHz


def _tag(header: str) -> str:
    for part in header.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key == "tag":
            return value
    return ""


@dataclass
class Phone:
    """One call: its SIP dialog and its RTP socket."""

    server: tuple[str, int]
    call_id: str
    sip: socket.socket = field(init=False)
    rtp: socket.socket = field(init=False)
    remote_rtp: tuple[str, int] | None = None
    to_tag: str = ""
    status: int = 0
    # what arrives: (arrival time, rtp seq, PCMU payload)
    received: list[tuple[float, int, bytes]] = field(default_factory=list)
    seq: int = 0

    def __post_init__(self) -> None:
        self.sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sip.bind(("127.0.0.1", 0))
        self.sip.settimeout(10)
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind(("127.0.0.1", 0))
        self.rtp.setblocking(False)

    def _request(self, method: str, cseq: int, body: str = "") -> bytes:
        sip_port = self.sip.getsockname()[1]
        to = f"<sip:agent@{self.server[0]}>" + (f";tag={self.to_tag}" if self.to_tag else "")
        ctype = "Content-Type: application/sdp\r\n" if body else ""
        return (
            f"{method} sip:agent@{self.server[0]}:{self.server[1]} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{sip_port};branch=z9hG4bK{self.call_id}{method}{cseq}\r\n"
            f"From: <sip:bench@127.0.0.1>;tag=b{self.call_id}\r\nTo: {to}\r\nCall-ID: {self.call_id}\r\nCSeq: {cseq} {method}\r\n"
            f"Contact: <sip:bench@127.0.0.1:{sip_port}>\r\nMax-Forwards: 70\r\n{ctype}Content-Length: {len(body)}\r\n\r\n{body}"
        ).encode()

    def dial(self) -> int:
        rtp_port = self.rtp.getsockname()[1]
        sdp = f"v=0\r\no=bench 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio {rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
        self.sip.sendto(self._request("INVITE", 1, sdp), self.server)
        while True:
            data = self.sip.recv(65535).decode()
            status = int(data.split(" ", 2)[1])
            if status >= 200:
                break
        self.status = status
        headers = dict(line.split(":", 1) for line in data.split("\r\n\r\n")[0].split("\r\n")[1:] if ":" in line)
        self.to_tag = _tag(headers.get("To", ""))
        self.sip.sendto(self._request("ACK", 1), self.server)
        if status == 200:
            port = int(data.split("m=audio ")[1].split()[0])
            self.remote_rtp = (self.server[0], port)
        return status

    def hangup(self) -> None:
        if self.status == 200:
            self.sip.sendto(self._request("BYE", 2), self.server)
            try:
                self.sip.recv(65535)
            except OSError:
                pass
        self.sip.close()
        self.rtp.close()

    def packet(self, payload: bytes) -> bytes:
        header = struct.pack("!BBHII", 0x80, 0, self.seq & 0xFFFF, (self.seq * FRAME) & 0xFFFFFFFF, 0xBEEF)
        self.seq += 1
        return header + payload


def pcm(payload: bytes) -> np.ndarray:
    return ulaw_to_pcm(payload)


class Media:
    """Plays each phone's script (8 kHz PCM, looped) on one steady 20 ms clock, and records what
    every phone receives."""

    def __init__(self, phones: list[Phone], scripts: list[np.ndarray]) -> None:
        self.phones = phones
        self.frames = [[pcm_to_ulaw(f) for f in s[: len(s) // FRAME * FRAME].reshape(-1, FRAME)] for s in scripts]  # encoded once
        self.started = 0.0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True), threading.Thread(target=self._receive, daemon=True)]

    def start(self) -> None:
        self.started = time.monotonic()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _send(self) -> None:
        """Phone ``i`` sends at ``i / n`` of each 20 ms period: independent phones are not in
        phase, and a burst of every call's packet at one instant is not what a server sees."""
        tick = 0
        n = max(1, len(self.phones))
        while not self._stop.is_set():
            for i, (phone, frames) in enumerate(zip(self.phones, self.frames)):
                delay = self.started + (tick + i / n) * 0.02 - time.monotonic()
                if delay > 0.0005:
                    time.sleep(delay)
                if phone.remote_rtp is not None:
                    try:
                        phone.rtp.sendto(phone.packet(frames[tick % len(frames)]), phone.remote_rtp)
                    except OSError:
                        pass
            tick += 1

    def _receive(self) -> None:
        sel = selectors.DefaultSelector()
        for phone in self.phones:
            sel.register(phone.rtp, selectors.EVENT_READ, phone)
        while not self._stop.is_set():
            for key, _ in sel.select(0.1):
                phone = key.data
                while True:
                    try:
                        data = phone.rtp.recv(2048)
                    except (BlockingIOError, OSError):
                        break
                    now = time.monotonic()
                    seq = struct.unpack_from("!H", data, 2)[0]
                    phone.received.append((now, seq, data[12:]))
        sel.close()
