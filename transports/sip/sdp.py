"""The little SDP (RFC 4566 / 3264 offer-answer) a G.711 phone call needs.

A SIP trunk offers one audio stream with a list of payload types; we pick the first of PCMU (0)
or PCMA (8) in the caller's order of preference, keep ``telephone-event`` (RFC 4733 DTMF) when it
is offered at 8 kHz, and answer with our RTP address. Everything else in the offer (video, SRTP
profiles, other codecs) is declined by leaving it out or, for extra media lines, answering them
with port 0 as RFC 3264 requires.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field

G711 = {0: "PCMU", 8: "PCMA"}  # static payload types (RFC 3551)
G711_BY_NAME = {v: k for k, v in G711.items()}


class SdpError(ValueError):
    """The offer cannot be used: ``status`` is the SIP answer (400 malformed, 488 no common codec)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class MediaLine:
    kind: str
    port: int
    proto: str
    formats: list[str]
    rtpmap: dict[int, str] = field(default_factory=dict)  # payload type -> "name/rate"
    address: str | None = None  # a media-level c= line
    direction: str = "sendrecv"


@dataclass
class Offer:
    address: str  # where the caller wants our RTP
    port: int
    codec: int  # the payload type we chose: 0 or 8
    dtmf: int | None  # the telephone-event payload type, when offered
    ptime: int
    media: list[MediaLine]
    audio_index: int


def parse_offer(text: str) -> Offer:
    session_address: str | None = None
    media: list[MediaLine] = []
    for raw in text.splitlines():
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        key, value = line[0], line[2:]
        if key == "c":
            parts = value.split()
            if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
                raise SdpError(f"unsupported connection line c={value}", 488)
            address = parts[2].split("/")[0]
            if media:
                media[-1].address = address
            else:
                session_address = address
        elif key == "m":
            parts = value.split()
            if len(parts) < 4:
                raise SdpError(f"malformed media line m={value}", 400)
            try:
                port = int(parts[1].split("/")[0])
            except ValueError:
                raise SdpError(f"malformed media port in m={value}", 400) from None
            if not 0 <= port <= 65535:
                raise SdpError(f"media port out of range in m={value}", 400)
            media.append(MediaLine(parts[0], port, parts[2], parts[3:]))
        elif key == "a" and media:
            m = media[-1]
            if value.startswith("rtpmap:"):
                pt, _, enc = value[7:].partition(" ")
                if pt.isdigit():
                    m.rtpmap[int(pt)] = enc.strip()
            elif value in ("sendrecv", "sendonly", "recvonly", "inactive"):
                m.direction = value
    audio = [i for i, m in enumerate(media) if m.kind == "audio" and m.port != 0]
    if not audio:
        raise SdpError("the offer has no audio stream", 488)
    index = audio[0]
    m = media[index]
    if m.proto not in ("RTP/AVP", "RTP/AVPF"):
        raise SdpError(f"unsupported media profile {m.proto} (only plain RTP/AVP)", 488)
    given = m.address or session_address
    if given is None:
        raise SdpError("the offer has no connection address", 400)
    try:  # an IP literal: a name would be resolved on every 20 ms tick, blocking every call
        ip = str(ipaddress.ip_address(given))
    except ValueError:
        raise SdpError(f"the connection address {given[:100]!r} is not an IP address", 488) from None
    codec = None
    dtmf: int | None = None
    for fmt in m.formats:
        if not fmt.isdigit():
            continue
        payload = int(fmt)
        name = m.rtpmap.get(payload, G711.get(payload, "") + "/8000").upper()
        if codec is None and name in ("PCMU/8000", "PCMA/8000"):
            codec = G711_BY_NAME[name.split("/")[0]]
        elif dtmf is None and name.startswith("TELEPHONE-EVENT/8000"):
            dtmf = payload
    if codec is None:
        raise SdpError("no common codec: this server speaks PCMU and PCMA", 488)
    return Offer(ip, m.port, codec, dtmf, 20, media, index)


_session_version = int(time.time())


def answer(offer: Offer, address: str, port: int, *, session_id: int) -> str:
    """The answer: one line per offered media line (RFC 3264 section 6), ours first-class for the
    chosen audio stream and port 0 for the rest."""
    global _session_version
    _session_version += 1
    lines = [
        "v=0",
        f"o=realtime-omni {session_id} {_session_version} IN IP4 {address}",
        "s=realtime-omni",
        f"c=IN IP4 {address}",
        "t=0 0",
    ]
    for i, m in enumerate(offer.media):
        if i != offer.audio_index:
            lines.append(f"m={m.kind} 0 {m.proto} {' '.join(m.formats)}")
            continue
        formats = [str(offer.codec)] + ([str(offer.dtmf)] if offer.dtmf is not None else [])
        lines.append(f"m=audio {port} RTP/AVP {' '.join(formats)}")
        lines.append(f"a=rtpmap:{offer.codec} {G711[offer.codec]}/8000")
        if offer.dtmf is not None:
            lines.append(f"a=rtpmap:{offer.dtmf} telephone-event/8000")
            lines.append(f"a=fmtp:{offer.dtmf} 0-15")
        lines.append("a=ptime:20")
        lines.append("a=sendrecv")
    return "\r\n".join(lines) + "\r\n"
