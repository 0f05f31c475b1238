"""Audio at the edge: wire formats, G.711, and the one resampling step each way.

Inside the server, audio is mono int16 numpy at the pipeline's rates. A connection converts its
wire format (pcm16 24 kHz, G.711 u-law / A-law 8 kHz) to the pipeline's input rate once on the way
in, and the pipeline's output rate to the wire once on the way out; nothing else resamples.
"""

from __future__ import annotations

import binascii
import enum

import numpy as np
import soxr

from .errors import invalid_value

# ---------------------------------------------------------------------------------------------
# G.711 (ITU-T G.711, as in the classic reference implementation and the old stdlib ``audioop``)
# Built once as lookup tables: decode is a 256-entry table, encode a 65536-entry one indexed by the
# int16 sample's bit pattern, so a frame converts with one numpy take.
# ---------------------------------------------------------------------------------------------


def _segment(values: np.ndarray, ends: tuple[int, ...]) -> np.ndarray:
    """Index of the first segment end >= value (8 when past the last)."""
    return np.searchsorted(np.asarray(ends), values, side="left")


def _ulaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), 8159) + (0x84 >> 2)
    seg = _segment(mag, (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF))
    uval = (np.minimum(seg, 7) << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0xF)
    out = np.where(seg >= 8, 0x7F ^ mask, uval ^ mask).astype(np.uint8)
    return np.roll(out, -32768)  # index by the sample's uint16 bit pattern


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)


def _alaw_encode_table() -> np.ndarray:
    pcm = np.arange(-32768, 32768, dtype=np.int32) >> 3
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = _segment(mag, (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF))
    s = np.minimum(seg, 7)
    quant = np.where(s < 2, mag >> 1, mag >> np.maximum(s, 1)) & 0x0F
    aval = (s << 4) | quant
    out = np.where(seg >= 8, 0x7F ^ mask, aval ^ mask).astype(np.uint8)
    return np.roll(out, -32768)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


ULAW_ENCODE, ULAW_DECODE = _ulaw_encode_table(), _ulaw_decode_table()
ALAW_ENCODE, ALAW_DECODE = _alaw_encode_table(), _alaw_decode_table()


def ulaw_to_pcm(data: bytes) -> np.ndarray:
    return ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def pcm_to_ulaw(pcm: np.ndarray) -> bytes:
    return ULAW_ENCODE[pcm.view(np.uint16)].tobytes()


def alaw_to_pcm(data: bytes) -> np.ndarray:
    return ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def pcm_to_alaw(pcm: np.ndarray) -> bytes:
    return ALAW_ENCODE[pcm.view(np.uint16)].tobytes()


# ---------------------------------------------------------------------------------------------
# Wire formats
# ---------------------------------------------------------------------------------------------


class WireFormat(enum.Enum):
    PCM16 = ("audio/pcm", 24000, 2)
    PCMU = ("audio/pcmu", 8000, 1)
    PCMA = ("audio/pcma", 8000, 1)

    def __init__(self, mime: str, rate: int, sample_bytes: int) -> None:
        self.mime = mime
        self.rate = rate
        self.sample_bytes = sample_bytes

    @classmethod
    def from_mime(cls, mime: str) -> "WireFormat":
        for f in cls:
            if f.mime == mime:
                return f
        raise ValueError(f"unknown audio format {mime!r}")

    def decode(self, data: bytes) -> np.ndarray:
        if self is WireFormat.PCM16:
            return np.frombuffer(data, dtype="<i2").astype(np.int16, copy=False)
        return ulaw_to_pcm(data) if self is WireFormat.PCMU else alaw_to_pcm(data)

    def encode(self, pcm: np.ndarray) -> bytes:
        if self is WireFormat.PCM16:
            return pcm.astype("<i2", copy=False).tobytes()
        return pcm_to_ulaw(pcm) if self is WireFormat.PCMU else pcm_to_alaw(pcm)

    def duration_ms(self, nbytes: int) -> float:
        return nbytes / self.sample_bytes * 1000.0 / self.rate


def wire_bytes(b64: str, fmt: WireFormat, param: str) -> bytes:
    """Base64 audio from a client event, checked: valid base64 and whole samples of ``fmt``."""
    try:
        data = binascii.a2b_base64(b64, strict_mode=True)
    except (binascii.Error, ValueError):
        raise invalid_value(param, f"Invalid '{param}': not valid base64.") from None
    if len(data) % fmt.sample_bytes:
        raise invalid_value(
            param, f"Invalid '{param}': {fmt.mime} audio is {fmt.sample_bytes}-byte samples, got {len(data)} bytes."
        )
    return data


# ---------------------------------------------------------------------------------------------
# Resampling
# ---------------------------------------------------------------------------------------------


class Resampler:
    """Streaming int16 resampler (soxr); a no-op when the rates match.

    soxr holds back a few milliseconds of output until it has seen what follows; ``flush`` drains
    it at the end of a stream (a commit, the end of a response) and starts a fresh stream.
    Timing is exact: output sample n is input time n / out_rate, whatever the buffering.
    """

    __slots__ = ("in_rate", "out_rate", "_stream")

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = self._new() if in_rate != out_rate else None

    def _new(self) -> soxr.ResampleStream:
        return soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="int16", quality="HQ")

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        if self._stream is None:
            return pcm
        return self._stream.resample_chunk(pcm)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.int16)
        tail = self._stream.resample_chunk(np.zeros(0, np.int16), last=True)
        self._stream = self._new()
        return tail


def resample(pcm: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot resampling of a whole clip."""
    if in_rate == out_rate or len(pcm) == 0:
        return pcm
    return soxr.resample(pcm, in_rate, out_rate, quality="HQ")


class InputConverter:
    """Wire bytes -> int16 at the pipeline's input rate.

    soxr's stream holds back 20-36 ms of 20 ms appends, so each turn's end reaches the turn
    detector that much later; ``PolyphaseResampler`` holds nothing but costs ~20 us more per append,
    which took the WebSocket load test (100 sessions on two cores) past its budget. WebSocket input
    stays on soxr; the media transports (one stream per call, their own clocks) use the polyphase
    filter."""

    def __init__(self, fmt: WireFormat, rate: int) -> None:
        self.format = fmt
        self.rate = rate
        self._resample = Resampler(fmt.rate, rate)

    def __call__(self, data: bytes) -> np.ndarray:
        return self._resample(self.format.decode(data))

    def flush(self) -> np.ndarray:
        return self._resample.flush()


class OutputConverter:
    """int16 at the pipeline's output rate -> wire bytes; one per response (streams restart)."""

    def __init__(self, rate: int, fmt: WireFormat) -> None:
        self.format = fmt
        self.rate = rate
        self._resample = Resampler(rate, fmt.rate)

    def __call__(self, pcm: np.ndarray) -> bytes:
        return self.format.encode(self._resample(pcm))

    def flush(self) -> bytes:
        return self.format.encode(self._resample.flush())


def samples_to_ms(samples: int, rate: int) -> int:
    return samples * 1000 // rate


def ms_to_samples(ms: float, rate: int) -> int:
    return int(round(ms * rate / 1000.0))
