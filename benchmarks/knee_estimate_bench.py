"""What one knee estimate costs the driver: one ``rng.integers`` call at a time, the bulk draws, and a worker.

States a knee search passes through, built from the real windows of the committed dense H200 grid
(``benchmarks/results/h200/dense/records.parquet``: 7 core counts x 3 windows x 146 requests), p90, the product's
1000 draws, tolerance 0.10. Per state, CPU ms per estimate of the calling thread (``time.thread_time``):

- *reference*: ``knee._estimate_knee_reference`` (every draw one ``rng.integers`` call at a time: what
  ``estimate_knee`` was);
- *bulk*: ``estimate_knee`` in the calling thread (``ConfigSearch``'s default);
- *pool*: ``search.EstimatorPool(workers=1)``: the calling thread's CPU, the driver process's CPU (its threads
  that send the windows and read the answer back included, the worker's not) and the wall time, per estimate.

A last row times what a search result costs the driver with the pool: ``ConfigSearch.choose`` over every
window of the grid (21 finished trials: the windows gathered, the estimate, the decision), per call.

Every bulk and pool estimate is checked equal to the reference's (all fields) on the states' first seeds.

Usage: ``python benchmarks/knee_estimate_bench.py [--seeds N] [--reference-seeds M] [records.parquet]``
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.control.search import ConfigSearch, EstimatorPool, SearchTrial
from orchestrator.observe.analysis.knee import KneeEstimate, _estimate_knee_reference, estimate_knee
from orchestrator.observe.report.tables import ReportOptions, ttft_values
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "h200" / "dense" / "records.parquet"

Windows = dict[int, list[np.ndarray]]


def real_windows(path: Path) -> Windows:
    """Per core count, each window's TTFTs as the report reads them (``tables.ttft_values``)."""
    d = pd.read_parquet(path)
    return {int(c): [ttft_values(g) for _, g in cg.groupby("trial_id")] for c, cg in d.groupby("cores")}


def states(real: Windows) -> dict[str, Windows]:
    """Search states: its first two windows, five counts of one window, every count with 1, 2, 3 windows, and
    3 windows of different lengths (as when some requests of a window time out) at 1 core, then at every count."""
    cores = sorted(real)
    return {
        "2 counts x 1 window (the search's start)": {c: real[c][:1] for c in (cores[0], cores[-1])},
        "5 counts x 1 window (after bisecting)": {c: real[c][:1] for c in cores[::2] + [cores[-1]]},
        "7 counts x 1 window": {c: real[c][:1] for c in cores},
        "7 counts x 2 windows": {c: real[c][:2] for c in cores},
        "7 counts x 3 windows (the most at repeats.max 3)": {c: real[c][:3] for c in cores},
        "7 counts x 3 windows, at 1 core of 146, 140, 131 requests": {
            c: [w[:n] for w, n in zip(real[c], (146, 140, 131) if c == cores[0] else (146,) * 3)] for c in cores},
        "7 counts x 3 windows of 146, 140, 131 requests": {c: [w[:n] for w, n in zip(real[c], (146, 140, 131))]
                                                           for c in cores},
    }


def timed(estimate: Callable[..., KneeEstimate], windows: Windows, seeds: range) -> tuple[list[KneeEstimate], float,
                                                                                        float, float]:
    """The estimates of ``seeds``, and per estimate: the calling thread's CPU, the process's CPU, the wall (ms)."""
    out = []
    t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
    for s in seeds:
        out.append(estimate(windows, stat="p90", tolerance=0.10, level=0.90, n_boot=1000, seed=s))
    n = len(seeds)
    return (out, (time.thread_time() - t0) / n * 1e3, (time.process_time() - p0) / n * 1e3,
            (time.perf_counter() - w0) / n * 1e3)


def choose_cost(real: Windows, pool: EstimatorPool, calls: int) -> tuple[float, float, float]:
    """``ConfigSearch.choose`` over every real window with ``pool`` as its estimator: per call, the calling
    thread's CPU, the process's CPU and the wall (ms)."""
    plan = expand(parse_spec({
        "name": "bench", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": sorted(real)}, "repeats": {"max": 3}, "search": "knee"}))
    done = [SearchTrial(t.trial_id, t.cores, True, tuple(real[t.cores][t.repeat]), 0.0, 80.0) for t in plan.trials]
    search = ConfigSearch(list(plan.trials), plan.spec, ReportOptions(), estimator=pool)
    search.choose(done)
    t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
    for _ in range(calls):
        search.choose(done)
    return ((time.thread_time() - t0) / calls * 1e3, (time.process_time() - p0) / calls * 1e3,
            (time.perf_counter() - w0) / calls * 1e3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("records", nargs="?", type=Path, default=RECORDS)
    p.add_argument("--seeds", type=int, default=30, help="estimates per state, bulk and pool")
    p.add_argument("--reference-seeds", type=int, default=3, help="estimates per state, reference (slow)")
    a = p.parse_args()
    real = real_windows(a.records)
    print(f"{os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f} at the start; p90, 1000 draws an "
          f"estimate; reference {a.reference_seeds} seeds, bulk and pool {a.seeds} seeds a state\n")
    print("| state | reference: thread CPU ms | bulk: thread CPU ms | pool: thread CPU ms | pool: driver process "
          "CPU ms | pool: wall ms | bulk: wall ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with EstimatorPool(workers=1) as pool:
        timed(pool, {1: [np.ones(3)]}, range(1))                 # the worker's imports, before any timing
        for name, windows in states(real).items():
            ref, ref_cpu, _, _ = timed(_estimate_knee_reference, windows, range(a.reference_seeds))
            bulk, bulk_cpu, _, bulk_wall = timed(estimate_knee, windows, range(a.seeds))
            pooled, pool_cpu, pool_proc, pool_wall = timed(pool, windows, range(a.seeds))
            k = a.reference_seeds
            assert bulk[:k] == ref and pooled[:k] == ref and pooled == bulk, name
            print(f"| {name} | {ref_cpu:.1f} | {bulk_cpu:.2f} | {pool_cpu:.2f} | {pool_proc:.2f} | {pool_wall:.1f} | "
                  f"{bulk_wall:.1f} |")
        thread, process, wall = choose_cost(real, pool, a.seeds)
        print(f"| `ConfigSearch.choose`, 7 counts x 3 windows, with the pool | | | {thread:.2f} | {process:.2f} | "
              f"{wall:.1f} | |")


if __name__ == "__main__":
    main()
