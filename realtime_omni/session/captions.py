"""Live captions of the user's turn: what the transcriber hears so far, shown as it firms up.

Each pass transcribes the turn from its start; a word is shown once two passes in a row agree on it
and on every word before it (a newer pass often revises its last words), and what was shown is
never taken back: the ``conversation.item.input_audio_transcription.delta`` events only append.
When the turn's final transcript arrives, the rest of it follows as one last delta if it begins with
the words shown; if it does not, no more deltas come and ``completed`` carries the whole transcript.
"""

from __future__ import annotations

import re


def _key(word: str) -> str:
    return re.sub(r"[^\w']+", "", word.lower())


class Captions:
    __slots__ = ("shown", "_keys", "_last")

    def __init__(self) -> None:
        self.shown: list[str] = []  # the words sent, as sent
        self._keys: list[str] = []  # ... compared without case and punctuation
        self._last: list[str] = []  # the previous pass's words

    def hear(self, text: str) -> str:
        """A pass's transcript of the turn so far -> the delta to send ("" for none)."""
        words = text.split()
        keys = [_key(w) for w in words]
        last = [_key(w) for w in self._last]
        agreed = 0
        while agreed < min(len(keys), len(last)) and keys[agreed] == last[agreed] and keys[agreed]:
            agreed += 1
        self._last = words
        n = len(self.shown)
        if agreed <= n or keys[:n] != self._keys:
            return ""
        return self._show(words[n:agreed], keys[n:agreed])

    def finish(self, transcript: str) -> str | None:
        """The final transcript -> the delta that completes what was shown into it ("" when nothing
        is left), or None when it does not begin with the words shown."""
        words = transcript.split()
        n = len(self.shown)
        if [_key(w) for w in words[:n]] != self._keys:
            return None
        return self._show(words[n:], [_key(w) for w in words[n:]])

    def _show(self, words: list[str], keys: list[str]) -> str:
        if not words:
            return ""
        delta = (" " if self.shown else "") + " ".join(words)
        self.shown += words
        self._keys += keys
        return delta
