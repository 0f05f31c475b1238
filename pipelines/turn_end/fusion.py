"""semantic_vad's decision: the audio's verdict, the thinker's and the silence, fused.

Three things say whether a pause ends the user's turn: Smart Turn's probability from the sound
(pipelines/turn_end/smart_turn.py), the thinker's probability that the words so far end the message
(pipelines/turn_end/judgement.py, when the pipeline judges them), and how long the silence has lasted.
They are fused as one logistic model:

    logit P(finished) = bias + audio * logit(P_audio) + words * logit(P_words) + silence_per_s * seconds

whose weights were fitted on the end-of-turn bench (``python -m bench turn_fit``, over
``bench.turns`` rows; docs/turn-taking.md) and can be set in the config (``turn_model.fusion``).
The session asks once per pause, at ``limits.end_of_turn_silence_ms``: a turn at or over the
eagerness's threshold ends there; one below it ends after the further silence that brings it
there (``TurnVerdict.wait_s``), unless the user speaks on first or the eagerness's longest wait
comes sooner. So a fragment ("I'd like to book a table for") waits long, a finished question ends
at once, and a short answer the words alone cannot place ("Tomorrow.") ends after a second or so.

Without the thinker's judgement (a pipeline that makes none, or one that came too late) the
audio weights apply: Smart Turn's probability alone, as before the thinker judged, shifted by the
transcript's last words where there is one (pipelines/turn_end/text_rule.py).
"""

from __future__ import annotations

import math

import msgspec

from pipelines.base import Heard, TurnVerdict
from pipelines.base import logit as _logit
from pipelines.turn_end.text_rule import combine


class Weights(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    bias: float = 0.0
    audio: float = 1.0  # on logit(Smart Turn's probability)
    words: float = 0.0  # on logit(the thinker's probability that the words end the message)
    silence_per_s: float = 0.0  # per second of silence after the check


# Fitted by bench/turn_fit.py on a bench.turns run's decisions (docs/turn-taking.md: which run, and
# what they do on the half they were not fitted on): the shortest mean delay that keeps the cut
# and split rates at most 10% on the fitting half.
WITH_WORDS = Weights(bias=-1.5, audio=0.5, words=0.5, silence_per_s=2.0)


class Fusion(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    with_words: Weights = WITH_WORDS  # the thinker judged the words
    audio_only: Weights = Weights()  # it did not: the audio (and the transcript's last words)

    def verdict(self, audio: float, cpu_ms: float, heard: Heard | None) -> TurnVerdict:
        text = heard.text if heard is not None else None
        if heard is None or heard.ends is None:
            w = self.audio_only
            p = combine(audio, text) if w == Weights() else _sigmoid(w.bias + w.audio * logit(audio))
            return TurnVerdict(p, cpu_ms, audio, text, None, w.silence_per_s)
        w = self.with_words
        z = w.bias + w.audio * logit(audio) + w.words * logit(heard.ends)
        return TurnVerdict(_sigmoid(z), cpu_ms, audio, text, heard.ends, w.silence_per_s)


def logit(p: float) -> float:
    return _logit(p, 1e-4)  # a probability read from 20 candidates is no finer than this


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-max(-50.0, min(50.0, z))))
