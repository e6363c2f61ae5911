"""A knee search's tables (pure): why each trial ran, and what the search cost against a grid.

A search trial records its ``search_reason`` ("most cores", "fewest cores", "bisect", "narrow the
interval", ...), its ``search_step`` (1, 2, ... within its configuration) and the configuration's grid
core counts (``search_grid_cores``) as params (``orchestrator.control.search``). From the per-trial table
(``tables.trial_table``):

- :func:`why_table`: one row per search trial, in the order they ran: its configuration, step, cores,
  repeat, reason, status and held seconds;
- :func:`cost_table`: per configuration, the GPU-seconds spent (each trial's held seconds times its GPUs;
  a CPU trial's once) against an estimate of a 3-repeat grid of the same configuration and start mode. A
  trial that started vLLM records ``startup_s``; the rest of a trial is its window (with the time around
  it). The grid runs the grid's core counts x 3 windows of the search's mean window seconds, and pays the
  starts the search paid (a re-pinned or shared replica: one per start, the same as the search), or one
  start per trial when every search trial started its own (``start: fresh``).

  Before 2026-12-04 the grid was the mean *trial* x core counts x 3: with a re-pinned replica that
  charged the grid the search's one start again for every 6 or so trials. On the H200 search of that
  day (6 trials, a cold start of 226 s) it read 29% of the grid; counted as above, 61%.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from orchestrator.observe.report.comparison import CONFIG

GRID_REPEATS = 3
WHY_COLUMNS = ["configuration", "step", "cores", "repeat", "reason", "status", "trial_s", "trial_id"]
COST_COLUMNS = ["configuration", "trials", "gpus", "spent_gpu_s", "starts", "start_s", "mean_window_s",
                "grid_core_counts", "grid_x3_gpu_s", "share_of_grid"]


def _label(row: Mapping[str, Any], labels: Mapping[tuple[Any, ...], str]) -> str:
    key = tuple("-" if pd.isna(row.get(c)) else row.get(c) for c in CONFIG)
    return labels.get(key, " / ".join(map(str, key)))


def why_table(per_trial: pd.DataFrame, labels: Mapping[tuple[Any, ...], str]) -> pd.DataFrame:
    """The search trials of ``per_trial``, in the order each configuration's search ran them; empty for a grid."""
    if per_trial.empty or "search_reason" not in per_trial:
        return pd.DataFrame(columns=WHY_COLUMNS)
    t = per_trial[per_trial["search_reason"].notna()]
    rows = [{"configuration": _label(r, labels), "step": int(r["search_step"]), "cores": int(r["cores"]),
             "repeat": None if pd.isna(r.get("repeat")) else int(r["repeat"]), "reason": r["search_reason"],
             "status": r["status"], "trial_s": r.get("trial_duration_s", float("nan")),
             "trial_id": r["trial_id"], "_gpus": int(r["gpus"]) if pd.notna(r.get("gpus")) else 0,
             "_grid": r.get("search_grid_cores") or "", "_startup_s": r.get("startup_s", float("nan"))}
            for r in t.to_dict("records")]
    if not rows:
        return pd.DataFrame(columns=WHY_COLUMNS)
    frame = pd.DataFrame(rows).sort_values(["configuration", "step"], kind="stable").reset_index(drop=True)
    return frame


def cost_table(why: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: what its search spent against a 3-repeat grid's estimate (see the module docstring)."""
    if why.empty or "_gpus" not in why:
        return pd.DataFrame(columns=COST_COLUMNS)
    rows = []
    for label, g in why.groupby("configuration", sort=False):
        gpus = max(int(g["_gpus"].max()), 1)
        seconds = pd.to_numeric(g["trial_s"], errors="coerce")
        startup = pd.to_numeric(g["_startup_s"], errors="coerce") if "_startup_s" in g else seconds * float("nan")
        started = startup.notna() & (startup > 0)
        window = float((seconds - startup.where(started, 0.0)).clip(lower=0.0).mean())
        counts = len(str(g["_grid"].iloc[-1]).split()) or g["cores"].nunique()
        windows = counts * GRID_REPEATS
        # every trial a start (fresh): the grid starts for each of its trials; else the starts the search paid
        starts = windows if started.all() else int(started.sum())
        start_s = float(startup[started].mean()) if started.any() else 0.0
        spent = float(seconds.sum()) * gpus
        grid = (windows * window + starts * start_s) * gpus
        rows.append({"configuration": label, "trials": len(g), "gpus": int(g["_gpus"].max()), "spent_gpu_s": spent,
                     "starts": int(started.sum()), "start_s": start_s, "mean_window_s": window,
                     "grid_core_counts": counts, "grid_x3_gpu_s": grid,
                     "share_of_grid": spent / grid if grid > 0 else float("nan")})
    return pd.DataFrame(rows, columns=COST_COLUMNS)


def visible(why: pd.DataFrame) -> pd.DataFrame:
    """The why table as written and shown (its helper columns dropped)."""
    return why.reindex(columns=WHY_COLUMNS)


__all__ = ["COST_COLUMNS", "GRID_REPEATS", "WHY_COLUMNS", "cost_table", "visible", "why_table"]
