"""Audio at the edge: the wire formats, and the one conversion step each way.

Inside the server, audio is mono int16 numpy at the pipeline's rates. A connection converts its
wire format (pcm16 24 kHz, G.711 u-law / A-law 8 kHz) to the pipeline's input rate once on the way
in, and the pipeline's output rate to the wire once on the way out; nothing else resamples.
"""

from __future__ import annotations

import binascii
import enum

import numpy as np

from dsp.g711 import alaw_to_pcm, pcm_to_alaw, pcm_to_ulaw, ulaw_to_pcm
from dsp.resample import Resampler

from ..errors import invalid_value


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
