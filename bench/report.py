"""What a replay writes: ``summary.json``, ``turns.jsonl``, a table in the style of ``vllm bench
serve``, PNG plots (latency CDFs; the timeline of one conversation), and side-by-side comparisons.
The figures themselves come from ``bench/metrics.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .metrics import DISTRIBUTIONS, playback_schedule


def table(summary: dict[str, Any]) -> str:
    lines = ["{:=^60}".format(" Realtime Replay Result ")]

    def row(label: str, value: Any) -> None:
        lines.append(f"{label:<42}{value:>18}")

    row("Server:", summary.get("url", ""))
    row("Conversations:", summary.get("conversations", ""))
    row("Concurrency / rate:", summary.get("load", ""))
    row("Turns:", summary["turns"])
    row("Completed / cancelled responses:", f"{summary['completed']} / {summary['cancelled']}")
    row("Errors:", summary["errors"])
    row("Duration (s):", summary["wall_s"])
    for key, title, unit in DISTRIBUTIONS:
        d = summary.get(key)
        lines.append("{:-^60}".format(f" {title} "))
        if not d:
            row("(no samples)", "")
            continue
        u = f" ({unit})" if unit else ""
        for stat, name in (("mean", "Mean"), ("p50", "Median"), ("p90", "P90"), ("p99", "P99")):
            row(f"{name} {key.removesuffix('_ms')}{u}:", f"{d[stat]:.2f}")
    g = summary["gaps_over_100ms"]
    lines.append("{:-^60}".format(" Audio continuity "))
    row("Gaps over 100 ms (total):", g["total"])
    row("Turns with a gap:", g["turns_with_gaps"])
    if summary.get("server_timings_ms"):
        lines.append("{:-^60}".format(" Server stage timings, median (ms) "))
        for stage, d in summary["server_timings_ms"].items():
            row(f"{stage}:", f"{d['p50']:.1f}" if d else "")
    lines.append("=" * 60)
    return "\n".join(lines)


def write(out: Path, result: dict[str, Any], summary: dict[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "turns.jsonl", "w") as f:
        for t in result["turns"]:
            f.write(json.dumps(t) + "\n")
    return [out / "summary.json", out / "turns.jsonl", *plots(out, result["turns"])]


# ------------------------------------------------------------------------------ plots


def plots(out: Path, turns: list[dict[str, Any]]) -> list[Path]:
    """latency_cdf.png and timeline.png (the first conversation). Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, title, _ in DISTRIBUTIONS:
        if not key.endswith("_ms"):
            continue
        values = np.sort([t[key] for t in turns if t[key] is not None])
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", label=f"{title} (n={len(values)})")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of turns")
    ax.set_title("Latency CDFs")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    save(fig, "latency_cdf.png")

    first = [t for t in turns if t["conversation"] == turns[0]["conversation"]] if turns else []
    if first:
        fig, ax = plt.subplots(figsize=(10, 0.9 * len(first) + 1.5))
        for i, t in enumerate(first):
            y = len(first) - 1 - i
            tl = t["timeline"]
            ax.barh(y + 0.2, tl["speech_end"] - tl["onset"], left=tl["onset"], height=0.3, color="tab:blue", label="user speech" if i == 0 else None)
            if "turn_end" in tl:
                ax.plot([tl["speech_end"], tl["turn_end"]], [y + 0.2] * 2, color="tab:gray", lw=2, label="end-of-turn wait" if i == 0 else None)
                base = tl["turn_end"]
                for j, (stage, ms) in enumerate(sorted(t["server_timings_ms"].items(), key=lambda kv: kv[1])):
                    x = base + ms / 1000
                    ax.plot([x], [y - 0.05], marker="|", ms=12, color=f"C{3 + j % 6}", label=stage if i == 0 else None)
            for j, (start, seconds) in enumerate(playback_schedule(t["playback"])):
                ax.barh(y - 0.2, seconds, left=start, height=0.3, color="tab:green", label="answer playing" if i == 0 and j == 0 else None)
        ax.set_yticks(range(len(first)))
        ax.set_yticklabels([f"turn {t['turn']}" + (" (barge-in)" if t["barge_in"] else "") for t in reversed(first)])
        ax.set_xlabel("seconds from the start of the conversation")
        ax.set_title(f"Timeline: {first[0]['conversation']} (ticks: server stages)")
        ax.legend(loc="upper right", fontsize=7, ncol=2)
        ax.grid(axis="x", alpha=0.3)
        save(fig, "timeline.png")
    return written


# ------------------------------------------------------------------------------ compare


def compare(a_path: Path, b_path: Path) -> str:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    lines = [f"{'metric':<30}{'stat':>6}{'A':>12}{'B':>12}{'B/A':>8}", "-" * 68]
    for key, _, _ in DISTRIBUTIONS:
        da, db = a.get(key), b.get(key)
        if not da and not db:
            continue
        for stat in ("mean", "p50", "p90", "p99"):
            va = da.get(stat) if da else None
            vb = db.get(stat) if db else None
            ratio = f"{vb / va:.2f}" if va and vb is not None else "-"
            fa = f"{va:.2f}" if va is not None else "-"
            fb = f"{vb:.2f}" if vb is not None else "-"
            lines.append(f"{key:<30}{stat:>6}{fa:>12}{fb:>12}{ratio:>8}")
    for key in ("turns", "errors"):
        va, vb = a.get(key), b.get(key)
        lines.append(f"{key:<30}{'':>6}{va!s:>12}{vb!s:>12}{(f'{vb / va:.2f}' if va else '-'):>8}")
    ga, gb = a.get("gaps_over_100ms", {}).get("total"), b.get("gaps_over_100ms", {}).get("total")
    lines.append(f"{'gaps_over_100ms':<30}{'total':>6}{ga!s:>12}{gb!s:>12}{(f'{gb / ga:.2f}' if ga else '-'):>8}")
    return "\n".join(lines)
