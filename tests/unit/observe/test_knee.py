"""The knee with its interval (orchestrator.observe.analysis.knee): fit, rule, bootstrap, sentence."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from orchestrator.observe.analysis.knee import estimate_knee, knee_of, monotone_fit


def _windows(centres: dict[int, float], *, n: int = 150, k: int = 3, sd: float = 0.3, seed: int = 0,
             window_sd: float = 0.0) -> dict[int, list[np.ndarray]]:
    """k windows of n lognormal TTFTs per core count, median ``centre``; ``window_sd`` moves each window."""
    rng = np.random.default_rng(seed)
    return {c: [m * np.exp(rng.normal(0, window_sd) + rng.normal(0, sd, n)) for _ in range(k)]
            for c, m in centres.items()}


def test_a_clear_knee_is_settled_on_one_core_count():
    est = estimate_knee(_windows({1: 1.0, 2: 0.5, 4: 0.49, 8: 0.48}), n_boot=300)
    assert (est.knee, est.low, est.high, est.settled) == (2, 2, 2, True)
    assert est.sentence() == "2 cores; 90%: 2"
    assert est.cores == (1, 2, 4, 8) and est.windows == (3, 3, 3, 3) and est.requests == (450,) * 4
    assert len(est.window_figures) == 12 and {c for c, _ in est.window_figures} == {1, 2, 4, 8}


def test_a_higher_core_count_that_reads_worse_does_not_move_the_knee():
    """Raw figures 1.0, 0.5, 0.44, 0.52: "fewest within 10% of the best (0.44)" says 4 cores; the monotone
    fit pools 4 and 8 cores (0.48), and 2 cores is within 10% of that."""
    w = {1: [np.full(100, 1.0)], 2: [np.full(100, 0.5)], 4: [np.full(100, 0.44)], 8: [np.full(100, 0.52)]}
    est = estimate_knee(w, n_boot=50)
    assert est.figures == pytest.approx((1.0, 0.5, 0.44, 0.52))
    assert est.fitted[2] == pytest.approx(est.fitted[3]) and est.fitted[3] == pytest.approx(np.sqrt(0.44 * 0.52))
    assert est.knee == 2
    assert knee_of(est.figures, 0.10) == 2  # the raw rule: index 2, i.e. 4 cores


def test_noisy_windows_leave_the_knee_not_settled():
    # few requests, a wide spread and windows that move: no single core count wins the draws
    w = _windows({1: 0.62, 2: 0.55, 3: 0.52, 4: 0.5, 6: 0.5}, n=8, k=2, sd=0.6, window_sd=0.2, seed=3)
    est = estimate_knee(w, n_boot=400, seed=1)
    assert not est.settled and est.high > est.low
    assert est.sentence().startswith("not settled: ") and f"between {est.low} and {est.high} cores" in est.sentence()
    assert sum(est.shares.values()) == pytest.approx(1.0)


def test_resampling_windows_widens_the_interval_when_windows_disagree():
    """The same requests, but the windows of 2 cores sit 30% apart: the draws of windows spread the knee."""
    calm = _windows({1: 1.0, 2: 0.55, 4: 0.5}, n=200, sd=0.2, seed=5)
    moved = {c: [w * f for w, f in zip(ws, (0.8, 1.0, 1.3))] if c == 2 else ws for c, ws in calm.items()}
    a, b = estimate_knee(calm, n_boot=400, seed=2), estimate_knee(moved, n_boot=400, seed=2)
    assert max(a.shares.values()) > max(b.shares.values())


def test_same_windows_and_seed_give_the_same_answer_and_bad_input_is_named():
    w = _windows({1: 1.0, 2: 0.7, 4: 0.6}, n=30, seed=7)
    assert estimate_knee(w, n_boot=100, seed=4) == estimate_knee(w, n_boot=100, seed=4)
    with pytest.raises(ValueError, match="statistic must be one of mean, p50"):
        estimate_knee(w, stat="median")
    with pytest.raises(ValueError, match="level"):
        estimate_knee(w, level=1.5)
    none = estimate_knee({1: [[float("nan")]], 2: []})
    assert none.knee is None and "no knee" in none.sentence()
    one = estimate_knee({4: [[0.3, 0.4]]}, n_boot=10)
    assert one.knee == 4 and "only core count" in one.sentence()


def test_one_window_per_core_count_is_said():
    """With one window at the knee or below it, no draw of windows is possible: the sentence says the interval
    leaves out window-to-window noise."""
    single = estimate_knee(_windows({1: 1.0, 2: 0.5, 4: 0.49}, k=1), n_boot=100)
    assert single.knee == 2 and single.single_windows
    assert single.sentence().endswith("(one window at the knee or below it: the interval leaves out "
                                      "window-to-window noise)")
    assert not estimate_knee(_windows({1: 1.0, 2: 0.5, 4: 0.49}, k=2), n_boot=100).single_windows


@pytest.mark.parametrize("stat", ["mean", "p50", "p90", "trimmed", "geomean"])
def test_every_statistic_gives_the_figure_it_names(stat):
    a = np.array([0.1, 0.2, 0.3, 0.4, 1.0, 0.25, 0.35, 0.15, 0.45, 0.5])
    est = estimate_knee({1: [a[:5], a[5:]]}, stat=stat, n_boot=5)
    want = {"mean": a.mean(), "p50": np.quantile(a, 0.5), "p90": np.quantile(a, 0.9),
            "trimmed": np.sort(a)[1:-1].mean(), "geomean": np.exp(np.log(a).mean())}[stat]
    assert est.figures[0] == pytest.approx(want)


def test_the_fit_never_rises_with_cores_and_keeps_a_monotone_curve():
    rng = np.random.default_rng(0)
    for _ in range(50):
        y = np.exp(rng.normal(0, 0.3, 7))
        w = rng.integers(1, 300, 7)
        fit = monotone_fit(y, w)
        assert np.all(np.diff(fit) <= 1e-12)
    y = np.array([1.0, 0.8, 0.6, 0.5])
    assert monotone_fit(y, [1, 1, 1, 1]) == pytest.approx(y)


def test_decode_needs_more_only_when_tpots_whole_interval_lies_above_ttfts_knee():
    from orchestrator.observe.analysis.knee import decode_needs_more
    from orchestrator.observe.report.html import decode_paragraph

    # H200 structured output, in seconds; decided on the mean, whose figures the paragraph quotes below
    ttft = estimate_knee(_windows({1: 0.70, 2: 0.43, 12: 0.41}), stat="mean", n_boot=300)
    slow = estimate_knee(_windows({1: 0.115, 2: 0.057, 12: 0.013}, sd=0.1), stat="mean", n_boot=300)
    flat = estimate_knee(_windows({1: 0.015, 2: 0.013, 12: 0.013}, sd=0.1), stat="mean", n_boot=300)
    assert (ttft.knee, slow.knee, slow.low, flat.knee) == (2, 12, 12, 2)
    assert decode_needs_more(ttft, slow) and not decode_needs_more(ttft, flat) and not decode_needs_more(ttft, None)
    said = decode_paragraph(ttft, slow)
    assert "Decode needs more cores than the first token" in said and "57 ms a token at 2 cores" in said
    assert "is 12 cores, not 2 cores" in said
    assert "decode needs no more cores" in decode_paragraph(ttft, flat)
    # A TPOT knee above TTFT's only by noise (its interval reaches down to TTFT's knee) says nothing more.
    assert not decode_needs_more(ttft, dataclasses.replace(slow, low=2, settled=False))
