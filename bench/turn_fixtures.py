"""Spoken end-of-turn fixtures, made at run time: complete utterances (questions, statements, short
answers) and unfinished ones, cut mid-sentence by a hesitation pause.

An unfinished utterance is its first part spoken with a trailing comma (the level, going-on
intonation a speaker keeps when the sentence is not over; a synthesizer speaks a bare fragment as a
finished sentence), a pause, then the rest. Voices: espeak-ng (American and British English, two
speeds) and Piper ("joe").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dsp.resample import resample

from .audio import espeak, speech_bounds

RATE = 16000

COMPLETE = [
    "What is the weather like today?",
    "What is the capital of France?",
    "Can you recommend a good book?",
    "How far away is the moon?",
    "Tell me a fun fact about cats.",
    "What time does the store open?",
    "I need to book a table for two.",
    "Thank you, that was helpful.",
    "Please turn off the lights in the kitchen.",
    "My flight leaves at seven tomorrow morning.",
    "How do I reset my password?",
    "Play some relaxing music.",
    "Where is the nearest train station?",
    "I would like a large coffee with milk.",
    "Can you set a timer for ten minutes?",
    "What does this word mean?",
    "It was a great movie.",
    "Call my sister, please.",
    "Yes.",
    "No.",
    "Paris.",
    "Sure.",
    "Tomorrow.",
    "Thanks!",
    "Okay, sounds good.",
    "Two people.",
    "At eight o'clock.",
    "Yes, please.",
    "London.",
    "Not really.",
    "Who wrote this song?",
    "How much does it cost?",
]

# (before the pause, after it)
UNFINISHED = [
    ("I'd like to book a table for", "four people tomorrow."),
    ("Can you tell me about the", "history of Rome?"),
    ("My name is", "John Smith."),
    ("I want to go to the", "train station."),
    ("What is the best way to", "learn a new language?"),
    ("I was thinking that we could", "go to the beach."),
    ("Could you please send an email to", "my manager?"),
    ("The thing I like most about", "summer is the long evenings."),
    ("I need to buy some", "milk and bread."),
    ("How long does it take to", "drive to the airport?"),
    ("Set an alarm for", "six thirty."),
    ("My favourite colour is", "dark blue."),
    ("I'm looking for a restaurant that", "serves vegetarian food."),
    ("Can you remind me to", "call the doctor?"),
    ("The meeting is scheduled for", "next Tuesday afternoon."),
    ("What would happen if", "the sun disappeared?"),
    ("I'd like to order a", "pizza with mushrooms."),
    ("Tell me a story about a", "brave little dog."),
    ("We should probably", "leave before it rains."),
    ("The reason I'm calling is", "my internet is down."),
    ("Do you know where I can", "find a pharmacy?"),
    ("I'm going to need", "a bigger boat."),
    ("Could you translate", "this sentence into French?"),
    ("Last weekend we went to", "see my grandparents."),
    ("Is it possible to", "change my reservation?"),
    ("Please add eggs and", "butter to my list."),
    ("I think the answer is", "forty two."),
    ("Which one of these", "is the cheapest?"),
    ("I want to learn how to", "play the guitar."),
    ("Book me a flight to", "New York on Friday."),
    ("When I was a child I", "lived near the sea."),
    ("The problem with my car is that", "it will not start."),
]

ESPEAK_VOICES = (("en-us", 160), ("en-gb", 150), ("en-us", 185), ("en-gb", 170))


@dataclass
class Fixture:
    kind: str  # complete | unfinished
    text: str
    voice: str
    pcm: np.ndarray  # int16 at RATE: the speech only (unfinished: with the pause spliced in)
    pause: tuple[int, int] | None = None  # unfinished: the pause's first and last sample + 1
    group: str = "synthetic"  # synthetic | human (wideband recordings) | phone (8 kHz or telephone band)
    source: str = "synthetic"  # where a recording comes from (bench/human_turns.py)
    end: int | None = None  # where the speech ends in pcm, when pcm carries the recording's own silence after it


@functools.cache
def _piper():  # type: ignore[no-untyped-def]
    from .dataset import _piper as load

    return load()


def voices(piper: bool = True) -> list[str]:
    names = [f"espeak-{v}-{wpm}" for v, wpm in ESPEAK_VOICES]
    if piper and _piper() is not None:
        names.append("piper-joe")
    return names


def speak(text: str, voice: str) -> np.ndarray:
    """``text`` in ``voice`` at RATE, trimmed to its speech."""
    if voice == "piper-joe":
        talker = _piper()
        pcm = resample(talker.speak(text), talker.rate, RATE)
    else:
        name, wpm = voice.removeprefix("espeak-").rsplit("-", 1)
        pcm = espeak(text, RATE, voice=name, wpm=int(wpm))
    bounds = speech_bounds(pcm)
    assert bounds is not None, text
    return pcm[bounds[0] : bounds[1] + 1]


def complete(text: str, voice: str) -> Fixture:
    return Fixture("complete", text, voice, speak(text, voice))


def unfinished(first: str, rest: str, voice: str, pause_ms: int) -> Fixture:
    before, after = speak(f"{first},", voice), speak(rest, voice)
    gap = np.zeros(pause_ms * RATE // 1000, np.int16)
    pcm = np.concatenate([before, gap, after])
    return Fixture("unfinished", f"{first} ... {rest}", voice, pcm, (len(before), len(before) + len(gap)))


def fixtures(piper: bool = True, seed: int = 0) -> list[Fixture]:
    """Every complete and unfinished utterance once, the voices taken in turn; pauses of
    400-900 ms drawn at random (``seed``)."""
    names = voices(piper)
    rng = np.random.default_rng(seed)
    out = [complete(text, names[i % len(names)]) for i, text in enumerate(COMPLETE)]
    for i, (first, rest) in enumerate(UNFINISHED):
        out.append(unfinished(first, rest, names[i % len(names)], int(rng.integers(400, 901))))
    return out
