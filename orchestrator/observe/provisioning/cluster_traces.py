"""Loaders for public GPU-cluster scheduling traces, one per format, for the provisioning view.

Every loader returns one row per job, pod or instance (``kind="requests"``: what a job asked
for), per node (``kind="nodes"``: what the hardware has), or per cluster (``kind="summary"``: a
per-cluster digest with no per-job figures). The columns:

- ``source``: the format's name (``alibaba-v2023-pods``, ...);
- ``job_id``: the row's id in the file (a pod, instance, job, node or cluster name);
- ``gpus``: GPUs requested or installed, a float: v2023 pods share GPUs (``gpu_milli`` of 1000);
- ``cores``: CPU cores requested or installed (NaN in a summary, which has none);
- ``gpu_type``: the GPU model where the file names one, else None;
- ``duration_s``: how long the job ran, where the format records it (NaN otherwise);
- ``jobs``: how many jobs the row stands for (1, except in a per-cluster summary).

Rows without a GPU are left out and counted (``ClusterTrace.excluded_no_gpu``). The format is
told by the header: a file that matches none raises ``ClusterTraceError`` naming the columns
missing from the closest format and every format's expected columns; a bad value names its line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

Kind = Literal["requests", "nodes", "summary"]
COLUMNS = ["source", "job_id", "gpus", "cores", "gpu_type", "duration_s", "jobs"]


class ClusterTraceError(ValueError):
    """A cluster trace that cannot be read; ``str()`` is ``<file name>[:<line>]: <problem>``."""

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        where = self.path.name if line is None else f"{self.path.name}:{line}"
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class TraceFormat:
    """One file format: its name, what its rows are, the columns it needs, and how its rows become ours."""

    name: str
    kind: Kind
    required: tuple[str, ...]
    build: Callable[[_Rows], pd.DataFrame]
    cannot_answer: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterTrace:
    """One loaded file: its rows with a GPU (``COLUMNS``), and what was left out or cannot be answered."""

    path: Path
    format: TraceFormat
    frame: pd.DataFrame
    rows: int
    excluded_no_gpu: int

    @property
    def kind(self) -> Kind:
        return self.format.kind

    def notes(self) -> list[str]:
        """What this trace leaves out and which questions it cannot answer, one line each."""
        unit = "node(s)" if self.kind == "nodes" else "job(s)"
        out = [f"{self.excluded_no_gpu:,} {unit} without a GPU left out"] if self.excluded_no_gpu else []
        out += list(self.format.cannot_answer)
        if self.kind != "summary" and self.frame["gpu_type"].isna().all():
            out.append("names no GPU type: figures for the whole trace only")
        if self.kind == "requests" and self.frame["duration_s"].isna().all():
            out.append("records no job duration: no GPU-time weighting")
        return out


class _Rows:
    """A file's cells as text, with checked conversion to numbers that names the bad line."""

    def __init__(self, path: Path, df: pd.DataFrame) -> None:
        self.path, self.df = path, df

    def number(self, col: str, *, optional: bool = False, most: float | None = None) -> pd.Series:
        """``col`` as floats >= 0 (and <= ``most``); empty cells (or the whole column, absent) are NaN when
        ``optional``, else an error."""
        if optional and col not in self.df:
            return pd.Series(float("nan"), index=self.df.index)
        raw = self.df[col]
        value = pd.to_numeric(raw, errors="coerce")
        bad = (value.isna() & raw.notna()) | (value < 0)
        if most is not None:
            bad |= value > most
        if not optional:
            bad |= raw.isna()
        if bad.any():
            i = bad.idxmax()
            cell = "empty" if pd.isna(raw[i]) else repr(raw[i])
            limit = "" if most is None else f" and <= {most:g}"
            more = int(bad.sum()) - 1
            raise ClusterTraceError(self.path, int(i) + 2, f"column {col!r} is {cell}, expected a number >= 0{limit}"
                                    + (f" ({more:,} more bad row(s))" if more else ""))
        return value.astype(float)

    def text(self, col: str) -> pd.Series:
        """``col`` as strings, None where empty or absent."""
        if col not in self.df:
            return pd.Series(None, index=self.df.index, dtype=object)
        cells = (v.strip() if isinstance(v, str) else "" for v in self.df[col])
        return pd.Series([v or None for v in cells], index=self.df.index, dtype=object)

    def span(self, start: str, end: str) -> pd.Series:
        """``end - start`` in the file's time unit, NaN where either is empty or absent."""
        return self.number(end, optional=True) - self.number(start, optional=True)

    def frame(self, source: str, job_id: pd.Series, gpus: pd.Series, cores: pd.Series,
              gpu_type: pd.Series | None = None, duration_s: pd.Series | None = None,
              jobs: pd.Series | None = None) -> pd.DataFrame:
        nan = pd.Series(float("nan"), index=self.df.index)
        return pd.DataFrame({
            "source": source, "job_id": job_id.astype(str), "gpus": gpus, "cores": cores,
            "gpu_type": gpu_type if gpu_type is not None else pd.Series(None, index=self.df.index, dtype=object),
            "duration_s": duration_s if duration_s is not None else nan,
            "jobs": jobs if jobs is not None else 1,
        }, columns=COLUMNS)


def _v2023_pods(r: _Rows) -> pd.DataFrame:
    """cluster-trace-gpu-v2023 pods: ``num_gpu`` GPUs, each a ``gpu_milli``/1000 share; cores = ``cpu_milli``/1000;
    duration = ``deletion_time - scheduled_time`` (s; NaN for a pod never scheduled)."""
    gpus = r.number("num_gpu") * r.number("gpu_milli", most=1000) / 1000
    return r.frame("alibaba-v2023-pods", r.df["name"], gpus, r.number("cpu_milli") / 1000, r.text("gpu_spec"),
                   r.span("scheduled_time", "deletion_time"))


def _v2023_nodes(r: _Rows) -> pd.DataFrame:
    """cluster-trace-gpu-v2023 node lists: ``gpu`` GPUs of ``model``, ``cpu_milli``/1000 cores."""
    return r.frame("alibaba-v2023-nodes", r.df["sn"], r.number("gpu"), r.number("cpu_milli") / 1000, r.text("model"))


def _v2025_dlrm(r: _Rows) -> pd.DataFrame:
    """cluster-trace-gpu-v2025 DLRM instances: ``gpu_request`` GPUs, ``cpu_request`` cores;
    duration = ``deletion_time - scheduled_time`` (s; NaN while still running at the trace's end)."""
    return r.frame("alibaba-v2025-dlrm", r.df["instance_sn"], r.number("gpu_request"), r.number("cpu_request"),
                   duration_s=r.span("scheduled_time", "deletion_time"))


def _v2026_nodes(r: _Rows) -> pd.DataFrame:
    """cluster-trace-v2026-spot-gpu nodes: ``gpu_capacity_num`` GPUs of ``gpu_model``, ``cpu_num`` vCPUs."""
    return r.frame("alibaba-v2026-nodes", r.df["node_name"], r.number("gpu_capacity_num"), r.number("cpu_num"),
                   r.text("gpu_model"))


def _v2026_jobs(r: _Rows) -> pd.DataFrame:
    """cluster-trace-v2026-spot-gpu jobs: ``worker_num`` instances of ``gpu_request`` GPUs and ``cpu_request``
    vCPUs each (cores per GPU is the same if the requests are the job's totals); ``duration`` in s."""
    workers = r.number("worker_num")
    return r.frame("alibaba-v2026-jobs", r.df["job_name"], r.number("gpu_request") * workers,
                   r.number("cpu_request") * workers, r.text("gpu_model"), r.number("duration", optional=True))


def _acme_jobs(r: _Rows) -> pd.DataFrame:
    """AcmeTrace job traces (trace_seren.csv, trace_kalos.csv): ``gpu_num`` GPUs, ``cpu_num`` CPUs, ``duration`` s."""
    return r.frame("acmetrace-jobs", r.df["job_id"], r.number("gpu_num"), r.number("cpu_num"),
                   duration_s=r.number("duration", optional=True))


def _acme_summary(r: _Rows) -> pd.DataFrame:
    """AcmeTrace cluster_summary.csv: per cluster, a row for its ``gpu_job_num`` GPU jobs (``avg_gpu_num`` GPUs
    each, cores unknown) and one, without GPUs, for the rest of ``job_num``."""
    ids, total, gpu_jobs = r.df["id"], r.number("job_num"), r.number("gpu_job_num")
    if (gpu_jobs > total).any():
        i = (gpu_jobs > total).idxmax()
        raise ClusterTraceError(r.path, int(i) + 2, f"gpu_job_num {gpu_jobs[i]:g} is more than job_num {total[i]:g}")
    nan = pd.Series(float("nan"), index=r.df.index)
    with_gpu = r.frame("acmetrace-summary", ids, r.number("avg_gpu_num"), nan, jobs=gpu_jobs)
    without = r.frame("acmetrace-summary", ids, nan.fillna(0.0), nan, jobs=total - gpu_jobs)
    return pd.concat([with_gpu, without], ignore_index=True)


_NODES_NOTE = "node hardware (the cores per GPU a node has), not what jobs requested: no share of jobs below a knee"
FORMATS: tuple[TraceFormat, ...] = (
    TraceFormat("alibaba-v2023-pods", "requests", ("name", "cpu_milli", "num_gpu", "gpu_milli"), _v2023_pods),
    TraceFormat("alibaba-v2023-nodes", "nodes", ("sn", "cpu_milli", "gpu", "model"), _v2023_nodes, (_NODES_NOTE,)),
    TraceFormat("alibaba-v2025-dlrm", "requests", ("instance_sn", "role", "cpu_request", "gpu_request"), _v2025_dlrm),
    TraceFormat("alibaba-v2026-nodes", "nodes", ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name"),
                _v2026_nodes, (_NODES_NOTE,)),
    TraceFormat("alibaba-v2026-jobs", "requests", ("job_name", "gpu_model", "cpu_request", "gpu_request", "worker_num"),
                _v2026_jobs),
    TraceFormat("acmetrace-jobs", "requests", ("job_id", "gpu_num", "cpu_num"), _acme_jobs),
    TraceFormat("acmetrace-summary", "summary", ("id", "job_num", "gpu_job_num", "avg_gpu_num"), _acme_summary,
                ("per-cluster summary with no CPU request per job: no cores per GPU, no shares below 2/4/8 cores "
                 "per GPU, no share below a knee (AcmeTrace's per-job trace_seren.csv / trace_kalos.csv have "
                 "cpu_num and can)",)),
)


def detect_format(path: Path | str, header: Sequence[str]) -> TraceFormat:
    """The format whose required columns are all in ``header`` (the most specific if several are)."""
    cols = {c.strip() for c in header}
    matches = [f for f in FORMATS if set(f.required) <= cols]
    if matches:
        return max(matches, key=lambda f: len(f.required))
    expected = "; ".join(f"{f.name}: {', '.join(f.required)}" for f in FORMATS)
    closest = max(FORMATS, key=lambda f: len(set(f.required) & cols))
    missing = [c for c in closest.required if c not in cols]
    if len(missing) == len(closest.required):
        problem = f"unknown header ({', '.join(header)})"
    else:
        problem = f"missing column(s) {', '.join(missing)} for {closest.name}"
    raise ClusterTraceError(path, 1, f"{problem}; expected the columns of one of: {expected}")


def load_trace(path: Path | str) -> ClusterTrace:
    """Read one cluster trace of any known format; rows without a GPU are left out and counted."""
    path = Path(path)
    if not path.is_file():
        raise ClusterTraceError(path, None, "no such file")
    try:
        df = pd.read_csv(path, dtype=str, skip_blank_lines=False, encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise ClusterTraceError(path, None, "empty file: no header") from None
    except pd.errors.ParserError as exc:
        raise ClusterTraceError(path, None, f"not a readable CSV: {str(exc).strip()}") from None
    except UnicodeDecodeError as exc:
        raise ClusterTraceError(path, None, f"not UTF-8 text: {exc}") from None
    df.columns = [str(c).strip() for c in df.columns]
    fmt = detect_format(path, list(df.columns))
    df = df[df.notna().any(axis=1)]  # blank lines (kept above so that row i is line i + 2)
    frame = fmt.build(_Rows(path, df))
    no_gpu = ~(frame["gpus"] > 0)
    return ClusterTrace(path=path, format=fmt, frame=frame[~no_gpu].reset_index(drop=True), rows=len(df),
                        excluded_no_gpu=int(frame.loc[no_gpu, "jobs"].sum()))


def combine(traces: Sequence[ClusterTrace]) -> pd.DataFrame:
    """All traces' rows in one frame, with ``trace`` (the file's name, or folder/name where names repeat) and ``kind``."""
    names = [t.path.name for t in traces]
    parts = []
    for t, name in zip(traces, names):
        label = f"{t.path.parent.name}/{name}" if names.count(name) > 1 else name
        parts.append(t.frame.assign(trace=label, kind=t.kind))
    if not parts:
        return pd.DataFrame(columns=["trace", "kind", *COLUMNS])
    out = pd.concat(parts, ignore_index=True)
    return out[["trace", "kind", *COLUMNS]]


__all__ = ["COLUMNS", "FORMATS", "ClusterTrace", "ClusterTraceError", "Kind", "TraceFormat", "combine",
           "detect_format", "load_trace"]
