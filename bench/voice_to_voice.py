"""Voice-to-voice latency of the embedded CPU cascade, one session, a multi-turn spoken conversation.

Each turn streams a spoken question (espeak-ng) in real time, 20 ms per append on a steady clock,
then keeps streaming silence as a live microphone would. Voice-to-voice is measured from the end of
the user's speech *in the input audio* (when its last speech sample had been sent) to the first
``response.output_audio.delta`` at the client. With ``server_vad`` at 500 ms of silence, 500 ms
of that is the end-of-turn wait itself.

Per turn it also reads the server's own stage timings (the timings log; ms from the response
trigger, negative when done speculatively before the turn ended): ASR done, thinker first token,
first clause, first audio. Variants (ablations) run one after another, each on a fresh server:

    default            everything on
    no_speculation     incremental prefill off (ASR and thinker start only after the turn ends)
    no_prefix_cache    vLLM prefix caching off (every turn prefills the whole history)
    no_async_chunk     the whole answer is written, then synthesised, then sent

    python -m bench.voice_to_voice --turns 20 [--variants default no_speculation ...]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import websockets
import yaml

from bench.audio import espeak
from bench.common import dist, machine, save, server_process
from bench.replay import Mic, WebSocketTransport

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
    "no_prefix_cache": {"thinker": {"prefix_caching": False}},
    "no_async_chunk": {"async_chunk": False},
}

RATE = 24000


def config(variant: str, silence_ms: int, timings: Path) -> dict[str, Any]:
    base = yaml.safe_load((Path(__file__).parent.parent / "configs" / "cpu.yaml").read_text())
    cfg = copy.deepcopy(base)
    opts = cfg["pipeline"]["options"]
    for key, value in VARIANTS[variant].items():
        if isinstance(value, dict):
            opts[key].update(value)
        else:
            opts[key] = value
    cfg["session"].setdefault("audio", {}).setdefault("input", {})["turn_detection"] = {"type": "server_vad", "silence_duration_ms": silence_ms}
    cfg["timings_log"] = str(timings)
    return cfg


async def conversation(url: str, turns: int, gap_s: float, log: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    clips = [np.concatenate([np.zeros(RATE // 5, np.int16), espeak(q, RATE)]) for q in QUESTIONS]
    async with websockets.connect(f"{url}/realtime?model=bench", max_size=None) as ws:
        while json.loads(await ws.recv())["type"] != "conversation.created":
            pass
        mic = Mic(WebSocketTransport(ws))
        mic_task = asyncio.create_task(mic.run())
        try:
            for turn in range(turns):
                question = QUESTIONS[turn % len(QUESTIONS)]
                _, last = mic.play(clips[turn % len(clips)])
                row: dict[str, Any] = {"turn": turn, "question": question}
                first_audio = None
                while True:
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    kind = msg["type"]
                    now = time.perf_counter()
                    if kind == "input_audio_buffer.speech_stopped":
                        row["turn_end_detected_ms"] = round((now - mic.time_of(last)) * 1000, 1)
                    elif kind == "response.output_audio.delta" and first_audio is None:
                        first_audio = now
                        row["voice_to_voice_ms"] = round((now - mic.time_of(last)) * 1000, 1)
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        row["heard"] = msg["transcript"]
                    elif kind == "response.output_audio_transcript.done":
                        row["answer"] = msg["transcript"]
                    elif kind == "error":
                        row.setdefault("errors", []).append(msg["error"]["message"])
                    elif kind == "response.done":
                        r = msg["response"]
                        row["response_id"] = r["id"]
                        row["status"] = r["status"]
                        u = r.get("usage") or {}
                        row["input_tokens"] = u.get("input_tokens")
                        row["cached_tokens"] = (u.get("input_token_details") or {}).get("cached_tokens")
                        break
                out.append(row)
                print(f"  turn {turn:2d}: v2v {row.get('voice_to_voice_ms')} ms, cached {row.get('cached_tokens')}/{row.get('input_tokens')}: {row.get('answer', '')[:60]!r}", flush=True)
                await asyncio.sleep(gap_s)
        finally:
            mic_task.cancel()
    # the server's stage timings, by response
    records = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        rec = json.loads(line)
        records[rec["response_id"]] = rec
    for row in out:
        rec = records.get(row.get("response_id", ""))
        if rec:
            row["stages_ms"] = rec["stages"]
            row["speculated"] = rec.get("speculated", False)
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "voice_to_voice_ms" in r]
    summary: dict[str, Any] = {
        "turns": len(rows),
        "voice_to_voice_ms": dist([r["voice_to_voice_ms"] for r in ok]),
        "turn_end_detected_ms": dist([r["turn_end_detected_ms"] for r in ok if "turn_end_detected_ms" in r]),
        "errors": sum(len(r.get("errors", [])) for r in rows),
        "speculated": sum(1 for r in ok if r.get("speculated")),
        "cached_fraction": round(
            sum(r.get("cached_tokens") or 0 for r in ok) / max(1, sum(r.get("input_tokens") or 0 for r in ok)), 3
        ),
    }
    for stage in ("asr", "thinker_first_token", "first_clause", "first_audio"):
        values = [r["stages_ms"][stage] for r in ok if stage in r.get("stages_ms", {})]
        summary[f"{stage}_ms"] = dist(values)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--silence-ms", type=int, default=500)
    parser.add_argument("--gap-s", type=float, default=1.0, help="pause between an answer and the next question")
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": machine(), "turns": args.turns, "silence_ms": args.silence_ms, "variants": {}}
    for variant in args.variants:
        print(f"{variant}: starting the server ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "timings.jsonl"
            with server_process(config(variant, args.silence_ms, log), startup_s=900) as url:
                rows = asyncio.run(conversation(url, args.turns, args.gap_s, log))
        summary = summarize(rows)
        result["variants"][variant] = {"summary": summary, "turns": rows}
        v = summary["voice_to_voice_ms"]
        print(f"{variant}: voice-to-voice p50 {v.get('p50')} ms, p90 {v.get('p90')} ms", flush=True)
    print()
    header = f"{'variant':16} {'v2v p50':>8} {'v2v p90':>8} {'end-det':>8} {'asr':>7} {'ttft':>7} {'clause':>7} {'audio':>7} {'cached':>7}"
    print(header)
    for variant, data in result["variants"].items():
        s = data["summary"]
        cells = [s["voice_to_voice_ms"].get("p50"), s["voice_to_voice_ms"].get("p90"), s["turn_end_detected_ms"].get("p50")]
        cells += [s[f"{k}_ms"].get("p50") for k in ("asr", "thinker_first_token", "first_clause", "first_audio")]
        print(f"{variant:16} " + " ".join(f"{c if c is not None else '-':>8}" if i < 3 else f"{c if c is not None else '-':>7}" for i, c in enumerate(cells)) + f" {s['cached_fraction']:>7}")
    print("(ms, medians; stage times from the response trigger, negative = done before the turn ended)")
    print("saved", save("voice_to_voice", result))


if __name__ == "__main__":
    main()
