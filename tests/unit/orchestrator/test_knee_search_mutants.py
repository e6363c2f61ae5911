"""Edges of the knee search's pure decisions (orchestrator.plan.knee_search) that test_knee_search.py leaves
open, found by mutation testing (tests/MUTATION.md): a count with no windows yet, the minimum step's order,
a partial estimate, the bracket at the settled stop, which counts the narrowing step wants, a count without
a window figure, and the ``until_ci`` edge."""

from __future__ import annotations

import math

import pytest
from fakes import GRID, Est

from orchestrator.plan.knee_search import Reason, Stop, next_cores, relative_half_width


def test_a_count_with_no_windows_yet_is_not_measured():
    """Pins ``have`` keeping only counts with at least one window (``n > 0``)."""
    d = next_cores(GRID, {12: 0}, Est(None, None, None), 3)
    assert (d.cores, d.reason) == (12, Reason.MOST)
    d = next_cores(GRID, {1: 0, 12: 1}, Est(12, 12, 12), 3)
    assert (d.cores, d.reason) == (1, Reason.FEWEST)


def test_the_minimum_goes_to_the_fewest_windows_before_the_fewest_cores():
    """Pins the MINIMUM step's order: fewest windows first, then fewest cores (not just the fewest cores)."""
    d = next_cores(GRID, {1: 2, 4: 1, 12: 1}, Est(4, 4, 4), 3, min_windows=3)
    assert (d.cores, d.reason) == (4, Reason.MINIMUM)
    d = next_cores(GRID, {1: 2, 4: 2, 12: 1}, Est(4, 4, 4), 3, min_windows=3)
    assert (d.cores, d.reason) == (12, Reason.MINIMUM)


@pytest.mark.parametrize("est", [Est(4, None, 6), Est(None, 2, 4), Est(4, 2, None), Est(None, None, 4)])
def test_an_estimate_missing_any_of_knee_low_high_is_no_knee(est):
    """Pins the NO_KNEE guard: knee, low or high missing, each alone, stops the search (no bisect, no crash)."""
    d = next_cores(GRID, {1: 1, 12: 1}, est, 3)
    assert d.done and d.stop is Stop.NO_KNEE and d.reason is None


def test_settled_needs_only_the_count_just_below_the_knee():
    """Pins the bracket clause of the SETTLED stop: it looks at the count just below the knee (``grid[i - 1]``),
    not the one above it nor two below, and a knee at the most cores is settled too."""
    # the count above the knee (6) unmeasured: still settled
    assert next_cores(GRID, {1: 1, 2: 1, 3: 2, 4: 2, 12: 1}, Est(4, 4, 6), 3).stop is Stop.SETTLED
    # the count two below the knee (2) unmeasured: still settled
    assert next_cores(GRID, {1: 1, 3: 2, 4: 2, 12: 1}, Est(4, 4, 6), 3).stop is Stop.SETTLED
    # the knee at the most cores, the count below it measured
    assert next_cores(GRID, {1: 1, 8: 2, 12: 2}, Est(12, 8, 12), 3).stop is Stop.SETTLED


def test_narrowing_wants_the_low_end_of_the_interval():
    """Pins ``est.low <= c``: the interval's low end is a count the narrowing step may add a window to."""
    # low == knee: the knee, among equals, is first
    d = next_cores(GRID, {1: 1, 3: 1, 4: 1, 8: 1, 12: 1}, Est(4, 4, 8), 3)
    assert (d.cores, d.reason) == (4, Reason.NARROW)
    # low below the measured count under the knee: it is the only count with room
    d = next_cores(GRID, {1: 1, 2: 1, 3: 3, 4: 3, 12: 3}, Est(4, 2, 6), 3)
    assert (d.cores, d.reason) == (2, Reason.NARROW)


def test_narrowing_wants_the_measured_count_just_below_the_knee():
    """Pins ``{max(below)}`` in the wanted set: the count under the knee, outside the interval, gets a window
    when it has the fewest."""
    d = next_cores(GRID, {1: 1, 3: 1, 4: 2, 8: 2, 12: 2}, Est(4, 4, 8), 3)
    assert (d.cores, d.reason) == (3, Reason.NARROW)


def test_narrowing_with_the_knee_at_the_fewest_cores():
    """Pins ``if below``: a knee at the fewest cores has nothing below it, and an unsettled interval is
    narrowed there (no crash on an empty ``below``)."""
    d = next_cores(GRID, {1: 1, 12: 1}, Est(1, 1, 3), 3)
    assert (d.cores, d.reason) == (1, Reason.NARROW)


def test_relative_half_width_is_inf_without_figures_or_without_a_positive_mean():
    """Pins the guard of relative_half_width: no figures (no mean to take) and a mean of 0 give inf, not an
    error."""
    assert relative_half_width([]) == math.inf
    assert relative_half_width([0.0, 0.0]) == math.inf
    assert relative_half_width([-1.0, 1.0]) == math.inf
    assert relative_half_width([-2.0, -1.0]) == math.inf


def test_until_ci_gives_a_count_without_window_figures_another_window():
    """Pins ``figures.get(c, [])``: a measured count with no window figure (its windows timed out) is never
    known closely enough, so with ``until_ci`` it still gets a window."""
    tight = ((4, 0.5), (4, 0.5), (8, 0.4), (8, 0.4), (12, 0.4), (12, 0.4))  # 3 has none
    d = next_cores(GRID, {1: 1, 3: 2, 4: 2, 8: 2, 12: 2}, Est(4, 4, 8, tight), 3, until_ci=0.05)
    assert (d.cores, d.reason) == (3, Reason.NARROW)


def test_until_ci_is_inclusive():
    """Pins ``<= until_ci``: a count whose relative half-width equals ``until_ci`` exactly is known closely
    enough; just above it, it is not."""
    figs = ((3, 1.0), (3, 1.1), (4, 0.5), (4, 0.5), (8, 0.4), (8, 0.4), (12, 0.4), (12, 0.4))
    have = {1: 1, 3: 2, 4: 2, 8: 2, 12: 2}
    width = relative_half_width([1.0, 1.1])
    assert 0 < width < math.inf
    assert next_cores(GRID, have, Est(4, 4, 8, figs), 3, until_ci=width).stop is Stop.REPEAT_CAP
    d = next_cores(GRID, have, Est(4, 4, 8, figs), 3, until_ci=math.nextafter(width, 0.0))
    assert (d.cores, d.reason) == (3, Reason.NARROW)
