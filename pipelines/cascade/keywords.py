"""Words the ears are told to expect: a session's ``audio.input.transcription.keywords`` (the GA
field: "words or phrases to guide transcription of the input audio"), such as the names in a
contact list or the towns a service covers.

Moonshine's beam is nudged towards them (contextual biasing, "shallow fusion"): a hypothesis that
writes a keyword whole, as a word of its own, scores ``GAIN`` nats more than its log probability.
On the way there each character gains its share, so that the beam keeps a keyword begun; a path
that breaks off ("Mar" + "kle"), or whose word goes on past the keyword ("Marconi"), gives back
what it gained; and a keyword gains once in a transcript (so no transcript fills up with one: at
1.2 nats a character and no such rule, some came back "Budapest Budapest Budapest ..."). Keywords are matched
by their letters, whatever the case and whatever tokens the decoder spells them with; what reaches
the transcript is the decoder's own writing of them. The beam also keeps its likeliest hypotheses
as they are, beside those the gains rank first (``MoonshineListener._beam``), so that a keyword
begun never crowds out the words that were said ("six pm" came back "six Dm", a start of "David",
before it did).

The beam cannot reach a spelling the decoder never writes for those sounds: "Jon" said is heard
"John" whatever it gains, "Katie" sometimes "Katy". So a name heard that sounds as a keyword is
spelt, by a rough key of English spelling (``sound``: "John" and "Jon", "Katy" and "Katie", "Sara"
and "Sarah" share one), is written as the keyword spells it (``respell``): a deployment's contact
list knows its Jon. Only a capitalised word heard within a sentence, not the first word of one (a
word capitalised only where a sentence begins is no sign of a name: "Been there?" and a keyword
"Ben"), and only a keyword of one word that no other keyword in the list shares a key with. A
keyword heard in lower case is written in its capitals ("Don katie for me": a name, not a word).

The matcher is made per keyword list and kept by the listener for the lists in use (an
``lru_cache``): it holds only what the list itself derives to, so one session's keywords reach
another's transcripts only where that session gave the same list.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

# nats a keyword gains, spread over its characters. A contact list of 30 names and 30 towns over
# 260 clips (the bench's requests in Piper's and espeak's voices, 2026-11-29, Zen 3): 2 nats changed
# 11 transcripts, two for the worse ("six pm" -> "six Dm") before the beam kept its likeliest
# hypotheses too; after it, 3 nats changed 10, each for the better (WER 0.095 -> 0.084), 4 nats
# wrote a keyword nobody said ("... than the Earth?" -> "... than Peter's?"). docs/cpu-agent.md.
GAIN = 3.0

ROWS_KEPT = 64  # a matcher's start rows kept, one per set of keywords written (a transcript writes a few)

# the keywords being spelt, each (which, how many characters so far), and those already written whole
State = tuple[tuple[tuple[int, int], ...], frozenset[int]]
NOTHING: State = ((), frozenset())


def phrase(keyword: str) -> str:
    """A keyword as the matcher spells it: lower case, one space before each word."""
    return " " + " ".join(keyword.lower().split())


class Expected:
    """A keyword list, matched against a decoder's tokens. ``by_text``: the ids of the tokens of each
    text, in lower case (a space where a token begins a word); ``joins``: whether each token goes on
    with the word before it (begins with a letter or digit). A keyword gains ``gain`` nats once
    written whole, a share of it for each character on the way there, and only once in a
    transcript (a keyword said twice is heard as the decoder hears it: no transcript fills with
    one keyword)."""

    def __init__(self, keywords: Sequence[str], by_text: Mapping[str, Sequence[int]], joins: np.ndarray, gain: float = GAIN) -> None:
        self.phrases = [p for p in dict.fromkeys(phrase(k) for k in keywords) if len(p) > 1]
        self.joins = joins
        self._ends_word = ~joins  # (the tokens after which a keyword spelt whole is written)
        self.gain = gain
        self.per_char = [gain / len(p) for p in self.phrases]
        self._by_text = by_text
        starts: dict[int, list[tuple[int, int]]] = defaultdict(list)  # token -> the keywords it begins, and how far
        for k, p in enumerate(self.phrases):
            for j in range(2, len(p) + 1):
                for t in by_text.get(p[:j], ()):
                    starts[t].append((k, j))
        self.starts = {t: tuple(v) for t, v in starts.items()}
        self._follows: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        self._rows: dict[frozenset[int], tuple[np.ndarray, np.ndarray]] = {}  # the starts' ids and gains by the keywords written (``_start_row``)

    def __bool__(self) -> bool:
        return bool(self.phrases)

    def _follow(self, k: int, at: int) -> tuple[tuple[int, int], ...]:
        """The tokens that spell on from ``at`` characters into keyword ``k``: (token, to)."""
        key = (k, at)
        if key not in self._follows:
            p = self.phrases[k]
            self._follows[key] = tuple((t, j) for j in range(at + 1, len(p) + 1) for t in self._by_text.get(p[at:j], ()))
        return self._follows[key]

    def _start_row(self, written: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
        """The tokens that begin a keyword not yet ``written``, and what each gains: made once per
        set written (~0.6 ms for 60 keywords, and the beam asks at every step of every hypothesis),
        at most ``ROWS_KEPT`` sets kept."""
        if written not in self._rows:
            if len(self._rows) >= ROWS_KEPT:
                self._rows.clear()
            gains = {t: max(self.per_char[k] * j for k, j in begun if k not in written) for t, begun in self.starts.items() if any(k not in written for k, _ in begun)}
            self._rows[written] = np.array(list(gains), np.int64), np.array(list(gains.values()), np.float64)
        return self._rows[written]

    def potential(self, state: State) -> float:
        return max((self.per_char[k] * at for k, at in state[0]), default=0.0)

    def _spelt_whole(self, state: State) -> set[int]:
        """The keywords ``state`` has spelt to their end (written once their word ends)."""
        return {k for k, at in state[0] if at == len(self.phrases[k])}

    def after(self, state: State, token: int) -> State:
        """The state once ``token`` is written."""
        live, written = state
        if not self.joins[token]:  # (a word ended: a keyword spelt whole is written)
            written = written | self._spelt_whole(state)
        moved = {(k, to) for k, at in live if at < len(self.phrases[k]) for t, to in self._follow(k, at) if t == token}
        moved.update(begun for begun in self.starts.get(token, ()) if begun[0] not in written)
        return tuple(sorted(moved)), written

    def gains(self, state: State, row: np.ndarray) -> np.ndarray:
        """``row`` (log P of each next token) with what each token gains or gives back added
        (``after`` gives the state it leads to)."""
        spelt = self._spelt_whole(state)
        before, whole = self.potential(state), self.gain if spelt else 0.0  # (a keyword spelt whole has gained all it gains)
        out = row - before
        if whole:
            out[self._ends_word] += whole  # a word ends: the whole keywords are kept (the end of the text is among these)
        ids, gains = self._start_row(state[1] | spelt)
        out[ids] += gains  # (a token that begins a keyword begins a word, so it kept them too)
        for k, at in state[0]:
            if at < len(self.phrases[k]):
                for t, to in self._follow(k, at):
                    ends = 0.0 if self.joins[t] else whole
                    out[t] = max(out[t], row[t] - before + ends + self.per_char[k] * to)
        return out


# how English spells one sound several ways: rewritten in order, so that the spellings of one name
# meet ("ph" -> "f": Philip, Filip; a "c" before e, i or y is an "s": Lucy, Lusi; else a "k")
_SPELLINGS = (("ph", "f"), ("ck", "k"), ("qu", "kw"), ("q", "k"), ("x", "ks"), ("z", "s"))
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters (an apostrophe ends it: "John's")


def sound(word: str) -> str:
    """A rough key of how a name sounds: "John" and "Jon" -> "jon", "Katie" and "Katy" -> "kati",
    "Sarah" -> "sara", "Anne" -> "an". Equal keys say two spellings may be one name, never that
    two names differ."""
    w = word.lower()
    for spelt, said in _SPELLINGS:
        w = w.replace(spelt, said)
    w = re.sub(r"c(?=[eiy])", "s", w).replace("c", "k")
    w = re.sub(r"(?<=[aeiou])h", "", w)  # (an "h" after a vowel is not said: John, Sarah)
    w = re.sub(r"(ie|ey|ee|y)$", "i", w)  # (Katie, Katy)
    w = re.sub(r"(?<=[^aeiou])e$", "", w)  # (a silent "e": Anne)
    return re.sub(r"(.)\1+", r"\1", w)  # (a doubled letter is one: Anna, Ana)


@lru_cache(maxsize=16)
def _by_sound(keywords: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """The keywords of one word by their ``sound`` (those sharing a key with another left out), and
    by their letters in lower case."""
    spellings: dict[str, set[str]] = defaultdict(set)
    by_letters: dict[str, str] = {}
    for k in keywords:
        word = k.strip()
        if _WORD.fullmatch(word):
            spellings[sound(word)].add(word)
            by_letters.setdefault(word.lower(), word)
    return {key: next(iter(s)) for key, s in spellings.items() if len(s) == 1}, by_letters


def respell(text: str, keywords: tuple[str, ...]) -> str:
    """``text`` with each capitalised word heard within a sentence that sounds as a keyword is
    spelt (``sound``) written as the keyword spells it ("Please call John." and a keyword "Jon":
    "Please call Jon."), and a keyword heard in lower case written in the keyword's capitals
    ("Phone katie", a keyword "Katie": "Phone Katie")."""
    by_sound, by_letters = _by_sound(keywords)
    if not by_letters:
        return text

    def one(m: re.Match[str]) -> str:
        word = m.group()
        if word.lower() in by_letters:
            return by_letters[word.lower()] if word.islower() else word
        if not word[0].isupper() or len(word) < 2:
            return word
        before = text[: m.start()].rstrip()  # (a sentence's first word, or a word's part after "'" or "-", stays)
        if not before or before[-1] in ".!?" or text[m.start() - 1] in "'-":
            return word
        return by_sound.get(sound(word), word)

    return _WORD.sub(one, text)
