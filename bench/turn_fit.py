"""Fit semantic_vad's fusion weights (pipelines/turn_end/fusion.py) on the decisions a ``bench.turns``
run recorded, and say what they would do on the fixtures they were not fitted on.

Each decision of a ``+listener`` or ``+thinker`` mode keeps its inputs (Smart Turn's probability, the
listener's or the thinker's judgement of the words, the words), where it was made, and its fixture's labels (where the speech ended, where
an unfinished utterance's pause lay). For a set of weights every decision names the further silence
after which it would end the turn (the product's own ``Fusion.odds`` and wait, pipelines/turn_end/fusion.py, at threshold 0.5, the ``auto``/medium
eagerness's; no flag changes it); replaying that
against the labels gives, offline:

* ``cut``: unfinished utterances whose turn would end before the speech after their pause resumes;
* ``split``: complete ones whose turn would end at a pause inside them (that pause's length is taken
  as the time to the next decision less 260 ms, the least it can be: an upper bound, so splits are
  over-counted rather than missed);
* ``delay``: for complete ones, end of speech to the commit (the check's silence, the wait, and the
  decision's own measured time, or ``--wall-ms``), capped by the eagerness's longest wait (4 s at ``auto``).

The weights are searched on a grid of the logistic form (bias, audio, words, silence per second):
the smallest mean delay with cut and split at most ``--max-cut``/``--max-split`` on the fitting
half (every other fixture by a hash of its text, so both voices of a sentence fall on one side).
Figures are then given for both halves; ``bench.turns --weights RESULT`` replays the fixtures with
the weights through the real session for the figures that count.

    python -m bench turn_fit bench/results/turns-....json [--mode semantic_auto+listener]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
from typing import Any

import numpy as np

from bench.common import save
from bench.metrics import dist
from bench.turn_fixtures import RATE
from bench.turns import fusion_for, judge_of
from pipelines.base import Heard
from pipelines.turn_end.fusion import Evidence, Fusion, Weights, silence_to
from pipelines.turn_end.policy import TurnEndConfig

CHECK_S = TurnEndConfig().check_ms / 1000  # the silence at which the policy decides
MIN_RESUME_S = CHECK_S + 0.06  # a pause's check and the least speech that starts a turn (60 ms)


class Decisions:
    """The decisions of one set of rows as arrays, with what each one's commit would mean."""

    def __init__(self, rows: list[dict[str, Any]], longest_wait_s: float, wall_ms: float | None = None, judge: str = "listener") -> None:
        self.judge = judge  # whose judgement the decisions weighed: the weights fitted are the fusion's for it
        evidence: list[Evidence] = []
        room, kind, delay0, row_of = [], [], [], []
        self.rows = rows
        for r, row in enumerate(rows):
            ds = [d for d in row["decisions"] if d.get("audio_p") is not None]
            for i, d in enumerate(ds):
                at = d["at"]
                if row["kind"] == "complete" and at >= row["end"]:
                    k, space = "final", longest_wait_s
                elif row["kind"] == "unfinished" and row["pause"] and at <= row["pause"][1] and (i + 1 == len(ds) or ds[i + 1]["at"] > row["pause"][1]):
                    k, space = "cut", (row["pause"][1] - at) / RATE  # the labelled pause: silence until the speech resumes
                else:
                    nxt = ds[i + 1]["at"] if i + 1 < len(ds) else row["end"]
                    k, space = ("split" if row["kind"] == "complete" else "cut"), max(0.0, (nxt - at) / RATE - MIN_RESUME_S)
                # what the policy weighed: the sound, and the words as the pipeline heard them, judged
                # by ``judge`` (the listener's own beside the thinker's) or not (the text rule alone)
                judged = d.get("words_p") is not None
                heard = Heard(d.get("text") or "", d.get("words_p"), judge if judged else None, d.get("listener_p"))  # type: ignore[arg-type]
                evidence.append(Fusion.evidence(d["audio_p"], heard))
                room.append(space)
                kind.append(k)
                delay0.append((at - row["end"]) / RATE + (d["wall_ms"] if wall_ms is None else wall_ms) / 1000)
                row_of.append(r)
        self.evidence, self.room = evidence, np.array(room)
        self.kind, self.delay0, self.row_of = np.array(kind), np.array(delay0), np.array(row_of)
        self.longest = longest_wait_s
        self.complete = np.array([row["kind"] == "complete" for row in rows])

    def waits(self, w: dict[str, float], threshold: float) -> np.ndarray:
        """Each decision's further silence to the end of the turn (inf: the longest wait): the
        product's fusion (pipelines/turn_end/fusion.py: each decision's ``Fusion.odds``, as its
        ``verdict`` has them, and the wait they give, ``silence_to``), ``w`` the weights for the
        judge's judgement, the defaults for the rest."""
        odds = fusion_for(self.judge, Weights(**w)).odds
        out = np.empty(len(self.evidence))
        for i, e in enumerate(self.evidence):
            wait = silence_to(threshold, *odds(e))
            out[i] = np.inf if wait is None else wait
        return np.minimum(out, self.longest - CHECK_S)

    def figures(self, w: dict[str, float], threshold: float = 0.5) -> dict[str, Any]:
        wait = self.waits(w, threshold)
        ends = wait < self.room  # the turn would end before speech resumes (or at the final pause)
        n = len(self.rows)
        cut = np.zeros(n, bool)
        split = np.zeros(n, bool)
        np.logical_or.at(cut, self.row_of[(self.kind == "cut") & ends], True)
        np.logical_or.at(split, self.row_of[(self.kind == "split") & ends], True)
        delay = np.full(n, np.nan)
        final = self.kind == "final"
        delay[self.row_of[final]] = self.delay0[final] + wait[final]
        complete = self.complete
        delays = delay[complete & ~split & ~np.isnan(delay)] * 1000
        return {
            "cut": float(cut[~complete].mean()) if (~complete).any() else 0.0,
            "split": float(split[complete].mean()) if complete.any() else 0.0,
            "delay_ms": dist(list(delays), 1),
            "mean_delay_ms": float(delays.mean()) if len(delays) else float("inf"),
        }


def half(row: dict[str, Any]) -> int:
    return hashlib.sha256(row["text"].encode()).digest()[0] % 2


def grid(judge: str = "listener") -> list[dict[str, float]]:
    """The weights searched; for the thinker's judgement also the weight of the listener's beside it."""
    listener = (0.0, 0.25, 0.5, 0.75, 1.0) if judge == "thinker" else (0.0,)
    return [
        {"bias": b, "audio": a, "words": w, "silence_per_s": k, "listener": m}
        for b, a, w, k, m in itertools.product(
            np.arange(-5.0, 4.01, 0.25), (0.0, 0.25, 0.5, 0.75, 1.0), (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0), (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), listener
        )
    ]


def fit(train: Decisions, max_cut: float, max_split: float) -> tuple[dict[str, float], dict[str, Any]]:
    best: tuple[float, dict[str, float], dict[str, Any]] | None = None
    for w in grid(train.judge):
        f = train.figures(w)
        if f["cut"] <= max_cut and f["split"] <= max_split and (best is None or f["mean_delay_ms"] < best[0]):
            best = (f["mean_delay_ms"], w, f)
    if best is None:
        raise SystemExit(f"no weights on the grid keep cut <= {max_cut:.0%} and split <= {max_split:.0%} on the fitting half")
    return {k: round(float(v), 3) for k, v in best[1].items()}, best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", help="a bench.turns result (bench/results/turns-*.json)")
    parser.add_argument("--mode", default="semantic_auto+listener")
    parser.add_argument("--max-cut", type=float, default=0.10)
    parser.add_argument("--max-split", type=float, default=0.10)
    longest = TurnEndConfig().eagerness["medium"].max_wait_ms / 1000
    parser.add_argument("--wall-ms", type=float, default=None, help="each decision's own time, in place of the one measured (which load inflates): e.g. a quiet run's p50")
    parser.add_argument("--longest-wait-s", type=float, default=longest, help=f"the eagerness's longest wait (auto: {longest:g} s)")
    args = parser.parse_args()
    data = json.loads(open(args.result).read())
    rows = data["modes"][args.mode]["rows"]
    parts = {h: [r for r in rows if half(r) == h] for h in (0, 1)}
    judge = judge_of(args.mode) or "listener"
    weights, fitted = fit(Decisions(parts[0], args.longest_wait_s, args.wall_ms, judge), args.max_cut, args.max_split)
    print("weights:", weights)
    out: dict[str, Any] = {"source": args.result, "mode": args.mode, "judge": judge, "weights": weights, "groups": {}}
    for name, part in (("fitting half", parts[0]), ("held-out half", parts[1])):
        for group in dict.fromkeys(r["group"] for r in part):
            f = Decisions([r for r in part if r["group"] == group], args.longest_wait_s, args.wall_ms, judge).figures(weights)
            out["groups"][f"{name} / {group}"] = f
            d = f["delay_ms"]
            print(f"{name:14} {group:9} cut {f['cut']:.1%}  split {f['split']:.1%}  delay p50 {d.get('p50')} p90 {d.get('p90')} ms")
    print("saved", save("turn_fit", out))


if __name__ == "__main__":
    main()
