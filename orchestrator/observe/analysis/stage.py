"""Which stage saturates first as one configuration's cores shrink: the decision, without its sentences (pure).

Between a request's arrival and its first token three stages can hold it, and each starves
differently:

- **frontend**: the API server's tokenization and request handling, one thread per API server.
  Its share of server TTFT is ``server_frontend_s_mean`` (server TTFT minus queue and prefill).
  If it grows as cores shrink, cores fix it. If it is most of TTFT even at the most cores, with
  cores to spare and few of the requests in flight running in the engine, the requests wait for
  that one thread: more cores do not help, more API servers (the ``api_servers`` axis) may.
- **engine**: the engine core's loop (scheduling, kernel launches, the shared-memory broadcast to
  the GPU workers). TTFT grows as cores shrink, but the added time is queue and prefill, not
  frontend; the replica's cores are busy. Cores fix it.
- **gpu**: TTFT stays flat across core counts while the GPU is busy. Cores do not fix it.

:func:`decide` reads the comparison rows of one configuration (``orchestrator.observe.report.comparison``:
one row per core count), or its raw trial rows (one per trial; repeats are folded here the same
way: the median TTFT p50, the mean of the other figures). Columns it reads, each optional but
``cores``: ``ttft_p50_s``, ``status``, ``timeout_rate``, ``server_ttft_s_mean``,
``server_frontend_s_mean``, ``replica_cpu_util_mean``, ``gpu<N>_util_mean``,
``server_num_requests_running_mean``, ``client_in_flight_mean`` (else ``workload_concurrency``),
``api_servers``, the CPU attribution ``cpu_s_per_req_<role>`` and ``runq_wait_s_<role>``, and the GPU
profile's ``gpu_profile_busy_frac`` and ``gpu_profile_gap_us_p99``. What is absent (or NaN) is left out
of the evidence. The knee follows the comparison's rule: a core count where most requests timed out is
not a candidate.

It returns a :class:`Finding`: which case of the rules below applied, the stage, and the figures that
decided it. :mod:`orchestrator.observe.analysis.diagnosis` says it in sentences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from orchestrator.observe.report.comparison import CONFIG, TIMEOUT_MAJORITY

TOLERANCE = 0.10  # TTFT p50 within this fraction counts as flat (the knee's tolerance)
FRONTEND_MOST = 0.75  # frontend share of server TTFT that makes the frontend the queue itself
STUCK_RUNNING = 0.5  # at most this fraction of the requests in flight running in the engine: stuck before it
SPARE_CPU = 50.0  # replica CPU busy percent below which it has cores to spare
CPU_BUSY = 70.0  # replica CPU busy percent read as saturated
GPU_BUSY = 80.0  # GPU busy percent read as the limit
ATTRIBUTION = "cpu_s_per_req_"
CPU_GROWS, CPU_GROWS_S = 1.2, 0.002  # CPU per request counts as grown past both: x1.2 and 2 ms
WAIT = "runq_wait_s_"  # seconds a role was runnable but waiting for a core, per window
GPU_PROFILE_BUSY, GPU_PROFILE_GAP = "gpu_profile_busy_frac", "gpu_profile_gap_us_p99"
BREAKDOWN_SLACK = 0.05  # a frontend part this far outside [0, server TTFT] is noise, clipped; further, no breakdown
_GPU_UTIL = re.compile(r"^gpu\d+_util_mean$")
_FIGURES = ["ttft_p50_s", "timeout_rate", "server_ttft_s_mean", "server_frontend_s_mean", "replica_cpu_util_mean",
            "server_num_requests_running_mean", "client_in_flight_mean", "workload_concurrency"]

Case = Literal[
    "no_trials",              # no trial of the configuration has a result yet
    "no_ttft",                # trials, but none with a TTFT to compare
    "frontend_queue",         # frontend-bound even at the most cores: more API servers, not cores
    "one_count",              # only one core count has a result
    "fewest_work",            # TTFT flat, but fewer cores failed: the fix is cores, the stage unknown
    "cores_no_breakdown",     # TTFT grows (or times out) as cores shrink; no server TTFT breakdown
    "frontend_before_clock",  # TTFT grows but server TTFT does not: lost in request handling
    "frontend",               # the added server TTFT is mostly frontend
    "engine",                 # the added server TTFT is mostly queue and prefill
    "gpu",                    # TTFT flat while the GPU is busy
    "no_stage",               # TTFT flat, nothing saturated
]


@dataclass(frozen=True)
class Attribution:
    """The mechanism's figures at both ends: the CPU column per request that grew most (and whether past
    both thresholds), the two roles whose wait for a core grew most, and the GPU profile."""

    cpu: tuple[str, float, float, bool] | None = None  # (column, at the most cores, at the fewest, grew)
    waits: tuple[tuple[str, float, float], ...] = ()  # (column, at the most cores, at the fewest)
    gpu_busy: tuple[float, float] | None = None  # (at the fewest, at the most)
    gpu_gap: tuple[float, float] | None = None  # (at the fewest, at the most), us


@dataclass(frozen=True)
class Finding:
    """What :func:`decide` found, before any sentence.

    ``evidence``: the figures by name, in seconds, percent (0-100), fractions and counts (``_lo``, ``_hi``: at
    the fewest and the most cores with a result); ``c_lo``/``c_hi``: those core counts; ``failed``: core
    counts without a result, ``failed_below`` those below ``c_lo``, each with the error kinds recorded there;
    ``prev``: the core count below ``c_hi`` with a result and its TTFT p50; ``top_flat``: whether TTFT p50 moved
    within the tolerance over that last step (None with one core count); ``split``: (frontend, server TTFT)
    change from the most to the fewest cores, seconds; ``api_servers``: the configuration's count, as given."""

    case: Case
    stage: str
    evidence: dict[str, float] = field(default_factory=dict)
    c_lo: int = 0
    c_hi: int = 0
    failed: tuple[int, ...] = ()
    failed_kinds: tuple[str, ...] = ()
    failed_below: tuple[int, ...] = ()
    failed_below_kinds: tuple[str, ...] = ()
    prev: tuple[int, float] | None = None
    top_flat: bool | None = None
    knee: int | None = None
    growth: float | None = None
    timeouts: bool = False
    split: tuple[float, float] | None = None
    api_servers: object = None
    attribution: Attribution = Attribution()


def _one_configuration(rows: pd.DataFrame) -> None:
    if "cores" not in rows:
        raise ValueError("config_rows: missing column 'cores' (one row per core count of one configuration)")
    for col in CONFIG:
        if col in rows and rows[col].nunique(dropna=False) > 1:
            values = ", ".join(str(v) for v in rows[col].drop_duplicates())
            raise ValueError(f"config_rows hold more than one configuration: column {col!r} takes {values}")


def _consistent_breakdown(pts: pd.DataFrame) -> None:
    """The frontend part is server TTFT minus queue and prefill, so it lies in [0, server TTFT]: a mean a little
    outside (clocks read apart) is clipped into it; one far outside is no breakdown at all (NaN)."""
    if "server_frontend_s_mean" not in pts or "server_ttft_s_mean" not in pts:
        return
    srv, fe = pts["server_ttft_s_mean"], pts["server_frontend_s_mean"]
    slack = BREAKDOWN_SLACK * srv.abs()
    bad = (srv <= 0) | (fe < -slack) | (fe > srv + slack)
    pts["server_frontend_s_mean"] = fe.clip(lower=0.0, upper=srv).where(~bad)


def _points(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[int]]:
    """Per core count with a TTFT: the median TTFT p50 and the mean of every other figure; and the
    core counts without one (every trial failed, or none had an ok request)."""
    cols = [c for c in rows.columns
            if c in _FIGURES or _GPU_UTIL.match(str(c)) or str(c).startswith((ATTRIBUTION, WAIT))
            or c in (GPU_PROFILE_BUSY, GPU_PROFILE_GAP)]
    num = rows[cols].apply(pd.to_numeric, errors="coerce") if cols else pd.DataFrame(index=rows.index)
    num["cores"] = pd.to_numeric(rows["cores"], errors="coerce")
    if "ttft_p50_s" not in num:
        num["ttft_p50_s"] = float("nan")
    ok = num["ttft_p50_s"].notna() & (num["ttft_p50_s"] > 0)  # a TTFT of 0 s measured nothing
    if "status" in rows:
        ok &= rows["status"].astype(str) != "FAILED"
    gpu = [c for c in num if _GPU_UTIL.match(str(c))]
    num["gpu_util_mean"] = num[gpu].max(axis=1) if gpu else float("nan")
    num = num.drop(columns=gpu)
    good = num[ok & num["cores"].notna()]
    pts = good.groupby("cores").mean()
    pts["ttft_p50_s"] = good.groupby("cores")["ttft_p50_s"].median()
    _consistent_breakdown(pts)
    failed = sorted(int(c) for c in set(num["cores"].dropna()) - set(pts.index))
    return pts.sort_index(), failed


def get(p: pd.Series, col: str) -> float | None:
    v = p.get(col)
    return None if v is None or pd.isna(v) else float(v)


def _kinds(rows: pd.DataFrame, cores: list[int]) -> tuple[str, ...]:
    """The error kinds recorded for the trials at ``cores`` (sorted, without none)."""
    if "error_kind" not in rows:
        return ()
    sel = rows[pd.to_numeric(rows["cores"], errors="coerce").isin(cores)]
    return tuple(sorted({str(k) for k in sel["error_kind"].dropna() if str(k) not in ("", "none")}))


def _growth(lo: pd.Series, hi: pd.Series, prefix: str) -> list[tuple[float, str, float, float]]:
    """(growth, column, at the most cores, at the fewest) of every ``prefix`` column, most grown first."""
    grown = []
    for col in lo.index:
        if str(col).startswith(prefix):
            a, b = get(hi, col), get(lo, col)
            if a is not None and b is not None:
                grown.append((b - a, str(col), a, b))
    return sorted(grown, reverse=True)


def _attribution(lo: pd.Series, hi: pd.Series, ev: dict[str, float]) -> Attribution:
    """The mechanism behind the knee: the CPU role (or category) whose seconds per request grow most from the
    most to the fewest cores; the roles whose wait for a core (run-queue wait) grows most, which is what
    starvation grows when the work per request does not; and the GPU profile's busy fraction and long kernel
    gaps at both ends, the device side of the same. Their figures go into ``ev``."""
    cpu = None
    if (top := next(iter(_growth(lo, hi, ATTRIBUTION)), None)) is not None:
        delta, col, a, b = top
        ev[f"{col}_hi"], ev[f"{col}_lo"] = a, b
        cpu = (col, a, b, b >= CPU_GROWS * a and delta >= CPU_GROWS_S)
    waits = tuple((col, a, b) for d, col, a, b in _growth(lo, hi, WAIT)[:2] if d > 0.05)  # the two grown most
    for col, a, b in waits:
        ev[f"{col}_hi"], ev[f"{col}_lo"] = a, b
    busy = gap = None
    busy_lo, busy_hi = get(lo, GPU_PROFILE_BUSY), get(hi, GPU_PROFILE_BUSY)
    if busy_lo is not None and busy_hi is not None:
        ev["gpu_profile_busy_frac_lo"], ev["gpu_profile_busy_frac_hi"] = busy = (busy_lo, busy_hi)
        gap_lo, gap_hi = get(lo, GPU_PROFILE_GAP), get(hi, GPU_PROFILE_GAP)
        if gap_lo is not None and gap_hi is not None:
            ev["gpu_profile_gap_us_p99_lo"], ev["gpu_profile_gap_us_p99_hi"] = gap = (gap_lo, gap_hi)
    return Attribution(cpu, waits, busy, gap)


def knee_of(pts: pd.DataFrame, tolerance: float) -> int | None:
    """The fewest cores within ``tolerance`` of the best TTFT p50, among the core counts where most requests
    did not time out (the comparison's rule); None when there is none."""
    ok = pts[~(pts["timeout_rate"] > TIMEOUT_MAJORITY)] if "timeout_rate" in pts else pts
    if ok.empty:
        return None
    best = ok["ttft_p50_s"].min()
    return int(ok.index[ok["ttft_p50_s"] <= best * (1 + tolerance)].min())


def _evidence(lo: pd.Series, hi: pd.Series) -> dict[str, float]:
    ev: dict[str, float] = {"cores_lo": float(lo.name), "cores_hi": float(hi.name),  # type: ignore[arg-type]
                            "ttft_p50_s_lo": float(lo["ttft_p50_s"]), "ttft_p50_s_hi": float(hi["ttft_p50_s"])}
    for col in ("server_ttft_s_mean", "server_frontend_s_mean", "replica_cpu_util_mean", "gpu_util_mean"):
        for end, p in (("lo", lo), ("hi", hi)):
            if (v := get(p, col)) is not None:
                ev[f"{col}_{end}"] = v
    for end in ("lo", "hi"):
        srv, fe = ev.get(f"server_ttft_s_mean_{end}"), ev.get(f"server_frontend_s_mean_{end}")
        if srv is not None and fe is not None and srv > 0:
            ev[f"server_rest_s_mean_{end}"] = srv - fe  # queue and prefill
            ev[f"frontend_share_{end}"] = fe / srv
    running = get(hi, "server_num_requests_running_mean")
    in_flight = get(hi, "client_in_flight_mean") or get(hi, "workload_concurrency")
    if running is not None:
        ev["server_num_requests_running_mean"] = running
    if in_flight:
        ev["client_in_flight_mean"] = in_flight
        if running is not None:  # the gauge and the client's count are sampled apart: a share, at most 1
            ev["running_share"] = min(running / in_flight, 1.0)
    return ev


def decide(config_rows: pd.DataFrame, *, tolerance: float = TOLERANCE) -> Finding:
    """The stage of one configuration that saturates first as its cores shrink (see the module docstring).

    Raises ValueError when ``config_rows`` has no ``cores`` column or holds more than one configuration.
    """
    _one_configuration(config_rows)
    pts, failed = _points(config_rows)
    if pts.empty:
        if config_rows.empty:
            return Finding("no_trials", "unknown")
        ev = {"core_counts": float(len(failed)), "core_counts_failed": float(len(failed))}
        return Finding("no_ttft", "unknown", ev, failed=tuple(failed), failed_kinds=_kinds(config_rows, failed))
    lo, hi = pts.iloc[0], pts.iloc[-1]
    c_lo, c_hi = int(lo.name), int(hi.name)  # type: ignore[call-overload]
    ev = _evidence(lo, hi)
    share = {end: ev[f"frontend_share_{end}"] for end in ("lo", "hi") if f"frontend_share_{end}" in ev}
    cpu_hi = get(hi, "replica_cpu_util_mean")
    below = [c for c in failed if c < c_lo]
    if failed:
        ev["core_counts_failed"] = float(len(failed))
    attribution = _attribution(lo, hi, ev)
    base = dict(c_lo=c_lo, c_hi=c_hi, failed=tuple(failed), failed_kinds=_kinds(config_rows, failed),
                failed_below=tuple(below), failed_below_kinds=_kinds(config_rows, below), attribution=attribution)

    # Frontend-bound even at the most cores: the API server's one thread is the queue.
    top_flat: bool | None = None
    prev = None
    if len(pts) > 1:
        before = pts.iloc[-2]
        prev = (int(before.name), float(before["ttft_p50_s"]))  # type: ignore[call-overload]
        ev["ttft_p50_top_step"] = float(before["ttft_p50_s"] / hi["ttft_p50_s"])
        top_flat = ev["ttft_p50_top_step"] <= 1 + tolerance
    spare = cpu_hi is not None and cpu_hi < SPARE_CPU
    stuck = "running_share" not in ev or ev["running_share"] <= STUCK_RUNNING
    if share.get("hi", 0) >= FRONTEND_MOST and stuck and (top_flat or (top_flat is None and spare)):
        servers = (config_rows["api_servers"].iloc[0] if "api_servers" in config_rows
                   and config_rows["api_servers"].notna().any() else None)
        knee = None
        if top_flat and (knee := knee_of(pts, tolerance)) is not None:
            ev["knee_cores"] = float(knee)
        return Finding("frontend_queue", "frontend", ev, prev=prev, top_flat=top_flat, knee=knee,
                       api_servers=servers, **base)  # type: ignore[arg-type]

    if len(pts) == 1:
        return Finding("one_count", "unknown", ev, **base)  # type: ignore[arg-type]

    growth = float(lo["ttft_p50_s"] / hi["ttft_p50_s"])
    ev["ttft_growth"] = growth
    knee = knee_of(pts, tolerance)
    if knee is not None:
        ev["knee_cores"] = float(knee)
    t_lo, t_hi = get(lo, "timeout_rate") or 0.0, get(hi, "timeout_rate") or 0.0
    timeouts = t_lo - t_hi > 0.01
    if timeouts:
        ev["timeout_rate_lo"], ev["timeout_rate_hi"] = t_lo, t_hi
    more = dict(prev=prev, top_flat=top_flat, knee=knee, growth=growth, timeouts=timeouts, **base)

    if below and growth <= 1 + tolerance and not timeouts:
        return Finding("fewest_work", "unknown", ev, **more)  # type: ignore[arg-type]
    if growth > 1 + tolerance or timeouts:
        if len(share) < 2:
            return Finding("cores_no_breakdown", "unknown", ev, **more)  # type: ignore[arg-type]
        split = (ev["server_frontend_s_mean_lo"] - ev["server_frontend_s_mean_hi"],
                 ev["server_ttft_s_mean_lo"] - ev["server_ttft_s_mean_hi"])
        fe, rest = split_ms(*split)
        case: Case = "frontend_before_clock" if fe + rest <= 0 else "frontend" if fe >= rest else "engine"
        return Finding(case, "engine" if case == "engine" else "frontend", ev, split=split,
                       **more)  # type: ignore[arg-type]
    gpu_lo = get(lo, "gpu_util_mean")
    if gpu_lo is not None and gpu_lo >= GPU_BUSY:
        return Finding("gpu", "gpu", ev, **more)  # type: ignore[arg-type]
    return Finding("no_stage", "unknown", ev, **more)  # type: ignore[arg-type]


def split_ms(d_fe: float, d_srv: float) -> tuple[int, int]:
    """How server TTFT's change from the most to the fewest cores divides between the frontend and the rest
    (queue and prefill), in whole ms: (frontend, rest). The rest is the net less the frontend as written, so
    the parts add up."""
    net, fe = round(1000 * d_srv), round(1000 * d_fe)
    return fe, net - fe


__all__ = ["ATTRIBUTION", "CPU_BUSY", "CPU_GROWS", "CPU_GROWS_S", "FRONTEND_MOST", "GPU_BUSY", "SPARE_CPU",
           "STUCK_RUNNING", "TOLERANCE", "WAIT", "Attribution", "Case", "Finding", "decide", "get", "knee_of",
           "split_ms"]
