"""The tracking record of a sweep and its trials, and the local outbox that holds it.

What MLflow receives is first built here as plain data (no MLflow import):
:func:`sweep_payload` for the parent run and :func:`trial_payload` for a child
run (params, tags, metrics, run name). A trial's result comes in through :func:`put`
alone: written whole into the outbox before any upload (write-ahead). The tracker
(``orchestrator.observe.tracking``) then drains the outbox: it uploads each pending
entry, oldest first, and removes it once MLflow has it; a trial's own result, the
results left by an earlier outage and ``orchestrator sync`` all take that one way.

Many threads may write and read the outbox at once (each lane puts its own results while the
tracker's uploaders remove entries): every file is written under a name of its own and renamed
into place, an entry folder appears whole by one rename, and a reader skips an entry that is
removed while it looks (:func:`load` gives None).

Layout (dot-prefixed names are in-progress writes and claimed entries, ignored by readers)::

    <outbox>/<sweep>/sweep.json              # experiment, parent params/tags, plan rows, spec (+ its YAML)
    <outbox>/<sweep>/sweep_end.json          # the sweep ended while MLflow was unreachable
    <outbox>/<sweep>/trials/<ns>-<trial_id>/ # one folder per trial result, oldest first
        result.json  records.parquet  telemetry.parquet  artifacts/...
    <outbox>/<sweep>/trials/.claimed-<pid>-<ns>-<trial_id>/  # being uploaded by process <pid> (:func:`claim`)
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.values import figures
from orchestrator.values.figures import Kind
from orchestrator.values.results import TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan, TrialSpec
from workloads.records import records_to_frame

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAX_PARAM_LEN = 6000   # MLflow's limit on a param value
MAX_TAG_LEN = 8000     # and on a tag value
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def safe_key(name: str) -> str:
    """An MLflow-safe metric/param key: anything but ``[A-Za-z0-9_-. /]`` (colons too) becomes ``_``."""
    return _UNSAFE.sub("_", str(name)).strip() or "_"


def _param_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        v = " ".join(str(x) for x in v)
    elif isinstance(v, dict):
        v = json.dumps(v, sort_keys=True, separators=(",", ":"), default=str)
    s = "" if v is None else str(v)
    return s[:MAX_PARAM_LEN]


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Floats only: None, NaN, ±inf and non-numbers are dropped (MLflow cannot chart them)."""
    out = {}
    for k, v in metrics.items():
        if v is None or isinstance(v, str):
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[safe_key(k)] = f
    return out


_WARNED: set[tuple[Kind, str]] = set()
_DECLARED: set[tuple[Kind, str]] = set()  # keys the catalogue declares, as found


def check_declared(payload: Mapping[str, Any], *, sweep: bool = False) -> list[str]:
    """Keys of a payload that the catalogue (``orchestrator.values.figures``) does not declare, as ``kind key``.
    Each is logged as a warning once per process and still written: nothing measured is dropped."""
    kinds = ((Kind.SWEEP_METRIC, "metrics"), (Kind.SWEEP_PARAM, "params"), (Kind.SWEEP_TAG, "tags")) if sweep else \
        ((Kind.METRIC, "metrics"), (Kind.PARAM, "params"), (Kind.TAG, "tags"))
    out = []
    for kind, field in kinds:
        keys = [k for k in payload.get(field) or {} if (kind, k) not in _DECLARED]
        missing = figures.undeclared(keys, kind)
        _DECLARED.update((kind, k) for k in keys if k not in missing)  # each key is looked up once per process
        for key in missing:
            out.append(f"{kind.value} {key}")
            if (kind, key) not in _WARNED:
                _WARNED.add((kind, key))
                log.warning("%s %r is not declared in orchestrator.values.figures: logged anyway; declare it there",
                            kind.value, key)
    return out


def run_name(trial: TrialSpec) -> str:
    """``tiny-llama c2 agentic-short r0``; non-default factors (GPUs, variant, start) are added."""
    parts = [trial.model.name]
    if trial.gpus:
        parts.append(f"g{trial.gpus}")
    parts.append(f"c{trial.cores}")
    if trial.vllm.name != "default":
        parts.append(trial.vllm.name)
    parts.append(trial.workload.name)
    if trial.start != "fresh":
        parts.append(trial.start)
    parts.append(f"r{trial.repeat}")
    return " ".join(parts)


def trial_params(trial: TrialSpec, learnt: Mapping[str, str]) -> dict[str, str]:
    """Every factor, the resolved server/client settings, and what the trial learnt while running.

    A learnt value that disagrees with a factor of the same name (e.g. the restriction mode
    actually used after a fallback) is kept as ``<name>_actual``; a param is never written twice.
    """
    p: dict[str, Any] = dict(trial.factors())
    p.update({
        "tp": trial.tensor_parallel,
        "model_kind": trial.model.kind,
        "model_source": getattr(trial.model, "shape", None) or getattr(trial.model, "id", ""),
        "load_format": trial.server.load_format,
        "max_model_len": trial.server.max_model_len,
        "block_size": trial.server.block_size if trial.server.block_size is not None else "default",
        "prefix_caching": trial.server.enable_prefix_caching,
        "vllm_args": " ".join(trial.vllm.args),
        "vllm_env": " ".join(f"{k}={v}" for k, v in sorted(trial.vllm.env.items())),
        "client_cores": trial.client.cores,
        "client_isolation": trial.client.isolation,
        "workload_kind": trial.workload.kind,
    })
    for section in ("protocol", "telemetry"):  # how the window started and what was sampled in it
        for k, v in getattr(trial, section).model_dump(mode="json").items():
            p[f"{section}_{k}"] = v
    for k, v in trial.workload.model_dump(mode="json", exclude={"name", "kind"}).items():
        p[f"workload_{k}"] = f"{v['min']}-{v['max']}" if isinstance(v, dict) and set(v) == {"min", "max"} else v
    out = {safe_key(k): _param_value(v) for k, v in p.items()}
    for k, v in learnt.items():
        key, val = safe_key(k), _param_value(v)
        if key in out and out[key] != val:
            key = f"{key}_actual"
        out.setdefault(key, val)
    return out


def records_frame(records: Iterable[Any]) -> pd.DataFrame:
    """Per-request records as a frame (``workloads.records.records_to_frame``)."""
    return records_to_frame(list(records))


def telemetry_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Sampled series rows as a long frame ``t, name, value`` (``ts`` accepted for ``t``)."""
    data = [{"t": float(r.get("t", r.get("ts", 0.0))), "name": str(r["name"]), "value": r.get("value")} for r in rows]
    frame = pd.DataFrame(data, columns=["t", "name", "value"])
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce").astype("float64")
    return frame


def sweep_payload(plan: SweepPlan, *, experiment: str, git_commit: str | None,
                  spec_yaml: str | None) -> dict[str, Any]:
    """What the parent run of a sweep holds: tags, params, the plan table and the spec."""
    spec = plan.spec
    tags = {"sweep": spec.name, "orchestrator.kind": "sweep"}
    if git_commit:
        tags.update({"git_commit": git_commit, "mlflow.source.git.commit": git_commit})
    if spec.description:
        tags["mlflow.note.content"] = spec.description[:MAX_TAG_LEN]
    params = {
        "trials_planned": len(plan.trials), "max_failures": spec.max_failures,
        "repeats": spec.repeats if isinstance(spec.repeats, int) else spec.repeats.model_dump(),
        "models": [m.name for m in spec.models], "workloads": [w.name for w in spec.workloads],
        "cores": list(spec.grid.cores), "gpus": list(spec.grid.gpus), "hardware": list(spec.grid.hardware),
        "restriction": list(spec.grid.restriction), "start": list(spec.grid.start),
        "vllm_variants": [v.name for v in spec.grid.vllm],
    }
    if spec.search.kind != "grid":  # a grid's parent params stay as they were
        params["search"] = spec.search.model_dump(exclude_none=True)
    plan_rows = [{"trial_id": t.trial_id, "run_name": run_name(t), **t.factors()} for t in plan.trials]
    payload = {
        "version": FORMAT_VERSION, "sweep": spec.name, "experiment": experiment, "tags": tags,
        "params": {k: _param_value(v) for k, v in params.items()}, "plan": plan_rows,
        "spec": spec.model_dump(mode="json"), "spec_yaml": spec_yaml,
    }
    check_declared(payload, sweep=True)
    return payload


def trial_payload(trial: TrialSpec, result: TrialResult, *, git_commit: str | None = None) -> dict[str, Any]:
    """What one child run holds (everything but the parquet files and the artifacts folder): the result's own
    metrics (derived once, by the executor's summary), and the tracker's ``num_records`` and ``trial_duration_s``."""
    finished = result.status is TrialStatus.COMPLETED
    tags = {
        "sweep": trial.sweep, "trial_id": trial.trial_id, "orchestrator.kind": "trial",
        "trial_status": result.status.value, "error_kind": result.error_kind.value,
    }
    if result.message:
        tags["error_message"] = result.message[:MAX_TAG_LEN]
    if result.warnings:
        tags["warnings"] = "\n".join(result.warnings)[:MAX_TAG_LEN]
    if git_commit:
        tags["git_commit"] = git_commit
    metrics = dict(result.metrics)
    metrics["num_records"] = len(result.records)
    if result.started_at and result.ended_at >= result.started_at:
        metrics["trial_duration_s"] = result.ended_at - result.started_at
    payload = {
        "version": FORMAT_VERSION, "kind": "trial", "upload_id": uuid.uuid4().hex,
        "sweep": trial.sweep, "trial_id": trial.trial_id, "run_name": run_name(trial),
        "status": "FINISHED" if finished else "FAILED", "error_kind": result.error_kind.value,
        "message": result.message, "started_at": result.started_at, "ended_at": result.ended_at,
        "params": trial_params(trial, result.params), "tags": tags, "metrics": finite_metrics(metrics),
        "trial_spec": trial.model_dump(mode="json"), "warnings": list(result.warnings),
    }
    check_declared(payload)
    return payload


# -- storage ------------------------------------------------------------------------------

@dataclass(frozen=True)
class OutboxEntry:
    """One trial folder: ``result.json`` plus optional parquet files and artifacts."""

    path: Path
    payload: dict[str, Any]

    @property
    def trial_id(self) -> str:
        return str(self.payload["trial_id"])

    @property
    def sweep(self) -> str:
        return str(self.payload["sweep"])

    def file(self, name: str) -> Path | None:
        p = self.path / name
        return p if p.exists() else None


def _write_json(path: Path, data: Any) -> None:
    # A temp name of this write's own: two threads writing the same file never share (or steal) a temp file.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    finally:
        tmp.unlink(missing_ok=True)


def _sweep_dir(outbox_dir: Path, sweep: str) -> Path:
    return Path(outbox_dir) / safe_key(sweep).replace(" ", "_").replace("/", "_")


def stage_trial(outbox_dir: Path, payload: Mapping[str, Any], *, records: pd.DataFrame | None = None,
                telemetry: pd.DataFrame | None = None, artifacts_dir: str | Path | None = None) -> Path:
    """Write a trial folder under a hidden staging name; :func:`commit` or :func:`discard` it next."""
    trials = _sweep_dir(outbox_dir, payload["sweep"]) / "trials"
    trials.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".staging-{payload['trial_id']}-", dir=trials))
    try:
        _write_json(path / "result.json", dict(payload))
        if records is not None and len(records):
            records.to_parquet(path / "records.parquet", index=False)
        if telemetry is not None and len(telemetry):
            telemetry.to_parquet(path / "telemetry.parquet", index=False)
        if artifacts_dir is not None and Path(artifacts_dir).is_dir():
            shutil.copytree(artifacts_dir, path / "artifacts", symlinks=False)
    except BaseException:
        discard(path)  # never leave half a folder behind
        raise
    return path


def put(outbox_dir: Path, sweep: Mapping[str, Any] | None, trial: TrialSpec, result: TrialResult, *,
        git_commit: str | None = None) -> OutboxEntry:
    """A trial's result into the outbox, whole: its sweep's parent payload (``sweep.json``, refreshed; ``sweep``
    None when the caller has written it already), then the trial's folder (payload, records, telemetry,
    artifacts) staged under a hidden name and renamed into place. The only way in: the tracker uploads from here
    and removes the entry once MLflow has it (write-ahead), so a result is on disk before anything can fail, and
    a crash or a dead server loses nothing. Safe to call from several threads at once."""
    payload = trial_payload(trial, result, git_commit=git_commit)
    if sweep is not None:
        write_sweep(outbox_dir, sweep)
    # No frame for what is empty (a failed trial, a simulated one): building an empty frame costs more than the rest.
    staged = stage_trial(outbox_dir, payload, records=records_frame(result.records) if result.records else None,
                         telemetry=telemetry_frame(result.telemetry) if result.telemetry else None,
                         artifacts_dir=result.artifacts_dir)
    return OutboxEntry(commit(staged), payload)


def commit(staged: Path) -> Path:
    """Make a staged folder a pending outbox entry (atomic rename; oldest sorts first). The name is
    ``<ns>-<trial_id>``: two entries committed in the same nanosecond by two threads differ by their trial ids,
    and the same trial's next attempt (its lane's next commit) comes later."""
    payload = json.loads((staged / "result.json").read_text())
    while True:
        final = staged.parent / f"{time.time_ns():020d}-{payload['trial_id']}"
        try:
            os.rename(staged, final)  # refused when the name is taken (a folder that is not empty)
            return final
        except OSError:
            if not final.exists():
                raise


def trial_id_of(path: Path) -> str:
    """The trial id in an entry folder's name (``<ns>-<trial_id>``), read without opening the entry."""
    return path.name.split("-", 1)[1]


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


_CLAIM = ".claimed-"


def claim(path: Path) -> Path | None:
    """Take an entry for upload: renamed (atomically) to a hidden ``.claimed-<pid>-<name>``, so no other uploader,
    in this process or another (``orchestrator sync`` beside a running sweep), sees or takes it. None when it is
    gone (another uploader took it). Give it back with :func:`unclaim`, or :func:`discard` it once uploaded; the
    claims of a process that died are given back by :func:`reclaim`."""
    claimed = path.with_name(f"{_CLAIM}{os.getpid()}-{path.name}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    return claimed


def unclaim(claimed: Path) -> Path:
    """A claimed entry back under its own name (its upload failed: it waits again)."""
    path = claimed.with_name(claimed.name.split("-", 2)[2])
    os.rename(claimed, path)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reclaim(outbox_dir: Path, sweep: str | None = None) -> int:
    """Give back the entries that a process which is gone (a SIGKILLed driver) had claimed for upload: they wait
    again under their own names. Returns how many."""
    root = Path(outbox_dir)
    if not root.is_dir():
        return 0
    dirs = [_sweep_dir(root, sweep)] if sweep is not None else [d for d in root.iterdir() if d.is_dir()]
    back = 0
    for d in dirs:
        try:
            names = os.listdir(d / "trials")
        except (FileNotFoundError, NotADirectoryError):
            continue
        for n in names:
            if not n.startswith(_CLAIM):
                continue
            pid = n.split("-", 2)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                try:
                    unclaim(d / "trials" / n)
                    back += 1
                except OSError:
                    continue  # another process gave it back first
    return back


def write_sweep(outbox_dir: Path, sweep: Mapping[str, Any]) -> Path:
    """Store (or refresh) the sweep's parent-run payload, so a later sync can create the parent."""
    d = _sweep_dir(outbox_dir, sweep["sweep"])
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / "sweep.json", dict(sweep))
    return d


def has_sweep(outbox_dir: Path, sweep: str) -> bool:
    """True when the sweep's ``sweep.json`` is in the outbox."""
    return (_sweep_dir(outbox_dir, sweep) / "sweep.json").exists()


def read_sweep(outbox_dir: Path, sweep: str) -> dict[str, Any] | None:
    p = _sweep_dir(outbox_dir, sweep) / "sweep.json"
    return json.loads(p.read_text()) if p.exists() else None


def write_sweep_end(outbox_dir: Path, sweep: str, data: Mapping[str, Any]) -> Path:
    d = _sweep_dir(outbox_dir, sweep)
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / "sweep_end.json", dict(data))
    return d / "sweep_end.json"


def read_sweep_end(outbox_dir: Path, sweep: str) -> dict[str, Any] | None:
    p = _sweep_dir(outbox_dir, sweep) / "sweep_end.json"
    return json.loads(p.read_text()) if p.exists() else None


def clear_sweep_end(outbox_dir: Path, sweep: str) -> None:
    (_sweep_dir(outbox_dir, sweep) / "sweep_end.json").unlink(missing_ok=True)


def sweeps(outbox_dir: Path) -> list[str]:
    """Sweep names with anything in the outbox."""
    root = Path(outbox_dir)
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / "sweep.json").exists():
            out.append(json.loads((d / "sweep.json").read_text())["sweep"])
    return out


def entry_paths(outbox_dir: Path, sweep: str | None = None, *, claimed: bool = False) -> list[Path]:
    """The committed trial entry folders, oldest first (optionally of one sweep), by their names alone: nothing
    is opened, so listing a deep outbox costs one directory read per sweep. ``claimed``: with the entries being
    uploaded (:func:`claim`) too."""
    root = Path(outbox_dir)
    if not root.is_dir():
        return []
    dirs = [_sweep_dir(root, sweep)] if sweep is not None else [d for d in root.iterdir() if d.is_dir()]
    paths = []
    for d in dirs:
        try:
            names = os.listdir(d / "trials")
        except (FileNotFoundError, NotADirectoryError):
            continue
        paths += [d / "trials" / n for n in names if not n.startswith(".") or (claimed and n.startswith(_CLAIM))]
    return sorted(paths, key=lambda p: p.name)


def load(path: Path) -> OutboxEntry | None:
    """The entry in ``path``; None when it is gone (an uploader removed it meanwhile) or not an entry."""
    try:
        return OutboxEntry(path, json.loads((path / "result.json").read_text()))
    except (FileNotFoundError, NotADirectoryError):
        return None


def pending(outbox_dir: Path, sweep: str | None = None, *, claimed: bool = False) -> list[OutboxEntry]:
    """Committed trial entries, oldest first (optionally of one sweep; ``claimed``: with those being uploaded)."""
    return [e for p in entry_paths(outbox_dir, sweep, claimed=claimed) if (e := load(p)) is not None]


def remove_sweep_if_empty(outbox_dir: Path, sweep: str) -> bool:
    """Delete a sweep's folder once no trial entry and no end marker is left in it."""
    d = _sweep_dir(outbox_dir, sweep)
    if pending(outbox_dir, sweep) or (d / "sweep_end.json").exists():
        return False
    trials = d / "trials"
    if trials.is_dir() and any(trials.iterdir()):
        return False  # a tracker is staging a trial right now
    shutil.rmtree(d, ignore_errors=True)
    return True


__all__ = ["FORMAT_VERSION", "OutboxEntry", "check_declared", "claim", "clear_sweep_end", "commit", "discard", "entry_paths",
           "finite_metrics", "has_sweep", "load", "pending", "put", "read_sweep", "read_sweep_end", "records_frame",
           "remove_sweep_if_empty", "run_name", "safe_key", "stage_trial", "sweep_payload", "sweeps",
           "reclaim", "telemetry_frame", "trial_id_of", "trial_params", "trial_payload", "unclaim", "write_sweep",
           "write_sweep_end"]
