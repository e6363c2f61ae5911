"""The knee search's decisions: which core count to measure next, and when to stop (pure).

Why. A sweep spends its GPU-hours on vLLM starts and windows, once per core count and repeat; a grid of
7 core counts x 3 repeats is 21 trials per configuration, and the answer most readers want is one
number, the knee. This module decides, from everything measured so far, the next window worth running;
it does no I/O and knows nothing of Ray, MLflow, the executor or how the knee is estimated.

Its input is the estimate the report prints (:func:`orchestrator.observe.analysis.knee.estimate_knee`,
called by :mod:`orchestrator.control.search`): anything with ``knee``, ``low``, ``high`` (core counts)
and ``window_figures`` ((cores, figure) per window), over the windows measured so far. So the search stops
on exactly the statement the report then makes.

The search (:func:`next_cores`), validated offline by ``benchmarks/knee_search_sim.py`` (its results:
``benchmarks/results/knee-search-sim.md``):

1. measure the most cores, then the fewest (one window each);
2. give every measured core count ``min_windows`` windows (fewest windows first);
3. bisect: while the knee the estimate names and the largest measured core count below it are not
   neighbours in the grid, measure the grid's middle count between them;
4. narrow the interval: add a window where the interval is (the core counts inside it, the most cores and
   the measured count just below the knee), the one with the fewest windows first (the knee first among
   equals), at most ``max_windows`` each; a count whose window figures are already known within
   ``until_ci`` (the relative half-width of their 90% t-interval, two windows or more) gets no more;
5. stop when the knee is **settled** (its interval spans at most one grid step) and **bracketed** (it is
   the fewest cores, or the count below it is measured), and the knee and the count below it have
   ``KNEE_WINDOWS`` windows each (else the one short of it, the count below first, gets another: a
   "second window at the knee"); or when no count may get another window.

   Tried and not adopted (``benchmarks/knee_search_sim.py``'s "tried" rows): narrowing also at grid counts
   inside the interval that have no window yet. The H200 search of 2026-12-04 stopped on 2-4 cores without
   ever measuring 3; on top of the rule above, measuring such counts named the grid's knee in 97% and 96% of
   seeds (against 95% and 96%) for 0.4 and 1.7 more windows, and settled less often (84% and 75% against
   90% and 83%).

The budget (:func:`budget_stop`): a search also stops once it ran ``max_trials`` trials or spent
``max_gpu_hours`` (each trial's held seconds times its GPUs, a CPU trial's once).
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scipy.stats import t as student_t


class Reason(str, enum.Enum):
    """Why a trial was chosen: the report's "why each point" column."""

    MOST = "most cores"
    FEWEST = "fewest cores"
    MINIMUM = "minimum windows"
    BISECT = "bisect"
    NARROW = "narrow the interval"
    KNEE_NOISE = "second window at the knee"


# Windows the knee and the count just below it need before the search stops settled: with one, the interval
# has no window-to-window noise in it (the estimate draws that window's requests only). Replayed on both dense
# H200 curves (benchmarks/results/knee-search-sim.md, 500 seeds, the same draws for both rules, at most 3
# windows a count), it named the 6-repeat grid's knee in 95% and 96% of seeds instead of 92% and 93%, and two
# runs named the same knee in 91% and 95% instead of 84% and 89%, for 0.9 and 1.3 more windows.
KNEE_WINDOWS = 2


class Stop(str, enum.Enum):
    """Why a search ended."""

    SETTLED = "settled"                  # the knee is settled and bracketed
    REPEAT_CAP = "repeat cap"            # not settled, and no core count may get another window
    MAX_TRIALS = "max_trials"            # the trial budget is spent
    MAX_GPU_HOURS = "max_gpu_hours"      # the GPU-hour budget is spent
    NO_TRIAL_LEFT = "no trial left"      # the count the search wants has no repeat left (its trials failed)
    NO_KNEE = "no knee"                  # both ends measured, and no window counts for the knee


class Estimate(Protocol):
    @property
    def knee(self) -> int | None: ...
    @property
    def low(self) -> int | None: ...
    @property
    def high(self) -> int | None: ...
    @property
    def window_figures(self) -> tuple[tuple[int, float], ...]: ...


@dataclass(frozen=True)
class Decision:
    """The next core count and why, or why the search ends (``cores`` None)."""

    cores: int | None
    reason: Reason | None = None
    stop: Stop | None = None

    @property
    def done(self) -> bool:
        return self.cores is None


def relative_half_width(figures: Sequence[float], level: float = 0.90) -> float:
    """The relative half-width of the ``level`` t-interval of the mean of ``figures``; inf below two."""
    n = len(figures)
    mean = statistics.fmean(figures) if n else math.nan
    if n < 2 or not mean > 0:
        return math.inf
    return float(student_t.ppf(0.5 + level / 2, n - 1)) * statistics.stdev(figures) / math.sqrt(n) / mean


def next_cores(allowed: Sequence[int], windows: Mapping[int, int], est: Estimate, max_windows: int, *,
               min_windows: int = 1, until_ci: float = 0.0) -> Decision:
    """The next core count to measure, or why to stop (see the module docstring).

    ``allowed``: the grid's core counts, ascending; ``windows``: completed windows per measured core count;
    ``est``: the estimate over the windows that count for the knee (a core count whose windows mostly timed
    out is measured, and below the knee, but has no figure)."""
    grid = sorted(allowed)
    have = {c: n for c, n in windows.items() if n > 0}
    if grid[-1] not in have:
        return Decision(grid[-1], Reason.MOST)
    if grid[0] not in have:
        return Decision(grid[0], Reason.FEWEST)
    short = [c for c in have if have[c] < min(min_windows, max_windows)]
    if short:
        return Decision(min(short, key=lambda c: (have[c], c)), Reason.MINIMUM)
    if est.knee is None or est.low is None or est.high is None:
        return Decision(None, stop=Stop.NO_KNEE)
    i = grid.index(est.knee)
    below = [c for c in have if c < est.knee]
    if below:
        j = grid.index(max(below))
        if i - j > 1:
            return Decision(grid[(i + j) // 2], Reason.BISECT)
    lo, hi = grid.index(est.low), grid.index(est.high)
    if hi - lo <= 1 and (i == 0 or grid[i - 1] in have):
        single = [c for c in grid[max(0, i - 1):i + 1] if have[c] < min(KNEE_WINDOWS, max_windows)]
        if single:  # its interval has no window-to-window noise in it yet
            return Decision(single[0], Reason.KNEE_NOISE)
        return Decision(None, stop=Stop.SETTLED)
    wanted = sorted({c for c in have if est.low <= c <= est.high} | {grid[-1]} | ({max(below)} if below else set()))
    figures: dict[int, list[float]] = {}
    for c, f in est.window_figures:
        figures.setdefault(c, []).append(f)
    room = [c for c in wanted if have[c] < max_windows
            and not (until_ci > 0 and relative_half_width(figures.get(c, [])) <= until_ci)]
    if not room:
        return Decision(None, stop=Stop.REPEAT_CAP)
    return Decision(min(room, key=lambda c: (have[c], c != est.knee)), Reason.NARROW)


def budget_stop(trials: int, gpu_seconds: float, *, max_trials: int | None,
                max_gpu_hours: float | None) -> Stop | None:
    """The budget a search has spent with ``trials`` run and ``gpu_seconds`` held, if any; else None."""
    if max_trials is not None and trials >= max_trials:
        return Stop.MAX_TRIALS
    if max_gpu_hours is not None and gpu_seconds >= max_gpu_hours * 3600:
        return Stop.MAX_GPU_HOURS
    return None


def gpu_seconds(started_at: float, ended_at: float, gpus: int) -> float:
    """What one trial spends of a GPU-hour budget: its held seconds times its GPUs (a CPU trial's once)."""
    return max(0.0, ended_at - started_at) * max(gpus, 1)


__all__ = ["Decision", "Estimate", "Reason", "Stop", "budget_stop", "gpu_seconds", "next_cores",
           "relative_half_width"]
