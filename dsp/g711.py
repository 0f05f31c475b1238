"""G.711 u-law and A-law (ITU-T G.711, as in the classic reference implementation and the old
stdlib ``audioop``), bit-exact."""

from __future__ import annotations

import numpy as np

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
