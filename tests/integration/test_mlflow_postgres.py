"""The cluster's tracking server on a real PostgreSQL, started as the head starts it.

``mlflow/postgres.sh start`` creates and starts a cluster of its own (loopback only), ``mlflow/server.sh`` serves
MLflow on the URI it prints, the product's tracker logs one trial whose result is built from real request
records (an H200 trial of ``benchmarks/results/``, its metrics computed by the product's own summary), and the
run is read back through the server and from the database itself. Then PostgreSQL is restarted (a head
reboot): same URI, the run is still there. Everything is stopped and removed; no process or file is left.

About 30 s on 2 cores, most of it MLflow creating its tables in the new database. Skips only where PostgreSQL
is not installed and this is not CI (``make test`` installs Debian's package as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from mlflow import MlflowClient
from orchestrator.infra.local_servers import free_port, kill_group, listens_in_tree, still_running, tree
from orchestrator.observe import outbox
from orchestrator.observe.summary import summarize_series
from orchestrator.observe.tracking import MlflowTracker, mlflow_server_ok
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import TrialResult, TrialStatus
from workloads.metrics import summarize
from workloads.records import frame_to_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
PG = ROOT / "mlflow" / "postgres.sh"
SERVER = ROOT / "mlflow" / "server.sh"
RECORDS = ROOT / "benchmarks" / "results" / "h200" / "questions" / "h200-quota-vs-cpuset-records.parquet"


def _state_dir() -> Path:
    """A temp folder. As root, postgres.sh runs the server as PostgreSQL's own user, who must reach the folder:
    pytest's and CI's temp folders are private to root, so it goes directly under /tmp, searchable by others."""
    if os.geteuid() != 0:
        return Path(tempfile.mkdtemp(prefix="mlflow-pg-"))
    d = Path(tempfile.mkdtemp(prefix="mlflow-pg-", dir="/tmp"))
    d.chmod(0o711)
    return d


def _pg(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(PG), cmd], env=env, capture_output=True, text=True, timeout=120)


def _postmaster(data: Path) -> psutil.Process:
    return psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))


def _result(trial, arts: Path) -> TrialResult:
    """One real H200 trial's request records, under this test's trial, with the product's metrics of them."""
    frame = pd.read_parquet(RECORDS)
    first = frame["trial_id"].iloc[0]
    records = frame_to_records(frame[frame["trial_id"] == first].drop(
        columns=["trial_id", "cores", "repeat", "restriction", "api_servers", "search_step", "search_reason"]))
    arts.mkdir()
    (arts / "vllm.log").write_text("INFO: Application startup complete.\n")
    (arts / "trial_spec.json").write_text(trial.model_dump_json())
    telemetry = tuple({"t": 0.5 * i, "name": "replica_cpu_util", "value": 40.0 + i} for i in range(20))
    now = time.time()
    return TrialResult(trial_id=trial.trial_id, status=TrialStatus.COMPLETED, records=tuple(records),
                       # as the executor's summary: the client's figures and the series' means and maxima
                       metrics={**summarize(records), **summarize_series(telemetry)},
                       params={"vllm_version": "0.26.0", "restriction": "cpuset"},
                       telemetry=telemetry, artifacts_dir=str(arts), started_at=now - 30, ended_at=now)


def test_cluster_tracking_server_on_postgres(tmp_path: Path) -> None:
    probe = _pg("status", {**os.environ, "MLFLOW_PG_DIR": str(tmp_path / "none"), "MLFLOW_ENV_FILE": os.devnull})
    if probe.returncode == 1 and "CPUSWEEP_CI_RUN" not in os.environ:
        pytest.skip(f"PostgreSQL is not installed here (`make test` installs it as root): {probe.stderr.strip()}")
    assert probe.returncode == 3, probe.stderr  # installed, and this folder's server is not running

    import psycopg2  # the cluster extra's driver (in the test extra too)

    state = _state_dir()
    data = state / "postgres" / "data"
    env = {**os.environ, "MLFLOW_PG_DIR": str(state / "postgres"), "MLFLOW_PG_PORT": str(free_port()),
           "MLFLOW_ENV_FILE": os.devnull}
    env.pop("MLFLOW_TRACKING_URI", None)
    server: subprocess.Popen | None = None
    pg_procs: list[psutil.Process] = []
    try:
        started = _pg("start", env)
        assert started.returncode == 0, started.stderr
        uri = started.stdout.strip()
        assert uri.startswith("postgresql+psycopg2://mlflow:") and f"@127.0.0.1:{env['MLFLOW_PG_PORT']}/mlflow" in uri
        assert _pg("uri", env).stdout.strip() == uri
        pg_procs = tree(_postmaster(data).pid)
        listening = [c.laddr for c in _postmaster(data).net_connections("inet") if c.status == psutil.CONN_LISTEN]
        assert listening and {a.ip for a in listening} == {"127.0.0.1"}, listening  # loopback only

        port = free_port()
        senv = {**env, "MLFLOW_HOME": str(state / "mlflow"), "MLFLOW_BACKEND_STORE_URI": uri,
                "MLFLOW_PORT": str(port), "MLFLOW_BIN": str(Path(sys.executable).parent / "mlflow")}
        with open(tmp_path / "server.log", "ab") as log:
            server = subprocess.Popen([str(SERVER)], env=senv, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        server_uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 150
        while not (mlflow_server_ok(server_uri, timeout_s=1) and listens_in_tree(server.pid, port)):
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the MLflow server on PostgreSQL was not healthy in 150 s"
            time.sleep(0.5)
        password = uri.split("@")[0].rsplit(":", 1)[1]
        for p in tree(server.pid):  # the URI travels in the environment: no command line shows the password
            assert password not in " ".join(p.cmdline()), p.cmdline()

        plan = expand(parse_spec({
            "name": "pg-cluster", "models": [{"kind": "shape", "name": "tiny-llama", "shape": "tiny-llama"}],
            "workloads": [{"kind": "agentic", "name": "agentic-short", "sessions": 2, "turns": 2}],
            "grid": {"cores": [2], "vllm": [{"name": "default", "args": ["--enforce-eager"]}]}}))
        [trial] = plan.trials
        result = _result(trial, tmp_path / "arts")
        box = tmp_path / "outbox"
        tracker = MlflowTracker(server_uri, outbox_dir=box)
        tracker.on_sweep_start(plan)
        tracker.on_trial_result(trial, result)
        tracker.on_sweep_end(plan, [result])
        assert outbox.pending(box) == []  # uploaded, nothing kept back
        assert tracker.finished_trial_ids("pg-cluster") == {trial.trial_id}

        client = MlflowClient(server_uri)
        exp = client.get_experiment_by_name("pg-cluster")
        [run] = client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'trial'")
        assert run.info.status == "FINISHED" and run.data.tags["trial_id"] == trial.trial_id
        assert run.data.params["cores"] == "2" and run.data.params["vllm_version"] == "0.26.0"
        assert run.data.metrics["num_records"] == len(result.records) > 100
        assert run.data.metrics["ttft_p50_s"] == pytest.approx(result.metrics["ttft_p50_s"])
        assert run.data.metrics["replica_cpu_util_max"] == 59.0
        assert len(client.get_metric_history(run.info.run_id, "ts/replica_cpu_util")) == 20
        got = client.download_artifacts(run.info.run_id, "records.parquet", str(tmp_path))
        assert len(pd.read_parquet(got)) == len(result.records)

        # It is PostgreSQL's: no sqlite file, and the database's own tables hold the run.
        assert not (state / "mlflow" / "mlflow.db").exists()
        dsn = uri.replace("+psycopg2", "")
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute("select status from runs where run_uuid = %s", (run.info.run_id,))
            assert cur.fetchall() == [("FINISHED",)]
            cur.execute("select count(*) from params where run_uuid = %s", (run.info.run_id,))
            assert cur.fetchone()[0] == len(run.data.params)
        conn.close()

        server_procs = tree(server.pid)
        kill_group(server)
        server = None
        assert still_running(server_procs) == []
        assert _pg("stop", env).returncode == 0
        assert _pg("status", env).returncode == 3
        assert still_running(pg_procs) == []
        # A restart (the head rebooted): the same URI, the same runs.
        again = _pg("start", env)
        assert again.returncode == 0 and again.stdout.strip() == uri, again.stderr
        pg_procs = tree(_postmaster(data).pid)
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute("select count(*) from runs where run_uuid = %s", (run.info.run_id,))
            assert cur.fetchone()[0] == 1
        conn.close()
    finally:
        if server is not None:
            kill_group(server)
        _pg("stop", env)
        left = still_running(pg_procs)
        shutil.rmtree(state, ignore_errors=True)
    assert left == [], f"PostgreSQL left running: {left}"
    assert not state.exists()
