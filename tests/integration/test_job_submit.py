"""``ray job submit`` of a sweep to a real multi-node Ray cluster, the way a user runs it on GPU nodes.

The cluster is started with the ``ray`` CLI, as ``cluster.yaml`` starts one, each node its own process
tree: a head that runs nothing (``--num-cpus 0``) with the dashboard's job server, a worker raylet
labelled with a simulated hardware type (``ray.io/accelerator-type``), and a decoy raylet of another
type (an ``accelerator_type:`` resource). Each raylet gets one core of this machine of its own
(``ORCH_NODE_CPUS``). Then ``ray job submit --working-dir <a copy of the repo>`` runs
``orchestrator run`` on a one-trial vLLM-CPU sweep. MLflow and ORCH_HOME travel in
``--runtime-env-json``.

Two things of Ray 2.60's CLI shape the set-up. First, ``ray start`` turns ``--node-ip-address 127.0.0.1``
into the host's address, because a node that joins a cluster needs a reachable one. So the nodes
listen beyond loopback, and the cluster gets a token of its own (``RAY_AUTH_MODE=token``). Second,
``ray start --head`` turns token authentication on by itself when ``~/.ray/auth_token`` exists, but
``ray start --address`` does not, and then its raylet is refused (InvalidAuthToken). The mode is
therefore set explicitly on every node, and on the ``ray job`` CLI.

Checked:
- the job SUCCEEDED; its driver ran on the head (Ray's default for an entrypoint that asks for no
  resources: the one process that talks to MLflow); it ran the submitted copy of the project with
  the venv's Python;
- its logs show the trial COMPLETED, and the printed table;
- MLflow has the sweep's parent run and one FINISHED child run, on the labelled worker (its
  ``node_id``), not on the decoy;
- once the process groups this test started are ended, none of their processes is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.infra.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(480)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: `ray`, and the `python` the job's entrypoint runs
CPUS = sorted(os.sched_getaffinity(0))
TARGET, DECOY = "simjob", "simdecoy"
SWEEP = "job-submit"
# What the nodes must not inherit from this process: another cluster's address, the loopback-only
# switch of orchestrator.infra.local_servers (it makes `ray start --address` refuse to join), this test's own
# services, a simulated node's cores.
SCRUB = ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "MLFLOW_TRACKING_URI", "ORCH_HOME", "ORCH_NODE_CPUS",
         "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
GRACE_S = 60.0


def _ports(n: int) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        if (p := free_port()) not in out:
            out.append(p)
    return out


def _get(url: str, token: str, timeout_s: float = 5.0):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (loopback URL we built)
        return json.loads(resp.read())


@dataclass
class LocalCluster:
    """The ``ray start --block`` processes this test started, each the leader of its own session."""

    tmp: Path
    ray_tmp: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    gcs_port: int = 0
    dashboard_port: int = 0
    nodes: list[dict] = field(default_factory=list)  # the ALIVE nodes, once all are up
    started_at: float = field(default_factory=time.monotonic)

    @property
    def token(self) -> str:
        return self.env["RAY_AUTH_TOKEN"]

    def get(self, path: str):
        return _get(f"{self.dashboard}{path}", self.token)

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        # Every port a node opens is chosen here: another Ray on this machine may hold the defaults.
        agent_http, agent_grpc, runtime_env, metrics = _ports(4)
        cmd = [str(BIN / "ray"), "start", "--block",
               "--dashboard-agent-listen-port", str(agent_http), "--dashboard-agent-grpc-port", str(agent_grpc),
               "--runtime-env-agent-port", str(runtime_env), "--metrics-export-port", str(metrics),
               "--object-store-memory", str(150 * 1024 * 1024), "--disable-usage-stats", *args]
        with open(self.tmp / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**self.env, **(extra_env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def processes(self) -> dict[int, psutil.Process]:
        """Every live process of the trees started here, and any process whose command line names this
        test's folders (a Ray or vLLM process whose parent died before it and left it to init)."""
        found: dict[int, psutil.Process] = {}
        for proc in self.procs:
            try:
                root = psutil.Process(proc.pid)
                for p in [root, *root.children(recursive=True)]:
                    found[p.pid] = p
            except psutil.NoSuchProcess:
                pass
        marks = (str(self.ray_tmp), str(self.tmp))
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if p.pid != os.getpid() and any(m in cmd for m in marks):
                    found.setdefault(p.pid, p)
            except psutil.Error:
                continue
        return {pid: p for pid, p in found.items() if _alive(p)}

    def stop(self, grace_s: float = GRACE_S) -> list[str]:
        """SIGTERM each session started here (the workers first: a raylet whose head is gone waits for it to
        come back), wait, then SIGKILL what is left; return what was left after the grace period (as
        'pid cmdline'). Only this test's processes are signalled."""
        seen = self.processes()
        deadline = time.monotonic() + grace_s
        for group in (self.procs[1:], self.procs[:1]):
            for proc in group:
                _signal_group(proc.pid, signal.SIGTERM)
            while time.monotonic() < deadline and any(proc.poll() is None for proc in group):
                seen.update(self.processes())
                time.sleep(0.5)
        while time.monotonic() < deadline and any(_alive(p) for p in seen.values()):
            seen.update(self.processes())
            time.sleep(0.5)
        left = [f"{p.pid} {_cmd(p)}" for p in seen.values() if _alive(p)]
        for proc in self.procs:
            _signal_group(proc.pid, signal.SIGKILL)
        for p in seen.values():  # Ray's workers lead process groups of their own; they are ours too
            if _alive(p):
                with contextlib.suppress(psutil.Error):
                    p.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        psutil.wait_procs(list(seen.values()), timeout=10)
        return left


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmd(p: psutil.Process) -> str:
    try:
        return (" ".join(p.cmdline()) or p.name())[:160]
    except psutil.Error:
        return "?"


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _nodes(cluster: LocalCluster) -> list[dict]:
    """The cluster's nodes, from the dashboard's state API."""
    return cluster.get("/api/v0/nodes?limit=100&detail=true")["data"]["result"]["result"]


def _wait_up(cluster: LocalCluster, workers: int, timeout_s: float = 90.0) -> list[dict]:
    """Wait until the job server answers and the head and ``workers`` worker nodes are ALIVE."""
    deadline = time.monotonic() + timeout_s
    last = "nothing yet"
    while time.monotonic() < deadline:
        for proc in cluster.procs:
            if proc.poll() is not None:
                logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
                                 for f in sorted(cluster.tmp.glob("*.log")))
                pytest.fail(f"`ray start` exited with {proc.returncode}:\n{logs}")
        try:
            cluster.get("/api/jobs/")
            nodes = [n for n in _nodes(cluster) if n.get("state") == "ALIVE"]
            if len(nodes) == workers + 1:
                return nodes
            last = f"{len(nodes)} nodes alive"
        except Exception as exc:  # noqa: BLE001 (not up yet: refused, 404/500 while the dashboard starts)
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(1.0)
    pytest.fail(f"the cluster was not up after {timeout_s:.0f} s: {last}")


@pytest.fixture
def cluster(tmp_path: Path):
    if len(CPUS) < 2:
        pytest.skip("needs 2 cores: one per simulated node")
    # Ray's session folder holds unix sockets, whose paths must stay short: not under pytest's tmp_path.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rayjob-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # as in cluster.yaml: the venv first on PATH
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")  # a test cluster serves no one: stop at once
    c = LocalCluster(tmp=tmp_path, ray_tmp=ray_tmp, env=env)
    try:
        c.gcs_port, c.dashboard_port, client_port = _ports(3)
        c.start("head", ["--head", "--port", str(c.gcs_port), "--num-cpus", "0", "--num-gpus", "0",
                         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(c.dashboard_port),
                         "--ray-client-server-port", str(client_port), "--temp-dir", str(ray_tmp)])
        address = f"127.0.0.1:{c.gcs_port}"
        # One node at a time: on a busy 2-core machine, raylets started together time out registering.
        _wait_up(c, workers=0)
        c.start("target", ["--address", address, "--num-cpus", "1", "--num-gpus", "0",
                           "--labels", f"ray.io/accelerator-type={TARGET}"], {"ORCH_NODE_CPUS": str(CPUS[0])})
        _wait_up(c, workers=1)
        c.start("decoy", ["--address", address, "--num-cpus", "1", "--num-gpus", "0",
                          "--resources", json.dumps({f"accelerator_type:{DECOY}": 1})],
                {"ORCH_NODE_CPUS": str(CPUS[1])})
        c.nodes = _wait_up(c, workers=2)
        yield c
    finally:
        left = c.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        after = c.processes()
        assert not left and not after, (f"left after SIGTERM and {GRACE_S:.0f} s: {left}; "
                                        f"left after SIGKILL: {[f'{p.pid} {_cmd(p)}' for p in after.values()]}")


def _working_dir(dest: Path) -> Path:
    """A small copy of the repository, as `--working-dir .` uploads it (no .venv, no .git), plus the sweep."""
    ignore = shutil.ignore_patterns(".venv", ".git", ".orchestrator", "__pycache__", "*.egg-info", ".pytest_cache",
                                    "tests", "benchmarks", ".bundle")
    shutil.copytree(ROOT, dest, ignore=ignore)
    sweep = yaml.safe_load((ROOT / "sweeps" / "smoke.yaml").read_text())  # the smoke sweep's shape, smaller
    sweep.update(name=SWEEP, description="One vLLM-CPU trial submitted as a Ray job, on the worker of its hardware.")
    sweep["workloads"][0].update(sessions=4, concurrency=2, turns=20, think_time_s=0.2, system_prompt_tokens=256,
                                 task_tokens={"min": 16, "max": 32}, tool_output_tokens={"min": 32, "max": 64},
                                 output_tokens={"min": 8, "max": 16}, max_context_tokens=2000, max_duration_s=12)
    # Eager: no torch.compile, which costs a minute of a start on one busy core; the test is about placement.
    sweep["grid"].update(cores=[1], hardware=[TARGET], vllm=[{"name": "default", "args": ["--enforce-eager"]}])
    sweep["server"]["startup_timeout_s"] = 240
    sweep["client"] = {"cores": 1, "isolation": "prefer"}
    sweep["protocol"] = {"warmup_s": 0}
    (dest / "sweep.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    return dest


def _ray_job(cluster: LocalCluster, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), "job", *args], env=cluster.env, capture_output=True, text=True,
                          timeout=timeout_s)


def test_a_sweep_submitted_as_a_ray_job_runs_on_the_worker_of_its_hardware(cluster: LocalCluster, mlflow_uri: str,
                                                                           tmp_path: Path):
    t0, nodes = cluster.started_at, cluster.nodes
    target = [n for n in nodes if n.get("labels", {}).get("ray.io/accelerator-type") == TARGET]
    decoy = [n for n in nodes if f"accelerator_type:{DECOY}" in n.get("resources_total", {})]
    assert len(target) == 1 and len(decoy) == 1, nodes
    print(f"cluster up in {time.monotonic() - t0:.0f} s")

    wd = _working_dir(tmp_path / "wd")
    home = tmp_path / "home"
    runtime_env = {"env_vars": {"MLFLOW_TRACKING_URI": mlflow_uri, "ORCH_HOME": str(home)}}
    sid = f"job-submit-{os.getpid()}"
    # Where the job imports the project from and which Python runs it, then the command a user types.
    probe = "import orchestrator, sys; print('project:', orchestrator.__file__, 'python:', sys.executable)"
    entry = f'python -c "{probe}" && python -m orchestrator.cli run sweep.yaml'
    submit = _ray_job(cluster, "submit", "--address", cluster.dashboard, "--submission-id", sid, "--no-wait",
                      "--working-dir", str(wd), "--runtime-env-json", json.dumps(runtime_env),
                      "--", "sh", "-c", entry)
    assert submit.returncode == 0, submit.stdout + submit.stderr

    deadline = time.monotonic() + 330
    status = "PENDING"
    while time.monotonic() < deadline:
        status = cluster.get(f"/api/jobs/{sid}")["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(2)
    took = time.monotonic() - t0
    logs = _ray_job(cluster, "logs", "--address", cluster.dashboard, sid).stdout
    print(logs[-6000:])
    print(f"job {status} after {took:.0f} s from the cluster's start")
    if status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        _ray_job(cluster, "stop", "--address", cluster.dashboard, sid)
        pytest.fail(f"job still {status} after {took:.0f} s")
    shown = _ray_job(cluster, "status", "--address", cluster.dashboard, sid)
    assert status == "SUCCEEDED", (status, logs[-4000:])
    [head] = [n for n in nodes if n.get("is_head_node")]
    assert cluster.get(f"/api/jobs/{sid}")["driver_node_id"] == head["node_id"]  # where MLflow is reached from
    assert f"Job '{sid}' succeeded" in shown.stdout + shown.stderr, shown.stdout + shown.stderr  # what a user reads

    # The job ran the submitted copy (Ray puts the working dir first on PYTHONPATH), with the venv's Python.
    probe_line = next(line for line in logs.splitlines() if line.startswith("project:"))
    assert "working_dir_files" in probe_line and str(ROOT) not in probe_line.split()[1], probe_line
    assert str(BIN) in probe_line.split("python:")[1], probe_line
    assert ": COMPLETED in" in logs, logs[-3000:]
    assert f"{SWEEP}: TTFT against cores" in logs and "tiny-llama" in logs, logs[-3000:]

    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name(SWEEP)
    assert exp is not None, f"no experiment {SWEEP!r} at {mlflow_uri}"
    runs = client.search_runs([exp.experiment_id], max_results=50)
    parents = [r for r in runs if r.data.tags.get("orchestrator.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("orchestrator.kind") == "trial"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [(r.info.run_name, r.info.status) for r in runs]
    assert len(children) == 1, [(r.info.run_name, r.info.status) for r in children]
    [child] = children
    assert child.info.status == "FINISHED", (child.info.status, child.data.tags.get("error_message"))
    assert child.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
    assert child.data.params["node_id"] == target[0]["node_id"] != decoy[0]["node_id"]
    assert child.data.params["hardware"] == TARGET
    assert float(child.data.metrics.get("requests", 0)) > 0, child.data.metrics
