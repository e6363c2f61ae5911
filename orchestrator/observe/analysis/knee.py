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

Every draw comes from ``numpy.random.default_rng(seed)``: the same windows and seed give the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
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
    rng = np.random.default_rng(seed)
    draws = np.empty(n_boot, dtype=np.int64)
    for b in range(n_boot):
        figs = np.empty(len(cores))
        ws = np.empty(len(cores))
        for i, wins in enumerate(data.values()):
            picked = [wins[j] for j in rng.integers(0, len(wins), size=len(wins))]
            a = np.concatenate([w[rng.integers(0, len(w), size=len(w))] for w in picked])
            figs[i], ws[i] = f(a), len(a)
        draws[b] = knee_of(monotone_fit(figs, ws), tolerance)
    tail = (1 - level) / 2
    lo, hi = (int(np.quantile(draws, q, method="inverted_cdf")) for q in (tail, 1 - tail))
    counts = np.bincount(draws, minlength=len(cores))
    return KneeEstimate(
        knee=cores[k], low=cores[lo], high=cores[hi], settled=hi - lo <= 1, level=level, statistic=stat,
        tolerance=tolerance, cores=cores, figures=tuple(float(x) for x in figures),
        fitted=tuple(float(x) for x in fitted), windows=tuple(len(w) for w in data.values()),
        requests=tuple(weights), shares={c: float(n) / n_boot for c, n in zip(cores, counts) if n},
        n_boot=n_boot, window_figures=tuple((c, f(w)) for c, ws in data.items() for w in ws))


def decode_needs_more(ttft: KneeEstimate, tpot: KneeEstimate | None) -> bool:
    """Whether the knee of the time per output token lies above TTFT's beyond its interval: its whole interval
    is above TTFT's knee, so the fewest cores for both is TPOT's knee, not TTFT's."""
    return (tpot is not None and ttft.knee is not None and tpot.knee is not None and tpot.low is not None
            and tpot.low > ttft.knee)


__all__ = ["LEVEL", "N_BOOT", "STATISTICS", "KneeEstimate", "decode_needs_more", "estimate_knee", "knee_of",
           "monotone_fit", "statistic"]
