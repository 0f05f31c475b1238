"""What a replay measures: one turn's record, the per-turn metrics taken from it, word error rate,
and the percentiles that summarize a run. Plain data and arithmetic: no I/O, no event loop.

Per turn (all client-side, times on the harness's clock):

* ``voice_to_voice_ms``: end of the user's speech in the replayed audio -> first audio delta;
* ``voice_to_voice_audible_ms``: the same end of speech -> the first audible sample of the answer
  (``AUDIBLE``), played from its first delta's arrival: what a caller hears, lead-in silence counted
  (the WebRTC transports' deltas begin at their first audible frame, so there the two agree to a frame);
* ``ttft_ms``: the same end of speech -> first text (transcript or text delta);
* ``audio_ttfp_ms``: the server's end-of-turn (``input_audio_buffer.speech_stopped`` arriving) ->
  first audio delta: time to first audio packet, without the VAD's end-of-turn wait;
* ``audio_rtf``: (server end-of-turn -> last audio delta) / seconds of audio received (< 1: faster
  than real time);
* ``gaps_over_100ms``: stalls longer than 100 ms when the received audio is played back in real time
  from its first packet (each delta plays at ``max(arrival, end of the previous one)``);
* ``barge_in_ms``: on a barge-in turn whose answer was still playing, from the onset of the user's
  speech in the replayed audio to the moment the answer's audio stops at the client, which is when
  the server's ``input_audio_buffer.speech_started`` arrives (a client stops playback there, as
  OpenAI's clients do; the harness then truncates the answer to what was played). When the answer
  was still being generated, ``barge_in_cancel_ms`` is the time to its ``response.done`` (cancelled);
* ``input_wer``: word error rate of the server's input transcript against the known text;
* ``server_timings_ms``: the per-stage timings the server reports in ``response.done``
  (``metadata["timing.<stage>_ms"]``; this server does, peers may not);
* errors: ``error`` events, responses that never came, dropped connections.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

AUDIBLE = 100  # |sample| (int16) from which an answer counts as heard (about -50 dBFS)


def first_audible(pcm: np.ndarray) -> int | None:
    """The index of the first audible sample of int16 ``pcm``, or None."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) >= AUDIBLE)
    return int(loud[0]) if len(loud) else None


def audible_at(pcm: np.ndarray, rate: int, first: float, before_s: float, arrival: float) -> float | None:
    """When the first audible sample of ``pcm`` (a delta of an answer) plays: the answer played from
    its first delta's arrival (``first``), ``before_s`` seconds of it ahead of this delta, which
    arrived at ``arrival`` (it cannot play before that). None when nothing in it is audible."""
    i = first_audible(pcm)
    return None if i is None else max(arrival, first + before_s + i / rate)

# the latency distributions a run is summarized by: (key, title, unit)
DISTRIBUTIONS = [
    ("voice_to_voice_ms", "Voice to voice", "ms"),
    ("voice_to_voice_audible_ms", "Voice to voice, audible", "ms"),
    ("ttft_ms", "Time to first text", "ms"),
    ("audio_ttfp_ms", "Time to first audio packet", "ms"),
    ("audio_rtf", "Audio real-time factor", ""),
    ("barge_in_ms", "Barge-in", "ms"),
    ("input_wer", "Input transcript WER", ""),
]


# ------------------------------------------------------------------------------ playback


def playback_schedule(deliveries: Iterable[Sequence[float]]) -> list[tuple[float, float]]:
    """(start, seconds) of each received piece of audio played back in real time from the first:
    a piece plays when it has arrived and the one before it has finished."""
    out, end = [], 0.0
    for arrival, seconds in deliveries:
        start = max(end, arrival)
        out.append((start, seconds))
        end = start + seconds
    return out


# ------------------------------------------------------------------------------ one turn's record


@dataclass
class TurnRecord:
    conversation: str
    turn: int
    text: str
    barge_in: bool
    onset_t: float = 0.0  # user speech begins (client clock)
    speech_end_t: float = 0.0  # user speech ends in the replayed audio
    turn_end_t: float | None = None  # the server's speech_stopped arrived
    item_id: str | None = None
    response_id: str | None = None
    created_t: float | None = None
    first_text_t: float | None = None
    first_audio_t: float | None = None
    first_audible_t: float | None = None
    last_audio_t: float | None = None
    done_t: float | None = None
    status: str | None = None
    audio_s: float = 0.0
    deliveries: list[tuple[float, float]] = field(default_factory=list)  # (arrival, seconds)
    heard: str | None = None
    answer: str | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    server_timings_ms: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    interrupted_by_t: float | None = None  # onset of the user speech that barged in on this answer
    assistant_item: str | None = None
    barge_in_ms: float | None = None  # set on the interrupting turn: onset -> playback stopped
    barge_in_cancel_ms: float | None = None  # onset -> the interrupted response's response.done

    def playback_end(self) -> float:
        """When the received audio would have finished playing (real time from its first packet)."""
        schedule = playback_schedule(self.deliveries)
        return schedule[-1][0] + schedule[-1][1] if schedule else 0.0

    def played_s(self, at: float) -> float:
        """Seconds of the received audio played by ``at``."""
        return sum(min(seconds, at - start) for start, seconds in playback_schedule(self.deliveries) if start < at)

    def heard_from(self, arrival: float, pcm: np.ndarray, rate: int) -> None:
        """A delta of the answer (int16 at the client's rate) arrived: note when its first audible
        sample plays, if it is the answer's first (playback starting at the first delta). Call it
        after the delta is counted in ``audio_s`` and ``first_audio_t``."""
        if self.first_audible_t is None:
            self.first_audible_t = audible_at(pcm, rate, self.first_audio_t or arrival, self.audio_s - len(pcm) / rate, arrival)

    def gaps(self) -> list[float]:
        """Silences in the playback: how long each piece arrived after the one before had finished."""
        schedule = playback_schedule(self.deliveries)
        return [
            arrival - (start + seconds)
            for (start, seconds), (arrival, _) in zip(schedule, self.deliveries[1:])
            if arrival > start + seconds
        ]

    def metrics(self, origin: float = 0.0) -> dict[str, Any]:
        """The turn's line of ``turns.jsonl``; its timeline in seconds from ``origin``."""
        ms = lambda a, b: round((a - b) * 1000, 1) if a is not None and b is not None else None  # noqa: E731
        gaps = self.gaps()
        m: dict[str, Any] = {
            "conversation": self.conversation,
            "turn": self.turn,
            "text": self.text,
            "barge_in": self.barge_in,
            "status": self.status,
            "voice_to_voice_ms": ms(self.first_audio_t, self.speech_end_t),
            "voice_to_voice_audible_ms": ms(self.first_audible_t, self.speech_end_t),
            "ttft_ms": ms(self.first_text_t, self.speech_end_t),
            "audio_ttfp_ms": ms(self.first_audio_t, self.turn_end_t),
            "turn_end_detected_ms": ms(self.turn_end_t, self.speech_end_t),
            "audio_s": round(self.audio_s, 3),
            "audio_rtf": None,
            "gaps_over_100ms": sum(1 for g in gaps if g > 0.1),
            "max_gap_ms": round(max(gaps, default=0.0) * 1000, 1),
            "barge_in_ms": self.barge_in_ms,
            "barge_in_cancel_ms": self.barge_in_cancel_ms,
            "heard": self.heard,
            "answer": self.answer,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "input_wer": round(wer(self.text, self.heard), 4) if self.heard is not None and self.text else None,
            "server_timings_ms": self.server_timings_ms,
            "errors": self.errors,
        }
        if self.status == "completed" and self.audio_s > 0 and self.turn_end_t is not None and self.last_audio_t is not None:
            m["audio_rtf"] = round((self.last_audio_t - self.turn_end_t) / self.audio_s, 3)
        # a timeline for plots
        timeline = {
            "onset": self.onset_t,
            "speech_end": self.speech_end_t,
            "turn_end": self.turn_end_t,
            "created": self.created_t,
            "first_audio": self.first_audio_t,
            "done": self.done_t,
        }
        m["timeline"] = {k: round(v - origin, 4) for k, v in timeline.items() if v is not None}
        m["playback"] = [[round(a - origin, 4), s] for a, s in self.deliveries]
        return m


# ------------------------------------------------------------------------------ word error rate


def words(text: str) -> list[str]:
    """The words WER counts: lower case, punctuation dropped, British spellings made American."""
    return re.findall(r"[a-z0-9']+", text.lower().replace("colour", "color").replace("favourite", "favorite"))


def word_edits(ref: list[str], hyp: list[str]) -> int:
    """Substitutions + deletions + insertions that turn ``ref`` into ``hyp``."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words."""
    ref, hyp = words(reference), words(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return word_edits(ref, hyp) / len(ref)


# ------------------------------------------------------------------------------ summaries


def dist(values: list[float], digits: int = 3) -> dict[str, float]:
    """mean / p50 / p90 / p99 / max of a sample (ms in, ms out)."""
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=float)
    stats = {"mean": a.mean(), "p50": np.percentile(a, 50), "p90": np.percentile(a, 90), "p99": np.percentile(a, 99), "max": a.max()}
    return {"n": int(a.size), **{k: round(float(v), digits) for k, v in stats.items()}}


def _dist_or_none(values: list[float]) -> dict[str, float] | None:
    return dist(values, digits=4) if values else None


def summarize(result: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """A replay's ``summary.json``: ``meta`` and the distributions over all its turns."""
    turns = result["turns"]
    summary: dict[str, Any] = {**meta, "turns": len(turns), "wall_s": result["wall_s"]}
    summary["completed"] = sum(1 for t in turns if t["status"] == "completed")
    summary["cancelled"] = sum(1 for t in turns if t["status"] == "cancelled")
    for key, _, _ in DISTRIBUTIONS:
        summary[key] = _dist_or_none([t[key] for t in turns if t[key] is not None])
    gaps = [t["gaps_over_100ms"] for t in turns if t["status"] == "completed"]
    summary["gaps_over_100ms"] = {"total": int(sum(gaps)), "turns_with_gaps": sum(1 for g in gaps if g), **(_dist_or_none(gaps) or {})}
    heard = [t for t in turns if t["heard"] is not None and t["text"]]
    if heard:  # corpus-level WER as well as per turn
        count = sum(len(words(t["text"])) for t in heard)
        summary["input_wer_overall"] = round(sum(wer(t["text"], t["heard"]) * len(words(t["text"])) for t in heard) / max(1, count), 4)
    errors = [e for t in turns for e in t["errors"]] + result["connection_errors"]
    summary["errors"] = len(errors)
    summary["error_messages"] = sorted(set(errors))[:20]
    stages = sorted({s for t in turns for s in t["server_timings_ms"]})
    summary["server_timings_ms"] = {s: _dist_or_none([t["server_timings_ms"][s] for t in turns if s in t["server_timings_ms"]]) for s in stages}
    summary["harness_mic_lag_ms"] = result.get("mic_lag_ms", {})
    return summary
