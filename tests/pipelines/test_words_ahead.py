"""The open turn's words given to the thinker while they are spoken (pipelines/cascade/words_ahead.py):
which words are settled, that their tokens are where every prompt that goes on from them begins
(the default thinker's own tokenizer and chat template), and the bookkeeping of giving them: one
part at a time, only to the session's request for the turn, a fresh request when words given are
heard again as others. The engine request is stood in for by ``Request`` (the real one, on the
real engine, is test_turn_judgement.py's); the ears are the real Moonshine."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from pipelines import models
from pipelines.base import Message, Part, ResponseRequest, Tool
from pipelines.cascade.listener import Words
from pipelines.cascade.overhearing import Overhearing
from pipelines.cascade.prompts import Prompts
from pipelines.cascade.shared import Counts
from pipelines.cascade.thinker import Thinker as RealThinker, ThinkerOptions
from pipelines.cascade.words_ahead import HOLD, WordsAhead, count_answer, rewrites, stable_words
from pipelines.turn_end import judgement

RATE = 16000
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
HISTORY = [Message("item_1", "user", [Part("text", text="Hi there.")]), Message("item_2", "assistant", [Part("text", text="Hello! How can I help?")])]
WEATHER = Tool("get_weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


@pytest.mark.parametrize(
    "before, after, stable",
    [
        ("", "What is", []),  # one pass: nothing agreed yet
        ("What is", "What is the", ["What", "is"]),
        ("What is the", "What is the weather", ["What", "is", "the"]),
        ("What is", "What is", ["What"]),  # the newest pass's last word is held back
        ("I want t", "I want to go", ["I", "want"]),  # a word cut by the pass's end: not agreed
        ("I want to go to", "I want to go, please", ["I", "want", "to"]),  # heard again with a comma
        ("Book a table", "Look at the table", []),
    ],
)
def test_stable_words_are_what_two_passes_agree_on_less_the_newest_last(before, after, stable):
    assert stable_words(before.split(), after.split()) == stable
    assert HOLD == 1


@pytest.mark.parametrize(
    "given, newest, rewritten",
    [
        ("What is the", "What is the weather in", False),
        ("What is the", "What is", False),  # a pass that says less says nothing against them
        ("What is the", "What is a", False),  # its last word may still change
        ("What is the", "What is a good", True),
        ("I want to go", "I want to go, please", True),
    ],
)
def test_words_given_are_rewritten_when_a_later_pass_says_others(given, newest, rewritten):
    assert rewrites(given.split(), newest.split()) is rewritten


# ------------------------------------------------------------------------------ tokens


@pytest.fixture(scope="module")
def thinker() -> RealThinker:
    """The default thinker's tokenizer and chat template (configs/cpu.yaml: Qwen2.5-Coder-0.5B)."""
    from transformers import AutoTokenizer

    t = RealThinker(ThinkerOptions())
    t.tokenizer = AutoTokenizer.from_pretrained(str(models.path("qwen2.5-coder-0.5b-instruct-w8")))
    return t


def request(tools: bool = False) -> ResponseRequest:
    return ResponseRequest("resp_1", HISTORY, INSTRUCTIONS, tools=[WEATHER] if tools else [])


@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize(
    "said",
    [
        "What is the weather like in Paris tomorrow?",
        "I'd like to book a table for 4 people at 7:30, please.",
        "Can you tell me what's 3.5 times 12 and why?",
        "OK, so um, I'm looking for a cheap flight to New York... maybe on Friday",
        "It costs $20 or €15 - I don't know which!",
    ],
)
def test_the_first_words_tokens_begin_every_prompt_that_goes_on_from_them(thinker, tools, said):
    """What giving words ahead rests on: the conversation so far, then the tokens of the first k
    words alone, is where the turn's prompt (with all the words) begins, and where the
    judgement's words (their final punctuation stripped) begin, for every k."""
    prompts = Prompts(thinker, lambda: True, "hidden")
    prefix = prompts.prefix(request(tools))
    prompt = prompts.prompt(request(tools), pending=said)
    judged = prefix + list(thinker.tokenizer.encode(judgement.bare(said), add_special_tokens=False))
    words = said.split()
    for k in range(1, len(words)):
        given = prefix + list(thinker.tokenizer.encode(" ".join(words[:k]), add_special_tokens=False))
        assert prompt[: len(given)] == given, words[:k]
        assert judged[: len(given)] == given, words[:k]


# ------------------------------------------------------------------------------ giving them


class Request:
    """The turn's engine request as words are given to it (``StreamedPrompt``'s side of it): each
    part's step is done when the test says the engine prefilled it (``prefill``)."""

    def __init__(self, prefix: list[int], salt: str, judging: bool) -> None:
        self.prefix, self.salt = prefix, salt
        self.logprobs = 20 if judging else None
        self.sent = list(prefix)
        self.words: tuple[str, ...] = ()
        self.ahead = 0
        self.used = False
        self.parts: list[list[int]] = []
        self.step: asyncio.Future[Any] = asyncio.get_running_loop().create_future()  # the prefix's
        self.closed = 0

    def prefill(self) -> None:
        if not self.step.done():
            self.step.set_result(None)

    def extend(self, ids: list[int], words: Any) -> asyncio.Future[Any] | None:
        if not ids or self.used or not self.step.done():
            return None
        self.parts.append(list(ids))
        self.sent += ids
        self.words, self.ahead = tuple(words), self.ahead + len(ids)
        self.step = asyncio.get_running_loop().create_future()
        return self.step

    def fits(self, prompt: list[int]) -> bool:
        return len(prompt) > len(self.sent) and prompt[: len(self.sent)] == self.sent

    async def close(self) -> None:
        self.used = True
        self.closed += 1
        self.step.cancel()


class Thinker:
    """The thinker as words are given: its tokenizer (the real one), and fresh requests."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.opened: list[Request] = []

    def encode(self, text: str) -> list[int]:  # (as the thinker's)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def open_prompt(self, prefix: list[int], salt: str, judging: bool = False) -> Request:
        self.opened.append(Request(prefix, salt, judging))
        return self.opened[-1]


class Session:
    """The session as words are given for it: its request for the turn, and whether it is between
    pauses."""

    def __init__(self, thinker: Thinker, prefix: list[int], salt: str = "salt-a") -> None:
        self.streamed: Any = thinker.open_prompt(prefix, salt, judging=True)
        self.paused = False
        self.tasks: list[asyncio.Future[Any]] = []

    def background(self, coro: Any) -> None:
        self.tasks.append(asyncio.ensure_future(coro))


def giving(thinker: RealThinker, prefix: list[int] | None = None) -> tuple[WordsAhead, Session, Thinker, Counts]:
    engine = Thinker(thinker.tokenizer)
    session = Session(engine, prefix if prefix is not None else [1, 2, 3])
    counts = Counts()
    ahead = WordsAhead(engine, counts, session, session.background, lambda: not session.paused)
    return ahead, session, engine, counts


def heard(ahead: WordsAhead, before: str | None, after: str) -> None:
    """A pass over the turn heard ``after``; the one before it, ``before``."""
    ahead.heard(Words(before, None) if before is not None else None, Words(after, None))


def tokens(thinker: RealThinker, text: str) -> list[int]:
    return list(thinker.tokenizer.encode(text, add_special_tokens=False))


async def test_settled_words_are_given_once_the_prefix_is_in_one_part_at_a_time_the_newest_last(thinker):
    ahead, session, _, counts = giving(thinker)
    request = session.streamed
    heard(ahead, None, "What")
    heard(ahead, "What", "What is the")
    heard(ahead, "What is the", "What is the weather")
    assert request.parts == []  # the conversation's own part is still being prefilled
    request.prefill()
    await asyncio.sleep(0)
    assert request.words == ("What", "is", "the") and request.parts == [tokens(thinker, "What is the")]
    heard(ahead, "What is the weather", "What is the weather like in")
    heard(ahead, "What is the weather like in", "What is the weather like in Paris")
    assert len(request.parts) == 1, "one part at a time: the next waits for the engine's step"
    request.prefill()
    await asyncio.sleep(0)
    assert request.words == tuple("What is the weather like in".split()), "the newest settled words, in one part"
    assert request.parts[1] == tokens(thinker, " weather like in")
    assert request.sent == [1, 2, 3] + tokens(thinker, "What is the weather like in")
    assert (counts.words_ahead_parts, counts.words_ahead_tokens, counts.words_ahead_rewritten) == (2, request.ahead, 0)
    request.prefill()
    await asyncio.sleep(0)
    assert len(request.parts) == 2  # nothing new settled: nothing given


async def test_words_heard_again_as_others_get_a_fresh_request_with_the_same_prefix(thinker):
    ahead, session, engine, counts = giving(thinker)
    old = session.streamed
    old.prefill()
    heard(ahead, "Book a table", "Book a table for")
    assert old.words == ("Book", "a", "table")
    heard(ahead, "Book a table for", "Book a table for two")
    assert counts.words_ahead_rewritten == 0
    heard(ahead, "Book a table for two", "Look at the table for two")
    assert counts.words_ahead_rewritten == 1
    fresh = session.streamed
    assert fresh is not old and fresh is engine.opened[-1] and fresh.prefix == old.prefix and fresh.salt == old.salt
    assert fresh.logprobs == old.logprobs  # (it can be judged in as the old one could)
    await asyncio.gather(*session.tasks)
    assert old.closed == 1  # (closed in the session's background)
    heard(ahead, "Look at the table for two", "Look at the table for two people")
    fresh.prefill()
    await asyncio.sleep(0)
    assert fresh.words == tuple("Look at the table for two".split())
    assert fresh.sent == old.prefix + tokens(thinker, "Look at the table for two")


async def test_at_a_pause_nothing_is_given_and_what_settled_there_goes_once_the_user_speaks_on(thinker):
    ahead, session, engine, counts = giving(thinker)
    request = session.streamed
    request.prefill()
    session.paused = True
    heard(ahead, "What is", "What is the")
    assert request.parts == []  # at a pause the words go to the judgement and the answer
    session.streamed = fresh = engine.open_prompt([1, 2, 3], "salt-a")  # the pause's was dropped with its answer
    session.paused = False
    ahead.give()  # (the session's resume)
    assert fresh.parts == []  # its prefix first
    fresh.prefill()
    await asyncio.sleep(0)
    assert fresh.parts == [tokens(thinker, "What is")] and request.parts == []


async def test_a_turns_words_reach_no_other_request(thinker):
    ahead, session, engine, counts = giving(thinker)
    request = session.streamed
    request.prefill()
    heard(ahead, "What is", "What is the")
    heard(ahead, "What is the", "What is the weather")  # (waits for the part under way)
    assert request.parts == [tokens(thinker, "What is")]
    ahead.reset()  # the turn was committed (or cleared) ...
    session.streamed = other = engine.open_prompt([1, 2, 3, 4], "salt-a")  # ... and the next one began
    other.prefill()
    request.step.set_result(None)  # the old turn's part done after that
    await asyncio.sleep(0)
    assert other.parts == [] and request.parts == [tokens(thinker, "What is")]
    heard(ahead, "Thanks", "Thanks a lot")
    assert other.parts == [tokens(thinker, "Thanks")]
    step = other.step
    heard(ahead, "Thanks a lot", "Thanks a lot for")
    session.streamed = None  # handed on at a pause (the judgement or the answer took it)
    step.set_result(None)
    await asyncio.sleep(0)
    assert other.parts == [tokens(thinker, "Thanks")] and counts.words_ahead_parts == 2


async def test_the_option_off_gives_nothing(thinker):
    ahead, session, _, counts = giving(thinker)
    ahead.on = False
    session.streamed.prefill()
    heard(ahead, "What is the", "What is the weather")
    await asyncio.sleep(0)
    assert session.streamed.parts == [] and counts.words_ahead_parts == 0


# ------------------------------------------------------------------------------ the real ears


@pytest.fixture(scope="module")
def ears() -> Any:
    from pipelines.cascade.ears import open_listener

    return open_listener("moonshine-base", str(models.ensure("moonshine-base")), threads=2)


async def test_a_spoken_turn_leaves_only_its_last_words_to_the_pause(thinker, ears):
    """Moonshine's passes over a turn as it is spoken (real time, every 300 ms): the words they
    settle on are given ahead, and the turn's prompt at the pause (the quiet pass's words) goes on
    from all that was given, so the pause prefills only the rest."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.audio import espeak, silence

    pool = ThreadPoolExecutor(1)
    busy = [0]

    async def hear(pcm: np.ndarray, ends: bool, hint: tuple[int, ...]) -> Words:
        busy[0] += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, ears.hear, pcm, ends, hint)
        finally:
            busy[0] -= 1

    prompts = Prompts(thinker, lambda: True, "hidden")
    prefix = prompts.prefix(request())
    ahead, session, _, counts = giving(thinker, prefix)
    over = Overhearing(hear, lambda: busy[0] > 0, RATE, 300, ahead)
    over.on = True
    said = espeak("I would like to know what the weather is going to be like in Lisbon tomorrow morning.", RATE)
    for i in range(0, len(said), RATE // 50):  # in real time, 20 ms a frame
        over.feed(said[i : i + RATE // 50])
        session.streamed.prefill()  # the engine prefills each part as soon as it is given
        await asyncio.sleep(0.02)
    over.quiet()
    session.paused = True
    for i in range(5):
        over.feed(silence(20, RATE))
        await asyncio.sleep(0.02)
    words = await over.words_for(over.audio(), ends=True)
    pool.shutdown()
    prompt = prompts.prompt(request(), pending=words.text)
    request_ = session.streamed
    assert request_.ahead > 0 and counts.words_ahead_parts >= 1, "words were given while the turn was spoken"
    assert request_.fits(prompt), "the pause's prompt goes on from every word given ahead"
    counted = Counts()
    count_answer(counted, request_, prompt)
    turn = counted.answer_turn_tokens
    assert counted.answers_streamed == 1 and counted.answer_turn_tokens_ahead == request_.ahead < turn
    print(f"\nturn tokens {turn}: given ahead {request_.ahead}, at the pause {turn - request_.ahead} (without: {turn}); {words.text!r}")
