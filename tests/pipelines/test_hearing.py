"""The cascade's Hearing on its own: what it gives the turn-end policy within the policy's bound,
and what it leaves behind when a pause is voided or kept. Whisper (its words and its own judgement
of them) and the thinker are stood in for by coroutines with set delays (the real ones are exercised through the server in
test_cpu_pipeline.py and test_turn_judgement.py); what is tested here is the hearing's own
bookkeeping: bounds, cancellation, and the engine request it owns."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from pipelines.base import Heard
from pipelines.cascade.hearing import Hearing
from pipelines.cascade.listener import Words
from pipelines.cascade.shared import Counts

AUDIO = np.zeros(16000, np.int16)
PREFIX = [1, 2, 3]


class Request:
    """A streamed engine request as the hearing holds it: it can be closed, once."""

    def __init__(self) -> None:
        self.closed = 0
        self.judged = False  # (the thinker's words_end judges in it)
        self.ahead = 0  # no words given while the user spoke (tests/pipelines/test_words_ahead.py)

    async def close(self) -> None:
        self.closed += 1


class Judge:
    def __init__(self, ends: float | None, delay_s: float = 0.0, fails: bool = False) -> None:
        self.ends, self.delay_s, self.fails = ends, delay_s, fails
        self.asked: list[tuple[list[int], str, Any]] = []

    async def words_end(self, prefix: list[int], text: str, salt: str, streamed: Any = None) -> float | None:
        self.asked.append((prefix, text, streamed))
        if streamed is not None:
            streamed.judged = True
        await asyncio.sleep(self.delay_s)
        if self.fails:
            raise RuntimeError("engine gone")
        return self.ends


def hearing(
    judge: Judge | None, words: str = "What time is it?", asr_s: float = 0.0, by: str = "thinker", ends: float = 0.4
) -> tuple[Hearing, dict[str, float], list[Any]]:
    """``by``: who judges (the listener's own judgement is ``ends``, given with its words when asked)."""
    asked: list[bool] = []

    async def hear(pcm: np.ndarray, judged: bool) -> Words:
        asked.append(judged)
        await asyncio.sleep(asr_s)
        return Words(words, ends if judged else None)

    counts = Counts()
    tasks: list[Any] = []
    h = Hearing(hear, judge, "salt", counts, lambda coro: tasks.append(asyncio.ensure_future(coro)), "s1", by)  # type: ignore[arg-type]
    h.judging = judge is not None or by == "listener"
    h.asked = asked  # type: ignore[attr-defined]
    return h, counts, tasks


async def test_the_words_and_their_judgement_in_the_streamed_request():
    judge, request = Judge(0.7), Request()
    h, counts, _ = hearing(judge)
    h.pause(AUDIO, PREFIX, request)  # type: ignore[arg-type]
    assert await h.heard(1.0) == Heard("What time is it?", 0.7, "thinker", listener=0.4)  # the listener's beside it: free
    assert judge.asked == [(PREFIX, "What time is it?", request)] and h.asked == [True]  # type: ignore[attr-defined]
    assert (counts.words_judged, counts.words_judged_streamed) == (1, 1)
    assert await h.current.claim() is request and request.closed == 0  # type: ignore[union-attr]  # the answer's now


async def test_the_listener_judges_its_own_words_and_the_thinker_is_not_asked():
    judge, request = Judge(0.7), Request()
    h, counts, tasks = hearing(judge, by="listener", ends=0.4)
    h.pause(AUDIO, PREFIX, request)  # type: ignore[arg-type]
    assert await h.heard(1.0) == Heard("What time is it?", 0.4, "listener")
    assert judge.asked == [] and h.asked == [True]  # type: ignore[attr-defined]
    assert (counts.words_judged, counts.words_judged_streamed) == (1, 0)
    await asyncio.gather(*tasks)
    assert request.closed == 1  # not a judgement's: the answer takes the open turn's request itself


async def test_without_judging_the_listener_is_not_asked_for_its_judgement():
    h, counts, _ = hearing(None, by="listener")
    h.judging = False
    h.pause(AUDIO, None, None)
    assert await h.heard(1.0) == Heard("What time is it?") and h.asked == [False]  # type: ignore[attr-defined]
    assert counts.words_judged == 0


async def test_a_thinkers_judgement_later_than_the_bound_leaves_the_listeners():
    h, _, _ = hearing(Judge(0.7, delay_s=5.0))
    h.pause(AUDIO, PREFIX, None)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await h.heard(0.2) == Heard("What time is it?", 0.4, "listener")
    assert loop.time() - t0 < 2.0  # the bound held, not the judgement's 5 s
    h.drop()


async def test_words_later_than_the_bound_are_nothing_heard():
    h, _, _ = hearing(None, asr_s=5.0)
    h.pause(AUDIO, None, None)
    assert await h.heard(0.1) is None
    h.drop()


async def test_without_judging_only_the_words_are_heard_and_a_given_request_is_closed():
    request = Request()
    h, counts, tasks = hearing(None)
    h.pause(AUDIO, PREFIX, request)  # type: ignore[arg-type]
    assert await h.heard(1.0) == Heard("What time is it?") and h.asked == [False]  # type: ignore[attr-defined]
    await asyncio.gather(*tasks)
    assert request.closed == 1 and counts.words_judged == 0


async def test_speech_going_on_voids_the_pause_and_closes_its_request_even_before_the_judgement_ran():
    request = Request()
    h, _, tasks = hearing(Judge(0.7, delay_s=1.0))
    heard = h.pause(AUDIO, PREFIX, request)  # type: ignore[arg-type]
    h.drop()  # at once: the judgement task has not started yet
    assert heard.judged is not None
    await asyncio.wait([heard.judged])
    await asyncio.sleep(0)  # its done callbacks
    await asyncio.gather(*tasks)
    assert heard.words.cancelled() and heard.judged.cancelled()
    assert request.closed == 1
    assert await h.heard(1.0) is None


async def test_a_committed_turn_keeps_its_words_when_its_pause_is_voided():
    h, _, tasks = hearing(Judge(0.7, delay_s=1.0), asr_s=0.05)
    h.pause(AUDIO, PREFIX, Request())  # type: ignore[arg-type]
    heard = h.keep()
    assert heard is not None and h.current is None
    heard.void(lambda coro: tasks.append(asyncio.ensure_future(coro)))
    assert await heard.words == "What time is it?"  # the item's transcript survives
    await asyncio.gather(*tasks)


async def test_a_failed_judgement_gives_the_words_and_drops_the_request_it_was_made_in():
    request = Request()
    h, counts, _ = hearing(Judge(None, fails=True))
    h.pause(AUDIO, PREFIX, request)  # type: ignore[arg-type]
    assert await h.heard(1.0) == Heard("What time is it?", 0.4, "listener")  # the listener's judgement, in its place
    assert request.closed == 1 and counts.words_judged == 0
    assert await h.current.claim() is None  # type: ignore[union-attr]  # not for the answer


async def test_a_new_pause_voids_the_last():
    h, _, tasks = hearing(Judge(0.7, delay_s=1.0))
    first = h.pause(AUDIO, PREFIX, Request())  # type: ignore[arg-type]
    second = h.pause(AUDIO, PREFIX, None)
    await asyncio.sleep(0)
    assert first.words.cancelled() and h.current is second
    h.drop()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("samples, expected", [(len(AUDIO), "What time is it?"), (len(AUDIO) - 1, None)])
async def test_a_caption_of_exactly_the_paused_audio_reuses_its_words(samples, expected):
    h, _, _ = hearing(None)
    h.pause(AUDIO, None, None)
    assert await h.words_of(samples) == expected
    h.drop()


@pytest.mark.parametrize("seed", range(20))
async def test_random_moves_leave_no_request_open_and_no_kept_words_cancelled(seed):
    """Seeded random pauses, speech going on, commits, claims and reads, against a small model of
    what the hearing owes: every engine request it was given is, in the end, either claimed by an
    answer or closed exactly once; the words of a committed turn are never cancelled; what it hears
    is always the last pause's."""
    import random

    rng = random.Random(seed)
    judge = Judge(0.5, delay_s=0.002)
    h, _, tasks = hearing(judge, asr_s=0.001)
    given: list[Request] = []
    claimed: list[Any] = []
    kept = []
    last_samples = None
    for _ in range(60):
        move = rng.choice(["pause", "pause", "drop", "keep", "heard", "claim", "sleep"])
        if move == "pause":
            request = Request() if rng.random() < 0.7 else None
            if request is not None:
                given.append(request)
            n = rng.randint(1600, 32000)
            h.pause(np.zeros(n, np.int16), PREFIX, request)  # type: ignore[arg-type]
            last_samples = n
        elif move == "drop":
            h.drop()
            last_samples = None
        elif move == "keep":
            heard = h.keep()
            if heard is not None:
                kept.append(heard)
                if rng.random() < 0.5:  # no answer goes on from it
                    heard.void(lambda coro: tasks.append(asyncio.ensure_future(coro)))
                else:  # an answer claims its request
                    claimed.append(await heard.claim())
            last_samples = None
        elif move == "heard":
            got = await h.heard(0.05)
            if last_samples is None:
                assert got is None
        elif move == "claim" and h.current is not None:
            claimed.append(await h.current.claim())
        else:
            await asyncio.sleep(rng.choice([0, 0.001, 0.005]))
        assert (h.current.samples if h.current is not None else None) == last_samples
    h.drop()
    for _ in range(5):  # let cancellations run their callbacks
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks, return_exceptions=True)
    claimed_ids = {id(c) for c in claimed if c is not None}
    for request in given:
        assert request.closed == (0 if id(request) in claimed_ids else 1), (seed, request.closed)
    for heard in kept:
        assert not heard.words.cancelled()


async def test_closing_stops_the_judgement_and_hands_its_request_to_be_closed_before_it_returns():
    request = Request()
    h, _, tasks = hearing(Judge(0.7, delay_s=5.0))
    heard = h.pause(AUDIO, PREFIX, request)  # type: ignore[arg-type]
    await asyncio.sleep(0.01)  # the judgement is under way
    await h.close()
    assert heard.judged is not None and heard.judged.cancelled()
    assert tasks  # the close of its request was handed on by then
    await asyncio.gather(*tasks)
    assert request.closed == 1
