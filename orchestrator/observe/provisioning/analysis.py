"""How many CPU cores per GPU real clusters hand out, and which share of jobs a knee would starve (pure).

Input: :func:`orchestrator.observe.provisioning.cluster_traces.combine`'s frame, one row per job (or node, or
per-cluster summary row) with ``trace``, ``kind``, ``source``, ``gpu_type``, ``gpus``, ``cores``,
``duration_s`` and ``jobs``. Definitions:

- ``cores_per_gpu = cores / gpus`` of one job (a v2023 pod on 0.5 GPU with 4 cores: 8).
- Weights: ``jobs`` counts each job once (the paper's view); ``gpus`` weighs it by its GPUs (for
  nodes: the share of the cluster's GPUs); ``gpu-time`` by ``gpus * duration_s`` (jobs without a
  duration are left out; nodes, there for the whole trace, by their GPUs).
- The CDF at ``x``: the weighted share of jobs with ``cores_per_gpu <= x``.
- ``below_K``: the weighted share with ``cores_per_gpu < K``; a job starves under a knee of ``K``
  cores per GPU when it is below ``K``.
- The median: the smallest ``x`` whose CDF reaches 1/2, or the mean of it and the next value where
  the CDF is exactly 1/2 (with unit weights, the usual median).

Figures are per trace, once for all its rows (``gpu_type = "all"``) and once per GPU type where
the file names them. Requests (what jobs asked for) and nodes (what the hardware has) are never
pooled: ``kind`` keeps them apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from orchestrator.observe.report.comparison import CONFIG

THRESHOLDS = (2.0, 4.0, 8.0)
WEIGHTS = ("jobs", "gpus", "gpu-time")
KEYS = ["trace", "source", "kind", "gpu_type"]
ALL = "all"


def _label(threshold: float) -> str:
    return f"below_{threshold:g}"


def weighted(frame: pd.DataFrame, weight: str = "jobs") -> pd.DataFrame:
    """The rows that can answer: cores known and a weight > 0, with ``cores_per_gpu`` and ``weight`` added."""
    if weight not in WEIGHTS:
        raise ValueError(f"weight must be one of {', '.join(WEIGHTS)}, got {weight!r}")
    out = frame[frame["cores"].notna() & (frame["gpus"] > 0)].copy()
    out["cores_per_gpu"] = out["cores"] / out["gpus"]
    w = out["jobs"].astype(float)
    if weight != "jobs":
        w = w * out["gpus"]
    if weight == "gpu-time":  # a node's GPUs are there all through the trace: weighed by GPUs alone
        w = w * out["duration_s"].where(out["kind"] != "nodes", 1.0)
    out["weight"] = w
    return out[out["weight"] > 0]


def ecdf(values: Sequence[float] | pd.Series, weights: Sequence[float] | pd.Series | None = None) -> pd.DataFrame:
    """The empirical CDF: one row per distinct value, ``cores_per_gpu`` and ``cdf`` (share with value <= it)."""
    v = np.asarray(values, dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    if not len(v) or w.sum() <= 0:
        return pd.DataFrame({"cores_per_gpu": pd.Series(dtype=float), "cdf": pd.Series(dtype=float)})
    x, inverse = np.unique(v, return_inverse=True)
    mass = np.bincount(inverse, weights=w, minlength=len(x))
    return pd.DataFrame({"cores_per_gpu": x, "cdf": np.cumsum(mass) / w.sum()})


def share_below(values: Sequence[float] | pd.Series, threshold: float,
                weights: Sequence[float] | pd.Series | None = None) -> float:
    """The (weighted) share of values strictly below ``threshold``; NaN without values."""
    v = np.asarray(values, dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    total = w.sum()
    return float(w[v < threshold].sum() / total) if len(v) and total > 0 else math.nan


def median(values: Sequence[float] | pd.Series, weights: Sequence[float] | pd.Series | None = None) -> float:
    """The (weighted) median, as defined in the module docstring; NaN without values."""
    c = ecdf(values, weights)
    if c.empty:
        return math.nan
    x, f = c["cores_per_gpu"].to_numpy(), c["cdf"].to_numpy()
    i = int(np.searchsorted(f, 0.5 - 1e-12))
    if math.isclose(f[i], 0.5, abs_tol=1e-12) and i + 1 < len(x):
        return float((x[i] + x[i + 1]) / 2)
    return float(x[i])


def groups(frame: pd.DataFrame) -> Iterator[tuple[dict[str, Any], pd.DataFrame]]:
    """Per trace: all its rows (``gpu_type = "all"``), then each GPU type it names (in name order)."""
    for (trace, source, kind), g in frame.groupby(["trace", "source", "kind"], sort=False):
        yield {"trace": trace, "source": source, "kind": kind, "gpu_type": ALL}, g
        if g["gpu_type"].notna().any():
            for gpu_type, sub in g.groupby(g["gpu_type"].fillna("(none named)"), sort=True):
                yield {"trace": trace, "source": source, "kind": kind, "gpu_type": gpu_type}, sub


def shares_table(frame: pd.DataFrame, thresholds: Sequence[float] = THRESHOLDS, weight: str = "jobs") -> pd.DataFrame:
    """One row per trace and GPU type: ``count`` (jobs or nodes with a GPU), ``counted`` (those with cores
    and a weight), ``gpus_median`` (per job), ``cores_per_gpu_median`` and ``below_K`` for each threshold."""
    rows = []
    for key, g in groups(frame):
        w = weighted(g, weight)
        row: dict[str, Any] = {**key, "count": float(g["jobs"].sum()), "counted": float(w["jobs"].sum()),
                               "gpus_median": median(w["gpus"], w["jobs"]),
                               "cores_per_gpu_median": median(w["cores_per_gpu"], w["weight"])}
        for t in thresholds:
            row[_label(t)] = share_below(w["cores_per_gpu"], t, w["weight"])
        rows.append(row)
    return pd.DataFrame(rows, columns=[*KEYS, "count", "counted", "gpus_median", "cores_per_gpu_median",
                                       *(_label(t) for t in thresholds)])


def cdf_table(frame: pd.DataFrame, weight: str = "jobs") -> pd.DataFrame:
    """The CDF points of every trace and GPU type: ``KEYS`` + ``cores_per_gpu``, ``cdf``."""
    parts = []
    for key, g in groups(frame):
        w = weighted(g, weight)
        c = ecdf(w["cores_per_gpu"], w["weight"])
        if len(c):
            parts.append(c.assign(**key))
    if not parts:
        return pd.DataFrame(columns=[*KEYS, "cores_per_gpu", "cdf"])
    return pd.concat(parts, ignore_index=True)[[*KEYS, "cores_per_gpu", "cdf"]]


def starvation_table(frame: pd.DataFrame, knees: Mapping[str, float], weight: str = "jobs") -> pd.DataFrame:
    """Per trace of requests, GPU type and knee: the share of jobs that would starve (``cores_per_gpu < knee``).

    Nodes and summaries are left out: a node's hardware is not a job's request, and a summary has no cores.
    """
    rows = []
    for key, g in groups(frame[frame["kind"] == "requests"]):
        w = weighted(g, weight)
        for label, k in knees.items():
            rows.append({**key, "knee": label, "knee_cores_per_gpu": float(k), "counted": float(w["jobs"].sum()),
                         "starving": share_below(w["cores_per_gpu"], k, w["weight"])})
    return pd.DataFrame(rows, columns=[*KEYS, "knee", "knee_cores_per_gpu", "counted", "starving"])


def sweep_knees(table: pd.DataFrame, sweep: str) -> dict[str, float]:
    """Knee cores per GPU of each configuration in :func:`orchestrator.observe.report.comparison`'s table.

    ``knee cores / gpus`` for every configuration with a knee and at least one GPU (CPU-only ones have no
    cores per GPU). The label is the sweep's name, plus the factors that differ between its configurations.
    """
    knees = table[(table["knee"].fillna("").astype(str).str.strip() != "") & (pd.to_numeric(table["gpus"], errors="coerce").fillna(0) > 0)]
    varying = [c for c in CONFIG if c in knees and knees[c].astype(str).nunique() > 1]
    out = {}
    for _, r in knees.iterrows():
        label = " ".join([sweep, *(f"{c}={r[c]}" for c in varying)])
        out[label] = float(r["cores"]) / float(r["gpus"])
    return out


def _pct(v: Any) -> str:
    return "-" if pd.isna(v) else f"{100 * v:.1f}%"


def _num(v: Any) -> str:
    return "-" if pd.isna(v) else f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def render_shares(table: pd.DataFrame, title: str = "Cores per GPU") -> Any:
    """A rich Table of :func:`shares_table` (shares in %)."""
    below = [c for c in table.columns if c.startswith("below_")]
    out = Table(title=title)
    for c in ["trace", "kind", "GPU type", "jobs / nodes", "counted", "GPUs p50", "cores/GPU p50",
              *(f"< {c[len('below_'):]}" for c in below)]:
        out.add_column(c, justify="left" if c in ("trace", "kind", "GPU type") else "right")
    for _, r in table.iterrows():
        out.add_row(str(r["trace"]), str(r["kind"]), str(r["gpu_type"]), f"{r['count']:,.0f}", f"{r['counted']:,.0f}",
                    _num(r["gpus_median"]), _num(r["cores_per_gpu_median"]), *(_pct(r[c]) for c in below))
    return out


def render_starvation(table: pd.DataFrame, title: str = "Jobs below the knee (would starve)") -> Any:
    """A rich Table of :func:`starvation_table`."""
    out = Table(title=title)
    for c in ["trace", "GPU type", "knee", "knee cores/GPU", "jobs counted", "starving"]:
        out.add_column(c, justify="left" if c in ("trace", "GPU type", "knee") else "right")
    for _, r in table.iterrows():
        out.add_row(str(r["trace"]), str(r["gpu_type"]), str(r["knee"]), _num(r["knee_cores_per_gpu"]),
                    f"{r['counted']:,.0f}", _pct(r["starving"]))
    return out


def cdf_figure(cdf: pd.DataFrame, knees: Mapping[str, float] | None = None, thresholds: Sequence[float] = THRESHOLDS,
               title: str = "CPU cores per GPU") -> Any:
    """A matplotlib Figure on the Agg canvas: requested cores per GPU (left) beside the nodes' hardware (right)."""
    # heavy: matplotlib, for the figure only (the tables and the knees do without it)
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    tab20 = matplotlib.colormaps["tab20"].colors  # type: ignore[attr-defined]  # a ListedColormap
    colours = tab20[::2] + tab20[1::2]  # the ten strong hues first
    for ax, kind, what in ((axes[0], "requests", "requested by jobs"), (axes[1], "nodes", "of the nodes (hardware)")):
        part = cdf[cdf["kind"] == kind]
        for i, ((trace, gpu_type), g) in enumerate(part.groupby(["trace", "gpu_type"], sort=False)):
            whole = gpu_type == ALL
            x, f = g["cores_per_gpu"].to_numpy(), g["cdf"].to_numpy()
            ax.step(np.r_[x[0], x], np.r_[0.0, f], where="post", color=colours[i % len(colours)],
                    linewidth=2.4 if whole else 1.1, linestyle="-" if whole else "--",
                    label=trace if whole else f"{trace}: {gpu_type}")
        for t in thresholds:
            ax.axvline(t, color="grey", linestyle=":", linewidth=0.8)
        for k in (knees or {}).values():
            ax.axvline(k, color="red", linestyle="--", linewidth=1.0)
            ax.annotate(f"knee {k:g}", (k, 0.98), color="red", fontsize=8, rotation=90, ha="right", va="top")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"CPU cores per GPU {what}")
        ax.set_title(f"{title}: {what}" + ("" if len(part) else " (no trace given)"))
        ax.grid(alpha=0.3)
        if len(part):
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0) if kind == "nodes" else (0.0, 0.9))
    axes[0].set_ylabel("share of jobs / nodes (CDF)")
    return fig


__all__ = ["ALL", "KEYS", "THRESHOLDS", "WEIGHTS", "cdf_figure", "cdf_table", "ecdf", "groups", "median",
           "render_shares", "render_starvation", "share_below", "shares_table", "starvation_table", "sweep_knees",
           "weighted"]
