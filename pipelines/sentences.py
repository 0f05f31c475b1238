"""Where a sentence ends: the one rule, for a text and for a token's piece of one.

The Thinker cuts its answers after ``max_sentences`` and the tool stream cuts the words around a
call the same way (``ends_sentence``, ``SentenceLimit``: a text); a turn's end is read from the
tokens that may come after the user's last word (``piece_ends_sentence``: the thinker's next token,
pipelines/turn_end/judgement.py; the listener's, pipelines/cascade/listener.py). A piece is the
text rule applied to a token alone, less what a token cannot tell: it is only the sentence's end
(marks and closing quotes), and an ellipsis in it ("...", a voice trailing off) ends nothing."""

from __future__ import annotations

import re

# A sentence ends at . ! ? followed by a space or the end of the text (not "3.5"), and a dot after
# an initial ("F. Scott") or a title ("Dr. Smith") ends none.
END_MARKS = ".!?"
QUOTES = "\"'"
_NOT_AFTER = "".join(rf"(?<!\b{a})" for a in ("Mr", "Mrs", "Ms", "Dr", "St", "Jr", "Prof", "vs"))
SENTENCE_END = re.compile(rf"(?:(?<!\b[A-Z]){_NOT_AFTER}\.|[!?])(?=[\s\"')\]]|$)")
_ENDED = re.compile(SENTENCE_END.pattern + r"[\"')\]]*\s*\Z")


def ends_sentence(text: str) -> bool:
    """Whether ``text`` ends with a sentence's end (its mark maybe inside quotes or brackets)."""
    return _ENDED.search(text) is not None


def piece_ends_sentence(piece: str, closers: str = QUOTES) -> bool:
    """Whether a token's text, alone, ends a sentence: end marks (``.``, ``?``, ``!``, doubled or
    with ``closers`` after or around them, white space around it), but not an ellipsis (two dots in
    a row). ``closers``: the quotes by default; the listener adds ``)`` (it writes its own
    brackets, "(laughs)."), the thinker's judgement does not (the user's words open none)."""
    s = piece.strip()
    return bool(s) and ".." not in s and all(c in END_MARKS + closers for c in s) and ends_sentence(s)


# A character written this many times in a row ends the answer there: a small thinker can run on
# ("100 euros in yin is 10000000000...", 170 zeros to the answer's cap, bench tools 2026-11-30),
# and nothing spoken holds such a run (ten quadrillion is 10000000000000000: 16 zeros).
RUN = 16
_RUN = re.compile(rf"(\S)\1{{{RUN - 1}}}")


class SentenceLimit:
    """Cuts an answer's text deltas at the end of its ``most``-th sentence: spoken answers stay
    short; and after ``RUN`` of one character in a row (a thinker running on), where it ends."""

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
        run = _RUN.search(full, max(0, len(self.text) - RUN))
        if run is not None:
            full = full[: run.end()]
        for m in SENTENCE_END.finditer(full, len(self.text)):
            self.sentences += 1
            if self.sentences >= self.most:
                self.done = True
                return full[len(self.text) : m.end()]
        kept, self.text = full[len(self.text) :], full
        if run is not None:
            self.done = True
        return kept
