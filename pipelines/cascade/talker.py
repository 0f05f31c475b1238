"""The Talker / Code2Wav stage of the CPU cascade: Piper (VITS on onnxruntime) speaking text clause
by clause, so the first audio exists as soon as the Thinker has produced its first few words.

``clauses`` cuts a stream of text deltas at clause boundaries; ``PiperTalker.speak`` turns one clause
into int16 audio at the voice's rate (synchronous: run it on a dedicated thread).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np

# a boundary: clause punctuation, optional closing quotes/brackets, then whitespace
BOUNDARY = re.compile(r"[.!?;:,]+[\"')\]]*\s")
# words a clause can start with: a phrase break before them sounds natural
JOINERS = frozenset("and but or so because that which who when while if then to for with as than".split())
MAX_CLAUSE_WORDS = 24


def cut(text: str, min_words: int, max_words: int = MAX_CLAUSE_WORDS, hurry: int = 0) -> int:
    """Where the first clause of ``text`` ends (an index), or 0 when no clause is complete yet: at
    the first punctuation boundary with at least ``min_words`` words before it; failing that, with
    ``hurry`` (> 0) and at least that many words in, after the last complete word (before a joining
    word if one is near); else before a joining word ("and", "because", ...) once ``max_words // 2``
    words are in, or after ``max_words`` words. Only complete words count (a word is complete once
    whitespace follows)."""
    for m in BOUNDARY.finditer(text):
        if len(text[: m.end()].split()) >= min_words:
            return m.end()
    words = list(re.finditer(r"\S+\s", text))
    if hurry and len(words) >= hurry:
        for i in range(len(words) - 1, hurry - 1, -1):  # the latest break before a joining word
            if words[i].group().strip().lower() in JOINERS:
                return words[i - 1].end()
        return words[-1].end()
    for i in range(max(1, max_words // 2), min(len(words), max_words)):
        if words[i].group().strip().lower() in JOINERS:
            return words[i - 1].end()
    if len(words) >= max_words:
        return words[max_words - 1].end()
    return 0


@dataclass(frozen=True)
class ClausePolicy:
    """How the thinker's text is cut for the talker. The first clause decides when the first audio
    exists, so it is short: a punctuation boundary after ``first_words``, or ``first_max_words``
    words. Later clauses wait for a boundary after ``words`` (natural phrasing) unless the audio
    already made is less than ``low_water_s`` ahead of playback: then a stall is near, and a clause
    of ``hurry_words`` words goes now."""

    first_words: int = 1
    first_max_words: int = 3
    words: int = 5
    hurry_words: int = 2
    low_water_s: float = 0.8


async def clauses(deltas: AsyncIterator[str], policy: ClausePolicy = ClausePolicy(), ahead: Callable[[], float] | None = None) -> AsyncIterator[str]:
    """Regroup text deltas into clauses (whitespace kept, so the clauses concatenate to the text).
    ``ahead()``: seconds of audio made ahead of playback (None: never in a hurry after the first)."""
    pending = ""
    first = True
    async for delta in deltas:
        pending += delta
        while True:
            if first:
                end = cut(pending, policy.first_words, policy.first_max_words)
            else:
                hurry = policy.hurry_words if ahead is not None and ahead() < policy.low_water_s else 0
                end = cut(pending, policy.words, hurry=hurry)
            if not end:
                break
            yield pending[:end]
            pending = pending[end:]
            first = False
    if pending.strip():
        yield pending


class Playback:
    """Audio made for one answer against the clock its playback runs on (from its first audio):
    how far the talker is ahead of the listener."""

    def __init__(self) -> None:
        self.started = 0.0
        self.made = 0.0  # seconds of audio

    def add(self, seconds: float) -> None:
        if not self.started:
            self.started = time.perf_counter()
        self.made += seconds

    def ahead(self) -> float:
        return self.made - (time.perf_counter() - self.started) if self.started else 0.0


# Phonemes synthesised in one inference at most: a long sentence is spoken in pieces, so the
# largest buffers Piper needs are bounded whatever the text.
MAX_PHONEMES = 240


def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


class PiperTalker:
    def __init__(self, model_path: str, config_path: str, threads: int = 1) -> None:
        import onnxruntime as ort
        from piper import PiperConfig, PiperVoice, SynthesisConfig

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # share the cores politely
        # No arena: onnxruntime's grows in steps whenever its free space does not fit a request (a
        # longer sentence, or just fragmentation) and never shrinks; 1,200 clauses took a process
        # from 313 to 556 MiB and still rising. Without it, and the freed buffers handed back to
        # the system after each clause (malloc_trim), the same run stays within 143-154 MiB, for
        # ~9 ms more on a two-word clause (docs/cpu-agent.md, memory).
        so.enable_cpu_mem_arena = False
        self._trim = _malloc_trim()
        session = ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
        with open(config_path, encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        self.voice = PiperVoice(session=session, config=config)
        self.rate = int(config.sample_rate)
        # per-chunk loudness normalisation would make the level jump from clause to clause
        self.settings = SynthesisConfig(normalize_audio=False)

    def speak(self, text: str) -> np.ndarray:
        text = text.strip()
        if not text:
            return np.zeros(0, np.int16)
        pieces = [self._audio(piece) for sentence in self.voice.phonemize(text) for piece in split_phonemes(sentence, MAX_PHONEMES)]
        if self._trim is not None:
            self._trim(0)
        return lead_trimmed(np.concatenate(pieces), self.rate) if pieces else np.zeros(0, np.int16)

    def _audio(self, phonemes: list[str]) -> np.ndarray:
        """One inference: what ``PiperVoice.synthesize`` does per sentence with our settings
        (no normalisation, volume 1), on a piece of a sentence."""
        if not phonemes:
            return np.zeros(0, np.int16)
        audio = self.voice.phoneme_ids_to_audio(self.voice.phonemes_to_ids(phonemes), self.settings)
        return (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype(np.int16)


# Piper begins every clause with 30-70 ms below -45 dBFS before the voice: on the first clause of
# an answer that is latency the caller hears as silence (docs/cpu-agent.md, speed).
LEAD_DBFS = -45.0
LEAD_KEEP_MS = 10  # of it kept before the voice
LEAD_FADE_MS = 5


def lead_trimmed(pcm: np.ndarray, rate: int) -> np.ndarray:
    """``pcm`` from ``LEAD_KEEP_MS`` before its first 5 ms above ``LEAD_DBFS``, faded in over
    ``LEAD_FADE_MS`` (no click where the cut falls on low noise). Unchanged without such a frame."""
    frame = rate // 200
    n = len(pcm) // frame
    if not n:
        return pcm
    x = pcm[: n * frame].astype(np.float64).reshape(n, frame)
    loud = np.flatnonzero(np.sqrt((x**2).mean(axis=1)) > 32768 * 10 ** (LEAD_DBFS / 20))
    start = int(loud[0]) * frame - rate * LEAD_KEEP_MS // 1000 if len(loud) else 0
    if start <= 0:
        return pcm
    out = pcm[start:].copy()
    fade = min(len(out), rate * LEAD_FADE_MS // 1000)
    out[:fade] = (out[:fade] * np.linspace(0.0, 1.0, fade, endpoint=False)).astype(np.int16)
    return out


def split_phonemes(phonemes: list[str], most: int) -> list[list[str]]:
    """A sentence's phonemes in pieces of at most ``most``, cut after a word (a space) where one is
    near the limit, else at the limit."""
    pieces = []
    while len(phonemes) > most:
        space = max((i for i in range(most // 2, most) if phonemes[i] == " "), default=most - 1)
        pieces.append(phonemes[: space + 1])
        phonemes = phonemes[space + 1 :]
    return [*pieces, phonemes] if phonemes else pieces
