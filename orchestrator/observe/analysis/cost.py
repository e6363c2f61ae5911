"""What the knee costs: a starved configuration, its knee, and one more GPU instead of cores (pure).

For one configuration (trials that differ only in cores), three options:

- ``starved``: the fewest cores tested;
- ``knee``: the fewest cores whose TTFT p50 is within ``tolerance`` of the best (as in
  ``orchestrator.observe.report.comparison``);
- ``one more GPU``: the starved cores with ``gpus + 1``, what a cluster that hands out cores per
  GPU reaches for instead of cores.

Each option's price, from the user's prices (never built in):

- ``usd_per_hour = cores * core_hour_usd + gpus * gpu_hour_usd``
- ``usd_per_1k_requests = usd_per_hour / (request_throughput_rps * 3600) * 1000``
- ``vs_starved = usd_per_1k_requests / the starved option's`` (the knee's is the cost ratio knee/starved)

The GPU option is measured only when the sweep ran it: a configuration equal but for ``gpus + 1``
with a trial at the starved cores, found in ``table``. Otherwise its TTFT stays empty
(``measured`` is False) and its cost per request assumes the starved option's throughput, which
the note states: the cores, not the GPU, limit that replica, and with one more GPU the same cores
must also feed one more worker.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from orchestrator.observe.report.comparison import CONFIG

OUT_COLUMNS = ["option", "cores", "gpus", "usd_per_hour", "request_throughput_rps", "usd_per_1k_requests",
               "ttft_p50_s", "measured", "vs_starved", "note"]
_NAN = float("nan")


def _check(config_rows: pd.DataFrame, core_hour_usd: float, gpu_hour_usd: float, tolerance: float) -> None:
    for name, v in (("core_hour_usd", core_hour_usd), ("gpu_hour_usd", gpu_hour_usd), ("tolerance", tolerance)):
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    for col in ("cores", "gpus"):
        if col not in config_rows:
            raise ValueError(f"config_rows: missing column {col!r}")
    if config_rows.empty:
        raise ValueError("config_rows: no rows (one row per core count of one configuration)")
    for col in CONFIG:
        if col in config_rows and config_rows[col].nunique(dropna=False) > 1:
            values = ", ".join(str(v) for v in config_rows[col].drop_duplicates())
            raise ValueError(f"config_rows hold more than one configuration: column {col!r} takes {values}")


def _point(rows: pd.DataFrame) -> tuple[float, float]:
    """TTFT p50 (median over the completed rows) and throughput (their mean) of the rows at one core count."""
    ttft = pd.to_numeric(rows.get("ttft_p50_s", pd.Series(_NAN, index=rows.index)), errors="coerce")
    rps = pd.to_numeric(rows.get("request_throughput_rps", pd.Series(_NAN, index=rows.index)), errors="coerce")
    ok = ttft.notna()
    if "status" in rows:
        ok &= rows["status"].astype(str) != "FAILED"
    t, r = ttft[ok].median(), rps[ok & (rps > 0)].mean()
    return (_NAN if pd.isna(t) else float(t)), (_NAN if pd.isna(r) else float(r))


def _same_but_gpus(table: pd.DataFrame, like: pd.Series, gpus: int, cores: int) -> pd.DataFrame:
    """Rows of ``table`` of the configuration ``like`` with ``gpus`` GPUs, at ``cores``."""
    if "cores" not in table or "gpus" not in table:
        return table.iloc[:0]
    sel = (pd.to_numeric(table["gpus"], errors="coerce") == gpus) & (pd.to_numeric(table["cores"],
                                                                                   errors="coerce") == cores)
    for col in CONFIG:
        if col == "gpus" or col not in like.index:
            continue
        if col not in table:
            return table.iloc[:0]
        v = like[col]
        sel &= table[col].isna() if pd.isna(v) else table[col].astype(str) == str(v)
    return table[sel]


def _n(cores: int) -> str:
    return f"{cores} core" if cores == 1 else f"{cores} cores"


def _ms(v: float) -> str:
    return f"{1000 * v:.0f} ms"


def knee_costs(config_rows: pd.DataFrame, *, core_hour_usd: float, gpu_hour_usd: float, tolerance: float = 0.10,
               table: pd.DataFrame | None = None) -> pd.DataFrame:
    """The starved, knee and one-more-GPU options of one configuration, priced (see the module docstring).

    ``config_rows``: the comparison rows of one configuration (repeats, if raw trial rows are given,
    fold into the median TTFT p50 and mean throughput per core count). ``table``: the sweep's whole
    comparison, searched for the trial with one more GPU at the starved cores. Raises ValueError
    naming the bad argument or column.
    """
    _check(config_rows, core_hour_usd, gpu_hour_usd, tolerance)
    like = config_rows.iloc[0]
    g = pd.to_numeric(pd.Series([like["gpus"]]), errors="coerce").iloc[0]
    if pd.isna(g):
        raise ValueError(f"config_rows: column 'gpus' holds {like['gpus']!r}, not a number")
    gpus = int(g)
    cores_col = pd.to_numeric(config_rows["cores"], errors="coerce")
    if cores_col.isna().any():
        raise ValueError("config_rows: column 'cores' holds a value that is not a number")
    points = {int(c): _point(config_rows[cores_col == c]) for c in sorted(cores_col.unique())}

    def price(cores: int, g: int, rps: float) -> tuple[float, float]:
        hourly = cores * core_hour_usd + g * gpu_hour_usd
        return hourly, (hourly / (rps * 3600) * 1000 if rps > 0 else _NAN)

    rows: list[dict[str, Any]] = []
    starved = min(points)
    s_ttft, s_rps = points[starved]
    hourly, per_1k = price(starved, gpus, s_rps)
    note = ("the fewest cores tested" if not math.isnan(s_ttft)
            else f"the fewest cores tested; no completed trial at {_n(starved)}, so no throughput to price")
    rows.append({"option": "starved", "cores": starved, "gpus": gpus, "usd_per_hour": hourly,
                 "request_throughput_rps": s_rps, "usd_per_1k_requests": per_1k, "ttft_p50_s": s_ttft,
                 "measured": not math.isnan(s_ttft), "note": note})

    done = {c: p for c, p in points.items() if not math.isnan(p[0])}
    if done:
        best = min(p[0] for p in done.values())
        knee = min(c for c, p in done.items() if p[0] <= best * (1 + tolerance))
        k_ttft, k_rps = done[knee]
        hourly, per_1k = price(knee, gpus, k_rps)
        note = (f"the fewest cores within {tolerance:.0%} of the best TTFT p50 ({_ms(best)})"
                + ("; the fewest cores tested are already there" if knee == starved else ""))
        rows.append({"option": "knee", "cores": knee, "gpus": gpus, "usd_per_hour": hourly,
                     "request_throughput_rps": k_rps, "usd_per_1k_requests": per_1k, "ttft_p50_s": k_ttft,
                     "measured": True, "note": note})
    else:
        rows.append({"option": "knee", "cores": None, "gpus": gpus, "usd_per_hour": _NAN,
                     "request_throughput_rps": _NAN, "usd_per_1k_requests": _NAN, "ttft_p50_s": _NAN,
                     "measured": False, "note": "no core count has a completed trial, so there is no knee"})

    more = _same_but_gpus(table, like, gpus + 1, starved) if table is not None else pd.DataFrame()
    if not more.empty:
        g_ttft, g_rps = _point(more)
        hourly, per_1k = price(starved, gpus + 1, g_rps)
        note = (f"measured: the sweep's trial with {gpus + 1} GPUs at {_n(starved)}"
                + ("" if not math.isnan(g_ttft) else ", which did not complete"))
        rows.append({"option": "one more GPU", "cores": starved, "gpus": gpus + 1, "usd_per_hour": hourly,
                     "request_throughput_rps": g_rps, "usd_per_1k_requests": per_1k, "ttft_p50_s": g_ttft,
                     "measured": True, "note": note})
    else:
        hourly, per_1k = price(starved, gpus + 1, s_rps)
        rows.append({"option": "one more GPU", "cores": starved, "gpus": gpus + 1, "usd_per_hour": hourly,
                     "request_throughput_rps": _NAN, "usd_per_1k_requests": per_1k, "ttft_p50_s": _NAN,
                     "measured": False,
                     "note": (f"not measured: the sweep has no trial with {gpus + 1} GPUs at {_n(starved)}, so its "
                              f"TTFT is unknown; the cost per request assumes the starved throughput, since the "
                              f"cores, not the GPU, limit that replica, and the same cores would feed one more "
                              f"worker")})

    out = pd.DataFrame(rows)
    base = out.loc[0, "usd_per_1k_requests"]
    out["vs_starved"] = out["usd_per_1k_requests"] / base if base > 0 else _NAN
    return out.reindex(columns=OUT_COLUMNS)


def knee_cost_ratio(costs: pd.DataFrame) -> float | None:
    """The knee's cost per request over the starved one's, from :func:`knee_costs`; None where either is unknown."""
    v = costs.loc[costs["option"] == "knee", "vs_starved"]
    return None if v.empty or pd.isna(v.iloc[0]) else float(v.iloc[0])


__all__ = ["OUT_COLUMNS", "knee_cost_ratio", "knee_costs"]
