"""Tracking as an observer: sweep/trial callbacks and their MLflow implementation.

MLflow layout (one experiment, default name = the sweep name):

* **Parent run** per sweep, named after it; tags ``sweep``, ``orchestrator.kind=sweep``,
  ``git_commit``; params = the grid; artifacts ``spec.yaml`` (when the file is known),
  ``spec.json`` (resolved) and the plan table ``plan.json``. Re-running the sweep
  re-attaches to it by the ``sweep`` tag instead of creating another. At the sweep's end it
  is FINISHED when every planned trial has a final (FINISHED or FAILED) run, else KILLED (the
  sweep was interrupted: Ctrl-C, SIGTERM); a later run marks it RUNNING again.
* **Child run** per trial result, nested with ``mlflow.parentRunId``; tags ``trial_id``,
  ``sweep``, ``orchestrator.kind=trial``, ``error_kind`` (+ ``error_message``),
  ``superseded``; params written once at creation; metrics (summary at step 0,
  sampled series as ``ts/<name>`` with step = milliseconds since the sampler started);
  artifacts ``records.parquet``, ``telemetry.parquet`` and the trial's artifacts folder.

Resume policy: a trial_id with a FINISHED child run is never logged again (a repeated
result is dropped with a warning). A trial that failed and runs again (a retry, or a
later re-run of the sweep) gets a *new* child run; the earlier non-finished runs of that
trial_id stay as history, tagged ``superseded=true`` and ``superseded_by=<run id>``.
Filter ``tags.superseded = 'false'`` to see the latest attempt of every trial.

The child run is created only after the trial ended (``on_trial_result``), in one go, so
tracking I/O never overlaps the measurement and a crash never leaves a half-run behind.
A result is first written whole into the local outbox (``orchestrator.observe.outbox.put``), then
:func:`drain` uploads the sweep's pending entries and removes each once MLflow has it: the
same way for a trial's own result, the results an outage left, and :func:`sync_outbox`. When the
server is unreachable the entries simply stay, and ``orchestrator sync`` uploads them later.

This module is the project's one MLflow writer: the parent run, the child runs, the sweep's
metrics and tags, and the report's artifacts are all written here.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Metric, Param, RunTag, ViewType

from mlflow import MlflowClient
from orchestrator.observe import outbox
from orchestrator.values.callbacks import Callback, CallbackList
from orchestrator.values.results import TrialResult
from orchestrator.values.trial import SweepPlan, TrialSpec

log = logging.getLogger(__name__)

# Bounded client retries: a dead server must cost seconds, not MLflow's default ~4 minutes.
# And no "View run at ..." line on stdout per run (we log it instead). Only defaults: a
# user's own setting wins.
_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60", "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
_BATCH_PARAMS = 100
_BATCH_METRICS = 1000
_SWEEP_KIND = "tags.`orchestrator.kind` = 'sweep'"
_TRIAL_KIND = "tags.`orchestrator.kind` = 'trial'"


def _client_defaults() -> None:
    """Set :data:`_CLIENT_DEFAULTS` where the user has not: before any MLflow client is made."""
    for k, v in _CLIENT_DEFAULTS.items():
        os.environ.setdefault(k, v)


def mlflow_server_ok(uri: str, timeout_s: float = 2.0) -> bool:
    """True when an http(s) tracking server answers ``/health``; non-HTTP stores count as up."""
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as resp:  # noqa: S310
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def git_commit(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the working directory, or None (no git, no repo, no commit)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _ms(seconds: float | None) -> int | None:
    return int(seconds * 1000) if seconds else None


def _search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Any]:
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string, ViewType.ACTIVE_ONLY,
                                  max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def trial_runs(client: MlflowClient, sweep: str) -> list[Any]:
    """The latest run of every trial of ``sweep`` (superseded attempts left out); [] if none exist yet."""
    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        return []
    return _search_all(client, exp.experiment_id, f"tags.sweep = '{sweep}' and {_TRIAL_KIND} "
                                                   "and tags.superseded = 'false'")


def parent_run(client: MlflowClient, sweep: str) -> Any | None:
    """The parent run of ``sweep`` (the oldest run tagged as its sweep run), or None."""
    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        return None
    run_id = _find_parent(client, exp.experiment_id, sweep)
    return client.get_run(run_id) if run_id else None


def log_report(uri: str, parent_run_id: str, folder: Path, artifact_path: str = "report") -> None:
    """Log a written report folder (``index.html``, plots, CSVs) as artifacts of the sweep's parent run."""
    _client_defaults()
    MlflowClient(uri).log_artifacts(parent_run_id, str(folder), artifact_path)


def _experiment_id(client: MlflowClient, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, tags={"orchestrator": "cpu-starvation-sweep"})
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def _find_parent(client: MlflowClient, experiment_id: str, sweep: str) -> str | None:
    runs = _search_all(client, experiment_id, f"tags.sweep = '{sweep}' and {_SWEEP_KIND}")
    runs.sort(key=lambda r: r.info.start_time or 0)  # the oldest parent is the sweep's home
    return runs[0].info.run_id if runs else None


def ensure_parent(client: MlflowClient, sweep: Mapping[str, Any], *, reopen: bool) -> tuple[str, str]:
    """(experiment id, parent run id) of a sweep: re-attached by its ``sweep`` tag, else created.

    Creation logs the params, the spec and the plan table once. ``reopen`` marks a re-attached
    parent RUNNING again and counts the resume (tag ``resumes``).
    """
    exp_id = _experiment_id(client, sweep["experiment"])
    parent = _find_parent(client, exp_id, sweep["sweep"])
    if parent is not None:
        if reopen:
            run = client.get_run(parent)
            resumes = int(run.data.tags.get("resumes", "0")) + 1
            client.update_run(parent, status="RUNNING")
            client.set_tag(parent, "resumes", str(resumes))
        return exp_id, parent
    run = client.create_run(exp_id, tags=dict(sweep["tags"]), run_name=sweep["sweep"])
    parent = run.info.run_id
    client.log_batch(parent, params=[Param(k, v) for k, v in sweep["params"].items()])
    client.log_dict(parent, sweep["spec"], "spec.json")
    if sweep.get("spec_yaml"):
        client.log_text(parent, sweep["spec_yaml"], "spec.yaml")
    if sweep.get("plan"):
        # object dtype: pandas 3 string columns make log_table emit a deprecation warning
        client.log_table(parent, data=pd.DataFrame(sweep["plan"]).astype(object), artifact_file="plan.json")
    return exp_id, parent


def _series_metrics(path: Path | None, started_at: float, max_points: int) -> list[Metric]:
    """Sampled series as ``ts/<name>`` metrics, stride-downsampled to ``max_points`` per name."""
    if path is None:
        return []
    frame = pd.read_parquet(path).dropna(subset=["value"])
    base_ms = int(started_at * 1000) if started_at else int(time.time() * 1000)
    out: list[Metric] = []
    for name, group in frame.groupby("name", sort=True):
        stride = max(1, -(-len(group) // max_points))
        for t, v in zip(group["t"].to_numpy()[::stride], group["value"].to_numpy()[::stride]):
            ms = int(round(float(t) * 1000))
            out.append(Metric(f"ts/{outbox.safe_key(str(name))}", float(v), base_ms + ms, ms))
    return out


def upload_trial(client: MlflowClient, experiment_id: str, parent_run_id: str, entry: outbox.OutboxEntry,
                 *, max_series_points: int = 1000) -> str | None:
    """Create the child run of one staged/outbox trial folder. Returns its run id, or None when skipped.

    Skipped (not an error): the same upload already completed (a sync that died before
    deleting the folder), or the trial_id already has a FINISHED run. Earlier non-finished
    runs of the trial_id are tagged ``superseded=true`` after the new run is complete.
    """
    p = entry.payload
    existing = _search_all(client, experiment_id, f"tags.trial_id = '{p['trial_id']}' and {_TRIAL_KIND}")
    for r in existing:
        if r.data.tags.get("upload_id") == p["upload_id"] and r.info.status in ("FINISHED", "FAILED"):
            log.info("trial %s: this result is already uploaded as run %s", p["trial_id"], r.info.run_id)
            return None
        if r.info.status == "FINISHED":
            log.warning("trial %s already has a FINISHED run %s; not logging it again", p["trial_id"], r.info.run_id)
            return None
    tags = {**p["tags"], "mlflow.parentRunId": parent_run_id, "upload_id": p["upload_id"],
            "superseded": "false", "attempt": str(len(existing) + 1)}
    run = client.create_run(experiment_id, start_time=_ms(p.get("started_at")), tags=tags, run_name=p["run_name"])
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in p["params"].items()]
    for i in range(0, len(params), _BATCH_PARAMS):
        client.log_batch(run_id, params=params[i:i + _BATCH_PARAMS])
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in p["metrics"].items()]
    metrics += _series_metrics(entry.file("telemetry.parquet"), p.get("started_at") or 0.0, max_series_points)
    for i in range(0, len(metrics), _BATCH_METRICS):
        client.log_batch(run_id, metrics=metrics[i:i + _BATCH_METRICS])
    for name in ("records.parquet", "telemetry.parquet", "result.json"):
        f = entry.file(name)
        if f is not None:
            client.log_artifact(run_id, str(f))
    arts = entry.file("artifacts")
    if arts is not None and any(arts.iterdir()):
        client.log_artifacts(run_id, str(arts))
    client.set_terminated(run_id, p["status"], end_time=_ms(p.get("ended_at")))
    for r in existing:
        if r.data.tags.get("superseded") == "true":
            continue  # already points at the attempt that replaced it
        client.log_batch(r.info.run_id, tags=[RunTag("superseded", "true"), RunTag("superseded_by", run_id)])
        if r.info.status == "RUNNING":  # an upload that died half-way
            client.set_terminated(r.info.run_id, "KILLED")
    log.info("trial %s logged as run %s (%s)", p["trial_id"], run_id, p["status"])
    return run_id


def drain(client: MlflowClient, experiment_id: str, parent_run_id: str, outbox_dir: Path, sweep: str, *,
          max_series_points: int = 1000) -> int:
    """The one way from the outbox to MLflow: each pending entry of ``sweep``, oldest first, becomes its child run
    (:func:`upload_trial`) and is then removed. Returns how many were logged (an entry already on the server is
    removed without a second run). Raises on the first failure: that entry and the later ones stay."""
    logged = 0
    for entry in outbox.pending(outbox_dir, sweep):
        if upload_trial(client, experiment_id, parent_run_id, entry, max_series_points=max_series_points):
            logged += 1
        outbox.discard(entry.path)
    return logged


def _finish_parent(client: MlflowClient, experiment_id: str, parent_run_id: str, sweep: str,
                   planned: Iterable[str] | None = None) -> str:
    """Count the sweep's latest trial runs into parent metrics and end the parent; returns its status.

    FINISHED when every planned trial ended (a FINISHED or FAILED run), else KILLED: the sweep
    was interrupted (Ctrl-C, SIGTERM) with trials left; its next run re-opens the parent.
    ``planned`` None (an old outbox without the plan) counts as complete.
    """
    runs = _search_all(client, experiment_id, f"tags.sweep = '{sweep}' and {_TRIAL_KIND} "
                                              "and tags.superseded = 'false'")
    finished = sum(r.info.status == "FINISHED" for r in runs)
    failed = sum(r.info.status == "FAILED" for r in runs)
    now = int(time.time() * 1000)
    client.log_batch(parent_run_id, metrics=[Metric("trials_finished", finished, now, 0),
                                             Metric("trials_failed", failed, now, 0)])
    ended = {r.data.tags.get("trial_id") for r in runs if r.info.status in ("FINISHED", "FAILED")}
    status = "FINISHED" if planned is None or set(planned) <= ended else "KILLED"
    client.set_terminated(parent_run_id, status)
    return status


def _planned(sweep: Mapping[str, Any]) -> list[str] | None:
    """The trial ids of a sweep payload's plan table (None when it has none)."""
    rows = sweep.get("plan") or []
    return [r["trial_id"] for r in rows] if rows else None


class MlflowTracker(Callback):
    """The MLflow callback. See the module docstring for the layout and the resume policy."""

    def __init__(self, tracking_uri: str, *, experiment: str | None = None, outbox_dir: Path,
                 spec_path: Path | None = None, client: MlflowClient | None = None,
                 health_timeout_s: float = 2.0, max_series_points: int = 1000) -> None:
        _client_defaults()
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.outbox_dir = Path(outbox_dir)
        self.spec_path = Path(spec_path) if spec_path else None
        self.client = client or MlflowClient(tracking_uri)
        self.health_timeout_s = health_timeout_s
        self.max_series_points = max_series_points
        self._lock = threading.Lock()
        self._sweep: dict[str, Any] | None = None
        self._exp_id: str | None = None
        self._parent_id: str | None = None
        self._git = git_commit()

    # -- helpers -------------------------------------------------------------------------
    def _up(self) -> bool:
        return mlflow_server_ok(self.tracking_uri, self.health_timeout_s)

    def _experiment_name(self, sweep: str) -> str:
        return self.experiment or sweep

    def _attach(self, reopen: bool) -> tuple[str, str]:
        assert self._sweep is not None, "on_sweep_start was not called"
        if self._parent_id is None or self._exp_id is None:
            self._exp_id, self._parent_id = ensure_parent(self.client, self._sweep, reopen=reopen)
        return self._exp_id, self._parent_id

    def _sweep_for(self, trial: TrialSpec) -> dict[str, Any]:
        if self._sweep is None:  # a result without on_sweep_start: a parent with what we know
            self._sweep = {"version": outbox.FORMAT_VERSION, "sweep": trial.sweep,
                           "experiment": self._experiment_name(trial.sweep),
                           "tags": {"sweep": trial.sweep, "orchestrator.kind": "sweep"},
                           "params": {}, "plan": [], "spec": {}, "spec_yaml": None}
        return self._sweep

    # -- callbacks -----------------------------------------------------------------------
    def _set_sweep(self, plan: SweepPlan) -> None:
        spec_yaml = self.spec_path.read_text() if self.spec_path and self.spec_path.exists() else None
        self._sweep = outbox.sweep_payload(plan, experiment=self._experiment_name(plan.spec.name),
                                           git_commit=self._git, spec_yaml=spec_yaml)
        self._exp_id = self._parent_id = None

    def on_sweep_start(self, plan: SweepPlan) -> None:
        with self._lock:
            self._set_sweep(plan)
            if not self._up():
                log.warning("MLflow at %s is unreachable: results of sweep %s go to the outbox %s; "
                            "upload them later with `orchestrator sync`", self.tracking_uri, plan.spec.name,
                            self.outbox_dir)
                return
            try:
                self._attach(reopen=True)
            except Exception as exc:  # noqa: BLE001 (tracking trouble never stops a sweep)
                log.warning("MLflow parent run for sweep %s not created yet (%s); will retry per trial",
                            plan.spec.name, exc)

    def on_trial_start(self, trial: TrialSpec) -> None:
        # No I/O: the child run is created in one go once the trial has ended.
        log.debug("trial %s (%s) started", trial.trial_id, outbox.run_name(trial))

    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None:
        with self._lock:
            entry = outbox.put(self.outbox_dir, self._sweep_for(trial), trial, result, git_commit=self._git)
            if result.artifacts_dir and not Path(result.artifacts_dir).is_dir():
                log.warning("trial %s: artifacts folder %s not found", trial.trial_id, result.artifacts_dir)
            trouble = self._drain(trial.sweep, reopen=True)
            if trouble is not None:
                log.warning("MLflow at %s %s; trial %s (%s) saved to the outbox %s; upload later with "
                            "`orchestrator sync`", self.tracking_uri, trouble, trial.trial_id,
                            entry.payload["run_name"], entry.path)

    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None:
        with self._lock:
            sweep = plan.spec.name
            if self._sweep is None or self._sweep["sweep"] != sweep or not self._sweep["plan"]:
                self._set_sweep(plan)
            assert self._sweep is not None  # set above
            trouble = self._drain(sweep, reopen=False)
            if trouble is None and not outbox.pending(self.outbox_dir, sweep):
                try:
                    assert self._exp_id is not None and self._parent_id is not None  # attached by the drain
                    status = _finish_parent(self.client, self._exp_id, self._parent_id, sweep,
                                            [t.trial_id for t in plan.trials])
                    if status != "FINISHED":
                        log.warning("sweep %s ended with trials left: its MLflow run is %s", sweep, status)
                    outbox.clear_sweep_end(self.outbox_dir, sweep)
                    outbox.remove_sweep_if_empty(self.outbox_dir, sweep)
                    return
                except Exception as exc:  # noqa: BLE001
                    log.warning("MLflow: could not close sweep %s: %s", sweep, exc)
            outbox.write_sweep(self.outbox_dir, self._sweep)
            outbox.write_sweep_end(self.outbox_dir, sweep, {"ended_at": time.time(), "results": len(results)})
            log.warning("sweep %s ended with results still in the outbox %s; run `orchestrator sync`",
                        sweep, self.outbox_dir)

    def _drain(self, sweep: str, *, reopen: bool) -> str | None:
        """Upload the sweep's pending outbox entries (this result and any an outage left), oldest first; None when
        all went up, else what went wrong ("is unreachable", "failed: ..."): the rest stays for later."""
        if not self._up():
            return "is unreachable"
        try:
            exp_id, parent = self._attach(reopen=reopen)
            drain(self.client, exp_id, parent, self.outbox_dir, sweep, max_series_points=self.max_series_points)
        except Exception as exc:  # noqa: BLE001 (anything: the results stay in the outbox)
            return f"failed: {type(exc).__name__}: {exc}"
        return None

    def tag_sweep(self, sweep: str, tags: Mapping[str, str]) -> bool:
        """Set ``tags`` on the sweep's parent run (a knee search's stop reason and knee); False when it could
        not (MLflow unreachable, no parent yet, an error: logged), never raises."""
        trouble = self._on_parent(sweep, "tags " + ", ".join(tags), lambda parent: self.client.log_batch(
            parent, tags=[RunTag(k, str(v)[:outbox.MAX_TAG_LEN]) for k, v in tags.items()]))
        if trouble is not None:
            log.warning("sweep %s's tags %s not set: %s", sweep, ", ".join(tags), trouble)
        return trouble is None

    def log_sweep_metrics(self, sweep: str, metrics: Mapping[str, float]) -> str | None:
        """Figures of the whole sweep (the share of held time inside windows) on its parent run; None when logged,
        else why not (never raises: a figure about the run must not fail it)."""
        now = int(time.time() * 1000)
        return self._on_parent(sweep, "metrics", lambda parent: self.client.log_batch(
            parent, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()]))

    def _on_parent(self, sweep: str, what: str, write: Callable[[str], object]) -> str | None:
        """``write(parent run id)`` on the sweep's parent run; None when done, else why not."""
        with self._lock:
            if not self._up():
                return f"MLflow at {self.tracking_uri} is unreachable"
            try:
                exp = self.client.get_experiment_by_name(self._experiment_name(sweep))
                parent = _find_parent(self.client, exp.experiment_id, sweep) if exp is not None else None
                if parent is None:
                    return f"sweep {sweep} has no parent run in MLflow"
                write(parent)
            except Exception as exc:  # noqa: BLE001 (tracking trouble never fails a sweep)
                return f"MLflow could not take the sweep's {what}: {type(exc).__name__}: {exc}"
        return None

    # -- queries -------------------------------------------------------------------------
    def finished_trial_ids(self, sweep: str) -> set[str]:
        """trial_ids with a FINISHED run on the server, plus FINISHED results waiting in the outbox.

        With the server unreachable this warns and returns the outbox part only: the sweep then
        re-runs trials, and the upload later drops results of trials already FINISHED there.
        """
        local = {e.trial_id for e in outbox.pending(self.outbox_dir, sweep) if e.payload["status"] == "FINISHED"}
        if not self._up():
            log.warning("MLflow at %s is unreachable: resume sees only the outbox (%d finished)",
                        self.tracking_uri, len(local))
            return local
        try:
            exp = self.client.get_experiment_by_name(self._experiment_name(sweep))
            if exp is None:
                return local
            runs = _search_all(self.client, exp.experiment_id,
                               f"tags.sweep = '{sweep}' and {_TRIAL_KIND} and attributes.status = 'FINISHED'")
        except Exception as exc:  # noqa: BLE001 (resume must not crash the sweep)
            log.warning("MLflow search failed (%s): resume sees only the outbox (%d finished)", exc, len(local))
            return local
        return local | {r.data.tags["trial_id"] for r in runs}


def sync_outbox(tracking_uri: str, outbox_dir: Path, *, client: MlflowClient | None = None,
                max_series_points: int = 1000) -> tuple[int, int]:
    """Upload every outbox entry; returns (uploaded, remaining).

    Parents are re-attached (or created from ``sweep.json``); a trial already FINISHED on the
    server is dropped, never duplicated. Each folder is removed only after its upload
    succeeded; a sweep that ended while offline is closed once all its trials are up.
    """
    _client_defaults()
    outbox_dir = Path(outbox_dir)
    if not mlflow_server_ok(tracking_uri):
        left = len(outbox.pending(outbox_dir))
        log.warning("MLflow at %s is unreachable; %d outbox entries left in %s", tracking_uri, left, outbox_dir)
        return 0, left
    client = client or MlflowClient(tracking_uri)
    uploaded = 0
    for sweep in outbox.sweeps(outbox_dir):
        info = outbox.read_sweep(outbox_dir, sweep)
        assert info is not None
        try:
            exp_id, parent = ensure_parent(client, info, reopen=False)
            uploaded += drain(client, exp_id, parent, outbox_dir, sweep, max_series_points=max_series_points)
            if outbox.read_sweep_end(outbox_dir, sweep) is not None:
                _finish_parent(client, exp_id, parent, sweep, _planned(info))
                outbox.clear_sweep_end(outbox_dir, sweep)
            outbox.remove_sweep_if_empty(outbox_dir, sweep)
        except Exception as exc:  # noqa: BLE001 (keep the rest for the next sync)
            log.warning("sync of sweep %s stopped: %s: %s", sweep, type(exc).__name__, exc)
    remaining = len(outbox.pending(outbox_dir))
    return uploaded, remaining


__all__ = ["Callback", "CallbackList", "MlflowTracker", "drain", "ensure_parent", "git_commit", "log_report",
           "mlflow_server_ok",
           "parent_run", "sync_outbox", "trial_runs", "upload_trial"]
