"""Which window design measures a configuration with the least window-to-window spread per second held:
window length and sessions in flight (issue 31's candidates the committed H200 grids hold fixed), and a
window's figure against the GPU clocks it ran at.

Reads a finished sweep whose workloads are the designs, all at one configuration, from an orchestrator
home (``benchmarks/h200_records.gather``: every window's per-request records and its logged figures), and
prints markdown, per design (workload) and statistic (mean, p90 of the windows' request TTFTs):

- ``between``: the sd of the log of each window's figure (0.05 is about 5%), the spread a repeat sees;
- ``within``: one window's own sampling error, the bootstrap SE of its log figure over its requests;
- ``between x sqrt(held s)``: ``between`` on one scale for designs of different lengths, where ``held s`` is
  what a window costs, the median of its trials' start to end (the window, its drain, the reset and the
  hand-off; the median leaves out the shared start that the first window's trial holds): for
  request noise alone the spread falls as the square root of the time measured, so lower is better per
  second held.

Then the drift: the between-window spread before and after each repeat's shared offset is taken out
(``knee_noise.drift``). Where the windows logged their GPU's SM clock (``gpu0_sm_clock_mhz_mean``, NVML), the last table sets each
window's log figure, relative to its design's mean, against its clock relative to the design's mean clock.

Usage: ``python benchmarks/window_design.py HOME SWEEP [OUT_DIR]``; with OUT_DIR the records and windows are
also written there (as ``benchmarks/h200_records.py`` writes them).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import knee_noise  # noqa: E402
from h200_records import gather  # noqa: E402
from knee_noise import N_SE, drift, table  # noqa: E402

from orchestrator.observe.report.tables import ttft_values  # noqa: E402

STATS = ("mean", "p90")


def split(records: pd.DataFrame, windows: pd.DataFrame, stat: str, rng: np.random.Generator) -> list[dict]:
    # a window's cost: its trial's start to end; the median leaves out the first window of a shared start, whose
    # trial also holds the replica's start and warm-up
    held = (windows["ended_at"] - windows["started_at"]).set_axis(windows["trial_id"])
    rows = []
    for _, r in knee_noise.split(records, stat, rng, by="workload", sort=False).iterrows():
        d = records[records["workload"] == r["workload"]]
        tids = d["trial_id"].unique()
        secs = float(held[tids].median())
        rows.append({"design": r["workload"], "statistic": stat, "windows": int(r["windows"]),
                     "requests": int(len(d) / len(tids)), "figure": 1000 * r["figure"], "span": r["seconds"],
                     "held": secs, "between": r["between"], "within": r["within"], "ratio": r["between"] / r["within"],
                     "per_s": r["between"] * math.sqrt(secs)})
    return rows


def clocks(records: pd.DataFrame, windows: pd.DataFrame) -> list[dict]:
    if "gpu0_sm_clock_mhz_mean" not in windows or windows["gpu0_sm_clock_mhz_mean"].isna().all():
        return []
    fig = records.groupby("trial_id")["ttft"].mean().rename("ttft")
    w = windows.set_index("trial_id").join(fig)
    rows = []
    for design, g in w.groupby("workload", sort=False):
        y = np.log(g["ttft"]) - np.log(g["ttft"]).mean()
        x = np.log(g["gpu0_sm_clock_mhz_mean"]) - np.log(g["gpu0_sm_clock_mhz_mean"]).mean()
        r = float(np.corrcoef(x, y)[0, 1]) if len(g) > 2 and x.std() > 0 and y.std() > 0 else math.nan
        rows.append({"design": design, "windows": len(g), "clock": float(g["gpu0_sm_clock_mhz_mean"].mean()),
                     "clock_sd": float(x.std(ddof=1)), "r": r,
                     "slowdown": float(g.get("gpu0_clock_slowdown_mean", pd.Series([math.nan])).mean())})
    return rows


def main() -> None:
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    home, sweep = Path(sys.argv[1]), sys.argv[2]
    records, windows = gather(home, sweep)
    if len(sys.argv) == 4:
        out = Path(sys.argv[3])
        out.mkdir(parents=True, exist_ok=True)
        records.to_parquet(out / f"{sweep}-records.parquet", index=False)
        windows.to_csv(out / f"{sweep}-windows.csv", index=False)
    records = records[(records["status"] == "ok") & records["first_token_ns"].notna()].copy()
    records["ttft"] = ttft_values(records)
    rng = np.random.default_rng(0)
    rows = [r for stat in STATS for r in split(records, windows, stat, rng)]
    print(f"`{sweep}`: {records['trial_id'].nunique()} windows, {len(records)} ok requests, designs "
          f"{', '.join(records['workload'].unique())}; within-window SE from {N_SE} resamples of a window's "
          f"requests.\n")
    print(table(rows, [("design", "design", ""), ("statistic", "statistic", ""), ("windows", "windows", ""),
                       ("requests", "requests/window", ""), ("figure", "TTFT ms (geo. mean of windows)", ".1f"),
                       ("span", "window s", ".1f"), ("held", "held s a window", ".1f"),
                       ("between", "between", ".3f"), ("within", "within", ".3f"),
                       ("ratio", "between / within", ".2f"), ("per_s", "between x sqrt(held s)", ".3f")]))
    print("\nA drift shared by windows close in time (the designs are interleaved, each repeat one pass over them): "
          "the between-window sd of the log figure, pooled over the designs, before and after each repeat's "
          "shared offset is taken out.\n")
    rows = [{"statistic": stat, **drift(records, "workload", stat)} for stat in STATS]
    print(table(rows, [("statistic", "statistic", ""), ("blocks", "repeats", ""), ("between", "between", ".3f"),
                       ("between_after_block", "between, each repeat's offset out", ".3f"),
                       ("largest_block", "largest repeat offset", ".3f")]))
    c = clocks(records, windows)
    if c:
        print("\n" + table(c, [("design", "design", ""), ("windows", "windows", ""), ("clock", "SM clock MHz", ".0f"),
                                ("clock_sd", "clock sd (log)", ".3f"), ("r", "r(log clock, log TTFT)", ".2f"),
                                ("slowdown", "slowed share", ".2f")]))


if __name__ == "__main__":
    main()
