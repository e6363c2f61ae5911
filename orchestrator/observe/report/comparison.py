"""Paper-style tables from trial results (pure), and their rendering.

- TTFT against cores, per configuration (trials that differ only in cores), its repeats
  aggregated: the median of their figures, and their spread, flagged above 10%.
- Speedup: TTFT p50 at the group's fewest cores divided by TTFT p50 here
  (the paper reports 1.47-7.11x between starved and adequate cores).
- Knee: the fewest cores whose TTFT p50 is within ``tolerance`` of the group's best.
- A core count where most requests timed out (``timeout_rate > TIMEOUT_MAJORITY``) gets neither a
  speedup nor the knee: its TTFT describes the few requests that finished, not the configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
from rich.table import Table

from orchestrator.observe.analysis.drift import repeat_drift
from orchestrator.values import figures
from orchestrator.values.figures import Agg, Kind

# A configuration: the factors other than cores and the repeat index. Repeats are aggregated.
CONFIG = ["model", "hardware", "gpus", "vllm_variant", "api_servers", "stack", "workload", "text_style", "restriction",
          "start"]
GROUP = [*CONFIG, "repeat"]  # one trial's identity apart from cores (the raw frames keep the repeat)
SPREAD_WARN = 0.10
SEARCH_PARAMS = tuple(f.key for f in figures.of_kind(Kind.PARAM) if f.when == "search")  # a knee search trial's
TIMEOUT_MAJORITY = 0.5
# The table's columns, and how repeats aggregate each: from the catalogue (orchestrator.values.figures)
COLUMNS = [*CONFIG, *figures.columns()]
# Attribution (orchestrator.node.attribution, .stacks): one column per process role and category, as recorded
ATTRIBUTION_PREFIXES = ("cpu_s_per_req_", "ctx_invol_", "ctx_vol_", "runq_wait_s_", "gpu_profile_")
_MEDIANS = figures.aggregated(Agg.MEDIAN)
_SUMS = figures.aggregated(Agg.SUM)
_MEANS = figures.aggregated(Agg.MEAN)


def attribution_columns(df: pd.DataFrame) -> list[str]:
    """The attribution metrics the trials of ``df`` have (per role, per stack category), sorted."""
    return sorted(c for c in df.columns if c.startswith(ATTRIBUTION_PREFIXES))


def results_frame(trials: Sequence[Any], results: Iterable[Any]) -> pd.DataFrame:
    """One row per trial: its factors, status and summary metrics (trials without a result are left out)."""
    by_id = {r.trial_id: r for r in results}
    rows = []
    for t in trials:
        r = by_id.get(t.trial_id)
        if r is None:
            continue
        rows.append({"trial_id": t.trial_id, **t.factors(), "status": r.status.value,
                     "error_kind": r.error_kind.value, **r.metrics})
    return pd.DataFrame(rows)


def trial_row(params: Mapping[str, Any], tags: Mapping[str, Any], metrics: Mapping[str, Any],
              finished: bool) -> dict[str, Any]:
    """One row of :func:`runs_frame` from a tracked trial's params, tags and metrics (params are strings)."""
    row = {"trial_id": tags["trial_id"], **{k: params.get(k) for k in GROUP}, "cores": int(params.get("cores", 0)),
           "status": "COMPLETED" if finished else "FAILED", "error_kind": tags.get("error_kind", ""),
           **{k: v for k, v in metrics.items() if not str(k).startswith("ts/")}}
    for k in SEARCH_PARAMS:  # a knee search's trial: why it ran, and when (orchestrator.control.search)
        if params.get(k) is not None:
            row[k] = params[k]
    row["api_servers"] = row.get("api_servers") or "1"  # runs from before the axis existed
    row["stack"] = row.get("stack") or "vllm"
    for k in ("gpus", "repeat", "api_servers"):
        row[k] = int(row[k]) if row.get(k) is not None else None
    return row


def runs_frame(runs: Iterable[Any]) -> pd.DataFrame:
    """Rows like :func:`results_frame`, from MLflow child runs (params are strings there)."""
    rows = []
    for r in runs:
        tags = r.data.tags
        if "trial_id" not in tags or tags.get("superseded") == "true":
            continue
        rows.append(trial_row(r.data.params, tags, r.data.metrics, r.info.status == "FINISHED"))
    return pd.DataFrame(rows)


def payloads_frame(payloads: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows like :func:`runs_frame`, from outbox trial payloads (``outbox.trial_payload``) not uploaded yet."""
    return pd.DataFrame([trial_row(p["params"], p["tags"], p["metrics"], p["status"] == "FINISHED")
                         for p in payloads])


def aggregate(df: pd.DataFrame, spread_warn: float = SPREAD_WARN) -> pd.DataFrame:
    """One row per configuration and core count, over its repeats (pure).

    - TTFT/E2E percentiles: the median over the repeats' completed trials of each trial's figure.
    - ``p50_spread = (max - min) / median`` of the repeats' TTFT p50 (0 with one repeat);
      ``spread_flag`` is ``"!"`` where it exceeds ``spread_warn``: those repeats disagree, so the
      configuration's figure is not a measurement yet.
    - requests and timeouts: sums; the other figures: means. ``status``: COMPLETED when every
      repeat completed, FAILED when none did, else ``"<ok>/<n> ok"``.
    """
    if df.empty:
        return df.reindex(columns=[c for c in COLUMNS if c not in ("speedup_p50", "knee")])
    df = df.copy()
    means = [*_MEANS, *attribution_columns(df)]
    for col in CONFIG:  # a factor the trials do not record is "-", never NaN (NaN keys never match)
        df[col] = df[col].fillna("-") if col in df else "-"
    for col in COLUMNS:
        if col not in df and col not in ("repeats", "trials", "p50_spread", "spread_flag", "speedup_p50", "knee"):
            df[col] = float("nan")
    rows = []
    for key, g in df.groupby([*CONFIG, "cores"], dropna=False, sort=True):
        ok = g[g["status"] == "COMPLETED"]
        row: dict[str, Any] = dict(zip([*CONFIG, "cores"], key))
        row["repeats"] = len(g)
        row["trials"] = ",".join(g["trial_id"].astype(str))
        row["status"] = ("COMPLETED" if len(ok) == len(g) else "FAILED" if ok.empty else f"{len(ok)}/{len(g)} ok")
        for c in _SUMS:
            row[c] = g[c].sum(min_count=1)
        for c in _MEDIANS:
            row[c] = ok[c].median()
        for c in means:
            row[c] = pd.to_numeric(ok[c], errors="coerce").mean()
        p50 = ok["ttft_p50_s"].dropna()
        row["p50_spread"] = (p50.max() - p50.min()) / p50.median() if len(p50) and p50.median() > 0 else float("nan")
        row["spread_flag"] = "!" if row["p50_spread"] > spread_warn else ""
        rows.append(row)
    return pd.DataFrame(rows)


def comparison(df: pd.DataFrame, tolerance: float = 0.10, spread_warn: float = SPREAD_WARN) -> pd.DataFrame:
    """:func:`aggregate`, plus ``speedup_p50`` and ``knee`` per configuration (trials that differ only in cores).

    Speedup: TTFT p50 at the configuration's fewest cores / TTFT p50 here. Knee: the fewest cores whose
    TTFT p50 is within ``tolerance`` of the configuration's best. Core counts without a TTFT p50, or
    where most requests timed out (see the module docstring), are left out of both.
    """
    df = aggregate(df, spread_warn)
    columns = [*COLUMNS, *attribution_columns(df)]
    if df.empty:
        return df.reindex(columns=columns)
    df["speedup_p50"] = float("nan")
    df["knee"] = ""
    for _, idx in df.groupby(CONFIG, dropna=False).groups.items():
        g = df.loc[idx].sort_values("cores")
        ok = g[g["ttft_p50_s"].notna() & ~(g["timeout_rate"] > TIMEOUT_MAJORITY)]
        if ok.empty:
            continue
        base = ok.iloc[0]["ttft_p50_s"]
        df.loc[ok.index, "speedup_p50"] = base / ok["ttft_p50_s"]
        best = ok["ttft_p50_s"].min()
        knee_cores = ok[ok["ttft_p50_s"] <= best * (1 + tolerance)]["cores"].min()
        df.loc[g.index, "knee"] = (g["cores"] == knee_cores).map({True: "<- knee", False: ""})
    return df.sort_values([*CONFIG, "cores"]).reindex(columns=columns)


def spread_warnings(table: pd.DataFrame, spread_warn: float = SPREAD_WARN) -> list[str]:
    """One line per configuration whose repeats disagree by more than ``spread_warn`` at TTFT p50."""
    out = []
    for _, r in table[table["spread_flag"] == "!"].iterrows():
        out.append(f"{r['model']} {r['workload']} cores={r['cores']}: {int(r['repeats'])} repeats disagree by "
                   f"{r['p50_spread']:.0%} at TTFT p50 (more than {spread_warn:.0%}); trials {r['trials']}")
    return out


def drift_warning(df: pd.DataFrame) -> str | None:
    """The sentence that says the sweep's repeats moved together in every configuration (the machine drifted,
    :mod:`orchestrator.observe.analysis.drift`), over its completed trials; None where they did not, or where the
    test does not apply."""
    if df.empty or "status" not in df:
        return None
    found = repeat_drift(df[df["status"] == "COMPLETED"], [c for c in CONFIG if c in df] + ["cores"])
    return found.sentence() if found is not None and found.drifted else None


def calibration(df: pd.DataFrame) -> pd.DataFrame:
    """Each start mode against ``fresh`` at the same cores (repin: a live replica re-pinned down; sized: a
    start on more cores with pools sized for these, then pinned): TTFT p50/p90 (median over repeats) of
    both, their ratios (mode / fresh), the fresh repeats' p50 spread ((max - min) / median), and whether
    both ratios lie within 10% and within that noise (``within_10pct``, ``within_noise``)."""
    keys = [c for c in CONFIG if c in df and c != "start"] + ["cores"]
    if df.empty or "start" not in df or "fresh" not in set(df["start"]) or len(set(df["start"])) < 2:
        return pd.DataFrame()
    ok = df[df["status"] == "COMPLETED"]
    if ok.empty or "ttft_p50_s" not in ok:
        return pd.DataFrame()
    cols = [c for c in ("ttft_p50_s", "ttft_p90_s") if c in ok]
    med = ok.groupby(keys + ["start"], dropna=False)[cols].median().reset_index()
    spread = ok[ok["start"] == "fresh"].groupby(keys, dropna=False)["ttft_p50_s"].agg(
        lambda x: (x.max() - x.min()) / x.median() if len(x) > 1 and x.median() > 0 else float("nan"))
    fresh = med[med["start"] == "fresh"].drop(columns="start").merge(
        spread.rename("fresh_p50_spread").reset_index(), on=keys, how="left")
    out = med[med["start"] != "fresh"].merge(fresh, on=keys, suffixes=("", "_fresh"))
    out["p50_ratio"] = out["ttft_p50_s"] / out["ttft_p50_s_fresh"]
    out["p90_ratio"] = (out["ttft_p90_s"] / out["ttft_p90_s_fresh"]) if "ttft_p90_s" in out else float("nan")
    worst = (out[["p50_ratio", "p90_ratio"]] - 1).abs().max(axis=1)
    out["within_10pct"] = worst <= 0.10
    out["within_noise"] = worst <= out["fresh_p50_spread"].fillna(0.0)
    lead = keys + ["start", "ttft_p50_s_fresh", "ttft_p50_s", "ttft_p90_s_fresh", "ttft_p90_s"]
    return out[[c for c in lead if c in out] + ["p50_ratio", "p90_ratio", "fresh_p50_spread", "within_10pct",
                                                 "within_noise"]].reset_index(drop=True)


# Reference clients of the cross-check: name -> (TTFT p50 column, TTFT p90 column) in a trial's metrics
REFERENCES = {"harness": ("crosscheck_ttft_p50_harness_s", "crosscheck_ttft_p90_harness_s"),
              "bare": ("crosscheck_ttft_p50_bare_s", "crosscheck_ttft_p90_bare_s"),
              "vllm_bench": ("crosscheck_vllm_bench_ttft_p50_s", "crosscheck_vllm_bench_ttft_p90_s")}


def references(df: pd.DataFrame) -> pd.DataFrame:
    """The harness against the clients nobody here wrote, per configuration and cores (pure).

    For each of ``harness``, ``bare`` (the bare client) and ``vllm_bench`` (``vllm bench serve`` on the
    prompts the harness sent): TTFT p50 and p90, each the median over the repeats that ran it, and the
    spread of its p50 over repeats ((max - min) / median); ``harness_vs_bare`` and ``harness_vs_vllm_bench``,
    the medians of the per-repeat p50 ratios; ``repeats``; and the window's GPU utilisation (median)."""
    cols = [c for pair in REFERENCES.values() for c in pair]
    if df.empty or "crosscheck_ttft_p50_bare_s" not in df:
        return pd.DataFrame()
    ok = df[(df["status"] == "COMPLETED") & df["crosscheck_ttft_p50_bare_s"].notna()].copy()
    if ok.empty:
        return pd.DataFrame()
    for c in cols:
        if c not in ok:
            ok[c] = float("nan")
    keys = [c for c in CONFIG if c in ok] + ["cores"]
    ok["harness_vs_bare"] = ok["crosscheck_ttft_p50_harness_s"] / ok["crosscheck_ttft_p50_bare_s"]
    ok["harness_vs_vllm_bench"] = ok["crosscheck_ttft_p50_harness_s"] / ok["crosscheck_vllm_bench_ttft_p50_s"]

    def spread(x: pd.Series) -> float:
        x = x.dropna()
        return (x.max() - x.min()) / x.median() if len(x) > 1 and x.median() > 0 else float("nan")

    agg: dict[str, Any] = {c: "median" for c in cols + ["harness_vs_bare", "harness_vs_vllm_bench"]}
    if "gpu0_util_mean" in ok:
        agg["gpu0_util_mean"] = "median"
    grouped = ok.groupby(keys, dropna=False)
    out = grouped.agg(agg)
    for name, (p50, _) in REFERENCES.items():
        out[f"{name}_p50_spread"] = grouped[p50].agg(spread)
    out["repeats"] = grouped.size()
    out = out.reset_index().rename(columns={c: f"{name}_{q}_s" for name, pair in REFERENCES.items()
                                            for c, q in zip(pair, ("p50", "p90"))})
    lead = keys + ["repeats"] + [f"{n}_{q}_s" for q in ("p50", "p90") for n in REFERENCES]
    rest = ["harness_vs_bare", "harness_vs_vllm_bench"] + [f"{n}_p50_spread" for n in REFERENCES]
    out = out[lead + rest + (["gpu0_util_mean"] if "gpu0_util_mean" in out else [])]
    return out.dropna(axis=1, how="all").reset_index(drop=True)


def costs(df: pd.DataFrame, *, core_hour_usd: float, gpu_hour_usd: float) -> pd.DataFrame:
    """The cost of cores against the cost of GPUs, per trial.

    - ``hourly_usd = cores * core_hour_usd + gpus * gpu_hour_usd``
    - ``core_share = cores * core_hour_usd / hourly_usd`` (what the CPU side adds to the bill)
    - ``usd_per_1k_requests = hourly_usd / (request_throughput_rps * 3600) * 1000``

    Adding cores raises the hourly bill a little; if it raises throughput more, each request
    gets cheaper. Prices are the user's (their cloud's or cluster's), never built in.
    """
    if df.empty:
        return df
    out = df[[c for c in ("trial_id", *GROUP, "cores", "status", "ttft_p50_s", "request_throughput_rps")
              if c in df]].copy()
    gpus = out["gpus"].fillna(0).astype(float) if "gpus" in out else 0.0
    out["hourly_usd"] = out["cores"] * core_hour_usd + gpus * gpu_hour_usd
    out["core_share"] = out["cores"] * core_hour_usd / out["hourly_usd"]
    rps = out.get("request_throughput_rps", pd.Series(float("nan"), index=out.index))
    out["usd_per_1k_requests"] = out["hourly_usd"] / (rps * 3600) * 1000
    return out


def render(df: pd.DataFrame, title: str = "Comparison") -> Any:
    """A rich Table of :func:`comparison`'s output, with only the columns that answer "what do cores buy":
    the configuration, cores, TTFT p50 (ms) with its interval, the speedup, timeouts and the knee (the
    rest is in the report and the CSV). It fits 120 columns.

    The configuration is ``df["configuration"]`` when given (a label per row), else model and workload.
    The interval is ``ttft_p50_lo``..``ttft_p50_hi`` when ``df`` has them (whichever interval the caller
    computed; ``[lo-hi]``), and a ``!`` marks repeats that disagree (``spread_flag``). A configuration
    whose trials all failed reads ``failed``; one where only some did, ``n/m ok``."""
    table = Table(title=title)
    for c in ("configuration", "cores", "TTFT p50 ms", "speedup", "timeouts", "knee"):
        table.add_column(c, justify="left" if c == "configuration" else "right",
                         overflow="fold" if c == "configuration" else "ellipsis")

    def ms(v: Any) -> str:
        return "-" if pd.isna(v) else f"{1000 * v:.1f}"

    def count(v: Any) -> str:
        return "-" if pd.isna(v) else f"{int(v)}"

    for _, r in df.iterrows():
        config = r["configuration"] if "configuration" in df else f"{r['model']} {r['workload']}"
        if r["status"] == "FAILED":
            p50 = "failed"
        else:
            p50 = ms(r["ttft_p50_s"])
            lo, hi = r.get("ttft_p50_lo", float("nan")), r.get("ttft_p50_hi", float("nan"))
            if pd.notna(r["ttft_p50_s"]) and pd.notna(lo) and pd.notna(hi):
                p50 += f" [{ms(lo)}-{ms(hi)}]"
            p50 += str(r["spread_flag"] or "") + ("" if r["status"] == "COMPLETED" else f" ({r['status']})")
        timeouts = count(r["timeouts"]) + ("" if pd.isna(r["requests"]) else f"/{count(r['requests'])}")
        table.add_row(str(config), str(r["cores"]), p50,
                      "-" if pd.isna(r["speedup_p50"]) else f"{r['speedup_p50']:.2f}x", timeouts, r["knee"])
    return table


__all__ = ["ATTRIBUTION_PREFIXES", "CONFIG", "GROUP", "SEARCH_PARAMS", "TIMEOUT_MAJORITY", "aggregate", "attribution_columns", "calibration", "comparison", "costs", "drift_warning", "payloads_frame",
           "render", "results_frame", "runs_frame", "spread_warnings", "trial_row"]
