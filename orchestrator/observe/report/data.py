"""Where the report's trials come from: MLflow child runs, or the local outbox (effects).

A report reads one sweep's trials (their params, tags and summary metrics), the per-request
records of every completed trial (``records.parquet``: ``workloads.records.records_to_frame``
written by the tracker) and the SLOs its sweep records, if any:

- **MLflow** (:func:`from_mlflow`): the latest run of every trial (``tracking.trial_runs``), each
  run's ``records.parquet`` artifact, and the parent run's params and ``spec.json`` / ``plan.json``.
- **The outbox** (:func:`from_outbox`): results kept locally while MLflow was unreachable
  (``outbox.pending``): each entry's ``result.json`` payload and ``records.parquet``, and the
  sweep's ``sweep.json``. Of several entries of one trial, the first FINISHED one counts (an
  upload drops later results of a finished trial), else the latest.

SLOs of a sweep: ``slo: {ttft_s, tpot_s}`` in its spec, or params ``slo_ttft_s`` / ``slo_tpot_s``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.observe import outbox
from orchestrator.observe.report.comparison import payloads_frame, runs_frame
from orchestrator.observe.report.tables import RECORD_COLUMNS, Slo


class ReportInputError(ValueError):
    """A sweep's stored results cannot be read as a report's input (the message names the file or field)."""


@dataclass(frozen=True)
class SweepData:
    """One sweep's trials and records, and where they were read from."""

    sweep: str
    kind: str                               # "mlflow" or "outbox"
    source: str                             # for the page: the server or folder, and why
    trials: pd.DataFrame                    # report.runs_frame rows
    records: Mapping[str, pd.DataFrame]     # trial_id -> its per-request records
    slo: Slo = Slo()                        # what the sweep itself records
    parent_run_id: str | None = None
    notes: tuple[str, ...] = ()             # what could not be read, what is still in the outbox
    time_use: Mapping[str, float] = field(default_factory=dict)  # the sweep run's window-share figures


def read_records(path: Path, what: str) -> pd.DataFrame:
    """A ``records.parquet`` file; :class:`ReportInputError` naming ``what`` (and the file) when it is
    unreadable or lacks the columns the report needs."""
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 (pyarrow raises many kinds)
        raise ReportInputError(f"{what}: cannot read {path.name}: {type(exc).__name__}: {exc}") from None
    missing = [c for c in RECORD_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportInputError(f"{what}: {path.name} lacks the record columns {missing}")
    return frame


def _number(value: Any, where: str) -> float | None:
    if value is None or value == "" or value == "None":
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ReportInputError(f"{where}: expected a number of seconds, got {value!r}") from None
    if not f > 0:
        raise ReportInputError(f"{where}: an SLO must be more than 0 s, got {value!r}")
    return f


def slo_of(data: Mapping[str, Any] | None, where: str) -> Slo:
    """The SLOs in one record of a sweep: ``slo`` (a mapping, or its JSON) with ``ttft_s``/``tpot_s``, or the
    flat ``slo_ttft_s``/``slo_tpot_s``. Empty when there are none; ``where`` names the record in errors."""
    if not data:
        return Slo()
    nested = data.get("slo")
    if isinstance(nested, str) and nested.strip():
        try:
            nested = json.loads(nested)
        except json.JSONDecodeError:
            raise ReportInputError(f"{where}: field 'slo' is not JSON: {nested[:80]!r}") from None
    if isinstance(nested, Mapping):
        ttft = _number(nested.get("ttft_s"), f"{where}: field 'slo.ttft_s'")
        tpot = _number(nested.get("tpot_s"), f"{where}: field 'slo.tpot_s'")
    else:
        ttft = _number(data.get("slo_ttft_s"), f"{where}: field 'slo_ttft_s'")
        tpot = _number(data.get("slo_tpot_s"), f"{where}: field 'slo_tpot_s'")
    return Slo(ttft, tpot, "the sweep's slo") if ttft is not None or tpot is not None else Slo()


def first_slo(sources: Iterable[tuple[Mapping[str, Any] | None, str]]) -> Slo:
    """The SLOs of the first record that has any."""
    for data, where in sources:
        slo = slo_of(data, where)
        if slo.given:
            return slo
    return Slo()


def _plan_first_row(table: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The first row of a ``plan.json`` (MLflow ``log_table`` layout: columns + data), or None."""
    if not table or not table.get("data"):
        return None
    return dict(zip(table.get("columns", []), table["data"][0]))


class ArtifactReadError(RuntimeError):
    """An artifact the run lists could not be listed, downloaded or parsed: a failure, never "not recorded"."""


def _artifact(client: Any, run_id: str, name: str, dst: Path) -> Path | None:
    """The downloaded artifact ``name`` of run ``run_id``; None only when the run does not list it.
    A listing or download that fails raises :class:`ArtifactReadError` naming the run, the artifact and why."""
    try:
        listed = {a.path for a in client.list_artifacts(run_id)}
    except Exception as exc:  # noqa: BLE001 - re-raised with what was being read
        raise ArtifactReadError(f"run {run_id}: could not list its artifacts: {type(exc).__name__}: {exc}") from exc
    if name not in listed:
        return None
    try:
        return Path(client.download_artifacts(run_id, name, str(dst)))
    except Exception as exc:  # noqa: BLE001 - re-raised with what was being read
        raise ArtifactReadError(f"run {run_id}: {name} is recorded but could not be downloaded: "
                                f"{type(exc).__name__}: {exc}") from exc


def _download_json(client: Any, run_id: str, name: str, dst: Path) -> Any | None:
    """A JSON artifact; None when the run does not record it (a failed read or bad JSON raises)."""
    path = _artifact(client, run_id, name, dst)
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactReadError(f"run {run_id}: {name} is not readable JSON: {type(exc).__name__}: {exc}") from exc


def from_mlflow(client: Any, sweep: str, *, source: str) -> SweepData | None:
    """The sweep's latest trial runs and their records from MLflow; None when it has no trial runs."""
    from orchestrator.observe.tracking import parent_run, trial_runs  # heavy: MLflow, for this source only

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per trial would flood stdout
    runs = trial_runs(client, sweep)
    if not runs:
        return None
    notes: list[str] = []
    records: dict[str, pd.DataFrame] = {}
    with tempfile.TemporaryDirectory(prefix="report-") as tmp:
        for run in runs:
            tid = run.data.tags.get("trial_id")
            if tid is None or run.info.status != "FINISHED":
                continue
            dst = Path(tmp) / run.info.run_id
            dst.mkdir()
            path = _artifact(client, run.info.run_id, "records.parquet", dst)
            if path is None:  # a run logged without records
                notes.append(f"trial {tid} (run {run.info.run_id}): no records.parquet artifact")
                continue
            try:
                records[tid] = read_records(path, f"trial {tid} (run {run.info.run_id})")
            except ReportInputError as exc:
                notes.append(str(exc))
        parent = parent_run(client, sweep)
        slo = Slo()
        if parent is not None:
            pid = parent.info.run_id
            slo = first_slo([(parent.data.params, f"parent run {pid}: params"),
                             (_download_json(client, pid, "spec.json", Path(tmp)), f"parent run {pid}: spec.json"),
                             (_plan_first_row(_download_json(client, pid, "plan.json", Path(tmp))),
                              f"parent run {pid}: plan.json")])
    time_use = {k: v for k, v in (parent.data.metrics if parent is not None else {}).items()
                if k.startswith(("gpu_", "core_")) and k.endswith(("_s", "_share"))}
    return SweepData(sweep=sweep, kind="mlflow", source=source, trials=runs_frame(runs), records=records, slo=slo,
                     parent_run_id=parent.info.run_id if parent is not None else None, notes=tuple(notes),
                     time_use=time_use)


def _latest_entries(entries: Iterable[outbox.OutboxEntry]) -> list[outbox.OutboxEntry]:
    """One entry per trial: its first FINISHED one, else its latest (``entries`` oldest first)."""
    chosen: dict[str, outbox.OutboxEntry] = {}
    for e in entries:
        held = chosen.get(e.trial_id)
        if held is None or held.payload["status"] != "FINISHED":
            chosen[e.trial_id] = e
    return list(chosen.values())


def from_outbox(outbox_dir: Path, sweep: str, *, reason: str) -> SweepData | None:
    """The sweep's results waiting in the outbox; None when it holds none. ``reason``: why not MLflow."""
    entries = _latest_entries(outbox.pending(outbox_dir, sweep))
    if not entries:
        return None
    notes: list[str] = []
    records: dict[str, pd.DataFrame] = {}
    for e in entries:
        if e.payload["status"] != "FINISHED":
            continue
        f = e.file("records.parquet")
        if f is None:
            notes.append(f"trial {e.trial_id} ({e.path.name}): no records.parquet")
            continue
        try:
            records[e.trial_id] = read_records(f, f"trial {e.trial_id} ({e.path})")
        except ReportInputError as exc:
            notes.append(str(exc))
    info = outbox.read_sweep(outbox_dir, sweep) or {}
    where = f"sweep.json of {sweep!r} in the outbox {outbox_dir}"
    plan = info.get("plan")
    slo = first_slo([(info.get("params"), f"{where}: params"), (info.get("spec"), f"{where}: spec"),
                     (plan[0] if plan else None, f"{where}: plan")])
    return SweepData(sweep=sweep, kind="outbox", source=f"the local outbox {outbox_dir} ({reason})",
                     trials=payloads_frame(e.payload for e in entries), records=records, slo=slo, notes=tuple(notes))


def pending_note(outbox_dir: Path, sweep: str) -> str | None:
    """A line for the page when results of the sweep are still waiting in the outbox (not in MLflow yet)."""
    n = len(_latest_entries(outbox.pending(outbox_dir, sweep)))
    if not n:
        return None
    return f"{n} result(s) of this sweep are still in the outbox {outbox_dir} and not shown; `orchestrator sync` uploads them"


__all__ = ["ArtifactReadError", "ReportInputError", "SweepData", "first_slo", "from_mlflow", "from_outbox", "pending_note", "read_records",
           "slo_of"]
