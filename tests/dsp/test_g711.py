"""G.711 (dsp/g711.py) against the classic reference algorithm: the CCITT coder as the public
domain Sun ``g711.c`` writes it (the one behind the old stdlib ``audioop``), restated below sample
by sample with its segment search. Our table-driven codec must agree on every one of the 65,536
int16 inputs and every one of the 256 codes; then what the codec itself promises: codes survive a
round trip, and a sample comes back within its segment's half step."""

from __future__ import annotations

import numpy as np
import pytest

from dsp import g711

SEG_UEND = (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)
SEG_AEND = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)
BIAS, CLIP = 0x84, 8159


def search(value: int, ends: tuple[int, ...]) -> int:
    for i, end in enumerate(ends):
        if value <= end:
            return i
    return len(ends)


def linear2ulaw(pcm: int) -> int:
    pcm >>= 2  # 14-bit
    if pcm < 0:
        pcm, mask = -pcm, 0x7F
    else:
        mask = 0xFF
    pcm = min(pcm, CLIP) + (BIAS >> 2)
    seg = search(pcm, SEG_UEND)
    if seg >= 8:
        return 0x7F ^ mask
    return ((seg << 4) | ((pcm >> (seg + 1)) & 0x0F)) ^ mask


def ulaw2linear(code: int) -> int:
    code = ~code & 0xFF
    t = (((code & 0x0F) << 3) + BIAS) << ((code & 0x70) >> 4)
    return BIAS - t if code & 0x80 else t - BIAS


def linear2alaw(pcm: int) -> int:
    pcm >>= 3  # 13-bit
    if pcm >= 0:
        mask = 0xD5
    else:
        mask, pcm = 0x55, -pcm - 1
    seg = search(pcm, SEG_AEND)
    if seg >= 8:
        return 0x7F ^ mask
    quant = (pcm >> 1) if seg < 2 else (pcm >> seg)
    return ((seg << 4) | (quant & 0x0F)) ^ mask


def alaw2linear(code: int) -> int:
    code ^= 0x55
    t = (code & 0x0F) << 4
    seg = (code & 0x70) >> 4
    if seg == 0:
        t += 8
    elif seg == 1:
        t += 0x108
    else:
        t = (t + 0x108) << (seg - 1)
    return t if code & 0x80 else -t


EVERY_SAMPLE = np.arange(-32768, 32768, dtype=np.int16)
EVERY_CODE = bytes(range(256))
LAWS = {
    "ulaw": (g711.pcm_to_ulaw, g711.ulaw_to_pcm, linear2ulaw, ulaw2linear),
    "alaw": (g711.pcm_to_alaw, g711.alaw_to_pcm, linear2alaw, alaw2linear),
}


@pytest.mark.parametrize("law", LAWS)
def test_encoding_every_sample_is_bit_exact_with_the_reference(law: str) -> None:
    encode, _, reference, _ = LAWS[law]
    assert encode(EVERY_SAMPLE) == bytes(reference(int(x)) for x in EVERY_SAMPLE)


@pytest.mark.parametrize("law", LAWS)
def test_decoding_every_code_is_bit_exact_with_the_reference(law: str) -> None:
    _, decode, _, reference = LAWS[law]
    assert decode(EVERY_CODE).tolist() == [reference(c) for c in EVERY_CODE]


def test_well_known_codes() -> None:
    # silence, the smallest step, and full scale in both laws (G.711's tables)
    assert g711.ulaw_to_pcm(bytes([0xFF, 0x7F, 0x00, 0x80])).tolist() == [0, 0, -32124, 32124]
    assert g711.alaw_to_pcm(bytes([0xD5, 0x55, 0x2A, 0xAA])).tolist() == [8, -8, -32256, 32256]
    assert g711.pcm_to_ulaw(np.array([0, -1, 32767, -32768], np.int16)) == bytes([0xFF, 0x7E, 0x80, 0x00])
    assert g711.pcm_to_alaw(np.array([0, -1, 32767, -32768], np.int16)) == bytes([0xD5, 0x55, 0xAA, 0x2A])


def test_every_code_survives_a_round_trip() -> None:
    assert g711.pcm_to_alaw(g711.alaw_to_pcm(EVERY_CODE)) == EVERY_CODE
    # u-law has two zeros: "negative zero" (0x7F) decodes to 0, which encodes as 0xFF
    assert g711.pcm_to_ulaw(g711.ulaw_to_pcm(EVERY_CODE)) == EVERY_CODE.replace(b"\x7f", b"\xff")


@pytest.mark.parametrize("law", LAWS)
def test_a_sample_comes_back_monotonic_and_within_its_segments_half_step(law: str) -> None:
    encode, decode, _, _ = LAWS[law]
    back = decode(encode(EVERY_SAMPLE)).astype(np.int64)
    x = EVERY_SAMPLE.astype(np.int64)
    assert np.all(np.diff(back) >= 0)  # a louder sample never comes back quieter
    # half a step: 4 bits of mantissa make a step about 1/16 of its segment's floor, so the error
    # is within 1/30 of the sample, and within 8 (half the smallest step) near zero; up to the clip
    unclipped = np.abs(x) < {"ulaw": 32124, "alaw": 32256}[law]
    error = np.abs(back - x)[unclipped]
    assert np.all(error <= np.abs(x[unclipped]) / 30 + 8)
    assert decode(encode(np.array([32767, -32768], np.int16))).tolist() == ({"ulaw": [32124, -32124], "alaw": [32256, -32256]}[law])
