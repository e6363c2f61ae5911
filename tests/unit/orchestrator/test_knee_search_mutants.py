"""Mutation-testing kills for the knee search (orchestrator/plan/knee_search.py); see tests/MUTATION.md.

The expected figures are recomputed here from the module docstring's rule (log-scale t-interval, Welch's df)."""

from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.plan.knee_search import (Observation, RepeatPolicy, Verdict, _half_width, _raw, _t975, next_trials,
                                           search_state)

T = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 30: 2.042}


def test_t_quantiles_round_the_degrees_of_freedom_down() -> None:
    assert _t975(1) == 12.706 and _t975(0.2) == 12.706 and _t975(-3) == 12.706
    assert _t975(2.99) == 4.303 and _t975(3 - 1e-12) == 3.182  # float noise below a whole df is not a step down
    assert _t975(30) == 2.042 and _t975(31) == pytest.approx(1.96 + 2.4 / 31) and _t975(60.5) == pytest.approx(2.0)


def test_repeat_policy_bounds() -> None:
    RepeatPolicy(min=1, max=1, until_ci=0.0)
    for bad in (dict(min=0, max=2), dict(min=3, max=2), dict(min=2, max=6, until_ci=-0.01)):
        with pytest.raises(ValueError, match="need 1 <= min <= max and until_ci >= 0, got RepeatPolicy"):
            RepeatPolicy(**bad)


def test_raw_points_read_the_trials_as_the_report_does() -> None:
    obs = [Observation(2, 0.3), Observation(2, None), Observation(2, float("inf")), Observation(2, 0.0),
           Observation(2, 0.1), Observation(2, 9.0, failed=True, timeout_rate=1.0)]
    x = _raw(2, obs)
    assert x.trials == 6 and x.values == (0.1, 0.3) and x.left_out is None and x.estimate == pytest.approx(0.2)
    assert x.var_log == pytest.approx(statistics.variance([math.log(0.1), math.log(0.3)]) / 2)
    assert _raw(2, [Observation(2, 0.3)]).var_log == math.inf
    half = _raw(2, [Observation(2, 0.3, timeout_rate=0.5), Observation(2, 0.3, timeout_rate=0.5)])
    assert half.left_out is None  # a timeout rate of exactly one half is not a majority
    most = _raw(2, [Observation(2, 0.3, timeout_rate=0.5), Observation(2, 0.3, timeout_rate=0.6)])
    assert most.left_out == "most requests timed out (mean timeout rate 55%)" and most.estimate is None
    assert _raw(2, [Observation(2, 1.0, failed=True)]).left_out == "every trial failed"
    assert _raw(2, [Observation(2, None)]).left_out == "no completed trial has a TTFT p50"


def test_half_width_is_welchs_t_interval_of_the_log_ratio() -> None:
    p, b = _raw(2, [Observation(2, v) for v in (1.0, 1.2, 1.1)]), _raw(4, [Observation(4, v) for v in (0.9, 1.0, 1.05, 0.95)])
    a, c = p.var_log, b.var_log
    df = (a + c) ** 2 / (a * a / 2 + c * c / 3)
    assert _half_width(p, b) == pytest.approx(_t975(df) * math.sqrt(a + c))
    assert 1 < df < 4
    flat = _raw(4, [Observation(4, 1.0), Observation(4, 1.0)])
    assert _half_width(flat, flat) == 0.0
    same = _raw(2, [Observation(2, 1.0), Observation(2, 2.0)])  # equal spreads do not cancel
    assert _half_width(same, same) == pytest.approx(T[2] * math.sqrt(2 * same.var_log)) and same.var_log > 0
    assert _half_width(_raw(2, [Observation(2, 1.0)]), flat) == math.inf
    assert _half_width(flat, _raw(2, [Observation(2, 1.0)])) == math.inf


def state(obs: dict[int, list[float]], allowed=(1, 2, 4, 8), tol=0.10, policy=RepeatPolicy(2, 6, 0.05)):
    return search_state(list(allowed), [Observation(c, v) for c, vs in obs.items() for v in vs], tol, policy)


def test_a_points_interval_is_the_t_interval_around_its_median() -> None:
    s = state({8: [1.0, 1.1], 1: [3.0, 3.3, 3.6]})
    p = s.point(1)
    w = T[2] * math.sqrt(statistics.variance([math.log(v) for v in (3.0, 3.3, 3.6)]) / 3)
    assert p.estimate == 3.3 and p.low == pytest.approx(3.3 * math.exp(-w)) and p.high == pytest.approx(3.3 * math.exp(w))
    assert p.trials == 3 and p.values == (3.0, 3.3, 3.6)
    one = state({8: [1.0]}).point(8)
    assert one.low is None and one.high is None and one.verdict is Verdict.UNCLEAR and one.note == "1 of 2 repeats"


def test_verdicts_at_the_band_edges() -> None:
    # with no spread anywhere the interval is a point: the ratio alone decides, the edge inclusive
    s = state({1: [1.1, 1.1], 2: [1.1000001, 1.1000001], 8: [1.0, 1.0]})
    assert s.point(1).verdict is Verdict.INSIDE and s.point(2).verdict is Verdict.OUTSIDE
    assert s.point(8).verdict is Verdict.INSIDE and s.point(8).note == "the best"
    assert s.knee == 1 and s.best_cores == 8 and s.bracketed and s.done and s.trials == 6
    assert s.point(1).note == "ratio to the best 1.100, interval up to 1.100"
    assert s.point(2).note == "ratio to the best 1.100, interval from 1.100"


def test_a_straddling_point_asks_for_a_repeat_where_the_spread_is() -> None:
    s = state({1: [1.0, 1.3], 8: [1.0, 1.01]}, allowed=(1, 8))
    p = s.point(1)
    assert p.verdict is Verdict.UNCLEAR and p.leaning is Verdict.OUTSIDE and not s.bracketed and not s.done
    assert p.note.startswith("one more repeat: 1 cores' interval ")
    assert [(x.cores, x.repeat) for x in next_trials([1, 8], [Observation(c, v) for c, vs in
                                                             {1: [1.0, 1.3], 8: [1.0, 1.01]}.items() for v in vs],
                                                    0.10, RepeatPolicy(2, 6, 0.05))] == [(1, 2)]
    best_noisy = {1: [1.15, 1.16], 8: [0.9, 1.1]}
    s = state(best_noisy, allowed=(1, 8))
    assert s.point(1).note.startswith("one more repeat of the best (8 cores)")
    assert [(x.cores, x.repeat) for x in next_trials([1, 8], [Observation(c, v) for c, vs in best_noisy.items()
                                                             for v in vs], 0.10, RepeatPolicy(2, 6, 0.05))] == [(8, 2)]


def test_a_straddling_point_at_the_cap_is_settled_by_its_figure() -> None:
    s = state({1: [1.0, 1.3], 8: [1.0, 1.01]}, allowed=(1, 8), policy=RepeatPolicy(2, 2, 0.05))
    p = s.point(1)
    assert p.verdict is Verdict.OUTSIDE and p.note == "near the band edge at the repeat cap (2)" and s.done
    wide = state({1: [1.0, 1.3], 8: [1.0, 1.01]}, allowed=(1, 8), policy=RepeatPolicy(2, 6, 100.0))
    assert wide.point(1).verdict is Verdict.OUTSIDE and wide.point(1).note.startswith("near the band edge, settled")


def test_bisection_takes_the_middle_allowed_point() -> None:
    s = state({1: [3.0, 3.0], 16: [1.0, 1.0]}, allowed=(1, 2, 4, 8, 16))
    assert s.note == "bisecting 1..16" and s.knee == 16 and not s.bracketed and not s.done
    assert [(p.cores, p.repeat) for p in next_trials([1, 2, 4, 8, 16], [Observation(1, 3.0)] * 2 +
                                                     [Observation(16, 1.0)] * 2, 0.1, RepeatPolicy(2, 6, 0.05))] == \
        [(4, 0), (4, 1)]
    s = state({1: [3.0, 3.0], 4: [3.0, 3.0], 16: [1.0, 1.0]}, allowed=(1, 2, 4, 8, 16))
    assert s.note == "bisecting 4..16"
    s = state({1: [3.0, 3.0], 4: [3.0, 3.0], 8: [1.0, 1.0], 16: [1.0, 1.0]}, allowed=(1, 2, 4, 8, 16))
    assert s.knee == 8 and s.bracketed and s.done and s.note == "knee 8 cores: 4 outside (bracketed)"


def test_the_state_before_and_after_the_ends() -> None:
    s = state({})
    assert s.note == "measuring the ends of the range" and s.knee is None and s.best_cores is None and not s.done
    s = state({1: [1.0, 1.0], 8: [1.0, 1.0]})
    assert s.knee == 1 and s.note == "knee 1 cores: the fewest of the range (bracketed)" and s.done
    s = search_state([1, 8], [Observation(c, None) for c in (1, 1, 8, 8)], 0.1, RepeatPolicy(2, 6, 0.05))
    assert s.knee is None and s.done and s.note.startswith("no measured core count has a usable TTFT p50")
    s = state({1: [3.0, 3.0], 2: [3.0], 8: [1.0, 1.0]})
    assert s.note.startswith("waiting for 2 repeats at 2")
    s = state({1: [1.0, 1.0], 2: [3.0, 3.0], 8: [1.0, 1.0]})
    assert s.contradictions == ((1, 2),) and s.knee == 1


def test_next_trials_interleave_repeats_and_respect_the_grid_budget() -> None:
    pol = RepeatPolicy(2, 3, 0.05)
    first = next_trials([1, 2, 4], [], 0.1, pol)
    assert [(p.cores, p.repeat) for p in first] == [(4, 0), (1, 0), (4, 1), (1, 1)]
    assert next_trials([1, 2, 4], [], 0.1, pol, in_flight=[4, 1, 4]) == [next_trials([1, 2, 4], [], 0.1, pol)[3]]
    assert next_trials([1, 2, 4], [], 0.1, pol, in_flight=[4] * 9) == []
    with pytest.raises(ValueError):
        search_state([0, 2], [], 0.1, pol)
    with pytest.raises(ValueError):
        search_state([1, 2], [], -0.01, pol)
    search_state([1, 2], [], 0.0, pol)


def obs(points: dict[int, list[float]]) -> list[Observation]:
    return [Observation(c, v) for c, vs in points.items() for v in vs]


def test_two_repeats_are_enough_for_a_points_interval() -> None:
    p = state({8: [1.0, 1.2], 1: [2.0, 2.0]}).point(8)
    assert p.low is not None and p.low < 1.1 < p.high


def test_the_notes_give_the_ratio_and_its_interval() -> None:
    pol = RepeatPolicy(2, 6, 0.05)
    for pts, verdict, text in (({1: [1.0, 1.01, 1.02, 1.01], 8: [1.0, 1.01, 1.0, 1.01]}, Verdict.INSIDE, "interval up to {:.3f}"),
                               ({1: [2.0, 2.1, 2.05], 8: [1.0, 1.01, 1.0, 1.01]}, Verdict.OUTSIDE, "interval from {:.3f}")):
        p, b = _raw(1, obs({1: pts[1]})), _raw(8, obs({8: pts[8]}))
        h, r = _half_width(p, b), p.estimate / b.estimate
        assert h > 0.001
        bound = r * math.exp(h) if verdict is Verdict.INSIDE else r * math.exp(-h)
        point = search_state([1, 8], obs(pts), 0.10, pol).point(1)
        assert point.verdict is verdict and point.note == f"ratio to the best {r:.3f}, " + text.format(bound)


def test_a_point_straddling_the_edge_settles_exactly_at_until_ci() -> None:
    pts = {1: [1.08, 1.08 * 1.1], 8: [1.0, 1.1]}
    h = _half_width(_raw(1, obs({1: pts[1]})), _raw(8, obs({8: pts[8]})))
    settled = search_state([1, 8], obs(pts), 0.10, RepeatPolicy(2, 6, math.exp(h) - 1)).point(1)
    assert settled.verdict is not Verdict.UNCLEAR
    assert settled.note == f"near the band edge, settled: interval +-{math.exp(h) - 1:.1%}"
    unclear = search_state([1, 8], obs(pts), 0.10, RepeatPolicy(2, 6, math.exp(h) - 1.001)).point(1)
    assert unclear.verdict is Verdict.UNCLEAR


def test_equal_spreads_send_the_repeat_to_the_point_not_the_best() -> None:
    pts = {1: [1.08, 1.08 * 1.1], 8: [1.0, 1.1]}
    p, b = _raw(1, obs({1: pts[1]})), _raw(8, obs({8: pts[8]}))
    assert p.var_log == b.var_log
    h = _half_width(p, b)
    point = search_state([1, 8], obs(pts), 0.10, RepeatPolicy(2, 6, 0.05)).point(1)
    est = p.estimate
    assert point.note == (f"one more repeat: 1 cores' interval {est * math.exp(-h):.3g}-{est * math.exp(h):.3g} s "
                          f"straddles the band edge {1.1 * b.estimate:.3g} s")
    assert [(x.cores, x.repeat) for x in next_trials([1, 8], obs(pts), 0.10, RepeatPolicy(2, 6, 0.05))] == [(1, 2)]


def test_an_unknown_in_flight_core_count_is_named() -> None:
    with pytest.raises(ValueError, match=r"in-flight trial at 5 cores, not in the allowed \[1, 2, 4\]"):
        next_trials([4, 1, 2], [], 0.1, RepeatPolicy(2, 6, 0.05), in_flight=[5])


def test_bad_ranges_and_observations_are_named() -> None:
    pol = RepeatPolicy(2, 6, 0.05)
    with pytest.raises(ValueError, match=r"need positive core counts and tolerance >= 0, got \[0, 2\], 0.1"):
        search_state([0, 2], [], 0.1, pol)
    with pytest.raises(ValueError, match=r"observation at 3 cores, not in the allowed \[1, 2\]"):
        search_state([2, 1], [Observation(3, 1.0)], 0.1, pol)


def test_the_first_proposals_say_why() -> None:
    got = [(p.cores, p.reason) for p in next_trials([1, 2, 4], [], 0.1, RepeatPolicy(2, 6, 0.05))][:2]
    assert got == [(4, "the most cores of the range (first bracket end)"),
                   (1, "the fewest cores of the range (first bracket end)")]


def test_a_point_below_the_most_cores_measured_once_gets_its_second_repeat() -> None:
    o = obs({8: [1.0, 1.0], 1: [3.0, 3.0], 4: [1.0]})
    got = [(p.cores, p.repeat, p.reason) for p in next_trials([1, 2, 4, 8], o, 0.1, RepeatPolicy(2, 6, 0.05))]
    assert (4, 1, "2 repeats for every measured point") in got


def test_the_notes_while_the_ends_or_a_bracket_wait() -> None:
    assert state({8: [1.0, 1.0]}).note == "measuring the ends of the range"
    assert state({8: [1.0, 1.0]}).knee == 8 and not state({8: [1.0, 1.0]}).bracketed
    s = state({1: [3.0, 3.0], 2: [3.0], 4: [1.0], 8: [1.0, 1.0]})
    assert s.knee == 4 and s.note == "waiting for 2 repeats at 2 and 4 cores"
    s = state({1: [1.15, 1.16], 8: [0.9, 1.1]}, allowed=(1, 8))
    assert s.note == "knee 8 cores: 1 outside (settling repeats)"
