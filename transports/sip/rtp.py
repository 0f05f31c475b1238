"""RTP for a G.711 phone call (RFC 3550, 3551, 4733): packets, the receive-side jitter buffer,
DTMF events, and the send-side packet header state.

Why the jitter buffer is event-driven and not a clock: the caller's audio goes to the session's
voice activity detector and the model, not to a loudspeaker, so arrival-time jitter costs nothing
as long as the frames come out in order and gaps are filled. Frames are therefore released as
soon as they are in sequence; only a gap makes the buffer wait, for up to ``depth`` later packets,
for the missing one to turn up (reordering) before concealing it (loss). The depth adapts: a
packet that arrives after its slot was concealed widens it (up to ``max_depth``), and a long run
without one narrows it again, so a clean network adds no delay at all.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dsp.g711 import alaw_to_pcm, pcm_to_alaw, pcm_to_ulaw, ulaw_to_pcm

RATE = 8000
FRAME_SAMPLES = 160  # 20 ms at 8 kHz
HEADER = struct.Struct("!BBHII")

DTMF_EVENTS = "0123456789*#ABCD"

DECODERS: dict[int, Callable[[bytes], np.ndarray]] = {0: ulaw_to_pcm, 8: alaw_to_pcm}
ENCODERS: dict[int, Callable[[np.ndarray], bytes]] = {0: pcm_to_ulaw, 8: pcm_to_alaw}


@dataclass(slots=True)
class Packet:
    payload_type: int
    seq: int
    timestamp: int
    ssrc: int
    marker: bool
    payload: bytes


def parse(data: bytes) -> Packet | None:
    """An RTP packet, or None for anything that is not one (RTCP, junk, version != 2)."""
    if len(data) < HEADER.size:
        return None
    b0, b1, seq, ts, ssrc = HEADER.unpack_from(data)
    if b0 >> 6 != 2:
        return None
    pt = b1 & 0x7F
    if 72 <= pt <= 76:  # RTCP sharing the port (RFC 5761): not audio
        return None
    offset = HEADER.size + 4 * (b0 & 0x0F)
    if b0 & 0x10:  # header extension: skip it
        if len(data) < offset + 4:
            return None
        offset += 4 + 4 * struct.unpack_from("!H", data, offset + 2)[0]
    end = len(data)
    if b0 & 0x20:  # padding: the last byte says how much
        if end <= offset:
            return None
        end -= data[-1]
    if end < offset:
        return None
    return Packet(pt, seq, ts, ssrc, bool(b1 & 0x80), data[offset:end])


def build(p: Packet) -> bytes:
    return HEADER.pack(0x80, (0x80 if p.marker else 0) | p.payload_type, p.seq & 0xFFFF, p.timestamp & 0xFFFFFFFF, p.ssrc) + p.payload


class Sender:
    """The header state of our outgoing stream: a random SSRC, sequence number and timestamp
    origin (RFC 3550 5.1), the timestamp advancing 160 per 20 ms frame, and the marker bit on the
    first packet of each talkspurt (RFC 3551 4.1)."""

    def __init__(self, payload_type: int) -> None:
        self.payload_type = payload_type
        self.encode = ENCODERS[payload_type]
        self.ssrc = random.getrandbits(32)
        self.seq = random.getrandbits(16)
        self.timestamp = random.getrandbits(32)
        self._talking = False

    def packet(self, pcm: np.ndarray, *, speech: bool) -> bytes:
        marker = speech and not self._talking
        self._talking = speech
        data = build(Packet(self.payload_type, self.seq, self.timestamp, self.ssrc, marker, self.encode(pcm)))
        self.seq = (self.seq + 1) & 0xFFFF
        self.timestamp = (self.timestamp + len(pcm)) & 0xFFFFFFFF
        return data


class JitterBuffer:
    """Orders 20 ms G.711 frames and conceals lost ones (see the module docstring)."""

    def __init__(self, payload_type: int, *, depth: int = 2, max_depth: int = 10, capacity: int = 64) -> None:
        self.decode = DECODERS[payload_type]
        self.payload_type = payload_type
        self.min_depth = depth
        self.depth = depth
        self.max_depth = max_depth
        self.capacity = capacity  # frames held at most: a bound whatever the sender does
        self._held: dict[int, bytes] = {}  # extended seq -> payload
        self._next: int | None = None  # extended seq of the next frame to release
        self._last: np.ndarray | None = None
        self._concealed_run = 0
        self._clean = 0
        self.received = 0
        self.late = 0
        self.lost = 0
        self.duplicates = 0

    def _extend(self, seq: int) -> int:
        """Sequence numbers wrap at 65536: place ``seq`` nearest the expected one."""
        if self._next is None:
            return seq
        base = self._next
        ext = (base & ~0xFFFF) | seq
        if ext - base > 0x8000:
            ext -= 0x10000
        elif base - ext > 0x8000:
            ext += 0x10000
        return ext

    def put(self, seq: int, payload: bytes) -> list[np.ndarray]:
        """Take one packet; returns the frames (PCM at 8 kHz) now ready, in order."""
        self.received += 1
        ext = self._extend(seq)
        if self._next is None:
            self._next = ext
        if ext < self._next:
            if self._next - ext > 3 * self.max_depth:  # far behind: the sender restarted its numbering
                self._held.clear()
                self._next = ext
            else:
                self.late += 1  # its slot was already concealed: wait longer from now on
                self.depth = min(self.max_depth, self.depth + 1)
                self._clean = 0
                return []
        if ext in self._held:
            self.duplicates += 1
            return []
        if ext - self._next > 50 * self.max_depth:  # a jump (new talkspurt numbering): start over there
            self._held.clear()
            self._next = ext
        self._held[ext] = payload
        return self._release()

    def _release(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        assert self._next is not None
        while self._held:
            payload = self._held.pop(self._next, None)
            if payload is not None:
                frame = self.decode(payload)
                self._last = frame
                self._concealed_run = 0
                self._clean += 1
                if self._clean >= 500 and self.depth > self.min_depth:  # 10 s without a late packet
                    self.depth -= 1
                    self._clean = 0
            elif len(self._held) >= self.depth or len(self._held) >= self.capacity or max(self._held) - self._next > self.max_depth * 4:
                frame = self._conceal()  # waited long enough: it is lost
            else:
                break  # a gap: give the missing packet a chance to arrive
            out.append(frame)
            self._next += 1
        return out

    def _conceal(self) -> np.ndarray:
        """Repeat the last frame, fading (a short loss is then inaudible to VAD and ASR); a long
        one becomes silence."""
        self.lost += 1
        self._concealed_run += 1
        if self._last is None or self._concealed_run > 3:
            return np.zeros(FRAME_SAMPLES, np.int16)
        gain = 0.5**self._concealed_run
        return (self._last.astype(np.float32) * gain).astype(np.int16)


class DtmfReceiver:
    """RFC 4733 telephone-events: one event is sent as many packets (same RTP timestamp, growing
    duration, the end packet repeated three times); report each event once, on its first packet."""

    def __init__(self) -> None:
        self._seen: list[int] = []  # recent event timestamps (bounded)

    def put(self, p: Packet) -> str | None:
        if len(p.payload) < 4:
            return None
        event = p.payload[0]
        if event >= len(DTMF_EVENTS) or p.timestamp in self._seen:
            return None
        self._seen.append(p.timestamp)
        del self._seen[:-16]
        return DTMF_EVENTS[event]
