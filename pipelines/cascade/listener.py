"""The Listener stage: Whisper (faster-whisper's CTranslate2 model, int8) turning user audio into text.

Whisper is trained on 30 s windows, and a stock call encodes all of them whatever the clip's length
(~0.33 s of tiny.en's 0.45 s on two cores for a 2 s question). A spoken turn is a few seconds, so
by default (``window: fit``) the encoder gets only the clip plus ``margin_s`` of silence, rounded up
to whole seconds. On our 15 spoken fixtures that took tiny.en from 0.45 s to 0.13 s per call; 11
transcripts were identical to the full window's and the others differed by a word either way
(``bench`` notes). With less silence (1 s) the decoder sometimes loops, repeating the sentence:
5 s avoids that, and ``_unloop`` cuts any repetition left. ``window: full`` keeps the stock
behaviour. Calls are synchronous: run them on a dedicated thread.

``hear`` also says how sure Whisper is that the words end where it stopped them: the probability of
the last word it wrote, times that of an end mark (".", "?", "!") or the end of the text after it,
read from the decoder's own distributions (CTranslate2's ``return_logits_vocab``) in the same pass.
Given a sentence cut at a pause, tiny.en often writes an ending nobody said ("a table for it."),
but it is unsure of it: after "for", " it" 0.43 and the end 0.22. semantic_vad weighs it beside the
thinker's judgement, or alone (``turn_end.judge: listener``); docs/turn-taking.md measures both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

import numpy as np

from pipelines.cascade.keywords import respell
from pipelines.sentences import QUOTES, piece_ends_sentence

FRAMES_PER_SECOND = 100  # log-mel frames (10 ms hop)
FULL_FRAMES = 3000


class Words(NamedTuple):
    text: str
    ends: float | None  # P(the words end a sentence where they stop), the listener's own; None: no words
    tokens: tuple[int, ...] = ()  # the listener's tokens for them, for a later pass to go on from (Moonshine's)


class Listener(Protocol):
    """A speech recogniser of the cascade (``WhisperListener``, ``MoonshineListener``): synchronous,
    run on the pipeline's ASR thread."""

    rate: int

    def transcribe(self, pcm: np.ndarray) -> str: ...

    def hear(self, pcm: np.ndarray, ends: bool = True, hint: tuple[int, ...] = (), keywords: tuple[str, ...] = ()) -> Words:
        """int16 mono at ``rate`` -> the words (with ``ends``: how sure it is they end there);
        ``hint``: the tokens of an earlier pass over the clip's beginning, where the listener can
        go on from them; ``keywords``: words or phrases to expect (a session's)."""
        ...


class WhisperListener:
    rate = 16000

    def __init__(
        self,
        model_dir: str,
        threads: int = 2,
        beam_size: int = 1,
        language: str = "en",
        window: Literal["fit", "full"] = "fit",
        margin_s: float = 5.0,
    ) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        self.whisper = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=threads)
        multilingual = self.whisper.model.is_multilingual
        self.tokenizer = Tokenizer(self.whisper.hf_tokenizer, multilingual, task="transcribe", language=language if multilingual else None)
        self.prompt = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self.beam_size = beam_size
        self.window = window
        self.margin_s = margin_s
        vocabulary = range(self.tokenizer.eot)
        self._marks = frozenset(i for i in vocabulary if is_mark(self.tokenizer.decode([i])))  # punctuation, no letters or digits
        self._ends = np.array(sorted(i for i in self._marks if ends_sentence(self.tokenizer.decode([i]))) + [self.tokenizer.eot])

    def transcribe(self, pcm: np.ndarray) -> str:
        """int16 mono at 16 kHz -> text. Feed arrays, never files (decoding files through PyAV in
        a process that has imported vLLM is many times slower)."""
        return self.hear(pcm, ends=False).text

    def hear(self, pcm: np.ndarray, ends: bool = True, hint: tuple[int, ...] = (), keywords: tuple[str, ...] = ()) -> Words:
        """The words, and with ``ends`` Whisper's probability that they end a sentence there
        (``hint`` is not used: Whisper decodes each pass from nothing). ``keywords`` only respell
        the names heard that sound as one is spelt (``keywords.respell``): given as Whisper's
        "previous text" (as whisper-1 takes a list of keywords), tiny.en wrote lists ("Give Sarah a
        call." -> "Give Sarah, Carl,", five espeak requests, 2026-11-29); Moonshine's beam takes
        them too (keywords.py)."""
        if len(pcm) < self.rate // 10:
            return Words("", None)
        import ctranslate2

        seconds = len(pcm) / self.rate
        if self.window == "full" or seconds + self.margin_s >= FULL_FRAMES / FRAMES_PER_SECOND:
            frames = FULL_FRAMES
        else:
            frames = int(math.ceil((seconds + self.margin_s) * 10)) * FRAMES_PER_SECOND // 10  # whole tenths of a second
        audio = np.zeros(frames * self.rate // FRAMES_PER_SECOND, np.float32)
        n = min(len(pcm), len(audio))
        audio[:n] = pcm[:n].astype(np.float32) / 32768.0
        features = self.whisper.feature_extractor(audio)[:, :frames]
        encoded = self.whisper.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])))
        result = self.whisper.model.generate(
            encoded,
            [self.prompt],
            beam_size=self.beam_size,
            max_length=min(448, len(self.prompt) + int(12 * seconds) + 16),  # ~12 tokens/s is fast speech
            suppress_blank=True,
            suppress_tokens=[-1],
            return_logits_vocab=ends,
        )[0]
        ids = [t for t in result.sequences_ids[0] if t < self.tokenizer.eot]
        text = respell(unloop(self.tokenizer.decode(ids).strip()), keywords)
        return Words(text, self._ending(ids, result.logits[0]) if ends and text else None)

    def _ending(self, ids: list[int], logits: list[object]) -> float | None:
        return ending(ids, logits, self._marks, self._ends)


def ending(tokens: list[int], logits: Sequence[object], marks: frozenset[int], ends: np.ndarray) -> float | None:
    """P(the last word) x P(an end mark (``ends``) or the end of the text right after it), from a
    decoder's logits for each token and the ones after the last (``logits[i]``: what follows
    ``tokens[:i]``); ``marks``: the tokens that are punctuation, not words. None: no word."""
    last = next((i for i in range(len(tokens) - 1, -1, -1) if tokens[i] not in marks), None)
    if last is None:
        return None
    word = softmax(logits[last])[tokens[last]]
    after = softmax(logits[last + 1])[ends].sum() if last + 1 < len(logits) else 1.0
    return float(word * after)


def softmax(logits: object) -> np.ndarray:
    z = np.asarray(logits, np.float64).ravel()
    p = np.exp(z - z.max())
    return p / p.sum()


def is_mark(piece: str) -> bool:
    return bool(piece.strip()) and not any(c.isalnum() for c in piece)


def ends_sentence(piece: str) -> bool:
    """An end mark, maybe with quotes or brackets around it ('.', '?"', '.)'); not an ellipsis
    ('...': a voice trailing off). The one rule (pipelines/sentences.py), with ``)``: a listener
    writes brackets of its own ("(laughs)."), which the user's words given the thinker never open."""
    return piece_ends_sentence(piece, QUOTES + ")")


LOOP_WORDS = 3  # the fewest words of a phrase that, said again and again with nothing else, is a loop ("no no no" is not)


def unloop(text: str) -> str:
    """Drop a sentence that repeats the one before it, and everything after (a decoder loop); a
    text that is one phrase of ``LOOP_WORDS`` words or more over and over, with no end mark between
    ("phone Katie for me phone Katie for me", heard through the server), is the phrase once."""
    sentences = re.findall(r"[^.!?]+[.!?]*", text)
    kept: list[str] = []
    for s in sentences:
        if kept and s.strip(" .!?").lower() == kept[-1].strip(" .!?").lower():  # (its end mark aside: "Calculate 18 times 3. Calculate 18 times 3")
            break
        kept.append(s)
    text = "".join(kept).strip()
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    said = [re.sub(r"\W", "", text[a:b]).lower() for a, b in spans]
    for period in range(LOOP_WORDS, len(said) // 2 + 1):
        if len(set(said[:period])) > 1 and all(said[i] == said[i - period] for i in range(period, len(said))):
            return text[: spans[period - 1][1]].rstrip(" ,;:")
    return text
