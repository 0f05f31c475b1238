"""The answer-quality bench (bench/answers.py): its scoring, and a small subset end to end through
the real CPU agent (spoken prompts in, the answer's audio transcribed by Whisper base)."""

from __future__ import annotations

import pytest

from bench import answers
from pipelines import models
from pipelines.cascade.listener import WhisperListener

pytestmark = pytest.mark.timeout(900)


def test_scoring_reads_numbers_and_alternatives_and_counts_sentences():
    days, moon = answers.PROMPTS[15], answers.Prompt("Is the moon bigger than the Earth?", ("no|smaller",), "yesno")
    assert answers.correct(days, "There are seven days in a week.") and answers.correct(days, "7 days.")
    assert not answers.correct(days, "There are five working days.")
    assert answers.correct(moon, "The Moon is smaller than the Earth.") and not answers.correct(moon, "Yes it is.")
    assert not answers.correct(answers.Prompt("Capital?", ("rome",), "fact"), "Romeo")  # whole words only
    assert answers.complete_sentences("Paris. It is lovely!") and not answers.complete_sentences("I mean, a tale of")
    assert not answers.complete_sentences("One. Two. Three.")  # more than two
    assert len(answers.PROMPTS) + len(answers.FOLLOW_UPS) >= 50


def test_a_yes_no_answer_is_a_yes_or_the_fact_affirmed_and_never_a_denial():
    fish = next(p for p in answers.PROMPTS if p.text == "Can fish breathe under water?")
    assert answers.correct(fish, "Yes, they can.") and answers.correct(fish, "Fish can breathe underwater.")
    assert not answers.correct(fish, "Fish can breathe underwater, but they are not able to.")
    assert not answers.correct(fish, "No, fish cannot breathe.") and not answers.correct(fish, "Fish swim.")


def test_with_a_calculator_offered_an_arithmetic_prompt_may_be_answered_by_its_call():
    three_plus_five = next(p for p in answers.PROMPTS if p.text == "What is three plus five?")
    call = lambda name, expression: {"name": name, "arguments": '{"expression": "%s"}' % expression}  # noqa: E731
    assert answers.correct(three_plus_five, "", [call("calculate", "3 + 5")])
    assert not answers.correct(three_plus_five, "", [call("calculate", "3 + 6")])
    assert not answers.correct(three_plus_five, "8", [call("get_weather", "3 + 5")])  # a call it did not need
    assert not answers.correct(answers.PROMPTS[0], "", [call("calculate", "1 + 1")])  # not arithmetic
    assert not answers.correct(three_plus_five, "", [{"name": "calculate", "arguments": "{not json"}])


def test_the_ears_are_right_when_they_heard_the_prompt_word_for_word():
    assert answers.heard_right("What is two plus two?", "What's 2 plus 2?")
    assert answers.heard_right("Can a dog fly?", "can a dog fly")
    assert answers.heard_right("What is my favourite color?", "What is my favorite colour?")
    assert not answers.heard_right("What is six plus seven?", "Zig plus seven?")
    assert answers.heard_right("Is ice cold?", None) is None  # no transcript came


async def test_a_subset_runs_end_to_end_through_the_cpu_agent(cpu_server):
    items = answers.conversations(10)[:2] + answers.conversations(10)[-1:]  # two prompts and a follow-up
    ears = WhisperListener(str(models.ensure("whisper-base", print)), 2, 1)
    rows, result = await answers.score(cpu_server.ws_base, items, ears)
    assert [r["prompt"] for r in rows] == [p.text for _, p in items] and not result["connection_errors"]
    for row, (_, prompt) in zip(rows, items):
        assert row["status"] == "completed" and row["voice_to_voice_ms"] is not None
        assert row["heard"].strip()  # the answer was spoken, and Whisper base heard words in it
        assert row["correct"] == answers.correct(prompt, row["heard"]) and not row["calls"]  # (no tools offered)
        assert row["ears"] and row["ears_right"] == answers.heard_right(prompt.text, row["ears"])
    assert len(result["turns"]) == 4 and all("answer_audio" not in t for t in result["turns"])
    summary = answers.summarize(rows, result)
    assert summary["prompts"] == 3 and summary["voice_to_voice_ms"]["n"] == 3 and summary["answered_by_call"] == 0
    assert summary["ears_right"] == round(sum(bool(r["ears_right"]) for r in rows) / 3, 3)
