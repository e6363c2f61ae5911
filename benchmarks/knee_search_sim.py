"""The knee from fewer windows: grids of 1-3 repeats and the window-level search, replayed from real windows.

A *window* at a core count is replayed from the committed per-request records of a dense H200 grid (7 core
counts x 3 real windows each): one of that core count's real windows, drawn at random, with its requests
drawn again with replacement. So a replayed grid has the real window-to-window and request-to-request noise
of that lease. Each records file is one dense curve; by default both committed ones
(``benchmarks/results/h200/dense``, ``benchmarks/results/h200/search`` and ``.../search-2``, three leases).

The answer of a design is :func:`orchestrator.observe.analysis.knee.estimate_knee` over the windows it
measured (the product's statistic, p90 TTFT, unless ``--stat`` says otherwise; monotone fit; 90% bootstrap of windows then requests). The reference is a 6-repeat
grid of the same replay. Per design and seed: does it name the reference's knee (exactly, within one grid
step), is its interval the reference's, does its interval hold the reference's knee, is it settled, and do
two independent runs of it agree; its windows against the 3-repeat grid's 21, and its GPU-seconds against
a 3-repeat re-pinned grid's, where both pay one start (``--start-s``) and every window costs a window with
the time between windows (``--window-s``; both default to the latest committed grid's time use,
``benchmarks/results/h200/search-2/h200-dense-knee/time_use.json``: 71 s warm start, 11.3 s a window).
The floor row runs the search on noiseless windows (each window of a core count is all its real windows'
requests, the same every time): the fewest windows, and so GPU-seconds, the rule can stop on for the curve.

The search is the product's own decision (:func:`orchestrator.plan.knee_search.next_cores`), at its
default of at most 3 windows a core count (``repeats.max``) and at 4. Two other rules are replayed beside it:
the one before ``KNEE_WINDOWS`` (it stopped settled with a single window at the knee or below it), and one
tried and not adopted, narrowing also at grid counts inside the interval that have no window yet (the H200
search of 2026-12-04 stopped on 2-4 cores without measuring 3).

``--stat p90`` decides every estimate on another statistic; ``--only TEXT`` replays only the designs whose name
holds it (and the 3-repeat grid). ``--distinct`` draws a run's windows at a core count without repeating a real window until each was drawn once.

``--exact`` checks instead that the estimate's bulk draws (:func:`estimate_knee`) decide as one ``rng.integers``
call at a time (``knee._estimate_knee_reference``): per seed, the search (at most 3 and 4 windows a count) and the
6-repeat grid are replayed once with each, on the same windows; every estimate along the way (all its fields) and
so every trial chosen must be the same. ``--n-boot`` sets the draws per estimate (default 200, as the table).

Usage: ``python benchmarks/knee_search_sim.py [--seeds N] [--procs P] [--distinct] [--stat S] [--only TEXT] [records.parquet ...]``
       ``python benchmarks/knee_search_sim.py --exact [--seeds N] [--n-boot B] [--stat S] [records.parquet ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.observe.analysis.knee import KneeEstimate, _estimate_knee_reference, estimate_knee
from orchestrator.observe.report.tables import ReportOptions, ttft_values
from orchestrator.plan.knee_search import Reason, next_cores

ROOT = Path(__file__).resolve().parents[1]
RECORDS = (ROOT / "benchmarks" / "results" / "h200" / "dense" / "records.parquet",
           ROOT / "benchmarks" / "results" / "h200" / "search" / "h200-dense-knee-records.parquet",
           ROOT / "benchmarks" / "results" / "h200" / "search-2" / "h200-dense-knee-records.parquet")
# the latest grid's time use: after the cuts between windows (d634576), so a window costs what it now costs
TIME_USE = ROOT / "benchmarks" / "results" / "h200" / "search-2" / "h200-dense-knee" / "time_use.json"
N_BOOT = 200


def real_windows(path: Path) -> dict[int, list[np.ndarray]]:
    """Per core count, each window's TTFTs as the report reads them (``tables.ttft_values``)."""
    d = pd.read_parquet(path)
    return {int(c): [ttft_values(g) for _, g in cg.groupby("trial_id")] for c, cg in d.groupby("cores")}


class Replay:
    """Windows replayed from real ones. ``distinct``: a run's windows at a core count are different real
    windows until each has been drawn once (then again, in a new random order), as a real search's windows
    are never the same window twice; else each window is any real window, drawn with replacement."""

    distinct = False
    stat = ReportOptions().knee_statistic  # what every estimate of the run decides on (the search's, the reference's)

    def __init__(self, real: dict[int, list[np.ndarray]], rng: np.random.Generator) -> None:
        self.real, self.rng = real, rng
        self.windows = 0
        self._left: dict[int, list[int]] = {}

    def window(self, cores: int) -> np.ndarray:
        self.windows += 1
        ws = self.real[cores]
        if self.distinct:
            left = self._left.get(cores) or [int(i) for i in self.rng.permutation(len(ws))]
            w = ws[left.pop()]
            self._left[cores] = left
        else:
            w = ws[self.rng.integers(0, len(ws))]
        return w[self.rng.integers(0, len(w), len(w))]


class Noiseless:
    """The floor: every window at a core count is all of its real windows' requests together, the same each
    time, so the search is never misled by a window and stops on the fewest windows its rule allows."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def window(self, cores: int) -> np.ndarray:
        self.replay.windows += 1
        return np.concatenate(self.replay.real[cores])


def grid(replay: Replay, allowed: list[int], repeats: int, seed: int) -> KneeEstimate:
    windows = {c: [replay.window(c) for _ in range(repeats)] for c in allowed}
    return estimate_knee(windows, stat=Replay.stat, n_boot=N_BOOT, seed=seed)


Decide = Callable[[list[int], dict[int, int], KneeEstimate, int], "int | None"]


def today(grid: list[int], have: dict[int, int], est: KneeEstimate, max_windows: int) -> int | None:
    return next_cores(grid, have, est, max_windows).cores


def inside(grid: list[int], have: dict[int, int], est: KneeEstimate, max_windows: int) -> int | None:
    """Tried, not adopted: the narrowing step also measures the grid counts inside the interval that have no
    window yet (and leaves out the count below the knee when it is outside the interval)."""
    d = next_cores(grid, have, est, max_windows)
    if d.reason is not Reason.NARROW:
        return d.cores
    n = {c: have.get(c, 0) for c in grid if est.low <= c <= est.high or c == grid[-1]}
    room = [c for c in n if n[c] < max_windows]
    return min(room, key=lambda c: (n[c], c != est.knee)) if room else None


def one_window(grid: list[int], have: dict[int, int], est: KneeEstimate, max_windows: int) -> int | None:
    """The rule before KNEE_WINDOWS (as at 6df18e0): settled stops at once, with one window at the knee."""
    d = next_cores(grid, have, est, max_windows)
    return None if d.reason is Reason.KNEE_NOISE else d.cores


def search(replay: Replay | Noiseless, allowed: list[int], seed: int, decide: Decide, max_windows: int,
           estimate: Callable[..., KneeEstimate] = estimate_knee, n_boot: int = N_BOOT) -> KneeEstimate:
    windows: dict[int, list[np.ndarray]] = {}
    est = estimate({}, n_boot=1)
    while (nxt := decide(allowed, {c: len(w) for c, w in windows.items()}, est, max_windows)) is not None:
        windows.setdefault(nxt, []).append(replay.window(nxt))
        est = estimate(windows, stat=Replay.stat, n_boot=n_boot, seed=seed)
    return est


@dataclass(frozen=True)
class Outcome:
    same: bool
    near: bool
    same_interval: bool
    holds: bool
    settled: bool
    agree_near: bool
    agree_same: bool
    windows: int


DESIGNS: dict[str, Callable[[Replay, list[int], int], KneeEstimate]] = {
    **{f"grid x{k}": (lambda r, a, s, k=k: grid(r, a, k, s)) for k in (1, 2, 3)},
    **{f"search, max {m} windows a count": (lambda r, a, s, m=m: search(r, a, s, today, m)) for m in (3, 4)},
    "before: settled on one window at the knee (max 3)": lambda r, a, s: search(r, a, s, one_window, 3),
    "tried: + unmeasured counts inside the interval (max 3)": lambda r, a, s: search(r, a, s, inside, 3),
    "floor: the search on noiseless windows (max 3)": lambda r, a, s: search(Noiseless(r), a, s, today, 3),
}


def one_seed(args: tuple[Path, int, bool, str, tuple[str, ...]]) -> dict[str, Outcome]:
    path, seed, distinct, stat, names = args
    Replay.distinct, Replay.stat = distinct, stat  # set in the worker process, for every replay of this seed
    real = real_windows(path)
    allowed = sorted(real)
    ix = allowed.index
    ref = grid(Replay(real, np.random.default_rng([seed, 0])), allowed, 6, seed)
    out = {}
    for name, run in DESIGNS.items():
        if name not in names:
            continue
        # every design the same streams (common random numbers): two designs differ by their rule, not by
        # their draws, and a design's figures do not move when another is added
        ra, rb = Replay(real, np.random.default_rng([seed, 1])), Replay(real, np.random.default_rng([seed, 2]))
        a, b = run(ra, allowed, seed), run(rb, allowed, seed + 10_000)
        out[name] = Outcome(a.knee == ref.knee, abs(ix(a.knee) - ix(ref.knee)) <= 1,
                            (a.low, a.high) == (ref.low, ref.high), a.low <= ref.knee <= a.high, a.settled,
                            abs(ix(a.knee) - ix(b.knee)) <= 1, a.knee == b.knee, ra.windows)
    return out


def table(path: Path, seeds: int, procs: int, start_s: float, window_s: float, distinct: bool = False,
          stat: str = ReportOptions().knee_statistic, only: str = "") -> str:
    t0 = time.monotonic()
    names = tuple(n for n in DESIGNS if only in n or n.startswith("grid x3"))
    with Pool(procs) as pool:
        runs = pool.map(one_seed, [(path, s, distinct, stat, names) for s in range(seeds)])
    real = real_windows(path)
    grid_s = start_s + 3 * len(real) * window_s
    rows = []
    for name in names:
        o = [r[name] for r in runs]
        def share(f: str, o: list[Outcome] = o) -> str:
            return f"{np.mean([getattr(x, f) for x in o]):.0%}"
        used = np.array([x.windows for x in o])
        rows.append({"design": name, "same knee as 6-repeat grid": share("same"), "within one step": share("near"),
                     "same interval": share("same_interval"), "interval holds its knee": share("holds"),
                     "settled": share("settled"), "two runs: same knee": share("agree_same"),
                     "two runs: within one step": share("agree_near"),
                     "windows (mean, max)": f"{used.mean():.1f}, {used.max()}",
                     "windows / 3-repeat grid's": f"{used.mean() / (3 * len(real)):.0%}",
                     "GPU-s / 3-repeat grid's": f"{(start_s + used.mean() * window_s) / grid_s:.0%}"})
    frame = pd.DataFrame(rows)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    head = (f"Replayed from `{shown}` ({', '.join(f'{c}: {len(w)}' for c, w in real.items())} real windows per "
            f"core count{', each drawn once before any again' if distinct else ''}), {stat} TTFT, {seeds} seeds, "
            f"{N_BOOT} bootstrap draws per estimate, "
            f"{time.monotonic() - t0:.0f} s on {procs} process(es).\n")
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v) for v in r) + " |" for _, r in frame.iterrows()]
    return head + "\n" + "\n".join(lines) + "\n"


def exact_one(args: tuple[Path, int, str, int]) -> tuple[int, int]:
    """One seed's replays with the bulk draws and with the reference: (estimates compared, estimates that differ)."""
    path, seed, stat, n_boot = args
    Replay.stat = stat
    real = real_windows(path)
    allowed = sorted(real)
    trails = []
    for estimate in (estimate_knee, _estimate_knee_reference):
        trail: list[tuple[tuple[tuple[int, int], ...], KneeEstimate]] = []

        def traced(windows: dict[int, list[np.ndarray]], estimate: Callable[..., KneeEstimate] = estimate,
                   trail: list[tuple[tuple[tuple[int, int], ...], KneeEstimate]] = trail,
                   **kw: object) -> KneeEstimate:
            est = estimate(windows, **kw)
            trail.append((tuple((c, len(w)) for c, w in windows.items()), est))  # the trials so far, and the estimate
            return est
        for m in (3, 4):
            search(Replay(real, np.random.default_rng([seed, 1])), allowed, seed, today, m, traced, n_boot)
        ref = Replay(real, np.random.default_rng([seed, 0]))
        traced({c: [ref.window(c) for _ in range(6)] for c in allowed}, stat=stat, n_boot=n_boot, seed=seed)
        trails.append(trail)
    bulk, reference = trails
    return len(reference), sum(a != b for a, b in zip(bulk, reference)) + abs(len(bulk) - len(reference))


def exact(path: Path, seeds: int, procs: int, stat: str, n_boot: int) -> str:
    t0 = time.monotonic()
    with Pool(procs) as pool:
        runs = pool.map(exact_one, [(path, s, stat, n_boot) for s in range(seeds)])
    compared, differ = (sum(x) for x in zip(*runs))
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return (f"`{shown}`, {stat}, {n_boot} draws an estimate, seeds 0-{seeds - 1}: {compared} estimates compared "
            f"(searches at most 3 and 4 windows a count, 6-repeat grid), {differ} differ "
            f"({time.monotonic() - t0:.0f} s on {procs} process(es))")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("records", nargs="*", type=Path, default=list(RECORDS))
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    use = json.loads(TIME_USE.read_text())
    p.add_argument("--start-s", type=float, default=use["gpu_starting_s"])
    p.add_argument("--window-s", type=float, default=(use["gpu_held_s"] - use["gpu_starting_s"]) / 21)
    p.add_argument("--distinct", action="store_true",
                   help="draw a run's windows at a core count without repeating a real window until each was drawn")
    p.add_argument("--stat", default=ReportOptions().knee_statistic,
                   help="the statistic the knee is decided on (knee.STATISTICS; default: the product's)")
    p.add_argument("--only", default="", help="replay only the designs whose name holds this (and the 3-repeat grid)")
    p.add_argument("--exact", action="store_true",
                   help="check the bulk draws decide as one rng.integers call at a time (see the docstring)")
    p.add_argument("--n-boot", type=int, default=N_BOOT, help="draws per estimate with --exact")
    a = p.parse_args()
    if a.exact:
        for path in a.records:
            print(exact(path, a.seeds, a.procs, a.stat, a.n_boot))
        return
    print(f"GPU-seconds: one start of {a.start_s:.0f} s and {a.window_s:.1f} s a window for every design.\n")
    for path in a.records:
        print(table(path, a.seeds, a.procs, a.start_s, a.window_s, a.distinct, a.stat, a.only))


if __name__ == "__main__":
    main()
