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


async def test_a_subset_runs_end_to_end_through_the_cpu_agent(cpu_server):
    items = answers.conversations(10)[:2] + answers.conversations(10)[-1:]  # two prompts and a follow-up
    ears = WhisperListener(str(models.ensure("whisper-base", print)), 2, 1)
    rows, result = await answers.score(cpu_server.ws_base, items, ears)
    assert [r["prompt"] for r in rows] == [p.text for _, p in items] and not result["connection_errors"]
    for row, (_, prompt) in zip(rows, items):
        assert row["status"] == "completed" and row["voice_to_voice_ms"] is not None
        assert row["heard"].strip()  # the answer was spoken, and Whisper base heard words in it
        assert row["correct"] == answers.correct(prompt, row["heard"])
    assert len(result["turns"]) == 4 and all("answer_audio" not in t for t in result["turns"])
    summary = answers.summarize(rows, result)
    assert summary["prompts"] == 3 and summary["voice_to_voice_ms"]["n"] == 3
