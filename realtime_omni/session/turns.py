"""Turn detection on webrtcvad: server VAD, and the timing of semantic VAD.

Audio is judged in 20 ms frames. A frame is speech when webrtcvad says so *and* its level is above
an energy floor; ``threshold`` (0..1) sets both the webrtcvad aggressiveness and that floor, so a
higher threshold needs louder, clearer speech, as with OpenAI's VAD.

* Speech starts after 3 speech frames within 5 (60 ms of speech: a click does not start a turn).
  ``audio_start_ms`` is the first speech frame minus ``prefix_padding_ms`` (the audio the item keeps).
* The first silent frame after speech reports ``Quiet``: a gap between words, or the end of what
  was said; a pipeline may hear the words so far then, ahead of the pause.
* A silence of ``pause_ms`` (shorter than the end-of-turn silence) reports ``Paused``: the user may
  be done, and a pipeline may start speculative work. Speech again reports ``Resumed``.
* A silence of ``silence_duration_ms`` ends the turn; ``audio_end_ms`` includes that silence
  (the item covers it), as OpenAI reports it. Two speech frames in a row break a silence; a lone
  one does not.
* Semantic VAD (``check_ms`` given): a silence of ``check_ms`` reports ``EndCheck``: the session
  asks its end-of-turn model whether the user has finished, and, if so, ends the turn there
  (``end_turn``), or after a longer silence it names (``end_after``). Otherwise the turn waits on:
  speech again reports ``Resumed`` (the next pause asks again, the longer silence forgotten), and
  ``silence_duration_ms`` of silence (the eagerness's longest wait) ends it anyway. Either
  way the turn's audio, and ``audio_end_ms``, end ``check_ms`` after the last speech, wherever the
  decision was made. ``events`` judges frames lazily, so a verdict applied between two events
  takes effect on the very next frame.

All positions are absolute: samples of the session's input since it began (the input buffer's
time base), counted from ``origin``, the position of the first sample this detector is given. A
detector made mid-session (after a clear, a commit or a settings change) therefore reports
positions the buffer can slice, and ``audio_start_ms`` keeps counting from the session's start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import webrtcvad

from dsp.resample import Resampler

from .config import VadSettings

FRAME_MS = 20
START_FRAMES, START_WINDOW = 3, 5
# how far before the moment it is detected a turn's speech onset can lie (the onset window)
ONSET_LOOKBACK_MS = START_WINDOW * FRAME_MS
BREAK_FRAMES = 2
VAD_RATES = (8000, 16000, 32000, 48000)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    start: int  # first sample the turn keeps (speech onset minus prefix padding)
    onset: int  # first speech sample


@dataclass(frozen=True, slots=True)
class Quiet:
    """The first silent frame after speech in a turn: the words so far may be all there is, and a
    pipeline whose ears are cheap can hear them now, ahead of the pause (``PipelineSession.quiet``)."""

    at: int


@dataclass(frozen=True, slots=True)
class Paused:
    at: int


@dataclass(frozen=True, slots=True)
class Resumed:
    at: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    end: int  # last sample the turn keeps (includes the end-of-turn silence)
    speech_end: int  # end of the last speech frame


@dataclass(frozen=True, slots=True)
class EndCheck:
    at: int  # where the turn ends if it ends here (the last speech plus the check silence)
    speech_end: int


TurnEvent = SpeechStarted | Quiet | Paused | Resumed | EndCheck | SpeechStopped


def floor_rms(threshold: float) -> float:
    """Energy floor in int16 RMS: -70 dBFS at threshold 0, -50 at 0.5, -30 at 1."""
    return 32768.0 * 10 ** ((-70.0 + 40.0 * threshold) / 20.0)


class TurnDetector:
    def __init__(self, settings: VadSettings, rate: int, pause_ms: int = 200, check_ms: int | None = None, origin: int = 0) -> None:
        self.settings = settings
        self.rate = rate
        self.origin = origin
        self._vad_rate = rate if rate in VAD_RATES else 16000
        self._to_vad = Resampler(rate, self._vad_rate)
        self._vad = webrtcvad.Vad(min(3, int(settings.threshold * 4)))
        self._frame = self._vad_rate * FRAME_MS // 1000
        self._floor_sq = floor_rms(settings.threshold) ** 2 * self._frame
        self._scale = rate / self._vad_rate  # vad samples -> input samples
        self._pending = np.zeros(0, np.int16)
        self._frames = 0  # frames judged since the start
        self._recent: deque[bool] = deque(maxlen=START_WINDOW)
        self.in_speech = False
        self._silence = 0
        self._streak = 0
        self._paused = False
        self._last_speech_end = origin
        ms = lambda v: max(1, round(v / FRAME_MS))  # noqa: E731
        self._pause_frames = ms(pause_ms)
        self._stop_frames = ms(settings.silence_duration_ms)
        self._check_frames = 0 if check_ms is None else min(ms(check_ms), self._stop_frames - 1)
        if self._check_frames:
            self._pause_frames = min(self._pause_frames, self._check_frames)
        self._check_at = 0
        self._deadline = self._stop_frames  # the silence that ends this pause's turn (end_after)
        self._padding = int(settings.prefix_padding_ms * rate / 1000)

    @property
    def last_speech_end(self) -> int:
        """Input position of the end of the last frame judged speech (in a turn)."""
        return self._last_speech_end

    def _pos(self, frames: int) -> int:
        return self.origin + int(frames * self._frame * self._scale)

    @property
    def checks(self) -> bool:
        """Whether this detector asks for end-of-turn decisions (semantic VAD)."""
        return bool(self._check_frames)

    def end_turn(self) -> None:
        """The turn ended (an end-of-turn model's verdict): listen for the next one."""
        self.in_speech = False
        self._recent.clear()

    def end_after(self, silence_ms: float) -> None:
        """End the turn once its silence reaches ``silence_ms`` (sooner than the longest wait),
        unless speech resumes first."""
        self._deadline = max(self._silence + 1, min(self._stop_frames, round(silence_ms / FRAME_MS)))

    def process(self, pcm: np.ndarray) -> list[TurnEvent]:
        return list(self.events(pcm))

    def events(self, pcm: np.ndarray) -> Iterator[TurnEvent]:
        """The events of ``pcm``, each frame judged only when the next event is asked for."""
        pcm = self._to_vad(pcm)
        if len(self._pending):
            pcm = np.concatenate((self._pending, pcm))
        size = self._frame
        n = len(pcm) // size
        self._pending = pcm[n * size :]
        if not n:
            return
        frames = pcm[: n * size].reshape(n, size)
        f = frames.astype(np.float32)
        loud = np.einsum("ij,ij->i", f, f) >= self._floor_sq  # the energy floor, all frames at once
        for i in range(n):
            speech = bool(loud[i]) and self._vad.is_speech(frames[i].tobytes(), self._vad_rate)
            self._frames += 1
            yield from self._step(speech)

    def _step(self, speech: bool) -> Iterator[TurnEvent]:
        if not self.in_speech:
            self._recent.append(speech)
            if speech and sum(self._recent) >= START_FRAMES:
                first = self._frames - len(self._recent) + next(i for i, s in enumerate(self._recent) if s)
                self._recent.clear()
                self.in_speech, self._silence, self._streak, self._paused = True, 0, 0, False
                self._deadline = self._stop_frames
                self._last_speech_end = self._pos(self._frames)
                onset = self._pos(first)
                yield SpeechStarted(max(self.origin, onset - self._padding), onset)
            return
        self._streak = self._streak + 1 if speech else 0
        if speech and (self._silence == 0 or self._streak >= BREAK_FRAMES):
            self._silence = 0
            self._deadline = self._stop_frames
            self._last_speech_end = self._pos(self._frames)
            if self._paused:
                self._paused = False
                yield Resumed(self._last_speech_end)
            return
        self._silence += 1
        if self._silence >= self._deadline:
            self.in_speech = False
            self._recent.clear()
            end = self._check_at if self._check_frames else self._pos(self._frames)
            yield SpeechStopped(end, self._last_speech_end)
            return
        if self._silence == 1:
            yield Quiet(self._pos(self._frames))
        if self._silence == self._pause_frames and self._pause_frames < self._stop_frames:
            self._paused = True
            yield Paused(self._pos(self._frames))
        if self._silence == self._check_frames:
            self._check_at = self._pos(self._frames)
            yield EndCheck(self._check_at, self._last_speech_end)
