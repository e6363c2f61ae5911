"""The knee as a statistical statement: the fewest cores within a tolerance of the best, and its interval (pure).

Input: every measured window of one configuration, grouped by core count: ``{cores: [ttfts, ...]}``, one
sequence of request TTFTs (seconds, ok requests) per window.

1. **The figure of a core count** is a statistic of all its windows' requests together (``p90`` by
   default; the ``mean``, ``p50``, a 10%-``trimmed`` mean or the ``geomean`` on request). Why p90: replaying
   the real windows of three dense H200 grids (``benchmarks/results/knee-search-sim.md``), the knee search
   decided on p90 named the 6-repeat grid's knee more often than on the mean, from fewer windows (100%, 99% and
   94% of 500 seeds from 6.8, 7.9 and 8.9 windows, against 95%, 96% and 89% from 9.6, 9.4 and 10.4); above the knee a window's p90 spreads least of the five, between windows and within one
   (``benchmarks/results/knee-noise.md``), and the starvation it reads at 1 core is as large (1.38-1.62x the
   plateau, against 1.34-1.65x for the mean). Pooling is what the
   noise calls for: on the committed dense H200 grid (``benchmarks/results/h200/dense``), above the knee
   the windows of one configuration differed less than one window's own sampling error, so a window's
   figure is mostly its requests' noise; more requests, from any window, narrow it.
2. **A monotone fit across core counts.** The log figures are made non-increasing in cores by isotonic
   regression (pool adjacent violators, weighted by the requests behind each point): more cores never
   make vLLM slower but noise can read so, and a higher core count that reads worse is pooled with its
   neighbours instead of moving the best. The best is the fit's lowest value (at the most cores).
3. **The knee** is the fewest cores whose fitted figure is at most ``(1 + tolerance)`` times the best.
4. **The interval** comes from a two-level bootstrap, as the report's TTFT intervals
   (:mod:`orchestrator.observe.stats`): within each core count draw its windows with replacement, then
   each drawn window's requests with replacement; fit; take the knee. The interval is the central
   ``level`` of the knees drawn, in grid order. The knee is **settled** when that interval spans at
   most one grid step ("2 cores; 90%: 2-3"), else it is "not settled" and the sentence says between what.

Every draw comes from ``numpy.random.default_rng(seed)``: the same windows and seed give the same answer. On the
p50 and the p90 the draws are taken in bulk, the same words of that stream read with array operations (see "The
same draws in bulk" below): the same draws, figures and knees as one ``rng.integers`` call at a time, in a
fraction of its time (``benchmarks/knee_estimate_bench.py``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike
from scipy.optimize import isotonic_regression

STATISTICS = ("mean", "p50", "p90", "trimmed", "geomean")
LEVEL = 0.90
N_BOOT = 1000


def _trimmed(a: np.ndarray, cut: float = 0.10) -> float:
    s = np.sort(a)
    k = int(math.floor(cut * len(s)))
    return float(s[k:len(s) - k].mean()) if len(s) > 2 * k else float(s.mean())


_STAT: dict[str, Callable[[np.ndarray], float]] = {
    "mean": lambda a: float(a.mean()),
    "p50": lambda a: float(np.quantile(a, 0.5)),
    "p90": lambda a: float(np.quantile(a, 0.9)),
    "trimmed": _trimmed,
    "geomean": lambda a: float(np.exp(np.log(a).mean())),
}


def statistic(name: str) -> Callable[[np.ndarray], float]:
    if name not in _STAT:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, not {name!r}")
    return _STAT[name]


@dataclass(frozen=True)
class KneeEstimate:
    """The knee of one configuration, its interval, and the fit it came from."""

    knee: int | None                   # fewest cores within tolerance of the best (None: no data)
    low: int | None                    # the interval's ends, in cores (central ``level`` of the draws)
    high: int | None
    settled: bool                      # the interval spans at most one grid step
    level: float
    statistic: str
    tolerance: float
    cores: tuple[int, ...] = ()        # the core counts with data, ascending
    figures: tuple[float, ...] = ()    # the statistic of each core count's pooled requests (seconds)
    fitted: tuple[float, ...] = ()     # the monotone fit of the figures (seconds)
    windows: tuple[int, ...] = ()      # windows behind each core count
    requests: tuple[int, ...] = ()     # requests behind each core count
    shares: dict[int, float] = field(default_factory=dict)  # share of the draws that named each core count
    n_boot: int = 0
    window_figures: tuple[tuple[int, float], ...] = ()  # (cores, the statistic of one window's requests)

    def sentence(self) -> str:
        """"2 cores; 90%: 2-3", "not settled: 90% between 1 and 4 cores", or why there is no knee."""
        if self.knee is None:
            return "no knee: no core count has a measured window"
        pct = f"{self.level:.0%}"
        span = f"{self.low}" if self.low == self.high else f"{self.low}-{self.high}"
        if len(self.cores) < 2:
            return f"{self.knee} cores (the only core count measured)"
        said = (f"{self.knee} cores; {pct}: {span}" if self.settled
                else f"not settled: {self.knee} cores, {pct} between {self.low} and {self.high} cores")
        if self.single_windows:
            said += " (one window at the knee or below it: the interval leaves out window-to-window noise)"
        return said

    @property
    def single_windows(self) -> bool:
        """The knee or the core count below it has one window: no draw of windows, requests only."""
        if self.knee is None:
            return False
        i = self.cores.index(self.knee)
        return any(self.windows[j] < 2 for j in range(max(0, i - 1), i + 1))


def monotone_fit(figures: ArrayLike, weights: ArrayLike) -> np.ndarray:
    """``figures`` (ascending cores) made non-increasing on the log scale, weighted; back in seconds."""
    y = np.log(np.asarray(figures, dtype=np.float64))
    w = np.asarray(weights, dtype=np.float64)
    return np.exp(isotonic_regression(y, weights=w, increasing=False).x)


def knee_of(fitted: ArrayLike, tolerance: float) -> int:
    """Index of the fewest cores whose fitted figure is within ``tolerance`` of the best."""
    f = np.asarray(fitted, dtype=np.float64)
    best = f.min()
    return int(np.flatnonzero(f <= best * (1 + tolerance) * (1 + 1e-12))[0])


def _clean(windows: Mapping[int, Sequence[ArrayLike]]) -> dict[int, list[np.ndarray]]:
    out: dict[int, list[np.ndarray]] = {}
    for cores in sorted(windows):
        kept = []
        for w in windows[cores]:
            a = np.asarray(w, dtype=np.float64).ravel()
            a = a[np.isfinite(a) & (a > 0)]
            if len(a):
                kept.append(a)
        if kept:
            out[int(cores)] = kept
    return out


def estimate_knee(windows: Mapping[int, Sequence[ArrayLike]], *, stat: str = "p90",
                  tolerance: float = 0.10, level: float = LEVEL, n_boot: int = N_BOOT,
                  seed: int = 0) -> KneeEstimate:
    """The knee of one configuration from every window's request TTFTs (see the module docstring)."""
    return _estimate(windows, stat, tolerance, level, n_boot, seed, bulk=True)


def _estimate_knee_reference(windows: Mapping[int, Sequence[ArrayLike]], *, stat: str = "p90",
                             tolerance: float = 0.10, level: float = LEVEL, n_boot: int = N_BOOT,
                             seed: int = 0) -> KneeEstimate:
    """:func:`estimate_knee` with every draw taken one ``rng.integers`` call at a time (the definition the bulk
    draws reproduce; the tests hold the two equal)."""
    return _estimate(windows, stat, tolerance, level, n_boot, seed, bulk=False)


def _estimate(windows: Mapping[int, Sequence[ArrayLike]], stat: str, tolerance: float, level: float, n_boot: int,
              seed: int, *, bulk: bool) -> KneeEstimate:
    f = statistic(stat)
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be at least 0, got {tolerance}")
    data = _clean(windows)
    if not data:
        return KneeEstimate(None, None, None, False, level, stat, tolerance)
    cores = tuple(data)
    pooled = [np.concatenate(ws) for ws in data.values()]
    figures = [f(a) for a in pooled]
    weights = [len(a) for a in pooled]
    fitted = monotone_fit(figures, weights)
    k = knee_of(fitted, tolerance)
    bitgen = np.random.default_rng(seed).bit_generator
    if bulk:
        draws = _bootstrap_knees(data, stat, tolerance, n_boot, bitgen)
    else:
        draws = _bootstrap_knees_reference(data, f, tolerance, n_boot, np.random.Generator(bitgen))
    tail = (1 - level) / 2
    lo, hi = (int(np.quantile(draws, q, method="inverted_cdf")) for q in (tail, 1 - tail))
    counts = np.bincount(draws, minlength=len(cores))
    return KneeEstimate(
        knee=cores[k], low=cores[lo], high=cores[hi], settled=hi - lo <= 1, level=level, statistic=stat,
        tolerance=tolerance, cores=cores, figures=tuple(float(x) for x in figures),
        fitted=tuple(float(x) for x in fitted), windows=tuple(len(w) for w in data.values()),
        requests=tuple(weights), shares={c: float(n) / n_boot for c, n in zip(cores, counts) if n},
        n_boot=n_boot, window_figures=tuple((c, f(w)) for c, ws in data.items() for w in ws))


def _bootstrap_knees_reference(data: dict[int, list[np.ndarray]], f: Callable[[np.ndarray], float],
                               tolerance: float, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """The knee index of each of ``n_boot`` draws: per draw and core count (ascending), its windows with
    replacement (``rng.integers(0, windows, windows)``), then each drawn window's requests with replacement
    (``rng.integers(0, requests, requests)``, in the order the windows were drawn); the statistic of them all;
    the monotone fit; :func:`knee_of`."""
    draws = np.empty(n_boot, dtype=np.int64)
    for b in range(n_boot):
        figs = np.empty(len(data))
        ws = np.empty(len(data))
        for i, wins in enumerate(data.values()):
            picked = [wins[j] for j in rng.integers(0, len(wins), size=len(wins))]
            a = np.concatenate([w[rng.integers(0, len(w), size=len(w))] for w in picked])
            figs[i], ws[i] = f(a), len(a)
        draws[b] = knee_of(monotone_fit(figs, ws), tolerance)
    return draws


# ---- The same draws in bulk ------------------------------------------------------------------------------------
#
# ``rng.integers(0, n, size=k)`` of a ``default_rng`` Generator (int64, n < 2**32) is numpy's
# ``random_bounded_uint64_fill``: for n == 1 it returns zeros and reads no bits; otherwise each value is Lemire's
# ``buffered_bounded_lemire_uint32`` on PCG64's ``next_uint32``. That reads 32-bit words off one stream (each
# 64-bit output gives its low word, then its high word, across calls) and maps a word u to ``(u * n) >> 32``,
# unless the low 32 bits of ``u * n`` are below ``2**32 % n``: then the word is thrown away and the next one read.
# So the bootstrap's draws are a function of the stream of words alone. Below, the stream is generated in bulk
# (``random_raw``) a chunk of draws at a time; every draw's window picks and request picks are read off it with
# array operations; a thrown-away word is found afterwards, taken out of the stream and the chunk read again (rare:
# a word is thrown away with probability ``(2**32 % n) / 2**32``, below ``n / 2**32``). The p50 or p90 of each resample comes from
# ranks: each core count's pooled requests are ranked once, a resample's order statistics are its ranks sorted,
# and numpy's linear interpolation between the two around the quantile is done with numpy's own operations
# (``numpy.quantile``'s index, weight and ``_lerp``), so each draw's figure is the float ``np.quantile`` gives.
# The monotone fit of every draw at once is the min-max formula of isotonic regression; a draw whose fitted
# figures lie within 1e-9 of the knee rule's threshold is fitted again by :func:`monotone_fit` and :func:`knee_of`
# themselves, so no rounding can move a draw's knee.

_QUANTILE = {"p50": 0.5, "p90": 0.9}
_MAX_REJECTIONS = 32         # past this many thrown-away words in one estimate, draw one call at a time instead
_MAX_POOLED = 1 << 20        # a core count's pooled requests, so a pick plus its window's offset is exact in a double
_NEAR = 1e-9                 # a draw's fit this close to the threshold, relative, is fitted again the reference way
_CHUNK_WORDS = 1 << 18       # words a chunk of draws reads: its arrays stay in a core's cache
_BLOCK_WORDS = 1 << 22       # words generated at a time (16 MB): every draw's at once, unless the windows are many


def _threshold(n: int) -> int:
    """``2**32 % n``: a word whose ``u * n`` has low 32 bits below it is thrown away (Lemire's rejection)."""
    return (1 << 32) % n


def _rejected(u: np.ndarray, n: np.ndarray | int, threshold: np.ndarray | int) -> np.ndarray:
    """Whether Lemire's map throws each word ``u`` away for modulus ``n``: the low 32 bits of ``u * n`` (uint32
    arithmetic wraps) below ``threshold``."""
    return np.asarray(np.multiply(u, np.asarray(n, dtype=np.uint32)) < np.asarray(threshold, dtype=np.uint32))


def _picks(u: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """``(u * n) >> 32`` of words ``u`` (Lemire's map to ``0 .. n-1``), exact: ``u * n`` < 2**53 in a double."""
    return np.multiply(u, np.asarray(n) * 2.0 ** -32, dtype=np.float64).astype(np.intp)


class _Count:
    """One core count's windows as the bulk draws read them: the windows' lengths and where each starts in the
    pooled requests, the rank of every pooled request, and the pooled requests sorted."""

    def __init__(self, windows: list[np.ndarray]) -> None:
        self.n = len(windows)                                         # the modulus of a window pick
        self.lengths = np.array([len(w) for w in windows], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.lengths)[:-1]))
        pooled = np.concatenate(windows)
        order = np.argsort(pooled, kind="stable")
        self.sorted = pooled[order]
        self.rank_dtype = np.int16 if len(pooled) < np.iinfo(np.int16).max else np.int32
        self.rank = np.empty(len(pooled), dtype=self.rank_dtype)
        self.rank[order] = np.arange(len(pooled))
        # a resample padded to the longest window has this rank in the pad's places: above every request's, last
        self.padded_rank = np.append(self.rank, np.iinfo(self.rank_dtype).max).astype(self.rank_dtype)
        # the words a window pick reads (none for one window), and those each window's request picks read (none
        # for a one-request window)
        self.pick_words = self.n if self.n > 1 else 0
        self.request_words = np.where(self.lengths > 1, self.lengths, 0)
        self.fixed = bool(np.all(self.lengths == self.lengths[0]))    # every draw reads as many words
        self.words = self.pick_words + self.n * int(self.request_words[0]) if self.fixed else -1
        self.most_words = self.pick_words + self.n * int(self.request_words.max())
        self.thresholds = (1 << 32) % self.lengths                   # per window: its request picks' rejection
        if self.fixed:                                                # each word of a draw here: its modulus
            self.moduli = np.repeat(np.array([self.n, self.lengths[0]], dtype=np.uint32),
                                    [self.pick_words, self.words - self.pick_words])
            self.word_thresholds = ((1 << 32) % np.maximum(self.moduli, 1).astype(np.uint64)).astype(np.uint32)


class _Words:
    """The stream of 32-bit words a Generator's ``integers`` reads, from the first: ``u`` holds the words not yet
    used (a thrown-away word taken out). Generated ``_BLOCK_WORDS`` at a time, no more than the draws can read
    (``count`` at most), so a chunk of draws reads a view of it."""

    def __init__(self, bitgen: np.random.BitGenerator, count: int) -> None:
        self.bitgen = bitgen
        self.left = count + 64                                     # words still to generate, at most
        self._all = np.empty(0, dtype=np.uint32)
        self._at = 0
        self.dropped = 0

    @property
    def u(self) -> np.ndarray:
        return self._all[self._at:]

    def ensure(self, count: int) -> None:
        have = len(self._all) - self._at
        if have < count:
            n = max(count - have, min(self.left, _BLOCK_WORDS))
            more = self.bitgen.random_raw((n + 1) // 2).view(np.uint32)
            self.left -= len(more)
            self._all, self._at = (np.concatenate((self._all[self._at:], more)) if have else more), 0

    def used(self, count: int) -> None:
        self._at += count

    def drop(self, at: int) -> None:
        self._all, self._at = np.delete(self._all[self._at:], at), 0
        self.dropped += 1


def _earliest(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _fixed_count(c: _Count, block: np.ndarray, q: float) -> np.ndarray:
    """Each draw's figure at a count whose windows have one length, from the draw's words there ``[rows, words]``:
    its window picks, then each picked window's request picks."""
    rows = len(block)
    picks = _picks(block[:, :c.n], c.n) if c.n > 1 else np.zeros((rows, 1), dtype=np.intp)
    length = int(c.lengths[0])
    first = c.offsets[picks]                                       # [rows, windows]: where each pick starts
    if length > 1:
        x = np.multiply(block[:, c.pick_words:].reshape(rows, c.n, length), length * 2.0 ** -32, dtype=np.float64)
        if c.n > 1:                                                # one window starts at 0
            x += first[:, :, None]
        ranks = c.rank[x.astype(np.intp)].reshape(rows, c.n * length)
    else:
        ranks = c.rank[first]
    ranks.sort(axis=1)
    return _quantile_of_sorted(ranks, c.n * length, c.sorted, q)


def _figures_fixed(counts: list[_Count], rows: int, u: np.ndarray, q: float,
                   figs: np.ndarray, ws: np.ndarray) -> int | None:
    """``rows`` draws where each count's windows have one length (every draw reads the same words): each
    count's figure and requests into ``figs`` and ``ws``; or the position of the first thrown-away word."""
    per_draw = sum(c.words for c in counts)
    u2 = u[:rows * per_draw].reshape(rows, per_draw)
    thresholds = np.concatenate([c.word_thresholds for c in counts])
    if np.any(thresholds):
        low = np.multiply(u2, np.concatenate([c.moduli for c in counts]))  # the low 32 bits of u * n
        if np.any(low.min(axis=0) < thresholds):
            return int(np.argmax((low < thresholds).ravel()))      # the first in the stream
    at = 0
    for i, c in enumerate(counts):
        figs[:, i] = _fixed_count(c, u2[:, at:at + c.words], q)
        ws[:, i] = c.n * int(c.lengths[0])
        at += c.words
    return None


def _block_starts(counts: list[_Count], rows: int, u: np.ndarray) -> tuple[np.ndarray, int]:
    """Where each of ``rows`` draws' words at each core count start in ``u`` ``[rows, counts]``, and the words
    the draws read. A count whose windows differ in length reads as many words as the windows it picked have
    requests: those counts' picks are read here one draw after another; the others read a fixed number."""
    ragged: list[tuple[int, int, tuple[int, ...]]] = []            # (fixed words before it, windows, their words)
    gap = 0
    for c in counts:
        if c.fixed:
            gap += c.words
        else:
            ragged.append((gap, c.n, tuple(int(x) for x in c.request_words)))
            gap = 0
    words = u.data                                                # indexing it gives Python ints
    used: list[int] = []
    add = used.append
    at = 0
    for _ in range(rows):
        for before, n, lengths in ragged:
            at += before
            read = n
            for k in range(at, at + n):
                read += lengths[(words[k] * n) >> 32]
            add(read)
            at += read
        at += gap
    reads = np.array([c.words for c in counts], dtype=np.int64)[None, :].repeat(rows, axis=0)
    reads[:, [i for i, c in enumerate(counts) if not c.fixed]] = np.array(used, dtype=np.int64).reshape(rows, -1)
    flat = np.cumsum(reads.ravel())                                # the stream is the draws' counts in order
    return (flat - reads.ravel()).reshape(rows, len(counts)), int(flat[-1]) if len(flat) else 0


def _figures_ragged(counts: list[_Count], rows: int, u: np.ndarray, q: float,
                    figs: np.ndarray, ws: np.ndarray) -> tuple[int | None, int]:
    """As :func:`_figures_fixed` where a count's windows differ in length (a resample is padded to the longest
    window with a rank above every request's, which sorts last); also the words the draws read."""
    starts, read = _block_starts(counts, rows, u)
    bad: int | None = None
    for i, c in enumerate(counts):
        s = starts[:, i]
        if c.fixed:                                                # its draws' words, each a block from s
            block = sliding_window_view(u, c.words)[s] if c.words else np.empty((rows, 0), dtype=np.uint32)
            wrong = np.multiply(block, c.moduli) < c.word_thresholds
            if wrong.any():
                bad = _earliest(bad, int((s[:, None] + np.arange(c.words))[wrong].min()))
            figs[:, i] = _fixed_count(c, block, q)
            ws[:, i] = c.n * int(c.lengths[0])
            continue
        if c.n > 1:
            at = s[:, None] + np.arange(c.n)
            pw = u[at]
            if _threshold(c.n):
                wrong = _rejected(pw, c.n, _threshold(c.n))
                if wrong.any():
                    bad = _earliest(bad, int(at[wrong].min()))
            picks = _picks(pw, c.n)
        else:
            picks = np.zeros((rows, 1), dtype=np.intp)
        length = c.lengths[picks][:, :, None]                      # [rows, windows, 1]
        used = c.request_words[picks]
        begin = s[:, None] + c.pick_words + np.cumsum(used, axis=1) - used
        r = np.arange(int(c.lengths.max()))
        w = sliding_window_view(u, len(r))[begin]                  # [rows, windows, longest]: the words from there
        wrong = _rejected(w, length, c.thresholds[picks][:, :, None])
        if wrong.any():
            wrong &= r < length                                     # past a window's requests is not its word
            if wrong.any():
                bad = _earliest(bad, int((begin[:, :, None] + r)[wrong].min()))
        x = np.multiply(w, length * 2.0 ** -32, dtype=np.float64)
        x += c.offsets[picks][:, :, None]
        np.copyto(x, len(c.rank), where=r >= length)               # past a window's requests: the pad's place
        ranks = c.padded_rank[x.astype(np.intp)]
        ranks = ranks.reshape(rows, -1)
        ranks.sort(axis=1)
        n = length.sum(axis=(1, 2))
        figs[:, i] = _quantile_of_sorted(ranks, n, c.sorted, q)
        ws[:, i] = n
    return bad, read


def _quantile_of_sorted(sorted_ranks: np.ndarray, n: np.ndarray | int, values: np.ndarray, q: float) -> np.ndarray:
    """``np.quantile(a, q)`` (method 'linear') of each row's resample, from its ranks sorted ascending and its
    length ``n`` (one for every row, or each row's): numpy's index, weight and interpolation, operation for
    operation."""
    if isinstance(n, int):                                         # every row has n ranks
        virtual = np.float64(n - 1) * np.float64(q)
        prev = -1 if virtual >= n - 1 else int(np.floor(virtual))  # -1: the last
        gamma = virtual - prev
        a = values[sorted_ranks[:, prev]]
        b = values[sorted_ranks[:, -1 if prev < 0 else prev + 1]]
        diff = b - a
        return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
    virtuals = (n - 1).astype(np.float64) * np.float64(q)
    above = virtuals >= n - 1
    prevs = np.where(above, -1, np.floor(virtuals)).astype(np.intp)
    gammas = virtuals - prevs
    rows = np.arange(len(n))
    a = values[sorted_ranks[rows, np.where(above, n - 1, prevs)]]
    b = values[sorted_ranks[rows, np.where(above, n - 1, prevs + 1)]]
    diff = b - a
    return np.where(gammas >= 0.5, b - diff * (1 - gammas), a + diff * gammas)


def _fit_knees(figs: np.ndarray, ws: np.ndarray, tolerance: float) -> np.ndarray:
    """:func:`knee_of` of :func:`monotone_fit` of each row, all rows at once.

    The non-increasing weighted fit of ``y`` at ``j`` is the least over ``s <= j`` of the most over ``t >= j``
    of the weighted mean of ``y[s..t]``; a row with a fitted figure within ``_NEAR`` of :func:`knee_of`'s
    threshold (other than the best itself) is fitted again by the functions themselves, so its knee is theirs."""
    n_boot, m = figs.shape
    y = np.log(figs)
    wy = ws * y
    means = np.full((m, m, n_boot), np.inf)                        # [s, t]: weighted mean of y[s..t], s <= t
    for s in range(m):
        sw = np.zeros(n_boot)
        swy = np.zeros(n_boot)
        for t in range(s, m):
            sw = sw + ws[:, t]
            swy = swy + wy[:, t]
            means[s, t] = swy / sw
    most = np.maximum.accumulate(means[:, ::-1], axis=1)[:, ::-1]  # [s, j]: the most over t >= j
    lower = np.arange(m)[:, None] <= np.arange(m)[None, :]         # s <= j
    fitted = np.exp(np.where(lower[:, :, None], most, np.inf).min(axis=0).T)  # [n_boot, m]
    best = fitted.min(axis=1, keepdims=True)
    threshold = best * (1 + tolerance) * (1 + 1e-12)
    knees = np.argmax(fitted <= threshold, axis=1).astype(np.int64)
    near = (np.abs(fitted - threshold) <= _NEAR * threshold) & (fitted != best)
    for b in np.flatnonzero(near.any(axis=1)):
        knees[b] = knee_of(monotone_fit(figs[b], ws[b]), tolerance)
    return knees


def _bulk_figures(counts: list[_Count], q: float, n_boot: int,
                  bitgen: np.random.BitGenerator) -> tuple[np.ndarray, np.ndarray] | None:
    """Each draw's figure and requests per core count ``[n_boot, counts]``, a chunk of draws at a time; None
    past ``_MAX_REJECTIONS`` thrown-away words."""
    figs = np.empty((n_boot, len(counts)))
    ws = np.empty((n_boot, len(counts)))
    fixed = all(c.fixed for c in counts)
    most = sum(c.most_words for c in counts)                        # words a draw reads at most (fixed: exactly)
    margin = max(c.most_words for c in counts)                      # a count's words read from where they start
    chunk = max(1, _CHUNK_WORDS // max(1, most))
    words = _Words(bitgen, n_boot * most + margin)
    for s in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - s)
        while True:
            words.ensure(rows * most + margin)
            if fixed:
                bad, read = _figures_fixed(counts, rows, words.u, q, figs[s:s + rows], ws[s:s + rows]), rows * most
            else:
                bad, read = _figures_ragged(counts, rows, words.u, q, figs[s:s + rows], ws[s:s + rows])
            if bad is None:
                words.used(read)
                break
            if words.dropped == _MAX_REJECTIONS:
                return None
            words.drop(bad)
    return figs, ws


def _bootstrap_knees(data: dict[int, list[np.ndarray]], stat: str, tolerance: float, n_boot: int,
                     bitgen: np.random.BitGenerator) -> np.ndarray:
    """:func:`_bootstrap_knees_reference`'s draws from the same ``bitgen``, in bulk for the p50 and the p90;
    the other statistics (their float depends on the order of a sum) and odd cases draw one call at a time."""
    start = bitgen.state
    if (stat in _QUANTILE and n_boot > 0 and sys.byteorder == "little"
            and all(sum(len(w) for w in ws) < _MAX_POOLED for ws in data.values())):
        got = _bulk_figures([_Count(ws) for ws in data.values()], _QUANTILE[stat], n_boot, bitgen)
        if got is not None:
            return _fit_knees(*got, tolerance)
    bitgen.state = start
    return _bootstrap_knees_reference(data, statistic(stat), tolerance, n_boot, np.random.Generator(bitgen))


def decode_needs_more(ttft: KneeEstimate, tpot: KneeEstimate | None) -> bool:
    """Whether the knee of the time per output token lies above TTFT's beyond its interval: its whole interval
    is above TTFT's knee, so the fewest cores for both is TPOT's knee, not TTFT's."""
    return (tpot is not None and ttft.knee is not None and tpot.knee is not None and tpot.low is not None
            and tpot.low > ttft.knee)


__all__ = ["LEVEL", "N_BOOT", "STATISTICS", "KneeEstimate", "decode_needs_more", "estimate_knee", "knee_of",
           "monotone_fit", "statistic"]
