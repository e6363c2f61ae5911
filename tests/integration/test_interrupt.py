"""An interrupted `orchestrator run` closes its sweep: real local Ray, the run's own real MLflow server.

No vLLM: the executor is replaced by one whose first trial completes at once and whose second
trial waits in ``ray.get`` on a real Ray task (where a real trial spends its time), so SIGTERM
lands in Ray's wait. The run must exit 143, leave the MLflow parent run KILLED with the first
trial's child FINISHED, and leave none of the processes it started alive (MLflow, its watchdog,
uvicorn, Ray's). A second run of the same home, started while the first holds it, is refused
at once (exit 2) and names the holder's pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.infra.local_servers import still_running, tree

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_DRIVER = """
    import sys, time
    import ray
    import orchestrator.control.ray_executor as rx
    from orchestrator.values.results import TrialResult, TrialStatus

    @ray.remote(num_cpus=0)
    def nap(seconds):
        time.sleep(seconds)

    class FakeExecutor:
        def __init__(self, home, *, plan=None):
            self.calls = 0

        def execute(self, trial, *, attempt=1):
            self.calls += 1
            if self.calls == 1:
                now = time.time()
                return TrialResult(trial.trial_id, TrialStatus.COMPLETED, metrics={"ttft_p50_s": 0.1},
                                   started_at=now, ended_at=now)
            print("waiting in ray.get", flush=True)
            ray.get(nap.remote(600))
            raise AssertionError("not reached")

        def close(self):
            print("executor closed", flush=True)

    rx.RayTrialExecutor = FakeExecutor
    from orchestrator.cli import main
    sys.argv = ["orchestrator", "run", "sweeps/smoke.yaml", "--home", sys.argv[1]]
    main()
"""


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        env.pop(k, None)
    return env


def test_sigterm_closes_the_sweep_and_leaves_nothing_running(tmp_path: Path):
    home = tmp_path / "home"
    t0 = time.monotonic()
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_DRIVER), str(home)], cwd=ROOT, env=_env(),
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    try:
        while True:
            line = driver.stdout.readline()
            assert line or driver.poll() is None, "".join(lines)[-4000:]
            lines.append(line)
            if "waiting in ray.get" in line:
                break
            assert time.monotonic() - t0 < 150, "".join(lines)[-4000:]
        started = tree(driver.pid)
        assert any("mlflow" in " ".join(p.cmdline()) for p in started), [p.cmdline() for p in started]
        assert any("raylet" in " ".join(p.cmdline()) for p in started)
        assert any(ln.startswith("MLflow tracking at http://127.0.0.1:") for ln in lines)

        second = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "sweeps/smoke.yaml",
                                 "--home", str(home)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"pid {driver.pid}" in second.stdout

        sent = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        out, _ = driver.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out = "".join(lines) + out
    assert driver.returncode == 143, out[-4000:]
    assert "executor closed" in out and "interrupted by SIGTERM" in out
    assert "SIGTERM received" not in out  # Ray's C++ handler did not run
    deadline = time.monotonic() + 15
    while still_running(started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert still_running(started) == [], out[-3000:]
    print(f"SIGTERM to exit: {took:.1f} s; {len(started)} processes started, none left")

    from mlflow import MlflowClient

    from orchestrator.infra import survivors
    from orchestrator.infra.local_servers import free_port, mlflow_server

    with mlflow_server(home / "mlflow", port=free_port()) as server:
        client = MlflowClient(server.uri)
        exp = client.get_experiment_by_name("smoke")
        runs = client.search_runs([exp.experiment_id])
        parents = [r for r in runs if r.data.tags.get("orchestrator.kind") == "sweep"]
        children = [r for r in runs if r.data.tags.get("orchestrator.kind") == "trial"]
        assert [p.info.status for p in parents] == ["KILLED"]
        assert [c.info.status for c in children] == ["FINISHED"]
    assert not (home / "run.pid").exists()
    assert (home / "services.json").exists() and survivors.recorded(home) == []  # recorded, then forgotten
