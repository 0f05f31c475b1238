"""bench.turn_fit's offline replay of decisions: what a set of fusion weights would cut, split and
delay, checked on rows whose answers are known by construction, and the grid search keeping the
cut rate it is asked to."""

from __future__ import annotations

import pytest

from bench.turn_fit import Decisions, fit
from bench.turn_fixtures import RATE

S = RATE  # one second in stream samples


def row(kind: str, words_p: float, audio_p: float = 0.9, pause_s: float = 0.6) -> dict:
    """A fixture whose speech ends at 2 s; an unfinished one paused from 1 s for ``pause_s``; one
    decision at the check 200 ms into its (last) pause, taken 50 ms."""
    if kind == "complete":
        return {"kind": kind, "group": "synthetic", "text": f"c{words_p}", "end": 2 * S, "pause": None,
                "decisions": [{"at": int(2.2 * S), "audio_p": audio_p, "words_p": words_p, "wall_ms": 50.0}]}
    return {"kind": kind, "group": "synthetic", "text": f"u{words_p}", "end": 3 * S, "pause": [S, int((1 + pause_s) * S)],
            "decisions": [{"at": int(1.2 * S), "audio_p": audio_p, "words_p": words_p, "wall_ms": 50.0}]}


W = {"bias": 0.0, "audio": 0.0, "words": 1.0, "silence_per_s": 2.0}


def test_a_sentence_ends_at_the_check_and_a_fragment_waits_past_its_pause():
    d = Decisions([row("complete", 0.9), row("unfinished", 0.001)], longest_wait_s=4.0)
    f = d.figures(W)
    assert f["cut"] == 0.0 and f["split"] == 0.0
    assert f["delay_ms"]["p50"] == pytest.approx(250.0)  # 200 ms to the check, 50 ms of decision, no wait


def test_a_fragment_is_cut_when_its_wait_is_shorter_than_its_pause_and_a_low_sentence_waits():
    # logit(0.3) = -0.85: 0.42 s more silence, the pause has 0.40 s left after its check: held;
    # with 0.5 s left, cut
    assert Decisions([row("unfinished", 0.3)], longest_wait_s=4.0).figures(W)["cut"] == 0.0
    assert Decisions([row("unfinished", 0.3, pause_s=0.7)], longest_wait_s=4.0).figures(W)["cut"] == 1.0
    d = Decisions([row("unfinished", 0.5)], longest_wait_s=4.0)
    assert d.figures(W)["cut"] == 1.0  # 0.5: ends at the check, inside its pause
    d = Decisions([row("complete", 0.1)], longest_wait_s=4.0)
    assert d.figures(W)["delay_ms"]["p50"] == pytest.approx(250.0 + 1000 * 2.1972 / 2.0, abs=1.0)


def test_without_a_silence_term_a_low_judgement_waits_the_longest_wait():
    d = Decisions([row("complete", 0.01)], longest_wait_s=4.0)
    assert d.figures({**W, "silence_per_s": 0.0})["delay_ms"]["p50"] == pytest.approx(4050.0)


def test_the_search_keeps_the_cut_rate_it_is_asked_for():
    rows = [row("complete", p) for p in (0.9, 0.6, 0.3, 0.05)] + [row("unfinished", p) for p in (0.001, 0.004, 0.02, 0.3)]
    weights, figures = fit(Decisions(rows, 4.0), max_cut=0.0, max_split=0.0)
    assert figures["cut"] == 0.0
    again = Decisions(rows, 4.0).figures(weights)
    assert again == figures
    loose, looser = fit(Decisions(rows, 4.0), max_cut=0.25, max_split=0.0)
    assert looser["mean_delay_ms"] <= figures["mean_delay_ms"]  # more cuts allowed: never slower


def test_the_listeners_judgement_is_weighed_with_the_text_rule_and_the_thinkers_without():
    """As the product's fusion does: the transcript's last words shift the listener's verdict (a
    fragment ending on "the" is held past its pause), not the thinker's (it read the words itself)."""
    fragment = row("unfinished", 0.5)
    fragment["decisions"][0]["text"] = "I want to go to the"
    assert Decisions([fragment], longest_wait_s=4.0, judge="listener").figures(W)["cut"] == 0.0
    assert Decisions([fragment], longest_wait_s=4.0, judge="thinker").figures(W)["cut"] == 1.0
