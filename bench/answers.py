"""Answer quality of a voice agent: does what it says make sense?

Spoken prompts a voice assistant gets (facts with a checkable answer, arithmetic, yes/no, short
how-to, greetings, and follow-ups that need the previous turn), spoken by espeak-ng (or, with
``--voice piper``, Piper's joe: a voice nearer a person's for the agent's ears), go through the
real server over the replay harness, one fresh session per prompt (two turns for a follow-up). The
answer *audio* is transcribed by Whisper base (a larger model than the agent's own, so the score
does not share its ears), so a TTS failure counts as a wrong answer. Per thinker config:

    correct     answers whose transcript holds the expected key word(s) (digits and number words
                alike), over all prompts and over the factual ones (facts, arithmetic, yes/no,
                follow-ups)
    sentences   answers (the server's own transcript) that are one or two complete sentences
    v2v         voice-to-voice p50 / p90 (end of the user's speech -> first answer audio)
    heard       whose miss: the prompts the agent's ears (the server's transcript of the request)
                heard word for word, and the factual ones right among those (the thinker's score
                with the ears' misses set apart)

    python -m bench.answers [--configs smollm2 smollm2-examples gemma3-270m] [--limit N] [--silence-ms 500] [--tools] [--voice piper]

``--tools`` offers bench.tools' five function tools in every session: what tools on offer do to
plain answers. The arithmetic prompts may then be answered by a call to ``calculate`` (the bench
runs no tool): such a call is right when its expression comes to the answer; any other call is a
wrong answer. Every session is opened with one API key, as an app's sessions
are (the openai SDK always sends one), so sessions share the cached prefix of the instructions and
tools (docs/reliability.md); ``--anonymous`` opens them without a key, each in a prefix-cache
namespace of its own, so each prefills its tools while its user speaks.

Results go to bench/results/answers-*.json with every answer, its transcript and its score.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import metrics, replay
from bench.audio import espeak
from bench.client import Options
from bench.common import machine, save, server_process
from bench.dataset import RATE, Conversation, Turn
from bench.metrics import dist
from bench.said import normalise
from bench.tools import TOOLS, espeak_voice, evaluate, piper_voice
from dsp.resample import resample
from realtime_omni import config as config_file

FACTUAL = {"fact", "math", "yesno", "follow"}


@dataclass(frozen=True)
class Prompt:
    text: str
    keys: tuple[str, ...]  # every key must appear; "a|b" means either; "+word": the word, and no negation in the answer
    kind: str  # fact, math, yesno, howto, greeting, follow


P = Prompt
PROMPTS: list[Prompt] = [
    P("What is the capital of Japan?", ("tokyo",), "fact"),
    P("What is the capital of France?", ("paris",), "fact"),
    P("What is the capital of Italy?", ("rome",), "fact"),
    P("What is the capital of Germany?", ("berlin",), "fact"),
    P("What is the capital of Greece?", ("athens",), "fact"),
    P("What is the capital of England?", ("london",), "fact"),
    P("What is the capital of Canada?", ("ottawa",), "fact"),
    P("What is the capital of Russia?", ("moscow",), "fact"),
    P("What is the capital of Egypt?", ("cairo",), "fact"),
    P("What is the largest planet in our solar system?", ("jupiter",), "fact"),
    P("Which planet is known as the red planet?", ("mars",), "fact"),
    P("What is the closest star to the Earth?", ("sun",), "fact"),
    P("What do bees make?", ("honey",), "fact"),
    P("What color is the sky on a clear day?", ("blue",), "fact"),
    P("What color are bananas when they are ripe?", ("yellow",), "fact"),
    P("How many days are there in a week?", ("7",), "fact"),
    P("How many legs does a spider have?", ("8",), "fact"),
    P("How many continents are there?", ("7",), "fact"),
    P("What is frozen water called?", ("ice",), "fact"),
    P("Who wrote Romeo and Juliet?", ("shakespeare",), "fact"),
    P("What is the opposite of hot?", ("cold",), "fact"),
    P("What language do people speak in Brazil?", ("portuguese",), "fact"),
    P("What animal says moo?", ("cow",), "fact"),
    P("In which country are the pyramids of Giza?", ("egypt",), "fact"),
    P("What is the boiling point of water in Celsius?", ("100",), "fact"),
    P("What is two plus two?", ("4",), "math"),
    P("What is three plus five?", ("8",), "math"),
    P("What is ten minus four?", ("6",), "math"),
    P("What is five times two?", ("10",), "math"),
    P("What is six plus seven?", ("13",), "math"),
    P("What is nine minus three?", ("6",), "math"),
    P("What is half of twenty?", ("10",), "math"),
    P("Is the sun a star?", ("yes|+star",), "yesno"),
    P("Is water wet?", ("yes|+wet",), "yesno"),
    P("Can fish breathe under water?", ("yes|+breathe",), "yesno"),
    P("Is the moon bigger than the Earth?", ("no|smaller",), "yesno"),
    P("Can a dog fly?", ("no|not|cannot|can t",), "yesno"),
    P("Is ice cold?", ("yes|+cold",), "yesno"),
    P("Is Paris in France?", ("yes|+france",), "yesno"),
    P("How do I boil an egg?", ("water|boil",), "howto"),
    P("How do I make a cup of tea?", ("water|tea bag|boil|kettle",), "howto"),
    P("How can I fall asleep faster?", ("bed|sleep|relax|light|screen|routine|breath",), "howto"),
    P("How do I wash my hands properly?", ("soap|water",), "howto"),
    P("How do I keep a plant alive?", ("water|sun|light",), "howto"),
    P("Hello!", ("hello|hi|hey|help|how are",), "greeting"),
    P("Good morning!", ("morning|hello|hi|help|how are",), "greeting"),
    P("Thank you very much.", ("welcome|pleasure|glad|problem|happy",), "greeting"),
    P("How are you today?", ("good|well|fine|great|thank",), "greeting"),
    P("Goodbye!", ("bye|goodbye|care|later|day",), "greeting"),
    P("Nice to meet you.", ("nice|pleasure|meet|you too|hello",), "greeting"),
]
# (the first turn, the follow-up that needs it): only the follow-up's answer is scored
FOLLOW_UPS: list[tuple[str, Prompt]] = [
    ("What is the capital of France?", P("And what is the capital of Italy?", ("rome",), "follow")),
    ("My name is Anna.", P("What is my name?", ("anna",), "follow")),
    ("What is two plus three?", P("And what is that plus one?", ("6",), "follow")),
    ("I live in Berlin.", P("Which country do I live in?", ("germany",), "follow")),
    ("My favourite color is green.", P("What is my favourite color?", ("green",), "follow")),
]

NEGATIONS = ("no", "not", "cannot", "can t", "isn t", "aren t", "doesn t", "don t", "never")


def correct(prompt: Prompt, heard: str, calls: Sequence[dict[str, str]] = ()) -> bool:
    """The key word(s) heard in the answer; or, for arithmetic with a calculator offered, the
    answer was a call to it whose expression comes to the key (what an app would run and say)."""
    if calls:
        try:
            values = [evaluate(json.loads(c["arguments"]).get("expression", "")) if c["name"] == "calculate" else None for c in calls]
        except (ValueError, AttributeError):
            return False
        return prompt.kind == "math" and len(values) == 1 and values[0] is not None and f"{values[0]:g}" == prompt.keys[0]
    said = f" {normalise(heard)} "
    denied = any(f" {w} " in said for w in NEGATIONS)

    def says(alt: str) -> bool:  # "+word": affirmed ("Fish can breathe underwater." answers "Can fish ...?")
        return not denied and f" {normalise(alt[1:])} " in said if alt.startswith("+") else f" {normalise(alt)} " in said

    return all(any(says(alt) for alt in key.split("|")) for key in prompt.keys)


def complete_sentences(answer: str) -> bool:
    """One or two sentences, the last one finished."""
    text = answer.strip()
    if not text or text[-1] not in ".!?":
        return False
    return 1 <= len([s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]) <= 2


# said either way: one way for both (a contraction for its words; British spellings are made
# American by bench.metrics.words, as the word error rate has them)
SAME = {"what s": "what is", "it s": "it is", "that s": "that is", "can t": "cannot", "can not": "cannot", "don t": "do not", "under water": "underwater"}


def heard_right(prompt: str, heard: str | None) -> bool | None:
    """Whether the ears heard the prompt word for word (case, punctuation, number words against
    digits, spellings and the few ways of ``SAME`` aside). None: no transcript came."""
    if heard is None:
        return None

    def words(text: str) -> str:
        text = f" {normalise(' '.join(metrics.words(text)))} "
        for either, one in SAME.items():
            text = text.replace(f" {either} ", f" {one} ")
        return " ".join(text.split())

    return words(heard) == words(prompt)


def conversations(limit: int, speak: Callable[[str], np.ndarray] | None = None) -> list[tuple[Conversation, Prompt]]:
    """One conversation per prompt (the follow-ups two turns long); the prompt scored is the last.
    ``speak``: text -> 24 kHz speech (espeak-ng unless given)."""
    speak = speak or (lambda text: espeak(text, RATE))
    out: list[tuple[Conversation, Prompt]] = []
    for k, p in enumerate(PROMPTS[:limit] if limit else PROMPTS):
        out.append((Conversation(f"answers-{k:02d}", [Turn(p.text, speak(p.text))]), p))
    for k, (first, p) in enumerate(FOLLOW_UPS[: max(1, limit // 10)] if limit else FOLLOW_UPS):
        turns = [Turn(first, speak(first)), Turn(p.text, speak(p.text))]
        out.append((Conversation(f"answers-follow-{k}", turns), p))
    return out


# Thinkers to compare: a name -> (config file, thinker options over it). Any config name works too.
EXAMPLES = [
    ["Hello, who are you?", "I'm a voice assistant. How can I help you today?"],
    ["What is the capital of Portugal?", "The capital of Portugal is Lisbon."],
    ["What is four plus four?", "Four plus four is eight."],
    ["Can you suggest something to drink?", "A cup of green tea is a nice choice."],
]
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2": ("cpu-smollm2", {}),
    "smollm2-examples": ("cpu-smollm2", {"examples": EXAMPLES, "temperature": 0.0}),
    "gemma3-270m": ("cpu-gemma", {}),
    "qwen2.5-coder-0.5b-w8": ("cpu", {}),  # the default: int8 weights, greedy
    "qwen2.5-coder-0.5b-w8-t0.3": ("cpu", {"temperature": 0.3}),  # the default before 2026-11-28: sampled at 0.3
    "qwen2.5-coder-1.5b-w8": ("cpu-1.5b", {}),  # the larger thinker (./scripts/install larger-thinker)
    "qwen2.5-coder-0.5b": ("cpu", {"model": "qwen2.5-coder-0.5b-instruct"}),
    "qwen2.5-coder-0.5b-examples": ("cpu", {"model": "qwen2.5-coder-0.5b-instruct", "examples": EXAMPLES, "temperature": 0.0}),
    "qwen2.5-coder-0.5b-w8-greedy-ears": ("cpu", {}),  # the default thinker, Moonshine decoded greedily (before 2026-11-29)
}
CASCADE: dict[str, dict[str, Any]] = {"qwen2.5-coder-0.5b-w8-greedy-ears": {"asr_beam_size": 1}}  # a variant's cascade options over its config's


def config(name: str, silence_ms: int, tools: bool = False) -> dict[str, Any]:
    """``tools``: every session offered bench.tools' five function tools (none of which any prompt
    here needs): what tools on offer do to plain answers."""
    base, thinker = VARIANTS.get(name, (name, {}))
    cfg = config_file.raw(base)
    cfg["pipeline"]["options"]["thinker"].update(thinker)
    cfg["pipeline"]["options"].update(CASCADE.get(name, {}))
    cfg["session"].setdefault("audio", {}).setdefault("input", {})["turn_detection"] = {"type": "server_vad", "silence_duration_ms": silence_ms}
    if tools:
        cfg["session"]["tools"] = [dict(t) for t in TOOLS]
    return cfg


KEY = "bench-answers"  # any key opens the bench's open server; one key: one prefix-cache namespace


async def score(url: str, items: list[tuple[Conversation, Prompt]], ears: Any, api_key: str | None = KEY) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Replay ``items`` into the server at ``url`` one by one, each session opened with ``api_key``;
    each scored answer, and the replay."""
    result = await replay.replay([c for c, _ in items], Options(url=url, keep_audio=True, api_key=api_key), concurrency=1, progress=False)
    by_conv: dict[str, dict[str, Any]] = {}
    for turn in result["turns"]:
        by_conv[turn["conversation"]] = turn  # the last turn of each conversation is the scored one
    rows = []
    for conv, prompt in items:
        turn = by_conv.get(conv.name, {})
        pcm = np.frombuffer(turn.get("answer_audio") or b"", "<i2")
        heard = await asyncio.to_thread(ears.transcribe, resample(pcm, RATE, 16000)) if len(pcm) else ""
        rows.append(
            {
                "prompt": prompt.text,
                "kind": prompt.kind,
                "answer": turn.get("answer") or "",
                "ears": turn.get("heard"),  # what the agent's ears made of the prompt
                "ears_right": heard_right(prompt.text, turn.get("heard")),
                "heard": heard,
                "calls": turn.get("calls") or [],
                "correct": correct(prompt, heard, turn.get("calls") or []),
                "sentences_ok": complete_sentences(turn.get("answer") or ""),
                "voice_to_voice_ms": turn.get("voice_to_voice_ms"),
                "status": turn.get("status"),
            }
        )
    for turn in result["turns"]:
        turn.pop("answer_audio", None)
    return rows, result


def summarize(rows: list[dict[str, Any]], result: dict[str, Any]) -> dict[str, Any]:
    factual = [r for r in rows if r["kind"] in FACTUAL]
    v2v = [r["voice_to_voice_ms"] for r in rows if r["voice_to_voice_ms"] is not None]
    summary = {
        "prompts": len(rows),
        "correct": round(sum(r["correct"] for r in rows) / max(1, len(rows)), 3),
        "correct_factual": round(sum(r["correct"] for r in factual) / max(1, len(factual)), 3),
        "sentences_ok": round(sum(r["sentences_ok"] for r in rows) / max(1, len(rows)), 3),
        "voice_to_voice_ms": dist(v2v),
        "errors": len(result["connection_errors"]) + sum(1 for r in rows if r["status"] != "completed"),
        # whose miss: the thinker's score over the prompts its ears heard word for word
        "ears_right": round(sum(bool(r["ears_right"]) for r in rows) / max(1, len(rows)), 3),
        "correct_factual_heard_right": round(np.mean([r["correct"] for r in factual if r["ears_right"]]), 3) if any(r["ears_right"] for r in factual) else None,
        "answered_by_call": sum(1 for r in rows if r["calls"]),
        "by_kind": {k: round(np.mean([r["correct"] for r in rows if r["kind"] == k]), 3) for k in sorted({r["kind"] for r in rows})},
    }
    return summary


def run_config(name: str, items: list[tuple[Conversation, Prompt]], silence_ms: int, ears: Any, tools: bool = False, api_key: str | None = KEY) -> dict[str, Any]:
    with server_process(config(name, silence_ms, tools), startup_s=900) as url:
        rows, result = asyncio.run(score(url, items, ears, api_key))
    return {"summary": summarize(rows, result), "answers": rows}


def report(result: dict[str, Any]) -> None:
    for name, data in result["configs"].items():
        print(f"{name}:")
        for r in data["answers"]:
            misheard = "" if r.get("ears_right") else f" (heard {r.get('ears')!r})"
            print(f"  {'+' if r['correct'] else '-'} {r['prompt'][:40]:40} -> {r['heard'][:70]!r}{misheard}")
    print(f"\n{'config':12} {'correct':>8} {'factual':>8} {'1-2 sent.':>9} {'v2v p50':>8} {'v2v p90':>8} {'errors':>6} {'heard':>6} {'factual|heard':>13}")
    for name, data in result["configs"].items():
        s = data["summary"]
        v = s["voice_to_voice_ms"]
        print(f"{name:12} {s['correct']:>8} {s['correct_factual']:>8} {s['sentences_ok']:>9} {v.get('p50', '-'):>8} {v.get('p90', '-'):>8} {s['errors']:>6} {s['ears_right']:>6} {s['correct_factual_heard_right'] or '-':>13}")
        print(f"{'':12} by kind: {s['by_kind']}")


def rescore(path: str) -> dict[str, Any]:
    """A saved result scored again by today's rules (``correct``, ``heard_right``): runs from
    before a rule changed, compared with runs after it."""
    with open(path) as f:
        result = json.load(f)
    prompts = {p.text: p for p in [*PROMPTS, *(p for _, p in FOLLOW_UPS)]}
    for data in result["configs"].values():
        for r in data["answers"]:
            r.setdefault("calls", [])
            r["correct"] = correct(prompts[r["prompt"]], r["heard"], r["calls"])
            r["ears_right"] = heard_right(r["prompt"], r.get("ears"))
        errors = data["summary"]["errors"]
        data["summary"] = summarize(data["answers"], {"connection_errors": []})
        data["summary"]["errors"] = errors
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(VARIANTS), help=f"thinkers to compare: {', '.join(VARIANTS)} or config names (configs/NAME.yaml)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N prompts (and N/10 follow-ups)")
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--tools", action="store_true", help="offer bench.tools' five function tools in every session (only the arithmetic prompts may use one: the calculator)")
    parser.add_argument("--voice", choices=["espeak", "piper"], default="espeak", help="who says the prompts: espeak-ng (hard for Whisper), or Piper's joe (nearer a person)")
    parser.add_argument("--anonymous", action="store_true", help="sessions without an API key: each its own prefix-cache namespace")
    parser.add_argument("--rescore", metavar="RESULT", help="score a saved result (bench/results/answers-*.json) again by today's rules; nothing is run")
    args = parser.parse_args()
    if args.rescore:
        report(rescore(args.rescore))
        return
    from pipelines import models
    from pipelines.cascade.listener import WhisperListener

    ears = WhisperListener(str(models.ensure("whisper-base", print)), 2, 1)
    items = conversations(args.limit, piper_voice() if args.voice == "piper" else espeak_voice)
    result: dict[str, Any] = {"machine": machine(), "voice": args.voice, "silence_ms": args.silence_ms, "tools": args.tools, "anonymous": args.anonymous, "configs": {}}
    for name in args.configs:
        print(f"{name}: {len(items)} conversations ...", flush=True)
        result["configs"][name] = run_config(name, items, args.silence_ms, ears, args.tools, None if args.anonymous else KEY)
    report(result)
    print("saved", save("answers", result))


if __name__ == "__main__":
    main()
