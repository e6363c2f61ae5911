"""Where a configuration's noise comes from, and which window design and statistic cut it (offline).

Reads the per-request records of a committed grid (default: ``benchmarks/results/h200/dense/records.parquet``,
7 core counts x 3 re-pinned windows, 16 recorded coding-agent sessions) and prints markdown:

1. **Noise split per statistic** (mean, p50, p90, 10%-trimmed mean, geometric mean): per core count the
   between-window spread (sd of the log of each window's figure) and the within-window part (bootstrap SE
   of the log figure, resampling one window's requests), averaged over core counts above the knee and at
   the fewest cores. ``sd x sqrt(GPU-s)`` puts designs of different lengths on one scale (for sampling
   noise, the spread shrinks as the square root of the time measured): lower is better per GPU-second.
2. **Which part of the window**: the same for the requests of the first half of the turns, the second
   half, and the whole window (a shorter window replays fewer turns of the same sessions).
3. **The first window after the start** against the re-pinned ones (how far each window's figure is
   from the median of its core count's other windows).
4. **A drift shared in time**: the between-window spread before and after each repeat's shared offset is
   taken out (the repeats are interleaved, so a repeat is a block of consecutive windows).
5. **The knee with its interval** (``orchestrator.observe.analysis.knee``) per statistic, from 3, 2 and 1
   windows per core count (every subset of repeats), with the share of the bootstrap draws that name it
   and the GPU-seconds of windows it took.

Usage: ``python benchmarks/knee_noise.py [records.parquet]``; ``benchmarks/results/knee-noise.md`` holds its output
for the three committed dense grids (``dense``, then ``search`` and ``search-2`` under their own headings).
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.observe.analysis.drift import repeat_drift
from orchestrator.observe.analysis.knee import STATISTICS, estimate_knee, statistic
from orchestrator.observe.report.tables import ttft_values

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "h200" / "dense" / "records.parquet"
N_SE = 300


def load(path: Path) -> pd.DataFrame:
    """The ok requests with a first token, and their TTFT as the report reads it (``tables.ttft_values``)."""
    d = pd.read_parquet(path)
    d = d[(d["status"] == "ok") & d["first_token_ns"].notna()].copy()
    d["ttft"] = ttft_values(d)
    return d


def window_seconds(d: pd.DataFrame) -> pd.Series:
    g = d.groupby("trial_id")
    return (g["end_ns"].max() - g["sent_ns"].min()) / 1e9


def split(d: pd.DataFrame, stat: str, rng: np.random.Generator, by: str = "cores", sort: bool = True) -> pd.DataFrame:
    """Per ``by`` group (core counts, or a sweep's designs): between-window sd of the log figure, mean within-window
    SE, mean window seconds, windows, and the figure of the group (geometric mean of its windows' figures)."""
    f = statistic(stat)
    secs = window_seconds(d)
    rows = []
    for key, g in d.groupby(by, sort=sort):
        logs, ses, s = [], [], []
        for tid, w in g.groupby("trial_id"):
            a = w["ttft"].to_numpy()
            logs.append(math.log(f(a)))
            boot = [math.log(f(a[rng.integers(0, len(a), len(a))])) for _ in range(N_SE)]
            ses.append(float(np.std(boot, ddof=1)))
            s.append(float(secs[tid]))
        rows.append({by: key, "between": float(np.std(logs, ddof=1)) if len(logs) > 1 else math.nan,
                     "within": float(np.mean(ses)), "seconds": float(np.mean(s)), "windows": len(logs),
                     "figure": math.exp(float(np.mean(logs)))})
    return pd.DataFrame(rows)


def summary(t: pd.DataFrame, low: int) -> dict[str, float]:
    above, at = t[t["cores"] > low], t[t["cores"] == low]
    secs = float(t["seconds"].mean())
    return {"between_above": above["between"].mean(), "within_above": above["within"].mean(),
            "between_low": at["between"].mean(), "within_low": at["within"].mean(), "seconds": secs,
            "between_above_x_sqrt_s": above["between"].mean() * math.sqrt(secs)}


def drift(d: pd.DataFrame, by: str, stat: str = "mean") -> dict[str, float]:
    """Whether windows measured close in time read alike (the report's test,
    :func:`orchestrator.observe.analysis.drift.repeat_drift`, on each window's ``stat``): ``d`` is interleaved, each
    repeat one pass over the ``by`` groups (core counts or designs), so a repeat is a block of consecutive windows.
    The between-window sd of the log figure (per ``by`` group, pooled), the same after each repeat's shared offset
    is taken out, and the largest repeat offset (log)."""
    f = statistic(stat)
    w = d.groupby(["trial_id", by, "repeat"]).agg(figure=("ttft", lambda s: f(s.to_numpy())),
                                                    start=("sent_ns", "min")).reset_index()
    found = repeat_drift(w, [by], figure="figure", start="start")
    if found is None:
        raise ValueError(f"no drift test: the repeats are not blocks in time, or too few repeats or {by} groups")
    return {"between": found.between, "between_after_block": found.between_after,
            "largest_block": max(abs(math.log1p(o)) for o in found.offsets), "blocks": len(found.repeats)}


def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(format(r[k], fmt) if isinstance(r[k], float) else str(r[k])
                                     for k, _, fmt in cols) + " |")
    return "\n".join(out)


def main(path: Path) -> None:
    d = load(path)
    rng = np.random.default_rng(0)
    low = int(d["cores"].min())
    secs = window_seconds(d)
    print(f"# Window noise and the knee's interval, offline\n\nWritten by `benchmarks/knee_noise.py` from "
          f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}`: {d['trial_id'].nunique()} "
          f"windows, {len(d)} ok requests, core counts {sorted(int(c) for c in d['cores'].unique())}, "
          f"window length {secs.min():.1f}-{secs.max():.1f} s (first request sent to last answer). "
          f"Spreads are in log units (0.05 is about 5%). 'above' averages the core counts above the fewest "
          f"({low}); within-window SE from {N_SE} resamples of one window's requests.\n")

    print("## 1. The statistic\n")
    rows = []
    for stat in STATISTICS:
        s = summary(split(d, stat, rng), low)
        rows.append({"statistic": stat, **s})
    print(table(rows, [("statistic", "statistic", ""), ("between_above", "between, above", ".3f"),
                       ("within_above", "within, above", ".3f"), ("between_low", f"between, {low} core", ".3f"),
                       ("within_low", f"within, {low} core", ".3f"),
                       ("between_above_x_sqrt_s", "between x sqrt(s), above", ".3f")]))

    print("\n## 2. Which turns of the sessions the window holds\n")
    turns = sorted(d["turn"].unique())
    half = turns[len(turns) // 2]
    parts = {"all turns": d, f"turns < {half} (first half)": d[d["turn"] < half],
             f"turns >= {half} (second half)": d[d["turn"] >= half], "turn 0 left out": d[d["turn"] > 0]}
    rows = []
    for stat in ("mean", "p50"):
        for name, part in parts.items():
            s = summary(split(part, stat, rng), low)
            f = statistic(stat)
            pooled = {int(c): f(g["ttft"].to_numpy()) for c, g in part.groupby("cores")}
            rows.append({"statistic": stat, "window holds": name, "requests": int(len(part) / part["trial_id"].nunique()),
                         "signal": pooled[low] / pooled[max(pooled)], **s})
    print(table(rows, [("statistic", "statistic", ""), ("window holds", "window holds", ""),
                       ("requests", "requests/window", ""), ("seconds", "seconds", ".1f"),
                       ("between_above", "between, above", ".3f"), ("within_above", "within, above", ".3f"),
                       ("between_above_x_sqrt_s", "between x sqrt(s)", ".3f"),
                       ("between_low", f"between, {low} core", ".3f"),
                       ("signal", f"{low} core / most cores", ".2f")]))
    print(f"\nThe last column is the starvation the knee is decided on: the figure of all {low}-core requests "
          "against all requests at the most cores, in the part of the window named.")

    print("\n## 3. The first window after the start\n")
    order = d.groupby("trial_id")["sent_ns"].min().sort_values()
    first = order.index[0]
    rows = []
    for stat in ("mean", "p50", "p90"):
        f = statistic(stat)
        fig = d.groupby("trial_id")["ttft"].apply(lambda s, f=f: f(s.to_numpy()))
        cores_of = d.groupby("trial_id")["cores"].first()
        dev = {}
        for tid in fig.index:
            others = fig[(cores_of == cores_of[tid]) & (fig.index != tid)]
            dev[tid] = abs(math.log(fig[tid] / float(np.median(others))))
        rest = [v for t, v in dev.items() if t != first]
        rows.append({"statistic": stat, "first": f"{cores_of[first]} cores", "first_dev": dev[first],
                     "rest_median": float(np.median(rest)), "rest_max": float(np.max(rest))})
    print(table(rows, [("statistic", "statistic", ""), ("first", "first window", ""),
                       ("first_dev", "its |log| distance to the others", ".3f"),
                       ("rest_median", "re-pinned windows: median", ".3f"), ("rest_max", "max", ".3f")]))

    print("\n## 4. A drift shared by windows close in time\n")
    print("The repeats are interleaved (each one pass over the core counts), so a repeat is a block of consecutive "
          "windows; a drift in the machine's state would show as an offset shared by a block's windows.\n")
    rows = []
    for name, part in (("all core counts", d), (f"above {low} core", d[d["cores"] > low])):
        for stat in ("mean", "p90"):
            rows.append({"windows": name, "statistic": stat, **drift(part, "cores", stat)})
    print(table(rows, [("windows", "windows", ""), ("statistic", "statistic", ""), ("blocks", "repeats", ""),
                       ("between", "between", ".3f"), ("between_after_block", "between, each repeat's offset out", ".3f"),
                       ("largest_block", "largest repeat offset", ".3f")]))

    print("\n## 5. The knee and its 90% interval, from fewer windows\n")
    repeats = sorted(d["repeat"].unique())
    rows = []
    for stat in ("mean", "trimmed", "geomean", "p50", "p90"):
        for k in range(len(repeats), 0, -1):
            settled, named, shares, gpus = 0, [], [], []
            subsets = list(itertools.combinations(repeats, k))
            for sub in subsets:
                part = d[d["repeat"].isin(sub)]
                w = {int(c): [g["ttft"].to_numpy() for _, g in cg.groupby("trial_id")] for c, cg in part.groupby("cores")}
                est = estimate_knee(w, stat=stat, n_boot=400, seed=1)
                settled += est.settled
                named.append(est.sentence())
                shares.append(max(est.shares.values()))
                gpus.append(float(window_seconds(part).sum()))
            rows.append({"statistic": stat, "windows per core count": k, "subsets": len(subsets),
                         "settled": f"{settled} of {len(subsets)}", "modal share": float(np.mean(shares)),
                         "window GPU-s": float(np.mean(gpus)), "answers": "; ".join(sorted(set(named)))})
    print(table(rows, [("statistic", "statistic", ""), ("windows per core count", "windows per core count", ""),
                       ("settled", "settled", ""), ("modal share", "draws naming the knee", ".2f"),
                       ("window GPU-s", "window GPU-s", ".0f"), ("answers", "answers", "")]))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
