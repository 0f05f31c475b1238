"""The turn-end policy: the one place that says when a user's turn is over.

The session's turn detector (realtime_omni/session/turns.py) hears speech and silence; it asks this
policy what they mean, once per check:

* ``server_vad`` needs no policy: the client's own ``silence_duration_ms`` ends the turn;
* ``semantic_vad`` without an end-of-turn model: the eagerness's fixed silence (``Eagerness.silence_ms``);
* ``semantic_vad`` with one: at ``check_ms`` of silence the policy weighs the sound (Smart Turn, in
  its worker thread) with what the pipeline heard of the turn (its words and the thinker's
  judgement of them, awaited at most ``hearing_wait_ms``), fused by ``fusion``: a turn judged
  finished at the eagerness's ``threshold`` ends at once, one judged unfinished after the further
  silence the fusion gives it (``Decision.ends_after_ms``: ``fusion.wait_s`` after the check), or
  at the eagerness's ``max_wait_ms``. The session applies the decision; it computes none of it.

``pause_ms`` is the shorter silence at which pipelines start hearing (and answering) ahead of the
end. Every setting is in the config's ``turn_end`` section (``TurnEndConfig``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
import numpy as np

from pipelines.base import Heard, Judge, TurnModel, TurnVerdict
from pipelines.turn_end.fusion import Fusion, wait_s

log = logging.getLogger(__name__)

class Eagerness(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one of semantic_vad's eagerness settings means."""

    threshold: float  # how sure the fused verdict must be that the user has finished
    max_wait_ms: int  # the longest silence a turn judged unfinished waits through (OpenAI's max timeouts)
    silence_ms: int  # the fixed silence that ends a turn when no end-of-turn model is loaded


EAGERNESS = {
    "low": Eagerness(threshold=0.8, max_wait_ms=8000, silence_ms=1500),
    "medium": Eagerness(threshold=0.5, max_wait_ms=4000, silence_ms=800),
    "high": Eagerness(threshold=0.2, max_wait_ms=2000, silence_ms=400),
}


class TurnEndConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The config's ``turn_end`` section."""

    model: str | None = "smart-turn-v3.2"  # the end-of-turn model on the sound; None: fixed silences per eagerness
    threads: int = 1  # ONNX Runtime threads for one decision (decisions run one at a time)
    pause_ms: int = 200  # silence after which pipelines may start hearing and answering ahead
    check_ms: int = 200  # semantic_vad: the silence at which the turn is judged (a finished one ends there)
    hearing_wait_ms: int = 1500  # the longest a decision waits for the pipeline's words and judgement
    # who judges whether the words at a pause end the turn, where the pipeline can (the cascade): the
    # thinker (one engine step over the words, in the conversation, before the answer) or the listener
    # (Whisper's own probability of its last word and of an end after it, in the same pass: nothing
    # added at the pause, the thinker left to the answer); the fusion has weights for each; the two
    # measured: docs/turn-taking.md
    judge: Judge = "thinker"
    eagerness: dict[str, Eagerness] = msgspec.field(default_factory=lambda: dict(EAGERNESS))  # "auto" is "medium"
    fusion: Fusion = msgspec.field(default_factory=Fusion)  # the defaults were fitted by `python -m bench turn_fit`

    def __post_init__(self) -> None:
        missing = {"low", "medium", "high"} - set(self.eagerness)
        if missing:
            raise msgspec.ValidationError(f"turn_end.eagerness lacks {', '.join(sorted(missing))}")
        if not 0 < self.pause_ms <= self.check_ms:
            raise msgspec.ValidationError("turn_end.pause_ms must be above 0 and at most turn_end.check_ms")


@dataclass(frozen=True, slots=True)
class Decision:
    wait_s: float | None  # further silence after which the turn is over: 0 now, None the eagerness's longest wait
    verdict: TurnVerdict | None  # what was weighed (None: nothing was, e.g. no model)
    check_ms: int = 0  # the silence the decision was asked at

    @property
    def finished(self) -> bool:
        """The turn is over now, at the check."""
        return self.wait_s == 0.0

    @property
    def ends_after_ms(self) -> float | None:
        """The silence (from the speech's end) after which the turn is over, unless speech comes
        first; None: the eagerness's longest wait."""
        return None if self.wait_s is None else self.check_ms + self.wait_s * 1000


LONGEST_WAIT = Decision(None, None)  # nothing weighed: the eagerness's longest wait ends the turn


Hear = Callable[[float], Awaitable[Heard | None]]  # what the pipeline heard, within so many seconds


class TurnEndPolicy:
    """Shared by every session of a server; ``model`` (loaded) is semantic_vad's sound model, or None."""

    def __init__(self, config: TurnEndConfig | None = None, model: TurnModel | None = None) -> None:
        self.config = config or TurnEndConfig()
        self.model = model

    def eagerness(self, name: str) -> Eagerness:
        return self.config.eagerness.get(name) or self.config.eagerness["medium"]

    def judges(self, eagerness: str | None) -> bool:
        """Whether a session with this turn detection checks its pauses here (semantic_vad with a model)."""
        return eagerness is not None and self.model is not None

    def judge(self, eagerness: str | None) -> Judge | None:
        """Who the pipeline is asked to judge the words of a session with this turn detection
        (``PipelineSession.judge_words``): ``turn_end.judge`` where its pauses are checked here."""
        return self.config.judge if self.judges(eagerness) else None

    def silence_ms(self, eagerness: str) -> int:
        """semantic_vad's turn-ending silence when no check ends the turn first."""
        e = self.eagerness(eagerness)
        return e.max_wait_ms if self.model is not None else e.silence_ms

    async def decide(self, pcm: np.ndarray, rate: int, eagerness: str, hear: Hear | None, name: str = "") -> Decision:
        """The decision at a check: ``pcm`` is the turn's end (at most the model's ``max_seconds``),
        ending with the silence that made the session ask; ``hear`` gives what the pipeline heard;
        ``name``: the session's, for the log."""
        model = self.model
        if model is None:
            return LONGEST_WAIT
        # the sound first, at the check, while the pause's hearing finishes; then the words: the
        # verdict comes with the thinker's judgement, and the answer begun there runs alone on two
        # cores (after the words, the sound ran beside the answer's first step: 28 ms later to
        # the first audio, docs/turn-taking.md)
        audio = await model.judge(pcm, rate)
        heard = None if hear is None else await _within(hear, self.config.hearing_wait_ms / 1000)
        verdict = self.config.fusion.verdict(audio.probability, audio.cpu_ms, heard)
        wait = wait_s(verdict, self.eagerness(eagerness).threshold)
        log.debug(
            "session %s: end of turn? sound %s, words %r judged %s -> %.3f: %s",
            name,
            verdict.audio_probability,
            verdict.transcript,
            verdict.words_probability,
            verdict.probability,
            "finished" if wait == 0.0 else "the longest wait" if wait is None else f"after {wait:.2f} s more silence",
        )
        return Decision(wait, verdict, self.config.check_ms)

    def window(self, start: int, end: int, rate: int) -> int:
        """Where the audio a decision at ``end`` hears begins, for a turn from ``start`` (input
        positions at ``rate``): at most the model's ``max_seconds`` back."""
        seconds = self.model.max_seconds if self.model is not None else 0.0
        return max(start, end - int(seconds * rate))

    def close(self) -> None:
        if self.model is not None:
            self.model.close()


async def _within(hear: Hear, seconds: float) -> Heard | None:
    """What the pipeline heard within ``seconds`` (it bounds its own wait; this bounds one that
    does not), or None when hearing failed or took longer (the sound alone then)."""
    try:
        async with asyncio.timeout(seconds + 0.1):
            return await hear(seconds)
    except Exception:  # TimeoutError among them; a cancellation of the decision itself goes on up
        return None
