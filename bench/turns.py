"""End-of-turn detection: server_vad 500 ms against semantic_vad at each eagerness, in one run.

Fixtures are made at run time (bench/turn_fixtures.py): complete utterances (questions,
statements, short answers such as "Yes." or "Paris.") and unfinished ones with a 400-900 ms
hesitation pause mid-sentence, in espeak-ng and Piper voices, with faint noise under them. Each
is streamed through the real session core (webrtcvad, the turn detector, the real end-of-turn
model in its worker thread) 20 ms at a time, as fast as it goes; positions are stream positions,
and a decision's own time (the model, and the transcript it waits for) is added to its commit.

Per mode:

* ``cut``: the share of unfinished utterances committed at their pause (before the speech resumed);
* ``split``: the share of complete ones committed before their end (at a pause inside them, such
  as a synthesizer's comma: "Okay, | sounds good.");
* ``delay``: for complete ones, end of speech to the commit that follows it (the silence waited,
  plus the decision's time for semantic_vad); a turn the model holds waits for the eagerness's
  longest wait;
* the model's CPU ms per decision, and its wall ms (with the transcript it waited for).

Modes: ``server_vad`` (500 ms); ``semantic_<eagerness>`` with the audio model alone (every
pipeline); ``semantic_<eagerness>+asr`` weighing the transcript the CPU cascade makes at each pause
(Whisper tiny.en, as configs/cpu.yaml runs it); ``semantic_auto_phone``: 8 kHz G.711 u-law audio.

Sets (``--set``): ``synthetic`` (the fixtures above), ``human`` (recordings that packages ship,
labelled by bench/human_turns.py: complete prompts and sentences, the same cut at a word with a
400-900 ms pause of their own noise floor, a telephone conversation's real turn ends), or ``all``.
Figures are reported per group: ``synthetic``, ``human`` (16 kHz and up) and ``phone`` (8 kHz or
telephone band, upsampled to 16 kHz as the SIP transport does); ``--limit N`` takes N per group
(half complete, half unfinished, every source in turn, seeded).

    python -m bench.turns [--set synthetic|human|all] [--limit N] [--no-piper] [--modes ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import numpy as np

from bench.common import machine, save
from bench.metrics import dist
from bench.turn_fixtures import RATE, Fixture, fixtures
from dsp.g711 import pcm_to_ulaw, ulaw_to_pcm
from dsp.resample import resample
from pipelines.base import Capabilities, OutputChunk, Pipeline, PipelineSession, ResponseRequest, TurnModel, TurnVerdict
from realtime_omni.config import Limits
from realtime_omni.metrics import Metrics
from realtime_omni.protocol import events as ev
from realtime_omni.session import Session
from realtime_omni.session.config import SessionConfig

LEAD_MS = 600
TAIL_MS = 8600  # past the longest wait (low: 8 s)
FRAME = RATE // 50
MODES = [
    "server_vad",
    "semantic_low",
    "semantic_auto",
    "semantic_high",
    "semantic_low+asr",
    "semantic_auto+asr",
    "semantic_high+asr",
    "semantic_auto_phone",
]


class Listening(Pipeline):
    """Listens only: at each pause, optionally, the turn so far is transcribed as the CPU cascade
    does for its speculation (and offered to the end-of-turn model)."""

    capabilities = Capabilities(name="bench-turns", input_rate=RATE)

    def __init__(self, listener: Any = None) -> None:
        self.listener = listener
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="asr")

    def open(self, session_id: str) -> PipelineSession:
        return _Listening(self)


class _Listening(PipelineSession):
    def __init__(self, pipeline: Listening) -> None:
        self.pipeline = pipeline
        self.turn: list[np.ndarray] = []
        self.transcript: asyncio.Future[str] | None = None

    def feed(self, pcm: np.ndarray) -> None:
        self.turn.append(pcm)

    def pause(self, request: ResponseRequest | None) -> None:
        if self.pipeline.listener is not None and self.turn:
            audio = np.concatenate(self.turn)
            self.transcript = asyncio.get_running_loop().run_in_executor(self.pipeline.pool, self.pipeline.listener.transcribe, audio)

    def resume(self) -> None:
        self.transcript = None

    def commit(self, item_id: str) -> None:
        self.turn, self.transcript = [], None

    def clear(self) -> None:
        self.turn, self.transcript = [], None

    async def partial_transcript(self) -> str | None:
        return None if self.transcript is None else await asyncio.shield(self.transcript)

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        return
        yield


class Timed(TurnModel):
    """The model, with each decision's wall time (from the pause to the verdict) and CPU time."""

    def __init__(self, model: TurnModel) -> None:
        self.model = model
        self.name = model.name
        self.decisions: list[dict[str, Any]] = []

    async def judge(self, pcm: np.ndarray, rate: int, transcript: Awaitable[str | None] | None = None) -> TurnVerdict:
        t0 = time.perf_counter()
        verdict = await self.model.judge(pcm, rate, transcript)
        wall = (time.perf_counter() - t0) * 1000
        self.decisions.append({"wall_ms": wall, "cpu_ms": verdict.cpu_ms, "p": verdict.probability, "text": verdict.transcript})
        return verdict


def session_config(mode: str) -> ev.SessionObject:
    if mode == "server_vad":
        td: dict[str, Any] = {"type": "server_vad", "silence_duration_ms": 500, "create_response": False}
    else:
        eagerness = mode.split("_")[1].split("+")[0]
        td = {"type": "semantic_vad", "eagerness": eagerness, "create_response": False}
    return msgspec.convert({"type": "realtime", "audio": {"input": {"turn_detection": td}}}, ev.SessionObject)


async def replay(fixture: Fixture, mode: str, pipeline: Listening, model: Timed, noise: np.ndarray) -> dict[str, Any]:
    speech = fixture.pcm
    if mode.endswith("_phone"):
        speech = resample(ulaw_to_pcm(pcm_to_ulaw(resample(speech, RATE, 8000))), 8000, RATE)
        speech = speech[: len(fixture.pcm)]
    lead = LEAD_MS * RATE // 1000
    audio = np.concatenate([np.zeros(lead, np.int16), speech, np.zeros(TAIL_MS * RATE // 1000, np.int16)])
    audio = np.clip(audio.astype(np.int32) + np.resize(noise, len(audio)), -32768, 32767).astype(np.int16)
    caps = pipeline.capabilities
    config = SessionConfig.default(caps, "bench").updated(session_config(mode), caps)
    session = Session(pipeline, config, Limits(pause_ms=150), Metrics(), turn_model=None if mode == "server_vad" else model)
    await session.start()
    first_decision = len(model.decisions)
    end = lead + (len(speech) if fixture.end is None else fixture.end)  # a recording's own silence follows its speech
    commits: list[tuple[int, int]] = []  # (stream position, decisions made by then)
    pushed = 0
    try:
        for i in range(0, len(audio), FRAME):
            await session.push_audio(audio[i : i + FRAME])
            pushed += len(audio[i : i + FRAME])
            while len(session.outbox):
                event = await session.outbox.get()
                if event.__struct_config__.tag == "input_audio_buffer.committed":
                    commits.append((pushed, len(model.decisions)))
            if commits and commits[-1][0] >= end:
                break
    finally:
        await session.close()
    out: dict[str, Any] = {
        "kind": fixture.kind,
        "group": fixture.group,
        "source": fixture.source,
        "text": fixture.text,
        "voice": fixture.voice,
        "decisions": model.decisions[first_decision:],
    }
    if fixture.kind == "unfinished":
        assert fixture.pause is not None
        out["cut"] = any(pos <= lead + fixture.pause[1] for pos, _ in commits)
    else:
        out["split"] = any(pos < end for pos, _ in commits)
    after = [(pos, made) for pos, made in commits if pos >= end]
    if after:
        pos, made = after[0]
        decision_ms = model.decisions[made - 1]["wall_ms"] if mode != "server_vad" and made > first_decision else 0.0
        out["delay_ms"] = (pos - end) * 1000 / RATE + decision_ms
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    complete = [r for r in rows if r["kind"] == "complete"]
    unfinished = [r for r in rows if r["kind"] == "unfinished"]
    decisions = [d for r in rows for d in r["decisions"]]
    return {
        "complete": len(complete),
        "unfinished": len(unfinished),
        "cut_share": round(sum(r["cut"] for r in unfinished) / max(1, len(unfinished)), 3),
        "split_share": round(sum(r["split"] for r in complete) / max(1, len(complete)), 3),
        "delay_ms": dist([r["delay_ms"] for r in complete if "delay_ms" in r], 1),
        "complete_within_400ms": round(sum(r.get("delay_ms", 1e9) <= 400 for r in complete) / max(1, len(complete)), 3),
        "decision_cpu_ms": dist([d["cpu_ms"] for d in decisions], 1),
        "decision_wall_ms": dist([d["wall_ms"] for d in decisions], 1),
    }


def take(made: list[Fixture], limit: int | None, seed: int) -> list[Fixture]:
    """Up to ``limit`` fixtures per group: half complete, half unfinished, each half drawing from
    every source in turn (seeded), so that a few conversation items are not lost among hundreds of prompts."""
    if limit is None:
        return made
    out = []
    rng = np.random.default_rng(seed)
    for group in dict.fromkeys(f.group for f in made):
        for kind, share in (("complete", (limit + 1) // 2), ("unfinished", limit // 2)):
            by_source: dict[str, list[Fixture]] = {}
            for f in made:
                if f.group == group and f.kind == kind:
                    by_source.setdefault(f.source, []).append(f)
            queues = [[pool[i] for i in rng.permutation(len(pool))] for pool in by_source.values()]
            picked = [f for f in itertools.chain.from_iterable(itertools.zip_longest(*queues)) if f is not None]
            out += picked[:share]
    return out


def load_set(name: str, piper: bool, seed: int, limit: int | None) -> list[Fixture]:
    made: list[Fixture] = []
    if name in ("synthetic", "all"):
        made += fixtures(piper=piper, seed=seed)
    if name in ("human", "all"):
        from bench import human_turns

        made += human_turns.load(seed)
    return take(made, limit, seed)


def report_line(label: str, summary: dict[str, Any]) -> str:
    s = summary
    return (
        f"{label:32} {s['complete']:>4} {s['unfinished']:>4} {s['cut_share']:>5.0%} {s['split_share']:>5.0%} {s['delay_ms'].get('p50', '-'):>9} {s['delay_ms'].get('p90', '-'):>7}"
        f" {s['complete_within_400ms']:>8.0%} {s['decision_cpu_ms'].get('p50', '-'):>8} {s['decision_cpu_ms'].get('p90', '-'):>8}"
        f" {s['decision_wall_ms'].get('p50', '-'):>9}"
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines import models
    from pipelines.smart_turn import SmartTurn

    model = Timed(SmartTurn(threads=1))
    model.model.load()
    listener = None
    if any(m.endswith("+asr") for m in args.modes):
        from pipelines.listener import WhisperListener

        listener = WhisperListener(str(models.path("whisper-tiny.en")), 2, 1, window="fit")
        listener.transcribe(np.zeros(RATE, np.int16))
    t0 = time.monotonic()
    made = load_set(args.set, not args.no_piper, args.seed, args.limit)
    groups = [g for g in ("synthetic", "human", "phone") if any(f.group == g for f in made)]
    sizes = {g: {k: sum(f.group == g and f.kind == k for f in made) for k in ("complete", "unfinished")} for g in groups}
    print(f"{len(made)} fixtures {sizes} ready in {time.monotonic() - t0:.0f} s", flush=True)
    noise = (np.random.default_rng(args.seed).standard_normal(RATE * 20) * 20).astype(np.int32)  # about -64 dBFS
    result: dict[str, Any] = {"machine": machine(), "set": args.set, "limit": args.limit, "fixtures": sizes, "modes": {}}
    for mode in args.modes:
        pipeline = Listening(listener if mode.endswith("+asr") else None)
        rows = [await replay(f, mode, pipeline, model, noise) for f in made]
        by_group = {g: summarize([r for r in rows if r["group"] == g]) for g in groups}
        result["modes"][mode] = {"groups": by_group, "rows": rows}
        for g, summary in by_group.items():
            d = summary["delay_ms"]
            print(
                f"{mode:22} {g:9} cut {summary['cut_share']:.0%}  split {summary['split_share']:.0%}  delay p50 {d.get('p50')} p90 {d.get('p90')} ms"
                f"  cpu/decision p50 {summary['decision_cpu_ms'].get('p50')} ms",
                flush=True,
            )
    result["machine_after"] = machine()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    parser.add_argument("--no-piper", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", choices=["synthetic", "human", "all"], default="all", help="human: recordings from packages (bench/human_turns.py)")
    parser.add_argument("--limit", type=int, default=None, help="at most N fixtures per group (synthetic, human, phone)")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(f"\n{'mode / group':32} {'comp':>4} {'unf':>4} {'cut':>5} {'split':>5} {'delay p50':>9} {'p90':>7} {'<=400ms':>8} {'cpu p50':>8} {'cpu p90':>8} {'wall p50':>9}")
    for mode, data in result["modes"].items():
        for group, summary in data["groups"].items():
            print(report_line(f"{mode} / {group}", summary))
    print("(cut: unfinished utterances committed at their pause; split: complete ones committed before their end;")
    print(" delay: end of speech to the next commit, complete utterances; cpu/wall: per decision of the model)")
    print("saved", save("turns", result))


if __name__ == "__main__":
    main()
