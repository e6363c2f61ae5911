"""The tables a finished sweep prints on the terminal: TTFT against cores, start modes, reference clients."""

from __future__ import annotations

from rich.console import Console

from orchestrator.observe.report.comparison import calibration, comparison, references, render, spread_warnings


def print_tables(console: Console, frame, sweep_name: str, spread_warn: float = 0.10, tolerance: float = 0.10):
    """Print the comparison (and each start mode against fresh, when the sweep has more than one); return it.

    Repeats are aggregated; a configuration whose repeats disagree by more than ``spread_warn`` at
    TTFT p50 is flagged in the table ("!") and named below it. ``tolerance``: the knee's (see
    ``report.comparison``)."""
    table = comparison(frame, tolerance=tolerance, spread_warn=spread_warn)
    if len(table):
        console.print(render(table, title=f"{sweep_name}: TTFT against cores"))
        for line in spread_warnings(table, spread_warn):
            console.print(f"  warning: {line}")
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


__all__ = ["print_tables"]
