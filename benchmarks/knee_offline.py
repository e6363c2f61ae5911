"""Offline check of the knee search (orchestrator.plan.knee_search) on the committed H200 grids: simulated,
no processes, no GPU.

For every configuration (one sweep's trials that differ only in cores and the repeat) in
``benchmarks/results/h200/``, this

1. takes the committed per-trial TTFT p50s (trial CSVs; the long-context windows file joined to its table
   by trial id; for the calibration sweep, which kept only its table, the two repeats of each core count
   rebuilt exactly from the median and the spread ``(max - min) / median`` the table holds);
2. computes the grid's knee from them with the report's own function (``observe.report.comparison``) and
   checks that ``search_state`` over the same trials gives the same knee;
3. fits, per core count, a lognormal to the repeats' p50s: median = their median, sigma = the standard
   deviation of their logs, or ``--default-spread`` (8%) where a core count has one repeat;
4. runs the search ``--seeds`` times, each trial drawn from that lognormal with a seeded RNG, one lane:
   it asks ``next_trials`` for a batch, runs it, asks again, until the list is empty;
5. runs the grid the same way (every core count x ``--grid-repeats``) as the baseline: how often a grid
   measured again would find the committed knee.

GPU-seconds per trial come from the sweep's own log (``COMPLETED in N s`` per trial id, the trial's
wall time on its one GPU) and the sweep's start mode:

- ``start trial``: the median of the trials that started a replica, the sweep's first (cold: compile
  cache built) left out, since grid and search would both pay it once;
- ``window trial``: the median of the trials that reused a live replica (shared start or repin);
- where a sweep has no warm start (repin sweeps start once, cold), the window trial plus the pooled
  median start overhead (start trial - window trial) of the sweeps that have both.

A trial costs a start trial when its lane has no replica for it: every trial without ``share_start``;
with ``share_start`` when the cores differ from the lane's previous trial (the batch runs grouped by
cores, as the controller's chains run trials that share a start); with ``repin`` only the first. The
grid runs in the sweep's order (share_start: cores-major; else repeat-major).

    .venv/bin/python benchmarks/knee_offline.py [--seeds 200] [--tolerance 0.10] [--grid-repeats 3]
"""

from __future__ import annotations

import argparse
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from orchestrator.observe.report.comparison import CONFIG, comparison
from orchestrator.plan.knee_search import Observation, RepeatPolicy, next_trials, search_state

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "benchmarks" / "results" / "h200"
OUT = ROOT / "benchmarks" / "results" / "knee-offline.md"


@dataclass(frozen=True)
class Source:
    """One committed sweep: its per-trial rows, its YAML and its log."""

    name: str
    trials: str
    sweep: str
    log: str
    table: str | None = None  # the report's table, where trial rows lack the factors


SOURCES = [
    Source("h200-llama8b", "h200-llama8b.csv", "h200-llama8b.yaml", "h200-llama8b.log"),
    Source("h200-llama8b-repin", "h200-llama8b-repin.csv", "h200-llama8b-repin.yaml", "h200-llama8b-repin.log"),
    Source("h200-long-context", "h200-long-context-trials.csv", "h200-long-context.yaml", "h200-long-context.log",
           table="h200-long-context.csv"),
    Source("h200-calibration", "h200-calibration.csv", "h200-calibration.yaml", "h200-calibration.log",
           table="h200-calibration.csv"),
    Source("h200-startup-before", "h200-startup-before-trials.csv", "h200-startup-before.yaml", "h200-startup.log"),
    Source("h200-startup-after", "h200-startup-after-trials.csv", "h200-startup-after.yaml", "h200-startup.log"),
    Source("h200-starved-agentic", "starved/agentic-trials.csv", "h200-starved-agentic.yaml", "starved/sweep.log"),
    Source("h200-starved-recorded", "starved/recorded-trials.csv", "h200-starved-recorded.yaml",
           "starved/sweep.log"),
]
_DONE = re.compile(r"^\[([0-9a-f]{12})\] .*: COMPLETED in (\d+) s")


def trial_rows(src: Source) -> pd.DataFrame:
    """One row per committed trial: the factors, cores, repeat, status, TTFT p50 (s), timeout rate."""
    path = H200 / src.trials
    if src.table is None:
        return pd.read_csv(path)
    table = pd.read_csv(H200 / src.table)
    windows = None if src.trials == src.table else pd.read_csv(path).set_index("trial")
    rows = []
    for _, t in table.iterrows():
        ids = str(t["trials"]).split(",")
        if windows is None:  # the table only: rebuild the repeats from median and spread (exact for 2)
            if len(ids) != 2:
                raise ValueError(f"{src.name}: {len(ids)} repeats cannot be rebuilt from a median and a spread")
            m, s = t["ttft_p50_s"], t["p50_spread"]
            p50s = [m * (1 - s / 2), m * (1 + s / 2)]
        else:
            p50s = [windows.loc[i, "p50"] / 1000 for i in ids]  # milliseconds there
        for rep, (i, v) in enumerate(zip(ids, p50s)):
            rows.append({**{c: t[c] for c in CONFIG if c in t}, "trial_id": i, "cores": int(t["cores"]),
                         "repeat": rep, "status": "COMPLETED", "ttft_p50_s": v, "timeout_rate": t["timeout_rate"]})
    return pd.DataFrame(rows)


def log_seconds(src: Source) -> list[tuple[str, int]]:
    """(trial id, wall seconds) of every completed trial in the log, in the order they ran."""
    out = []
    for line in (H200 / src.log).read_text().splitlines():
        m = _DONE.match(line.strip())
        if m:
            out.append((m.group(1), int(m.group(2))))
    return out


@dataclass(frozen=True)
class Costs:
    """What one trial costs on its GPUs: with a start of its own, and on a live replica."""

    mode: str  # "fresh" (every trial starts), "share" (one start per cores), "repin" (one start)
    start_trial_s: float
    window_trial_s: float
    gpus: int
    how: str  # where the figures came from


def sweep_mode(src: Source) -> str:
    """``repin``, ``share`` (fresh or sized starts with protocol.share_start) or ``fresh``, from the sweep."""
    spec = yaml.safe_load((ROOT / "sweeps" / src.sweep).read_text())
    if spec["grid"]["start"][0] == "repin":
        return "repin"
    return "share" if spec.get("protocol", {}).get("share_start") else "fresh"


def measured_costs(src: Source, rows: pd.DataFrame, workload: str) -> tuple[str, list[float], list[float]]:
    """The sweep's mode, and the seconds of one workload's warm start trials and of its window trials.

    Which trials started a replica follows from the sweep's mode and the log's order: without share_start
    every trial; with share_start the first at each core count (its start serves every workload there);
    with repin the sweep's first. The sweep's first trial is its cold start and is left out."""
    mode = sweep_mode(src)
    cores = dict(zip(rows["trial_id"].astype(str), rows["cores"]))
    mine = set(rows[rows["workload"] == workload]["trial_id"].astype(str))
    ran = [(tid, s) for tid, s in log_seconds(src) if tid in cores]  # a log may hold other sweeps too
    seen: set[int] = set()
    starts, windows = [], []
    for i, (tid, s) in enumerate(ran):
        started = mode == "fresh" or (mode == "repin" and i == 0) or (mode == "share" and cores[tid] not in seen)
        seen.add(cores[tid])
        if tid in mine and i > 0:
            (starts if started else windows).append(float(s))
    return mode, starts, windows


def costs_for(sources: list[tuple[Source, pd.DataFrame]]) -> dict[str, Costs]:
    """Per ``source|workload``: its trial costs (see the module docstring for the pooled fallback)."""
    measured = {f"{src.name}|{w}": (measured_costs(src, rows, w), int(rows["gpus"].iloc[0]))
                for src, rows in sources for w in sorted(set(rows["workload"]))}
    pooled = float(np.median([np.median(s) - np.median(w) for (_, s, w), _ in measured.values() if s and w]))
    out = {}
    for key, ((mode, starts, windows), gpus) in measured.items():
        w = float(np.median(windows)) if windows else math.nan
        if starts:
            s, how = float(np.median(starts)), f"log: {len(starts)} warm starts"
        else:
            s, how = w + pooled, f"log: window + pooled start overhead {pooled:.0f} s"
        out[key] = Costs(mode, s, w, gpus, how + (f", {len(windows)} windows" if windows else ""))
    return out


def trial_cost(costs: Costs, lane: dict[str, int | None], cores: int) -> float:
    """One trial's GPU-seconds on a lane that last ran ``lane["cores"]`` (None: no replica yet)."""
    last = lane.get("cores")
    started = (costs.mode == "fresh" or last is None or (costs.mode == "share" and last != cores))
    lane["cores"] = cores
    return (costs.start_trial_s if started else costs.window_trial_s) * costs.gpus


def knee_of(medians: dict[int, float], tol: float) -> int:
    """The report's knee of figures that are all usable: the fewest cores within ``tol`` of the best."""
    best = min(medians.values())
    return min(c for c, m in medians.items() if m <= best * (1 + tol))


@dataclass(frozen=True)
class Curve:
    """A configuration as the simulation serves it: per core count, a lognormal of the repeats' TTFT p50s
    (``median`` in s, ``sigma`` of the log); ``single``: the core counts that had one repeat."""

    median: dict[int, float]
    sigma: dict[int, float]
    single: frozenset[int] = frozenset()

    @classmethod
    def fit(cls, rows: pd.DataFrame, default_spread: float) -> Curve:
        median, sigma, single = {}, {}, set()
        for c, g in rows.groupby("cores"):
            v = g[g["status"] == "COMPLETED"]["ttft_p50_s"].dropna().to_numpy(float)
            median[int(c)] = float(np.median(v))
            sigma[int(c)] = float(np.std(np.log(v), ddof=1)) if len(v) > 1 else default_spread
            if len(v) < 2:
                single.add(int(c))
        return cls(median, sigma, frozenset(single))

    def interpolated(self, cores: list[int]) -> Curve:
        """The curve at ``cores`` (within the measured range): log TTFT linear in log cores between the
        measured counts, sigma linear; a synthetic curve, for grids finer than the committed ones."""
        known = sorted(self.median)
        x = np.log(known)
        inside = [c for c in cores if known[0] <= c <= known[-1]]
        med = np.exp(np.interp(np.log(inside), x, np.log([self.median[c] for c in known])))
        sig = np.interp(np.log(inside), x, [self.sigma[c] for c in known])
        return Curve(dict(zip(inside, map(float, med))), dict(zip(inside, map(float, sig))))

    def noiseless(self) -> Curve:
        return Curve(self.median, {c: 0.0 for c in self.sigma})

    @property
    def allowed(self) -> list[int]:
        return sorted(self.median)

    def knee(self, tol: float) -> int:
        return knee_of(self.median, tol)

    def draw(self, cores: int, rng: np.random.Generator) -> Observation:
        return Observation(cores, float(self.median[cores] * math.exp(self.sigma[cores] * rng.standard_normal())))

    def describe(self) -> str:
        return ", ".join(f"{c}: {self.median[c]:.3f} s / {self.sigma[c]:.0%}" + ("*" if c in self.single else "")
                         for c in self.allowed)


def run_search(curve: Curve, costs: Costs, tol: float, policy: RepeatPolicy,
               rng: np.random.Generator) -> tuple[int | None, int, float]:
    """One simulated search on one lane: (knee found, trials, GPU-seconds). Each batch ``next_trials``
    proposes runs before the next question; with share_start its trials at the same cores run together."""
    allowed = curve.allowed
    obs: list[Observation] = []
    lane: dict[str, int | None] = {"cores": None}
    gpu_s = 0.0
    while batch := next_trials(allowed, obs, tol, policy):
        cores = [p.cores for p in batch]
        if costs.mode == "share":
            cores = sorted(cores, key=cores.index)
        for c in cores:
            gpu_s += trial_cost(costs, lane, c)
            obs.append(curve.draw(c, rng))
    return search_state(allowed, obs, tol, policy).knee, len(obs), gpu_s


def grid_order(allowed: list[int], repeats: int, mode: str) -> list[int]:
    """The sweep's own order (expand): cores-major with share_start, else repeat-major."""
    if mode == "share":
        return [c for c in allowed for _ in range(repeats)]
    return [c for _ in range(repeats) for c in allowed]


def regrid_knee(curve: Curve, order: list[int], tol: float, rng: np.random.Generator) -> int:
    """The knee of the grid measured again: every trial of ``order`` drawn, the report's definition."""
    values: dict[int, list[float]] = {c: [] for c in curve.allowed}
    for c in order:
        values[c].append(float(curve.draw(c, rng).ttft_p50_s or math.nan))
    return knee_of({c: float(np.median(v)) for c, v in values.items()}, tol)


def committed_knee(label: str, rows: pd.DataFrame, tol: float) -> int:
    """The report's knee of the committed trials, checked against ``search_state`` on the same trials."""
    table = comparison(rows, tol)
    knee = int(table[table["knee"] == "<- knee"]["cores"].iloc[0])
    obs = [Observation(int(r.cores), float(r.ttft_p50_s), float(r.timeout_rate), r.status != "COMPLETED")
           for r in rows.itertuples()]
    mine = search_state(sorted(set(rows["cores"])), obs, tol, RepeatPolicy(1, 1, 0.0)).knee
    if mine != knee:
        raise AssertionError(f"{label}: search_state's knee {mine} != the report's {knee}")
    return knee


@dataclass(frozen=True)
class Result:
    """One configuration under one repeat policy: the seeds' searches and regrids against its knee."""

    label: str
    curve: Curve
    knee: int
    costs: Costs
    found: list[int | None]
    trials: list[int]
    spent: list[float]
    regrid: list[int]
    grid_trials: int
    grid_s: float
    floor_n: int
    floor_s: float

    def share(self, knees: list[int | None] | list[int], steps: int) -> float:
        """The share of ``knees`` within ``steps`` allowed steps of the knee."""
        allowed = self.curve.allowed
        return float(np.mean([k is not None and abs(allowed.index(k) - allowed.index(self.knee)) <= steps
                              for k in knees]))

    @property
    def ratio(self) -> float:
        return float(np.mean(self.spent)) / self.grid_s

    def row(self) -> str:
        counts = pd.Series([str(k) for k in self.found]).value_counts()
        found = ", ".join(f"{k}: {v / len(self.found):.0%}" for k, v in counts.items())
        return (f"| {self.label} | {','.join(map(str, self.curve.allowed))} | {self.knee} | {found} "
                f"| {self.share(self.found, 1):.0%} | {self.share(self.found, 0):.0%} | {self.share(self.regrid, 1):.0%} "
                f"| {self.share(self.regrid, 0):.0%} | {np.mean(self.trials):.1f} ({max(self.trials)}) / "
                f"{self.grid_trials} | {np.mean(self.spent):.0f} / {self.grid_s:.0f} | {self.ratio:.0%} "
                f"| {self.floor_n} trials, {self.floor_s / self.grid_s:.0%} |")


def simulate(label: str, curve: Curve, knee: int, costs: Costs, args: argparse.Namespace,
             policy: RepeatPolicy) -> Result:
    """The search and the regrid over ``args.seeds`` seeds (their own RNG streams), and the noiseless floor."""
    order = grid_order(curve.allowed, args.grid_repeats, costs.mode)
    lane: dict[str, int | None] = {"cores": None}
    grid_s = sum(trial_cost(costs, lane, c) for c in order)
    _, floor_n, floor_s = run_search(curve.noiseless(), costs, args.tolerance, policy, np.random.default_rng(0))
    found, trials, spent, regrid = [], [], [], []
    for seed in range(args.seeds):
        key = zlib.crc32(label.encode())
        k, n, s = run_search(curve, costs, args.tolerance, policy, np.random.default_rng([seed, key, 0]))
        found.append(k)
        trials.append(n)
        spent.append(s)
        regrid.append(regrid_knee(curve, order, args.tolerance, np.random.default_rng([seed, key, 1])))
    return Result(label, curve, knee, costs, found, trials, spent, regrid, len(order), grid_s, floor_n, floor_s)


HEAD = ("| configuration | cores | grid knee | search found | search <=1 step | exact | regrid <=1 step | exact "
        "| trials (max) / grid | GPU-s / grid | GPU-s ratio | noiseless floor |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|")


def goal(results: list[Result]) -> str:
    met = [r for r in results if r.share(r.found, 1) == 1.0 and r.ratio <= 0.5]
    return (f"Goal (the same knee within one grid step in every configuration, at <= 50% of the grid's "
            f"GPU-seconds): met in {len(met)} of {len(results)}.")


def markdown(committed: list[Result], fine: list[Result], args: argparse.Namespace) -> str:
    lines = [
        "# Knee search, offline against the committed H200 grids",
        "",
        "Written by `benchmarks/knee_offline.py` (its docstring has the method). Data: the committed per-trial",
        "TTFT p50s in `benchmarks/results/h200/` (calibration: its two repeats per core count rebuilt from the",
        "table's median and spread), trial seconds from each sweep's log. Each core count is resampled from a",
        "lognormal: the median of its repeats, sigma the standard deviation of their logs (`*`: one repeat,",
        f"sigma {args.default_spread:.0%} assumed). {args.seeds} seeds, one lane. Knee: the fewest cores within "
        f"{args.tolerance:.0%} of the best TTFT p50 (the report's definition). Search repeats: min {args.min}, "
        f"max {args.max}, until_ci {args.until_ci:.0%}. Grid: every core count x {args.grid_repeats} repeats. "
        "Regrid: that grid measured again from the same lognormals. Noiseless floor: the search on the "
        "medians without noise (the fewest trials bisection needs).",
        "",
        "## The committed core counts",
        "",
        HEAD, *(r.row() for r in committed), "", goal(committed), "",
        f"## Interpolated to {args.interpolate} cores (synthetic: log TTFT linear in log cores between the",
        "committed counts, sigma linear; the grid knee is that curve's)",
        "",
        HEAD, *(r.row() for r in fine), "", goal(fine), "",
        "## Fits (median / sigma per core count) and trial costs",
        "",
    ]
    for r in committed:
        c = r.costs
        window = "none (every trial starts)" if math.isnan(c.window_trial_s) else f"{c.window_trial_s:.0f} s"
        lines.append(f"- {r.label}: {r.curve.describe()}; {c.mode}: start trial {c.start_trial_s:.0f} s, "
                     f"window trial {window} ({c.how})")
    return "\n".join(lines) + "\n"


def tradeoff(runs: dict[int, list[tuple[bool, Result]]], args: argparse.Namespace) -> str:
    """One line per ``repeats.max`` and table: how often the search lands within one step, what it spends."""
    lines = ["", "## Trade-off: repeats.max", "",
             f"min {args.min}, until_ci {args.until_ci:.0%}. Per table: the configurations where every seed "
             "lands within one grid step of the grid's knee, the worst share of seeds that does, and the "
             "search's GPU-seconds over the grid's (mean over configurations, and the largest).", "",
             "| repeats.max | table | every seed <=1 step | worst <=1 step | GPU-s ratio mean | largest |",
             "|---|---|---|---|---|---|"]
    first = next(iter(runs.values()))
    for fine, name in ((False, "committed"), (True, "interpolated")):
        rs = [r for f, r in first if f is fine]
        lines.append(f"| (grid x {args.grid_repeats}, measured again) | {name} "
                     f"| {sum(r.share(r.regrid, 1) == 1.0 for r in rs)} of {len(rs)} "
                     f"| {min(r.share(r.regrid, 1) for r in rs):.0%} | 100% | 100% |")
    for top, results in runs.items():
        for fine, name in ((False, "committed"), (True, "interpolated")):
            rs = [r for f, r in results if f is fine]
            lines.append(f"| {top} | {name} | {sum(r.share(r.found, 1) == 1.0 for r in rs)} of {len(rs)} "
                         f"| {min(r.share(r.found, 1) for r in rs):.0%} | {np.mean([r.ratio for r in rs]):.0%} "
                         f"| {max(r.ratio for r in rs):.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--grid-repeats", type=int, default=3)
    ap.add_argument("--min", type=int, default=2)
    ap.add_argument("--max", type=int, default=6)
    ap.add_argument("--until-ci", type=float, default=0.05)
    ap.add_argument("--default-spread", type=float, default=0.08, help="sigma of log p50 where one repeat")
    ap.add_argument("--interpolate", default="1,2,3,4,6,8,12", help="the finer grid of the second table")
    ap.add_argument("--tradeoff", default="2,3", help="other repeats.max values for the trade-off table")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    loaded = [(src, trial_rows(src)) for src in SOURCES]
    for _, rows in loaded:
        for col in CONFIG:
            rows[col] = rows[col].fillna("-") if col in rows else "-"
    costs = costs_for(loaded)
    fine_cores = [int(c) for c in args.interpolate.split(",")]
    cases = []  # (interpolated?, label, curve, knee, costs) of both tables
    for src, rows in loaded:
        for workload, g in rows.groupby("workload"):
            label = f"{src.name} {workload} ({g['start'].iloc[0]})"
            curve = Curve.fit(g, args.default_spread)
            cost = costs[f"{src.name}|{workload}"]
            cases.append((False, label, curve, committed_knee(label, g.reset_index(drop=True), args.tolerance), cost))
            if len(curve.allowed) > 2:
                finer = curve.interpolated(fine_cores)
                cases.append((True, label, finer, finer.knee(args.tolerance), cost))
    runs = {}
    for top in sorted({args.max, *(int(m) for m in args.tradeoff.split(",") if m)}):
        policy = RepeatPolicy(args.min, top, args.until_ci)
        runs[top] = [(fine, simulate(label, curve, knee, cost, args, policy))
                     for fine, label, curve, knee, cost in cases]
    committed = [r for fine, r in runs[args.max] if not fine]
    fine = [r for f, r in runs[args.max] if f]
    text = markdown(committed, fine, args) + tradeoff(runs, args)
    print(text)
    args.out.write_text(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
