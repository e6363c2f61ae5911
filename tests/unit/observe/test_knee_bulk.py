"""The knee's bootstrap in bulk (orchestrator.observe.analysis.knee) draws exactly what one ``rng.integers`` call
at a time draws: the same figure per draw and core count, the same knee per draw, the same estimate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from orchestrator.observe.analysis import knee as K
from orchestrator.observe.analysis.knee import _estimate_knee_reference, estimate_knee, knee_of, monotone_fit

PCG64_MULTIPLIER = (2549297995355413924 << 64) + 4865540595714422341
M64, M128 = (1 << 64) - 1, (1 << 128) - 1


def _random_windows(rng: np.random.Generator, *, equal: bool | None) -> dict[int, list[np.ndarray]]:
    """1-7 core counts, 1-4 windows each, 1-40 requests a window: one length per count when ``equal``, lengths
    that differ when not, either per count when None; values rounded to 10 ms so resamples tie."""
    cores = sorted(int(c) for c in rng.choice(np.arange(1, 33), int(rng.integers(1, 8)), replace=False))
    out = {}
    for c in cores:
        length = int(rng.integers(1, 41))
        one = bool(rng.integers(0, 2)) if equal is None else equal
        out[c] = [np.round(np.exp(rng.normal(-1 + 1 / c, 0.3, length if one else int(rng.integers(1, 41)))), 2)
                  for _ in range(int(rng.integers(1, 5)))]
    return out


def _reference_figures(data: dict[int, list[np.ndarray]], stat: str, n_boot: int,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's figure and requests per core count, one ``rng.integers`` call at a time (as the reference)."""
    f = K.statistic(stat)
    figs, ws = np.empty((n_boot, len(data))), np.empty((n_boot, len(data)))
    for b in range(n_boot):
        for i, wins in enumerate(data.values()):
            picked = [wins[j] for j in rng.integers(0, len(wins), size=len(wins))]
            a = np.concatenate([w[rng.integers(0, len(w), size=len(w))] for w in picked])
            figs[b, i], ws[b, i] = f(a), len(a)
    return figs, ws


@pytest.mark.parametrize("equal", [True, False, None], ids=["one-length", "lengths-differ", "mixed"])
def test_every_draw_has_the_figure_one_call_at_a_time_gives(equal):
    rng = np.random.default_rng({True: 11, False: 12, None: 13}[equal])
    for _ in range(25):
        data = K._clean(_random_windows(rng, equal=equal))
        stat, seed, n_boot = str(rng.choice(["p50", "p90"])), int(rng.integers(0, 2**31)), int(rng.integers(1, 120))
        got = K._bulk_figures([K._Count(ws) for ws in data.values()], K._QUANTILE[stat], n_boot,
                              np.random.default_rng(seed).bit_generator)
        assert got is not None
        want = _reference_figures(data, stat, n_boot, np.random.default_rng(seed))
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize("stat", K.STATISTICS)
def test_the_estimate_is_the_reference_field_for_field(stat):
    rng = np.random.default_rng(K.STATISTICS.index(stat))
    for case in range(16 if stat in ("p50", "p90") else 6):
        windows = _random_windows(rng, equal=case % 2 == 0)
        kw = {"stat": stat, "n_boot": int(rng.integers(1, 150)), "seed": int(rng.integers(0, 2**31)),
              "tolerance": float(rng.choice([0.0, 0.05, 0.10, 0.25])), "level": float(rng.choice([0.8, 0.9, 0.95]))}
        fast, ref = estimate_knee(windows, **kw), _estimate_knee_reference(windows, **kw)
        for f in dataclasses.fields(fast):
            assert getattr(fast, f.name) == getattr(ref, f.name), (case, f.name)


@pytest.mark.parametrize("windows", [
    {1: [[0.3]], 2: [[0.2]]},                                         # no word read at all
    {1: [[0.3], [0.4]], 2: [[0.2]], 4: [[0.2], [0.1], [0.3]]},        # window picks only
    {1: [[0.3], [0.22, 0.26]], 2: [[0.25, 0.24, 0.26, 0.25, 0.23]]},  # a one-request window beside a longer one
    {2: [[0.5] * 5 + [0.7] * 5, [0.6] * 10], 3: [[0.55] * 10, [0.5] * 4 + [0.6] * 6]},  # ties everywhere
], ids=["one-request-windows", "picks-only", "one-and-two", "ties"])
def test_windows_of_one_request_and_ties_draw_as_the_reference(windows):
    for stat in ("p50", "p90"):
        for seed in range(5):
            assert estimate_knee(windows, stat=stat, seed=seed, n_boot=50) == _estimate_knee_reference(
                windows, stat=stat, seed=seed, n_boot=50)


def test_a_realistic_state_draws_a_thousand_times_as_the_reference():
    """7 core counts x 3 windows x 146 requests (the dense H200 grid's shape), p90, 1000 draws."""
    rng = np.random.default_rng(3)
    centres = {1: 0.62, 2: 0.41, 3: 0.40, 4: 0.39, 6: 0.39, 8: 0.38, 12: 0.38}
    windows = {c: [m * np.exp(rng.normal(0, 0.25, 146)) for _ in range(3)] for c, m in centres.items()}
    assert estimate_knee(windows, seed=7) == _estimate_knee_reference(windows, seed=7)


def _pcg64_with_zero_words(seed: int, position: int, both: bool = False) -> np.random.PCG64:
    """A PCG64 whose stream of 32-bit words has a zero at ``position`` (and at its 64-bit output's other half when
    ``both``): a zero word is thrown away by Lemire's map for every modulus that is not a power of two."""
    bg = np.random.PCG64(seed)
    state = bg.state
    inc = state["state"]["inc"]
    k, half = divmod(position, 2)
    natural = int(np.random.PCG64(seed).random_raw(k + 1)[k])
    out = 0 if both else natural & ~(0xFFFFFFFF << (32 * half))
    hi = int(state["state"]["state"]) >> 64                        # any high half; its top 6 bits rotate
    rot = hi >> 58
    lo = hi ^ (((out << rot) | (out >> (64 - rot))) & M64 if rot else out)
    s = (hi << 64) | lo                                           # the state that outputs ``out``
    inverse = pow(PCG64_MULTIPLIER, -1, 1 << 128)
    for _ in range(k + 1):                                        # k + 1 steps back: output k is ``out``
        s = ((s - inc) * inverse) & M128
    state["state"]["state"] = s
    bg.state = state
    words = np.random.PCG64(0)
    words.state = state
    assert words.random_raw(k + 1).view(np.uint32)[position] == 0
    return bg


@pytest.mark.parametrize("equal", [True, False], ids=["one-length", "lengths-differ"])
@pytest.mark.parametrize("position,both", [(0, False), (1, True), (7, False), (4001, False), (9000, True)],
                         ids=["window-pick", "pick-twice", "request", "later-chunk", "request-twice"])
def test_a_thrown_away_word_is_taken_out_of_the_stream_as_numpy_does(monkeypatch, equal, position, both):
    """Lemire's rejection, placed where it happens: a window pick (position 0: count 1 has 3 windows), twice in a
    row, a request pick, one in a later chunk of draws; the bulk draws throw the word away (not the reference
    instead) and draw what one call at a time draws."""
    rng = np.random.default_rng(5)
    windows = {c: [rng.uniform(0.3, 0.6, 146 if equal else 140 + j) for j in range(3)] for c in (1, 2, 4, 8)}
    data = K._clean(windows)
    dropped = []
    monkeypatch.setattr(K, "_CHUNK_WORDS", 3000)                  # a few draws a chunk: position 4001 is in a later one
    monkeypatch.setattr(K, "_BLOCK_WORDS", 5000)                  # words generated a few chunks at a time
    monkeypatch.setattr(K._Words, "drop", lambda self, at, d=K._Words.drop: (dropped.append(at), d(self, at)))
    monkeypatch.setattr(K, "_bootstrap_knees_reference", None)   # the bulk path must not fall back
    got = K._bulk_figures([K._Count(ws) for ws in data.values()], 0.9, 30, _pcg64_with_zero_words(9, position, both))
    assert got is not None and len(dropped) == (2 if both else 1)
    want = _reference_figures(data, "p90", 30, np.random.Generator(_pcg64_with_zero_words(9, position, both)))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_the_fit_of_every_draw_at_once_names_the_knee_the_functions_name():
    rng = np.random.default_rng(2)
    for m in (1, 2, 3, 5, 7, 12):
        figs = np.exp(rng.normal(0, 0.2, (400, m)))
        figs[::7] = np.round(figs[::7], 1)                        # ties: pooled blocks of equal figures
        ws = rng.integers(1, 500, (400, m)).astype(np.float64)
        for tol in (0.0, 0.1):
            want = [knee_of(monotone_fit(f, w), tol) for f, w in zip(figs, ws)]
            assert K._fit_knees(figs, ws, tol).tolist() == want


def test_a_draw_on_the_threshold_is_fitted_again_by_the_functions(monkeypatch):
    """1.1 at 1 core against a best of 1.0, tolerance 0.10: the fitted figure sits on the threshold, where a
    rounding could move the knee; that draw is decided by monotone_fit and knee_of themselves."""
    calls = []
    monkeypatch.setattr(K, "knee_of", lambda f, t, real=K.knee_of: (calls.append(1), real(f, t))[1])
    figs = np.array([[1.1, 1.0, 1.0], [2.0, 1.0, 1.0]])
    ws = np.full((2, 3), 100.0)
    assert K._fit_knees(figs, ws, 0.10).tolist() == [0, 1] and len(calls) == 1
