"""The drift test: repeats that moved together in every configuration (orchestrator.observe.analysis.drift)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.observe.analysis.drift import repeat_drift
from orchestrator.observe.report.comparison import drift_warning

CELL = ["workload", "cores"]


def windows(offsets: list[float], *, noise: float = 0.01, seed: int = 0, shuffled: bool = False,
            cells: tuple[tuple[str, int], ...] = (("a", 1), ("a", 2), ("b", 1), ("b", 2))) -> pd.DataFrame:
    """One window per cell and repeat, interleaved (repeat-major) in time; each repeat's windows read
    ``exp(offset)`` times their cell's level, with log-normal ``noise``."""
    rng = np.random.default_rng(seed)
    level = {c: 0.05 * (i + 1) for i, c in enumerate(cells)}
    rows = []
    for r, off in enumerate(offsets):
        for c in cells:
            rows.append({"workload": c[0], "cores": c[1], "repeat": r, "status": "COMPLETED",
                         "ttft_mean_s": level[c] * math.exp(off + rng.normal(0, noise))})
    d = pd.DataFrame(rows)
    order = rng.permutation(len(d)) if shuffled else np.arange(len(d))
    d["window_span_start_unix"] = 1_800_000_000.0 + 20.0 * np.argsort(order)
    return d


def test_a_shared_drift_is_found_with_its_offsets():
    drift = repeat_drift(windows([-0.07, -0.03, 0.0, 0.04, 0.09]), CELL)
    assert drift is not None and drift.drifted
    assert drift.repeats == (0, 1, 2, 3, 4) and drift.cells == 4 and drift.windows == 20
    # the offsets are each repeat's against the cells' means (the mean of the five is 0.006)
    assert drift.offsets == pytest.approx([math.expm1(o - 0.006) for o in (-0.07, -0.03, 0.0, 0.04, 0.09)], abs=0.012)
    assert drift.between_after < drift.between / 3 and drift.p_value < 1e-6
    said = drift.sentence()
    assert "repeats 0-4 read -7%, -3%, -1%, +2%, +9% in every configuration" in said


def test_windows_that_only_scatter_are_no_drift():
    for seed in range(5):
        drift = repeat_drift(windows([0.0] * 5, noise=0.05, seed=seed), CELL)
        assert drift is not None and not drift.drifted


def test_a_small_shared_offset_is_not_worth_a_warning():
    drift = repeat_drift(windows([-0.02, 0.0, 0.02], noise=0.001), CELL)
    assert drift is not None and drift.p_value < 0.01 and drift.largest < 0.05 and not drift.drifted


def test_it_applies_only_to_repeats_that_are_blocks_in_time():
    assert repeat_drift(windows([-0.1, 0.0, 0.1], shuffled=True, seed=3), CELL) is None
    assert repeat_drift(windows([-0.1, 0.1]), CELL) is None                       # two repeats
    assert repeat_drift(windows([-0.1, 0.0, 0.1], cells=(("a", 1),)), CELL) is None  # one cell


def test_a_cell_missing_from_a_repeat_is_left_out():
    d = windows([-0.08, 0.0, 0.08])
    d = d[~((d["workload"] == "b") & (d["cores"] == 2) & (d["repeat"] == 1))]
    drift = repeat_drift(d, CELL)
    assert drift is not None and drift.cells == 3 and drift.windows == 9 and drift.drifted


def test_the_report_warns_over_completed_trials_only():
    d = windows([-0.08, 0.0, 0.08])
    assert "moved together" in (drift_warning(d) or "")
    d.loc[d["repeat"] == 2, "status"] = "FAILED"  # two repeats left: the test does not apply
    assert drift_warning(d) is None
    assert drift_warning(windows([0.0] * 4, noise=0.03)) is None
