"""How well does the predicted knee predict? Leave-one-core-count-out on measured sweeps.

For every configuration (the factors other than cores and the repeat) in every result CSV under
``benchmarks/results`` that has ``cores`` and ``ttft_p50_s`` columns (``orchestrator report --csv``
tables, or one row per trial, whose repeats are aggregated here by their median), and in any CSV
given on the command line, this prints:

  * the model fitted on all core counts (``orchestrator.observe.analysis.predict``): its parameters and
    in-sample error;
  * per core count: the measured TTFT p50, the prediction of the model fitted without it, the
    error, and the in-sample fit;
  * the knee (fewest cores within ``--tolerance`` of the best p50): measured, predicted from all
    core counts, and predicted by each leave-one-out fit; and the vLLM docs' rule of thumb of
    2 + N cores for N GPUs against both;
  * the predicted curve at 1, 2, 3, 4, 6, 8, 12 and 16 cores;

and a summary over all configurations: held-out core counts within 10% (interior core counts,
which the others bracket, apart from the ends, which need extrapolation), knees within one step of
the measured grid. ``--threads auto,2,4,fit`` repeats the summary for each thread count ``k`` (the
first one gets the full tables; ``auto`` is ``1 + api_servers + gpus``; ``fit`` chooses k where a
configuration has at least 5 core counts, and is ``auto`` elsewhere).

    python benchmarks/predict_bench.py [extra.csv ...] [--threads auto] [--tolerance 0.10] [--loop closed]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from orchestrator.observe.analysis.predict import fit, holdout, rule_of_thumb_cores
from orchestrator.observe.report.comparison import CONFIG

RESULTS = Path(__file__).resolve().parent / "results"
CURVE = [1, 2, 3, 4, 6, 8, 12, 16]


def configurations(path: Path) -> list[tuple[str, pd.DataFrame]]:
    """One frame per configuration of a result CSV, one row per core count (repeats: medians)."""
    df = pd.read_csv(path)
    keys = [c for c in CONFIG if c in df]
    out = []
    for key, g in df.groupby(keys, dropna=False, sort=True) if keys else [((), df)]:
        if g["cores"].duplicated().any():
            numeric = g.select_dtypes("number").columns.drop("cores")
            g = g.groupby("cores", as_index=False).agg({**{c: "median" for c in numeric},
                                                         **{c: "first" for c in keys}})
        values = key if isinstance(key, tuple) else (key,)
        named = dict(zip(keys, values))
        head = f"{named.pop('model')} on {named.pop('hardware')}, " if {"model", "hardware"} <= set(named) else ""
        label = head + " ".join(f"{k}={v}" for k, v in named.items())
        out.append((label, g.sort_values("cores").reset_index(drop=True)))
    return out


def steps(grid: list[int], a: int | None, b: int | None) -> int | None:
    """How many core counts of ``grid`` apart two knees are."""
    if a is None or b is None or pd.isna(a) or pd.isna(b):
        return None
    return abs(grid.index(int(a)) - grid.index(int(b)))


def run(sources: list[tuple[str, Path]], threads: int | str | None, tolerance: float, loop: str,
        verbose: bool) -> dict[str, list]:
    tally: dict[str, list] = {"interior": [], "ends": [], "knee_all": [], "knee_holdout": []}
    for name, path in sources:
        for label, rows in configurations(path):
            gpus = int(rows["gpus"].iloc[0]) if "gpus" in rows and rows["gpus"].notna().any() else 1
            model = fit(rows, threads=threads, loop=loop)
            h = holdout(rows, tolerance=tolerance, threads=threads, loop=loop)
            grid = [int(c) for c in h["cores"]]
            if verbose:
                print(f"\n== {name}: {label}")
            if model is None:
                if verbose:
                    print("   no fit: the rows leave too little to fit (fewer than 3 usable core counts)")
                continue
            p = model.params
            if verbose:
                print(f"   fit on all {len(grid)} core counts: G (GPU-side TTFT) {1000 * p['gpu_ttft_s']:.1f} ms, "
                      f"S (CPU work per request) {1000 * p['cpu_work_s']:.1f} ms, k {model.threads} threads, "
                      f"load {model.load:.1f} {'in flight' if loop == 'closed' else 'req/s'}, "
                      f"decode {1000 * model.decode_s:.0f} ms; in-sample rms error {model.fit_error_rms:.1%}")
                print("   cores  measured ms  held-out prediction ms   error  in-sample ms  knee without it  held out")
            for i, r in h.iterrows():
                held = not math.isnan(r["predicted_s"])
                where = "end" if i in (0, len(h) - 1) else "interior"
                if held:
                    tally["ends" if where == "end" else "interior"].append(r["error"])
                    tally["knee_holdout"].append(steps(grid, r["knee_holdout"], r["knee_measured"]))
                if verbose:
                    pred = f"{1000 * r['predicted_s']:22.1f}  {r['error']:+6.1%}" if held else f"{'-':>22}  {'-':>6}"
                    knee = "-" if not held else str(int(r["knee_holdout"]))
                    print(f"   {r['cores']:5d}  {1000 * r['measured_s']:11.1f}  {pred}  {1000 * r['fitted_s']:12.1f}"
                          f"  {knee:>15}  {where if held else '-':>8}" + (f"   ({r['note']})" if r["note"] else ""))
            km, kp = int(h["knee_measured"].iloc[0]), int(h["knee_predicted"].iloc[0])
            tally["knee_all"].append(steps(grid, kp, km))
            if verbose:
                rule = rule_of_thumb_cores(gpus)
                best = float(h["measured_s"].min())
                at_rule = model.predict_ttft_p50(rule)
                measured_at = dict(zip(grid, h["measured_s"]))
                print(f"   knee ({tolerance:.0%}): measured {km}, predicted from all core counts {kp} "
                      f"({steps(grid, kp, km)} step(s) apart on the measured grid); over {CURVE}: "
                      f"{model.knee(CURVE, tolerance)}")
                there = (f"measured {1000 * measured_at[rule]:.1f} ms" if rule in measured_at
                         else f"not measured, predicted {1000 * at_rule:.1f} ms")
                print(f"   2+N rule ({gpus} GPU): {rule} cores, {there}: {(measured_at.get(rule, at_rule)) / best - 1:+.1%}"
                      f" against the best measured p50 ({1000 * best:.1f} ms); measured knee {km} "
                      f"({'at or below' if km <= rule else 'above'} the rule)")
                print("   predicted curve ms: " + "  ".join(f"{c}:{1000 * model.predict_ttft_p50(c):.0f}"
                                                          for c in CURVE))
    return tally


def summary(tally: dict[str, list], label: str) -> str:
    def within(errs: list[float]) -> str:
        return f"{sum(abs(e) <= 0.10 for e in errs)}/{len(errs)}"

    errs = tally["interior"] + tally["ends"]
    knees = [s for s in tally["knee_all"] if s is not None]
    held = [s for s in tally["knee_holdout"] if s is not None]
    mean = sum(abs(e) for e in errs) / len(errs) if errs else math.nan
    return (f"{label}: held-out TTFT p50 within 10%: {within(errs)} (interior {within(tally['interior'])}, "
            f"ends {within(tally['ends'])}); mean |error| {mean:.1%}; "
            f"interior {', '.join(f'{e:+.1%}' for e in tally['interior'])}; "
            f"ends {', '.join(f'{e:+.1%}' for e in tally['ends'])}; "
            f"knee from all points within one step: {sum(s <= 1 for s in knees)}/{len(knees)}; "
            f"knee of each leave-one-out fit within one step: {sum(s <= 1 for s in held)}/{len(held)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="*", type=Path, help="more result CSVs (orchestrator report --csv)")
    ap.add_argument("--threads", default="auto",
                    help="k, or a comma list of them (auto: 1 + api_servers + gpus; fit: chosen by the fit)")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--loop", choices=["closed", "open"], default="closed")
    args = ap.parse_args()
    sources = []
    for path in sorted(RESULTS.rglob("*.csv")) + list(args.csv):
        cols = pd.read_csv(path, nrows=0).columns
        missing = [c for c in ("cores", "ttft_p50_s") if c not in cols]
        name = str(path.relative_to(RESULTS)) if path.is_relative_to(RESULTS) else str(path)
        if missing:
            print(f"skipped {name}: no column {', '.join(missing)}")
            continue
        sources.append((name, path))
    lines = []
    for i, t in enumerate(args.threads.split(",")):
        t = t.strip()
        threads = None if t == "auto" else t if t == "fit" else int(t)
        tally = run(sources, threads, args.tolerance, args.loop, verbose=i == 0)
        lines.append(summary(tally, f"k={t}"))
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
