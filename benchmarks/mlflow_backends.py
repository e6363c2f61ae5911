"""How many trial results per second a tracking server takes, sqlite against PostgreSQL.

The write is the product's own: each writer is an :class:`~orchestrator.observe.tracking.MlflowTracker`
(one per sweep driver) and every result goes through it as the controller hands it over: ``persist_result``
(the lane's: the payload, ``outbox.trial_payload``, into the outbox: result.json, records.parquet,
telemetry.parquet, the artifacts folder), then ``on_trial_result`` (the writer thread's: the entry to the
tracker's upload pool, ``--uploaders`` threads, each upload ``tracking.upload_trial``: a child run, its params
and metrics in batches, the ``ts/`` series, the files, the end status). A tracker without ``persist_result``
(the code before it, 7f02a5a) gets ``on_trial_result`` alone, which there stages and uploads the result itself.
A writer's results are done when ``flush()`` returns (when the tracker has one). The payload is a real trial's:
``--trial`` names a trial folder as the product stores it in MLflow (``<home>/mlflow/artifacts/<exp>/<run>/
artifacts``: its ``result.json``, ``records.parquet``, ``telemetry.parquet`` and the other files are turned back
into the TrialSpec and TrialResult the executor returned); by default the H200 trial :func:`h200_trial` builds
(``--make-trial DIR`` writes that folder, for a run of older code with ``--trial DIR``). Each upload is a new
trial (the repeat index and the sweep change, so does the trial id).

For each server worker count it starts a real ``mlflow server`` (``orchestrator.infra.local_servers.mlflow_server``)
per backend, both at once: ``sqlite`` in the server's folder, ``postgres`` on a cluster of its own started with
``mlflow/postgres.sh`` on 127.0.0.1; each backend keeps one store for the whole run. For each writer count and
repeat it runs a cell on each backend in turn (the order flips every repeat), each cell that many writer
processes at once, each its own sweep, each first uploading one untimed result (its experiment and parent
run), then ``--trials`` timed ones. Throughput: every timed upload / (last end - first start). A result the
server refused lands in the writer's outbox, as in the product: counted as failed. At the end of a cell the
server is asked how many child runs it holds: it must be every upload.

    python benchmarks/mlflow_backends.py [--trial DIR] [--backends sqlite,postgres] [--workers 2,4]
        [--writers 1,4] [--uploaders 4] [--trials 15] [--repeats 2] [--max-series-total 400|none]
        [--md out.md] [--csv out.csv]
    python benchmarks/mlflow_backends.py --make-trial DIR     # the H200 trial folder, then exit
    python benchmarks/mlflow_backends.py --requests 12 --workers 1   # what each request of an upload costs

Everything lives in one temp folder, removed at the end; the servers and PostgreSQL are stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from mlflow import MlflowClient
from orchestrator.infra.local_servers import free_port, mlflow_server
from orchestrator.observe import outbox
from orchestrator.observe.tracking import MlflowTracker
from orchestrator.values.results import TrialResult, TrialStatus
from orchestrator.values.trial import TrialSpec
from workloads.records import frame_to_records

ROOT = Path(__file__).resolve().parents[1]
PG_SCRIPT = ROOT / "mlflow" / "postgres.sh"
STORED = ("result.json", "records.parquet", "telemetry.parquet")  # what upload_trial writes beside the artifacts
# The H200 knee search's committed results: its spec, its trials' metrics and every request of its windows.
H200_SPEC = ROOT / "sweeps" / "h200-knee-search.yaml"
H200_TRIALS = ROOT / "benchmarks" / "results" / "h200" / "search-2" / "h200-knee-search" / "trials.csv"
H200_RECORDS = ROOT / "benchmarks" / "results" / "h200" / "search-2" / "h200-knee-search-records.parquet"
# What a trial on the H200 learnt while running (the executor's params, as the figures catalogue declares them).
H200_LEARNT = {
    "cpu_model": "INTEL(R) XEON(R) PLATINUM 8568Y+", "smt": "on", "replica_physical_cores": "2",
    "replica_numa_nodes": "0", "client_numa_nodes": "0", "gpu_numa_nodes": "0", "cpu_governor": "performance",
    "replica_cpus": "2,3", "restriction_requested": "cpuset", "restriction_mode": "cpuset",
    "restriction_fallback": "", "server_env": "OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=2-3",
    "server_stack": "vllm", "port": "8000", "vllm_version": "0.26.0",
    "vllm_command": "vllm serve /models/llama-3.1-8b --load-format dummy --max-model-len 20480 "
                    "--kv-cache-memory-bytes 68719476736 --enable-prefix-caching --port 8000 --host 127.0.0.1",
    "gpu_ids": "0", "gpu_name": "NVIDIA H200", "hostname": "h200-node-0", "node_id": "5f0c" * 14,
    "platform": "Linux-6.8.0-x86_64-with-glibc2.39", "telemetry_cpus": "1", "repinned": "true",
    "prefix_cache_reset": "ok", "client_cpus": "4,5", "client_isolated": "true", "neighbours": "0",
    "window_on_start": "false", "placement": "pack", "node_wait_s": "0.004", "pg_ready_s": "0.41",
    "replica_actor_s": "1.9", "warmup_s": "0", "startup_s": "226.4", "startup_sources": "log,stacks",
    "startup_weights": "dummy", "compile_cache": "/root/.cache/vllm/torch_compile_cache", "compile_cache_entries": "4",
    "compile_cache_load": "true", "model_page_cache": "n/a", "runq_wait_status": "ok", "stacks_status": "ok",
    "stacks_rate_hz": "50", "stacks_cpu_basis": "thread cputime", "search_reason": "bisect", "search_step": "4",
    "search_grid_cores": "1 2 3 4 6 8 12",
}


@dataclasses.dataclass(frozen=True)
class Payload:
    """A real trial, as the executor returned it: the spec, the result, and the folder of its artifacts."""

    trial: TrialSpec
    result: TrialResult
    source: Path

    def nth(self, sweep: str, i: int) -> tuple[TrialSpec, TrialResult]:
        """The same result as trial ``i`` of ``sweep``: a new trial id, so a new child run."""
        trial = self.trial.model_copy(update={"sweep": sweep, "repeat": i})
        now = time.time()
        span = self.result.ended_at - self.result.started_at
        return trial, dataclasses.replace(self.result, trial_id=trial.trial_id, started_at=now - span, ended_at=now)


def h200_trial(folder: Path) -> Path:
    """A trial folder as the product stores it in MLflow, of a real H200 trial: the 2-core window of the H200 knee
    search (``sweeps/h200-knee-search.yaml``; Llama-3.1-8B shape, 146 recorded requests), its metrics as its
    ``trials.csv`` row holds them, its requests from the committed records, what such a trial learns while running
    (:data:`H200_LEARNT`), the 21 sampled series its row names (86 samples each, between the row's mean and
    maximum), and the executor's files (``trial_spec.json``, ``verified_cores.json``, ``vllm.log``)."""
    import math

    from orchestrator.plan.expand import expand
    from orchestrator.plan.load import load_spec
    from workloads.records import frame_to_records

    plan = expand(load_spec(H200_SPEC))
    trial = next(t for t in plan.trials if t.cores == 2 and t.repeat == 0)
    rows = pd.read_csv(H200_TRIALS)
    row = rows[(rows["cores"] == 2) & (rows["repeat"] == 0)].iloc[0]
    frame = pd.read_parquet(H200_RECORDS)
    frame = frame[frame["trial_id"] == row["trial_id"]].drop(columns=[
        "trial_id", "cores", "repeat", "restriction", "api_servers", "search_step", "search_reason"])
    records = tuple(frame_to_records(frame.reset_index(drop=True)))
    factors = set(trial.factors())
    metrics = {str(k): float(v) for k, v in row.items() if k not in factors and isinstance(v, (int, float))
               and not isinstance(v, bool) and math.isfinite(v)}
    series = sorted(str(k)[:-5] for k in row.index if str(k).endswith("_mean") and f"{str(k)[:-5]}_max" in row.index)
    # The table holds the host's cores the knee search's trials sampled; one it has no figure for (another trial's
    # core) is an idle core here, 1-3% busy, its mean and maximum among the metrics as the executor's summary has them.
    for name in series:
        if not math.isfinite(row[f"{name}_mean"]):
            row[f"{name}_mean"], row[f"{name}_max"] = 1.0, 3.0
            metrics[f"{name}_mean"], metrics[f"{name}_max"] = 1.0, 3.0
    rng = __import__("random").Random(0)
    telemetry = tuple({"t": round(0.25 * i, 2), "name": name,
                       "value": row[f"{name}_mean"] + (row[f"{name}_max"] - row[f"{name}_mean"]) * rng.random()}
                      for name in series for i in range(86))
    folder.mkdir(parents=True, exist_ok=False)
    arts = folder / ".arts"
    arts.mkdir()
    (arts / "trial_spec.json").write_text(trial.model_dump_json(indent=2))
    (arts / "verified_cores.json").write_text(json.dumps({"replica": [2, 3], "client": [4, 5], "telemetry": [1]}))
    (arts / "vllm.log").write_text("".join(f"INFO 12-04 16:4{i % 10}:{i % 60:02d} [engine.py:{100 + i}] step {i}: "
                                           f"running 16 reqs, waiting 0 reqs, KV cache usage {i % 97}%\n"
                                           for i in range(405)))
    now = time.time()
    result = TrialResult(trial_id=trial.trial_id, status=TrialStatus.COMPLETED, records=records, metrics=metrics,
                         params=dict(H200_LEARNT), telemetry=telemetry, artifacts_dir=str(arts),
                         started_at=now - float(row["trial_duration_s"]), ended_at=now)
    entry = outbox.put(folder / ".outbox", outbox.sweep_payload(plan, experiment=plan.spec.name, git_commit=None,
                                                                spec_yaml=None), trial, result)
    for f in entry.path.iterdir():  # the run's artifacts, flat, as MLflow stores them
        if f.name == "artifacts":
            for g in f.iterdir():
                shutil.copy2(g, folder / g.name)
        else:
            shutil.copy2(f, folder / f.name)
    shutil.rmtree(folder / ".outbox")
    shutil.rmtree(arts)
    return folder


def load_payload(folder: Path, scratch: Path) -> Payload:
    """The TrialSpec and TrialResult behind a stored trial folder (see the module docstring)."""
    path = folder / "result.json"
    try:
        res = json.loads(path.read_text())
        trial = TrialSpec.model_validate(res["trial_spec"])
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"{path}: not a trial's result.json ({type(exc).__name__}: {exc})") from exc
    factors = outbox.trial_params(trial, {})
    learnt = {k: v for k, v in res.get("params", {}).items() if k not in factors}
    records = (frame_to_records(pd.read_parquet(folder / "records.parquet"))
               if (folder / "records.parquet").exists() else [])
    telemetry = (tuple(pd.read_parquet(folder / "telemetry.parquet").to_dict("records"))
                 if (folder / "telemetry.parquet").exists() else ())
    arts = scratch / "artifacts"
    arts.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name not in STORED:
            (shutil.copytree if f.is_dir() else shutil.copy2)(f, arts / f.name)
    result = TrialResult(
        trial_id=trial.trial_id, status=TrialStatus.COMPLETED if res.get("status") == "FINISHED" else TrialStatus.FAILED,
        records=tuple(records), metrics=dict(res.get("metrics", {})), params=learnt,
        warnings=tuple(res.get("warnings", ())), artifacts_dir=str(arts), telemetry=telemetry,
        started_at=float(res.get("started_at") or 0.0), ended_at=float(res.get("ended_at") or 0.0))
    return Payload(trial, result, folder)


def _postmaster(state: Path) -> int | None:
    """The PostgreSQL server's pid (``mlflow/postgres.sh`` keeps its data in ``<state>/data``)."""
    try:
        return int((state / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def reachable_dir(prefix: str) -> Path:
    """A temp folder; as root one that PostgreSQL's own user can reach (``mlflow/postgres.sh`` runs the server as
    another user there, and a private temp folder above it would stop that user)."""
    if os.geteuid() != 0:
        return Path(tempfile.mkdtemp(prefix=prefix))
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o711)
    return d


@contextlib.contextmanager
def postgres(state: Path) -> Iterator[str]:
    """``mlflow/postgres.sh start`` in ``state``; yields its URI; stops exactly that cluster after."""
    env = {**os.environ, "MLFLOW_PG_DIR": str(state), "MLFLOW_PG_PORT": str(free_port()),
           "MLFLOW_ENV_FILE": os.devnull}
    try:
        out = subprocess.run([str(PG_SCRIPT), "start"], env=env, check=True, capture_output=True, text=True, timeout=120)
        yield out.stdout.strip()
    finally:
        subprocess.run([str(PG_SCRIPT), "stop"], env=env, check=False, timeout=120)


def _tracker(uri: str, box: Path, uploaders: int, series_points: int, series_total: str) -> Any:
    """The writer's tracker; older code takes neither ``uploaders`` nor ``max_series_total`` (it has no such cap)."""
    import inspect

    known = inspect.signature(MlflowTracker).parameters
    extra: dict[str, Any] = {}
    if "uploaders" in known:
        extra["uploaders"] = uploaders
    if "max_series_total" in known and series_total != "default":
        extra["max_series_total"] = None if series_total == "none" else int(series_total)
    return MlflowTracker(uri, outbox_dir=box, max_series_points=series_points, **extra)


def _hand(tracker: Any, trial: TrialSpec, result: TrialResult) -> None:
    """One result, as the controller hands it over: persisted (the lane), then to ``on_trial_result`` (the writer)."""
    persist = getattr(tracker, "persist_result", None)
    if persist is not None:
        persist(trial, result)
    tracker.on_trial_result(trial, result)


def _writer(uri: str, folder: str, scratch: str, sweep: str, n: int, uploaders: int, series: tuple[int, str],
            go: Any, out: Any) -> None:
    """One sweep driver: a tracker, one untimed upload (experiment, parent), then ``n`` timed ones, as fast as they
    are handed over; done when the tracker says every one is up (``flush``; older code: when the calls return)."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    payload = load_payload(Path(folder), Path(scratch))
    box = Path(scratch) / "outbox"
    tracker = _tracker(uri, box, uploaders, *series)
    flush = getattr(tracker, "flush", lambda: None)
    _hand(tracker, *payload.nth(sweep, 0))
    flush()
    go.wait()
    cpu0 = time.process_time()  # this driver's CPU for the timed results: its share of the machine
    calls = []
    for i in range(1, n + 1):
        t0 = time.monotonic()
        _hand(tracker, *payload.nth(sweep, i))
        calls.append((t0, time.monotonic()))
    trouble = flush()
    out.put({"sweep": sweep, "calls": calls, "end": time.monotonic(), "failed": len(outbox.pending(box)),
             "trouble": trouble, "cpu_s": time.process_time() - cpu0})


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of the processes ``pids`` and their children."""
    import psutil

    from orchestrator.infra.local_servers import tree

    total = 0.0
    for p in {q for pid in pids for q in tree(pid)}:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def cell(uri: str, folder: Path, scratch: Path, tag: str, writers: int, n: int, uploaders: int,
         series: tuple[int, str] = (1000, "default"), server_pid: int | None = None,
         db_pid: int | None = None) -> dict[str, Any]:
    """``writers`` processes at once against the server at ``uri``; the cell's figures, with the CPU the server
    (``server_pid``'s tree), the database (``db_pid``'s) and the writers spent per timed result."""
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = []
    for w in range(writers):
        d = scratch / f"{tag}-w{w}"
        d.mkdir(parents=True)
        procs.append(ctx.Process(target=_writer, args=(uri, str(folder), str(d), f"bench-{tag}-w{w}", n, uploaders,
                                                       series, go, out), daemon=True))
    try:
        for p in procs:
            p.start()
        # Every writer has made its experiment and parent before the clock starts: wait for their first runs.
        client = MlflowClient(uri)
        deadline = time.monotonic() + 300
        while sum(_children(client, f"bench-{tag}-w{w}") for w in range(writers)) < writers:
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
                raise SystemExit(f"{tag}: the writers' first uploads did not arrive")
            time.sleep(0.2)
        srv0 = _cpu([server_pid]) if server_pid else 0.0
        db0 = _cpu([db_pid]) if db_pid else 0.0
        go.set()
        results = [out.get(timeout=1800) for _ in procs]
        srv = _cpu([server_pid]) - srv0 if server_pid else float("nan")
        db = _cpu([db_pid]) - db0 if db_pid else 0.0
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=60)
    spans = [t for r in results for t in r["calls"]]
    wall = max(r["end"] for r in results) - min(s for s, _ in spans)
    lat = sorted(e - s for s, e in spans)
    stored = sum(_children(client, r["sweep"]) for r in results)
    return {"uploads": len(spans), "failed": sum(r["failed"] for r in results), "wall_s": round(wall, 2),
            "trials_per_s": round(len(spans) / wall, 2), "call_p50_s": round(statistics.median(lat), 3),
            "call_max_s": round(lat[-1], 3), "runs_stored": stored, "runs_expected": writers * (n + 1),
            "trouble": "; ".join(str(r["trouble"]) for r in results if r["trouble"]),
            "server_cpu_ms": round(1000 * srv / len(spans), 1), "db_cpu_ms": round(1000 * db / len(spans), 1),
            "writer_cpu_ms": round(1000 * sum(r["cpu_s"] for r in results) / len(spans), 1)}


def _children(client: MlflowClient, sweep: str) -> int:
    exp = client.get_experiment_by_name(sweep)
    if exp is None:
        return 0
    return len(client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'trial'", max_results=5000))


def shape(payload: Payload, uri: str, sweep: str) -> dict[str, Any]:
    """What one child run holds on the server (params, metrics, tags, series points, artifact files and bytes)."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(sweep)
    assert exp is not None
    run = client.search_runs([exp.experiment_id], "tags.`orchestrator.kind` = 'trial'", max_results=1)[0]
    rid = run.info.run_id
    series = [k for k in run.data.metrics if k.startswith("ts/")]
    points = sum(len(client.get_metric_history(rid, k)) for k in series)
    files = sum(1 for f in payload.source.rglob("*") if f.is_file())
    size = sum(f.stat().st_size for f in payload.source.rglob("*") if f.is_file())
    return {"params": len(run.data.params), "metrics": len(run.data.metrics), "series": len(series),
            "series_points": points, "tags": len(run.data.tags), "files": files, "bytes": size}


def requests_cost(uri: str, folder: Path, n: int, server_pid: int | None, db_pid: int | None,
                  series_total: int | None) -> list[dict[str, Any]]:
    """What each request of one upload costs: ``n`` uploads of the payload made request by request as
    ``tracking.upload_trial`` makes them (the run, its ``log_batch`` requests, one PUT per file, the end), one at a
    time, each request timed; the medians (the first two uploads left out), and the CPU the server and the database
    spent per upload."""
    from mlflow.entities import Metric, Param

    from orchestrator.observe.tracking import _artifact_repo, _series_metrics, log_batches

    payload = json.loads((folder / "result.json").read_text())
    client = MlflowClient(uri)
    exp = client.create_experiment(f"requests-{time.time_ns()}")
    spent: dict[str, list[float]] = {}

    def timed(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        spent.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    srv0, db0 = _cpu([server_pid]) if server_pid else 0.0, _cpu([db_pid]) if db_pid else 0.0
    for i in range(n):
        tags = {**payload["tags"], "upload_id": f"u{i}", "superseded": "false", "attempt": "1"}
        run = timed("create_run (with its tags)", client.create_run, exp, tags=tags, run_name="requests")
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in payload["metrics"].items()]
        metrics += _series_metrics(folder / "telemetry.parquet", payload["started_at"], 1000, series_total)
        params = [Param(k, v) for k, v in payload["params"].items()]
        for j, (ps, ms, _) in enumerate(log_batches(params, metrics)):
            timed(f"log_batch {j + 1}: {len(ps)} params, {len(ms)} metrics", client.log_batch, run.info.run_id,
                  metrics=ms, params=ps)
        repo = _artifact_repo(client, run.info.artifact_uri)
        for f in sorted(folder.iterdir()):
            timed(f"PUT {f.name} ({f.stat().st_size:,} B)", repo.log_artifact, str(f))
        timed("update_run (the end status)", client.set_terminated, run.info.run_id, "FINISHED")
    srv = (_cpu([server_pid]) - srv0) / n if server_pid else float("nan")
    db = (_cpu([db_pid]) - db0) / n if db_pid else 0.0
    for _ in range(n):  # what the code before this one asked before each upload, with n runs in the experiment
        timed("search_runs of one trial id (before: one per upload)", client.search_runs, [exp],
              f"tags.trial_id = '{payload['trial_id']}'")
    rows = [{"request": k, "ms_median": round(1000 * statistics.median(v[2:] or v), 1)} for k, v in spent.items()]
    rows.append({"request": "server CPU per upload", "ms_median": round(1000 * srv, 1)})
    rows.append({"request": "database CPU per upload", "ms_median": round(1000 * db, 1)})
    return rows


def _series_total(arg: str) -> int | None:
    """``--max-series-total`` as a number of points: None for 'none', the tracker's default for 'default' (None
    for code that has no such cap)."""
    import orchestrator.observe.tracking as tracking

    if arg == "none":
        return None
    return getattr(tracking, "MAX_SERIES_TOTAL", None) if arg == "default" else int(arg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trial", type=Path, help="a stored trial folder (default: the H200 trial h200_trial builds)")
    ap.add_argument("--make-trial", type=Path, metavar="DIR", help="write the H200 trial folder to DIR and exit")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--workers", default="2,4", help="mlflow server worker processes")
    ap.add_argument("--writers", default="1,4", help="writer processes at once (sweep drivers)")
    ap.add_argument("--uploaders", default="4", help="upload threads of each writer's tracker (a list: a cell each)")
    ap.add_argument("--trials", type=int, default=15, help="timed uploads per writer")
    ap.add_argument("--max-series-points", type=int, default=1000,
                    help="the tracker's max_series_points (points a sampled series keeps, per series)")
    ap.add_argument("--max-series-total", default="default",
                    help="the tracker's max_series_total (points of a result's series together; 'none': no cap; "
                    "'default': the tracker's own)")
    ap.add_argument("--repeats", type=int, default=2, help="each cell this many times, the backends alternating")
    ap.add_argument("--requests", type=int, metavar="N", help="time each request of N uploads, one at a time, on "
                    "each backend with --workers' first count (instead of the cells)")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args()
    if args.make_trial:
        print(h200_trial(args.make_trial.resolve()))
        return
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # our own servers, never a user's
    backends = args.backends.split(",")
    bad = set(backends) - {"sqlite", "postgres"}
    if bad:
        raise SystemExit(f"--backends: unknown {sorted(bad)} (sqlite, postgres)")
    workers = [int(w) for w in args.workers.split(",")]
    writers = [int(w) for w in args.writers.split(",")]
    uploaders = [int(u) for u in args.uploaders.split(",")]
    # A stop (Ctrl-C, kill) unwinds: the servers, PostgreSQL and the temp folder are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base = reachable_dir("mlflow-bench-")
    rows: list[dict[str, Any]] = []
    held: dict[str, Any] = {}
    try:
        folder = args.trial.resolve() if args.trial else h200_trial(base / "h200-trial")
        payload = load_payload(folder, base / "probe")
        with contextlib.ExitStack() as stack:
            pg_uri = stack.enter_context(postgres(base / "postgres")) if "postgres" in backends else None
            for nw in workers:
                # Both backends' servers up at once, their cells alternating (ABBA over the repeats): load that
                # others put on the machine falls on both alike.
                servers, up, pids = {}, {}, {}
                with contextlib.ExitStack() as running:
                    for backend in backends:
                        t0 = time.monotonic()
                        uri = pg_uri if backend == "postgres" else None
                        srv = running.enter_context(mlflow_server(
                            base / backend, port=free_port(), backend_uri=uri, workers=nw, timeout_s=300))
                        servers[backend], pids[backend] = srv.uri, srv.proc.pid if srv.proc else None
                        up[backend] = round(time.monotonic() - t0, 1)
                    if args.requests:
                        for backend in backends:
                            db = _postmaster(base / "postgres") if backend == "postgres" else None
                            for r in requests_cost(servers[backend], folder, args.requests, pids[backend], db,
                                                   _series_total(args.max_series_total)):
                                print(json.dumps({"backend": backend, "server_workers": nw, **r}), flush=True)
                        return
                    for nwr, nup, rep in ((a, b, c) for a in writers for b in uploaders for c in range(args.repeats)):
                        for backend in (backends if rep % 2 == 0 else backends[::-1]):
                            tag = f"{backend}-s{nw}-c{nwr}-u{nup}-r{rep}"
                            load = os.getloadavg()[0]
                            row = {"backend": backend, "server_workers": nw, "writers": nwr, "uploaders": nup,
                                   "repeat": rep, "trials_per_writer": args.trials,
                                   "max_series_points": args.max_series_points,
                                   "max_series_total": args.max_series_total,
                                   **cell(servers[backend], folder, base / "w", tag, nwr, args.trials, nup,
                                          (args.max_series_points, args.max_series_total), pids[backend],
                                          _postmaster(base / "postgres") if backend == "postgres" else None),
                                   "server_start_s": up[backend], "load_1min": round(load, 1)}
                            print(json.dumps(row), flush=True)
                            rows.append(row)
                            if backend not in held:
                                held[backend] = shape(payload, servers[backend], f"bench-{tag}-w0")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"payload: {json.dumps(held)}")
    summary = table(rows)
    print(summary)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
    if args.md:
        args.md.write_text(summary + f"\n\npayload: {json.dumps(held)}\n")


def table(rows: list[dict[str, Any]]) -> str:
    """One line per backend, server workers, writers and upload threads: trial results per second (median of the
    repeats, and each repeat), the time a result's hand-over took the writer (p50 and max over every repeat), the
    CPU milliseconds a result cost the server, the database and the writer (medians), failed uploads, runs stored
    against expected."""
    cells: dict[tuple[str, int, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["backend"], r["server_workers"], r["writers"], r.get("uploaders", 1)), []).append(r)
    lines = ["| backend | server workers | writers | uploaders | trials/s (median) | trials/s, each repeat "
             "| hand-over p50 s | hand-over max s | CPU ms a result: server / database / writer | failed "
             "| runs stored / expected |",
             "|---|---:|---:|---:|---:|---|---:|---:|---|---:|---|"]
    for (backend, nw, nwr, nup), rs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][0])):
        rates = [r["trials_per_s"] for r in rs]
        cpu = " / ".join(f"{statistics.median(r.get(k, float('nan')) for r in rs):.0f}"
                         for k in ("server_cpu_ms", "db_cpu_ms", "writer_cpu_ms"))
        lines.append(f"| {backend} | {nw} | {nwr} | {nup} | {statistics.median(rates):.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in rates)} | {statistics.median(r['call_p50_s'] for r in rs):.3f} | "
                     f"{max(r['call_max_s'] for r in rs):.3f} | {cpu} | {sum(r['failed'] for r in rs)} | "
                     f"{sum(r['runs_stored'] for r in rs)} / {sum(r['runs_expected'] for r in rs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
