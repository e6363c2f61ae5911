"""Start-up before and after: two sweeps of the same load, one with vLLM's start-up defaults and one
with the cuts (``start: sized``, ``server.kv_cache_bytes``, ``server.cudagraph_sizes``, shared starts).

Reads the report folders ``orchestrator run`` writes (``<home>/reports/<sweep>/trials.csv`` and
``time_use.json``; ``orchestrator report SWEEP`` writes them again) and prints, per core count, TTFT
p50/p90 of each sweep (the median over its repeats), the ratios (after / before), whether both lie
within 10%, the after sweep's own repeat spread; then each sweep's start-up by phase (the mean over its
starts, in seconds) and its time use (the share of GPU-held time inside windows).

    python benchmarks/startup_compare.py h200-startup-before h200-startup-after [--home DIR] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

PHASES = ("imports", "engine_spawn", "workers", "weights", "compile", "graph_capture", "engine_init", "api")


def load(reports: Path, sweep: str) -> tuple[pd.DataFrame, dict[str, float]]:
    folder = reports / sweep
    trials = folder / "trials.csv"
    if not trials.exists():
        sys.exit(f"{trials}: no such file; run `orchestrator report {sweep}` first")
    frame = pd.read_csv(trials)
    frame = frame[frame["status"] == "COMPLETED"] if "status" in frame else frame
    use_path = folder / "time_use.json"
    use = json.loads(use_path.read_text()) if use_path.exists() else {}
    return frame, use


def spread(x: pd.Series) -> float:
    return float((x.max() - x.min()) / x.median()) if len(x) > 1 and x.median() > 0 else float("nan")


def ttft_table(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Per core count: both sweeps' TTFT p50/p90 (median over repeats), ratios after / before."""
    cols = ["ttft_p50_s", "ttft_p90_s"]
    b = before.groupby("cores")[cols].median().add_suffix("_before")
    a = after.groupby("cores")[cols].median().add_suffix("_after")
    out = b.join(a, how="outer")
    out["p50_ratio"] = out["ttft_p50_s_after"] / out["ttft_p50_s_before"]
    out["p90_ratio"] = out["ttft_p90_s_after"] / out["ttft_p90_s_before"]
    out["within_10pct"] = (out[["p50_ratio", "p90_ratio"]] - 1).abs().max(axis=1) <= 0.10
    out["after_p50_spread"] = after.groupby("cores")["ttft_p50_s"].agg(spread)
    out["before_p50_spread"] = before.groupby("cores")["ttft_p50_s"].agg(spread)
    return out.reset_index()


def startup_table(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per sweep and core count: the mean start-up by phase over the windows that followed a start."""
    rows = []
    for name, f in frames.items():
        starts = f[f["startup_s"].notna()] if "startup_s" in f else f.iloc[0:0]
        for cores, g in starts.groupby("cores"):
            row = {"sweep": name, "cores": cores, "starts": len(g), "startup_s": g["startup_s"].mean()}
            for p in PHASES:
                col = f"startup_{p}_s"
                if col in g:
                    row[p] = g[col].mean()
            if "repin_s" in g:
                row["pin_s"] = g["repin_s"].mean()
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--home", default=os.environ.get("ORCH_HOME", ".orchestrator"),
                    help="the orchestrator home the sweeps ran in (default: $ORCH_HOME)")
    ap.add_argument("--csv", default=None, help="also write the TTFT table here")
    args = ap.parse_args(argv)
    reports = Path(args.home) / "reports"
    before, use_b = load(reports, args.before)
    after, use_a = load(reports, args.after)
    pd.set_option("display.width", 200)
    fmt = {"float_format": lambda v: f"{v:.3f}"}
    table = ttft_table(before, after)
    print(f"TTFT: {args.after} against {args.before} (medians over repeats; ratio = after / before)")
    print(table.to_string(index=False, **fmt))
    print("\nstart-up by phase (mean seconds per start)")
    print(startup_table({args.before: before, args.after: after}).to_string(index=False, **fmt))
    print("\ntime use")
    for name, use in ((args.before, use_b), (args.after, use_a)):
        held = use.get("gpu_held_s") or use.get("core_held_s")
        unit = "gpu" if use.get("gpu_held_s") else "core"
        if not held:
            print(f"  {name}: no time-use figures")
            continue
        parts = ", ".join(f"{p} {use.get(f'{unit}_{p}_s', 0.0):.0f}" for p in
                          ("starting", "warmup", "window", "crosscheck", "teardown", "idle"))
        gap = use.get(f"{unit}_between_leases_s")
        print(f"  {name}: {held:.0f} {unit}-s held, {use.get(f'{unit}_window_share', 0.0):.1%} inside windows "
              f"({parts})" + (f"; {gap:.0f} between leases, {use.get(f'{unit}_node_window_share', 0.0):.1%} "
                              "counting them" if gap is not None else ""))
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"\nwritten to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
