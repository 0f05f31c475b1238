"""semantic_vad's verdict: the sound's, the words' and the silence's, weighed as one logistic model.

Three things say whether a pause ends the user's turn: Smart Turn's probability from the sound
(``smart_turn.py``), the probability that the words so far end the message (when the pipeline
judged them: the listener's own, pipelines/cascade/listener.py, or the thinker's, ``judgement.py``),
and how long the silence has lasted:

    logit P(finished) = bias + audio * logit(P_audio) + words * logit(P_words) + silence_per_s * seconds

``with_listener`` weighs a pause whose words the listener judged, ``with_words`` one the thinker
judged (with ``listener * logit(P_listener)`` added when the listener's came beside it);
``audio_only`` one nobody did (a pipeline that makes no judgement, or one that came too late).
Where the pipeline heard words, the text rule's odds (``text_rule.py``) are added to the
listener's and the sound's alone unless ``text_rule`` is off (the thinker reads the words itself). The weights
were fitted on the end-of-turn bench (``python -m bench turn_fit`` over ``bench.turns`` rows,
docs/turn-taking.md) and are set in the config (``turn_end.fusion``). The policy (``policy.py``)
asks once per check: a verdict at or over the eagerness's threshold ends the turn there; one below
it ends after the further silence that brings it there (``TurnVerdict.wait_s``).
"""

from __future__ import annotations

import math
from typing import TypeVar

import msgspec

from pipelines.base import Heard, TurnVerdict
from pipelines.turn_end.odds import logit, sigmoid
from pipelines.turn_end.text_rule import odds_factor

FLOOR = 1e-4  # the probabilities weighed are kept this far from 0 and 1: one read from 20 candidates is no finer

Z = TypeVar("Z")  # a float, or a numpy array of them (bench/turn_fit.py scores a whole grid at once)


class Weights(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    bias: float = 0.0
    audio: float = 1.0  # on logit(Smart Turn's probability)
    words: float = 0.0  # on logit(the probability that the words end the message: the listener's or the thinker's)
    silence_per_s: float = 0.0  # per second of silence after the check
    listener: float = 0.0  # with the thinker's judgement: on logit(the listener's own, when there is one)

    def score(self, audio_logit: Z, words_logit: Z | float = 0.0, listener_logit: Z | float = 0.0) -> Z:
        """The logit of P(finished) at the check."""
        return self.bias + self.audio * audio_logit + self.words * words_logit + self.listener * listener_logit  # type: ignore[return-value,operator]


# Fitted by bench/turn_fit.py on a bench.turns run's decisions (docs/turn-taking.md: which run, and
# what they do on the half they were not fitted on): the shortest mean delay that keeps the cut
# and split rates at most 10% on the fitting half. The listener's: on every fixture of
# `bench turns --set all --modes semantic_auto+listener` (2026-11-28); its weight beside the
# thinker's (0.25): on the fitting half of that set's +thinker run, the same cuts and ~200 ms
# sooner commits on both halves.
WITH_WORDS = Weights(bias=-1.5, audio=0.5, words=0.5, silence_per_s=2.0, listener=0.25)
WITH_LISTENER = Weights(bias=-4.75, audio=0.25, words=0.75, silence_per_s=2.0)


class Fusion(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    with_listener: Weights = WITH_LISTENER  # the listener judged the words
    with_words: Weights = WITH_WORDS  # the thinker did
    audio_only: Weights = Weights()  # nobody did
    text_rule: bool = True  # the transcript's last words shift the odds (text_rule.py), unless the thinker judged them

    def verdict(self, audio: float, cpu_ms: float, heard: Heard | None) -> TurnVerdict:
        text = heard.text if heard is not None else None
        shift = self.words_shift(text) if self.text_rule else 0.0
        if heard is None or heard.ends is None:
            w = self.audio_only
            z = w.score(logit(audio, FLOOR)) + shift
            return TurnVerdict(sigmoid(z), cpu_ms, audio, text, None, w.silence_per_s)
        if heard.judge == "listener":
            w = self.with_listener
            z = w.score(logit(audio, FLOOR), logit(heard.ends, FLOOR)) + shift
        else:
            w = self.with_words
            z = w.score(logit(audio, FLOOR), logit(heard.ends, FLOOR), 0.0 if heard.listener is None else logit(heard.listener, FLOOR))
        return TurnVerdict(sigmoid(z), cpu_ms, audio, text, heard.ends, w.silence_per_s, heard.listener)

    @staticmethod
    def words_shift(text: str | None) -> float:
        """The text rule's shift of the logit for a transcript (0: no opinion)."""
        return math.log(odds_factor(text))



def wait_s(verdict: TurnVerdict, threshold: float) -> float | None:
    """More silence after which ``verdict``'s turn counts as finished at ``threshold``: 0 now, None
    never (the eagerness's longest wait decides). Each second of silence adds ``logit_per_s`` to
    the verdict's logit (the weights' ``silence_per_s``)."""
    if verdict.probability >= threshold:
        return 0.0
    if verdict.logit_per_s <= 0:
        return None
    return (logit(threshold) - logit(verdict.probability)) / verdict.logit_per_s
