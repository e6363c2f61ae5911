"""A knee search of one configuration: its candidate trials, what its finished trials say, the next trial.

A *configuration* is everything of a trial but its cores and repeat (``observe.report.comparison.CONFIG``).
Its candidates are the grid's trials of it (every core count, repeats ``0 .. repeats.max-1``: the same
trial ids as the grid). From the trials finished so far (this run's, and an earlier run's read back from
MLflow on resume) :class:`ConfigSearch` estimates the knee exactly as the report does
(:func:`orchestrator.observe.analysis.knee.estimate_knee` over each completed window's ok TTFTs, the
report's seed for this configuration, a core count left out when most of its requests timed out) and asks
the pure decision (:func:`orchestrator.plan.knee_search.next_cores`, :func:`budget_stop`) for the next core
count; the trial run there is its lowest repeat not yet run. No I/O here: the controller runs the trials,
``orchestrator.sweep`` reads the history.

An estimate runs where the search is asked from (the lane's thread, under the driver's GIL) unless the search is
given an ``estimator``: :class:`EstimatorPool` runs :func:`estimate_knee` in worker processes, so a search's
estimates cost the driver a submit and a reply (``benchmarks/results/knee-search-sim.md`` has the figures).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from orchestrator.observe import stats
from orchestrator.observe.analysis.knee import KneeEstimate, estimate_knee
from orchestrator.observe.report.comparison import CONFIG, SEARCH_PARAMS, TIMEOUT_MAJORITY
from orchestrator.observe.report.tables import ReportOptions, ttft_values
from orchestrator.plan.knee_search import Reason, Stop, budget_stop, gpu_seconds, next_cores
from orchestrator.values.results import TrialResult
from orchestrator.values.sweep_spec import SweepSpec
from orchestrator.values.trial import TrialSpec
from workloads.metrics import ttft_s

# What a search trial records beside its result (MLflow params), for the report's "why each point" table.
REASON_PARAM, STEP_PARAM, GRID_PARAM = SEARCH_PARAMS


@dataclass(frozen=True)
class SearchTrial:
    """One finished trial as the search reads it: completed or not, its ok TTFTs (seconds), the share of
    its requests that timed out, and what it spent (held seconds times GPUs)."""

    trial_id: str
    cores: int
    completed: bool
    ttfts: tuple[float, ...] = ()
    timeout_rate: float = 0.0
    gpu_seconds: float = 0.0


def from_result(spec: TrialSpec, result: TrialResult) -> SearchTrial:
    """This run's trial as the search reads it; TTFTs as the report reads them (``tables.ttft_values``), read off the
    records by ``workloads.metrics.ttft_s`` without a frame (a frame of a window's records cost milliseconds of the
    driver's CPU a result)."""
    ttfts = tuple(ttft_s(result.records))
    rate = result.metrics.get("timeout_rate", 0.0)
    return SearchTrial(spec.trial_id, spec.cores, result.ok, ttfts, float(rate) if math.isfinite(rate) else 0.0,
                       gpu_seconds(result.started_at, result.ended_at, spec.gpus))


def from_history(trials: Any, records: Mapping[str, Any]) -> dict[str, SearchTrial]:
    """An earlier run's trials, from the report's inputs (``observe.report.data.SweepData``: the trials frame
    and each completed trial's records), by trial id."""
    out: dict[str, SearchTrial] = {}
    for row in trials.to_dict("records") if len(trials) else []:
        tid = str(row["trial_id"])
        completed = row.get("status") == "COMPLETED"
        ttfts = tuple(float(x) for x in ttft_values(records[tid])) if tid in records else ()
        rate = _number(row.get("timeout_rate"))
        held = _number(row.get("trial_duration_s"))
        gpus = int(_number(row.get("gpus")))
        out[tid] = SearchTrial(tid, int(row["cores"]), completed, ttfts, rate, held * max(gpus, 1))
    return out


def _number(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) else 0.0


def config_key(trial: TrialSpec) -> tuple[str, ...]:
    """The configuration of a trial as the report keys it (its ``CONFIG`` columns, as text)."""
    f = trial.factors()
    return tuple(str(f[c]) for c in CONFIG)


def configurations(trials: Iterable[TrialSpec]) -> list[list[TrialSpec]]:
    """The trials grouped by configuration, in the order each first appears."""
    groups: dict[tuple[str, ...], list[TrialSpec]] = {}
    for t in trials:
        groups.setdefault(config_key(t), []).append(t)
    return list(groups.values())


@dataclass(frozen=True)
class Choice:
    """The search's next trial and why, or why it ends (``trial`` None), with the estimate it decided on."""

    trial: TrialSpec | None
    reason: Reason | None
    stop: Stop | None
    estimate: KneeEstimate


@dataclass(frozen=True)
class Outcome:
    """How one configuration's search ended."""

    label: str
    stop: Stop
    trials: int
    gpu_seconds: float                 # held seconds times GPUs; a CPU sweep's trial seconds
    estimate: KneeEstimate
    gpus: int = 0

    def line(self) -> str:
        spent = f"{self.gpu_seconds:.0f} {'GPU-s' if self.gpus else 'trial-s'}"
        return (f"knee search {self.label}: stopped ({self.stop.value}) after {self.trials} trial(s), {spent}; "
                f"knee: {self.estimate.sentence()}")


class KneeEstimator(Protocol):
    """What a search estimates the knee with: :func:`estimate_knee`'s call (it is one)."""

    def __call__(self, windows: Mapping[int, Sequence[np.ndarray]], *, stat: str, tolerance: float, level: float,
                 n_boot: int, seed: int) -> KneeEstimate: ...


class EstimatorPool:
    """:func:`estimate_knee` in worker processes, off the driver's GIL and its CPU; a :class:`KneeEstimator`.

    Hold it for the searches' duration and give it to each search::

        with EstimatorPool(workers=1) as pool:
            search = ConfigSearch(group, spec, estimator=pool)

    The workers start on entering ('spawn': the driver has threads, so no fork), each on a pipe of its own: the
    calling lane takes an idle worker, sends it the windows and reads its answer itself, so an estimate costs the
    driver a pickle each way and no helper thread (``concurrent.futures``' process pool spent 0.5 ms of the
    driver's CPU an estimate in its feeder and manager threads). On leaving, every worker is told to stop and
    joined, so none outlives the block; a worker also exits once the driver is gone (SIGKILL). Several threads
    may call it at once; up to ``workers`` estimates run side by side. A worker's estimate is the in-process one:
    the same function of the same windows and seed; so where a worker is gone (killed), the estimate is made in
    the calling thread instead."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self._idle: queue.SimpleQueue[_Worker] | None = None
        self._all: list[_Worker] = []

    def __enter__(self) -> EstimatorPool:
        if self._idle is not None:
            raise RuntimeError("the estimator pool is already open")
        ctx = multiprocessing.get_context("spawn")
        self._idle = queue.SimpleQueue()
        for _ in range(self.workers):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs, os.getpid()), name="knee-estimator", daemon=True)
            proc.start()
            theirs.close()
            worker = _Worker(proc, mine)
            self._all.append(worker)
            self._idle.put(worker)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.proc.pid for w in self._all if w.proc.pid is not None]

    def close(self) -> None:
        """Tell every worker to stop and join it (one still estimating finishes first; a stuck one is ended)."""
        workers, self._all, self._idle = self._all, [], None
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        for w in workers:
            w.proc.join(10)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.conn.close()

    def __call__(self, windows: Mapping[int, Sequence[np.ndarray]], *, stat: str, tolerance: float, level: float,
                 n_boot: int, seed: int) -> KneeEstimate:
        idle = self._idle
        if idle is None:
            raise RuntimeError("the estimator pool is not open (use it as a context manager)")
        kw: dict[str, Any] = {"stat": stat, "tolerance": tolerance, "level": level, "n_boot": n_boot, "seed": seed}
        worker = idle.get()
        try:
            if not worker.broken:
                worker.conn.send((dict(windows), kw))
                out = worker.conn.recv()
                if isinstance(out, BaseException):
                    raise out
                return out  # type: ignore[no-any-return]
        except (EOFError, OSError):
            worker.broken = True  # the worker is gone: this and its later estimates are made here
        finally:
            idle.put(worker)
        return estimate_knee(windows, **kw)


@dataclass(eq=False)
class _Worker:
    proc: Any  # multiprocessing's process (spawn context)
    conn: Any  # our end of its pipe
    broken: bool = False


def _serve(conn: Any, parent: int) -> None:
    """A pool worker: estimates what it is sent until told to stop (None), its pipe closes, or the driver is gone."""
    _end_with_parent(parent)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        windows, kw = job
        try:
            out: Any = estimate_knee(windows, **kw)
        except Exception as exc:  # noqa: BLE001 (raised again in the caller's thread)
            out = exc
        conn.send(out)


def _end_with_parent(parent: int) -> None:
    """In a pool worker: exit once the driver that started it is gone, however it died (a SIGKILLed driver runs no
    shutdown, and its workers would wait on their queue for ever): a daemon thread looks at the parent every second."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class ConfigSearch:
    """The knee search of one configuration over its candidate trials (see the module docstring); its estimates
    by ``estimator`` (:func:`estimate_knee` in the calling thread unless told otherwise, e.g. an
    :class:`EstimatorPool`)."""

    def __init__(self, candidates: Sequence[TrialSpec], spec: SweepSpec, opts: ReportOptions = ReportOptions(),
                 *, estimator: KneeEstimator = estimate_knee) -> None:
        if not candidates:
            raise ValueError("a search needs candidate trials")
        keys = {config_key(t) for t in candidates}
        if len(keys) != 1:
            raise ValueError(f"the candidates span {len(keys)} configurations")
        self.candidates = sorted(candidates, key=lambda t: (t.cores, t.repeat))
        self._ids = [t.trial_id for t in self.candidates]  # a trial id is a hash of the spec: computed once here
        self.grid = sorted({t.cores for t in candidates})
        self.key = keys.pop()
        self.label = " / ".join(self.key)
        self.policy = spec.repeat_policy
        self.search = spec.search
        self.opts = opts
        self.estimator = estimator

    def estimate(self, done: Sequence[SearchTrial]) -> KneeEstimate:
        """The report's knee over ``done``'s completed windows (same statistic, tolerance, level, draws, seed)."""
        windows: dict[int, list[np.ndarray]] = {}
        rates: dict[int, list[float]] = {}
        for t in done:
            if t.completed:
                rates.setdefault(t.cores, []).append(t.timeout_rate)
                if t.ttfts:
                    windows.setdefault(t.cores, []).append(np.asarray(t.ttfts, dtype=np.float64))
        usable = {c: w for c, w in windows.items() if np.mean(rates[c]) <= TIMEOUT_MAJORITY}
        o = self.opts
        return self.estimator(usable, stat=o.knee_statistic, tolerance=o.tolerance, level=o.knee_level,
                              n_boot=o.n_boot, seed=stats.cell_seed(o.seed, "knee|" + "|".join(self.key)))

    def choose(self, done: Sequence[SearchTrial]) -> Choice:
        """The next trial from everything ``done`` so far (this configuration's finished trials, any order)."""
        mine = set(self._ids)
        done = [t for t in done if t.trial_id in mine]
        est = self.estimate(done)
        measured: dict[int, int] = {}
        for t in done:
            if t.completed:
                measured[t.cores] = measured.get(t.cores, 0) + 1
        decision = next_cores(self.grid, measured, est, self.policy.max, min_windows=self.policy.min,
                              until_ci=self.policy.until_ci)
        if decision.cores is None:
            return Choice(None, None, decision.stop, est)
        spent = budget_stop(len(done), sum(t.gpu_seconds for t in done), max_trials=self.search.max_trials,
                            max_gpu_hours=self.search.max_gpu_hours)
        if spent is not None:
            return Choice(None, None, spent, est)
        ran = {t.trial_id for t in done}
        left = [t for t, tid in zip(self.candidates, self._ids) if t.cores == decision.cores and tid not in ran]
        if not left:
            return Choice(None, None, Stop.NO_TRIAL_LEFT, est)
        return Choice(left[0], decision.reason, None, est)

    def params(self, reason: Reason, step: int) -> dict[str, str]:
        """What a chosen trial records (MLflow params) so the report can say why it ran."""
        return {REASON_PARAM: reason.value, STEP_PARAM: str(step), GRID_PARAM: " ".join(map(str, self.grid))}


__all__ = ["GRID_PARAM", "REASON_PARAM", "STEP_PARAM", "Choice", "ConfigSearch", "EstimatorPool", "KneeEstimator",
           "Outcome", "SearchTrial",
           "config_key", "configurations", "from_history", "from_result"]
