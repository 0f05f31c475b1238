"""What a cascade session hears of the open turn at each pause: the words and a judgement of them.

At a pause (``PipelineSession.pause``) the turn so far goes to Whisper. When semantic_vad asks
(``judging``), the words come with a judgement of whether they end the user's message, by the
session's ``judge``: the thinker's (``"thinker"``, the cascade's default: one engine step over the
words, pipelines/turn_end/judgement.py, in the turn's streamed request when it has one: the words
are then prefilled there for the answer too, and the request is handed on to the speculation,
``claim``; else in a request of its own), or the listener's own (``"listener"``: Whisper's
probability of its last word and of an end after it, read in the same pass,
pipelines/cascade/listener.py). The listener's comes with the words either way: beside the
thinker's, and in its place when that one is late or fails. The turn-end policy asks
``heard(within_s)``: the words and the judgements, whatever of them is ready within its bound.

One ``Heard`` round per pause: the user speaking on voids it (``drop``); a commit keeps its words
for the turn's item (``keep``). ``bench.turns`` hears through this class too, so the end-of-turn
figures and the fusion's fit come from the product's own hearing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from pipelines.base import Heard
from pipelines.cascade.listener import Words
from pipelines.cascade.shared import Counts
from pipelines.cascade.thinker import StreamedPrompt

log = logging.getLogger(__name__)


class Judging(Protocol):
    """The thinker's side (``Thinker``): P(the words end the message)."""

    async def words_end(self, prefix: list[int], text: str, salt: str, streamed: StreamedPrompt | None = None) -> float | None: ...


@dataclass(eq=False)
class Round:
    """What was heard at one pause."""

    samples: int  # of the turn, up to the pause
    words: asyncio.Future[str] = field(init=False)  # Whisper's pass
    judged: asyncio.Task[None] | None = None  # the thinker's judgement (semantic_vad, judge "thinker")
    ends: float | None = None  # the thinker's judgement, once ``judged`` is done
    listener_ends: float | None = None  # the listener's own, with its words (semantic_vad)
    streamed: StreamedPrompt | None = None  # the request it was made in, until claimed
    kept: bool = False  # the turn's item took the words
    times: dict[str, float] = field(default_factory=dict)  # asr, judged (perf_counter)

    async def text(self) -> str | None:
        """The words, or None if the pass was voided or failed (waited on, never cancelled from here)."""
        await asyncio.wait([self.words])
        return None if self.words.cancelled() or self.words.exception() is not None else self.words.result()

    async def claim(self) -> StreamedPrompt | None:
        """After the judgement: the streamed request it was made in, now the caller's (once)."""
        if self.judged is not None:
            await asyncio.wait([self.judged])
        streamed, self.streamed = self.streamed, None
        return streamed

    def void(self, background: Callable[[Awaitable[None]], None]) -> None:
        """Nobody needs this round any more: cancel what runs, close an unclaimed request (once the
        judgement has stopped using it)."""
        if not self.kept:
            self.words.cancel()
        if self.judged is not None and not self.judged.done():
            self.judged.cancel()
            self.judged.add_done_callback(lambda _: self._close(background))
        else:
            self._close(background)

    def _close(self, background: Callable[[Awaitable[None]], None]) -> None:
        streamed, self.streamed = self.streamed, None
        if streamed is not None:
            background(streamed.close())


class Hearing:
    """Per pipeline session. ``hear`` runs Whisper off the loop (with ``ends``: its judgement too);
    ``judge``: who judges the words (None: nobody, words only); ``thinker`` for judge "thinker";
    ``counts`` is the pipeline's accounting."""

    def __init__(
        self,
        hear: Callable[[np.ndarray, bool], Awaitable[Words]],
        thinker: Judging | None,
        salt: str,
        counts: Counts,
        background: Callable[[Awaitable[None]], None],
        name: str = "",
        judge: Literal["listener", "thinker"] | None = "thinker",
        listener_beside: bool = True,
    ) -> None:
        self.hear = hear
        self.thinker = thinker
        self.judge = judge
        self.salt = salt
        self.counts = counts
        self.background = background
        self.name = name
        # the listener's judgement weighed beside the thinker's: the fusion's weight for it was fitted
        # on Whisper's (pipelines/turn_end/fusion.py), not on Moonshine's
        self.listener_beside = listener_beside
        self.judging = False  # semantic_vad asks for a judgement of the words at each pause
        self.current: Round | None = None

    @property
    def thinker_judges(self) -> bool:
        """Whether the thinker judges the words at a pause (in the turn's streamed request)."""
        return self.judging and self.judge == "thinker" and self.thinker is not None

    def pause(self, audio: np.ndarray, prefix: list[int] | None, streamed: StreamedPrompt | None) -> Round:
        """Hear the turn so far (``audio``); judge its words after ``prefix`` (the conversation up to
        where they go) in ``streamed`` when given (this round owns it from now on)."""
        self.drop()
        self.current = heard = Round(len(audio), times={"pause": time.perf_counter()})
        heard.words = words = asyncio.ensure_future(self._words(heard, audio))
        if self.thinker_judges and prefix is not None:
            heard.streamed = streamed
            heard.judged = asyncio.create_task(self._judge(heard, prefix), name=f"judge:{self.name}")
        elif streamed is not None:
            self.background(streamed.close())
        return heard

    async def _words(self, heard: Round, audio: np.ndarray) -> str:
        judging = self.judging and self.judge is not None  # (the listener's judgement comes with the thinker's too: it is free)
        words = await self.hear(audio, judging)
        # stamped here, not in a done callback: words heard ahead come back at once, and whoever
        # awaits them may read the times before a callback has run
        heard.times.setdefault("asr", time.perf_counter())
        if judging and words.ends is not None:
            heard.listener_ends = words.ends
            self.counts.words_judged += self.judge == "listener"
        return words.text

    async def _judge(self, heard: Round, prefix: list[int]) -> None:
        assert self.thinker is not None
        try:
            text = await heard.text()
            if text is None:
                return
            streamed = heard.streamed
            heard.ends = await self.thinker.words_end(prefix, text, self.salt, streamed)
            heard.times["judged"] = time.perf_counter()
            self.counts.words_judged += 1
            self.counts.words_judged_streamed += streamed is not None and streamed.judged
            if streamed is not None and streamed.ahead and not streamed.judged:  # the words do not go on from those given ahead
                self.counts.words_ahead_missed += 1
        except Exception as exc:  # the decision goes on without it (the sound alone)
            log.warning("session %s: the thinker's end-of-turn judgement failed: %s", self.name, exc)
            if heard.streamed is not None:  # in an unknown state: not for the answer
                await heard.streamed.close()
                heard.streamed = None
        except BaseException:  # cancelled: the round is void, and so is its request
            heard._close(self.background)
            raise

    async def heard(self, within_s: float) -> Heard | None:
        """The last pause's words and judgement, as far as they are ready within ``within_s``."""
        heard = self.current
        if heard is None:
            return None
        deadline = time.monotonic() + within_s
        await asyncio.wait([heard.words], timeout=within_s)
        if not heard.words.done() or heard.words.cancelled() or heard.words.exception() is not None:
            return None
        text = heard.words.result()
        if heard.judged is not None:
            await asyncio.wait([heard.judged], timeout=max(0.0, deadline - time.monotonic()))
            if heard.judged.done() and heard.ends is not None:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("session %s: heard %s", self.name, self._timeline(heard))
                return Heard(text, heard.ends, "thinker", heard.listener_ends if self.listener_beside else None)
            if log.isEnabledFor(logging.DEBUG):  # too late, or it failed: the listener's judgement, if any
                log.debug("session %s: the thinker's judgement is missing (%s)", self.name, self._timeline(heard))
        if heard.listener_ends is not None:
            return Heard(text, heard.listener_ends, "listener")
        return Heard(text)

    @staticmethod
    def _timeline(heard: Round) -> str:
        """ms from the pause to each step of the round, and to now (for the debug log)."""
        t0 = heard.times.get("pause", 0.0)
        steps = {**heard.times, "asked": time.perf_counter()}
        return ", ".join(f"{k} +{(t - t0) * 1000:.0f} ms" for k, t in steps.items() if k != "pause")

    async def words_of(self, samples: int) -> str | None:
        """The words of the turn's first ``samples``, if the last pause heard exactly those."""
        heard = self.current
        return await heard.text() if heard is not None and heard.samples == samples else None

    def drop(self) -> None:
        """The user spoke on (or the turn was cleared): the last pause's hearing is void."""
        heard, self.current = self.current, None
        if heard is not None:
            heard.void(self.background)

    async def close(self) -> None:
        """The session ends: the last pause's hearing is void, its judgement stopped (and the request
        it held handed to ``background`` to close) before this returns."""
        heard = self.current
        self.drop()
        if heard is not None and heard.judged is not None:
            await asyncio.wait([heard.judged])
            await asyncio.sleep(0)  # its done callbacks

    def keep(self) -> Round | None:
        """The turn is committed: its item keeps the last pause's words (the round is returned to
        whoever goes on with it; ``void`` it when done)."""
        heard, self.current = self.current, None
        if heard is not None:
            heard.kept = True
        return heard
