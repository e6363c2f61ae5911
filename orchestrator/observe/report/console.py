"""The tables a finished sweep prints on the terminal: TTFT against cores, start modes, reference clients.

The terminal's comparison shows only what answers the sweep's question, within 120 columns
(:func:`~orchestrator.observe.report.comparison.render`); the frame returned, which the CSV is
written from, keeps every column.
"""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from orchestrator.observe.report.comparison import (
    CONFIG,
    calibration,
    comparison,
    drift_warning,
    references,
    render,
    spread_warnings,
)
from orchestrator.observe.report.tables import config_labels


def print_tables(console: Console, frame, sweep_name: str, spread_warn: float = 0.10, tolerance: float = 0.10):
    """Print the comparison (and each start mode against fresh, when the sweep has more than one); return it.

    Repeats are aggregated; a configuration whose repeats disagree by more than ``spread_warn`` at
    TTFT p50 is flagged in the table ("!") and named below it, and a sweep whose repeats moved together in every
    configuration (the machine drifted: ``comparison.drift_warning``) is said so. ``tolerance``: the knee's (see
    ``report.comparison``)."""
    table = comparison(frame, tolerance=tolerance, spread_warn=spread_warn)
    if len(table):
        shown = for_terminal(table, frame)
        rendered = render(shown, title=f"{sweep_name}: TTFT against cores")
        ranged = " [their range]" if shown["ttft_p50_lo"].notna().any() else ""
        rendered.caption = f"TTFT p50: median of repeats{ranged}, ! = they disagree; more in the CSV"
        console.print(rendered)
        for line in spread_warnings(table, spread_warn):
            console.print(f"  warning: {line}")
        drift = drift_warning(frame)
        if drift:
            console.print(f"  warning: {drift}")
    calib = calibration(frame)
    if len(calib):
        console.print("start modes against fresh starts at the same cores (ratio = mode / fresh):")
        console.print(calib.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    refs = references(frame)
    if len(refs):
        console.print("the harness against the reference clients (TTFT s, medians over repeats; "
                      "harness_vs_*: below 1 = the harness reads less):")
        show = [c for c in ("cores", "repeats", "harness_p50_s", "bare_p50_s", "vllm_bench_p50_s", "harness_p90_s",
                            "bare_p90_s", "vllm_bench_p90_s", "harness_vs_bare", "harness_vs_vllm_bench",
                            "gpu0_util_mean") if c in refs]
        console.print(refs[[c for c in ("workload",) if c in refs] + show].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
    return table


def for_terminal(table: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of :func:`comparison`'s ``table`` for :func:`render`: a ``configuration`` label per row
    (:func:`~orchestrator.observe.report.tables.config_labels`: model, workload and the factors that vary)
    and, where two or more repeats completed, ``ttft_p50_lo``/``ttft_p50_hi``, the lowest and highest of
    their TTFT p50 in ``frame`` (one row per trial). The bootstrap intervals need the requests' records,
    which the report reads; the terminal has only the trials' figures."""
    out = table.copy()
    labels = config_labels(out)
    out["configuration"] = [labels.get(tuple(r[c] for c in CONFIG), "") for _, r in out.iterrows()]
    out["ttft_p50_lo"] = out["ttft_p50_hi"] = float("nan")
    if frame.empty or "ttft_p50_s" not in frame or "status" not in frame:
        return out
    trials = frame.copy()
    for col in CONFIG:  # as report.comparison.aggregate keys them
        trials[col] = trials[col].fillna("-") if col in trials else "-"
    ok = trials[(trials["status"] == "COMPLETED") & trials["ttft_p50_s"].notna()]
    keys = [*CONFIG, "cores"]
    spans = ok.groupby(keys, dropna=False)["ttft_p50_s"].agg(["min", "max", "count"])
    spans = spans[spans["count"] >= 2]
    for i, r in out.iterrows():
        key = tuple(r[c] for c in keys)
        if key in spans.index:
            out.at[i, "ttft_p50_lo"], out.at[i, "ttft_p50_hi"] = spans.at[key, "min"], spans.at[key, "max"]
    return out


__all__ = ["for_terminal", "print_tables"]
