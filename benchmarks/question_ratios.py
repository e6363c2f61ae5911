"""Ratios of a mean per-request figure (TTFT by default; ``--metric tpot`` or ``e2e``) between two settings of one axis, per core count, with a 90% bootstrap interval, from
a committed sweep's per-request records (``benchmarks/h200_records.py``).

The interval resamples each cell's windows, then each drawn window's requests (as the report's knee
interval does), and takes the ratio of the two cells' pooled means; one window in a cell leaves the
window-to-window noise out, which the output says. Also the ratio against the same setting's most cores.

Usage: ``python benchmarks/question_ratios.py RECORDS.parquet AXIS BASE OTHER [--metric M] [--draws N]``, e.g.
``... h200-quota-vs-cpuset-records.parquet restriction cpuset quota``. Metrics, over ok requests: ``ttft`` (first
token - send), ``e2e`` (end - send), ``tpot`` ((end - first token) / (completion tokens - 1)).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from orchestrator.observe.report.tables import tpot_values, ttft_values


def e2e_values(d: pd.DataFrame) -> np.ndarray:
    ok = d[d["status"] == "ok"]
    return ((ok["end_ns"] - ok["sent_ns"]) / 1e9).to_numpy(dtype=float)


METRICS = {"ttft": ttft_values, "e2e": e2e_values, "tpot": tpot_values}


def windows(d: pd.DataFrame, metric: str = "ttft") -> list[np.ndarray]:
    return [METRICS[metric](g) for _, g in d.groupby("trial_id")]


def draw(ws: list[np.ndarray], rng: np.random.Generator) -> float:
    picked = [ws[i] for i in rng.integers(0, len(ws), len(ws))]
    return float(np.mean(np.concatenate([w[rng.integers(0, len(w), len(w))] for w in picked])))


def ratio(a: list[np.ndarray], b: list[np.ndarray], draws: int, rng: np.random.Generator) -> str:
    point = np.mean(np.concatenate(a)) / np.mean(np.concatenate(b))
    boot = [draw(a, rng) / draw(b, rng) for _ in range(draws)]
    lo, hi = np.quantile(boot, [0.05, 0.95])
    note = "" if min(len(a), len(b)) > 1 else " (one window: requests only)"
    return f"{point:.2f}x [{lo:.2f}-{hi:.2f}]{note}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("records")
    p.add_argument("axis")
    p.add_argument("base")
    p.add_argument("other")
    p.add_argument("--metric", choices=sorted(METRICS), default="ttft")
    p.add_argument("--draws", type=int, default=2000)
    a = p.parse_args()
    d = pd.read_parquet(a.records)
    d[a.axis] = d[a.axis].astype(str)
    rng = np.random.default_rng(0)
    top = int(d["cores"].max())
    cells = {(str(v), int(c)): windows(g, a.metric) for (v, c), g in d.groupby([a.axis, "cores"])}
    name = a.metric.upper()
    print(f"| cores | {a.base}: mean {name} ms | {a.other}: mean {name} ms | {a.other} / {a.base} (90%) "
          f"| {a.base}: / its {top} cores | {a.other}: / its {top} cores |")
    print("|---|---|---|---|---|---|")
    for c in sorted({c for _, c in cells}):
        base, other = cells.get((a.base, c)), cells.get((a.other, c))
        if not base or not other:
            continue
        print(f"| {c} | {1000 * np.mean(np.concatenate(base)):.0f} ({len(base)} windows) "
              f"| {1000 * np.mean(np.concatenate(other)):.0f} ({len(other)} windows) | {ratio(other, base, a.draws, rng)} "
              f"| {ratio(base, cells[(a.base, top)], a.draws, rng)} | {ratio(other, cells[(a.other, top)], a.draws, rng)} |")


if __name__ == "__main__":
    main()
