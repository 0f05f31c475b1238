"""The Listener stage: Whisper (faster-whisper's CTranslate2 model, int8) turning user audio into text.

Whisper is trained on 30 s windows, and a stock call encodes all of them whatever the clip's length
(~0.33 s of tiny.en's 0.45 s on two cores for a 2 s question). A spoken turn is a few seconds, so
by default (``window: fit``) the encoder gets only the clip plus ``margin_s`` of silence, rounded up
to whole seconds. On our 15 spoken fixtures that took tiny.en from 0.45 s to 0.13 s per call; 11
transcripts were identical to the full window's and the others differed by a word either way
(``bench`` notes). With less silence (1 s) the decoder sometimes loops, repeating the sentence:
5 s avoids that, and ``_unloop`` cuts any repetition left. ``window: full`` keeps the stock
behaviour. Calls are synchronous: run them on a dedicated thread.
"""

from __future__ import annotations

import math
import re
from typing import Literal

import numpy as np

FRAMES_PER_SECOND = 100  # log-mel frames (10 ms hop)
FULL_FRAMES = 3000


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

    def transcribe(self, pcm: np.ndarray) -> str:
        """int16 mono at 16 kHz -> text. Feed arrays, never files (decoding files through PyAV in
        a process that has imported vLLM is many times slower)."""
        if len(pcm) < self.rate // 10:
            return ""
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
        )[0]
        ids = [t for t in result.sequences_ids[0] if t < self.tokenizer.eot]
        return unloop(self.tokenizer.decode(ids).strip())


def unloop(text: str) -> str:
    """Drop a sentence that repeats the one before it, and everything after (a decoder loop)."""
    sentences = re.findall(r"[^.!?]+[.!?]*", text)
    kept: list[str] = []
    for s in sentences:
        if kept and s.strip().lower() == kept[-1].strip().lower():
            break
        kept.append(s)
    return "".join(kept).strip()
