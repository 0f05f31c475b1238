"""What the words of a turn say about its end: a second opinion for the audio end-of-turn model.

A speaker who stops after "I'd like to book a table for" has not finished, however the last word
sounded; one whose words end a sentence probably has. When the pipeline has a transcript of the
turn so far (the CPU cascade transcribes at every pause for its speculation), its end shifts the
audio model's odds:

* it trails off (an ellipsis, a comma, a dash), or its last word rarely ends an English sentence
  (an article, a conjunction, a possessive, a subject "I", a filler "um", a preposition that is not
  also a particle): odds / 1000, a veto whatever the audio says. A question that strands its
  preposition ("Who is it for?") is judged unfinished too: Whisper puts question marks on fragments
  ("Is it possible to?") as often;
* its last word is an auxiliary or modal verb, or "that" (often, not always, more to come: "The
  reason I'm calling is", but "Yes, I can."): odds / 20;
* it ends with a full stop, question or exclamation mark: odds x 10;
* otherwise (no punctuation): unchanged.

English only, like the CPU cascade's ASR; a transcript in another language shifts nothing
unless its punctuation does.
"""

from __future__ import annotations

import math
import re

from pipelines.turn_end.odds import logit, sigmoid

NEVER_LAST = frozenset(
    "the a an and or but nor because if unless whether my your our their its i um uh er erm uhm".split()
)
AUXILIARIES = frozenset("is are was were am be been can could would should will shall may might must do does did have has had need want that".split())
PREPOSITIONS = frozenset("to of for at by with from into onto between through during without than toward towards".split())
TRAILING = ("...", "\u2026", ",", "-", "\u2014", ":", ";")
_WORD = re.compile(r"[a-z']+")


def odds_factor(text: str | None) -> float:
    """How much the transcript multiplies the odds that the turn is finished (1: no opinion)."""
    if not text:
        return 1.0
    text = text.strip()
    words = _WORD.findall(text.lower())
    if not words:
        return 1.0
    last = words[-1]
    if text.endswith(TRAILING) or last in NEVER_LAST or last in PREPOSITIONS:
        return 1 / 1000
    if last in AUXILIARIES:
        return 1 / 20
    if text.endswith((".", "?", "!")):
        return 10.0
    return 1.0


def combine(probability: float, text: str | None) -> float:
    """The audio model's probability of a finished turn, shifted by what the transcript says."""
    factor = odds_factor(text)
    if factor == 1.0:
        return probability
    return sigmoid(logit(probability, 1e-6) + math.log(factor))
