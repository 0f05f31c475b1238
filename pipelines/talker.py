"""The Talker / Code2Wav stage of the CPU cascade: Piper (VITS on onnxruntime) speaking text clause
by clause, so the first audio exists as soon as the Thinker has produced its first few words.

``clauses`` cuts a stream of text deltas at clause boundaries; ``PiperTalker.speak`` turns one clause
into int16 audio at the voice's rate (synchronous: run it on a dedicated thread).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import numpy as np

# a boundary: clause punctuation, optional closing quotes/brackets, then whitespace
BOUNDARY = re.compile(r"[.!?;:,]+[\"')\]]*\s")
# words a clause can start with: a phrase break before them sounds natural
JOINERS = frozenset("and but or so because that which who when while if then to for with as than".split())
MAX_CLAUSE_WORDS = 24


def cut(text: str, min_words: int, max_words: int = MAX_CLAUSE_WORDS) -> int:
    """Where the first clause of ``text`` ends (an index), or 0 when no clause is complete yet: at
    the first punctuation boundary with at least ``min_words`` words before it; failing that, before
    a joining word ("and", "because", ...) once ``max_words // 2`` words are in, or after
    ``max_words`` words. Only complete words count (a word is complete once whitespace follows)."""
    for m in BOUNDARY.finditer(text):
        if len(text[: m.end()].split()) >= min_words:
            return m.end()
    words = list(re.finditer(r"\S+\s", text))
    for i in range(max(1, max_words // 2), min(len(words), max_words)):
        if words[i].group().strip().lower() in JOINERS:
            return words[i - 1].end()
    if len(words) >= max_words:
        return words[max_words - 1].end()
    return 0


async def clauses(deltas: AsyncIterator[str], first_words: int = 1, words: int = 5, first_max: int = 10) -> AsyncIterator[str]:
    """Regroup text deltas into clauses (whitespace kept, so the clauses concatenate to the text).
    The first clause is kept short (at most ``first_max`` words): it decides when the first audio
    exists; later ones are longer, since the talker is ahead of playback by then."""
    pending = ""
    first = True
    async for delta in deltas:
        pending += delta
        while end := (cut(pending, first_words, first_max) if first else cut(pending, words)):
            yield pending[:end]
            pending = pending[end:]
            first = False
    if pending.strip():
        yield pending


class PiperTalker:
    def __init__(self, model_path: str, config_path: str, threads: int = 1) -> None:
        import onnxruntime as ort
        from piper import PiperConfig, PiperVoice, SynthesisConfig

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # share the cores politely
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
        chunks = [np.asarray(c.audio_int16_array, dtype=np.int16) for c in self.voice.synthesize(text, self.settings)]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
