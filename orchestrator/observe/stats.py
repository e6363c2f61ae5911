"""Confidence intervals of TTFT quantiles over repeats (pure, seeded).

A configuration at one core count is measured by a few *repeats* (trials that differ only in
the repeat index), each holding many *requests*. Repeats vary more than their requests suggest
(another start of vLLM, another placement, a neighbour), so an interval that resampled the
requests alone would be too narrow. The bootstrap here resamples at both levels:

1. draw ``k`` repeats out of the ``k`` with replacement;
2. within each drawn repeat, draw its ``n_i`` requests out of its ``n_i`` with replacement;
3. compute the statistic the tables show: the *median over repeats of each repeat's quantile*
   (``report.aggregate`` takes the median over repeats of every trial's TTFT percentile);

and the interval is the percentile interval of that statistic over ``n_boot`` draws. With one
repeat it is the ordinary bootstrap of a quantile. Quantiles use linear interpolation
(numpy's default, as ``workloads.metrics.percentile``), so the point estimate from the
records equals the trial's logged figure.

Every draw comes from ``numpy.random.default_rng(seed)``: the same records and seed give the
same interval, so a report rebuilt later is identical. :func:`cell_seed` derives a seed per
table cell from its identity, so adding a configuration does not move the others' intervals.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

N_BOOT = 1000
LEVEL = 0.95
_CHUNK = 2_000_000  # most resampled values held at once (8 bytes each)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval (NaN throughout when there was no data)."""

    point: float
    low: float
    high: float

    @property
    def known(self) -> bool:
        return not math.isnan(self.point)

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high


NO_DATA = Interval(math.nan, math.nan, math.nan)


def cell_seed(base: int, key: str) -> int:
    """A seed for one table cell: ``base`` mixed with a stable hash (CRC-32) of the cell's identity."""
    return (int(base) * 1_000_003 + zlib.crc32(key.encode())) % 2**32


def _check(qs: Sequence[float] | np.ndarray, n_boot: int, level: float) -> np.ndarray:
    q = np.asarray(qs, dtype=np.float64)
    if q.ndim != 1 or not len(q) or np.any((q <= 0) | (q >= 1)):
        raise ValueError(f"quantiles must be a non-empty list of fractions in (0, 1), got {list(qs)}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return q


def _arrays(samples: Sequence[ArrayLike]) -> list[np.ndarray]:
    """The repeats that hold at least one finite value, as float arrays (NaNs dropped)."""
    out = []
    for s in samples:
        a = np.asarray(s, dtype=np.float64).ravel()
        a = a[np.isfinite(a)]
        if len(a):
            out.append(a)
    return out


def repeat_quantiles(samples: Sequence[ArrayLike], qs: Sequence[float] | np.ndarray) -> np.ndarray:
    """The point estimates: for each ``q`` in ``qs``, the median over repeats of ``quantile(repeat, q)``.

    NaN for every ``q`` when no repeat holds a value."""
    q = _check(qs, 1, LEVEL)
    arrays = _arrays(samples)
    if not arrays:
        return np.full(len(q), np.nan)
    return np.median(np.stack([np.quantile(a, q) for a in arrays]), axis=0)


def _resampled_quantiles(a: np.ndarray, draws: int, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``draws`` bootstrap resamples of ``a`` (each of ``len(a)`` values): their quantiles, shape (draws, len(q))."""
    out = np.empty((draws, len(q)))
    step = max(1, _CHUNK // len(a))
    for start in range(0, draws, step):
        stop = min(draws, start + step)
        idx = rng.integers(0, len(a), size=(stop - start, len(a)))
        out[start:stop] = np.quantile(a[idx], q, axis=1).T
    return out


def bootstrap_quantiles(samples: Sequence[ArrayLike], qs: Sequence[float], *, n_boot: int = N_BOOT,
                        level: float = LEVEL, seed: int = 0, resample_repeats: bool = True) -> list[Interval]:
    """One :class:`Interval` per ``q`` in ``qs`` (fractions, e.g. 0.5, 0.9, 0.99) of the repeats in ``samples``.

    ``samples`` holds one sequence of values (say, TTFT seconds of ok requests) per repeat; empty
    repeats are left out. ``point`` is :func:`repeat_quantiles`; ``low``/``high`` are the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the two-level bootstrap described in the
    module docstring. ``resample_repeats=False`` keeps the repeats fixed and resamples requests
    only (the narrower interval that ignores repeat-to-repeat variation).
    """
    q = _check(qs, n_boot, level)
    arrays = _arrays(samples)
    if not arrays:
        return [NO_DATA] * len(q)
    point = repeat_quantiles(arrays, q)
    k = len(arrays)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, k, size=(n_boot, k)) if resample_repeats else np.tile(np.arange(k), (n_boot, 1))
    stat = np.empty((n_boot, k, len(q)))
    for j, a in enumerate(arrays):
        rows, slots = np.nonzero(pick == j)  # every slot that drew repeat j gets its own resample
        if len(rows):
            stat[rows, slots] = _resampled_quantiles(a, len(rows), q, rng)
    boot = np.median(stat, axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(boot, [tail, 1 - tail], axis=0)
    return [Interval(float(p), float(lo), float(hi)) for p, lo, hi in zip(point, low, high)]


__all__ = ["LEVEL", "NO_DATA", "N_BOOT", "Interval", "bootstrap_quantiles", "cell_seed", "repeat_quantiles"]
