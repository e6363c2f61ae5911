"""The sweep report's tables, from trials and their per-request records (pure).

- **aggregated**: :func:`report.comparison` (one row per configuration and core count, repeats
  aggregated), plus bootstrap intervals of TTFT p50/p90/p99 (:mod:`orchestrator.observe.stats`),
  the frontend share of TTFT (``server_frontend_s_mean / server_ttft_s_mean``), goodput under
  the report's SLOs and the heatmap cell's label.
- **trials**: one row per trial, with the SLO goodput of its own records.
- **heatmap**: configurations against cores; a cell is the speedup ``TTFT p50 at the fewest cores /
  TTFT p50 here``, or ``timeout`` / ``failed`` where there is no figure worth a number.

Goodput under SLOs: requests per second that met every SLO,
``workloads.metrics.goodput_count(records) / workloads.metrics.duration_s(records)`` per trial,
the mean over a cell's completed repeats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.observe import stats
from orchestrator.observe.report.comparison import COLUMNS, CONFIG, TIMEOUT_MAJORITY, comparison
from workloads.metrics import duration_s, goodput_count
from workloads.records import RequestRecord

QUANTILES = (0.5, 0.9, 0.99)
RECORD_COLUMNS = ("status", "scheduled_ns", "sent_ns", "first_token_ns", "end_ns", "completion_tokens")
TIMEOUT_KINDS = ("startup_timeout",)  # error kinds shown as "timeout" rather than "failed"
CI_COLUMNS = [f"ttft_{p}_{end}" for p in ("p50", "p90", "p99") for end in ("lo", "hi")]
# Figures that CPU-only trials (no NVML, no vLLM /metrics) do not record: "not recorded", never 0.
SIDE_FIGURES = {"timeout_rate": "timeout rate", "gpu0_util_mean": "GPU 0 utilisation (%)",
                "replica_cpu_util_mean": "replica CPU utilisation (%)", "frontend_share": "frontend share of TTFT"}


@dataclass(frozen=True)
class Slo:
    """Service-level objectives for goodput; ``source`` says where they came from (flags, the sweep)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    source: str = ""

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def describe(self) -> str:
        parts = [f"TTFT <= {self.ttft_s:g} s" if self.ttft_s is not None else "",
                 f"TPOT <= {self.tpot_s:g} s" if self.tpot_s is not None else ""]
        text = " and ".join(p for p in parts if p)
        return f"{text} (from {self.source})" if text and self.source else text or "none"


def merge_slo(flags: Slo, sweep: Slo) -> Slo:
    """Each target from the flags when given there, else from the sweep's ``slo:`` section."""
    ttft = flags.ttft_s if flags.ttft_s is not None else sweep.ttft_s
    tpot = flags.tpot_s if flags.tpot_s is not None else sweep.tpot_s
    from_sweep = (flags.ttft_s is None and sweep.ttft_s is not None) or (flags.tpot_s is None and sweep.tpot_s is not None)
    used = (("the command line", flags.given), (sweep.source or "the sweep", from_sweep))
    return Slo(ttft, tpot, " and ".join(name for name, on in used if on))


@dataclass(frozen=True)
class ReportOptions:
    """What the report is asked for: knee tolerance, SLOs, prices and the bootstrap's settings."""

    tolerance: float = 0.10
    slo: Slo = Slo()
    core_hour_usd: float | None = None
    gpu_hour_usd: float | None = None
    n_boot: int = stats.N_BOOT
    level: float = stats.LEVEL
    seed: int = 0
    knee_statistic: str = "p90"    # the figure the knee and its interval are decided on (analysis.knee says why)
    knee_level: float = 0.90

    @property
    def priced(self) -> bool:
        return self.prices is not None

    @property
    def prices(self) -> tuple[float, float] | None:
        """(core-hour, GPU-hour) in USD when both are set, else None."""
        if self.core_hour_usd is None or self.gpu_hour_usd is None:
            return None
        return self.core_hour_usd, self.gpu_hour_usd


def ttft_values(records: pd.DataFrame) -> np.ndarray:
    """TTFT seconds of ok requests with a first token: ``(first_token_ns - sent_ns) / 1e9`` (as
    ``workloads.metrics.ttft_s``)."""
    ok = records[(records["status"] == "ok") & records["first_token_ns"].notna()]
    return ((ok["first_token_ns"].astype("int64") - ok["sent_ns"].astype("int64")) / 1e9).to_numpy(np.float64)


def tpot_values(records: pd.DataFrame) -> np.ndarray:
    """Time per output token after the first, in seconds, of ok requests with two tokens or more:
    ``(end_ns - first_token_ns) / (completion_tokens - 1) / 1e9`` (as ``workloads.metrics.tpot_s``)."""
    ok = records[(records["status"] == "ok") & records["first_token_ns"].notna() & (records["completion_tokens"] > 1)]
    gen = ok["end_ns"].astype("int64") - ok["first_token_ns"].astype("int64")
    return (gen / (ok["completion_tokens"].astype("int64") - 1) / 1e9).to_numpy(np.float64)


def _window_values(trial_ids: Sequence[str], records: Mapping[str, pd.DataFrame],
                   values: Callable[[pd.DataFrame], np.ndarray] = ttft_values) -> list[np.ndarray]:
    """Each trial's (window's) ok requests' figures (TTFTs by default), for the trials that have records: what
    the intervals resample."""
    return [values(records[t]) for t in trial_ids if t in records]


def _slo_view(records: pd.DataFrame) -> list[Any]:
    """The records as ``RequestRecord`` values holding only what goodput and the window's span read (status,
    scheduled/sent/first-token/end times, completion tokens); the rest is left empty. Four times faster than
    ``frame_to_records`` on large sweeps, and never leaves this module."""
    cols = [records[c].tolist() for c in RECORD_COLUMNS]
    return [RequestRecord(request_id="", session_id="", turn=0, scheduled_ns=int(sched), sent_ns=int(sent),
                          first_token_ns=None if pd.isna(first) else int(first), token_ns=(), end_ns=int(end),
                          prompt_tokens=0, completion_tokens=int(tokens), cached_tokens=None, client_prompt_tokens=0,
                          tokenize_ns=0, status=str(status))  # type: ignore[arg-type] # checked by RequestRecord
            for status, sched, sent, first, end, tokens in zip(*cols)]


def slo_goodput(records: pd.DataFrame, slo: Slo) -> tuple[float, float]:
    """(requests per second meeting every SLO, share of requests meeting them); NaN without SLOs or records."""
    if not slo.given or records is None or not len(records):
        return math.nan, math.nan
    recs = _slo_view(records)
    good = goodput_count(recs, ttft_slo_s=slo.ttft_s, tpot_slo_s=slo.tpot_s)
    span = duration_s(recs)
    return (good / span if span > 0 else math.nan), good / len(recs)


def trial_table(trials: pd.DataFrame, records: Mapping[str, pd.DataFrame], slo: Slo) -> pd.DataFrame:
    """The trials, one row each, with ``records`` (how many were read) and the SLO goodput of each."""
    out = trials.copy()
    if out.empty:
        return out.assign(records=pd.Series(dtype="Int64"))
    got = [records.get(t) for t in out["trial_id"]]
    out["records"] = pd.array([len(r) if r is not None else None for r in got], dtype="Int64")
    pairs = [slo_goodput(r, slo) if r is not None else (math.nan, math.nan) for r in got]
    out["slo_goodput_rps"] = [p[0] for p in pairs]
    out["slo_met_share"] = [p[1] for p in pairs]
    return out.sort_values([c for c in (*CONFIG, "cores", "repeat") if c in out], na_position="first")


def _cell_label(row: pd.Series, failed_kinds: Sequence[str]) -> str:
    """``timeout`` / ``failed`` where the cell has no TTFT worth a number, else ``""``."""
    if row["status"] == "FAILED":
        return "timeout" if failed_kinds and all(k in TIMEOUT_KINDS for k in failed_kinds) else "failed"
    if pd.isna(row["ttft_p50_s"]):
        return "timeout" if row.get("timeouts", 0) and row["timeouts"] > 0 else "failed"
    if row.get("timeout_rate") is not None and row["timeout_rate"] > TIMEOUT_MAJORITY:
        return "timeout"
    return ""


def aggregated_table(trials: pd.DataFrame, records: Mapping[str, pd.DataFrame], opts: ReportOptions,
                     per_trial: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`report.comparison` with CI, frontend-share, SLO-goodput and heatmap-cell columns (see the module
    docstring). ``ci_repeats``/``ci_requests``: the completed repeats with records, and their ok requests.
    ``per_trial``: :func:`trial_table` of the same inputs, when the caller already has it."""
    table = comparison(trials, tolerance=opts.tolerance)
    if table.empty:
        return table.reindex(columns=[*COLUMNS, *CI_COLUMNS, "ci_repeats", "ci_requests", "frontend_share",
                                      "slo_goodput_rps", "slo_met_share", "cell"])
    per_trial = (per_trial if per_trial is not None else trial_table(trials, records, opts.slo)).set_index("trial_id")
    out = []
    for _, row in table.iterrows():
        ids = [t for t in str(row["trials"]).split(",") if t in per_trial.index]
        done = [t for t in ids if per_trial.at[t, "status"] == "COMPLETED"]
        samples = _window_values(done, records)
        key = "|".join(str(row[c]) for c in (*CONFIG, "cores"))
        ci = stats.bootstrap_quantiles(samples, QUANTILES, n_boot=opts.n_boot, level=opts.level,
                                       seed=stats.cell_seed(opts.seed, key))
        extra: dict[str, Any] = {}
        for p, iv in zip(("p50", "p90", "p99"), ci):
            extra[f"ttft_{p}_lo"], extra[f"ttft_{p}_hi"] = iv.low, iv.high
        extra["ci_repeats"] = sum(len(s) > 0 for s in samples)
        extra["ci_requests"] = int(sum(len(s) for s in samples))
        front, total = row.get("server_frontend_s_mean"), row.get("server_ttft_s_mean")
        extra["frontend_share"] = front / total if pd.notna(front) and pd.notna(total) and total > 0 else math.nan
        extra["slo_goodput_rps"] = per_trial.loc[done, "slo_goodput_rps"].mean() if done else math.nan
        extra["slo_met_share"] = per_trial.loc[done, "slo_met_share"].mean() if done else math.nan
        failed = [str(per_trial.at[t, "error_kind"]) for t in ids if per_trial.at[t, "status"] != "COMPLETED"]
        extra["cell"] = _cell_label(row, failed)
        out.append(extra)
    return pd.concat([table.reset_index(drop=True), pd.DataFrame(out)], axis=1)


def knee_windows(rows: pd.DataFrame, records: Mapping[str, pd.DataFrame], per_trial: pd.DataFrame,
                 values: Callable[[pd.DataFrame], np.ndarray] = ttft_values) -> dict[int, list[np.ndarray]]:
    """One configuration's windows for :func:`orchestrator.observe.analysis.knee.estimate_knee`: per core
    count that counts for the knee (a TTFT p50, most requests answered: ``report.comparison``'s rule), the
    ok requests' figures (``values``: TTFTs, or :func:`tpot_values`) of each completed trial with records."""
    status = per_trial.set_index("trial_id")["status"] if len(per_trial) else pd.Series(dtype=object)
    out: dict[int, list[np.ndarray]] = {}
    for _, row in rows.iterrows():
        rate = row.get("timeout_rate")
        if pd.isna(row.get("ttft_p50_s")) or (pd.notna(rate) and rate > TIMEOUT_MAJORITY):
            continue
        done = [t for t in str(row["trials"]).split(",") if status.get(t) == "COMPLETED"]
        windows = [v for v in _window_values(done, records, values) if len(v)]
        if windows:
            out[int(row["cores"])] = windows
    return out


def configurations(table: pd.DataFrame) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """(configuration key, its rows sorted by cores), in the table's order."""
    if table.empty:
        return []
    groups = table.groupby(CONFIG, dropna=False, sort=True)
    return [(key if isinstance(key, tuple) else (key,), g.sort_values("cores")) for key, g in groups]


def config_labels(table: pd.DataFrame) -> dict[tuple[Any, ...], str]:
    """A short name per configuration: its model and workload, then ``factor=value`` for every other factor
    that differs between the sweep's configurations."""
    keys = [k for k, _ in configurations(table)]
    varying = ["model", "workload", *(c for i, c in enumerate(CONFIG)
                                      if c not in ("model", "workload") and len({k[i] for k in keys}) > 1)]
    labels = {}
    for k in keys:
        parts = [str(k[CONFIG.index(c)]) if c in ("model", "workload") else f"{c}={k[CONFIG.index(c)]}"
                 for c in varying]
        labels[k] = " ".join(parts)
    return labels


def knee(rows: pd.DataFrame) -> int | None:
    """The observed knee of one configuration's rows (:func:`report.comparison`'s ``knee`` mark)."""
    marked = rows[rows["knee"] == "<- knee"]["cores"]
    return int(marked.iloc[0]) if len(marked) else None


def heatmap_table(table: pd.DataFrame) -> pd.DataFrame:
    """Rows: configurations (by :func:`config_labels`); columns: cores; cells: ``"2.31"`` (the speedup),
    ``timeout``, ``failed``, or ``""`` where that core count was not in the configuration's grid."""
    labels = config_labels(table)
    cores = sorted({int(c) for c in table["cores"]}) if len(table) else []
    rows = {}
    for key, g in configurations(table):
        cells = {c: "" for c in cores}
        for _, r in g.iterrows():
            cells[int(r["cores"])] = r["cell"] or ("" if pd.isna(r["speedup_p50"]) else f"{r['speedup_p50']:.2f}")
        rows[labels[key]] = cells
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=cores)
    frame.index.name = "configuration"
    return frame


__all__ = ["CI_COLUMNS", "QUANTILES", "RECORD_COLUMNS", "SIDE_FIGURES", "ReportOptions", "Slo", "aggregated_table",
           "config_labels", "configurations", "heatmap_table", "knee", "merge_slo", "slo_goodput", "trial_table",
           "tpot_values", "ttft_values"]
