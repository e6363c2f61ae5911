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
  sampled series as ``ts/<name>`` with step = milliseconds since the sampler started, each
  stride-downsampled to an equal share of ``max_series_total`` points for all of a result's series
  together, 400 by default, at least 10 a series: every sample is in ``telemetry.parquet``);
  artifacts ``records.parquet``, ``telemetry.parquet`` and the trial's artifacts folder.

Resume policy: a trial_id with a FINISHED child run is never logged again (a repeated
result is dropped with a warning). A trial that failed and runs again (a retry, or a
later re-run of the sweep) gets a *new* child run; the earlier non-finished runs of that
trial_id stay as history, tagged ``superseded=true`` and ``superseded_by=<run id>``.
Filter ``tags.superseded = 'false'`` to see the latest attempt of every trial.

The child run is created only after the trial ended, in one go, so tracking I/O never overlaps
the measurement and a crash never leaves a half-run behind.

**The way a result goes.** First into the local outbox, whole and on disk
(``orchestrator.observe.outbox.put``): by ``persist_result``, which the controller calls in the
lane's own thread as soon as the trial's attempt has its result (or by ``on_trial_result`` when
nobody persisted it). That call takes no lock an upload holds and sends nothing to MLflow, so a
lane never waits for MLflow, and a driver that dies loses no result that reached a lane: the
outbox is the queue of results waiting for MLflow. Then ``on_trial_result`` (the controller's
writer thread) hands the entry to the tracker's :class:`UploadPool` and returns at once. The pool
uploads the outbox's entries on a few threads at once (``uploaders``, 8 by default; one for a
tracking URI that is not a server, whose local store takes one writer), oldest first, the entries of
one trial one after another (its attempts keep their order), each entry once, and removes each
only after MLflow has it. An upload first claims its entry (``outbox.claim``: a rename), so an
``orchestrator sync`` beside a running sweep never uploads the same entry; the claims of a driver
that died are given back when the sweep next starts or resumes, or at a sync. An upload that fails while the server does not answer puts the pool on
hold: the entries stay, and it goes on by itself once ``/health`` answers again (checked every
``retry_s``); ``orchestrator sync`` uploads whatever a driver left. One upload is as few requests as
MLflow's API allows: the run created with its tags, params and metrics packed into ``log_batch``
requests within MLflow's per-request limits (100 params, 1,000 entities), each file one PUT to the
artifact store (no run lookup), the end status; and no search: the sweep's trial runs are read
with one search when the tracker attaches to the sweep (:class:`TrialRuns`) and kept up to date by
its own uploads, which decide the resume policy above from it. ``on_sweep_end`` waits for the
pool, then closes the parent run; the same pool uploads for :func:`sync_outbox`.

This module is the project's one MLflow writer: the parent run, the child runs, the sweep's
metrics and tags, and the report's artifacts are all written here.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Metric, Param, RunTag, ViewType
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

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
# MLflow's limits on one log_batch request (mlflow.utils.validation): params and tags each, metrics, and all of them.
_BATCH_PARAMS = 100
_BATCH_TAGS = 100
_BATCH_METRICS = 1000
_BATCH_ENTITIES = 1000
# The points of a result's sampled series that go to MLflow as ``ts/`` metrics, all series together. Each point is
# a metric row MLflow's server inserts, about 0.12 ms of its CPU and 0.02 ms of PostgreSQL's: sent whole, an H200
# result's series were 87% of its param and metric rows and most of its upload (benchmarks/results/mlflow-writes.md).
# The charts in MLflow's UI need few points; every sample stays in the run's telemetry.parquet.
MAX_SERIES_TOTAL = 400
MIN_SERIES_POINTS = 10  # a series keeps at least this many, however many series a result has
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


def _series_metrics(path: Path | None, started_at: float, max_points: int, total: int | None = None) -> list[Metric]:
    """Sampled series as ``ts/<name>`` metrics, stride-downsampled to ``max_points`` per name and, with ``total``, to
    an equal share of ``total`` points for each series (at least :data:`MIN_SERIES_POINTS`)."""
    if path is None:
        return []
    frame = pd.read_parquet(path).dropna(subset=["value"])
    base_ms = int(started_at * 1000) if started_at else int(time.time() * 1000)
    groups = list(frame.groupby("name", sort=True))
    if total is not None and groups:
        max_points = min(max_points, max(MIN_SERIES_POINTS, total // len(groups)))
    out: list[Metric] = []
    for name, group in groups:
        stride = max(1, -(-len(group) // max_points))
        for t, v in zip(group["t"].to_numpy()[::stride], group["value"].to_numpy()[::stride]):
            ms = int(round(float(t) * 1000))
            out.append(Metric(f"ts/{outbox.safe_key(str(name))}", float(v), base_ms + ms, ms))
    return out


@dataclass
class RunRef:
    """What the resume policy needs of one trial run: its id, status, upload and whether it was replaced."""

    run_id: str
    status: str
    upload_id: str | None
    superseded: bool


class TrialRuns:
    """The trial runs of one sweep on the server, by trial id (ACTIVE ones; deleted runs are not counted).

    Read with one search when a tracker attaches to the sweep (:meth:`load`), then kept up to date by the
    uploads themselves (:meth:`record`, :meth:`supersede`), so an upload decides the resume policy without
    a search of its own: a search per trial costs a round trip and server time that grows with the runs.
    It assumes what the design holds: one driver writes a sweep's trials at a time. Thread-safe.
    """

    def __init__(self, runs: Iterable[Any] = ()) -> None:
        self._lock = threading.Lock()
        self._by_trial: dict[str, list[RunRef]] = {}
        for r in runs:
            trial_id = r.data.tags.get("trial_id")
            if trial_id:
                self._by_trial.setdefault(trial_id, []).append(RunRef(
                    r.info.run_id, r.info.status, r.data.tags.get("upload_id"),
                    r.data.tags.get("superseded") == "true"))

    @classmethod
    def load(cls, client: MlflowClient, experiment_id: str, sweep: str) -> TrialRuns:
        return cls(_search_all(client, experiment_id, f"tags.sweep = '{sweep}' and {_TRIAL_KIND}"))

    def of(self, trial_id: str) -> list[RunRef]:
        with self._lock:
            return list(self._by_trial.get(trial_id, ()))

    def record(self, trial_id: str, run: RunRef) -> None:
        with self._lock:
            self._by_trial.setdefault(trial_id, []).append(run)

    def finish(self, trial_id: str, run_id: str, status: str) -> None:
        """The run ended with ``status``."""
        self._set(trial_id, run_id, status=status)

    def supersede(self, trial_id: str, run_id: str, status: str | None = None) -> None:
        """The run was replaced by a later attempt (and ended with ``status``, when given)."""
        self._set(trial_id, run_id, status=status, superseded=True)

    def _set(self, trial_id: str, run_id: str, *, status: str | None = None, superseded: bool = False) -> None:
        with self._lock:
            for r in self._by_trial.get(trial_id, ()):
                if r.run_id == run_id:
                    r.status = status or r.status
                    r.superseded = r.superseded or superseded

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_trial.values())


def log_batches(params: Iterable[Param], metrics: Iterable[Metric], tags: Iterable[RunTag] = ()
                ) -> Iterator[tuple[list[Param], list[Metric], list[RunTag]]]:
    """``params``, ``metrics`` and ``tags`` packed into as few ``log_batch`` requests as MLflow takes: each at
    most 100 params, 100 tags, 1,000 metrics and 1,000 entities in all. Params and tags go first (a request
    holds all of them when they fit), metrics fill the rest; each list keeps its order (a series' steps too)."""
    params, metrics, tags = list(params), list(metrics), list(tags)
    while params or metrics or tags:
        p, params = params[:_BATCH_PARAMS], params[_BATCH_PARAMS:]
        t, tags = tags[:_BATCH_TAGS], tags[_BATCH_TAGS:]
        room = min(_BATCH_METRICS, _BATCH_ENTITIES - len(p) - len(t))
        m, metrics = metrics[:room], metrics[room:]
        yield p, m, t


def _artifact_repo(client: MlflowClient, artifact_uri: str) -> Any:
    """The run's artifact store, from the URI its creation returned: no ``get_run`` request before the uploads
    (``MlflowClient.log_artifact`` makes one per run to learn that URI)."""
    return get_artifact_repository(artifact_uri, tracking_uri=client._tracking_client.tracking_uri)


def upload_trial(client: MlflowClient, experiment_id: str, parent_run_id: str, entry: outbox.OutboxEntry,
                 *, max_series_points: int = 1000, max_series_total: int | None = None,
                 runs: TrialRuns | None = None) -> str | None:
    """Create the child run of one staged/outbox trial folder. Returns its run id, or None when skipped.

    Skipped (not an error): the same upload already completed (a sync that died before
    deleting the folder), or the trial_id already has a FINISHED run. Earlier non-finished
    runs of the trial_id are tagged ``superseded=true`` after the new run is complete.
    ``runs``: the sweep's trial runs as the caller keeps them (:class:`TrialRuns`), updated here;
    without it the trial's runs are searched for.

    Requests: the run with its tags, its params and metrics in ``log_batch`` requests (:func:`log_batches`),
    one PUT per file, the end status; one more per earlier attempt it supersedes.
    """
    p = entry.payload
    trial_id = p["trial_id"]
    if runs is None:
        runs = TrialRuns(_search_all(client, experiment_id, f"tags.trial_id = '{trial_id}' and {_TRIAL_KIND}"))
    existing = runs.of(trial_id)
    for r in existing:
        if r.upload_id == p["upload_id"] and r.status in ("FINISHED", "FAILED"):
            log.info("trial %s: this result is already uploaded as run %s", trial_id, r.run_id)
            return None
        if r.status == "FINISHED":
            log.warning("trial %s already has a FINISHED run %s; not logging it again", trial_id, r.run_id)
            return None
    tags = {**p["tags"], "mlflow.parentRunId": parent_run_id, "upload_id": p["upload_id"],
            "superseded": "false", "attempt": str(len(existing) + 1)}
    run = client.create_run(experiment_id, start_time=_ms(p.get("started_at")), tags=tags, run_name=p["run_name"])
    run_id = run.info.run_id
    runs.record(trial_id, RunRef(run_id, "RUNNING", p["upload_id"], False))  # a half upload is an attempt too
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in p["metrics"].items()]
    metrics += _series_metrics(entry.file("telemetry.parquet"), p.get("started_at") or 0.0, max_series_points,
                               max_series_total)
    for params, batch, _ in log_batches([Param(k, v) for k, v in p["params"].items()], metrics):
        client.log_batch(run_id, metrics=batch, params=params)
    repo = _artifact_repo(client, run.info.artifact_uri)
    for name in ("records.parquet", "telemetry.parquet", "result.json"):
        f = entry.file(name)
        if f is not None:
            repo.log_artifact(str(f))
    arts = entry.file("artifacts")
    if arts is not None and any(arts.iterdir()):
        repo.log_artifacts(str(arts))
    client.set_terminated(run_id, p["status"], end_time=_ms(p.get("ended_at")))
    runs.finish(trial_id, run_id, p["status"])
    for r in existing:
        if r.superseded:
            continue  # already points at the attempt that replaced it
        client.log_batch(r.run_id, tags=[RunTag("superseded", "true"), RunTag("superseded_by", run_id)])
        if r.status == "RUNNING":  # an upload that died half-way
            client.set_terminated(r.run_id, "KILLED")
        runs.supersede(trial_id, r.run_id, "KILLED" if r.status == "RUNNING" else None)
    log.info("trial %s logged as run %s (%s)", trial_id, run_id, p["status"])
    return run_id


class UploadPool:
    """Uploads outbox entries on up to ``threads`` threads at once; see the module docstring for the policy.

    ``upload(path)`` uploads one entry and removes it from the outbox (it raises when MLflow did not take it), and
    says whether it made a new run (False: MLflow had the result already);
    ``reachable()`` says whether MLflow answers. The pool holds the entries' paths only: the results are on disk.
    Oldest first (by the entries' names), one trial's entries one after another, each entry once. An upload
    that raises while ``reachable()`` is False puts the entry back and the pool on hold; a thread of its own
    checks ``reachable()`` every ``retry_s`` and goes on once it is True. One that raises while MLflow answers
    is tried again, up to ``tries`` times in all; then the entry stays in the outbox for a later run or sync
    (logged). Threads are started as entries come and end when none is left, so an idle pool holds none.
    """

    def __init__(self, upload: Callable[[Path], object], *, threads: int = 4,
                 reachable: Callable[[], bool] = lambda: True, retry_s: float = 2.0, tries: int = 3,
                 name: str = "mlflow-upload", describe: str = "MLflow") -> None:
        self._upload = upload
        self.threads = max(1, threads)
        self._reachable = reachable
        self.retry_s = retry_s
        self.tries = tries
        self.name = name
        self.describe = describe  # "MLflow at <uri>", for the warnings
        self._cond = threading.Condition()
        self._heap: list[tuple[str, Path]] = []  # waiting entries by name: the oldest on top
        self._waiting: dict[Path, str] = {}  # waiting entry -> its trial id
        self._busy: dict[Path, str] = {}  # being uploaded -> its trial id
        self._failures: dict[Path, int] = {}  # failed uploads of an entry while MLflow answered
        self.given_up: dict[Path, str] = {}  # entry -> why it stays in the outbox
        self._workers = 0
        self._seq = 0
        self.down: str | None = None  # why the pool is on hold (MLflow does not answer); None while it uploads
        self._probing = False
        self._closed = False
        self.done = 0  # entries out of the outbox: taken by MLflow, or found there already
        self.uploaded = 0  # of them, those that made a new run

    # -- what callers use
    def add(self, path: Path, trial_id: str) -> None:
        """Queue an entry (once: an entry already queued, being uploaded or given up is not queued again)."""
        with self._cond:
            if path in self._waiting or path in self._busy or path in self.given_up:
                return
            self._waiting[path] = trial_id
            heapq.heappush(self._heap, (path.name, path))
            self._spawn()

    def waiting(self) -> int:
        """Entries queued or being uploaded."""
        with self._cond:
            return len(self._waiting) + len(self._busy)

    def wait(self, timeout: float | None = None) -> str | None:
        """Wait until every queued entry is up: None. Else why not, as soon as no upload is in flight and none
        can start (the pool is on hold, or closed), or when ``timeout`` runs out; entries given up are named."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy or (self._waiting and self.down is None and not self._closed):
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return f"{len(self._waiting) + len(self._busy)} result(s) still uploading after {timeout:.0f} s"
                self._cond.wait(left)
            if self._waiting:
                return f"{self.describe} {self.down}" if self.down else "the uploads were stopped"
            if self.given_up:
                return f"{len(self.given_up)} result(s) refused: {next(iter(self.given_up.values()))}"
            return None

    def close(self, wait_s: float = 0.0) -> None:
        """Start no more uploads; what is queued stays in the outbox. Those in flight finish: ``wait_s`` is how long
        to wait for them (an upload that fails gives its entry back to the outbox meanwhile)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._busy and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(min(left, 0.5))

    # -- inside
    def _spawn(self) -> None:
        """Under the lock: a thread for each queued entry, up to ``threads`` (none while on hold or closed)."""
        if self.down is not None or self._closed:
            return
        while self._workers < self.threads and self._workers - len(self._busy) < len(self._waiting):
            self._workers += 1
            self._seq += 1
            threading.Thread(target=self._work, name=f"{self.name}-{self._seq}", daemon=True).start()

    def _take(self) -> tuple[Path, str] | None:
        """Under the lock: the oldest waiting entry whose trial has no upload in flight, marked busy."""
        if self.down is not None or self._closed:
            return None
        busy_trials = set(self._busy.values())
        held: list[tuple[str, Path]] = []
        found = None
        while self._heap:
            key, path = heapq.heappop(self._heap)
            if path not in self._waiting:
                continue  # a stale heap slot
            if self._waiting[path] in busy_trials:
                held.append((key, path))  # its trial's earlier entry is being uploaded: after that one
                continue
            found = (path, self._waiting.pop(path))
            break
        for item in held:
            heapq.heappush(self._heap, item)
        if found is not None:
            self._busy[found[0]] = found[1]
        return found

    def _work(self) -> None:
        while True:
            with self._cond:
                item = self._take()
                if item is None:
                    self._workers -= 1
                    self._cond.notify_all()
                    return
            path, trial_id = item
            error: Exception | None = None
            made = False
            try:
                made = bool(self._upload(path))
            except Exception as exc:  # noqa: BLE001 (any trouble: the entry stays in the outbox)
                error = exc
            answers = error is None or self._reachable()
            with self._cond:
                del self._busy[path]
                if error is None:
                    self.done += 1
                    self.uploaded += made
                    self._failures.pop(path, None)
                elif not answers:
                    self._requeue(path, trial_id)
                    self._hold(f"is unreachable ({type(error).__name__})")
                else:
                    tries = self._failures[path] = self._failures.get(path, 0) + 1
                    if tries < self.tries:
                        self._requeue(path, trial_id)
                    else:
                        self.given_up[path] = f"{type(error).__name__}: {error}"
                        log.warning("%s refused the result in %s %d times (%s: %s); it stays in the outbox for "
                                    "`orchestrator sync`", self.describe, path, tries, type(error).__name__, error)
                self._cond.notify_all()

    def _requeue(self, path: Path, trial_id: str) -> None:
        self._waiting[path] = trial_id
        heapq.heappush(self._heap, (path.name, path))

    def _hold(self, why: str) -> None:
        """Under the lock: no new uploads until MLflow answers again (one thread checks every ``retry_s``)."""
        if self.down is None:
            log.warning("%s %s: %d result(s) wait in the outbox; they go up once it answers again, or with "
                        "`orchestrator sync`", self.describe, why, len(self._waiting) + len(self._busy))
        self.down = why
        if not self._probing and not self._closed:
            self._probing = True
            threading.Thread(target=self._probe, name=f"{self.name}-probe", daemon=True).start()

    def _probe(self) -> None:
        while True:
            with self._cond:
                if self._closed or self.down is None:
                    self._probing = False
                    return
                self._cond.wait(self.retry_s)  # a nudge() (a new result) asks sooner
                if self._closed or self.down is None:
                    self._probing = False
                    return
            if self._reachable():
                self.resume()

    def nudge(self) -> None:
        """While on hold: ask MLflow again now rather than after ``retry_s``."""
        with self._cond:
            self._cond.notify_all()

    def resume(self) -> None:
        """MLflow answers again: uploads go on."""
        with self._cond:
            if self.down is None:
                return
            log.warning("%s answers again: uploading the %d result(s) waiting in the outbox", self.describe,
                        len(self._waiting))
            self.down = None
            self._spawn()
            self._cond.notify_all()


def upload_entry(client: MlflowClient, experiment_id: str, parent_run_id: str, path: Path, *,
                 max_series_points: int = 1000, max_series_total: int | None = MAX_SERIES_TOTAL,
                 runs: TrialRuns | None = None, claims: AbstractContextManager[Any] | None = None) -> bool:
    """One outbox entry up (:func:`upload_trial`) and out of the outbox; False when it made no run (gone, or MLflow
    had it already). The entry is claimed first (``outbox.claim``), so no other uploader takes it meanwhile; if the
    upload raises, it is given back and waits again. ``claims``: a lock held while the entry is renamed, so a
    reader holding it sees every entry under one name (:meth:`MlflowTracker.finished_trial_ids`)."""
    claims = claims or contextlib.nullcontext()
    with claims:
        claimed = outbox.claim(path)
    if claimed is None:
        return False  # another uploader took it
    try:
        entry = outbox.load(claimed)
        run_id = None if entry is None else upload_trial(
            client, experiment_id, parent_run_id, entry, max_series_points=max_series_points,
            max_series_total=max_series_total, runs=runs)
    except BaseException:
        with claims:
            outbox.unclaim(claimed)
        raise
    outbox.discard(claimed)
    return run_id is not None


def drain(client: MlflowClient, experiment_id: str, parent_run_id: str, outbox_dir: Path, sweep: str, *,
          max_series_points: int = 1000, max_series_total: int | None = MAX_SERIES_TOTAL, threads: int = 1,
          runs: TrialRuns | None = None) -> int:
    """Upload each pending entry of ``sweep`` (:func:`upload_trial`, on ``threads`` threads at once: an
    :class:`UploadPool`), removing each once MLflow has it. Returns how many were taken (an entry already on the
    server is removed without a second run). Raises when any could not be uploaded: those entries stay."""
    runs = runs if runs is not None else TrialRuns.load(client, experiment_id, sweep)
    uri = client._tracking_client.tracking_uri

    def upload(path: Path) -> bool:
        return upload_entry(client, experiment_id, parent_run_id, path, max_series_points=max_series_points,
                            max_series_total=max_series_total, runs=runs)

    pool = UploadPool(upload, threads=threads, reachable=lambda: mlflow_server_ok(uri), describe=f"MLflow at {uri}")
    try:
        for path in outbox.entry_paths(outbox_dir, sweep):
            pool.add(path, outbox.trial_id_of(path))
        trouble = pool.wait()
    finally:
        pool.close()
    if trouble is not None:
        raise RuntimeError(trouble)
    return pool.uploaded


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
    """The MLflow callback. See the module docstring for the layout, the resume policy and the uploads.

    ``uploaders``: upload threads at once (one where the tracking URI is not a server); ``retry_s``: how often
    an unreachable server is asked again while results wait.
    """

    def __init__(self, tracking_uri: str, *, experiment: str | None = None, outbox_dir: Path,
                 spec_path: Path | None = None, client: MlflowClient | None = None,
                 health_timeout_s: float = 2.0, max_series_points: int = 1000,
                 max_series_total: int | None = MAX_SERIES_TOTAL, uploaders: int = 8,
                 retry_s: float = 2.0) -> None:
        _client_defaults()
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.outbox_dir = Path(outbox_dir)
        self.spec_path = Path(spec_path) if spec_path else None
        self.client = client or MlflowClient(tracking_uri)
        self.health_timeout_s = health_timeout_s
        self.max_series_points = max_series_points
        self.max_series_total = max_series_total
        server = tracking_uri.startswith(("http://", "https://"))
        self.uploaders = max(1, uploaders) if server else 1  # a local store (sqlite file) takes one writer
        self.retry_s = retry_s
        # _lock: attaching to MLflow (the parent run, the sweep's trial runs) and the parent's own writes; an
        # upload may hold it for a round trip. _state: what the lanes touch (the sweep payload, results persisted
        # and not yet handed on); never held over I/O to MLflow, so persist_result never waits for MLflow.
        self._lock = threading.Lock()
        self._state = threading.Lock()
        self._claims = threading.Lock()  # held while an upload renames its entry (see finished_trial_ids)
        self._sweep: dict[str, Any] | None = None
        self._sweep_on_disk: int | None = None  # id() of the sweep payload last written to sweep.json
        self._exp_id: str | None = None
        self._parent_id: str | None = None
        self._runs: TrialRuns | None = None
        self._persisted: dict[int, tuple[TrialResult, Path]] = {}  # id(result) -> (result, its outbox entry)
        self._pool: UploadPool | None = None
        self._git = git_commit()

    # -- helpers -------------------------------------------------------------------------
    def _up(self) -> bool:
        return mlflow_server_ok(self.tracking_uri, self.health_timeout_s)

    def _experiment_name(self, sweep: str) -> str:
        return self.experiment or sweep

    def _attach(self, reopen: bool) -> tuple[str, str]:
        """Under ``_lock``: the experiment and parent run (re-attached or created), and the sweep's trial runs."""
        sweep = self._sweep
        assert sweep is not None, "on_sweep_start was not called"
        if self._parent_id is None or self._exp_id is None:
            self._exp_id, self._parent_id = ensure_parent(self.client, sweep, reopen=reopen)
            self._runs = None
        if self._runs is None:
            self._runs = TrialRuns.load(self.client, self._exp_id, sweep["sweep"])
        return self._exp_id, self._parent_id

    def _sweep_for(self, trial: TrialSpec) -> dict[str, Any]:
        with self._state:
            if self._sweep is None:  # a result without on_sweep_start: a parent with what we know
                self._sweep = {"version": outbox.FORMAT_VERSION, "sweep": trial.sweep,
                               "experiment": self._experiment_name(trial.sweep),
                               "tags": {"sweep": trial.sweep, "orchestrator.kind": "sweep"},
                               "params": {}, "plan": [], "spec": {}, "spec_yaml": None}
            return self._sweep

    def _put(self, trial: TrialSpec, result: TrialResult) -> Path:
        """The result into the outbox (its sweep's ``sweep.json`` first, written once per sweep payload)."""
        sweep = self._sweep_for(trial)
        with self._state:
            fresh = self._sweep_on_disk != id(sweep) or not outbox.has_sweep(self.outbox_dir, sweep["sweep"])
            if fresh:
                outbox.write_sweep(self.outbox_dir, sweep)  # a local file, once: lanes wait only for this
                self._sweep_on_disk = id(sweep)
        entry = outbox.put(self.outbox_dir, None, trial, result, git_commit=self._git)
        if result.artifacts_dir and not Path(result.artifacts_dir).is_dir():
            log.warning("trial %s: artifacts folder %s not found", trial.trial_id, result.artifacts_dir)
        return entry.path

    def _uploads(self) -> UploadPool:
        with self._state:
            if self._pool is None:
                self._pool = UploadPool(self._upload, threads=self.uploaders, reachable=self._up,
                                        retry_s=self.retry_s, describe=f"MLflow at {self.tracking_uri}")
            return self._pool

    def _upload(self, path: Path) -> bool:
        """One entry to MLflow, then out of the outbox (an upload thread of the pool); False when it made no run."""
        with self._lock:
            exp_id, parent = self._attach(reopen=True)
            runs = self._runs
        return upload_entry(self.client, exp_id, parent, path, max_series_points=self.max_series_points,
                            max_series_total=self.max_series_total, runs=runs, claims=self._claims)

    def _queue_backlog(self, sweep: str) -> int:
        """Every entry of ``sweep`` in the outbox into the pool (those of an earlier run, an outage, and those a
        driver that died had claimed for upload); how many."""
        with self._claims:
            outbox.reclaim(self.outbox_dir, sweep)
        paths = outbox.entry_paths(self.outbox_dir, sweep)
        if paths:
            pool = self._uploads()
            for path in paths:
                pool.add(path, outbox.trial_id_of(path))
        return len(paths)

    def _close_pool(self, wait_s: float = 0.0) -> None:
        with self._state:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(wait_s)

    # -- callbacks -----------------------------------------------------------------------
    def _set_sweep(self, plan: SweepPlan) -> None:
        spec_yaml = self.spec_path.read_text() if self.spec_path and self.spec_path.exists() else None
        sweep = outbox.sweep_payload(plan, experiment=self._experiment_name(plan.spec.name),
                                     git_commit=self._git, spec_yaml=spec_yaml)
        with self._state:
            self._sweep = sweep
        self._exp_id = self._parent_id = None
        self._runs = None

    def on_sweep_start(self, plan: SweepPlan) -> None:
        self._close_pool()  # a pool of an earlier sweep of this tracker: its entries stay on disk
        with self._lock:
            self._set_sweep(plan)
            if not self._up():
                log.warning("MLflow at %s is unreachable: results of sweep %s go to the outbox %s; "
                            "upload them later with `orchestrator sync`", self.tracking_uri, plan.spec.name,
                            self.outbox_dir)
            else:
                try:
                    self._attach(reopen=True)
                except Exception as exc:  # noqa: BLE001 (tracking trouble never stops a sweep)
                    log.warning("MLflow parent run for sweep %s not created yet (%s); will retry per trial",
                                plan.spec.name, exc)
        left = self._queue_backlog(plan.spec.name)
        if left:
            log.info("sweep %s: %d result(s) of an earlier run wait in the outbox: uploading them", plan.spec.name,
                     left)

    def on_trial_start(self, trial: TrialSpec) -> None:
        # No I/O: the child run is created in one go once the trial has ended.
        log.debug("trial %s (%s) started", trial.trial_id, outbox.run_name(trial))

    def persist_result(self, trial: TrialSpec, result: TrialResult) -> None:
        """In the lane's thread: the result into the outbox, on disk, before the controller queues it to the
        writer. Touches no lock an upload holds and nothing of MLflow; ``on_trial_result`` hands it on."""
        path = self._put(trial, result)
        with self._state:
            self._persisted[id(result)] = (result, path)

    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None:
        """The result's outbox entry to the upload pool (put there first if ``persist_result`` was not called for
        it); returns without waiting for MLflow."""
        with self._state:
            kept = self._persisted.pop(id(result), None)
        path = kept[1] if kept is not None and kept[0] is result else self._put(trial, result)
        pool = self._uploads()
        pool.add(path, trial.trial_id)
        if pool.down is not None:
            pool.nudge()
            log.warning("MLflow at %s %s; trial %s saved to the outbox %s; it goes up once MLflow answers, or "
                        "with `orchestrator sync`", self.tracking_uri, pool.down, trial.trial_id, path)

    def flush(self, timeout: float | None = None) -> str | None:
        """Wait for the queued uploads: None once every one is up, else why not (MLflow unreachable, a result
        refused, ``timeout`` seconds passed). The results that did not go up stay in the outbox."""
        with self._state:
            pool = self._pool
        if pool is None:
            return None
        if pool.down is not None and self._up():
            pool.resume()  # back before the pool's own check came round
        return pool.wait(timeout)

    def close(self, wait_s: float = 10.0) -> None:
        """Stop uploading: what is queued stays in the outbox for a later run or sync. Waits up to ``wait_s`` for the
        uploads in flight (one that fails gives its entry back to the outbox)."""
        self._close_pool(wait_s)

    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None:
        sweep = plan.spec.name
        if self._sweep is None or self._sweep["sweep"] != sweep or not self._sweep["plan"]:
            with self._lock:
                self._set_sweep(plan)
        assert self._sweep is not None  # set above
        if not self._up():
            trouble: str | None = "is unreachable"
        else:
            self._queue_backlog(sweep)  # anything persisted whose on_trial_result never came
            waited = self.flush()
            trouble = None if waited is None else f"did not take every result ({waited})"
        self._close_pool(wait_s=5.0)  # uploads in flight: done, or their entries back in the outbox
        if trouble is None and not outbox.entry_paths(self.outbox_dir, sweep, claimed=True):
            try:
                with self._lock:
                    exp_id, parent = self._attach(reopen=False)
                    status = _finish_parent(self.client, exp_id, parent, sweep, [t.trial_id for t in plan.trials])
                if status != "FINISHED":
                    log.warning("sweep %s ended with trials left: its MLflow run is %s", sweep, status)
                outbox.clear_sweep_end(self.outbox_dir, sweep)
                outbox.remove_sweep_if_empty(self.outbox_dir, sweep)
                return
            except Exception as exc:  # noqa: BLE001
                log.warning("MLflow: could not close sweep %s: %s", sweep, exc)
        outbox.write_sweep(self.outbox_dir, self._sweep)
        outbox.write_sweep_end(self.outbox_dir, sweep, {"ended_at": time.time(), "results": len(results)})
        log.warning("MLflow at %s %s: sweep %s ended with %d result(s) still in the outbox %s; run "
                    "`orchestrator sync`", self.tracking_uri, trouble or "is unreachable", sweep,
                    len(outbox.entry_paths(self.outbox_dir, sweep, claimed=True)), self.outbox_dir)

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
        # The outbox is read before MLflow is asked, with no upload renaming an entry meanwhile (the claims lock):
        # an entry is either read here (waiting, or being uploaded by this process) or was removed after its run
        # ended on the server, where the search below finds it. So a trial that is being uploaded is never missed.
        with self._claims:
            outbox.reclaim(self.outbox_dir, sweep)  # what a driver that died was uploading waits again
            local = {e.trial_id for e in outbox.pending(self.outbox_dir, sweep, claimed=True)
                     if e.payload["status"] == "FINISHED"}
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
                max_series_points: int = 1000, max_series_total: int | None = MAX_SERIES_TOTAL,
                uploaders: int = 8) -> tuple[int, int]:
    """Upload every outbox entry; returns (uploaded, remaining).

    Parents are re-attached (or created from ``sweep.json``); a trial already FINISHED on the
    server is dropped, never duplicated. Each folder is removed only after its upload
    succeeded; a sweep that ended while offline is closed once all its trials are up.
    ``uploaders`` entries go up at once (one where the tracking URI is not a server).
    """
    _client_defaults()
    outbox_dir = Path(outbox_dir)
    threads = uploaders if tracking_uri.startswith(("http://", "https://")) else 1
    if not mlflow_server_ok(tracking_uri):
        left = len(outbox.entry_paths(outbox_dir, claimed=True))
        log.warning("MLflow at %s is unreachable; %d outbox entries left in %s", tracking_uri, left, outbox_dir)
        return 0, left
    client = client or MlflowClient(tracking_uri)
    uploaded = 0
    outbox.reclaim(outbox_dir)  # entries a driver that died was uploading
    for sweep in outbox.sweeps(outbox_dir):
        info = outbox.read_sweep(outbox_dir, sweep)
        assert info is not None
        try:
            exp_id, parent = ensure_parent(client, info, reopen=False)
            uploaded += drain(client, exp_id, parent, outbox_dir, sweep, max_series_points=max_series_points,
                              max_series_total=max_series_total,
                              threads=threads)
            if outbox.read_sweep_end(outbox_dir, sweep) is not None:
                _finish_parent(client, exp_id, parent, sweep, _planned(info))
                outbox.clear_sweep_end(outbox_dir, sweep)
            outbox.remove_sweep_if_empty(outbox_dir, sweep)
        except Exception as exc:  # noqa: BLE001 (keep the rest for the next sync)
            log.warning("sync of sweep %s stopped: %s: %s", sweep, type(exc).__name__, exc)
    remaining = len(outbox.entry_paths(outbox_dir, claimed=True))  # those being uploaded elsewhere are not up yet
    return uploaded, remaining


__all__ = ["Callback", "CallbackList", "MlflowTracker", "RunRef", "TrialRuns", "UploadPool", "drain", "ensure_parent",
           "git_commit", "log_batches", "log_report", "mlflow_server_ok", "parent_run", "sync_outbox", "trial_runs",
           "upload_entry", "upload_trial"]
