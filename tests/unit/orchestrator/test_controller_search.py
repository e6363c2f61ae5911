"""A knee search run by the SweepController with a fake executor that returns synthetic request records
(the knee at 4 cores): the trials it picks, why, when it stops, the budget, resume, that its final
estimate is the report's, and (through the real tracker on a local MLflow store, no server) that the sweep
ends FINISHED with its stop reason as a tag and resumes from the records MLflow holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlflow import MlflowClient
from orchestrator.control.controller import SweepController
from orchestrator.control.search import ConfigSearch, SearchTrial, config_key, from_history, from_result
from orchestrator.control.trial import TrialState
from orchestrator.observe import stats
from orchestrator.observe.analysis.knee import estimate_knee
from orchestrator.observe.outbox import records_frame
from orchestrator.observe.report.comparison import results_frame
from orchestrator.observe.report.tables import (
    ReportOptions,
    aggregated_table,
    configurations,
    knee_windows,
    trial_table,
)
from orchestrator.observe.tracking import MlflowTracker, parent_run, trial_runs
from orchestrator.plan.expand import expand
from orchestrator.plan.knee_search import Stop
from orchestrator.plan.load import parse_spec
from orchestrator.sweep import _search_end, search_history
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from workloads.metrics import summarize
from workloads.records import RequestRecord

CORES = [1, 2, 3, 4, 6, 8, 12]
KNEE = 4


def ttft_mean(cores: int) -> float:
    """0.2 s from 4 cores up; 50% more per core below."""
    return 0.2 * (1 + 0.5 * max(0, KNEE - cores))


def plan(search="knee", repeats=None, **grid):
    return expand(parse_spec({
        "name": "ks", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": CORES, **grid}, "repeats": repeats or {"max": 3}, "search": search}))


class Fake:
    """Each call one window of 200 requests; TTFT ~ ttft_mean(cores) x lognormal(0, 0.1), seeded per call."""

    def __init__(self, fail_at=(), interrupt_after=None, held_s=10.0, sigma=0.1, n=200):
        self.calls: list[tuple[int, int]] = []
        self.sigma, self.n = sigma, n
        self.fail_at = set(fail_at)   # (cores, repeat) that fail
        self.interrupt_after = interrupt_after
        self.held_s = held_s

    def execute(self, trial, *, attempt=1):
        if self.interrupt_after is not None and len(self.calls) == self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append((trial.cores, trial.repeat))
        if (trial.cores, trial.repeat) in self.fail_at:
            return TrialResult.failed(trial.trial_id, ErrorKind.CONFIG, "x", started_at=0.0, ended_at=self.held_s)
        rng = np.random.default_rng(len(self.calls))
        ttfts = ttft_mean(trial.cores) * rng.lognormal(0.0, self.sigma, self.n)
        recs = tuple(RequestRecord(
            request_id=f"r{i}", session_id="s", turn=0, scheduled_ns=i * 10**9, sent_ns=i * 10**9,
            first_token_ns=i * 10**9 + int(x * 1e9), token_ns=(), end_ns=i * 10**9 + int(x * 1e9) + 1,
            prompt_tokens=1, completion_tokens=1, cached_tokens=None, client_prompt_tokens=1, tokenize_ns=0,
            status="ok") for i, x in enumerate(ttfts))
        return TrialResult(trial.trial_id, TrialStatus.COMPLETED, records=recs, metrics=summarize(recs),
                           started_at=0.0, ended_at=self.held_s)


class Ends:
    def __init__(self):
        self.plans, self.results = [], []

    def on_sweep_end(self, plan, results):
        self.plans.append(plan)
        self.results.append(results)


def test_finds_the_knee_with_fewer_trials_than_the_grid_and_stops_settled():
    p, fake, ends = plan(), Fake(), Ends()
    c = SweepController(p, fake, observers=[ends])
    results = c.run()
    # ends, then bisection 1..12, 1..4, 2..4; settled, then a second window below the knee and at it
    assert fake.calls == [(12, 0), (1, 0), (4, 0), (2, 0), (3, 0), (3, 1), (4, 1)]
    assert [r.params["search_reason"] for r in results] == ["most cores", "fewest cores", "bisect", "bisect",
                                                            "bisect"] + ["second window at the knee"] * 2
    assert [r.params["search_step"] for r in results] == ["1", "2", "3", "4", "5", "6", "7"]
    assert results[0].params["search_grid_cores"] == "1 2 3 4 6 8 12"
    [out] = c.outcomes
    assert out.stop is Stop.SETTLED and out.estimate.knee == KNEE and out.estimate.settled
    assert out.trials == 7 < len(p.trials) == 21 and out.gpu_seconds == 70.0
    assert "stopped (settled) after 7 trial(s), 70 trial-s; knee: 4 cores" in out.line()
    states = [t.state for t in c.trials.values()]
    assert states.count(TrialState.COMPLETED) == 7 and states.count(TrialState.PENDING) == 14
    assert TrialState.FAILED not in states  # trials never chosen are not failures
    # the sweep's end gets the trials the search ran: a tracker then calls the sweep complete
    assert [t.trial_id for t in ends.plans[0].trials] == [r.trial_id for r in sorted(
        results, key=lambda r: [t.trial_id for t in p.trials].index(r.trial_id))]


def test_a_second_run_with_every_trial_finished_runs_none_of_them():
    p = plan()
    first = SweepController(p, Fake())
    results = first.run()
    by_id = {t.trial_id: t for t in p.trials}
    history = {r.trial_id: from_result(by_id[r.trial_id], r) for r in results}
    again = Fake()
    second = SweepController(p, again, finished=lambda: set(history), history=lambda: history)
    assert second.run() == [] and again.calls == []
    assert second.outcomes[0].stop is Stop.SETTLED and second.outcomes[0].estimate.knee == KNEE
    assert sum(t.state is TrialState.SKIPPED for t in second.trials.values()) == 7


def test_an_interrupted_search_resumes_where_it_stopped():
    p, ends = plan(), Ends()
    cut = Fake(interrupt_after=2)
    with pytest.raises(KeyboardInterrupt):
        SweepController(p, cut, observers=[ends]).run()
    assert len(ends.plans[0].trials) == 21  # interrupted: the whole plan, so the tracker says KILLED
    by_id = {t.trial_id: t for t in p.trials}
    history = {r.trial_id: from_result(by_id[r.trial_id], r) for r in ends.results[0]}
    assert len(history) == 2
    rest = Fake()
    rest.calls = [None, None]  # the call numbering (the seeds) of an uninterrupted run goes on
    second = SweepController(p, rest, finished=lambda: set(history), history=lambda: history)
    second.run()
    assert rest.calls[2:] == [(4, 0), (2, 0), (3, 0), (3, 1), (4, 1)]  # never 12 or 1 again
    assert second.outcomes[0].stop is Stop.SETTLED and second.outcomes[0].trials == 7


def test_max_trials_and_max_gpu_hours_stop_the_search():
    c = SweepController(plan({"kind": "knee", "max_trials": 3}), Fake())
    assert len(c.run()) == 3 and c.outcomes[0].stop is Stop.MAX_TRIALS
    c = SweepController(plan({"kind": "knee", "max_gpu_hours": 0.5}), Fake(held_s=1000.0))
    assert len(c.run()) == 2 and c.outcomes[0].stop is Stop.MAX_GPU_HOURS  # 2000 GPU-s >= 1800


def test_a_failed_trial_is_spent_and_the_next_repeat_runs_instead():
    fake = Fake(fail_at={(1, 0)})
    c = SweepController(plan(), fake)
    results = c.run()
    assert fake.calls[:3] == [(12, 0), (1, 0), (1, 1)]
    assert [r.ok for r in results][:3] == [True, False, True]
    assert c.outcomes[0].estimate.knee == KNEE


def test_a_grid_sweep_runs_every_trial_and_has_no_outcome():
    fake = Fake()
    c = SweepController(plan(search="grid", repeats=1), fake)
    assert len(c.run()) == 7 and len(fake.calls) == 7 and c.outcomes == []


def test_the_searchs_estimate_is_the_reports():
    p = plan()
    results = SweepController(p, Fake(sigma=0.8, n=20)).run()  # noisy: several windows a count, split draws
    by_id = {t.trial_id: t for t in p.trials}
    records = {r.trial_id: records_frame(r.records) for r in results}
    trials = results_frame(p.trials, results)
    opts = ReportOptions()
    per_trial = trial_table(trials, records, opts.slo)
    [(key, rows)] = configurations(aggregated_table(trials, records, opts, per_trial))
    report = estimate_knee(knee_windows(rows, records, per_trial), stat=opts.knee_statistic, tolerance=opts.tolerance,
                           level=opts.knee_level, n_boot=opts.n_boot,
                           seed=stats.cell_seed(opts.seed, "knee|" + "|".join(map(str, key))))
    search = ConfigSearch(list(p.trials), p.spec)
    ours = search.estimate([from_result(by_id[r.trial_id], r) for r in results])
    assert tuple(map(str, key)) == config_key(p.trials[0])
    assert max(ours.windows) > 1 and 0 < max(ours.shares.values()) < 1  # the data can tell seeds and windows apart
    assert ours.sentence() == report.sentence() and ours.shares == report.shares


def test_history_from_the_reports_inputs():
    p = plan()
    t1, t2 = p.trials[0], p.trials[1]
    frame = pd.DataFrame([{"trial_id": t1.trial_id, "cores": t1.cores, "status": "COMPLETED", "gpus": 2,
                           "trial_duration_s": 30.0, "timeout_rate": 0.25},
                          {"trial_id": t2.trial_id, "cores": t2.cores, "status": "FAILED", "gpus": 2,
                           "trial_duration_s": float("nan")}])
    recs = pd.DataFrame({"status": ["ok", "ok", "timeout"], "sent_ns": [0, 0, 0],
                         "first_token_ns": [10**8, 3 * 10**8, None]})
    got = from_history(frame, {t1.trial_id: recs})
    assert got[t1.trial_id] == SearchTrial(t1.trial_id, t1.cores, True, (0.1, 0.3), 0.25, 60.0)
    assert got[t2.trial_id] == SearchTrial(t2.trial_id, t2.cores, False, (), 0.0, 0.0)


def test_a_search_is_tracked_tagged_and_resumed_from_mlflow(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = plan()
    tracker = MlflowTracker(uri, outbox_dir=tmp_path / "outbox")
    first = SweepController(p, Fake(), observers=[tracker])
    assert len(first.run()) == 7
    lines = _search_end(first.outcomes, tracker, p.spec.name)
    assert lines == [first.outcomes[0].line()]

    client = MlflowClient(uri)
    parent = parent_run(client, p.spec.name)
    assert parent.info.status == "FINISHED"  # the trials never chosen do not make it KILLED
    assert parent.data.tags["search_stop_reason"] == "settled"
    assert parent.data.tags["search_knee"] == first.outcomes[0].estimate.sentence()
    runs = trial_runs(client, p.spec.name)
    assert sorted(r.data.params["search_step"] for r in runs) == ["1", "2", "3", "4", "5", "6", "7"]

    history = search_history(p.spec.name, uri, tmp_path / "outbox")
    assert len(history) == 7 and all(len(t.ttfts) == 200 for t in history.values())
    again = Fake()
    second = SweepController(p, again, observers=[tracker], finished=lambda: tracker.finished_trial_ids(p.spec.name),
                             history=lambda: search_history(p.spec.name, uri, tmp_path / "outbox"))
    assert second.run() == [] and again.calls == []
    out = second.outcomes[0]
    assert out.stop is Stop.SETTLED and out.estimate.knee == KNEE
    assert out.estimate.sentence() == first.outcomes[0].estimate.sentence()  # the same windows, read back
    assert len(trial_runs(client, p.spec.name)) == 7  # no trial id has a second run


def test_a_count_whose_requests_mostly_timed_out_is_measured_but_has_no_figure():
    p = plan()
    search = ConfigSearch(list(p.trials), p.spec)
    by = {(t.cores, t.repeat): t for t in p.trials}
    fast = tuple(0.2 + 0.001 * i for i in range(50))
    done = [SearchTrial(by[12, 0].trial_id, 12, True, fast),
            SearchTrial(by[1, 0].trial_id, 1, True, tuple(3 * x for x in fast[:5]), timeout_rate=0.9)]
    assert search.estimate(done).cores == (12,)  # the report's rule: left out of the knee
    choice = search.choose(done)
    assert (choice.trial.cores, choice.reason.value) == (4, "bisect")  # 1 core counts as measured, below the knee
