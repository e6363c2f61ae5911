"""Unit tests of the tracker's upload machinery: the request packing, the upload pool's order and hold, the
sweep's run index, the outbox under many writing threads, and persist_result never waiting for an upload."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.entities import Metric, Param, RunTag

from orchestrator.observe import outbox
from orchestrator.observe.tracking import MlflowTracker, TrialRuns, UploadPool, _series_metrics, log_batches
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan


def _plan(cores: list[int], name: str = "unit-uploads") -> SweepPlan:
    return expand(parse_spec({
        "name": name,
        "models": [{"kind": "shape", "name": "tiny-llama", "shape": "tiny-llama"}],
        "workloads": [{"kind": "agentic", "name": "agentic-short", "sessions": 2, "turns": 2}],
        "grid": {"cores": cores},
    }))


def _ok(trial_id: str) -> TrialResult:
    return TrialResult(trial_id, TrialStatus.COMPLETED, metrics={"ttft_p50_s": 0.1},
                       telemetry=({"t": 0.1, "name": "replica_cpu_util", "value": 50.0},),
                       started_at=time.time() - 5, ended_at=time.time())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- log_batches ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_params,n_metrics,n_tags,requests", [
    (96, 1979, 0, 3),     # the H200 payload: 96 params, 170 summary metrics + 1,809 series points
    (0, 0, 0, 0),
    (100, 900, 0, 1),     # exactly one request's worth
    (101, 0, 0, 2),       # the 101st param needs a second request
    (0, 2500, 0, 3),
    (50, 10, 150, 2),     # tags too: at most 100 a request
])
def test_log_batches_pack_within_mlflows_limits(n_params: int, n_metrics: int, n_tags: int, requests: int) -> None:
    params = [Param(f"p{i}", "v") for i in range(n_params)]
    metrics = [Metric(f"m{i % 7}", float(i), 0, i) for i in range(n_metrics)]
    tags = [RunTag(f"t{i}", "v") for i in range(n_tags)]
    batches = list(log_batches(params, metrics, tags))
    assert len(batches) == requests
    for p, m, t in batches:
        assert len(p) <= 100 and len(t) <= 100 and len(m) <= 1000 and len(p) + len(m) + len(t) <= 1000
        assert p or m or t
    assert [x for p, _, _ in batches for x in p] == params      # all of them, each once, in order
    assert [x for _, m, _ in batches for x in m] == metrics     # a series' steps keep their order
    assert [x for _, _, t in batches for x in t] == tags


@pytest.mark.parametrize("series,points,total,kept_each", [
    (21, 86, 400, 18),     # the H200 payload: 19 a series at most, every 5th sample: 18
    (21, 86, None, 86),    # no total: every sample (up to max_series_points)
    (1, 20, 400, 20),      # one short series: whole
    (100, 50, 400, 10),    # many series: each keeps at least 10 (every 5th of 50)
])
def test_series_points_share_a_total(tmp_path: Path, series: int, points: int, total: int | None,
                                     kept_each: int) -> None:
    import pandas as pd

    frame = pd.DataFrame([{"t": 0.25 * i, "name": f"cpu{s}_util", "value": float(i)}
                          for s in range(series) for i in range(points)])
    frame.to_parquet(tmp_path / "telemetry.parquet", index=False)
    metrics = _series_metrics(tmp_path / "telemetry.parquet", 1000.0, 1000, total)
    by_name: dict[str, list] = {}
    for m in metrics:
        by_name.setdefault(m.key, []).append(m)
    assert len(by_name) == series and {len(v) for v in by_name.values()} == {kept_each}
    first = by_name["ts/cpu0_util"]
    assert first[0].step == 0 and first[0].timestamp == 1_000_000      # step: ms since the sampler started
    assert [m.step for m in first] == sorted(m.step for m in first)    # in time order, evenly strided


# -- UploadPool ------------------------------------------------------------------------------------------------------

def _paths(n: int, trial: callable = lambda i: f"t{i}") -> list[tuple[Path, str]]:
    return [(Path(f"/outbox/s/trials/{i:020d}-{trial(i)}"), trial(i)) for i in range(n)]


def test_pool_uploads_oldest_first_each_once() -> None:
    done: list[Path] = []
    queued = threading.Event()

    def upload(path: Path) -> bool:
        queued.wait(10)  # the first upload waits until every entry is queued
        done.append(path)
        return True

    pool = UploadPool(upload, threads=1)
    entries = _paths(20)
    for p, t in reversed(entries):  # queued newest first: still taken oldest first (after the first taken)
        pool.add(p, t)
    for p, t in entries:
        pool.add(p, t)              # queued again while waiting: not twice
    queued.set()
    assert pool.wait(10) is None
    assert sorted(done) == [p for p, _ in entries] and len(done) == 20
    assert done[1:] == sorted(done[1:])  # the first thread took what was there; then oldest first
    assert pool.done == pool.uploaded == 20


def test_pool_runs_uploads_at_once_but_one_trials_entries_in_order() -> None:
    lock = threading.Lock()
    running: list[str] = []
    together: list[str] = []  # a trial seen twice in flight
    peak = [0]
    order: dict[str, list[Path]] = {}
    four = threading.Barrier(4, timeout=10)

    def upload(path: Path) -> bool:
        trial = outbox.trial_id_of(path)
        with lock:
            if trial in running:
                together.append(trial)
            running.append(trial)
            peak[0] = max(peak[0], len(running))
            order.setdefault(trial, []).append(path)
        if int(path.name[:20]) < 4:
            four.wait()  # the first four entries (four trials) must be in flight together
        time.sleep(0.002)
        with lock:
            running.remove(trial)
        return True

    pool = UploadPool(upload, threads=4)
    # four single trials, then ten trials of 20 attempts each, each trial's attempts one after another
    entries = _paths(204, trial=lambda i: f"t{i}" if i < 4 else f"t{4 + (i - 4) // 20}")
    for p, t in entries:
        pool.add(p, t)
    assert pool.wait(30) is None
    assert peak[0] == 4 and together == []
    assert sum(len(v) for v in order.values()) == 204
    for trial, paths in order.items():
        assert paths == sorted(paths), f"trial {trial}'s attempts went up out of order"


def test_pool_holds_while_mlflow_is_unreachable_and_goes_on_when_it_answers(caplog: pytest.LogCaptureFixture) -> None:
    up = threading.Event()
    done: list[Path] = []

    def upload(path: Path) -> bool:
        if not up.is_set():
            raise ConnectionError("refused")
        done.append(path)
        return True

    pool = UploadPool(upload, threads=3, reachable=up.is_set, retry_s=0.05)
    entries = _paths(10)
    for p, t in entries:
        pool.add(p, t)
    assert "is unreachable" in (pool.wait(10) or "")  # said at once: nothing can go up
    assert pool.down is not None and done == [] and pool.waiting() == 10
    assert "result(s) wait in the outbox" in caplog.text and "orchestrator sync" in caplog.text
    up.set()                                          # MLflow is back: the pool's own check finds it
    deadline = time.monotonic() + 10
    while pool.waiting() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.wait(10) is None and sorted(done) == [p for p, _ in entries] and pool.down is None
    pool.close()


def test_pool_gives_up_on_an_entry_mlflow_refuses_and_uploads_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    tries: dict[Path, int] = {}
    entries = _paths(5)
    bad = entries[2][0]

    def upload(path: Path) -> bool:
        tries[path] = tries.get(path, 0) + 1
        if path == bad:
            raise ValueError("INVALID_PARAMETER_VALUE: too long")
        return True

    pool = UploadPool(upload, threads=2, tries=3)
    for p, t in entries:
        pool.add(p, t)
    why = pool.wait(10)
    assert why is not None and "1 result(s) refused" in why and "too long" in why
    assert tries[bad] == 3 and all(tries[p] == 1 for p, _ in entries if p != bad)
    assert pool.done == 4 and list(pool.given_up) == [bad]
    assert "stays in the outbox" in caplog.text
    pool.add(bad, "t2")                   # not queued again in this pool: it waits for a sync
    assert pool.wait(1) is not None and tries[bad] == 3


def test_pool_close_starts_no_more_uploads() -> None:
    gate, started = threading.Event(), threading.Event()
    done: list[Path] = []

    def upload(path: Path) -> bool:
        started.set()
        gate.wait(10)
        done.append(path)
        return True

    pool = UploadPool(upload, threads=1)
    for p, t in _paths(3):
        pool.add(p, t)
    assert started.wait(10)
    pool.close()
    gate.set()
    assert pool.wait(10) == "the uploads were stopped"
    assert len(done) == 1  # the one in flight finished; the others stay queued (on disk, for later)


# -- TrialRuns -------------------------------------------------------------------------------------------------------

def _run(trial: str, run_id: str, status: str, upload: str, superseded: str = "false") -> SimpleNamespace:
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status=status),
                           data=SimpleNamespace(tags={"trial_id": trial, "upload_id": upload, "superseded": superseded}))


def test_trial_runs_index_is_kept_up_to_date() -> None:
    runs = TrialRuns([_run("a", "r1", "FAILED", "u1", "true"), _run("a", "r2", "RUNNING", "u2"),
                      _run("b", "r3", "FINISHED", "u3"), SimpleNamespace(info=None, data=SimpleNamespace(tags={}))])
    assert [(r.run_id, r.superseded) for r in runs.of("a")] == [("r1", True), ("r2", False)]
    assert len(runs) == 3 and runs.of("c") == []
    from orchestrator.observe.tracking import RunRef
    runs.record("a", RunRef("r4", "RUNNING", "u4", False))
    runs.finish("a", "r4", "FINISHED")
    runs.supersede("a", "r2", "KILLED")
    assert [(r.run_id, r.status, r.superseded) for r in runs.of("a")] == [
        ("r1", "FAILED", True), ("r2", "KILLED", True), ("r4", "FINISHED", False)]
    runs.of("a").clear()          # a copy: the index is not changed through it
    assert len(runs.of("a")) == 3


# -- the outbox under many threads -------------------------------------------------------------------------------

def test_many_threads_put_into_one_outbox_at_once(tmp_path: Path) -> None:
    plan = _plan(list(range(1, 33)))
    sweep = outbox.sweep_payload(plan, experiment="e", git_commit=None, spec_yaml=None)
    start = threading.Barrier(16)
    errors: list[BaseException] = []

    def lane(k: int) -> None:
        start.wait()
        try:
            for trial in plan.trials[k::16]:
                outbox.put(tmp_path, sweep, trial, _ok(trial.trial_id))  # sweep.json rewritten by each, at once
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    entries = outbox.pending(tmp_path)
    assert sorted(e.trial_id for e in entries) == sorted(t.trial_id for t in plan.trials)
    assert [p.name for p in outbox.entry_paths(tmp_path)] == [e.path.name for e in entries]
    assert outbox.read_sweep(tmp_path, plan.spec.name)["params"]["trials_planned"] == "32"
    leftovers = [p.name for p in (tmp_path.rglob(".*"))]
    assert leftovers == [], f"temp files or staging folders left behind: {leftovers}"


# -- persist_result ------------------------------------------------------------------------------------------------

def test_persist_result_never_waits_for_an_upload_and_on_trial_result_hands_it_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a refused connection fails at once
    plan = _plan([1, 2, 3, 4, 5, 6, 7, 8])
    tracker = MlflowTracker(f"http://127.0.0.1:{_closed_port()}", outbox_dir=tmp_path / "outbox",
                            health_timeout_s=0.2, retry_s=60)
    tracker.on_sweep_start(plan)  # MLflow does not answer: warned, and the sweep goes on
    results = {t.trial_id: _ok(t.trial_id) for t in plan.trials}
    took: list[float] = []
    with tracker._lock:  # what an upload holds while it talks to MLflow
        def lane(trial) -> None:  # noqa: ANN001
            t0 = time.monotonic()
            tracker.persist_result(trial, results[trial.trial_id])
            took.append(time.monotonic() - t0)

        threads = [threading.Thread(target=lane, args=(t,)) for t in plan.trials]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads), "persist_result waited for the upload lock"
    assert len(took) == 8 and max(took) < 10
    assert sorted(e.trial_id for e in outbox.pending(tmp_path / "outbox")) == sorted(results)

    for trial in plan.trials:  # the writer thread: the persisted entry goes to the pool, not a second one
        tracker.on_trial_result(trial, results[trial.trial_id])
    assert len(outbox.pending(tmp_path / "outbox")) == 8
    extra = _ok(plan.trials[0].trial_id)  # a result nobody persisted (a direct caller): put first, as before
    tracker.on_trial_result(plan.trials[0], extra)
    assert len(outbox.pending(tmp_path / "outbox")) == 9
    assert tracker.flush(10) is not None  # MLflow is unreachable: the results wait in the outbox
    tracker.close()
    assert tracker.finished_trial_ids(plan.spec.name) == set(results)


def test_finished_trial_ids_counts_an_entry_while_it_is_being_uploaded(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    plan = _plan([1, 2])
    box = tmp_path / "outbox"
    sweep = outbox.sweep_payload(plan, experiment="e", git_commit=None, spec_yaml=None)
    first, second = (outbox.put(box, sweep, t, _ok(t.trial_id)) for t in plan.trials)
    assert outbox.claim(first.path) is not None  # an upload of this process has it in flight
    tracker = MlflowTracker(f"http://127.0.0.1:{_closed_port()}", outbox_dir=box, health_timeout_s=0.2)
    assert tracker.finished_trial_ids(plan.spec.name) == {first.trial_id, second.trial_id}
    tracker.close()
