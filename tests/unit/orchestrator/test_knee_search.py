"""The knee search's pure decisions (orchestrator.plan.knee_search) with a fake estimate: the order of the
steps, the stop rules and the budget."""

from __future__ import annotations

import pytest
from fakes import GRID, Est

from orchestrator.plan.knee_search import Reason, Stop, budget_stop, gpu_seconds, next_cores, relative_half_width

NONE = Est(None, None, None)


def test_the_most_cores_first_then_the_fewest():
    assert next_cores(GRID, {}, NONE, 3) == next_cores(GRID, {4: 0}, NONE, 3)
    first = next_cores(GRID, {}, NONE, 3)
    assert (first.cores, first.reason) == (12, Reason.MOST)
    second = next_cores(GRID, {12: 1}, Est(12, 12, 12), 3)
    assert (second.cores, second.reason) == (1, Reason.FEWEST)


def test_every_measured_count_gets_the_minimum_fewest_windows_first():
    d = next_cores(GRID, {1: 1, 12: 2, 4: 1}, Est(4, 4, 4), 3, min_windows=2)
    assert (d.cores, d.reason) == (1, Reason.MINIMUM)
    d = next_cores(GRID, {1: 2, 12: 2, 4: 1}, Est(4, 4, 4), 3, min_windows=2)
    assert (d.cores, d.reason) == (4, Reason.MINIMUM)
    # a minimum above the cap is the cap
    assert next_cores(GRID, {1: 2, 12: 2}, Est(12, 12, 12), 2, min_windows=5).reason is Reason.BISECT


def test_bisects_between_the_knee_and_the_largest_measured_count_below_it():
    d = next_cores(GRID, {1: 1, 12: 1}, Est(12, 8, 12), 3)
    assert (d.cores, d.reason) == (4, Reason.BISECT)  # grid[(6 + 0) // 2]
    d = next_cores(GRID, {1: 1, 4: 1, 12: 1}, Est(4, 4, 6), 3)
    assert (d.cores, d.reason) == (2, Reason.BISECT)
    d = next_cores(GRID, {1: 1, 2: 1, 4: 1, 12: 1}, Est(4, 3, 4), 3)
    assert (d.cores, d.reason) == (3, Reason.BISECT)


def test_stops_settled_when_the_interval_spans_one_step_and_the_count_below_is_measured():
    d = next_cores(GRID, {1: 1, 2: 2, 3: 2, 4: 1, 12: 1}, Est(3, 3, 4), 3)
    assert d.done and d.stop is Stop.SETTLED and d.reason is None
    # the fewest cores as the knee needs nothing below it
    assert next_cores(GRID, {1: 2, 12: 1}, Est(1, 1, 2), 3).stop is Stop.SETTLED


def test_a_settled_knee_with_one_window_there_or_below_gets_a_second_first():
    """One window at the knee or at the count below it leaves window-to-window noise out of the interval:
    the count below first, then the knee; a cap of one window a count stops at once."""
    d = next_cores(GRID, {1: 1, 2: 1, 3: 1, 4: 1, 12: 1}, Est(3, 3, 4), 3)
    assert (d.cores, d.reason, d.stop) == (2, Reason.KNEE_NOISE, None)
    d = next_cores(GRID, {1: 1, 2: 2, 3: 1, 4: 1, 12: 1}, Est(3, 3, 4), 3)
    assert (d.cores, d.reason) == (3, Reason.KNEE_NOISE)
    assert next_cores(GRID, {1: 1, 2: 1, 3: 1, 4: 1, 12: 1}, Est(3, 3, 4), 1).stop is Stop.SETTLED
    d = next_cores(GRID, {1: 1, 12: 1}, Est(1, 1, 2), 3)  # the knee at the fewest cores: itself only
    assert (d.cores, d.reason) == (1, Reason.KNEE_NOISE)
    assert next_cores(GRID, {1: 1, 2: 1, 12: 1}, Est(2, 2, 3), 3).cores == 1


def test_an_unsettled_interval_gets_a_window_fewest_windows_first_the_knee_among_equals():
    have = {1: 1, 2: 2, 3: 1, 4: 1, 12: 2}
    d = next_cores(GRID, have, Est(3, 2, 6), 3)
    assert (d.cores, d.reason) == (3, Reason.NARROW)
    d = next_cores(GRID, {**have, 3: 2}, Est(3, 2, 6), 3)
    assert (d.cores, d.reason) == (4, Reason.NARROW)  # the only one inside with one window
    # the most cores is always wanted: the best is measured there
    d = next_cores(GRID, {1: 1, 2: 3, 3: 3, 4: 3, 12: 1}, Est(3, 2, 4), 3)
    assert (d.cores, d.reason) == (12, Reason.NARROW)


def test_stops_at_the_repeat_cap():
    d = next_cores(GRID, {1: 1, 2: 3, 3: 3, 4: 3, 12: 3}, Est(3, 2, 4), 3)
    assert d.stop is Stop.REPEAT_CAP


def test_until_ci_leaves_out_a_count_known_closely_enough():
    have = {1: 1, 2: 2, 3: 2, 4: 1, 12: 2}
    close = Est(3, 2, 4, ((2, 1.0), (2, 1.01), (3, 0.5), (3, 0.5), (12, 0.4), (12, 0.401)))
    assert next_cores(GRID, have, close, 3).cores == 4  # the count with one window first either way
    have[4] = 3
    assert next_cores(GRID, have, close, 3).cores == 3  # off: the knee among equals
    assert next_cores(GRID, have, close, 3, until_ci=0.05).stop is Stop.REPEAT_CAP
    wide = Est(3, 2, 4, ((2, 1.0), (2, 2.0), (3, 0.5), (3, 0.9), (12, 0.4), (12, 0.8)))
    assert next_cores(GRID, have, wide, 3, until_ci=0.05).cores == 3


def test_relative_half_width_of_the_t_interval():
    assert relative_half_width([1.0, 3.0]) == pytest.approx(6.3138 * 2 ** 0.5 / 2 ** 0.5 / 2, rel=1e-4)
    assert relative_half_width([1.0]) == float("inf")


def test_no_knee_when_no_window_counts():
    assert next_cores(GRID, {1: 1, 12: 1}, NONE, 3).stop is Stop.NO_KNEE


def test_budget():
    assert budget_stop(3, 0.0, max_trials=3, max_gpu_hours=None) is Stop.MAX_TRIALS
    assert budget_stop(2, 1e9, max_trials=3, max_gpu_hours=None) is None
    assert budget_stop(1, 1800.0, max_trials=None, max_gpu_hours=0.5) is Stop.MAX_GPU_HOURS
    assert budget_stop(1, 1799.0, max_trials=None, max_gpu_hours=0.5) is None
    assert budget_stop(99, 1e9, max_trials=None, max_gpu_hours=None) is None


def test_gpu_seconds_count_gpus_and_a_cpu_trial_once():
    assert gpu_seconds(100.0, 130.0, 0) == 30.0
    assert gpu_seconds(100.0, 130.0, 2) == 60.0
    assert gpu_seconds(130.0, 100.0, 2) == 0.0
