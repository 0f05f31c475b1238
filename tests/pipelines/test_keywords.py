"""The keyword matcher (``pipelines/cascade/keywords.py``) on a small vocabulary of its own: what a
hypothesis gains for spelling a keyword, what it gives back when it breaks off, that a keyword
counts only where its word ends and only once; how names heard are respelt as keywords spell
them. The real decoder with it: tests/pipelines/test_moonshine.py."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import pytest

from pipelines.cascade.keywords import NOTHING, Expected, State, respell, sound

TEXTS = ["<s>", "</s>", " Mar", " mar", "co", "ni", " Marco", " Mark", "le", "?", " ring", " can", " Jo", "n", " John", " Jon", ",", " New", " York", " new", "ork", " y"]
END = 1
GAIN = 3.0


def expected(*keywords: str) -> Expected:
    by_text: dict[str, list[int]] = defaultdict(list)
    for i, text in enumerate(TEXTS[2:], 2):
        by_text[text.lower()].append(i)
    joins = np.array([t[:1].isalnum() for t in TEXTS])
    return Expected(keywords, by_text, joins, GAIN)


def ids(*texts: str) -> list[int]:
    return [TEXTS.index(t) for t in texts]


def gained(e: Expected, tokens: list[int]) -> float:
    """What the keywords add to a hypothesis of ``tokens`` and then the end of the text."""
    state, total = NOTHING, 0.0
    for t in [*tokens, END]:
        total += float(e.gains(state, np.zeros(len(TEXTS)))[t])
        state = e.after(state, t)
    return total


@pytest.mark.parametrize(
    "spelt",
    [(" Mar", "co"), (" Marco",), (" mar", "co"), (" Mar", "co", "?")],
)
def test_a_keyword_spelt_whole_gains_its_gain_whatever_the_tokens_and_the_case(spelt: tuple[str, ...]):
    e = expected("Marco")
    assert gained(e, ids(" can", " ring", *spelt)) == pytest.approx(GAIN)


@pytest.mark.parametrize(
    "spelt",
    [(" Mar",), (" Mar", "ni"), (" Mark", "le"), (" Mar", "co", "ni"), (" Mark",), (" can",)],
)
def test_what_breaks_off_or_goes_on_past_the_keyword_gains_nothing(spelt: tuple[str, ...]):
    """" Mar" alone, "Marconi" (the word goes on past the keyword), "Markle" (another word)."""
    e = expected("Marco")
    assert gained(e, ids(*spelt, " ring")) == pytest.approx(0.0)
    assert gained(e, ids(*spelt)) == pytest.approx(0.0)


def test_on_the_way_a_keyword_gains_a_share_a_character_and_a_break_gives_it_back():
    e = expected("Marco")
    after_mar = e.after(NOTHING, ids(" Mar")[0])
    row = e.gains(after_mar, np.zeros(len(TEXTS)))
    assert row[ids("co")[0]] == pytest.approx(GAIN * 2 / 6)  # " Mar" -> " Marco": two more of six characters
    assert row[ids(" ring")[0]] == pytest.approx(-GAIN * 4 / 6)  # broken off: what " Mar" gained given back
    assert e.gains(NOTHING, np.zeros(len(TEXTS)))[ids(" Mar")[0]] == pytest.approx(GAIN * 4 / 6)


def test_a_keyword_gains_only_once_in_a_transcript():
    e = expected("Marco")
    assert gained(e, ids(" Marco", ",", " Marco", ",", " Marco")) == pytest.approx(GAIN)


def test_each_keyword_gains_once_and_phrases_span_words():
    e = expected("Marco", "New York", "Jon")
    assert gained(e, ids(" can", " Marco", " ring", " New", " York", "?")) == pytest.approx(2 * GAIN)
    assert gained(e, ids(" new", " y", "ork")) == pytest.approx(GAIN)
    assert gained(e, ids(" Jo", "n")) == gained(e, ids(" Jon")) == pytest.approx(GAIN)
    assert gained(e, ids(" John")) == pytest.approx(0.0)  # another spelling: the decoder's own


def test_no_keywords_change_nothing():
    e = expected()
    assert not e
    row = np.random.default_rng(1).normal(size=len(TEXTS))
    assert np.array_equal(e.gains(NOTHING, row), row)


def test_random_hypotheses_gain_what_their_whole_keywords_are_worth():
    """Seeded: random token sequences; the gains summed along each equal GAIN times the keywords
    written whole in its text (counted on the text itself, once each), whatever the tokens."""
    keywords = ("Marco", "New York", "Jon", "Mark")
    e = expected(*keywords)
    rng = random.Random(7)
    words = range(2, len(TEXTS))
    for _ in range(2000):
        tokens = [rng.choice(words) for _ in range(rng.randrange(1, 8))]
        text = "".join(TEXTS[t] for t in tokens).lower()
        spoken = _words(text)
        whole = {k for k in keywords if _said(k.lower().split(), spoken)}
        assert math.isclose(gained(e, tokens), GAIN * len(whole), abs_tol=1e-9), (text, whole)


def _words(text: str) -> list[str]:
    """A transcript's words as the matcher sees them: what a space begins, up to the next space or
    mark; a mark is a word of its own that no keyword matches, and what follows it unspaced too."""
    out, word = [], ""
    for c in text:
        if c.isalnum():
            word += c
        else:
            if word:
                out.append(word)
            word = "" if c == " " else "\0"
    if word:
        out.append(word)
    return out


def _said(phrase: list[str], spoken: list[str]) -> bool:
    return any(spoken[i : i + len(phrase)] == phrase for i in range(len(spoken) - len(phrase) + 1))


def test_state_is_hashable_and_shared_by_nothing():
    e = expected("Marco")
    s: State = e.after(NOTHING, ids(" Mar")[0])
    assert hash(s) and NOTHING == ((), frozenset())


@pytest.mark.parametrize(
    ("heard", "keywords", "written"),
    [
        ("Please call John.", ("Jon",), "Please call Jon."),
        ("Phone Katy for me.", ("Katie",), "Phone Katie for me."),
        ("Is Sara in? Ask Sara.", ("Sarah",), "Is Sarah in? Ask Sarah."),
        ("Call John's phone.", ("Jon",), "Call Jon's phone."),
        ("Can you ring Marko?", ("Marco", "Lisbon"), "Can you ring Marco?"),
        ("Please call John.", ("John", "Jon"), "Please call John."),  # (a keyword as heard stays)
        ("Please call John.", ("Jon", "Jonn"), "Please call John."),  # (two keywords, one key: which one?)
        ("John, are you there?", ("Jon",), "John, are you there?"),  # (a sentence's first word)
        ("Please call john.", ("Jon",), "Please call john."),  # (not capitalised: "been", a keyword "Ben")
        ("Don katie for me.", ("Katie",), "Don Katie for me."),  # (a keyword heard in lower case)
        ("Call grandma, Grandma.", ("grandma",), "Call grandma, Grandma."),
        ("Katie, call katie.", ("KATIE",), "Katie, call KATIE."),
        ("Call Jean-John.", ("Jon",), "Call Jean-John."),
        ("Give Ann a call.", ("Anna",), "Give Ann a call."),
        ("Please call John.", (), "Please call John."),
        ("Please call John.", ("New York",), "Please call John."),  # (a keyword of two words is the beam's alone)
    ],
)
def test_a_name_heard_is_written_as_the_keyword_that_sounds_as_it_spells_it(heard: str, keywords: tuple[str, ...], written: str):
    assert respell(heard, keywords) == written


def test_spellings_of_one_name_share_a_sound_and_other_names_do_not():
    for one in [("John", "Jon"), ("Katie", "Katy", "Katey"), ("Philip", "Phillip", "Filip"), ("Lucy", "Lucie"), ("Sarah", "Sara"), ("Anne", "Ann"), ("Marco", "Marko")]:
        assert len({sound(w) for w in one}) == 1, one
    names = ["Jon", "Jean", "Katie", "Kate", "Marco", "Mark", "Anna", "Ann", "Sarah", "Sam", "Ben", "Bea"]
    assert len({sound(n) for n in names}) == len(names)


NAMES = ["John", "Jon", "Katy", "Katie", "Sara", "Sarah", "Marko", "Peter", "Anne", "Lisbon"]
COMMON = ["call", "please", "the", "weather", "in", "been", "an", "ring", "for", "me"]


def test_random_transcripts_change_only_names_heard_within_a_sentence_to_their_keyword():
    """Seeded: random transcripts of names and common words (capitalised or not, sentences
    begun); a reference from the words as made: a capitalised word not beginning a sentence whose
    sound is that of one keyword alone becomes it, a keyword in lower case takes the keyword's
    capitals, every other word stays, the marks stay."""
    rng = random.Random(11)
    for _ in range(2000):
        keywords = tuple(rng.sample(["Jon", "Katie", "Sarah", "Marco", "Ann", "Peter", "Lisbon", "Ben"], rng.randrange(0, 4)))
        words, expected_words, starts = [], [], True
        for _ in range(rng.randrange(1, 9)):
            word = rng.choice(NAMES + COMMON)
            word = rng.choice([word, word, word.lower(), word.capitalize()])
            keys = [k for k in keywords if sound(k) == sound(word)]
            same = [k for k in keywords if k.lower() == word.lower()]
            renamed = word[0].isupper() and not starts and not same and len(keys) == 1
            words.append(word)
            expected_words.append(keys[0] if renamed else same[0] if same and word.islower() else word)
            mark = rng.choice(["", "", ",", ".", "?"])
            words[-1] += mark
            expected_words[-1] += mark
            starts = mark in (".", "?")
        text, expected = " ".join(words), " ".join(expected_words)
        assert respell(text, keywords) == expected, (text, keywords)
        assert respell(expected, keywords) == expected
