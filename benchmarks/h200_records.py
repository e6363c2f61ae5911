"""Gather a finished sweep's per-request records and per-window figures from an orchestrator home, for
``benchmarks/results/``: every trial's ``records.parquet`` (MLflow artifacts) with the trial's axes added
(``trial_id``, ``cores``, ``repeat``, ``restriction``, ``api_servers``, ``workload``, ``stack``, and a search's ``search_step`` and
``search_reason``), and one row per window of the trial's logged metrics that the H200 notes quote.

Usage: ``python benchmarks/h200_records.py HOME SWEEP OUT_DIR`` writes ``OUT_DIR/SWEEP-records.parquet`` and
``OUT_DIR/SWEEP-windows.csv``. Reads the home's files only; starts nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

AXES = ("trial_id", "cores", "repeat", "restriction", "api_servers", "workload", "stack", "search_step", "search_reason")
WINDOW_METRICS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "num_records", "window_span_s", "startup_s",
                  "replica_cpu_util_mean", "replica_tree_cpu_s", "cpu_s_api_server", "cpu_s_engine_core",
                  "cpu_s_gpu_worker", "runq_wait_s_api_server", "runq_wait_s_engine_core", "api_server_threads",
                  "engine_core_threads", "cgroup_periods", "cgroup_throttled_periods", "cgroup_throttled_frac",
                  "cgroup_throttled_s", "gpu0_util_mean", "gpu0_sm_clock_mhz_mean", "gpu0_power_w_mean",
                  "gpu0_clock_slowdown_mean", "completion_tokens_mean")
# Stack categories (telemetry.stacks): CPU-s per request of each role in each category, every one the window logged.
CATEGORY_PREFIX = "cpu_s_per_req_"


def gather(home: Path, sweep: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    records, windows = [], []
    for result in sorted((home / "mlflow" / "artifacts").glob("*/*/artifacts/result.json")):
        r = json.loads(result.read_text())
        if r.get("sweep") != sweep or r.get("kind", "trial") != "trial" or r.get("error_kind") != "none":
            continue
        params, metrics = r.get("params", {}), r.get("metrics", {})
        axes = {"trial_id": r["trial_id"], **{k: params.get(k) for k in AXES[1:]}}
        axes["cores"], axes["repeat"] = int(axes["cores"]), int(axes["repeat"])
        categories = {k: v for k, v in metrics.items() if k.startswith(CATEGORY_PREFIX) and "." in k}
        windows.append({**axes, **{k: metrics.get(k) for k in WINDOW_METRICS}, **categories,
                        "started_at": r.get("started_at"), "ended_at": r.get("ended_at")})
        path = result.with_name("records.parquet")
        if path.is_file():
            d = pd.read_parquet(path)
            for k, v in axes.items():
                d[k] = v
            records.append(d)
    if not windows:
        raise SystemExit(f"{home}: no completed trial of sweep {sweep!r}")
    w = pd.DataFrame(windows).sort_values("started_at").reset_index(drop=True)
    return (pd.concat(records, ignore_index=True) if records else pd.DataFrame()), w.dropna(axis=1, how="all")


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    home, sweep, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    records, windows = gather(home, sweep)
    out.mkdir(parents=True, exist_ok=True)
    records.to_parquet(out / f"{sweep}-records.parquet", index=False)
    windows.to_csv(out / f"{sweep}-windows.csv", index=False)
    print(f"{sweep}: {len(windows)} windows, {len(records)} requests -> {out}")


if __name__ == "__main__":
    main()
