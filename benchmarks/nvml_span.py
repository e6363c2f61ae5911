"""GPU utilisation per trial, the product's figure against an NVML sampler outside it, over the same span.

The product's ``gpu0_util_mean`` is the mean of its own sampler's rows inside the window's requests'
span (first send to last completion). This reads an independent sampler's log, written during the
sweep by ``nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 100``,
and averages it over each trial's ``window_span_start_unix``..``window_span_end_unix`` (from the
report's ``trials.csv``). A figure that a simpler method contradicts is a bug until explained.

Run: ``python benchmarks/nvml_span.py REPORT_DIR/trials.csv NVIDIA_SMI.log [--csv OUT]``.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

import pandas as pd


def read_smi(path: str) -> pd.DataFrame:
    """nvidia-smi's CSV lines (``2026/12/02 18:40:01.123, 97``) -> (unix seconds, util %)."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 2:
                continue
            try:
                t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((t, float(parts[1].rstrip(" %"))))
            except ValueError:
                continue
    return pd.DataFrame(rows, columns=["t", "util"])


def compare(trials: pd.DataFrame, smi: pd.DataFrame) -> pd.DataFrame:
    """Per trial: cores, repeat, the product's gpu0_util_mean and the sampler's mean over the same span."""
    out = []
    for _, r in trials.iterrows():
        t0, t1 = r.get("window_span_start_unix"), r.get("window_span_end_unix")
        if pd.isna(t0) or pd.isna(t1):
            continue
        inside = smi[(smi["t"] >= t0) & (smi["t"] <= t1)]
        out.append({"trial_id": r["trial_id"], "workload": r.get("workload"), "cores": r["cores"],
                    "repeat": r.get("repeat"), "span_s": round(t1 - t0, 2),
                    "product_gpu_util": r.get("gpu0_util_mean"),
                    "nvml_gpu_util": inside["util"].mean() if len(inside) else float("nan"),
                    "nvml_samples": len(inside)})
    df = pd.DataFrame(out)
    if len(df):
        df["difference_points"] = df["product_gpu_util"] - df["nvml_gpu_util"]
    return df


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trials_csv")
    ap.add_argument("smi_log")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    df = compare(pd.read_csv(args.trials_csv), read_smi(args.smi_log))
    if df.empty:
        print("no trial with a span (window_span_start_unix) in", args.trials_csv, file=sys.stderr)
        return 2
    print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    by = df.groupby("cores")[["product_gpu_util", "nvml_gpu_util", "difference_points"]].mean()
    print("\nmeans per core count:\n" + by.to_string(float_format=lambda v: f"{v:.1f}"))
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
