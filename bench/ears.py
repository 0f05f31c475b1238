"""The agent's ears: word error rate and time per clip of each listener, in one run, on the same clips;
then, through a real server, how soon a transcription session's transcript follows its commit.

``offline``: every request of the bench's own sets (``bench.answers``' prompts, ``bench.tools``'
requests, no-tool requests, held-out requests and, since 2026-11-29, the said set's names and
places: 132 requests, 120 before), said by two espeak voices (en-us 160 wpm, en-gb
150 wpm; ``--voices``; each clip from 200 ms before the speech to 300 ms after it, ``--tail-ms``), and the people's speech of the human end-of-turn set whose words are known
from their sources, not from a recogniser (LibriVox readings with pocketsphinx's transcripts, the
pyannote telephone conversation's turns with its STM transcript: ``--human``), each heard whole by
each listener in process (``pipelines.cascade.listener.open_listener``, 2 threads, one clip at a
time), as ``models prepare`` makes them. WER counts words after ``bench.metrics.words`` (lower case,
no punctuation) with number words as digits ("two" = "2"), over all clips of a set (edits / words).

``passes``: each spoken clip heard as ``Overhearing`` hears a turn as it grows (a pass every 300 ms
of audio, each going on from the last one's tokens, and one over the whole clip): what a turn's
passes cost together, and the last one (the pause's) alone.

``session``: a transcription session (``type: transcription``, manual turns: ``turn_detection:
null``) on a server of ``--config`` with each listener, the requests streamed in real time (20 ms
appends, 300 ms of silence after the speech), then ``input_audio_buffer.commit``: the time from the
commit to ``conversation.item.input_audio_transcription.completed`` (p50, p90), and the WER of those
transcripts.

    python -m bench ears --listeners whisper-tiny.en moonshine-base --isa avx2
    python -m bench ears --part session --limit 20
    python -m bench ears --part offline --listeners moonshine-base moonshine-base+argmax-opening --tail-ms 40
    python -m bench ears --listeners moonshine-base+greedy moonshine-base --tail-ms 40
    python -m bench ears --part passes --listeners moonshine-base+greedy moonshine-base --tail-ms 40 --voices piper en-us-160
    python -m bench ears --part offline --listeners moonshine-base moonshine-base+keywords --voices piper en-us-160 en-gb-150

``+keywords``: the listener told ``bench.tools.KEYWORDS`` to expect (a contact list of 30 names and
30 towns, the sets' people and places among them: ``audio.input.transcription.keywords``), on every
clip, those that name none of them too. ``moonshine-base+greedy``: Moonshine decoded greedily, without its beam where it is unsure (the
listener before 2026-11-29, pipelines/cascade/moonshine.py). ``moonshine-base+argmax-opening``: Moonshine with the decoder's own first token, where the listener
takes a word instead of a list's number or a quote mark ("1. What is ...", "\"'What is ...";
pipelines/cascade/moonshine.py), on the same clips (Piper's voice differs from one synthesis to the next: compare within one run).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import sys
import time
from typing import Any

import numpy as np

from bench.audio import espeak, resample, speech_bounds_ms
from bench.common import machine, save, server_config, server_process
from bench.isa import environment
from bench.metrics import dist, word_edits, words

RATE = 16000
ARGMAX_OPENING = "+argmax-opening"  # a listener name so ended: Moonshine with the decoder's own first token
GREEDY = "+greedy"  # a listener name so ended: greedy decoding (Moonshine without its beam)
WITH_KEYWORDS = "+keywords"  # a listener name so ended: told bench.tools.KEYWORDS (a contact list and towns) to expect
WIRE_RATE = 24000
VOICES = {"en-us-160": ("en-us", 160), "en-gb-150": ("en-gb", 150)}
NUMBER_WORDS = set("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())
NUMBER_WORDS |= set("twenty thirty forty fifty sixty seventy eighty ninety hundred".split())


def said_words(text: str) -> list[str]:
    """``bench.metrics.words`` with every number as its digits, one word each: the listeners write
    numbers either way ("one hundred and twenty" / "120", "four five one two" / "4512", "8pm")."""
    from bench.tools import _numbers

    out: list[str] = []
    run: list[str] = []  # number words (and an "and" after a hundred) not yet written

    def flush() -> None:
        if run:
            out.extend(d for n in _numbers(" ".join(run)) for d in str(n))
            run.clear()

    for w in words(re.sub(r"(\d)([a-z])", r"\1 \2", text.lower().replace("-", " "))):
        if w.isdigit() or w in NUMBER_WORDS or (w == "and" and run and run[-1] == "hundred"):
            run.append(w)
        else:
            flush()
            out.append(w)
    flush()
    return out


def edits(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words)."""
    ref = said_words(reference)
    return word_edits(ref, said_words(hypothesis)), len(ref)


def requests() -> list[str]:
    from bench.answers import PROMPTS
    from bench.tools import HELDOUT_NO_TOOL, HELDOUT_REQUESTS, NO_TOOL, REQUESTS, SAID_NO_TOOL, SAID_REQUESTS

    seen: dict[str, None] = {}
    for text in [p.text for p in PROMPTS] + [r.text for r in REQUESTS + NO_TOOL + HELDOUT_REQUESTS + HELDOUT_NO_TOOL + SAID_REQUESTS + SAID_NO_TOOL]:
        seen.setdefault(text, None)
    return list(seen)


def spoken_clips(voices: list[str], limit: int | None, tail_ms: int = 300) -> list[dict[str, Any]]:
    """The requests said by each voice: espeak's, or Piper's "joe" (``piper``: a voice nearer a
    person's, and the agent's own), from 200 ms before the speech to ``tail_ms`` after it."""
    clips = []
    for voice in voices:
        say = _piper() if voice == "piper" else None
        for text in requests()[:limit]:
            if say is not None:
                pcm = resample(say(text), WIRE_RATE, RATE)
            else:
                name, wpm = VOICES[voice]
                pcm = espeak(text, RATE, voice=name, wpm=wpm)
            first, last = speech_bounds_ms(pcm, RATE)
            clips.append({"set": f"{'piper' if say else 'espeak'} {voice}", "text": text, "pcm": pcm[max(0, first - 200) * RATE // 1000 : (last + tail_ms) * RATE // 1000]})
    return clips


def _piper() -> Any:
    from bench.tools import piper_voice

    return piper_voice()


def human_clips(limit: int | None) -> list[dict[str, Any]]:
    """People's speech whose words come with the recording (not from a recogniser)."""
    from bench import human_turns

    clips = []
    for f in human_turns.load():
        if f.kind == "complete" and f.source in ("librivox", "conversation"):
            clips.append({"set": f"human {f.source}", "text": f.text, "pcm": f.pcm})
    return clips[:limit] if limit else clips


def _listener(name: str) -> Any:
    """The listener ``name`` names (``+greedy``, ``+argmax-opening``: see above), in process, 2
    threads, its one-time costs paid."""
    from pipelines import models
    from pipelines.cascade.ears import open_listener

    model = name.removesuffix(WITH_KEYWORDS).removesuffix(ARGMAX_OPENING).removesuffix(GREEDY)
    ears = open_listener(model, str(models.ensure(model, print)), threads=2, beam_size=1 if GREEDY in name else 0)
    if name.endswith(ARGMAX_OPENING):  # (Moonshine's words-first rule off: the decoder's own first token)
        ears.words_first = False  # type: ignore[attr-defined]
    ears.transcribe(np.zeros(RATE, np.int16))
    return ears


def offline(listeners: list[str], clips: list[dict[str, Any]]) -> dict[str, Any]:
    from bench.tools import KEYWORDS

    rows: list[dict[str, Any]] = []
    for name in listeners:
        ears = _listener(name)
        expected = tuple(KEYWORDS) if name.endswith(WITH_KEYWORDS) else ()
        for clip in clips:
            t0 = time.perf_counter()
            heard = ears.hear(clip["pcm"], False, (), expected).text
            ms = (time.perf_counter() - t0) * 1000
            wrong, n = edits(clip["text"], heard)
            rows.append({"listener": name, "set": clip["set"], "text": clip["text"], "heard": heard, "ms": round(ms, 1), "seconds": round(len(clip["pcm"]) / RATE, 2), "edits": wrong, "words": n})
        print(f"{name}: {len(clips)} clips", flush=True)
    summary: dict[str, Any] = {}
    for name in listeners:
        for group in sorted({r["set"] for r in rows}) + ["espeak", "piper", "human"]:
            mine = [r for r in rows if r["listener"] == name and (r["set"] == group or r["set"].startswith(group + " "))]
            if mine:
                summary[f"{name} | {group}"] = {
                    "clips": len(mine),
                    "wer": round(sum(r["edits"] for r in mine) / max(1, sum(r["words"] for r in mine)), 4),
                    "word_for_word": round(sum(r["edits"] == 0 for r in mine) / len(mine), 3),
                    "ms": dist([r["ms"] for r in mine], 1),
                    "ms_per_audio_s": round(float(np.median([r["ms"] / max(r["seconds"], 0.1) for r in mine])), 1),
                }
    return {"rows": rows, "summary": summary}


def passes(listeners: list[str], clips: list[dict[str, Any]], every_ms: int = 300) -> dict[str, Any]:
    """Each clip heard as it grows, in process: a pass every ``every_ms`` of audio, each going on
    from the one before (its tokens as the hint, as ``Overhearing`` gives them), and one over the
    whole clip: what a turn's passes cost the ears together, and the last one alone (the pause's)."""
    out: dict[str, Any] = {}
    step = RATE * every_ms // 1000
    for name in listeners:
        ears = _listener(name)
        turns, last = [], []
        for clip in clips:
            pcm, hint, spent = clip["pcm"], (), 0.0
            for n in [*range(step, len(pcm), step), len(pcm)]:
                t0 = time.perf_counter()
                hint = ears.hear(pcm[:n], True, hint).tokens
                took = (time.perf_counter() - t0) * 1000
                spent += took
            turns.append(spent)
            last.append(took)
        out[name] = {"turn_ms": dist(turns, 1), "last_pass_ms": dist(last, 1), "clips": len(clips)}
    return out


async def one_commit(url: str, pcm: np.ndarray, model: str) -> tuple[float | None, str, int]:
    """ms from the commit to the completed transcript, the transcript, deltas before the commit."""
    import websockets

    step = WIRE_RATE // 50
    async with websockets.connect(f"{url}/realtime?model=bench", max_size=None) as ws:
        td = {"type": "transcription", "audio": {"input": {"turn_detection": None, "transcription": {"model": model}}}}
        await ws.send(json.dumps({"type": "session.update", "session": td}))
        t0 = time.perf_counter()
        for i in range(0, len(pcm), step):
            delay = t0 + i / WIRE_RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + step].tobytes()).decode()}))
        await asyncio.sleep(max(0.0, t0 + len(pcm) / WIRE_RATE - time.perf_counter()))
        committed = time.perf_counter()
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        deltas_before = 0
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "conversation.item.input_audio_transcription.completed":
                return round((time.perf_counter() - committed) * 1000, 1), event["transcript"], deltas_before
            if event["type"] == "error" or event["type"].endswith(".failed"):
                raise RuntimeError(json.dumps(event))
    return None, "", 0


async def session_run(url: str, clips: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    rows = []
    for clip in clips:
        pcm = resample(clip["pcm"], RATE, WIRE_RATE)
        ms, heard, _ = await one_commit(url, pcm, model)
        wrong, n = edits(clip["text"], heard)
        rows.append({"text": clip["text"], "heard": heard, "commit_to_completed_ms": ms, "edits": wrong, "words": n})
        print(f"{str(ms):>7} ms  {clip['text'][:50]!r} -> {heard[:50]!r}", flush=True)
    return rows


def session(args: argparse.Namespace, clips: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in args.listeners:
        config = server_config(args.config, {})
        options = config["pipeline"]["options"]
        options["asr_model"] = name.removesuffix(GREEDY)
        options["asr_beam_size"] = 1 if name.endswith(GREEDY) else 0
        options["hear_every_ms"] = 0 if name.startswith("whisper") else options.get("hear_every_ms", 300)
        with server_process(config) as url:
            rows = asyncio.run(session_run(url, clips, name))
        times = [r["commit_to_completed_ms"] for r in rows if r["commit_to_completed_ms"] is not None]
        out[name] = {
            "commit_to_completed_ms": dist(times, 1),
            "wer": round(sum(r["edits"] for r in rows) / max(1, sum(r["words"] for r in rows)), 4),
            "rows": rows,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listeners", nargs="+", default=["whisper-tiny.en", "moonshine-base"])
    ap.add_argument("--part", nargs="+", default=["offline", "session"], choices=["offline", "passes", "session"])
    ap.add_argument("--voices", nargs="+", default=[*VOICES, "piper"], choices=[*VOICES, "piper"])
    ap.add_argument("--human", action=argparse.BooleanOptionalAction, default=True, help="people's speech too (bench/human_turns_setup first)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many requests a voice (and human clips)")
    ap.add_argument("--session-limit", type=int, default=24, help="requests streamed through the server, per listener")
    ap.add_argument(
        "--tail-ms", type=int, default=300, help="offline: the spoken clips end this long after the speech (40: as the pass taken when the user goes quiet hears them)"
    )
    ap.add_argument("--config", default="cpu")
    ap.add_argument("--isa", default=None, help="avx2: as on a CPU without AVX-512 (bench/isa.py)")
    args = ap.parse_args(argv)
    os.environ.update(environment(args.isa))
    result: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    clips = spoken_clips(args.voices, args.limit, args.tail_ms)
    if "offline" in args.part:
        every = clips + (human_clips(args.limit) if args.human else [])
        result["offline"] = offline(args.listeners, every)
        print(f"\n{'listener | set':42} {'clips':>5} {'WER':>7} {'exact':>6} {'ms p50':>7} {'p90':>7} {'ms/s':>6}")
        for key, s in result["offline"]["summary"].items():
            print(f"{key:42} {s['clips']:>5} {s['wer']:>7.3f} {s['word_for_word']:>6.0%} {s['ms'].get('p50', '-'):>7} {s['ms'].get('p90', '-'):>7} {s['ms_per_audio_s']:>6}")
    if "passes" in args.part:
        result["passes"] = passes(args.listeners, clips)
        print(f"\n{'listener':24} {'a turn heard as it grows: ms p50':>32} {'p90':>7} {'its last pass p50':>18} {'p90':>7}")
        for name, s in result["passes"].items():
            print(f"{name:24} {s['turn_ms'].get('p50', '-'):>32} {s['turn_ms'].get('p90', '-'):>7} {s['last_pass_ms'].get('p50', '-'):>18} {s['last_pass_ms'].get('p90', '-'):>7}")
    if "session" in args.part:
        picked = [c for c in clips if c["set"].endswith(f" {args.voices[0]}")][:: max(1, len(requests()) // args.session_limit)][: args.session_limit]
        result["session"] = session(args, picked)
        print(f"\n{'listener':20} {'commit -> completed p50':>24} {'p90':>7} {'WER':>7}")
        for name, s in result["session"].items():
            d = s["commit_to_completed_ms"]
            print(f"{name:20} {d.get('p50', '-'):>24} {d.get('p90', '-'):>7} {s['wer']:>7.3f}")
    print("saved", save("ears", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
