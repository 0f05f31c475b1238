"""The Listener stage: Whisper (faster-whisper on CTranslate2, int8) turning user audio into text.

Whisper encodes a padded 30 s window, so a call costs about the same for 1 s as for 10 s of
speech (~0.5 s for tiny.en on two cores). Calls are synchronous: run them on a dedicated thread.
"""

from __future__ import annotations

import numpy as np


class WhisperListener:
    rate = 16000

    def __init__(self, model_dir: str, threads: int = 2, beam_size: int = 1, language: str | None = "en") -> None:
        from faster_whisper import WhisperModel

        self.model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=threads)
        self.beam_size = beam_size
        self.language = language

    def transcribe(self, pcm: np.ndarray) -> str:
        """int16 mono at 16 kHz -> text. Feed arrays, never files (decoding files through PyAV in
        a process that has imported vLLM is many times slower)."""
        if len(pcm) < self.rate // 10:
            return ""
        audio = pcm.astype(np.float32) / 32768.0
        segments, _ = self.model.transcribe(
            audio,
            language=self.language,
            beam_size=self.beam_size,
            vad_filter=False,
            condition_on_previous_text=False,
            without_timestamps=True,
        )
        return " ".join(s.text.strip() for s in segments).strip()
