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
it ends after the further silence that brings it there (``wait_s``, below).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import msgspec

from pipelines.base import Heard, Judge, TurnVerdict
from pipelines.turn_end.odds import logit, sigmoid
from pipelines.turn_end.text_rule import odds_factor

FLOOR = 1e-4  # the probabilities weighed are kept this far from 0 and 1: one read from 20 candidates is no finer


class Weights(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    bias: float = 0.0
    audio: float = 1.0  # on logit(Smart Turn's probability)
    words: float = 0.0  # on logit(the probability that the words end the message: the listener's or the thinker's)
    silence_per_s: float = 0.0  # per second of silence after the check
    listener: float = 0.0  # with the thinker's judgement: on logit(the listener's own, when there is one)

    def score(self, audio_logit: float, words_logit: float = 0.0, listener_logit: float = 0.0) -> float:
        """The logit of P(finished) at the check, before the text rule's shift."""
        return self.bias + self.audio * audio_logit + self.words * words_logit + self.listener * listener_logit


# Fitted by bench/turn_fit.py on a bench.turns run's decisions (docs/turn-taking.md: which run, and
# what they do on the half they were not fitted on): the shortest mean delay that keeps the cut
# and split rates at most 10% on the fitting half. The listener's: on every fixture of
# `bench turns --set all --modes semantic_auto+listener` (2026-11-28); its weight beside the
# thinker's (0.25): on the fitting half of that set's +thinker run, the same cuts and ~200 ms
# sooner commits on both halves.
WITH_WORDS = Weights(bias=-1.5, audio=0.5, words=0.5, silence_per_s=2.0, listener=0.25)
WITH_LISTENER = Weights(bias=-4.75, audio=0.25, words=0.75, silence_per_s=2.0)


class Evidence(NamedTuple):
    """What a check weighs, as log-odds: the sound's, the words' judgement (None: not judged) and
    by whom, the listener's own beside the thinker's (0: none), and the text rule's shift."""

    audio: float
    words: float | None
    judge: Judge | None
    listener: float
    shift: float


class Fusion(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    with_listener: Weights = WITH_LISTENER  # the listener judged the words
    with_words: Weights = WITH_WORDS  # the thinker did
    audio_only: Weights = Weights()  # nobody did
    text_rule: bool = True  # the transcript's last words shift the odds (text_rule.py), unless the thinker judged them

    def verdict(self, audio: float, cpu_ms: float, heard: Heard | None) -> TurnVerdict:
        p, per_s = self.odds(self.evidence(audio, heard))
        text = heard.text if heard is not None else None
        if heard is None or heard.ends is None:
            return TurnVerdict(p, cpu_ms, audio, text, None, per_s)
        return TurnVerdict(p, cpu_ms, audio, text, heard.ends, per_s, heard.listener)

    def odds(self, e: Evidence) -> tuple[float, float]:
        """P(finished) at the check, and what each further second of silence adds to its logit."""
        z, w = self.weigh(e)
        return sigmoid(z), w.silence_per_s

    @staticmethod
    def evidence(audio: float, heard: Heard | None) -> Evidence:
        """Smart Turn's probability ``audio`` and what the pipeline heard, as the log-odds weighed."""
        if heard is None:
            return Evidence(logit(audio, FLOOR), None, None, 0.0, 0.0)
        return Evidence(
            logit(audio, FLOOR),
            None if heard.ends is None else logit(heard.ends, FLOOR),
            heard.judge,
            0.0 if heard.listener is None else logit(heard.listener, FLOOR),
            Fusion.words_shift(heard.text),
        )

    def weigh(self, e: Evidence) -> tuple[float, Weights]:
        """The logit of P(finished) at the check, and the weights that gave it (their
        ``silence_per_s`` is what each further second of silence adds to it)."""
        shift = e.shift if self.text_rule else 0.0
        if e.words is None:
            w = self.audio_only
            return w.score(e.audio) + shift, w
        if e.judge == "listener":
            w = self.with_listener
            return w.score(e.audio, e.words) + shift, w
        w = self.with_words
        return w.score(e.audio, e.words, e.listener), w

    @staticmethod
    def words_shift(text: str | None) -> float:
        """The text rule's shift of the logit for a transcript (0: no opinion)."""
        return math.log(odds_factor(text))


def wait_s(verdict: TurnVerdict, threshold: float) -> float | None:
    """More silence after which ``verdict``'s turn counts as finished at ``threshold``: 0 now, None
    never (the eagerness's longest wait decides). Each second of silence adds ``logit_per_s`` to
    the verdict's logit (the weights' ``silence_per_s``)."""
    return silence_to(threshold, verdict.probability, verdict.logit_per_s)


def silence_to(threshold: float, probability: float, logit_per_s: float) -> float | None:
    """``wait_s`` of a verdict of ``probability`` and ``logit_per_s``."""
    if probability >= threshold:
        return 0.0
    if logit_per_s <= 0:
        return None
    return (logit(threshold) - logit(probability)) / logit_per_s
