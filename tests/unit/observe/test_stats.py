"""The two-level bootstrap of TTFT quantiles: coverage on distributions with known quantiles, seeding, edges."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.observe.stats import bootstrap_quantiles, cell_seed, repeat_quantiles

QS = (0.5, 0.9)
TRUE = -np.log(1 - np.array(QS))  # quantiles of Exp(1)


def _coverage(experiments: int, repeats: int, n: int, repeat_sd: float, *, level: float = 0.9,
              resample_repeats: bool = True) -> np.ndarray:
    """Share of simulated experiments whose interval holds the true quantile of Exp(1).

    Each repeat draws ``n`` requests from ``Exp(1) * exp(u)``, ``u ~ N(0, repeat_sd)`` per repeat: the
    median repeat has ``u = 0``, so the median over repeats of a repeat's quantile has the true value
    ``-ln(1 - q)``."""
    rng = np.random.default_rng(1)
    hits = np.zeros(len(QS))
    for e in range(experiments):
        reps = [rng.exponential(1.0, n) * math.exp(rng.normal(0, repeat_sd)) for _ in range(repeats)]
        ivs = bootstrap_quantiles(reps, QS, n_boot=300, level=level, seed=e, resample_repeats=resample_repeats)
        hits += [iv.covers(t) for iv, t in zip(ivs, TRUE)]
    return hits / experiments


def test_one_repeat_covers_the_known_quantiles_at_the_nominal_rate():
    cov = _coverage(200, 1, 300, 0.0)
    # 200 experiments at 90%: binomial sd 2.1 points; within 3 sd of nominal
    assert np.all((cov >= 0.84) & (cov <= 0.96)), cov


def test_repeat_to_repeat_variation_is_covered_only_by_resampling_repeats():
    both = _coverage(150, 7, 60, 0.3)
    requests_only = _coverage(150, 7, 60, 0.3, resample_repeats=False)
    assert np.all(both >= 0.83), both
    assert np.all(requests_only <= both - 0.1), (requests_only, both)  # ignoring repeats: too narrow


def test_identical_repeats_are_covered_at_least_at_the_nominal_rate():
    cov = _coverage(150, 3, 100, 0.0)
    assert np.all(cov >= 0.88), cov  # the two levels count the request noise twice: conservative, not short


def test_point_is_the_median_over_repeats_of_each_repeats_percentile():
    reps = [np.arange(1.0, 11.0), np.arange(2.0, 22.0, 2.0), np.array([5.0, 7.0])]
    want = np.median([np.percentile(r, 90) for r in reps])
    assert repeat_quantiles(reps, [0.9])[0] == pytest.approx(want)
    [iv] = bootstrap_quantiles(reps, [0.9], n_boot=200, seed=3)
    assert iv.point == pytest.approx(want) and iv.low <= iv.point <= iv.high


def test_same_seed_same_interval_other_seed_other_draws():
    rng = np.random.default_rng(0)
    reps = [rng.exponential(1.0, 200) for _ in range(3)]
    a = bootstrap_quantiles(reps, QS, n_boot=400, seed=11)
    assert a == bootstrap_quantiles(reps, QS, n_boot=400, seed=11)
    b = bootstrap_quantiles(reps, QS, n_boot=400, seed=12)
    assert [x.point for x in a] == [x.point for x in b] and a != b


def test_more_requests_narrow_the_interval():
    rng = np.random.default_rng(5)
    small = bootstrap_quantiles([rng.exponential(1.0, 50)], [0.5], n_boot=400)[0]
    large = bootstrap_quantiles([rng.exponential(1.0, 5000)], [0.5], n_boot=400)[0]
    assert (large.high - large.low) < (small.high - small.low) / 4


def test_empty_repeats_are_left_out_and_no_data_is_nan():
    assert not bootstrap_quantiles([[], [float("nan")]], QS)[0].known
    [iv] = bootstrap_quantiles([[], [0.2, 0.4]], [0.5], n_boot=50)
    assert iv.point == pytest.approx(0.3) and 0.2 <= iv.low <= iv.high <= 0.4
    [one] = bootstrap_quantiles([[0.25]], [0.99], n_boot=20)
    assert (one.point, one.low, one.high) == (0.25, 0.25, 0.25)


@pytest.mark.parametrize("qs,kw", [([50], {}), ([], {}), ([0.5], {"n_boot": 0}), ([0.5], {"level": 1.0})])
def test_bad_arguments_are_refused(qs, kw):
    with pytest.raises(ValueError):
        bootstrap_quantiles([[1.0, 2.0]], qs, **kw)


def test_cell_seeds_are_stable_and_distinct():
    assert cell_seed(0, "m|chat|4") == cell_seed(0, "m|chat|4")
    assert len({cell_seed(0, f"m|chat|{c}") for c in (1, 2, 4, 8)} | {cell_seed(1, "m|chat|1")}) == 5
