"""What a session does with the audio it is given, checked against a small reference model.

A crash-counting fuzzer cannot see a session that quietly commits the wrong audio (after a ``clear``
every later VAD turn held nothing, and no fuzzer noticed). Here a seeded generator writes random
sequences of the client events that shape the input side (appends of real speech and of digital
silence in random sizes, ``input_audio_buffer.clear``, ``input_audio_buffer.commit``, ``session.update``
switching ``turn_detection`` between server VAD settings, semantic VAD and manual turns), at random
points, mid-utterance too, with a small input buffer so that long speech overflows it. A reference
model (``Model``) says what must come of each sequence:

* which turns start (``speech_started`` and its ``audio_start_ms``), which items are committed, in
  what order and how (a VAD turn's end, a manual commit, a turn longer than the buffer), which
  errors come (a commit of less than 100 ms, a full buffer in manual mode);
* what each committed item holds: exactly the samples of the session's input between its start and
  its end (read back with ``conversation.item.retrieve``, compared sample for sample), the start and
  end within the voice activity detector's timing tolerance of where the speech is.

The model knows where the speech is from each utterance's own measured bounds, and works in ranges
of positions where the detector's timing is uncertain; a sequence whose outcome would hinge on that
uncertainty (an event within a few frames of a turn's start or end) is not judged but generated
again. A mismatch is shrunk to the fewest steps that still mismatch, printed and saved.

    python -m bench.input_model --sequences 10000 --seed 1       # spawns a synthetic server
    python -m bench.input_model --replay FILE                     # a saved mismatch, again

``run()`` is the library entry the CI test uses (tests/protocol/test_input_model.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import webrtcvad

from .audio import espeak
from .common import save, server_process

RATE = 24000  # the wire's and (configured so) the pipeline's: items read back sample for sample
MAX_BUFFER_S = 3.0
MIN_COMMIT_MS = 100
ONSET_LOOKBACK_MS = 100  # the detector's onset window (5 frames), as in realtime_omni.session.turns
FRAME = RATE // 50
SEMANTIC_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 400}  # semantic_vad with no end-of-turn model

PHRASES = [
    "What time is it in Tokyo right now",
    "Please book a table for two people",
    "Tell me a short joke",
    "How far away is the moon",
    "Thank you very much",
    "Turn on the kitchen lights",
]
VOICES = [("en-us", 160), ("en-gb", 190), ("en-us+f3", 140)]


def ms(v: float) -> int:
    return int(round(v * RATE / 1000))


# ---------------------------------------------------------------------------------------------
# Fixtures: utterances and where their speech is
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Utterance:
    pcm: np.ndarray
    onset: tuple[int, int]  # where a voice activity detector hears the speech begin (earliest, latest)
    end: tuple[int, int]  # ... and end
    max_gap: int  # the longest pause it hears inside the speech


def _heard(pcm: np.ndarray, *, lead: int = 0) -> list[tuple[int, int]]:
    """(onset, end of speech) of each turn a fresh turn detector hears in ``pcm`` (20 ms appends)."""
    from realtime_omni.session.config import VadSettings
    from realtime_omni.session.turns import SpeechStarted, SpeechStopped, TurnDetector

    detector = TurnDetector(VadSettings(0.5, 0, 300, False, False, None), RATE, pause_ms=200)
    pcm = np.concatenate([np.zeros(lead, np.int16), pcm, np.zeros(RATE, np.int16)])
    turns, onset = [], 0
    for i in range(0, len(pcm), FRAME):
        for event in detector.process(pcm[i : i + FRAME]):
            if isinstance(event, SpeechStarted):
                onset = event.onset
            elif isinstance(event, SpeechStopped):
                turns.append((onset - lead, event.speech_end - lead))
    return turns


@functools.cache
def utterances() -> tuple[Utterance, ...]:
    """Short spoken phrases, trimmed to their speech, with where the server's own turn detector
    hears that speech begin and end, measured in several contexts (after silences of different
    lengths, after another utterance, from the middle on): the detector's frames fall differently in
    each, and webrtcvad's judgement depends on what it heard before."""
    out = []
    raw = [espeak(text, RATE, voice, wpm) for text in PHRASES for voice, wpm in VOICES]
    for i, pcm in enumerate(raw):
        ((first, last),) = _heard(pcm)
        pcm = pcm[max(0, first - ms(100)) : last + ms(100)].copy()
        onsets, ends = [], []
        for lead in (0, ms(507), ms(1311), *(ms(400) + k * 79 for k in range(6))):  # frames fall differently
            ((o, e),) = _heard(pcm, lead=lead)
            onsets.append(o)
            ends.append(e)
        for j, other in enumerate(raw):  # after each other utterance: what webrtcvad heard before matters
            gap = ms((450, 900, 1300)[j % 3] + j)
            *_, (o, e) = _heard(np.concatenate([other, np.zeros(gap, np.int16), pcm]))
            onsets.append(o - len(other) - gap)
            ends.append(e - len(other) - gap)
        for k in (len(pcm) // 3, len(pcm) // 2):
            *_, (o, e) = _heard(pcm[k:])
            ends.append(e + k)
        frames = np.abs(pcm[: len(pcm) // FRAME * FRAME].reshape(-1, FRAME).astype(np.int32)).max(axis=1) > 300
        on = np.flatnonzero(frames)
        gaps = np.diff(on) - 1 if len(on) > 1 else np.zeros(1)
        out.append(Utterance(pcm, (min(onsets), max(onsets)), (min(ends), max(ends)), int(gaps.max()) * FRAME))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Steps: what a client sends
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Audio:
    source: int  # an utterance's index, or -1 for digital silence
    start: int  # samples of the source
    stop: int
    chunks: tuple[int, ...]  # the sizes of its appends (samples), summing to stop - start


@dataclass(frozen=True)
class Event:
    kind: str  # "clear" | "commit" | "update"
    turn_detection: dict[str, Any] | None = None  # for "update"


Step = Audio | Event


def samples(step: Audio) -> np.ndarray:
    if step.source < 0:
        return np.zeros(step.stop - step.start, np.int16)
    return utterances()[step.source].pcm[step.start : step.stop]


# ---------------------------------------------------------------------------------------------
# The reference model
# ---------------------------------------------------------------------------------------------


class Ambiguous(Exception):
    """The outcome would hinge on the detector's timing within its tolerance: not judged."""


@dataclass(frozen=True)
class R:
    """A position known to lie in [lo, hi] (samples of the session's input)."""

    lo: int
    hi: int

    @classmethod
    def at(cls, v: int) -> "R":
        return cls(v, v)

    def __add__(self, n: int) -> "R":
        return R(self.lo + n, self.hi + n)

    def max(self, other: "R") -> "R":
        return R(max(self.lo, other.lo), max(self.hi, other.hi))

    def __contains__(self, v: int) -> bool:
        return self.lo <= v <= self.hi


# The detector's timing beyond what the utterances' measured ranges cover.
DETECT = (ms(40), ms(110))  # onset -> the frame that starts the turn (3 speech frames in 5)
SLACK = ms(30)  # frame alignment against the measurements
LATE = ms(60)  # a soft first consonant (the burst of a "p") is heard a few frames late in some alignments
MIN_SPEECH = ms(300)  # speech after a reset shorter than this may or may not start a turn
NO_SPEECH = ms(40)  # ... and shorter than this certainly does not
MARGIN = ms(60)  # an event this close to a decision is too close to judge


@dataclass
class Vad:
    silence: int
    padding: int
    settings: tuple  # what the server compares to know whether an update changes the detector


@dataclass
class Expect:
    kind: str  # "speech_started" | "committed" | "error" | "cleared" | "updated"
    how: str = ""  # committed: "vad" | "commit" | "full"; error: its code
    start: R | None = None
    end: R | None = None


@dataclass
class Segment:
    """Speech in the session's input: it begins in ``s`` and ends in ``e``; ``cut``: its audio
    stopped mid-speech at ``e`` (a step ended there) and may go on in the next step."""

    s: R
    e: R
    gap: int  # the longest pause inside it
    cut: bool = False


@dataclass
class Turn:
    onset: R
    detect: R
    start: R


class Model:
    """The input side of a session, as the API documents it and this server keeps it."""

    def __init__(self, turn_detection: dict[str, Any] | None) -> None:
        self.pos = 0
        self.max_buffer = int(MAX_BUFFER_S * RATE)
        self.td: dict[str, Any] | None = None
        self.vad: Vad | None = None
        self.segments: list[Segment] = []  # speech heard while the detector listened
        self.origin = 0  # where the detector started listening
        self.listen = R.at(0)  # it hears new turns from here (the origin, or the last turn's end)
        self.turn: Turn | None = None
        self.boundary = R.at(0)  # nothing before this can be in the next item (the last commit or clear)
        self.bstart = R.at(0)  # the input buffer's first sample
        self.accepted: list[bool] = []  # per append: taken (False: refused, the buffer was full)
        self.out: list[Expect] = []
        self._last: Audio | None = None
        self._set_vad(turn_detection)

    # -- settings

    def _set_vad(self, td: dict[str, Any] | None) -> None:
        self.td = td
        if td is None:
            self.vad = None
        elif td["type"] == "semantic_vad":
            eagerness = td.get("eagerness", "auto")
            threshold = {"low": 0.8, "high": 0.2}.get(eagerness, 0.5)  # auto is medium: the same settings
            self.vad = Vad(ms(SEMANTIC_SILENCE_MS[eagerness]), ms(300), ("semantic", SEMANTIC_SILENCE_MS[eagerness], threshold))
        else:
            silence, padding = td.get("silence_duration_ms", 500), td.get("prefix_padding_ms", 300)
            self.vad = Vad(ms(silence), ms(padding), ("server", silence, padding))

    def merged(self, update: dict[str, Any] | None) -> dict[str, Any] | None:
        """``turn_detection`` after an update: the same type merges field by field, another type
        starts from its defaults, null is manual turns."""
        if update is None:
            return None
        if self.td is not None and self.td["type"] == update["type"]:
            return {**self.td, **update}
        return dict(update)

    # -- audio

    def append(self, step: Audio) -> None:
        if self.vad is not None:
            self._hear(step)
        elif self.segments and self.segments[-1].cut:
            self.segments[-1].cut = False
        for size in step.chunks:
            p = self.pos
            if self.vad is not None:
                self._trim()
                started, full = self._started_by(p), self._overflows(size)
                if full is not False and self.turn is not None:
                    end = self._turn_end(self.turn)[0]
                    if end is not None and end.lo - MARGIN <= p:
                        raise Ambiguous("a full buffer as the turn ends")
                if started is True and full is True:  # a turn longer than the buffer ends where it is full
                    self._commit_turn(R.at(p), "full")
                    self._reset(p)
                elif started is not False and full is not False:
                    raise Ambiguous("a full buffer, if the turn had started")
            elif (full := self._overflows(size)) is not False:
                if full is None:
                    raise Ambiguous("the buffer may be full")
                self.out.append(Expect("error", "input_audio_buffer_full"))
                self.accepted.append(False)
                continue
            self.accepted.append(True)
            self.pos += size
            if self.vad is not None:
                self._scan(self.pos)
                self._trim()
        self._last = step

    def _hear(self, step: Audio) -> None:
        """The speech of an audio step the detector will hear, as a segment (or the continuation of one)."""
        last = self.segments[-1] if self.segments else None
        continues = last is not None and last.cut and self._last is not None and self._last.source == step.source >= 0 and self._last.stop == step.start
        if last is not None and last.cut and not continues:
            last.cut = False  # the speech stopped where its audio did
        if step.source < 0:
            return
        u = utterances()[step.source]
        at = self.pos - step.start  # where the utterance's sample 0 would be
        if step.stop <= u.onset[0] or step.start >= u.end[1]:
            return
        cut = step.stop < u.end[0]  # its audio stops before the speech does
        # speech cut off mid-word ends in the frame the cut falls in
        end = R(at + min(u.end[0], step.stop), at + min(u.end[1], step.stop)) if not cut else R(at + step.stop - SLACK, at + step.stop + SLACK)
        if continues:
            assert last is not None
            last.e, last.cut, last.gap = end if cut else R(end.lo - SLACK, end.hi + SLACK), cut, max(last.gap, u.max_gap)
        else:
            start = R(at + max(u.onset[0], step.start) - SLACK, at + max(u.onset[1], step.start) + LATE)
            self.segments.append(Segment(start, end if cut else R(end.lo - SLACK, end.hi + SLACK), u.max_gap, cut))

    def _trim(self) -> None:
        """VAD, no turn: the buffer keeps only the last prefix padding + 140 ms (silence is not kept).
        While the turn may or may not have started, the buffer may or may not have been trimmed."""
        assert self.vad is not None
        started = self._started_by(self.pos)
        if started is True:
            return
        keep = ms(round(self.vad.padding * 1000 / RATE) + ONSET_LOOKBACK_MS + 40)
        trimmed = self.bstart.max(R.at(self.pos - keep)).max(self.boundary)
        self.bstart = trimmed if started is False else R(self.bstart.lo, trimmed.hi)

    def _overflows(self, size: int) -> bool | None:
        most, least = self.pos - self.bstart.lo, self.pos - self.bstart.hi
        if size + least > self.max_buffer:
            return True
        if size + most <= self.max_buffer:
            return False
        return None

    def _started_by(self, p: int) -> bool | None:
        if self.turn is None:
            return False
        if self.turn.detect.hi <= p:
            return True
        return None if self.turn.detect.lo <= p else False

    # -- the detector

    def _next_onset(self) -> tuple[Segment, R] | None:
        """The speech the listening detector will start its next turn on, and where it starts."""
        for seg in self.segments:
            if seg.e.hi <= self.listen.lo and not seg.cut:
                continue
            if seg.s.hi < self.listen.lo:  # speech under way where it starts listening: its next frame
                onset = R(self.listen.lo, self.listen.hi + seg.gap + SLACK)
            else:
                onset = seg.s.max(self.listen)
            if seg.cut and seg.e.lo <= self.pos:  # all of it heard so far; more may come
                return seg, onset
            if seg.e.hi - onset.lo < NO_SPEECH:
                continue  # too short to start a turn
            if seg.e.lo - onset.hi < MIN_SPEECH:
                raise Ambiguous("a short stretch of speech")
            return seg, onset
        return None

    def _scan(self, y: int) -> None:
        """Advance the detector over the audio up to ``y``: turns that start, turns that end."""
        assert self.vad is not None
        while True:
            if self.turn is None:
                found = self._next_onset()
                if found is None:
                    return
                seg, onset = found
                detect = R(onset.lo + DETECT[0], onset.hi + DETECT[1])
                if detect.lo > y:
                    return
                start = R.at(self.origin).max(R(onset.lo - self.vad.padding, onset.hi - self.vad.padding)).max(self.boundary)
                self.turn = Turn(onset, detect, start)
                self.out.append(Expect("speech_started", start=start))
            end, final = self._turn_end(self.turn)
            if end is None or not final:
                return
            self._commit_turn(end, "vad")
            self.listen = end

    def _turn_end(self, turn: Turn) -> tuple[R | None, bool]:
        """Where the turn's item will end (a silence of ``silence`` after its last speech; pauses
        shorter than that stay inside), and whether that is final or only so if no more speech comes."""
        assert self.vad is not None
        silence = self.vad.silence
        segs = [g for g in self.segments if g.e.hi > turn.onset.lo or g.cut]
        if segs and not segs[0].cut and segs[0].e.lo - turn.onset.hi < MIN_SPEECH:
            raise Ambiguous("a turn on a short stretch of speech")
        for seg, nxt in zip(segs, [*segs[1:], None]):
            if seg.gap > silence - MARGIN - ms(60):
                raise Ambiguous("a pause inside the speech nearly as long as the end-of-turn silence")
            if seg.cut or seg.e.hi > self.pos:
                return None, False  # it may still be speaking
            end = seg.e + silence
            if nxt is None:
                return end, self.pos >= end.hi  # the detector has heard the whole silence
            if nxt.s.lo >= end.hi + MARGIN:
                return end, True
            if nxt.s.hi > end.lo - MARGIN - ms(40):
                raise Ambiguous("a pause about as long as the end-of-turn silence")
        return None, False

    def _commit_turn(self, end: R, how: str) -> None:
        assert self.turn is not None
        self.out.append(Expect("committed", how, self.turn.start, end))
        self.turn = None
        self.boundary = self.bstart = end

    def _reset(self, p: int) -> None:
        self.turn = None
        self.origin = p
        self.listen = R.at(p)

    # -- client events

    def event(self, step: Event) -> None:
        p = self.pos
        if self.vad is not None:
            self._scan(p)
            turn = self.turn
            if turn is None:
                found = self._next_onset()
                if found is not None and found[1].lo + DETECT[0] - MARGIN <= p:
                    raise Ambiguous("an event as a turn starts")
            else:
                if turn.detect.lo - MARGIN <= p <= turn.detect.hi + MARGIN:
                    raise Ambiguous("an event as a turn starts")
                end, _ = self._turn_end(turn)
                if end is not None and end.lo - MARGIN <= p:
                    raise Ambiguous("an event as a turn ends")
        if step.kind == "clear":
            self.out.append(Expect("cleared"))
            self.boundary = self.bstart = R.at(p)
            if self.vad is not None:
                self._reset(p)
        elif step.kind == "commit":
            start = self.turn.start if self.turn is not None else self.bstart
            short = ms(MIN_COMMIT_MS)
            if p - start.hi < short <= p - start.lo:
                raise Ambiguous("a commit of about 100 ms")
            if p - start.lo < short:
                self.out.append(Expect("error", "input_audio_buffer_commit_empty"))
                return
            self.out.append(Expect("committed", "commit", start, R.at(p)))
            had_turn = self.turn is not None
            self.turn = None
            self.boundary = self.bstart = R.at(p)
            if had_turn:
                self._reset(p)
        else:
            before = None if self.vad is None else self.vad.settings
            self._set_vad(self.merged(step.turn_detection))
            after = None if self.vad is None else self.vad.settings
            self.out.append(Expect("updated"))
            if before != after:
                if self.turn is not None:  # the turn under way is dropped with the buffer
                    self.boundary = self.bstart = R.at(p)
                self.turn = None
                if self.vad is not None:
                    self._reset(p)
                    self.segments = []  # the new detector hears only what comes next
                    self._last = None

    def run(self, steps: list[Step]) -> list[Expect]:
        for step in steps:
            if isinstance(step, Audio):
                self.append(step)
            else:
                self.event(step)
        if self.turn is not None:
            raise Ambiguous("a turn still open at the end")
        return self.out


def expect(initial: dict[str, Any] | None, steps: list[Step]) -> tuple[list[Expect], list[bool]]:
    model = Model(initial)
    out = model.run(steps)
    return out, model.accepted


# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------


def _chunks(rng: random.Random, n: int) -> tuple[int, ...]:
    out = []
    style = rng.random()
    while n > 0:
        if style < 0.5:
            size = rng.choice([ms(20), ms(40), ms(100), ms(200)])
        else:
            size = rng.randint(1, ms(250))
        size = min(size, n)
        out.append(size)
        n -= size
    return tuple(out)


def _turn_detection(rng: random.Random) -> dict[str, Any] | None:
    r = rng.random()
    if r < 0.2:
        return None
    if r < 0.35:
        return {"type": "semantic_vad", "eagerness": rng.choice(["low", "medium", "high", "auto"]), "create_response": False}
    return {
        "type": "server_vad",
        "silence_duration_ms": rng.choice([300, 400, 500, 700]),
        "prefix_padding_ms": rng.choice([0, 100, 300, 500]),
        "create_response": False,
    }


def _silence(rng: random.Random, lo_ms: int, hi_ms: int) -> Audio:
    n = ms(rng.randint(lo_ms, hi_ms))
    return Audio(-1, 0, n, _chunks(rng, n))


def generate(rng: random.Random) -> tuple[dict[str, Any] | None, list[Step]]:
    """One random sequence: an initial turn detection and a list of steps."""
    initial = _turn_detection(rng)
    steps: list[Step] = []
    count = len(utterances())
    for _ in range(rng.randint(2, 7)):
        r = rng.random()
        if r < 0.4:  # an utterance between silences
            u = rng.randrange(count)
            n = len(utterances()[u].pcm)
            steps += [_silence(rng, 0, 900), Audio(u, 0, n, _chunks(rng, n))]
        elif r < 0.55:  # an event in the middle of an utterance
            u = rng.randrange(count)
            n = len(utterances()[u].pcm)
            k = rng.randint(ms(100), n - ms(100))
            steps += [_silence(rng, 0, 600), Audio(u, 0, k, _chunks(rng, k)), _event(rng), Audio(u, k, n, _chunks(rng, n - k))]
        elif r < 0.65:  # speech longer than the input buffer
            for _ in range(3):
                u = rng.randrange(count)
                n = len(utterances()[u].pcm)
                steps.append(Audio(u, 0, n, _chunks(rng, n)))
        elif r < 0.8:
            steps.append(_silence(rng, 100, 2000))
        else:
            steps.append(_event(rng))
    steps.append(_silence(rng, 1800, 2200))  # the last turn ends (the longest silence, semantic low, is 1.5 s)
    if rng.random() < 0.3:
        steps.append(Event("commit"))
    return initial, steps


def _event(rng: random.Random) -> Event:
    r = rng.random()
    if r < 0.35:
        return Event("clear")
    if r < 0.7:
        return Event("commit")
    return Event("update", _turn_detection(rng))


def judged(rng: random.Random, tries: int = 200) -> tuple[dict[str, Any] | None, list[Step], list[Expect], list[bool], int]:
    """A generated sequence the model can judge, and how many were generated again to get it."""
    for rejected in range(tries):
        initial, steps = generate(rng)
        try:
            out, accepted = expect(initial, steps)
        except Ambiguous:
            continue
        return initial, steps, out, accepted, rejected
    raise RuntimeError("no judgeable sequence in 200 tries")


# ---------------------------------------------------------------------------------------------
# Running a sequence against the server
# ---------------------------------------------------------------------------------------------


SENTINEL = "input-model-sentinel"


@dataclass
class Observed:
    events: list[dict[str, Any]] = field(default_factory=list)  # the input side's events, in order
    items: dict[str, np.ndarray] = field(default_factory=dict)  # committed item id -> its audio


async def play(url: str, initial: dict[str, Any] | None, steps: list[Step], validate: Any = None) -> Observed:
    """Send one sequence on a fresh session; what came back."""
    from websockets.asyncio.client import connect

    observed = Observed()
    kinds = {
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        "input_audio_buffer.cleared", "session.updated", "error", "conversation.item.retrieved",
    }  # fmt: skip
    async with connect(f"{url.rstrip('/')}/realtime?model=input-model", additional_headers={"Authorization": "Bearer k"}, max_size=None, ping_interval=None) as ws:

        async def until(predicate) -> list[dict[str, Any]]:
            got = []
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if validate is not None:
                    validate(event)
                if event["type"] in kinds:
                    got.append(event)
                    if predicate(event):
                        return got

        session = {"type": "realtime", "audio": {"input": {"turn_detection": initial, "transcription": None}}}
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await until(lambda e: e["type"] == "session.updated")
        for step in steps:
            if isinstance(step, Audio):
                pcm = samples(step)
                at = 0
                for size in step.chunks:
                    chunk = pcm[at : at + size]
                    at += size
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk.astype("<i2").tobytes()).decode()}))
            elif step.kind == "update":
                update = {"type": "realtime", "audio": {"input": {"turn_detection": step.turn_detection}}}
                await ws.send(json.dumps({"type": "session.update", "session": update}))
            else:
                await ws.send(json.dumps({"type": f"input_audio_buffer.{step.kind}"}))
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "none", "event_id": SENTINEL}))
        events = await until(lambda e: e["type"] == "error" and e["error"].get("event_id") == SENTINEL)
        observed.events = events[:-1]
        for e in observed.events:
            if e["type"] == "input_audio_buffer.committed":
                await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": e["item_id"]}))
                got = await until(lambda r: r["type"] == "conversation.item.retrieved")
                audio = got[-1]["item"]["content"][0].get("audio") or ""
                observed.items[e["item_id"]] = np.frombuffer(base64.b64decode(audio), "<i2").astype(np.int16)
    return observed


def stream_of(steps: list[Step], accepted: list[bool]) -> np.ndarray:
    """The session's input as it took it: every accepted append, in order."""
    parts, i = [], 0
    for step in steps:
        if isinstance(step, Audio):
            pcm, at = samples(step), 0
            for size in step.chunks:
                if accepted[i]:
                    parts.append(pcm[at : at + size])
                at += size
                i += 1
    return np.concatenate(parts) if parts else np.zeros(0, np.int16)


def compare(expected: list[Expect], observed: Observed, stream: np.ndarray) -> list[str]:
    """Every difference between what the model says and what the session did."""
    got: list[tuple[Expect, str]] = []  # observed events, in the model's terms
    starts: dict[str, int] = {}
    stops: dict[str, int] = {}
    for e in observed.events:
        t = e["type"]
        if t == "input_audio_buffer.speech_started":
            starts[e["item_id"]] = e["audio_start_ms"]
            got.append((Expect("speech_started", start=R.at(ms(e["audio_start_ms"]))), e["item_id"]))
        elif t == "input_audio_buffer.speech_stopped":
            stops[e["item_id"]] = e["audio_end_ms"]
        elif t == "input_audio_buffer.committed":
            how = "vad" if e["item_id"] in stops else "commit"
            got.append((Expect("committed", how), e["item_id"]))
        elif t == "input_audio_buffer.cleared":
            got.append((Expect("cleared"), ""))
        elif t == "session.updated":
            got.append((Expect("updated"), ""))
        elif t == "error":
            got.append((Expect("error", e["error"].get("code") or ""), ""))
    problems = []
    kinds = lambda xs: [f"{x.kind}:{x.how}" if x.how else x.kind for x in xs]  # noqa: E731
    want = [x if x.how != "full" else Expect("committed", "vad", x.start, x.end) for x in expected]  # a full buffer ends a turn as VAD does
    if kinds(want) != kinds([g for g, _ in got]):
        return [f"events differ:\n  model:  {_runs(kinds(expected))}\n  server: {_runs(kinds([g for g, _ in got]))}"]
    for i, (w, (g, item_id)) in enumerate(zip(expected, got)):
        if w.kind == "speech_started":
            assert w.start is not None and g.start is not None
            if not w.start.lo - ms(1) <= g.start.lo <= w.start.hi + ms(1):
                problems.append(f"#{i} speech_started at {g.start.lo / RATE * 1000:.0f} ms, model {w.start.lo / RATE * 1000:.0f}..{w.start.hi / RATE * 1000:.0f} ms")
        if w.kind != "committed":
            continue
        assert w.start is not None and w.end is not None
        audio = observed.items.get(item_id)
        if audio is None:
            problems.append(f"#{i} committed item {item_id} not retrieved")
            continue
        where = _find(audio, stream, w, starts.get(item_id), stops.get(item_id))
        if isinstance(where, str):
            problems.append(f"#{i} {w.how} item {item_id}: {where}")
    return problems


def _runs(names: list[str]) -> str:
    """["a", "a", "b"] -> "a x2, b"."""
    out: list[list[Any]] = []
    for name in names:
        if out and out[-1][0] == name:
            out[-1][1] += 1
        else:
            out.append([name, 1])
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in out)


def _find(audio: np.ndarray, stream: np.ndarray, w: Expect, start_ms: int | None, end_ms: int | None) -> tuple[int, int] | str:
    """Where in the input the item's audio lies: it must be exactly the samples of a stretch whose
    start and end are in the model's ranges (and, reported, in ``audio_start_ms``/``audio_end_ms``)."""
    assert w.start is not None and w.end is not None
    n = len(audio)
    lo, hi = max(w.start.lo, w.end.lo - n), min(w.start.hi, w.end.hi - n)
    if start_ms is not None:  # the reported start (ms, floored) pins it to 24 samples
        lo, hi = max(lo, ms(start_ms)), min(hi, ms(start_ms) + ms(1) - 1)
    if lo > hi:
        span = f"{n / RATE * 1000:.0f} ms" + (f" reported {start_ms}..{end_ms} ms" if start_ms is not None else "")
        return f"holds {span}; model: start {w.start.lo / 24:.0f}..{w.start.hi / 24:.0f} ms, end {w.end.lo / 24:.0f}..{w.end.hi / 24:.0f} ms"
    for s in range(lo, hi + 1):
        if s + n <= len(stream) and np.array_equal(stream[s : s + n], audio):
            if end_ms is not None and abs(ms(end_ms) - (s + n)) >= ms(1):
                return f"audio_end_ms {end_ms} but the audio ends at {(s + n) / 24:.1f} ms"
            return s, s + n
    return f"its {n / RATE * 1000:.0f} ms of audio are not the input's samples anywhere the model allows ({lo / 24:.0f}..{hi / 24:.0f} ms)"


async def check(url: str, initial: dict[str, Any] | None, steps: list[Step], validate: Any = None) -> list[str]:
    """The mismatches of one sequence (empty: the session did what the model says)."""
    expected, accepted = expect(initial, steps)
    observed = await play(url, initial, steps, validate)
    return compare(expected, observed, stream_of(steps, accepted))


async def shrink(url: str, initial: dict[str, Any] | None, steps: list[Step]) -> list[Step]:
    """The fewest steps that still mismatch (delta debugging over the step list; candidates the
    model cannot judge are skipped)."""
    n = 2
    while len(steps) >= 2:
        size = max(1, len(steps) // n)
        reduced = False
        for i in range(0, len(steps), size):
            candidate = steps[:i] + steps[i + size :]
            try:
                expect(initial, candidate)
            except Ambiguous:
                continue
            if await check(url, initial, candidate):
                steps, n, reduced = candidate, max(n - 1, 2), True
                break
        if not reduced:
            if size == 1:
                break
            n = min(n * 2, len(steps))
    return steps


def _dump(initial: dict[str, Any] | None, steps: list[Step]) -> dict[str, Any]:
    return {"initial": initial, "steps": [{"audio": asdict(s)} if isinstance(s, Audio) else {"event": asdict(s)} for s in steps]}


def _load(data: dict[str, Any]) -> tuple[dict[str, Any] | None, list[Step]]:
    steps: list[Step] = []
    for s in data["steps"]:
        if "audio" in s:
            a = s["audio"]
            steps.append(Audio(a["source"], a["start"], a["stop"], tuple(a["chunks"])))
        else:
            steps.append(Event(**s["event"]))
    return data["initial"], steps


def server_config() -> dict[str, Any]:
    """The synthetic pipeline at the wire's rate (items read back sample for sample), a small input
    buffer, no end-of-turn model (semantic_vad waits its fixed silence)."""
    return {
        "pipeline": {"kind": "synthetic", "options": {"input_rate": RATE}},
        "limits": {"max_buffer_seconds": MAX_BUFFER_S, "outbox_events": 4096},
        "turn_end": {"model": None},
        "session": {"audio": {"input": {"transcription": None}}},
    }


async def run(url: str, sequences: int, seed: int, connections: int = 2, validate: Any = None, out: Any = print) -> dict[str, Any]:
    """Judge ``sequences`` generated sequences; a summary (``mismatches``: each shrunk reproducer)."""
    rng = random.Random(seed)
    work = [judged(random.Random(rng.getrandbits(64))) for _ in range(sequences)]
    stats: dict[str, Any] = {"sequences": sequences, "seed": seed, "regenerated": sum(w[4] for w in work), "items": 0, "events": 0, "mismatches": []}
    counts: dict[str, int] = {}
    queue = list(enumerate(work))
    t0 = time.monotonic()

    async def worker() -> None:
        while queue:
            index, (initial, steps, expected, accepted, _) = queue.pop(0)
            observed = await play(url, initial, steps, validate)
            problems = compare(expected, observed, stream_of(steps, accepted))
            stats["items"] += len(observed.items)
            stats["events"] += len(observed.events)
            for x in expected:
                key = f"{x.kind}:{x.how}" if x.how else x.kind
                counts[key] = counts.get(key, 0) + 1
            if problems:
                small = await shrink(url, initial, steps)
                stats["mismatches"].append({"index": index, "problems": problems, "reproducer": _dump(initial, small), "shrunk_problems": await check(url, initial, small)})
                out(f"MISMATCH in sequence {index} (seed {seed}): {problems}")
            if index and index % 500 == 0:
                out(f"{index} sequences, {len(stats['mismatches'])} mismatches, {time.monotonic() - t0:.0f} s")

    await asyncio.gather(*(worker() for _ in range(connections)))
    stats["seconds"] = round(time.monotonic() - t0, 1)
    stats["expected"] = dict(sorted(counts.items()))
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="ws base URL of a running server started with server_config() (default: spawn one)")
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--replay", type=Path, help="a saved mismatch: check its reproducer again")
    args = parser.parse_args(argv)

    async def go(url: str) -> int:
        if args.replay:
            initial, steps = _load(json.loads(args.replay.read_text())["reproducer"])
            problems = await check(url, initial, steps)
            print(json.dumps(problems, indent=2) if problems else "no mismatch")
            return 1 if problems else 0
        stats = await run(url, args.sequences, args.seed, args.connections)
        path = save("input-model", stats)
        for i, m in enumerate(stats["mismatches"]):
            (path.parent / f"input-model-mismatch-{args.seed}-{i}.json").write_text(json.dumps(m, indent=2))
        summary = {k: v for k, v in stats.items() if k != "mismatches"}
        print(json.dumps({**summary, "mismatches": len(stats["mismatches"])}, indent=2))
        print(f"saved {path}")
        return 1 if stats["mismatches"] else 0

    if args.url:
        return asyncio.run(go(args.url))
    with server_process(server_config(), startup_s=60) as url:
        return asyncio.run(go(url))


if __name__ == "__main__":
    sys.exit(main())
