"""The knee search: which core count to measure next, so that the knee is found without the full grid (pure).

Why. A sweep spends its GPU-hours on vLLM starts (56-78 s warm) and windows (20-40 s), once per core count
and repeat; a grid of 7 core counts x 3 repeats is 21 trials per configuration, and the answer most readers
want is one number, the knee. Load generators search their load axis (GuideLLM's sweep profile, AIPerf's
concurrency sweeps); none searches the core axis. This module decides, from everything measured so far,
which trials are worth running next; it does no I/O and knows nothing of Ray, MLflow or the executor.

Terms. A *point* is one core count of the allowed list; each *trial* there gives one *repeat*: its TTFT p50.

The knee (the report's definition, ``observe.report.comparison``): a point's figure is the median over its
completed trials of their TTFT p50. A point is left out (here: outside the band) when no completed trial
has a TTFT p50, or when the mean timeout rate of its completed trials exceeds :data:`TIMEOUT_MAJORITY`.
A failed trial is dropped from the figures but counts as a trial spent. The best is the lowest figure;
the knee is the fewest cores whose figure is at most ``(1 + tolerance) * best``. With every point
measured, :func:`search_state`'s ``knee`` equals the report's.

The search. Measure the most and the fewest cores. The knee candidate ``k`` is the fewest measured point
whose figure lies inside the band, and ``lo`` the largest measured point below it (outside, by
construction). While ``lo`` and ``k`` are not adjacent in the allowed list, measure the middle allowed
point between them (bisection on the band), going by the figures alone once both have ``repeats.min``
trials. When they are adjacent (or ``k`` is the smallest allowed) the pair is settled with the rule below;
the knee is *bracketed* when ``k`` is settled inside and ``lo`` settled outside. Nothing is incremental:
the state is recomputed from all observations, so when the best changes (a later point is faster), or a
settling repeat flips a verdict, the bracket moves and bisection resumes from there.

Adaptive repeats (the rule). Every measured point gets ``repeats.min`` trials. A point ``p`` is compared
with the best ``b`` through the ratio of their figures, ``r = est_p / est_b``, on the log scale (TTFT is
positive and skewed; the band edge is a ratio): ``h = t(0.975, df) * sqrt(s_p^2/n_p + s_b^2/n_b)``, with
``s`` the standard deviation of the log p50s of each point's ``n`` values and ``df`` Welch's. Then ``p`` is

- *inside* when ``r * e^h <= 1 + tolerance``, *outside* when ``r / e^h > 1 + tolerance``;
- else *settled by its figure* when the interval is already narrow, ``e^h - 1 <= repeats.until_ci``, or
  when neither ``p`` nor ``b`` may get a useful trial (``repeats.max``);
- else *unclear*: one more trial goes to whichever of ``p`` and ``b`` contributes more of the variance
  (never to one with none: a repeat there cannot narrow the interval).

Only the last pair (and through it the best) gets repeats beyond ``min``: bisecting on the figures and
correcting later is cheaper than settling every midpoint. A point with fewer than two values has no
spread yet and is unclear. Why a t-interval per point and not a bootstrap: with 2-6 repeats a bootstrap
of the median spans no more than [min, max] of the repeats and is far too narrow; why per point: the
starved points are the noisy ones (26% spread at 1 core against 2% at 12 in h200-calibration). No point
gets more than ``repeats.max`` trials, so the search never runs more than the full grid,
``len(allowed) * repeats.max``.

Assumption. TTFT p50 is monotone-ish in cores: non-increasing up to noise. The search never measures
between two points that are both outside, so an inside point hidden there (1 core outside, 2 inside, 3
outside) is missed, as by any bisection; nor above the most cores' neighbour it needs, so a best hidden
between (4 cores faster than 12) leaves the band relative to a slower best. What the data contradict is
not ignored: the knee is always the fewest *measured* inside point, so a smaller point found inside
re-brackets on it, and a point above an inside one that falls outside the band is named in
``SearchState.contradictions`` for the report.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

TIMEOUT_MAJORITY = 0.5  # the report's (observe.report.comparison.TIMEOUT_MAJORITY; a unit test pins them equal)
# Student's t, two-sided 95%, for df = 1..30; beyond, 1.96 + 2.4 / df is within 0.003 of it.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def _t975(df: float) -> float:
    """The t quantile at the whole degrees of freedom below ``df`` (rounding down is the cautious side)."""
    d = max(1, int(math.floor(df + 1e-9)))
    return _T975[d - 1] if d <= len(_T975) else 1.96 + 2.4 / d


class Verdict(str, Enum):
    INSIDE = "inside"
    OUTSIDE = "outside"
    UNCLEAR = "unclear"


@dataclass(frozen=True)
class RepeatPolicy:
    """Trials per point: at least ``min``, at most ``max``; ``until_ci``: the relative half-width of the
    ratio interval at which a point near the band edge counts as settled (see the module docstring)."""

    min: int = 2
    max: int = 6
    until_ci: float = 0.05

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max or self.until_ci < 0:
            raise ValueError(f"need 1 <= min <= max and until_ci >= 0, got {self}")


@dataclass(frozen=True)
class Observation:
    """One finished trial. ``ttft_p50_s`` None: no request finished. ``failed``: the trial itself failed
    (the report drops it); a window that timed out entirely is ``Observation(c, None, timeout_rate=1.0)``."""

    cores: int
    ttft_p50_s: float | None
    timeout_rate: float = 0.0
    failed: bool = False


@dataclass(frozen=True)
class Proposal:
    """A trial to run: its core count, the repeat index it will be, and a sentence saying why."""

    cores: int
    repeat: int
    reason: str


@dataclass(frozen=True)
class Point:
    """What is known at one measured core count. ``estimate``: the report's figure (None when left out);
    ``low``/``high``: the point's own 95% interval (log-scale t, around the estimate; None below two
    values); ``leaning``: inside or outside by the estimate alone; ``note``: why the verdict is what it is."""

    cores: int
    trials: int
    values: tuple[float, ...]  # the completed trials' TTFT p50s, sorted
    estimate: float | None
    low: float | None
    high: float | None
    verdict: Verdict
    leaning: Verdict
    note: str


@dataclass(frozen=True)
class SearchState:
    """Where the search stands. ``points``: the measured core counts, fewest first; ``knee``: the report's
    knee over them; ``bracketed``: the knee is settled inside and its smaller allowed neighbour settled
    outside; ``done``: nothing is left to measure (bracketed, or no point has a usable TTFT p50);
    ``note``: one sentence for the report."""

    points: tuple[Point, ...]
    best_cores: int | None
    knee: int | None
    bracketed: bool
    done: bool
    trials: int
    contradictions: tuple[tuple[int, int], ...]  # (inside, outside) pairs with inside < outside
    note: str

    def point(self, cores: int) -> Point | None:
        return next((p for p in self.points if p.cores == cores), None)


@dataclass(frozen=True)
class _Raw:
    """One point's trials as the report reads them."""

    cores: int
    trials: int
    values: tuple[float, ...]
    left_out: str | None  # why the report leaves this point out

    @property
    def estimate(self) -> float | None:
        return None if self.left_out else statistics.median(self.values)

    @property
    def var_log(self) -> float:
        """The variance of the mean log p50 (s^2 / n), infinite below two values: no spread is known."""
        n = len(self.values)
        return statistics.variance([math.log(v) for v in self.values]) / n if n > 1 else math.inf


def _raw(cores: int, obs: list[Observation]) -> _Raw:
    done = [o for o in obs if not o.failed]
    values = tuple(float(o.ttft_p50_s) for o in done
                   if o.ttft_p50_s is not None and math.isfinite(o.ttft_p50_s) and o.ttft_p50_s > 0)
    rate = statistics.fmean([o.timeout_rate for o in done]) if done else 0.0
    left_out = ("every trial failed" if not done
                else f"most requests timed out (mean timeout rate {rate:.0%})" if rate > TIMEOUT_MAJORITY
                else "no completed trial has a TTFT p50" if not values else None)
    return _Raw(cores, len(obs), tuple(sorted(values)), left_out)


def _half_width(p: _Raw, b: _Raw) -> float:
    """``h`` of the module docstring: the log half-width of the 95% interval of ``est_p / est_b``."""
    a, c = p.var_log, b.var_log
    if math.isinf(a) or math.isinf(c):
        return math.inf
    if a + c == 0:
        return 0.0
    df = (a + c) ** 2 / (a * a / (len(p.values) - 1) + c * c / (len(b.values) - 1))
    return _t975(df) * math.sqrt(a + c)


def _judge(p: _Raw, b: _Raw | None, tol: float, policy: RepeatPolicy) -> tuple[Point, int | None, str]:
    """The point's verdict, and when unclear the core count whose next trial helps most and why."""
    est = p.estimate
    low = high = None
    if est is not None and len(p.values) > 1:
        w = _t975(len(p.values) - 1) * math.sqrt(p.var_log)
        low, high = est * math.exp(-w), est * math.exp(w)
    best = b.estimate if b is not None else None
    edge = (1 + tol) * best if best is not None else math.nan
    leaning = Verdict.INSIDE if est is not None and est <= edge else Verdict.OUTSIDE

    def point(verdict: Verdict, note: str) -> Point:
        return Point(p.cores, p.trials, p.values, est, low, high, verdict, leaning, note)

    if p.trials < policy.min:
        return point(Verdict.UNCLEAR, f"{p.trials} of {policy.min} repeats"), None, ""
    if p.left_out or b is None or est is None or best is None:
        return point(Verdict.OUTSIDE, p.left_out or "no point has a TTFT p50"), None, ""
    if b.cores == p.cores:
        return point(Verdict.INSIDE, "the best"), None, ""
    h = _half_width(p, b)
    r = est / best
    if r * math.exp(h) <= 1 + tol:
        return point(Verdict.INSIDE, f"ratio to the best {r:.3f}, interval up to {r * math.exp(h):.3f}"), None, ""
    if r * math.exp(-h) > 1 + tol:
        return point(Verdict.OUTSIDE, f"ratio to the best {r:.3f}, interval from {r * math.exp(-h):.3f}"), None, ""
    if math.exp(h) - 1 <= policy.until_ci:
        return point(leaning, f"near the band edge, settled: interval +-{math.exp(h) - 1:.1%}"), None, ""
    order = [p, b] if p.var_log >= b.var_log else [b, p]  # the repeat goes where most of the spread is
    helper = next((x for x in order if x.trials < policy.max and x.var_log > 0), None)
    if helper is None:
        return point(leaning, f"near the band edge at the repeat cap ({policy.max})"), None, ""
    span = f"{est * math.exp(-h):.3g}-{est * math.exp(h):.3g} s"
    why = f"{p.cores} cores' interval {span} straddles the band edge {edge:.3g} s"
    if helper is b:
        why = f"one more repeat of the best ({b.cores} cores): {why}, and most of that spread is the best's"
    else:
        why = f"one more repeat: {why}"
    return point(Verdict.UNCLEAR, why), helper.cores, why


def _plan(allowed: Sequence[int], observations: Sequence[Observation], tolerance: float,
          repeats: RepeatPolicy) -> tuple[SearchState, list[tuple[int, int, str]]]:
    """The state, and the targets: (cores, trials it should have, why), most useful first."""
    grid = sorted(set(int(c) for c in allowed))
    if not grid or grid[0] < 1 or tolerance < 0:
        raise ValueError(f"need positive core counts and tolerance >= 0, got {list(allowed)}, {tolerance}")
    by: dict[int, list[Observation]] = {}
    for o in observations:
        if o.cores not in grid:
            raise ValueError(f"observation at {o.cores} cores, not in the allowed {grid}")
        by.setdefault(o.cores, []).append(o)
    raw = {c: _raw(c, by[c]) for c in sorted(by)}
    targets: list[tuple[int, int, str]] = []
    for c, why in ((grid[-1], "the most cores of the range (first bracket end)"),
                   (grid[0], "the fewest cores of the range (first bracket end)")):
        if c not in raw or raw[c].trials < repeats.min:
            targets.append((c, repeats.min, why))
    for c, x in raw.items():
        if x.trials < repeats.min and c not in (grid[0], grid[-1]):
            targets.append((c, repeats.min, f"{repeats.min} repeats for every measured point"))
    usable = [x for x in raw.values() if x.estimate is not None]
    best = min(usable, key=lambda x: (x.estimate, x.cores)) if usable else None
    judged = {c: _judge(x, best, tolerance, repeats) for c, x in raw.items()}
    points = tuple(j[0] for j in judged.values())
    inside = [p.cores for p in points if p.leaning is Verdict.INSIDE]
    knee = min(inside) if inside else None
    contradictions = tuple((a, p.cores) for a in inside for p in points
                           if p.cores > a and p.leaning is Verdict.OUTSIDE)
    bracketed, note = False, "measuring the ends of the range"
    ends_known = all(c in raw and raw[c].trials >= repeats.min for c in (grid[0], grid[-1]))
    if ends_known and knee is None:
        note = "no measured core count has a usable TTFT p50 (failed or timed out)"
    elif ends_known and knee is not None:
        lo = max((c for c in raw if c < knee), default=None)
        i_k = grid.index(knee)
        waiting = [c for c in (lo, knee) if c is not None and raw[c].trials < repeats.min]
        if waiting:
            note = f"waiting for {repeats.min} repeats at " + " and ".join(map(str, waiting)) + " cores"
        elif lo is not None and grid.index(lo) < i_k - 1:  # bisect on the leanings; only the last pair settles
            mid = grid[(grid.index(lo) + i_k) // 2]
            why = f"bisects {lo}..{knee}: {lo} is outside {tolerance:.0%} of the best, {knee} inside"
            targets.append((mid, repeats.min, why))
            note = f"bisecting {lo}..{knee}"
        else:
            for c in (knee, lo):
                if c is not None and judged[c][1] is not None:
                    targets.append((judged[c][1], raw[judged[c][1]].trials + 1, judged[c][2]))
            bracketed = all(c is None or judged[c][0].verdict is not Verdict.UNCLEAR for c in (knee, lo))
            note = (f"knee {knee} cores: " + ("the fewest of the range" if lo is None else f"{lo} outside") +
                    (" (bracketed)" if bracketed else " (settling repeats)"))
    total = sum(x.trials for x in raw.values())
    done = not any(t > raw[c].trials if c in raw else True for c, t, _ in targets)
    state = SearchState(points, best.cores if best else None, knee, bracketed, done, total, contradictions, note)
    return state, targets


def search_state(allowed: Sequence[int], observations: Sequence[Observation], tolerance: float,
                 repeats: RepeatPolicy) -> SearchState:
    """Everything known from ``observations`` (recomputed from all of them; see the module docstring)."""
    return _plan(allowed, observations, tolerance, repeats)[0]


def next_trials(allowed: Sequence[int], observations: Sequence[Observation], tolerance: float,
                repeats: RepeatPolicy, in_flight: Sequence[int] = ()) -> list[Proposal]:
    """The trials worth starting now, most useful first; a caller with L free lanes takes the first L.

    ``in_flight``: the core count of every trial already running. Each counts towards its point's repeats,
    and nothing is proposed that a running trial may make useless: a point with a settling repeat in
    flight gets no other, and a bisection waits for both bracket ends' ``min`` repeats. Proposals are
    interleaved (repeat r of every point before repeat r+1), and never take the trials, run and running,
    past the full grid (``len(allowed) * repeats.max``). Empty: the search is done, or nothing is worth
    starting until the trials in flight finish.
    """
    _, targets = _plan(allowed, observations, tolerance, repeats)
    grid = set(allowed)
    have: dict[int, int] = {}
    for c in [o.cores for o in observations] + list(in_flight):
        if c not in grid:
            raise ValueError(f"in-flight trial at {c} cores, not in the allowed {sorted(grid)}")
        have[c] = have.get(c, 0) + 1
    wanted: dict[int, tuple[int, int, str]] = {}  # cores -> (priority, trials it should have, why)
    for rank, (c, target, why) in enumerate(targets):
        first = wanted.get(c)
        if first is None or target > first[1]:
            wanted[c] = (rank if first is None else first[0], min(target, repeats.max), why)
    proposals = sorted((r, rank, Proposal(c, r, why)) for c, (rank, target, why) in wanted.items()
                       for r in range(have.get(c, 0), target))
    budget = len(grid) * repeats.max - sum(have.values())  # the hard cap: never more than the full grid
    return [p for _, _, p in proposals][:max(0, budget)]


__all__ = ["TIMEOUT_MAJORITY", "Observation", "Point", "Proposal", "RepeatPolicy", "SearchState", "Verdict",
           "next_trials", "search_state"]
