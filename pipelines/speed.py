"""Can this machine speak as fast as it plays? The CPU agent's self-check at start-up.

A voice agent that writes or synthesises slower than its voice plays stalls mid-sentence, and a
user on a slow box would otherwise find out by ear. At warm-up the cascade measures, on this
machine, the thinker's decode speed (tokens per second, ``ignore_eos``) and the talker's real-time
factor (seconds to synthesise one second of speech), and how many thinker tokens one second of
the talker's speech holds. One second of answer then costs ``tokens_per_audio_s / tokens_per_s``
seconds of thinking plus ``rtf`` of talking; the two share the same cores, so ``load`` is their
sum, and the agent keeps up while it is below 1 (``MARGIN`` leaves room for ASR, captions and
the session's own work).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MARGIN = 0.8  # above this share of real time, stalls come with the first extra load


@dataclass(frozen=True)
class Speed:
    thinker_tokens_per_s: float
    talker_rtf: float  # seconds of synthesis per second of speech
    speech_tokens_per_s: float  # thinker tokens in one second of the talker's speech
    faster: str  # what to run instead, in words

    @property
    def load(self) -> float:
        """Seconds of work per second of answer played (below 1: the agent keeps up)."""
        return self.speech_tokens_per_s / max(self.thinker_tokens_per_s, 1e-9) + self.talker_rtf

    @property
    def keeps_up(self) -> bool:
        return self.load <= MARGIN

    def warning(self) -> str | None:
        """What to tell the operator, or None when the machine is fast enough."""
        if self.keeps_up:
            return None
        return (
            f"this machine is too slow for this config to speak in real time: the thinker writes "
            f"{self.thinker_tokens_per_s:.1f} tokens/s where one second of speech holds "
            f"{self.speech_tokens_per_s:.1f}, and the talker takes {self.talker_rtf:.2f} s per second of "
            f"speech, so one second of answer costs {self.load:.2f} s of work (keeping up needs at most "
            f"{MARGIN}): answers will stall mid-sentence. Faster: {self.faster}"
        )

    def report(self) -> dict[str, Any]:
        """For /healthz: the measurements, the load, the verdict and the warning."""
        return {**asdict(self), "load": round(self.load, 3), "keeps_up": self.keeps_up, "warning": self.warning()}

    def stats(self) -> dict[str, float]:
        """For /metrics (``realtime_pipeline_speed_*``)."""
        return {
            "speed_thinker_tokens_per_s": self.thinker_tokens_per_s,
            "speed_talker_rtf": self.talker_rtf,
            "speed_load": self.load,
            "speed_keeps_up": float(self.keeps_up),
        }
