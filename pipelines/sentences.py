"""Where a spoken answer's sentences end: the Thinker cuts its answers after ``max_sentences``,
and the tool stream cuts the words around a call the same way."""

from __future__ import annotations

import re

# A sentence ends at . ! ? followed by a space or the end of the text (not "3.5"), and a dot after
# an initial ("F. Scott") or a title ("Dr. Smith") ends none.
_NOT_AFTER = "".join(rf"(?<!\b{a})" for a in ("Mr", "Mrs", "Ms", "Dr", "St", "Jr", "Prof", "vs"))
SENTENCE_END = re.compile(rf"(?:(?<!\b[A-Z]){_NOT_AFTER}\.|[!?])(?=[\s\"')\]]|$)")
_ENDED = re.compile(SENTENCE_END.pattern + r"[\"')\]]*\s*\Z")


def ends_sentence(text: str) -> bool:
    """Whether ``text`` ends with a sentence's end (its mark maybe inside quotes or brackets)."""
    return _ENDED.search(text) is not None


class SentenceLimit:
    """Cuts an answer's text deltas at the end of its ``most``-th sentence: spoken answers stay short."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.sentences = 0
        self.text = ""
        self.done = False

    def finishing(self) -> None:
        """End at the end of the sentence under way."""
        self.most = min(self.most, self.sentences + 1)

    def __call__(self, delta: str) -> str:
        """The part of ``delta`` to keep; after it, ``done`` says whether to stop."""
        full = self.text + delta
        for m in SENTENCE_END.finditer(full, len(self.text)):
            self.sentences += 1
            if self.sentences >= self.most:
                self.done = True
                return full[len(self.text) : m.end()]
        self.text = full
        return delta
