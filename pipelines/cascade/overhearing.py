"""The open turn heard while it is spoken: the ears' passes over the words so far.

With ears whose cost follows the clip (Moonshine), the turn is heard as it grows: a pass every
``every_ms`` of new audio while the ASR thread is free, and one at once when the user goes quiet
(``quiet``: the first silent frame after speech). After that, none over the silence that follows
(it would only take the cores from the answer being made ahead) until speech resumes after a pause
(``resumed``), or the user goes quiet again (a gap between words). Each pass goes on from the previous one's tokens
(``Words.tokens``, the listener's ``hint``), so it decodes only what is new. What the passes give:

* at the pause (``words_for``): when the last pass began at the moment the user went quiet, nothing
  was said since, and its words are the turn's: the pause does not wait for the ears at all.
  Otherwise a pass over the whole turn, going on from the last one.
* live captions (``caption``): the newest pass, when it heard nearly all of the audio given.
* the item's transcript at a commit with no pause before it (manual turns): ``words_for`` too; with
  no turn detection, the newest pass is the turn's when webrtcvad hears no speech after it.

Bounded: one pass at a time per session, none while another session's pass holds the ASR thread
(except the pass at ``quiet``, which matters most), a session's passes at most half of its time on
that thread, and none over a turn longer than ``MAX_TURN_S`` (its words are heard at the end).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipelines.cascade.listener import Words

MAX_TURN_S = 20.0


class Told(Protocol):
    """Who is told of the passes over the open turn (the words they settle on go to the thinker as
    they are spoken: words_ahead.py)."""

    def heard(self, before: Words | None, after: Words) -> None:
        """A pass heard words (``after``); ``before``: the turn's pass before it, if any."""

    def reset(self) -> None:
        """The turn was committed or cleared."""


@dataclass(eq=False)
class Pass:
    turn: int  # which turn of the session
    samples: int  # how much of it it heard
    words: asyncio.Future[Words]
    began: float
    ended: float | None = None


class Overhearing:
    """Per session. ``hear(pcm, ends, hint)``: a pass of the ears on the ASR thread; ``busy()``:
    whether that thread has work queued or running; ``told``: of each pass over the open turn that
    heard words, and of the turn's end."""

    def __init__(
        self,
        hear: Callable[[np.ndarray, bool, tuple[int, ...]], Awaitable[Words]],
        busy: Callable[[], bool],
        rate: int,
        every_ms: int,
        told: Told | None = None,
    ) -> None:
        self.hear = hear
        self.told = told
        self.busy = busy
        self.rate = rate
        self.every = rate * every_ms // 1000
        self.max_samples = int(MAX_TURN_S * rate)
        self.turn: list[np.ndarray] = []
        self.samples = 0
        self.on = False  # the session wants the turn heard as it goes (an answer or captions follow)
        self.latest: Pass | None = None  # the newest pass begun over this turn
        self.done: Pass | None = None  # the newest pass done with words (its tokens go on)
        self.quiet_at: int | None = None  # the turn's length when the user last went quiet
        self.silent = False  # since then nothing says the user spoke again: no pass over the silence
        self._want_quiet = False  # a pass at the quiet waits for the running one
        self.passes = 0  # begun, over the session (stats)
        self._turns = 0  # turns reset so far: a pass over an earlier one is nobody's

    def feed(self, pcm: np.ndarray) -> None:
        self.turn.append(pcm)
        self.samples += len(pcm)
        if self.on and self.every and not self.silent and self._idle() and not self.busy() and self.samples - self._heard() >= self.every and self._rested():
            self._begin()

    def quiet(self) -> None:
        """The user went quiet: hear what was said up to here now (or as soon as the pass under way ends)."""
        self.quiet_at = self.samples
        self.silent = True
        if not self.on or not self.every:
            return
        if self._idle():
            self._begin()
        else:
            self._want_quiet = True

    def resumed(self) -> None:
        """Speech again after a pause: hear it as it grows again. (Speech again after a shorter
        gap is heard at the next ``quiet``.)"""
        self.silent = False

    def reset(self) -> None:
        """The turn was committed or cleared: the next turn starts from nothing."""
        self.turn, self.samples = [], 0
        self._turns += 1
        self.latest = self.done = None
        self.quiet_at = None
        self.silent = False
        self._want_quiet = False
        if self.told is not None:
            self.told.reset()

    def audio(self) -> np.ndarray:
        return np.concatenate(self.turn) if self.turn else np.zeros(0, np.int16)

    async def words_for(self, pcm: np.ndarray, ends: bool) -> Words:
        """The words of ``pcm`` (the turn from its start, as fed): the newest pass if it was begun
        after the user last went quiet (at that moment, or once the pass under way then ended) and
        ``pcm`` adds only the silence after it, else a pass of its own going on from the newest one."""
        reuse = self.latest
        if (
            reuse is not None
            and self.silent  # (no speech after a pause since the user went quiet)
            and self.quiet_at is not None
            and self.quiet_at <= reuse.samples <= len(pcm) <= self.samples
        ):
            try:
                words = await asyncio.shield(reuse.words)
            except Exception:  # (cancelled, or the pass failed) heard again below
                words = None
            if words is not None and (not ends or words.ends is not None or not words.text):
                return words
        done = self.done
        if self.quiet_at is None and done is not None and done.samples <= len(pcm) <= self.samples and unvoiced(pcm[done.samples :], self.rate):
            words = done.words.result()  # no turn detection (manual turns), and nothing said since that pass
            if not ends or words.ends is not None or not words.text:
                return words
        return await self._pass(pcm, ends)

    async def caption(self, pcm: np.ndarray) -> str | None:
        """The words so far for live captions: the newest pass if it heard nearly all of ``pcm``,
        else a pass now unless the ASR thread is busy (None: no caption this time)."""
        latest = self.latest
        if latest is not None and len(pcm) - latest.samples < max(self.every, 1) and latest.samples <= len(pcm):
            try:
                return (await asyncio.shield(latest.words)).text
            except Exception:
                return None
        if self.busy():
            return None
        return (await self._pass(pcm, True)).text

    # ------------------------------------------------------------------ passes

    def _heard(self) -> int:
        return self.latest.samples if self.latest is not None else 0

    def _idle(self) -> bool:
        return (self.latest is None or self.latest.words.done()) and 0 < self.samples <= self.max_samples

    def _rested(self) -> bool:
        """At most half of this session's time on the ASR thread: as long since the last pass as it took."""
        last = self.latest
        if last is None or last.ended is None:
            return True
        return time.perf_counter() - last.ended >= last.ended - last.began

    def _begin(self) -> None:
        self._want_quiet = False
        asyncio.ensure_future(self._pass(self.audio(), True))

    def _pass(self, pcm: np.ndarray, ends: bool) -> asyncio.Future[Words]:
        hint = self.done.words.result().tokens if self.done is not None else ()
        made = Pass(self._turns, len(pcm), asyncio.ensure_future(self.hear(pcm, ends, hint)), time.perf_counter())
        self.passes += 1
        if self.latest is None or made.samples >= self.latest.samples:
            self.latest = made
        made.words.add_done_callback(lambda _: self._finished(made))
        return made.words

    def _finished(self, made: Pass) -> None:
        made.ended = time.perf_counter()
        if made.words.cancelled() or made.words.exception() is not None or made.turn != self._turns:
            return  # (a failed pass is heard again when needed; one over an earlier turn is nobody's)
        before = self.done
        if before is None or (made.samples >= before.samples and made.words.result().tokens):
            self.done = made  # (a pass that heard no words leaves the last one's tokens to go on from)
        if self._want_quiet and self.quiet_at is not None and self._idle():
            self._begin()
        if self.done is made and self.told is not None and made.words.result().text:
            self.told.heard(before.words.result() if before is not None else None, made.words.result())


def unvoiced(pcm: np.ndarray, rate: int) -> bool:
    """Whether webrtcvad (its most permissive mode, 20 ms frames) hears no speech in ``pcm``: with
    manual turns nothing else says the user went quiet, and the words of a pass that ended where
    the speech did are the turn's."""
    import webrtcvad

    if rate not in (8000, 16000, 32000, 48000):
        return False
    vad = webrtcvad.Vad(0)
    frame = rate // 50
    return not any(vad.is_speech(pcm[i : i + frame].tobytes(), rate) for i in range(0, len(pcm) - frame + 1, frame))
