"""Mutation-testing kills for the span selection (``rows_in_span``) and the window series
(``window_series``, ``span_bounds``); see tests/MUTATION.md."""

from __future__ import annotations

import pytest

from orchestrator.node.telemetry import rows_in_span
from orchestrator.node.window_figures import span_bounds, window_series
from orchestrator.values.wire import WindowSpan


def series(name: str, times: list[float]) -> list[dict]:
    return [{"name": name, "t": t, "value": 10 * t} for t in times]


def picked(rows: list[dict], t0: float, t1: float) -> list[tuple[str, float]]:
    return [(r["name"], r["t"]) for r in rows_in_span(rows, t0, t1)]


def test_a_gauge_counts_at_its_reading_a_host_sample_at_its_periods_middle() -> None:
    rows = series("server_x", [0.0, 1.0, 2.0, 3.0]) + series("cpu", [0.0, 1.0, 2.0, 3.0])
    assert set(picked(rows, 1.0, 2.0)) == {("server_x", 1.0), ("server_x", 2.0), ("cpu", 2.0)}


def test_a_host_sample_moves_by_exactly_half_its_period() -> None:
    # period 1: the sample at 3 covers (2, 3], middle 2.5, inside [1.6, 2.6]; the one at 2 (middle 1.5) is not
    assert picked(series("cpu", [0.0, 1.0, 2.0, 3.0]), 1.6, 2.6) == [("cpu", 3.0)]


def test_the_period_is_the_smallest_gap_between_distinct_timestamps() -> None:
    # two rows at t=1 (a gap of 0) must not make the period 0
    assert picked(series("cpu", [1.0, 1.0, 2.0, 3.0]), 1.5, 2.5) == [("cpu", 2.0), ("cpu", 3.0)]
    assert picked(series("cpu", [0.0, 4.0, 5.0]), 4.0, 4.5) == [("cpu", 5.0)]  # period 1, not 4


def test_a_lone_sample_is_a_reading_at_its_time() -> None:
    assert picked(series("cpu", [1.0]), 1.0, 1.2) == [("cpu", 1.0)]
    assert picked(series("cpu", [1.0]), 0.8, 1.0) == [("cpu", 1.0)]


def test_a_span_shorter_than_the_period_keeps_the_samples_overlapping_it() -> None:
    rows = series("cpu", [0.0, 2.0, 4.0])  # period 2: the sample at t covers (t - 2, t]
    assert picked(rows, 2.0, 2.5) == [("cpu", 4.0)]  # the sample ending at 2 covers nothing after 2
    assert picked(rows, 1.5, 2.0) == [("cpu", 2.0)]  # the one at 4 starts at 2: no overlap with [1.5, 2]
    assert picked(rows, 2.1, 2.9) == [("cpu", 4.0)]


def test_a_gauge_outside_a_short_span_is_left_out() -> None:
    rows = series("server_x", [0.0, 2.0, 4.0])
    assert picked(rows, 2.5, 3.0) == []
    assert picked(rows, 2.0, 2.0) == [("server_x", 2.0)]


def test_rows_come_back_sorted_by_time_across_series_and_as_copies() -> None:
    rows = series("server_b", [3.0, 1.0, 2.0]) + series("cpu", [2.0, 1.0, 3.0])
    out = rows_in_span(rows, 0.0, 10.0)
    assert [r["t"] for r in out] == sorted(r["t"] for r in out)
    assert len(out) == 6
    out[0]["value"] = -1
    assert all(r["value"] != -1 for r in rows)


def test_span_bounds_are_the_span_in_the_samplers_seconds() -> None:
    assert span_bounds(WindowSpan(12_500_000_000, 20_250_000_000, 19_000_000_000), 10.0) == (2.5, 10.25)


def test_window_series_facts() -> None:
    span = WindowSpan(start_ns=12_000_000_000, end_ns=17_123_456_789, window_end_ns=15_000_000_000)
    rows = series("server_x", [1.0, 3.0, 8.0])
    got, facts = window_series(rows, 10.0, 9.87654, span)
    assert [r["t"] for r in got] == [3.0]
    assert facts == {"window_span_s": 5.123, "window_drain_s": 2.123, "telemetry_outside_span_s": 4.753}
    _, facts = window_series(rows, 10.0, 9.87654, span, wall_offset=1000.0004)
    assert facts["window_span_start_unix"] == pytest.approx(1012.0)
    assert facts["window_span_end_unix"] == pytest.approx(1017.123)
    assert facts["window_span_start_unix"] == round(12 + 1000.0004, 3)


def test_window_series_facts_never_go_negative() -> None:
    span = WindowSpan(start_ns=12_000_000_000, end_ns=11_000_000_000, window_end_ns=13_000_000_000)
    _, facts = window_series([], 10.0, 0.5, span)
    assert facts == {"window_span_s": 0.0, "window_drain_s": 0.0, "telemetry_outside_span_s": 0.5}
    # the sampled time beyond a span longer than the sampling is 0, not negative
    span = WindowSpan(start_ns=10_000_000_000, end_ns=14_000_000_000, window_end_ns=14_000_000_000)
    _, facts = window_series([], 10.0, 3.0, span)
    assert facts == {"window_span_s": 4.0, "window_drain_s": 0.0, "telemetry_outside_span_s": 0.0}


def test_window_series_wall_clock_bounds_after_days_of_uptime() -> None:
    # the monotonic clock after ~11.6 days: 1e15 ns; the bounds are exact to the millisecond
    start = 1_000_000_000_000_000 + 250_000_000
    span = WindowSpan(start_ns=start, end_ns=start + 3_000_000_000, window_end_ns=start + 2_000_000_000)
    _, facts = window_series([], start / 1e9 - 1.0, 5.0, span, wall_offset=1000.1234567)
    assert facts["window_span_start_unix"] == pytest.approx(1_000_000.25 + 1000.123, abs=1e-6)
    assert facts["window_span_end_unix"] == pytest.approx(1_000_003.25 + 1000.123, abs=1e-6)
    assert facts["window_span_s"] == 3.0 and facts["window_drain_s"] == 1.0
    assert facts["telemetry_outside_span_s"] == 2.0
