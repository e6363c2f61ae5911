"""Integration tests of MLflow tracking against a REAL `mlflow server` (sqlite + served artifacts).

One server per module (startup costs 6-8 s on 2 cores); the outage test stops it and
restarts it on the same sqlite file and port. Also: scraping /metrics from a tiny local
HTTP server.
"""

from __future__ import annotations

import http.server
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

from mlflow import MlflowClient
from orchestrator.node.telemetry import TelemetrySampler, scrape
from orchestrator.observe import outbox
from orchestrator.observe.summary import summarize_series
from orchestrator.observe.tracking import CallbackList, MlflowTracker, mlflow_server_ok, sync_outbox
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan, TrialSpec
from workloads.records import RequestRecord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class _Server:
    """A real MLflow tracking server in its own process group."""

    def __init__(self, home: Path) -> None:
        self.home = home
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.home}/mlflow.db",
               "--artifacts-destination", str(self.home / "artifacts"), "--serve-artifacts",
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        # No GenAI job runner (seven worker processes we never use): a faster start on 2 cores.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.home / "server.log", "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         cwd=self.home, env=env)
        deadline = time.monotonic() + timeout_s
        while not mlflow_server_ok(self.uri, timeout_s=1):
            assert self.proc.poll() is None, (self.home / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server not healthy in time"
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        self.proc = None
        deadline = time.monotonic() + 10
        while mlflow_server_ok(self.uri, timeout_s=0.5) and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    srv = _Server(tmp_path_factory.mktemp("mlflow"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _plan(name: str, cores: list[int]) -> SweepPlan:
    return expand(parse_spec({
        "name": name,
        "description": f"integration sweep {name}",
        "models": [{"kind": "shape", "name": "tiny-llama", "shape": "tiny-llama"}],
        "workloads": [{"kind": "agentic", "name": "agentic-short", "sessions": 2, "turns": 2}],
        "grid": {"cores": cores, "vllm": [{"name": "default", "args": ["--enforce-eager"]}]},
    }))


def _record(i: int) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", session_id=f"s{i % 2}", turn=i // 2, scheduled_ns=i, sent_ns=i + 1,
                         first_token_ns=i + 5, token_ns=(i + 5, i + 7), end_ns=i + 9, prompt_tokens=100,
                         completion_tokens=2, cached_tokens=64, client_prompt_tokens=100, tokenize_ns=3,
                         status="ok")


def _ok(trial: TrialSpec, tmp: Path) -> TrialResult:
    arts = tmp / f"arts-{trial.trial_id}"
    arts.mkdir(exist_ok=True)
    (arts / "vllm.log").write_text("INFO: Application startup complete.\n")
    (arts / "trial.json").write_text(trial.model_dump_json())
    (arts / "cores.json").write_text('{"replica": [0], "client": [1]}')
    telemetry = tuple({"t": 0.1 * (i + 1), "name": n, "value": v * (i + 1)}
                      for i in range(3) for n, v in (("replica_cpu_util", 30.0), ("server_kv_cache_usage_perc", 0.1)))
    return TrialResult(
        trial_id=trial.trial_id, status=TrialStatus.COMPLETED, records=tuple(_record(i) for i in range(4)),
        # the executor's summary holds the series' means and maxima (orchestrator.observe.summary.summarize_trial)
        metrics={"ttft_s_p50": 0.04 * trial.cores, "goodput_rps": 3.5, "broken": float("nan"),
                 **summarize_series(telemetry)},
        params={"vllm_version": "0.32.0", "cpu_model": "Test CPU", "restriction": "affinity",
                "verified_replica_cpus": "0", "OMP_NUM_THREADS": str(trial.cores)},
        telemetry=telemetry, artifacts_dir=str(arts), started_at=time.time() - 30, ended_at=time.time())


def _failed(trial: TrialSpec) -> TrialResult:
    return TrialResult.failed(trial.trial_id, ErrorKind.STARTUP_TIMEOUT, "server not healthy after 600 s",
                              started_at=time.time() - 600, ended_at=time.time())


def _runs(client: MlflowClient, experiment: str, filter_string: str = "") -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], filter_string, ViewType.ALL) if exp else []


def _children(client: MlflowClient, sweep: str) -> list:
    return _runs(client, sweep, "tags.`orchestrator.kind` = 'trial'")


def _parents(client: MlflowClient, sweep: str) -> list:
    return _runs(client, sweep, "tags.`orchestrator.kind` = 'sweep'")


def _artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for f in client.list_artifacts(run_id, path):
        out |= _artifact_paths(client, run_id, f.path) if f.is_dir else {f.path}
    return out


def test_sweep_layout_params_metrics_artifacts(server: _Server, tmp_path: Path):
    plan = _plan("trk-layout", [1, 2])
    spec_path = tmp_path / "sweep.yaml"
    spec_path.write_text("name: trk-layout\n# the user's own YAML\n")
    tracker = MlflowTracker(server.uri, outbox_dir=tmp_path / "outbox", spec_path=spec_path)
    cbs = CallbackList([tracker])
    t_fail, t_ok = plan.trials
    cbs.on_sweep_start(plan)
    results = []
    for trial, result in ((t_fail, _failed(t_fail)), (t_ok, _ok(t_ok, tmp_path))):
        cbs.on_trial_start(trial)
        cbs.on_trial_result(trial, result)
        results.append(result)
    cbs.on_sweep_end(plan, results)

    client = MlflowClient(server.uri)
    [parent] = _parents(client, "trk-layout")
    assert parent.info.run_name == "trk-layout" and parent.info.status == "FINISHED"
    assert parent.data.tags["sweep"] == "trk-layout"
    assert parent.data.params["trials_planned"] == "2" and parent.data.params["cores"] == "1 2"
    assert parent.data.metrics == {"trials_finished": 1.0, "trials_failed": 1.0}
    assert {"spec.yaml", "spec.json", "plan.json"} <= _artifact_paths(client, parent.info.run_id)

    children = {r.data.tags["trial_id"]: r for r in _children(client, "trk-layout")}
    assert set(children) == {t_fail.trial_id, t_ok.trial_id}
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children.values())

    ok = children[t_ok.trial_id]
    assert ok.info.status == "FINISHED" and ok.info.run_name == "tiny-llama c2 agentic-short r0"
    assert ok.data.tags["superseded"] == "false" and ok.data.tags["error_kind"] == "none"
    p = ok.data.params
    assert (p["cores"], p["model"], p["workload"], p["repeat"], p["tp"]) == ("2", "tiny-llama", "agentic-short", "0", "1")
    assert p["vllm_args"] == "--enforce-eager" and p["load_format"] == "dummy" and p["restriction"] == "affinity"
    assert p["vllm_version"] == "0.32.0" and p["OMP_NUM_THREADS"] == "2" and p["verified_replica_cpus"] == "0"
    m = ok.data.metrics
    assert m["ttft_s_p50"] == pytest.approx(0.08) and m["goodput_rps"] == 3.5 and "broken" not in m
    assert m["replica_cpu_util_mean"] == pytest.approx(60.0) and m["replica_cpu_util_max"] == pytest.approx(90.0)
    assert m["num_records"] == 4
    history = client.get_metric_history(ok.info.run_id, "ts/replica_cpu_util")
    assert sorted((h.step, h.value) for h in history) == [(100, 30.0), (200, 60.0), (300, 90.0)]
    arts = _artifact_paths(client, ok.info.run_id)
    assert {"records.parquet", "telemetry.parquet", "vllm.log", "trial.json", "cores.json", "result.json"} <= arts
    local = client.download_artifacts(ok.info.run_id, "records.parquet", str(tmp_path))
    assert len(pd.read_parquet(local)) == 4

    with pytest.raises(MlflowException):      # params are write-once: MLflow refuses a new value
        client.log_param(ok.info.run_id, "cores", "4")

    bad = children[t_fail.trial_id]
    assert bad.info.status == "FAILED" and bad.info.run_name == "tiny-llama c1 agentic-short r0"
    assert bad.data.tags["error_kind"] == "startup_timeout"
    assert bad.data.tags["error_message"] == "server not healthy after 600 s"
    assert bad.data.params["cores"] == "1"
    assert outbox.pending(tmp_path / "outbox") == []


def test_resume_reattaches_and_never_duplicates(server: _Server, tmp_path: Path):
    plan = _plan("trk-resume", [1, 2])
    t0, t1 = plan.trials
    first = MlflowTracker(server.uri, outbox_dir=tmp_path / "outbox")
    first.on_sweep_start(plan)
    first.on_trial_result(t0, _failed(t0))
    first.on_trial_result(t1, _ok(t1, tmp_path))
    assert first.flush() is None  # uploaded in the background: wait for them
    first.close()
    # (the first session crashed: no on_sweep_end)

    second = MlflowTracker(server.uri, outbox_dir=tmp_path / "outbox")   # a new process, same sweep
    second.on_sweep_start(plan)
    assert second.finished_trial_ids("trk-resume") == {t1.trial_id}
    second.on_trial_result(t1, _ok(t1, tmp_path))    # a careless caller re-sends a finished trial: dropped
    second.on_trial_result(t0, _failed(t0))          # the failed trial fails again ...
    second.on_trial_result(t0, _ok(t0, tmp_path))    # ... and then succeeds on a retry
    assert second.finished_trial_ids("trk-resume") == {t0.trial_id, t1.trial_id}
    second.on_sweep_end(plan, [])

    client = MlflowClient(server.uri)
    [parent] = _parents(client, "trk-resume")
    assert parent.data.tags["resumes"] == "1" and parent.info.status == "FINISHED"
    assert parent.data.metrics == {"trials_finished": 2.0, "trials_failed": 0.0}
    runs = _children(client, "trk-resume")
    by_trial: dict[str, list] = {}
    for r in runs:
        by_trial.setdefault(r.data.tags["trial_id"], []).append(r)
    assert len(by_trial[t1.trial_id]) == 1                    # 0 duplicates of a FINISHED trial
    attempts = sorted(by_trial[t0.trial_id], key=lambda r: int(r.data.tags["attempt"]))
    assert [(r.info.status, r.data.tags["superseded"]) for r in attempts] == [
        ("FAILED", "true"), ("FAILED", "true"), ("FINISHED", "false")]
    assert attempts[0].data.tags["superseded_by"] == attempts[1].info.run_id
    assert attempts[1].data.tags["superseded_by"] == attempts[2].info.run_id
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == len({r.data.tags["trial_id"] for r in finished}) == 2


def test_server_down_results_go_to_outbox_then_sync(server: _Server, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture):
    box = tmp_path / "outbox"
    plan = _plan("trk-offline", [1, 2, 3])
    t1, t2, t3 = plan.trials
    cold = _plan("trk-cold", [1])
    tracker = MlflowTracker(server.uri, outbox_dir=box)
    tracker.on_sweep_start(plan)
    tracker.on_trial_result(t1, _ok(t1, tmp_path))            # uploaded while the server is up
    assert tracker.flush() is None
    try:
        server.stop()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="orchestrator.observe.tracking"):
            tracker.on_trial_result(t2, _ok(t2, tmp_path))
            tracker.on_trial_result(t3, _failed(t3))
            assert tracker.finished_trial_ids("trk-offline") == {t2.trial_id}   # outbox part only
            tracker.on_sweep_end(plan, [])
            offline = MlflowTracker(server.uri, outbox_dir=box)            # a sweep started while down
            offline.on_sweep_start(cold)
            offline.on_trial_result(cold.trials[0], _ok(cold.trials[0], tmp_path))
            assert offline.flush() is not None                              # it cannot go up: said at once
            offline.close()                                                 # (its driver ends here)
        assert time.monotonic() - started < 30, "an unreachable server must cost seconds, not minutes"
        assert "wait in the outbox" in caplog.text and "orchestrator sync" in caplog.text
        pending = outbox.pending(box, claimed=True)
        assert sorted(e.trial_id for e in pending) == sorted([t2.trial_id, t3.trial_id, cold.trials[0].trial_id])
        # A stale copy of t1 (already FINISHED on the server) also sits in the outbox: it must not duplicate.
        outbox.commit(outbox.stage_trial(box, outbox.trial_payload(t1, _ok(t1, tmp_path))))
        assert sync_outbox(server.uri, box) == (0, 4)           # still down: nothing moves
    finally:
        server.start()

    assert sync_outbox(server.uri, box) == (3, 0)
    assert outbox.pending(box) == [] and list(box.iterdir()) == []
    assert sync_outbox(server.uri, box) == (0, 0)

    client = MlflowClient(server.uri)
    [parent] = _parents(client, "trk-offline")
    assert parent.info.status == "FINISHED"                    # the offline sweep end was replayed
    runs = _children(client, "trk-offline")
    assert sorted(r.data.tags["trial_id"] for r in runs) == sorted(t.trial_id for t in plan.trials)
    assert {r.data.tags["trial_id"]: r.info.status for r in runs} == {
        t1.trial_id: "FINISHED", t2.trial_id: "FINISHED", t3.trial_id: "FAILED"}
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in runs)
    synced = next(r for r in runs if r.data.tags["trial_id"] == t2.trial_id)
    assert synced.data.params["cores"] == "2" and synced.data.metrics["goodput_rps"] == 3.5
    assert {"records.parquet", "telemetry.parquet", "vllm.log"} <= _artifact_paths(client, synced.info.run_id)
    assert len(client.get_metric_history(synced.info.run_id, "ts/replica_cpu_util")) == 3

    [cold_parent] = _parents(client, "trk-cold")               # created by the sync from sweep.json
    assert cold_parent.data.params["trials_planned"] == "1"
    [cold_child] = _children(client, "trk-cold")
    assert cold_child.data.tags["mlflow.parentRunId"] == cold_parent.info.run_id
    assert cold_child.info.status == "FINISHED"


def test_a_result_after_an_outage_takes_the_outage_results_up_with_it(server: _Server, tmp_path: Path):
    # Every result is written into the outbox first and drained from there (write-ahead): the first result after
    # MLflow comes back uploads the ones the outage left, oldest first, with no `orchestrator sync`.
    box = tmp_path / "outbox"
    plan = _plan("trk-drain", [1, 2, 3])
    t1, t2, t3 = plan.trials
    tracker = MlflowTracker(server.uri, outbox_dir=box)
    tracker.on_sweep_start(plan)
    try:
        server.stop()
        tracker.on_trial_result(t1, _ok(t1, tmp_path))
        tracker.on_trial_result(t2, _failed(t2))
        # in the outbox: waiting, or claimed by an upload that is trying
        assert sorted(e.trial_id for e in outbox.pending(box, claimed=True)) == sorted([t1.trial_id, t2.trial_id])
    finally:
        server.start()
    tracker.on_trial_result(t3, _ok(t3, tmp_path))
    assert tracker.flush() is None                              # the uploads go on in the background
    assert outbox.pending(box) == []
    client = MlflowClient(server.uri)
    runs = _children(client, "trk-drain")
    assert {r.data.tags["trial_id"]: r.info.status for r in runs} == {
        t1.trial_id: "FINISHED", t2.trial_id: "FAILED", t3.trial_id: "FINISHED"}
    by_id = {r.data.tags["trial_id"]: r for r in runs}
    assert by_id[t1.trial_id].info.start_time <= by_id[t3.trial_id].info.start_time
    assert {"records.parquet", "vllm.log"} <= _artifact_paths(client, by_id[t1.trial_id].info.run_id)
    tracker.on_sweep_end(plan, [])
    assert [p.info.status for p in _parents(client, "trk-drain")] == ["FINISHED"]
    assert not box.exists() or list(box.iterdir()) == []


def test_parallel_uploads_keep_each_trials_attempts_in_order(server: _Server, tmp_path: Path):
    # Results handed over as the controller does (persisted by several lanes at once, a trial's attempts by its
    # lane one after another; then on_trial_result for each), uploaded by 4 threads: each trial's attempts still
    # go up one after another, in order.
    plan = _plan("trk-parallel", [1, 2, 3, 4, 5, 6, 7, 8])
    tracker = MlflowTracker(server.uri, outbox_dir=tmp_path / "outbox", uploaders=4)
    tracker.on_sweep_start(plan)
    handed = []
    for trial in plan.trials:
        attempts = [_failed(trial), _failed(trial)] if trial.cores % 2 else []
        handed += [(trial, r) for r in (*attempts, _ok(trial, tmp_path))]
    lanes = [threading.Thread(target=lambda part: [tracker.persist_result(t, r) for t, r in part],
                              args=([(t, r) for t, r in handed if t.cores % 4 == k],)) for k in range(4)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    for trial, result in sorted(handed, key=lambda tr: tr[1].ended_at):
        tracker.on_trial_result(trial, result)
    tracker.on_sweep_end(plan, [r for _, r in handed])
    assert outbox.pending(tmp_path / "outbox") == []

    client = MlflowClient(server.uri)
    [parent] = _parents(client, "trk-parallel")
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials_finished"] == 8.0
    runs: dict[str, list] = {}
    for r in _children(client, "trk-parallel"):
        runs.setdefault(r.data.tags["trial_id"], []).append(r)
    assert set(runs) == {t.trial_id for t in plan.trials}
    for trial in plan.trials:
        attempts = sorted(runs[trial.trial_id], key=lambda r: int(r.data.tags["attempt"]))
        want = ["FAILED", "FAILED", "FINISHED"] if trial.cores % 2 else ["FINISHED"]
        assert [r.info.status for r in attempts] == want, trial.cores
        assert [r.data.tags["superseded"] for r in attempts] == ["true"] * (len(want) - 1) + ["false"]
        for earlier, later in zip(attempts, attempts[1:]):
            assert earlier.data.tags["superseded_by"] == later.info.run_id


PROM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.125
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 1500.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.2
"""


@pytest.fixture()
def metrics_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            body = PROM_TEXT.encode() if self.path == "/metrics" else b"not found"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_scrape_local_metrics_endpoint(metrics_server: str):
    import requests

    snap = scrape(metrics_server)
    assert snap.values["vllm:prompt_tokens_total"] == 1500.0
    assert snap.values["vllm:time_to_first_token_seconds_count"] == 4.0
    assert snap.buckets["vllm:time_to_first_token_seconds"][0.04] == 3.0
    assert snap.gauges() == {"server_num_requests_running": 2.0, "server_kv_cache_usage_perc": 0.125}
    with requests.Session() as session:
        assert scrape(metrics_server + "/", session=session).values == snap.values
    with pytest.raises(urllib.error.HTTPError):
        scrape(metrics_server + "/nothing")

    with TelemetrySampler(replica_cpus=[0], metrics_url=metrics_server, hz=20, metrics_hz=20) as sampler:
        time.sleep(0.3)
    rows = sampler.stop()
    kv = [r["value"] for r in rows if r["name"] == "server_kv_cache_usage_perc"]
    assert kv and set(kv) == {0.125} and not sampler.errors
