"""End-of-turn fixtures from human recordings that packages ship, labelled here, cached on this machine.

Nothing of it is committed: ``bench/human_turns_setup`` installs the packages (``scripts/test`` runs
it), ``load()`` builds the set once from where they install and caches it under
``<home>/turn-sets/`` (``pipelines.paths.home()``: ``REALTIME_OMNI_HOME`` or ``~/.cache/realtime-omni``).

Where each part comes from (licence as the package states it):

* ``asterisk``: Debian's ``asterisk-core-sounds-en-wav`` and ``-en-g722`` (Allison Smith's IVR
  prompts, CC-BY-SA-3.0): the same recordings twice, 8 kHz PCM and G.722 (16 kHz wideband, decoded
  with PyAV, which aiortc already brings). Prompts Whisper hears as one whole sentence of
  at least 4 words (ending in ".", "?" or "!", the last word not one that rarely ends a sentence,
  ``pipelines.turn_end.text_rule``; two sentences may well be two turns) are used, less the few made to be
  followed by a number or a name (``FRAGMENTS``); the G.722 ones are ``human``, the 8 kHz ones ``phone``.
* ``codec2``: Debian's ``codec2-examples`` (LGPL-2.1 per its copyright file): Harvard sentences,
  at 8 kHz (``phone``) and four in one 16 kHz file (``human``, split at Whisper's sentences).
* ``librivox``: the five LibriVox utterances (public domain readings of *Sense and Sensibility*)
  in pocketsphinx's sdist test data (BSD-2-Clause), 16 kHz, with their transcripts.
* ``conversation``: the 30 s two-speaker telephone conversation in pyannote.audio's wheel
  (MIT, ``pyannote/audio/sample/``: wav, speaker-turn RTTM, timed transcript STM).

Labels, all at 16 kHz (8 kHz recordings are upsampled with soxr, as the SIP transport does, and
reported as ``phone``; so is any recording with no energy above 4 kHz: the pyannote conversation
is telephone speech in a 16 kHz file):

* ``complete``: a whole recorded sentence (or prompt), from 200 ms before its speech to the end of
  the recording's own silence after it (the file's end, or the next sentence); ``end`` is where its
  speech ends (the last 10 ms frame above the recording's speech threshold);
* ``unfinished``: the same sentence cut after a word (Whisper word timestamps, whisper-base; the cut
  at the quietest 10 ms around the boundary, 5 ms fades), with at least two words before and two
  after and never after a word that Whisper punctuates, then 400-900 ms of the recording's own
  noise floor (digital silence where the recording is studio-clean) and the rest of the sentence:
  ``pause`` says where;
* the conversation's real turn ends (``complete``): an RTTM segment after which the other
  speaker takes the floor (overlap up to 250 ms; backchannels inside the turn ignored), up to the
  next speaker's start; its mid-turn pauses (``unfinished``): quiet runs of 200 ms or more inside
  one speaker's segment that no other speaker fills, the turn around them as the item.

Randomness (the cut word, the pause length) is seeded; a given seed builds the same set.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import tarfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dsp.g711 import alaw_to_pcm, ulaw_to_pcm
from dsp.resample import resample
from pipelines import models
from pipelines.paths import home
from pipelines.turn_end.text_rule import NEVER_LAST, PREPOSITIONS

from .audio import read_wav, write_wav
from .turn_fixtures import RATE, Fixture

VERSION = 1
ASTERISK = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
CODEC2 = Path("/usr/share/codec2")
CODEC2_SENTENCES = ["forig", "morig", "hts1a", "hts2a", "mmt1", "big_dog", "cross"]  # one Harvard sentence each
CODEC2_16K = "raw/speech_orig_16k.wav"
# (pip requirement, file pip downloads, its sha256): read in place, never installed
DOWNLOADS = {
    "pyannote": ("pyannote.audio==4.0.7", "pyannote_audio-4.0.7-py3-none-any.whl", "852ea15c4d85bc34773e618267603ffca6a521669a74d33742692cc67fc700d6"),
    "pocketsphinx": ("pocketsphinx==5.1.1", "pocketsphinx-5.1.1.tar.gz", "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355"),
}
DEB_PACKAGES = ["asterisk-core-sounds-en-wav", "asterisk-core-sounds-en-g722", "codec2-examples"]
WHISPER = "whisper-base"
FRAME = RATE // 100  # 10 ms
LEAD = RATE // 5  # 200 ms kept before the speech
MIN_PAUSE = RATE // 5  # a conversation's mid-turn pause: 200 ms or more (semantic_vad asks its model at 200 ms)
MAX_OVERLAP = RATE // 4  # a turn end overlapped by the next speaker by up to 250 ms still counts
GROUPS = ("human", "phone")
# prompts made to be followed by a number or a name: they end a sentence in Whisper's text, not in speech
FRAGMENTS = frozenset(
    "at-tone-time-exactly conf-enteringno if-correct-press num-was-successfully queue-holdtime queue-thereare "
    "vm-from-phonenumber vm-incorrect-mailbox vm-theperson".split()
)
TITLES = frozenset({"mr.", "mrs.", "ms.", "dr.", "st."})


class MissingSource(RuntimeError):
    """A package the human set comes from is not installed: run bench/human_turns_setup."""


def sets_dir() -> Path:
    return home() / "turn-sets"


def downloads_dir() -> Path:
    return sets_dir() / "downloads"


# ---------------------------------------------------------------- audio in


def parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Mono 16-bit PCM, u-law or A-law WAV bytes -> int16, rate (``wave`` reads only PCM)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a WAV file")
    fmt, body, i = None, b"", 12
    while i + 8 <= len(data):
        cid, size = data[i : i + 4], struct.unpack("<I", data[i + 4 : i + 8])[0]
        if cid == b"fmt ":
            fmt = struct.unpack("<HHIIHH", data[i + 8 : i + 24])
        elif cid == b"data":
            body = data[i + 8 : i + 8 + size]
        i += 8 + size + (size & 1)
    if fmt is None or fmt[1] != 1:
        raise ValueError("expected a mono WAV")
    tag, _, rate, _, _, bits = fmt
    if tag == 1 and bits == 16:
        return np.frombuffer(body[: len(body) // 2 * 2], "<i2").astype(np.int16), rate
    if tag in (6, 7) and bits == 8:
        return (ulaw_to_pcm(body) if tag == 7 else alaw_to_pcm(body)).astype(np.int16), rate
    raise ValueError(f"unsupported WAV format {tag}/{bits} bits")


def decode_g722(path: Path) -> np.ndarray:
    """A raw G.722 file (Asterisk's .g722) -> int16 at 16 kHz, with PyAV's decoder."""
    import av

    with av.open(str(path), format="g722") as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    return np.concatenate(frames).astype(np.int16)


def narrowband(pcm: np.ndarray) -> bool:
    """Telephone band: less than 0.1% of the energy above 4 kHz (``pcm`` at RATE)."""
    n = 512
    x = pcm[: len(pcm) // n * n].astype(np.float64).reshape(-1, n) * np.hanning(n)
    power = (np.abs(np.fft.rfft(x, axis=1)) ** 2).sum(0)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    return float(power[freqs > 4000].sum()) < 0.001 * float(power.sum())


# ---------------------------------------------------------------- levels


@dataclass
class Levels:
    """A recording's 10 ms frame levels, its noise floor and the level that counts as speech."""

    rms: np.ndarray
    floor: float
    threshold: float

    @classmethod
    def of(cls, pcm: np.ndarray) -> Levels:
        frames = pcm[: len(pcm) // FRAME * FRAME].astype(np.float64).reshape(-1, FRAME)
        rms = np.sqrt((frames**2).mean(1))
        floor = float(np.percentile(rms, 5))
        return cls(rms, floor, max(4 * floor, 0.02 * float(np.percentile(rms, 95)), 30.0))

    def speech_end(self, lo: int, hi: int) -> int | None:
        """The sample after the last speech frame in [lo, hi)."""
        loud = np.flatnonzero(self.rms[lo // FRAME : hi // FRAME] > self.threshold)
        return None if not len(loud) else (lo // FRAME + int(loud[-1]) + 1) * FRAME

    def speech_start(self, lo: int, hi: int) -> int | None:
        loud = np.flatnonzero(self.rms[lo // FRAME : hi // FRAME] > self.threshold)
        return None if not len(loud) else (lo // FRAME + int(loud[0])) * FRAME

    def quietest(self, lo: int, hi: int) -> int:
        """The middle of the quietest 10 ms frame in [lo, hi)."""
        a, b = lo // FRAME, max(lo // FRAME + 1, hi // FRAME)
        return (a + int(np.argmin(self.rms[a:b]))) * FRAME + FRAME // 2

    def quiet_runs(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Runs of frames below the threshold in [lo, hi), as sample ranges."""
        quiet = self.rms[lo // FRAME : hi // FRAME] <= self.threshold
        runs, start = [], None
        for i, q in enumerate(np.append(quiet, False)):
            if q and start is None:
                start = i
            elif not q and start is not None:
                runs.append((lo // FRAME * FRAME + start * FRAME, lo // FRAME * FRAME + i * FRAME))
                start = None
        return runs

    def noise(self, pcm: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` samples of the recording's own noise floor (its quiet frames, in a random order);
        digital silence when it is studio-clean or has too few quiet frames."""
        quiet = np.flatnonzero(self.rms <= max(2 * self.floor, 1.0))
        if self.floor < 4 or len(quiet) < 10:
            return np.zeros(n, np.int16)
        frames = pcm[: len(self.rms) * FRAME].reshape(-1, FRAME)[quiet]
        order = rng.integers(0, len(frames), n // FRAME + 1)
        return frames[order].reshape(-1)[:n].astype(np.int16)


def _fade(pcm: np.ndarray, out: bool) -> np.ndarray:
    n = min(len(pcm), RATE // 200)  # 5 ms
    ramp = np.linspace(1.0, 0.0, n) if out else np.linspace(0.0, 1.0, n)
    pcm = pcm.astype(np.float64)
    if out:
        pcm[len(pcm) - n :] *= ramp
    else:
        pcm[:n] *= ramp
    return pcm.astype(np.int16)


# ---------------------------------------------------------------- words


@dataclass
class Word:
    text: str
    start: int  # samples at RATE
    end: int


class Transcriber:
    """Whisper word timestamps, cached per recording (by its content) in <turn-sets>/words.json."""

    def __init__(self) -> None:
        self.path = sets_dir() / "words.json"
        self.cache: dict[str, list[list[Any]]] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.model: Any = None
        self.dirty = False

    def words(self, pcm: np.ndarray) -> list[list[Word]]:
        """Whisper's segments (roughly its sentences), each a list of words."""
        key = f"{WHISPER}:{hashlib.sha1(pcm.tobytes()).hexdigest()}"
        if key not in self.cache:
            if self.model is None:
                from faster_whisper import WhisperModel

                from pipelines import models

                self.model = WhisperModel(str(models.ensure(WHISPER, progress=lambda _: None)), device="cpu", compute_type="int8", cpu_threads=1)
            segments, _ = self.model.transcribe(pcm.astype(np.float32) / 32768, language="en", beam_size=1, word_timestamps=True)
            self.cache[key] = [[[w.word.strip(), w.start, w.end] for w in s.words or []] for s in segments]
            self.dirty = True
        return [[Word(t, int(s * RATE), int(e * RATE)) for t, s, e in seg] for seg in self.cache[key] if seg]

    def save(self) -> None:
        if self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.cache))
            tmp.replace(self.path)
            self.dirty = False


_WORD = re.compile(r"[a-z']+")


def finished_sentence(words: list[Word]) -> bool:
    """At least 4 words ending a sentence: '.', '?' or '!' (not '...') after a word that can end one."""
    text = " ".join(w.text for w in words).strip()
    bare = _WORD.findall(text.lower())
    ends = text.endswith((".", "?", "!")) and not text.endswith(("...", "\u2026"))
    return len(words) >= 4 and ends and bool(bare) and bare[-1] not in NEVER_LAST | PREPOSITIONS


def _text(words: list[Word]) -> str:
    return " ".join(w.text for w in words)


# ---------------------------------------------------------------- items


@dataclass
class Recording:
    key: str  # source/name
    pcm: np.ndarray  # int16 at RATE
    rate: int  # as recorded
    heard: np.ndarray | None = None  # what Whisper transcribes instead (the wideband copy of the same recording)
    group: str = field(init=False)

    def __post_init__(self) -> None:
        self.group = "phone" if self.rate < 16000 or narrowband(self.pcm) else "human"


def sentence_items(rec: Recording, words: list[Word], lo: int, hi: int, rng: np.random.Generator) -> list[Fixture]:
    """A complete item for the sentence ``words`` in rec.pcm[lo:hi] (hi: where the recording's own
    silence after it ends), and an unfinished one cut after one of its words."""
    levels = Levels.of(rec.pcm)
    start = levels.speech_start(lo, hi)
    end = levels.speech_end(lo, hi)
    if start is None or end is None:
        return []
    first = max(lo, start - LEAD)
    span = rec.pcm[first:hi]
    source = rec.key.split("/")[0]
    out = [Fixture("complete", _text(words), rec.key, span.copy(), group=rec.group, source=source, end=end - first)]
    cuts = [i for i in range(1, len(words) - 2) if not re.search(r"[-.,?!;:]$", words[i].text) and not words[i + 1].text.startswith("-")]
    if not cuts:
        return out
    i = int(rng.choice(cuts))
    a, b = words[i].end - RATE * 6 // 100, max(words[i].end, words[i + 1].start) + RATE * 6 // 100
    cut = min(max(levels.quietest(max(a, first), min(b, end)), first + FRAME), end - FRAME) - first
    pause = levels.noise(rec.pcm, int(rng.integers(400, 901)) * RATE // 1000, rng)
    pcm = np.concatenate([_fade(span[:cut], out=True), pause, _fade(span[cut:], out=False)])
    text = f"{_text(words[: i + 1])} ... {_text(words[i + 1 :])}"
    out.append(Fixture("unfinished", text, rec.key, pcm, (cut, cut + len(pause)), group=rec.group, source=source, end=end - first + len(pause)))
    return out


def recording_items(rec: Recording, transcriber: Transcriber, rng: np.random.Generator, split: bool = False) -> list[Fixture]:
    """A recording of one prompt (its Whisper segments one sentence or more), or (``split``) of
    several sentences, each an item with the silence up to the next one after it."""
    segments = transcriber.words(rec.pcm if rec.heard is None else rec.heard)
    if not segments:
        return []
    if not split:
        words = [w for s in segments for w in s]
        one = not any(re.search(r"[.?!]$", w.text) and w.text.lower() not in TITLES for w in words[:-1])  # two sentences: two turns, maybe
        return sentence_items(rec, words, 0, len(rec.pcm), rng) if one and finished_sentence(words) else []
    out = []
    for k, seg in enumerate(segments):
        lo = max(0, seg[0].start - LEAD) if k == 0 else segments[k - 1][-1].end
        hi = segments[k + 1][0].start if k + 1 < len(segments) else len(rec.pcm)
        if finished_sentence(seg):
            out += sentence_items(rec, seg, max(lo, seg[0].start - LEAD), hi, rng)
    return out


def conversation_items(rec: Recording, rttm: str, transcriber: Transcriber) -> list[Fixture]:
    """The conversation's real turn ends and mid-turn pauses, from its speaker-turn RTTM."""
    turns = []
    for line in rttm.splitlines():
        f = line.split()
        if f and f[0] == "SPEAKER":
            start = int(float(f[3]) * RATE)
            turns.append((start, start + int(float(f[4]) * RATE), f[7]))
    turns.sort()
    # a segment inside another speaker's (a backchannel: "mhm") does not take the floor
    floor = [t for t in turns if not any(o[2] != t[2] and o[0] <= t[0] and t[1] <= o[1] for o in turns)]
    words = [w for s in transcriber.words(rec.pcm) for w in s]
    levels = Levels.of(rec.pcm)
    out = []
    for start, end, who in floor:
        if end >= len(rec.pcm) - FRAME:
            continue  # cut by the recording's end: not a turn end
        first = max(0, start - LEAD)
        said = [w for w in words if start <= (w.start + w.end) // 2 < end]
        others = [t for t in turns if t[2] != who]
        following = [t for t in floor if t[2] != who and t[0] > start]
        nxt = following[0][0] if following else len(rec.pcm)
        # mid-turn pauses: quiet runs inside the turn with speech of this turn on both sides and no other speaker
        for a, b in levels.quiet_runs(start, end):
            if b - a < MIN_PAUSE or a - start < 3 * FRAME or end - b < 3 * FRAME:
                continue
            if any(o[0] < b and a < o[1] for o in others):
                continue
            before = [w for w in said if w.end <= b]
            text = f"{_text(before)} ... {_text(said[len(before):])}"
            out.append(Fixture("unfinished", text, rec.key, rec.pcm[first:end].copy(), (a - first, b - first), group=rec.group, source="conversation", end=end - first))
        if following and following[0][0] >= end - MAX_OVERLAP and not any(t[2] == who and end <= t[0] < nxt for t in floor):
            stop = max(end, min(nxt, end + RATE * 3 // 2))
            out.append(Fixture("complete", _text(said), rec.key, rec.pcm[first:stop].copy(), group=rec.group, source="conversation", end=end - first))
    return out


# ---------------------------------------------------------------- sources


def _download(name: str) -> Path:
    _, filename, sha256 = DOWNLOADS[name]
    path = downloads_dir() / filename
    if not path.exists():
        raise MissingSource(f"{path} is missing: run bench/human_turns_setup")
    digest = models.sha256(path)
    if digest != sha256:
        raise MissingSource(f"{path}: sha256 {digest}, expected {sha256}")
    return path


def check_sources() -> None:
    """Raises MissingSource naming what is not installed."""
    for path in (ASTERISK / "vm-intro.wav", ASTERISK / "vm-intro.g722", CODEC2 / "wav" / "hts1a.wav"):
        if not path.exists():
            raise MissingSource(f"{path} is missing: run bench/human_turns_setup (Debian packages {', '.join(DEB_PACKAGES)})")
    for name in DOWNLOADS:
        _download(name)


def recordings() -> list[tuple[Recording, str]]:
    """Every recording, with how to label it: "prompt", "sentences" or an RTTM (the conversation)."""
    check_sources()
    out: list[tuple[Recording, str]] = []
    for wav in sorted(w for w in ASTERISK.glob("*.wav") if w.stem not in FRAGMENTS):
        g722 = wav.with_suffix(".g722")
        pcm8, rate = read_wav(wav)
        wide = decode_g722(g722) if g722.exists() else None
        narrow = resample(pcm8, rate, RATE)
        if wide is not None and abs(len(wide) - len(narrow)) > RATE // 50:
            wide = None  # not the same recording after all: each transcribed on its own
        out.append((Recording(f"asterisk/{wav.stem}.wav", narrow, rate, heard=wide), "prompt"))
        if wide is not None:
            out.append((Recording(f"asterisk/{wav.stem}.g722", wide, 16000), "prompt"))
    for name in CODEC2_SENTENCES:
        pcm, rate = parse_wav((CODEC2 / "wav" / f"{name}.wav").read_bytes())
        out.append((Recording(f"codec2/{name}", resample(pcm, rate, RATE), rate), "prompt"))
    pcm, rate = parse_wav((CODEC2 / CODEC2_16K).read_bytes())
    out.append((Recording("codec2/speech_orig_16k", resample(pcm, rate, RATE), rate), "sentences"))
    with tarfile.open(_download("pocketsphinx")) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if "/test/data/librivox/" in member.name and member.name.endswith(".wav"):
                data = tar.extractfile(member)
                assert data is not None
                pcm, rate = parse_wav(data.read())
                out.append((Recording(f"librivox/{Path(member.name).stem}", resample(pcm, rate, RATE), rate), "prompt"))
    with zipfile.ZipFile(_download("pyannote")) as whl:
        pcm, rate = parse_wav(whl.read("pyannote/audio/sample/sample.wav"))
        rttm = whl.read("pyannote/audio/sample/sample.rttm").decode()
    out.append((Recording("conversation/sample", resample(pcm, rate, RATE), rate), rttm))
    return out


def items_of(rec: Recording, how: str, transcriber: Transcriber, seed: int) -> list[Fixture]:
    """A recording's labelled items; ``how``: "prompt", "sentences" or the conversation's RTTM."""
    # seeded by the recording, not its encoding: a prompt's G.722 and 8 kHz copies are cut alike
    stem = rec.key.rsplit(".", 1)[0]
    rng = np.random.default_rng([seed, int(hashlib.sha1(stem.encode()).hexdigest()[:8], 16)])
    if how == "prompt":
        return recording_items(rec, transcriber, rng)
    if how == "sentences":
        return recording_items(rec, transcriber, rng, split=True)
    return conversation_items(rec, how, transcriber)


def build(seed: int = 0) -> list[Fixture]:
    transcriber = Transcriber()
    made: list[Fixture] = []
    try:
        for rec, how in recordings():
            made += items_of(rec, how, transcriber, seed)
    finally:
        transcriber.save()
    return made


# ---------------------------------------------------------------- the cache


def _set_dir(seed: int) -> Path:
    return sets_dir() / f"human-v{VERSION}-seed{seed}"


def load(seed: int = 0, rebuild: bool = False) -> list[Fixture]:
    """The labelled human set (built and cached at the first call)."""
    where = _set_dir(seed)
    index = where / "index.json"
    if rebuild or not index.exists():
        made = build(seed)
        audio = where / "audio"
        audio.mkdir(parents=True, exist_ok=True)
        rows = []
        for n, f in enumerate(made):
            name = f"{n:04d}.wav"
            write_wav(audio / name, f.pcm, RATE)
            rows.append({**{k: v for k, v in asdict(f).items() if k != "pcm"}, "wav": name})
        tmp = index.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": VERSION, "seed": seed, "items": rows}, indent=1))
        tmp.replace(index)
    rows = json.loads(index.read_text())["items"]
    out = []
    for row in rows:
        pcm, _ = read_wav(where / "audio" / row.pop("wav"))
        pause = row.pop("pause")
        out.append(Fixture(pcm=pcm, pause=None if pause is None else (pause[0], pause[1]), **row))
    return out


def counts(items: list[Fixture]) -> dict[str, dict[str, int]]:
    """Items per group and kind, and per source."""
    out: dict[str, dict[str, int]] = {}
    for f in items:
        group = out.setdefault(f.group, {})
        for k in (f.kind, f"{f.source}:{f.kind}"):
            group[k] = group.get(k, 0) + 1
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    items = load(args.seed, args.rebuild)
    print(json.dumps(counts(items), indent=1))
    print("cached in", _set_dir(args.seed))


if __name__ == "__main__":
    main()
