"""The knee search's choices on constructed curves (orchestrator.plan.knee_search; pure, fast).

A fake, deterministic *measure* serves each trial: the curve's TTFT p50 at those cores times a noise
factor chosen by the repeat index, so every run here is exact and the counts of trials can be asserted.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable

import pandas as pd
import pytest

from orchestrator.observe.report import comparison as report
from orchestrator.plan.knee_search import (TIMEOUT_MAJORITY, Observation, RepeatPolicy, Verdict, next_trials,
                                           search_state)

CORES = [1, 2, 3, 4, 6, 8, 12]
MONOTONE = {1: 2.0, 2: 1.2, 3: 1.05, 4: 1.0, 6: 1.0, 8: 0.99, 12: 1.0}
POLICY = RepeatPolicy(min=2, max=6, until_ci=0.05)
Measure = Callable[[int, int], Observation]  # (cores, repeat index) -> the trial's observation


def exact(curve: dict[int, float], noisy: dict[int, list[float]] | None = None) -> Measure:
    """The curve's value, times ``noisy[cores][repeat % len]`` where given (else exactly the value)."""
    def measure(cores: int, repeat: int) -> Observation:
        factors = (noisy or {}).get(cores, [1.0])
        return Observation(cores, curve[cores] * factors[repeat % len(factors)])
    return measure


def drive(measure: Measure, allowed: list[int] = CORES, policy: RepeatPolicy = POLICY, tol: float = 0.10,
          lanes: int = 1) -> tuple[list[Observation], list[int]]:
    """Run the search to its end on ``lanes`` lanes (the oldest running trial finishes first): the
    observations, and the core counts in the order the trials started."""
    obs: list[Observation] = []
    running: list[int] = []
    started: list[int] = []
    while True:
        free = lanes - len(running)
        new = [p.cores for p in next_trials(allowed, obs, tol, policy, in_flight=running)[:free]]
        running += new
        started += new
        if not running:
            return obs, started
        c = running.pop(0)
        obs.append(measure(c, sum(o.cores == c for o in obs)))


def per_point(obs: list[Observation]) -> dict[int, int]:
    return dict(sorted(Counter(o.cores for o in obs).items()))


def test_monotone_curve_finds_the_knee_with_min_repeats_at_five_points():
    obs, started = drive(exact(MONOTONE))
    state = search_state(CORES, obs, 0.10, POLICY)
    assert state.knee == 3 and state.bracketed and state.done
    # the ends, then bisection 1..12 -> 4, 1..4 -> 2, 2..4 -> 3; 6 and 8 never measured
    assert per_point(obs) == {1: 2, 2: 2, 3: 2, 4: 2, 12: 2}
    assert started == [12, 1, 12, 1, 4, 4, 2, 2, 3, 3]
    assert state.point(2).verdict is Verdict.OUTSIDE and state.point(3).verdict is Verdict.INSIDE
    assert state.point(6) is None


def test_the_first_proposals_are_both_ends_interleaved_with_plain_reasons():
    first = next_trials(CORES, [], 0.10, RepeatPolicy(min=3))
    assert [(p.cores, p.repeat) for p in first] == [(12, 0), (1, 0), (12, 1), (1, 1), (12, 2), (1, 2)]
    assert "most cores" in first[0].reason and "fewest cores" in first[1].reason


def test_a_bisection_names_its_bracket():
    obs = [Observation(c, MONOTONE[c]) for c in (12, 12, 1, 1)]
    (mid, again) = next_trials(CORES, obs, 0.10, POLICY)
    assert (mid.cores, mid.repeat, again.cores, again.repeat) == (4, 0, 4, 1)
    assert mid.reason == "bisects 1..12: 1 is outside 10% of the best, 12 inside"


def test_a_flat_curve_stops_at_the_fewest_cores_after_the_ends():
    obs, _ = drive(exact({c: 1.0 for c in CORES}, {c: [1.01, 0.99] for c in CORES}))
    state = search_state(CORES, obs, 0.10, POLICY)
    assert state.knee == 1 and state.bracketed and len(obs) == 4


def test_noise_buys_repeats_only_at_the_point_near_the_band_edge_up_to_max():
    curve = {**MONOTONE, 2: 1.3, 3: 1.09, 8: 1.0}  # 3 cores 9% above the best: the edge is 10%
    wobble = {3: [1.03, 0.97]}  # its median goes 1.09 (inside), 1.12 (outside), 1.09, ...
    obs, _ = drive(exact(curve, wobble), policy=RepeatPolicy(2, 6, until_ci=0.0))
    state = search_state(CORES, obs, 0.10, RepeatPolicy(2, 6, until_ci=0.0))
    assert per_point(obs) == {1: 2, 2: 2, 3: 6, 4: 2, 12: 2}  # the noiseless points stay at min
    assert state.bracketed and state.knee == 3 and "repeat cap" in state.point(3).note


def test_until_ci_settles_a_point_on_the_border_before_max():
    curve = {**MONOTONE, 2: 1.3, 3: 1.09, 8: 1.0}
    obs, _ = drive(exact(curve, {3: [1.03, 0.97]}))
    state = search_state(CORES, obs, 0.10, POLICY)
    # five repeats: the ratio interval is +-4.2% <= 5%; the median (1.12) is outside, so the knee is 4
    assert per_point(obs)[3] == 5 and state.knee == 4 and state.bracketed
    assert "settled" in state.point(3).note


def test_a_noisy_point_far_from_the_edge_gets_no_extra_repeats():
    noisy = {1: [1.4, 0.7], 12: [1.0]}  # 1 core: +-40%, but far outside the band
    obs, _ = drive(exact(MONOTONE, noisy))
    assert per_point(obs)[1] == 2 and search_state(CORES, obs, 0.10, POLICY).knee == 3


def test_timeouts_at_the_fewest_cores_count_as_outside():
    def measure(cores: int, repeat: int) -> Observation:
        return Observation(1, None, timeout_rate=1.0) if cores == 1 else exact(MONOTONE)(cores, repeat)
    obs, _ = drive(measure)
    state = search_state(CORES, obs, 0.10, POLICY)
    assert state.knee == 3 and state.bracketed and len(obs) == 10
    assert state.point(1).verdict is Verdict.OUTSIDE and "timed out" in state.point(1).note


def test_a_timeout_minority_keeps_the_point_as_the_report_does():
    obs = [Observation(1, 1.0, timeout_rate=0.4), Observation(1, 1.0), Observation(12, 1.0), Observation(12, 1.0)]
    state = search_state(CORES, obs, 0.10, POLICY)
    assert state.knee == 1 and state.point(1).estimate == 1.0
    assert TIMEOUT_MAJORITY == report.TIMEOUT_MAJORITY


def test_a_failed_trial_counts_as_spent_and_its_point_needs_another_value():
    obs = [Observation(12, 1.0), Observation(12, 1.0), Observation(1, 1.05), Observation(1, None, failed=True)]
    state = search_state([1, 12], obs, 0.10, POLICY)
    assert state.point(1).trials == 2 and state.point(1).values == (1.05,)
    assert state.point(1).verdict is Verdict.UNCLEAR  # one value: no spread known
    assert [(p.cores, p.repeat) for p in next_trials([1, 12], obs, 0.10, POLICY)] == [(1, 2)]


def test_non_monotone_at_one_core_the_fewest_inside_is_the_knee():
    curve = {**MONOTONE, 1: 1.0, 2: 1.3}  # 1 core inside, 2 outside
    obs, _ = drive(exact(curve))
    assert search_state(CORES, obs, 0.10, POLICY).knee == 1 and len(obs) == 4
    seen = obs + [Observation(2, 1.3), Observation(2, 1.3)]  # measured anyway: the report's knee is still 1
    state = search_state(CORES, seen, 0.10, POLICY)
    assert state.knee == 1 and state.contradictions == ((1, 2),)


def test_a_smaller_point_found_inside_rebrackets_on_it():
    known = [Observation(c, v) for c, v in [(12, 1.0), (12, 1.0), (1, 2.0), (1, 2.0), (4, 1.3), (4, 1.3)]]
    assert search_state(CORES, known, 0.10, POLICY).knee == 12
    state = search_state(CORES, known + [Observation(2, 1.05), Observation(2, 1.05)], 0.10, POLICY)
    assert state.knee == 2 and state.bracketed and (2, 4) in state.contradictions


def test_a_hidden_inside_point_between_two_outside_ones_is_missed_as_by_any_bisection():
    curve = {1: 2.0, 2: 1.05, 3: 1.3, 4: 1.3, 6: 1.0, 8: 1.0, 12: 1.0}
    obs, _ = drive(exact(curve))
    assert search_state(CORES, obs, 0.10, POLICY).knee == 6  # the grid's would be 2
    assert 2 not in per_point(obs)


def test_a_faster_point_moves_the_best_and_every_verdict_with_it():
    known = [Observation(c, v) for c, v in [(12, 1.0), (12, 1.0), (1, 2.0), (1, 2.0), (4, 1.08), (4, 1.08)]]
    assert search_state(CORES, known, 0.10, POLICY).knee == 4
    state = search_state(CORES, known + [Observation(6, 0.9), Observation(6, 0.9)], 0.10, POLICY)
    assert state.best_cores == 6 and state.knee == 6 and state.point(4).verdict is Verdict.OUTSIDE


def test_never_more_trials_than_the_full_grid():
    wobble = {c: [1.3, 0.75] for c in CORES}  # so noisy that nothing near the edge ever settles
    policy = RepeatPolicy(2, 3, until_ci=0.0)
    for lanes in (1, 3):
        obs, _ = drive(exact(MONOTONE, wobble), policy=policy, lanes=lanes)
        assert len(obs) <= len(CORES) * policy.max and max(per_point(obs).values()) <= policy.max
    full = [Observation(c, MONOTONE[c]) for c in CORES for _ in range(3)]
    assert next_trials(CORES, full, 0.10, policy) == []


def test_in_flight_trials_count_and_nothing_waits_on_a_result_it_lacks():
    assert [(p.cores, p.repeat) for p in next_trials(CORES, [], 0.10, POLICY, in_flight=[12])] == \
        [(1, 0), (12, 1), (1, 1)]
    assert next_trials(CORES, [], 0.10, POLICY, in_flight=[12, 1, 12, 1]) == []
    ends = [Observation(c, MONOTONE[c]) for c in (12, 12, 1, 1)]
    assert next_trials(CORES, ends + [Observation(4, 1.0)], 0.10, POLICY, in_flight=[4]) == []
    obs, started = drive(exact(MONOTONE), lanes=2)
    assert search_state(CORES, obs, 0.10, POLICY).knee == 3 and len(obs) == 10
    assert started[:4] == [12, 1, 12, 1]


def test_the_same_observations_in_any_order_give_the_same_answer():
    measure = exact({**MONOTONE, 3: 1.09}, {3: [1.03, 0.97], 12: [1.01, 0.99]})
    obs, started = drive(measure)
    assert drive(measure)[1] == started
    for head in (obs[:9], obs):
        shuffled = head[:]
        random.Random(7).shuffle(shuffled)
        assert next_trials(CORES, head, 0.10, POLICY) == next_trials(CORES, shuffled, 0.10, POLICY)
        assert search_state(CORES, head, 0.10, POLICY) == search_state(CORES, shuffled, 0.10, POLICY)
    assert next_trials(CORES, obs[:9], 0.10, POLICY) != []


def test_the_knee_over_all_points_is_the_reports():
    """Random grids with failed trials and timeouts, each its own configuration of one report table."""
    rng = random.Random(3)
    cases: list[list[Observation]] = []
    rows = []
    for case in range(12):  # the report's aggregation takes ~25 ms a core count: keep this small
        obs = []
        for c in CORES:
            for _ in range(rng.randint(1, 3)):
                kind = rng.random()
                if kind < 0.1:
                    obs.append(Observation(c, None, failed=True))
                elif kind < 0.2:
                    obs.append(Observation(c, rng.choice([None, 3.0]), timeout_rate=rng.choice([0.4, 0.9])))
                else:
                    obs.append(Observation(c, 1.0 + rng.random() * (0.6 if c < 4 else 0.15)))
        cases.append(obs)
        rows += [{"model": f"case{case}", "trial_id": f"{case}-{i}", "cores": o.cores,
                  "status": "FAILED" if o.failed else "COMPLETED",
                  "ttft_p50_s": math.nan if o.ttft_p50_s is None else o.ttft_p50_s,
                  "timeout_rate": math.nan if o.failed else o.timeout_rate} for i, o in enumerate(obs)]
    table = report.comparison(pd.DataFrame(rows), 0.10)
    knees = table[table["knee"] == "<- knee"].set_index("model")["cores"]
    for case, obs in enumerate(cases):
        assert search_state(CORES, obs, 0.10, POLICY).knee == knees.get(f"case{case}"), case
    assert knees.size >= 9  # most cases have a knee; the rest have none the report marks


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        RepeatPolicy(min=3, max=2)
    with pytest.raises(ValueError):
        search_state(CORES, [Observation(5, 1.0)], 0.10, POLICY)
    with pytest.raises(ValueError):
        next_trials(CORES, [], 0.10, POLICY, in_flight=[5])
