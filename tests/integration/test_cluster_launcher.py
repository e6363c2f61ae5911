"""Ray's own cluster launcher, end to end on this machine: ``ray up``, ``ray submit`` (interrupted, then again),
``ray down``, with ``cluster-local.yaml`` (Ray's on-premise provider over SSH to 127.0.0.1; why that provider:
``orchestrator/infra/loopback_cluster.py``).

The commands are README's ("Across a cluster", "On this machine"), run from the repository root with the
node's folder in place of ``/tmp/orch-local``; the test checks that README shows each of them. Checked:

- ``loopback_cluster up`` starts an sshd on 127.0.0.1 only, and its copy of cluster-local.yaml differs from the
  repository's only in what ``up`` fills in (cluster name, SSH user, key, proxy command);
- ``ray up`` brings the head up; every process of the node listens on loopback only; the head imports the
  project from the copy ``ray up`` synced;
- ``ray submit`` of ``orchestrator run`` on sweeps/launcher-smoke.yaml (two vLLM-CPU trials), interrupted with
  Ctrl-C (written to its terminal, which ``ssh -tt`` passes to the head) once the head's MLflow has the first
  trial FINISHED: the driver stops and marks the sweep KILLED;
- the same ``ray submit`` again skips the finished trial (the controller asks MLflow) and runs the other: in the
  head's MLflow, each trial has exactly one run, FINISHED, the first one the run seen before the interrupt;
- ``ray down`` ends every process of the node (its ``ray stop`` is the node's own) and none of this machine's
  other processes: a decoy whose command line Ray's own ``ray stop`` would match is still alive;
- ``loopback_cluster down`` leaves nothing: no process, no folder, no key, no launcher file (ssh control
  sockets, provider state, config cache), ``~/.ssh`` as it was.

Needs ``sshd`` and ``rsync`` (Debian: openssh-server, rsync; ``make test-cluster`` installs them where it runs as
root with apt). Without them the test skips, except under ``.ci/run`` (``CPUSWEEP_CI_RUN``), where it fails.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.infra import loopback_cluster as lc
from orchestrator.infra.net import non_loopback_listeners

# `cluster`: `make test-cluster` runs it alone; `make test` runs it in the lane that sees every core (whole_node).
pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.cluster, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SWEEP = "launcher-smoke"
README_FOLDER = "/tmp/orch-local"
# README's commands, in the order the test runs them (`ray submit` twice: interrupted, then resumed).
UP = "python -m orchestrator.infra.loopback_cluster up /tmp/orch-local"
RAY_UP = "ray up -y /tmp/orch-local/cluster-local.yaml"
PROBE = "ray exec /tmp/orch-local/cluster-local.yaml 'python -c \"import orchestrator; print(orchestrator.__file__)\"'"
SUBMIT = ("ray submit /tmp/orch-local/cluster-local.yaml orchestrator/cli.py -- "
          "run cpu-starvation/sweeps/launcher-smoke.yaml")
RAY_DOWN = "ray down -y /tmp/orch-local/cluster-local.yaml"
DOWN = "python -m orchestrator.infra.loopback_cluster down /tmp/orch-local"
# What the nodes must not inherit from this process (sshd gives them a clean environment anyway; the
# launcher's own processes must not join another cluster either).
SCRUB = ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "MLFLOW_TRACKING_URI", "ORCH_HOME")


def _missing_tools() -> list[str]:
    return [t for t, path in (("sshd (openssh-server)", lc.SSHD), ("rsync", shutil.which("rsync") or "/nonexistent"))
            if not Path(path).exists()]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `ray` and `python` of this environment
    return env


def _argv(command: str, folder: Path) -> list[str]:
    return ["bash", "-c", command.replace(README_FOLDER, str(folder))]


def _run(command: str, folder: Path, timeout_s: float = 240) -> tuple[str, float]:
    t0 = time.monotonic()
    done = subprocess.run(_argv(command, folder), cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"`{command}` exited {done.returncode} after {took:.0f} s:\n{out[-5000:]}"
    print(f"`{command}`: {took:.1f} s")
    return out, took


def _finished_trials(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name(SWEEP)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'trial' and attributes.status = 'FINISHED'")


def _submit(folder: Path, client: MlflowClient | None, timeout_s: float = 420) -> tuple[int, str, float]:
    """`ray submit` with a terminal, as a user runs it. With ``client``: Ctrl-C once a trial is FINISHED in MLflow.
    Returns the exit status, what the terminal showed (escapes removed) and the seconds it took."""
    master, slave = pty.openpty()
    t0 = time.monotonic()
    proc = subprocess.Popen(_argv(SUBMIT, folder), cwd=ROOT, env=_env(), stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    sent, polled = False, 0.0
    try:
        while time.monotonic() - t0 < timeout_s:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal has exited
                    data = b""
                if not data:
                    break
                chunks.append(data)
            if client is not None and not sent and time.monotonic() - polled > 2:
                polled = time.monotonic()
                if _finished_trials(client):
                    print(f"a trial FINISHED in the head's MLflow after {polled - t0:.0f} s: Ctrl-C")
                    os.write(master, b"\x03")
                    sent = True
        else:
            pytest.fail(f"`ray submit` still running after {timeout_s:.0f} s:\n{_text(chunks)[-4000:]}")
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        os.close(master)
    if client is not None:
        assert sent, f"no trial FINISHED before `ray submit` ended ({rc}):\n{_text(chunks)[-4000:]}"
    return rc, _text(chunks), time.monotonic() - t0


def _text(chunks: list[bytes]) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace")).replace("\r", "")


def _decoy(tmp: Path) -> subprocess.Popen:
    """A process that is not the cluster's but that Ray's own `ray stop` would end: its command line holds
    one of Ray's process keywords (``log_monitor.py``)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", str(tmp / "log_monitor.py")],
                            start_new_session=True)


def _snapshot_ssh() -> dict[str, float]:
    ssh = Path.home() / ".ssh"
    return {str(p): p.stat().st_mtime for p in ssh.rglob("*")} if ssh.exists() else {}


@pytest.fixture
def folder():
    missing = _missing_tools()
    if missing:
        reason = f"needs {' and '.join(missing)} (Debian: apt-get install openssh-server rsync; `make test` does it as root)"
        if os.environ.get("CPUSWEEP_CI_RUN"):
            pytest.fail(f"CI must run the launcher test: {reason}")
        pytest.skip(reason)
    # Ray's session folder, under the node's TMPDIR, holds unix sockets: keep the path short, not under tmp_path.
    f = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    try:
        yield f
    finally:
        if (f / lc.STATE).exists():
            lc.down(f)  # what a failed test left (README's last command did not run)
        shutil.rmtree(f, ignore_errors=True)


def test_ray_up_submit_interrupt_resume_down_on_a_loopback_node(folder: Path, tmp_path: Path):
    readme = (ROOT / "README.md").read_text()
    for command in (UP, RAY_UP, PROBE, SUBMIT, RAY_DOWN, DOWN):
        assert command in readme, f"README does not show the command the test runs: {command}"
    ssh_before = _snapshot_ssh()
    controls_before = set(Path("/tmp").glob("ray_ssh_*/*"))
    t_all = time.monotonic()

    _run(UP, folder)
    node = lc.Node.load(folder)
    template = yaml.safe_load((ROOT / "cluster-local.yaml").read_text())
    rendered = yaml.safe_load(node.config.read_text())
    assert {k: v for k, v in rendered.items() if k not in lc.FILLED} == \
           {k: v for k, v in template.items() if k not in lc.FILLED}
    assert rendered["auth"]["ssh_private_key"] == str(node.key)
    sshd = [p for p in lc.node_processes(folder) if "sshd" in p.name()]
    assert len(sshd) == 1 and not non_loopback_listeners(sshd), lc.describe(sshd)

    _, up_s = _run(RAY_UP, folder)
    ours = lc.node_processes(folder)
    names = " ".join(lc.describe(ours))
    assert "raylet" in names and "gcs_server" in names and "mlflow" in names, names[:2000]
    assert not non_loopback_listeners(ours), non_loopback_listeners(ours)
    probe, _ = _run(PROBE, folder)
    assert f"{node.home}/cpu-starvation/orchestrator/__init__.py" in probe, probe[-2000:]

    client = MlflowClient(node.mlflow_uri)
    rc, first, first_s = _submit(folder, client)
    print(first[-3000:])
    assert rc != 0 and "interrupted by SIGINT" in first, (rc, first[-4000:])
    [done] = _finished_trials(client)
    exp = client.get_experiment_by_name(SWEEP)
    assert exp is not None
    sweeps = client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'sweep'")
    assert [r.info.status for r in sweeps] == ["KILLED"], [(r.info.run_name, r.info.status) for r in sweeps]

    rc, again, again_s = _submit(folder, None)
    print(again[-3000:])
    assert rc == 0, again[-4000:]
    assert f"[{done.data.tags['trial_id']}]" in again and "already finished in MLflow, skipped" in again, again[-4000:]
    trials = client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'trial'")
    by_id: dict[str, list] = {}
    for r in trials:
        by_id.setdefault(r.data.tags["trial_id"], []).append(r)
    assert len(by_id) == 2, sorted(by_id)
    assert all(len(runs) == 1 and runs[0].info.status == "FINISHED" for runs in by_id.values()), \
        {t: [r.info.status for r in runs] for t, runs in by_id.items()}
    assert by_id[done.data.tags["trial_id"]][0].info.run_id == done.info.run_id  # not run again
    [sweep_run] = client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'sweep'")
    assert sweep_run.info.status == "FINISHED", sweep_run.info.status
    assert all(float(r.data.metrics.get("requests", 0)) > 0 for r in trials), [r.data.metrics for r in trials]

    decoy = _decoy(tmp_path)
    try:
        down_out, down_s = _run(RAY_DOWN, folder)
        stopped = [line for line in down_out.splitlines() if "processes of the loopback node" in line]
        assert stopped, down_out[-3000:]  # the node's `ray stop` ran
        print(stopped[0])
        left = lc.describe(lc.node_processes(folder, marked_only=True))
        assert not left, f"left running after `ray down`: {left}"
        assert decoy.poll() is None, "ray down ended a process that is not the cluster's"
    finally:
        decoy.kill()
        decoy.wait(timeout=10)

    _run(DOWN, folder)
    print(f"launcher test: {time.monotonic() - t_all:.0f} s in all (ray up {up_s:.0f} s, interrupted submit "
          f"{first_s:.0f} s, resumed submit {again_s:.0f} s, ray down {down_s:.0f} s)")
    assert not folder.exists()
    assert not lc.node_processes(folder), lc.describe(lc.node_processes(folder))
    assert not lc.control_dir(node.cluster_name).exists()
    assert set(Path("/tmp").glob("ray_ssh_*/*")) <= controls_before
    assert not lc.launcher_files(node)
    assert _snapshot_ssh() == ssh_before, "~/.ssh changed"
