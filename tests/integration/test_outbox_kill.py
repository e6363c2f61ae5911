"""A sweep driver SIGKILLed with over 1,000 results waiting in its outbox loses none, and runs none of them again.

Real parts only: a real ``mlflow server`` (sqlite, ``orchestrator.infra.local_servers.mlflow_server``), the real
:class:`~orchestrator.control.controller.SweepController` and :class:`~orchestrator.observe.tracking.MlflowTracker`
in a driver process of their own (this file run as a script), trials on simulated nodes
(:class:`~orchestrator.control.sim_executor.SimExecutor`, in virtual time: results come as fast as the driver
puts them into its outbox, about 100 a second on 2 cores).

1. The first driver starts; once MLflow holds some of its trials' runs, the server's process group is stopped
   (SIGSTOP: it accepts connections and never answers, the way a hung server does), uploads in flight hang.
2. The driver's lanes go on putting results into the outbox; once 1,000 or more wait there (uploads in flight
   included: claimed entries), the driver's process group is SIGKILLed, with trials of the sweep still to run.
3. MLflow goes on (SIGCONT), and the same sweep runs again in a new driver (resume).

The server's store (sqlite) and artifacts (about 24 MiB) live in ``/dev/shm`` where it has room: on a disk every commit waits
for an fsync, and sqlite takes one writer at a time, so 1,400 uploads there cost about 100 s on 2 cores instead of
about 40; what is tested here is the outbox and the resume, not the disk.

Then: the second driver ran exactly the trials with neither a FINISHED run nor a FINISHED outbox entry (none of
the outboxed ones), it uploaded every outboxed result (the FINISHED run of each such trial carries the entry's own
``upload_id``), the outbox is empty, and MLflow holds exactly one FINISHED run per planned trial, none missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

N_TRIALS = 1400  # 4 core counts x 35 workloads x 10 repeats
KILL_AT = 1000   # results waiting in the outbox when the first driver is killed
NODES = 16       # 8 trials a node at once: 128 lanes


def _plan():  # noqa: ANN202 (imported in the driver process too)
    from orchestrator.plan.expand import expand
    from orchestrator.plan.load import parse_spec

    return expand(parse_spec({
        "name": "outbox-kill", "models": [{"name": "m", "shape": "tiny-llama"}],
        "client": {"cores": 2, "isolation": "require"},
        "workloads": [{"name": f"w{i}", "kind": "agentic", "sessions": 1, "turns": 1} for i in range(35)],
        "grid": {"cores": [1, 2, 4, 8], "gpus": [1], "hardware": ["H200"], "start": ["fresh"]},
        "repeats": 10,
    }))


def drive(uri: str, box: Path, report: Path, resume: bool) -> None:
    """One sweep driver: the controller over simulated nodes, the tracker as its observer; resumed from what
    MLflow and the outbox say is finished. Writes the trials its lanes started, and the executor's count."""
    from orchestrator.control.controller import SweepController
    from orchestrator.control.sim_executor import Durations, SimExecutor, fleet
    from orchestrator.observe.tracking import MlflowTracker

    class Started:  # the trials the controller hands to the executor, as it tells its observers
        def __init__(self) -> None:
            self.ids: list[str] = []

        def on_trial_start(self, trial) -> None:  # noqa: ANN001
            self.ids.append(trial.trial_id)

    plan = _plan()
    tracker = MlflowTracker(uri, outbox_dir=box, health_timeout_s=1.0, retry_s=1.0)
    started = Started()
    ex = SimExecutor(fleet({"H200": NODES}), Durations(started=(10.0,), warm=(10.0,)), plan=plan, seed=0)
    controller = SweepController(plan, ex, observers=(tracker, started), max_concurrent=10 ** 6,
                                 finished=(lambda: tracker.finished_trial_ids(plan.spec.name)) if resume else set)
    ex.clock.lanes_expected = lambda: controller.lanes_used
    results = controller.run()
    ex.close()
    report.write_text(json.dumps({"started": started.ids, "attempts": ex.stats.attempts, "results": len(results)}))


def _server_home(tmp_path: Path) -> Path:
    """A folder for the MLflow server: in /dev/shm when it has room (see the module docstring), else ``tmp_path``."""
    import shutil
    import tempfile

    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 48 * 2**20:  # it takes ~24 MiB
        return Path(tempfile.mkdtemp(prefix="outbox-kill-mlflow-", dir=shm))
    return tmp_path / "mlflow"


def _entries(box: Path) -> list[Path]:
    """The sweep's results in the outbox: waiting, or claimed by an upload (the killed driver's in flight)."""
    trials = box / "outbox-kill" / "trials"
    names = os.listdir(trials) if trials.is_dir() else []
    return [trials / n for n in names if not n.startswith(".") or n.startswith(".claimed-")]


def _driver(uri: str, box: Path, report: Path, log: Path, resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, __file__, uri, str(box), str(report), "resume" if resume else "first"]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[2])


def _runs(client, sweep: str) -> list:  # noqa: ANN001
    from mlflow.entities import ViewType

    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        return []
    out, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'trial'", ViewType.ALL,
                                  max_results=1000, page_token=token)
        out += page
        token = page.token
        if not token:
            return out


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_driver_killed_with_a_deep_outbox_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # a server of this test's own
    box, log = tmp_path / "outbox", tmp_path / "drivers.log"
    planned = {t.trial_id for t in _plan().trials}
    assert len(planned) == N_TRIALS
    t_start = time.monotonic()
    home = _server_home(tmp_path)
    try:
        _run_and_kill(home, box, log, planned, tmp_path, t_start)
    finally:
        if home.is_relative_to("/dev/shm"):
            import shutil

            shutil.rmtree(home, ignore_errors=True)


def _run_and_kill(home: Path, box: Path, log: Path, planned: set[str], tmp_path: Path, t_start: float) -> None:
    from mlflow import MlflowClient
    from orchestrator.infra.local_servers import free_port, mlflow_server
    from orchestrator.observe import outbox

    with mlflow_server(home, port=free_port(), workers=2) as server:
        assert server.proc is not None
        client = MlflowClient(server.uri)
        first = _driver(server.uri, box, tmp_path / "first.json", log, resume=False)
        stopped = False
        try:
            deadline = time.monotonic() + 120
            while len([r for r in _runs(client, "outbox-kill") if r.info.status == "FINISHED"]) < 5:
                assert first.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the first driver uploaded nothing in 120 s"
                time.sleep(0.2)
            os.killpg(server.proc.pid, signal.SIGSTOP)  # MLflow hangs: uploads in flight never get an answer
            stopped = True
            t_stopped = time.monotonic()
            deadline = time.monotonic() + 120
            while len(_entries(box)) < KILL_AT:
                assert first.poll() is None, "the first driver ended before 1,000 results waited:\n" + \
                    log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"only {len(_entries(box))} results in the outbox after 120 s"
                time.sleep(0.02)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait(timeout=30)
            if stopped:
                os.killpg(server.proc.pid, signal.SIGCONT)
        t_killed = time.monotonic()
        assert not (tmp_path / "first.json").exists(), "the first driver finished its sweep before the kill"
        waiting = [e for p in _entries(box) if (e := outbox.load(p)) is not None]
        claimed = sum(e.path.name.startswith(".claimed-") for e in waiting)  # uploads in flight at the kill
        assert len(waiting) >= KILL_AT
        outboxed = {e.trial_id: e.payload["upload_id"] for e in waiting}
        assert len(outboxed) == len(waiting), "a trial has two results in the outbox"
        on_server = {r.data.tags["trial_id"] for r in _runs(client, "outbox-kill") if r.info.status == "FINISHED"}
        done_before = on_server | set(outboxed)
        assert len(done_before) < N_TRIALS, "nothing left for the second driver to run: the kill came too late"

        second = _driver(server.uri, box, tmp_path / "second.json", log, resume=True)
        try:
            second.wait(timeout=240)
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
                second.wait(timeout=30)
        assert second.returncode == 0, log.read_text()[-3000:]
        t_end = time.monotonic()
        report = json.loads((tmp_path / "second.json").read_text())

        started = Counter(report["started"])
        assert not set(started) & set(outboxed), "the second driver ran trials whose results waited in the outbox"
        assert set(started) == planned - done_before and max(started.values()) == 1
        assert report["attempts"] == len(started)  # the executor ran exactly those, once each
        assert _entries(box) == [] and outbox.pending(box) == []

        runs = _runs(client, "outbox-kill")
        finished = Counter(r.data.tags["trial_id"] for r in runs if r.info.status == "FINISHED")
        assert set(finished) == planned, f"{len(planned - set(finished))} trial(s) without a FINISHED run"
        assert max(finished.values()) == 1, "a trial has two FINISHED runs"
        by_trial = {r.data.tags["trial_id"]: r for r in runs if r.info.status == "FINISHED"}
        assert all(by_trial[t].data.tags["upload_id"] == u for t, u in outboxed.items()), \
            "an outboxed trial's FINISHED run is not its outboxed result"
        half = [r for r in runs if r.info.status != "FINISHED"]  # uploads cut by the stop: superseded, not shown
        assert all(r.data.tags.get("superseded") == "true" and r.info.status == "KILLED" for r in half)
        parents = [r for r in client.search_runs([by_trial[next(iter(planned))].info.experiment_id],
                                                 "tags.`orchestrator.kind` = 'sweep'")]
        assert [p.info.status for p in parents] == ["FINISHED"]
    print(f"\nMLflow stopped after {t_stopped - t_start:.1f} s; the driver killed {t_killed - t_stopped:.1f} s later "
          f"with {len(waiting)} results in the outbox ({claimed} claimed by uploads in flight; {len(on_server)} "
          f"FINISHED on the server, {len(half)} half uploads); the second driver ran {len(started)} trials and "
          f"uploaded them and the {len(waiting)} outboxed results in {t_end - t_killed:.1f} s; the server's store "
          f"took {sum(f.stat().st_size for f in home.rglob('*') if f.is_file()) / 2**20:.0f} MiB in {home}")


if __name__ == "__main__":
    drive(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), resume=sys.argv[4] == "resume")
