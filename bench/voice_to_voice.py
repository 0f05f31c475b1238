"""Voice-to-voice latency of the embedded CPU cascade, one session, a multi-turn spoken conversation.

One user (the replay harness, ``bench/replay.py``) asks 20 spoken questions (espeak-ng) in real
time, 20 ms per append on a steady clock, silence in between as a live microphone would send.
Voice-to-voice is measured from the end of the user's speech *in the input audio* to the first
``response.output_audio.delta`` at the client. With ``server_vad`` at 500 ms of silence, about
500 ms of that is the end-of-turn wait itself.

Per turn it also reads the server's own stage timings from ``response.done`` (ms from the response
trigger, negative when done speculatively before the turn ended): ASR done, thinker first token,
first clause, first audio. Variants (ablations) run one after another, each on a fresh server;
without ``--variants`` all of them run, ``remote_thinker`` with a ``vllm serve`` of its own:

    default            everything on
    no_speculation     incremental prefill off (ASR and thinker start only after the turn ends)
    words_ahead        the words the ears settle on while the user speaks given to the thinker's
                       streamed request before the pause (off by default: measured slower)
    no_prefix_cache    vLLM prefix caching off (every turn prefills the whole history)
    no_async_chunk     the whole answer is written, then synthesised, then sent
    remote_thinker     the thinker on a shared ``vllm serve`` of the same model (thinker.engine:
                       remote), started for the run on the same machine: what the HTTP hop costs
    semantic_vad       everything on, the turn ended by semantic_vad (eagerness auto: at each
                       pause Smart Turn's score of the sound, the thinker's judgement of the
                       cascade's transcript and the silence, weighed together) instead of
                       server_vad's fixed silence
    semantic_vad_listener  the same, the words judged by the listener itself (``turn_end.judge: listener``:
                       the listener's own probability of an end, from the same pass)
    whisper            the ears before Moonshine: Whisper tiny.en, the turn heard at its pauses only
                       (``hear_every_ms: 0``)
    whisper_semantic_vad  the same, with semantic_vad
    greedy_ears        Moonshine decoded greedily (``asr_beam_size: 1``), without its beam where it
                       is unsure (the ears before 2026-11-29)
    larger_thinker     the thinker of configs/cpu-1.5b.yaml (Qwen2.5-Coder-1.5B-Instruct, int8), the
                       rest as the default (``./scripts/install larger-thinker`` first)
    larger_thinker_words_ahead  the same, the words heard as the user speaks given to it before
                       the pause (its prefill is three times the 0.5B's: the words ahead may pay there)

    python -m bench.voice_to_voice --turns 20 [--variants default no_speculation ...] [--isa avx2] [--config cpu-smollm2]
    python -m bench.voice_to_voice --dataset builtin --variants default semantic_vad

Besides voice-to-voice it reports the stalls a listener hears: in how many turns the answer's audio
fell behind playback by more than 100 ms after its first chunk (``bench.metrics``: each delta
against the playback clock the first one started), and the longest such gap. ``--isa avx2`` runs the
server as on a CPU without AVX-512 (``bench/isa.py``); the CPU and its flags are in every result.

``--dataset builtin`` replays the replay harness's built-in conversations (bench/dataset.py: 6
conversations of 4 turns, espeak-ng voices and Piper) instead of the 20 questions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from bench import dataset, replay
from bench.audio import espeak
from bench.common import machine, save, vllm_serve
from bench.dataset import RATE, Conversation, Turn
from bench.isa import environment
from bench.metrics import dist
from realtime_omni import config as config_file

QUESTIONS = [
    "Hi there, how are you today?",
    "What is the capital of France?",
    "What is it famous for?",
    "Can you recommend a good book?",
    "What should I cook for dinner tonight?",
    "How far away is the moon?",
    "What is your favourite colour?",
    "Tell me a fun fact about cats.",
    "What is the weather like in spring?",
    "Thank you, that was helpful.",
]

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no_speculation": {"speculate": False},
    "words_ahead": {"words_ahead": True},  # the words heard as the user speaks given to the thinker before the pause (measured slower, 2026-11-29)
    "no_prefix_cache": {"thinker": {"prefix_caching": False}},
    "no_async_chunk": {"async_chunk": False},
    "remote_thinker": {"thinker": {"engine": "remote", "served_model": "smollm2"}},
    "semantic_vad": {},
    "semantic_vad_listener": {},
    "whisper": {"asr_model": "whisper-tiny.en", "hear_every_ms": 0},
    "whisper_semantic_vad": {"asr_model": "whisper-tiny.en", "hear_every_ms": 0},
    "greedy_ears": {"asr_beam_size": 1},
    "larger_thinker": {"thinker": {"model": "qwen2.5-coder-1.5b-instruct-w8"}},
    "larger_thinker_words_ahead": {"thinker": {"model": "qwen2.5-coder-1.5b-instruct-w8"}, "words_ahead": True},
}
TURN_END: dict[str, dict[str, Any]] = {"semantic_vad_listener": {"judge": "listener"}}  # the config's turn_end, per variant
TURN_DETECTION = {v: {"type": "semantic_vad", "eagerness": "auto"} for v in ("semantic_vad", "semantic_vad_listener", "whisper_semantic_vad")}
STAGES = ("asr", "thinker_first_token", "first_clause", "first_audio")


def config(variant: str, silence_ms: int, base: str = "cpu") -> dict[str, Any]:
    cfg = config_file.raw(base)
    opts = cfg["pipeline"]["options"]
    for key, value in VARIANTS[variant].items():
        if isinstance(value, dict):
            opts[key].update(value)
        else:
            opts[key] = value
    if variant in TURN_END:
        cfg.setdefault("turn_end", {}).update(TURN_END[variant])
    td = TURN_DETECTION.get(variant, {"type": "server_vad", "silence_duration_ms": silence_ms})
    cfg["session"].setdefault("audio", {}).setdefault("input", {})["turn_detection"] = td
    return cfg


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [t for t in turns if t["voice_to_voice_ms"] is not None]
    summary: dict[str, Any] = {
        "turns": len(turns),
        "voice_to_voice_ms": dist([t["voice_to_voice_ms"] for t in ok]),
        "voice_to_voice_audible_ms": dist([t["voice_to_voice_audible_ms"] for t in ok if t.get("voice_to_voice_audible_ms") is not None]),
        "turn_end_detected_ms": dist([t["turn_end_detected_ms"] for t in ok if t["turn_end_detected_ms"] is not None]),
        "errors": sum(len(t["errors"]) for t in turns),
        "cached_fraction": round(sum(t["cached_tokens"] or 0 for t in ok) / max(1, sum(t["input_tokens"] or 0 for t in ok)), 3),
        # a stall: the answer's audio more than 100 ms behind playback after its first chunk
        "turns_with_stalls": sum(1 for t in ok if t["gaps_over_100ms"]),
        "max_gap_ms": max((t["max_gap_ms"] for t in ok), default=0.0),
    }
    for stage in STAGES:
        summary[f"{stage}_ms"] = dist([t["server_timings_ms"][stage] for t in ok if stage in t["server_timings_ms"]])
    # the ears' own stage: from the pause the answer was started at to its words
    summary["ears_at_pause_ms"] = dist([t["server_timings_ms"]["asr"] - t["server_timings_ms"]["pause"] for t in ok if {"asr", "pause"} <= t["server_timings_ms"].keys()])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--dataset", default="questions", choices=["questions", "builtin"])
    parser.add_argument("--config", default="cpu", help="the server config the variants start from (default cpu)")
    parser.add_argument("--isa", default="native", choices=["native", "avx2"], help="avx2: as on a CPU without AVX-512 (bench/isa.py)")
    args = parser.parse_args()
    os.environ.update(environment(args.isa))
    if args.dataset == "builtin":
        conversations = dataset.builtin()
    else:
        questions = [QUESTIONS[k % len(QUESTIONS)] for k in range(args.turns)]
        conversations = [Conversation("voice-to-voice", [Turn(q, espeak(q, RATE)) for q in questions])]
    turns_total = sum(len(c.turns) for c in conversations)
    result: dict[str, Any] = {"machine": machine(), "config": args.config, "dataset": args.dataset, "turns": turns_total, "silence_ms": args.silence_ms, "variants": {}}
    for variant in args.variants:
        print(f"{variant}: starting the server ...", flush=True)
        cfg = config(variant, args.silence_ms, args.config)
        with contextlib.ExitStack() as stack:
            if variant == "remote_thinker":
                url = stack.enter_context(vllm_serve(cfg["pipeline"]["options"]["thinker"].get("model", "smollm2-135m-instruct")))
                cfg["pipeline"]["options"]["thinker"]["remote"] = {"url": url}
            run = replay.replay_into(cfg, conversations)
        turns = run["turns"]
        for t in turns:
            print(f"  {t.get('conversation', '')} turn {t['turn']:2d}: v2v {t['voice_to_voice_ms']} ms, longest gap {t['max_gap_ms']} ms, cached {t['cached_tokens']}/{t['input_tokens']}: {(t['answer'] or '')[:60]!r}")
        summary = summarize(turns)
        summary["errors"] += len(run["connection_errors"])
        result["variants"][variant] = {"summary": summary, "self_check": run.get("self_check"), "turns": turns, "machine_after": machine()}
        v = summary["voice_to_voice_ms"]
        print(f"{variant}: voice-to-voice p50 {v.get('p50')} ms, p90 {v.get('p90')} ms, stalls in {summary['turns_with_stalls']}/{summary['turns']} turns, errors {summary['errors']}", flush=True)
        check = run.get("self_check")
        if check:
            print(f"{variant}: the server's self-check: thinker {check['thinker_tokens_per_s']} tokens/s, talker RTF {check['talker_rtf']}, load {check['load']} (keeps up: {check['keeps_up']})", flush=True)
    print(f"\n{result['machine']['cpu']} ({', '.join(result['machine']['flags'])}), run as {result['machine']['ran_as']}")
    print(f"\n{'variant':16} {'v2v p50':>8} {'v2v p90':>8} {'heard':>8} {'end-det':>8} {'asr':>7} {'ttft':>7} {'clause':>7} {'audio':>7} {'cached':>7} {'stalls':>7} {'ears@pause':>10}")
    for variant, data in result["variants"].items():
        s = data["summary"]
        cells = [s["voice_to_voice_ms"].get("p50"), s["voice_to_voice_ms"].get("p90"), s["voice_to_voice_audible_ms"].get("p50"), s["turn_end_detected_ms"].get("p50")]
        cells += [s[f"{k}_ms"].get("p50") for k in STAGES]
        ears = s["ears_at_pause_ms"].get("p50")
        print(f"{variant:16} " + " ".join(f"{c if c is not None else '-':>{8 if i < 4 else 7}}" for i, c in enumerate(cells)) + f" {s['cached_fraction']:>7} {s['turns_with_stalls']:>3}/{s['turns']} {ears if ears is not None else '-':>10}")
    print("(ms, medians; heard: to the answer's first audible sample, its lead-in counted; stage times from the response trigger, negative = done before the turn ended; ears@pause: from the pause the answer was started at to its words)")
    print("saved", save("voice_to_voice", result))


if __name__ == "__main__":
    main()
