"""The knee from fewer windows: grids of 1-6 repeats and a window-level search, replayed from real windows.

A *window* at a core count is replayed from the committed per-request records (default: the dense H200
grid, ``benchmarks/results/h200/dense/records.parquet``, 7 core counts x 3 real windows): one of that
core count's real windows, drawn at random, with its requests drawn again with replacement. So a replayed
grid has the real window-to-window and request-to-request noise of that lease.

The answer of a design is :func:`orchestrator.observe.analysis.knee.estimate_knee` over the windows it
measured (mean TTFT, monotone fit, 90% bootstrap of windows then requests). The reference is a 6-repeat
grid of the same replay. Per design and seed: does it name the reference's knee (exactly, within one grid
step), is it settled, and do two independent runs of it agree within one step; its windows against the
3-repeat grid's 21.

The search (:func:`orchestrator.plan.knee_search.next_cores`, the product's own decision): measure the most and the fewest cores (one window each), then bisect on
the knee the estimate names, between it and the largest measured core count below it; once those two are
neighbours in the grid, add a window where the interval is (the core counts inside it and the most cores,
the one with fewest windows first, at most ``max_windows`` each) until the knee is settled and bracketed.

Usage: ``python benchmarks/knee_search_sim.py [records.parquet] [seeds]``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.observe.analysis.knee import estimate_knee
from orchestrator.plan.knee_search import next_cores as decide
from orchestrator.observe.report.tables import ttft_values

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "h200" / "dense" / "records.parquet"
N_BOOT = 200


def real_windows(path: Path) -> dict[int, list[np.ndarray]]:
    """Per core count, each window's TTFTs as the report reads them (``tables.ttft_values``)."""
    d = pd.read_parquet(path)
    return {int(c): [ttft_values(g) for _, g in cg.groupby("trial_id")] for c, cg in d.groupby("cores")}


class Replay:
    def __init__(self, real: dict[int, list[np.ndarray]], rng: np.random.Generator) -> None:
        self.real, self.rng = real, rng
        self.windows = 0

    def window(self, cores: int) -> np.ndarray:
        self.windows += 1
        ws = self.real[cores]
        w = ws[self.rng.integers(0, len(ws))]
        return w[self.rng.integers(0, len(w), len(w))]


def grid(replay: Replay, allowed: list[int], repeats: int, seed: int):
    windows = {c: [replay.window(c) for _ in range(repeats)] for c in allowed}
    return estimate_knee(windows, n_boot=N_BOOT, seed=seed)


def next_cores(allowed: list[int], windows: dict[int, list[np.ndarray]], est, max_windows: int) -> int | None:
    """The next core count to measure, or None when the search stops: the product's decision
    (:func:`orchestrator.plan.knee_search.next_cores`)."""
    return decide(allowed, {c: len(w) for c, w in windows.items()}, est, max_windows).cores


def search(replay: Replay, allowed: list[int], seed: int, max_windows: int = 4):
    windows: dict[int, list[np.ndarray]] = {}
    for c in (allowed[-1], allowed[0]):
        windows.setdefault(c, []).append(replay.window(c))
    while True:
        est = estimate_knee(windows, n_boot=N_BOOT, seed=seed)
        nxt = next_cores(allowed, windows, est, max_windows)
        if nxt is None:
            return est, windows
        windows.setdefault(nxt, []).append(replay.window(nxt))


def main(path: Path, seeds: int) -> None:
    real = real_windows(path)
    allowed = sorted(real)
    rows = []
    designs = {f"grid x{k}": (lambda r, s, k=k: (grid(r, allowed, k, s), None)) for k in (1, 2, 3)}
    designs["search (max 4 windows a point)"] = lambda r, s: search(r, allowed, s, 4)
    for name, run in designs.items():
        exact = near = settled = agree = 0
        used = []
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            ref = grid(Replay(real, rng), allowed, 6, seed)
            a_replay, b_replay = Replay(real, rng), Replay(real, rng)
            a, _ = run(a_replay, seed)
            b, _ = run(b_replay, seed + 10_000)
            exact += a.knee == ref.knee
            near += abs(allowed.index(a.knee) - allowed.index(ref.knee)) <= 1
            settled += a.settled
            agree += abs(allowed.index(a.knee) - allowed.index(b.knee)) <= 1
            used.append(a_replay.windows)
        rows.append({"design": name, "same knee as 6-repeat grid": f"{exact / seeds:.0%}",
                     "within one step": f"{near / seeds:.0%}", "settled": f"{settled / seeds:.0%}",
                     "two runs within one step": f"{agree / seeds:.0%}",
                     "windows (mean, max)": f"{np.mean(used):.1f}, {max(used)}",
                     "windows / 3-repeat grid's": f"{np.mean(used) / (3 * len(allowed)):.0%}"})
    frame = pd.DataFrame(rows)
    print(f"Replayed from `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` "
          f"({', '.join(f'{c}: {len(w)}' for c, w in real.items())} real windows per core count), {seeds} seeds, "
          f"{N_BOOT} bootstrap draws per estimate.\n")
    print("| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns))
    for _, r in frame.iterrows():
        print("| " + " | ".join(str(v) for v in r) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT, int(sys.argv[2]) if len(sys.argv) > 2 else 100)
