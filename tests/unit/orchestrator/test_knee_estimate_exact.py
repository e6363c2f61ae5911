"""A knee search decides the same whichever way its estimates are computed: in the lane's thread (the bulk
draws), one ``rng.integers`` call at a time (the reference), or in an EstimatorPool's worker process; and the
pool leaves no process behind."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest

from orchestrator.control.search import ConfigSearch, EstimatorPool, SearchTrial
from orchestrator.observe.analysis.knee import _estimate_knee_reference
from orchestrator.observe.report.tables import ReportOptions
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec

OPTS = ReportOptions(n_boot=200)


def _plan():
    return expand(parse_spec({
        "name": "ks", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 3, 4, 6, 8, 12]}, "repeats": {"max": 3}, "search": "knee"}))


def _search(**kw):
    """The search's trials in order, each with why and the estimate it was chosen on, and how it ended. A
    window's TTFTs: 0.2 s from 3 cores up, more below, lognormal noise; a later repeat has fewer requests (the
    windows of a count differ in length, as when some requests time out)."""
    p = _plan()
    search = ConfigSearch(list(p.trials), p.spec, OPTS, **kw)
    done: list[SearchTrial] = []
    steps = []
    while (choice := search.choose(done)).trial is not None:
        t = choice.trial
        rng = np.random.default_rng([t.cores, t.repeat])
        ttfts = 0.2 * (1 + 0.4 * max(0, 3 - t.cores)) * rng.lognormal(0.0, 0.35, 146 - 9 * t.repeat)
        done.append(SearchTrial(t.trial_id, t.cores, True, tuple(ttfts), 0.0, 10.0))
        steps.append((t.trial_id, choice.reason, choice.estimate))
    return steps, choice.stop, choice.estimate


def test_the_search_runs_the_same_trials_on_the_bulk_draws_as_on_the_reference():
    steps, stop, est = _search()
    assert len(steps) >= 5 and max(est.windows) > 1       # a real search: bisection, then windows again
    assert (steps, stop, est) == _search(estimator=_estimate_knee_reference)


def test_an_estimator_pool_decides_as_the_lanes_thread_and_leaves_no_process_behind():
    before = set(multiprocessing.active_children())
    with EstimatorPool(workers=2) as pool:
        assert _search(estimator=pool) == _search()
        with pytest.raises(RuntimeError, match="already open"):
            pool.__enter__()
    assert set(multiprocessing.active_children()) <= before  # every worker joined
    with pytest.raises(RuntimeError, match="not open"):
        pool({1: [np.ones(3)]}, stat="p90", tolerance=0.1, level=0.9, n_boot=10, seed=0)
    with pytest.raises(ValueError, match="workers"):
        EstimatorPool(workers=0)


def test_a_pool_whose_worker_was_killed_estimates_in_the_calling_thread():
    windows = {1: [np.linspace(0.5, 0.9, 50)], 2: [np.linspace(0.3, 0.5, 50)]}
    kw = {"stat": "p90", "tolerance": 0.1, "level": 0.9, "n_boot": 50, "seed": 3}
    with EstimatorPool() as pool:
        want = pool(windows, **kw)
        [pid] = pool.pids()                                      # the one worker
        os.kill(pid, signal.SIGKILL)                             # killed (out of memory, say): the pool is broken
        assert pool(windows, **kw) == want                       # the same estimate, made in this thread
