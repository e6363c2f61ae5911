"""How many trial results per second a tracking server takes, sqlite against PostgreSQL.

The write is the product's own: each writer is an :class:`~orchestrator.observe.tracking.MlflowTracker`
(one per sweep driver) and every result goes through ``on_trial_result``, which builds the payload
(``outbox.trial_payload``), stages it (``outbox.stage_trial``: result.json, records.parquet, telemetry.parquet,
the artifacts folder) and uploads it (``tracking.upload_trial``): a child run, its params and metrics in
batches, the ``ts/`` series, the files, the end status. The payload is a real trial's: ``--trial`` names a
trial folder as the product stores it in MLflow (``<home>/mlflow/artifacts/<exp>/<run>/artifacts``: its
``result.json``, ``records.parquet``, ``telemetry.parquet`` and the other files are turned back into the
TrialSpec and TrialResult the executor returned); by default the newest under ``$ORCH_HOME`` (``.orchestrator``,
what ``make smoke`` leaves). Each upload is a new trial (the repeat index and the sweep change, so does the
trial id).

For each server worker count it starts a real ``mlflow server`` (``orchestrator.infra.local_servers.mlflow_server``)
per backend, both at once: ``sqlite`` in the server's folder, ``postgres`` on a cluster of its own started with
``mlflow/postgres.sh`` on 127.0.0.1; each backend keeps one store for the whole run. For each writer count and
repeat it runs a cell on each backend in turn (the order flips every repeat), each cell that many writer
processes at once, each its own sweep, each first uploading one untimed result (its experiment and parent
run), then ``--trials`` timed ones. Throughput: every timed upload / (last end - first start). A result the
server refused lands in the writer's outbox, as in the product: counted as failed. At the end of a cell the
server is asked how many child runs it holds: it must be every upload.

    python benchmarks/mlflow_backends.py [--trial DIR] [--backends sqlite,postgres] [--workers 2,4]
        [--writers 1,4] [--trials 15] [--repeats 2] [--md out.md] [--csv out.csv]

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


def newest_trial(home: Path) -> Path:
    found = sorted((home / "mlflow" / "artifacts").glob("*/*/artifacts/result.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"no trial folder under {home}/mlflow/artifacts: run `make smoke` first, or pass --trial DIR")
    return found[-1].parent


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


def _writer(uri: str, folder: str, scratch: str, sweep: str, n: int, go: Any, out: Any) -> None:
    """One sweep driver: a tracker, one untimed upload (experiment, parent), then ``n`` timed ones."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    payload = load_payload(Path(folder), Path(scratch))
    box = Path(scratch) / "outbox"
    tracker = MlflowTracker(uri, outbox_dir=box)
    tracker.on_trial_result(*payload.nth(sweep, 0))
    go.wait()
    times = []
    for i in range(1, n + 1):
        t0 = time.monotonic()
        tracker.on_trial_result(*payload.nth(sweep, i))
        times.append((t0, time.monotonic()))
    out.put({"sweep": sweep, "times": times, "failed": len(outbox.pending(box))})


def cell(uri: str, folder: Path, scratch: Path, tag: str, writers: int, n: int) -> dict[str, Any]:
    """``writers`` processes at once against the server at ``uri``; the cell's figures."""
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = []
    for w in range(writers):
        d = scratch / f"{tag}-w{w}"
        d.mkdir(parents=True)
        procs.append(ctx.Process(target=_writer, args=(uri, str(folder), str(d), f"bench-{tag}-w{w}", n, go, out),
                                 daemon=True))
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
        go.set()
        results = [out.get(timeout=1800) for _ in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=60)
    spans = [t for r in results for t in r["times"]]
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    lat = sorted(e - s for s, e in spans)
    stored = sum(_children(client, r["sweep"]) for r in results)
    return {"uploads": len(spans), "failed": sum(r["failed"] for r in results), "wall_s": round(wall, 2),
            "trials_per_s": round(len(spans) / wall, 2), "upload_p50_s": round(statistics.median(lat), 3),
            "upload_max_s": round(lat[-1], 3), "runs_stored": stored, "runs_expected": writers * (n + 1)}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trial", type=Path, help="a stored trial folder (default: the newest under $ORCH_HOME)")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--workers", default="2,4", help="mlflow server worker processes")
    ap.add_argument("--writers", default="1,4", help="writer processes at once (sweep drivers)")
    ap.add_argument("--trials", type=int, default=15, help="timed uploads per writer")
    ap.add_argument("--repeats", type=int, default=2, help="each cell this many times, the backends alternating")
    ap.add_argument("--md", type=Path)
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # our own servers, never a user's
    backends = args.backends.split(",")
    bad = set(backends) - {"sqlite", "postgres"}
    if bad:
        raise SystemExit(f"--backends: unknown {sorted(bad)} (sqlite, postgres)")
    folder = (args.trial or newest_trial(Path(os.environ.get("ORCH_HOME", ".orchestrator")))).resolve()
    workers = [int(w) for w in args.workers.split(",")]
    writers = [int(w) for w in args.writers.split(",")]
    # A stop (Ctrl-C, kill) unwinds: the servers, PostgreSQL and the temp folder are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base = reachable_dir("mlflow-bench-")
    rows: list[dict[str, Any]] = []
    held: dict[str, Any] = {}
    try:
        payload = load_payload(folder, base / "probe")
        with contextlib.ExitStack() as stack:
            pg_uri = stack.enter_context(postgres(base / "postgres")) if "postgres" in backends else None
            for nw in workers:
                # Both backends' servers up at once, their cells alternating (ABBA over the repeats): load that
                # others put on the machine falls on both alike.
                servers, up = {}, {}
                with contextlib.ExitStack() as running:
                    for backend in backends:
                        t0 = time.monotonic()
                        uri = pg_uri if backend == "postgres" else None
                        servers[backend] = running.enter_context(mlflow_server(
                            base / backend, port=free_port(), backend_uri=uri, workers=nw, timeout_s=300)).uri
                        up[backend] = round(time.monotonic() - t0, 1)
                    for nwr in writers:
                        for rep in range(args.repeats):
                            for backend in (backends if rep % 2 == 0 else backends[::-1]):
                                tag = f"{backend}-s{nw}-c{nwr}-r{rep}"
                                row = {"backend": backend, "server_workers": nw, "writers": nwr, "repeat": rep,
                                       "trials_per_writer": args.trials,
                                       **cell(servers[backend], folder, base / "w", tag, nwr, args.trials),
                                       "server_start_s": up[backend]}
                                print(json.dumps(row), flush=True)
                                rows.append(row)
                                if backend not in held:
                                    held[backend] = shape(payload, servers[backend], f"bench-{tag}-w0")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"payload: {folder} {json.dumps(held)}")
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
    """One line per backend, server workers and writers: trial results per second (median of the repeats, and
    each repeat), upload time p50 and max over every repeat, failed uploads, runs stored against expected."""
    cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["backend"], r["server_workers"], r["writers"]), []).append(r)
    lines = ["| backend | server workers | writers | trials/s (median) | trials/s, each repeat | upload p50 s "
             "| upload max s | failed | runs stored / expected |", "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for (backend, nw, nwr), rs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        rates = [r["trials_per_s"] for r in rs]
        lines.append(f"| {backend} | {nw} | {nwr} | {statistics.median(rates):.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in rates)} | {statistics.median(r['upload_p50_s'] for r in rs):.2f} | "
                     f"{max(r['upload_max_s'] for r in rs):.2f} | {sum(r['failed'] for r in rs)} | "
                     f"{sum(r['runs_stored'] for r in rs)} / {sum(r['runs_expected'] for r in rs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
