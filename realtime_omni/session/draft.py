"""The assistant message a response is writing, and what of it the client got.

A ``MessageDraft`` keeps the message's text and audio as the pipeline produced them, where each
transcript segment starts in that audio (``Alignment``), and two tallies: what was queued for the
client (``sent``) and what a cut then dropped from the queue unsent (``dropped``). What the client
got is the difference, known without asking the outbox or the playout; a cancelled or failed
response keeps only that (``trim_to_delivered``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pipelines.base import Message

from .conversation import Alignment


class Weight(NamedTuple):
    """What one queued delta carries of a message: samples of its audio (pipeline output rate)
    and characters of its text."""

    message: Any
    samples: int = 0
    chars: int = 0

    def plus(self, other: Weight) -> Weight:
        """This weight with ``other``'s samples and characters added (of the same message)."""
        return Weight(self.message, self.samples + other.samples, self.chars + other.chars)


class MessageDraft:
    def __init__(self, message: Message, index: int, rate: int, *, audio: bool) -> None:
        self.message = message
        self.index = index  # in the response's output
        self.audio = audio  # an audio message (its text is the transcript), else a text one
        self.rate = rate
        self.alignment = Alignment(rate)
        self.sent = Weight(message)  # queued for the client
        self.dropped = Weight(message)  # queued, then dropped by a cut
        self.produced = 0  # samples produced (pipeline output rate)
        self._text: list[str] = []
        self._text_len = 0
        self._audio: list[np.ndarray] = []

    @property
    def text(self) -> str:
        return "".join(self._text)

    def pcm(self) -> np.ndarray:
        return np.concatenate(self._audio) if self._audio else np.zeros(0, np.int16)

    def add_text(self, text: str) -> None:
        if self.audio:
            self.alignment.mark(self.produced, self._text_len)
        self._text.append(text)
        self._text_len += len(text)

    def add_audio(self, pcm: np.ndarray) -> None:
        self._audio.append(pcm)
        self.produced += len(pcm)

    def trim_to_delivered(self) -> None:
        """Keep only what the client got: audio delivered, and the transcript of that audio."""
        delivered_samples = max(0, self.sent.samples - self.dropped.samples)
        delivered_chars = max(0, self.sent.chars - self.dropped.chars)
        text = self.text
        if self.audio:
            text = self.alignment.cut(text, delivered_samples, self.produced, final=False)
            self.alignment.trim(delivered_samples, len(text))
            self._audio = [self.pcm()[:delivered_samples]]
            self.produced = min(self.produced, delivered_samples)
        else:
            text = text[:delivered_chars]
        self._text, self._text_len = [text], len(text)
