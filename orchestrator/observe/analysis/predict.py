"""A predicted knee: TTFT p50 against cores and load, from a queueing model fitted to a calibration sweep (pure).

One configuration (everything fixed but the cores and the load) is a closed queueing network:

- ``N`` requests circulate (closed loop: ``N`` requests in flight). Each visits
  1. the CPU stage: ``S`` seconds of CPU work (tokenization, request handling, the engine core's
     loop), shared over ``c`` cores, each request on at most one core at a time, and at most ``k``
     requests served at once (the threads that can do that work: the API servers, the engine core,
     one GPU worker per GPU). With ``j`` requests there it serves at rate ``min(j, c, k) / S``;
  2. the GPU stage: ``G`` seconds to the first token, then ``Zd`` seconds of decode. The GPU batches,
     so it is a delay that does not depend on the cores.
- ``TTFT(c, N) = G + R_cpu(c, N)``, with ``R_cpu`` the CPU stage's mean residence time, exact from
  the network's product form (under processor sharing it holds for any distribution of the work).
- Open loop (``loop="open"``, load = request rate ``λ``): ``R_cpu`` is the M/M/m response time with
  ``m = min(c, k)``: ``S + C(m, λS) S / (m - λS)`` (Erlang C), infinite when ``λS >= m``.

Fitted: ``G`` and ``S``, by least squares on log TTFT p50. Measured, not fitted: ``N``, the workload's
``concurrency`` column where the rows have one, else the median of ``request_throughput_rps *
e2e_p50_s`` (Little's law); ``Zd``, the median of ``e2e_p50_s - ttft_p50_s``. Assumed: ``k = 1 +
api_servers + gpus`` unless given, or fitted where there are enough core counts. So the predicted
knee is never above k. Not modelled: CPU starvation that slows the GPU stage itself (kernel-launch
delay), and a load's effect on ``G`` and ``Zd`` (taken from the calibration's load).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import gammaln

from orchestrator.observe.report.comparison import CONFIG, TIMEOUT_MAJORITY

Loop = Literal["closed", "open"]
Threads = int | Literal["fit"] | None
MIN_CORE_COUNTS = 3  # two fitted parameters, and one core count left to disagree with them
MIN_CORE_COUNTS_FOR_THREADS = 5  # k fitted too: three parameters, and two core counts to check them
TOLERANCE = 0.10     # the knee's rule, as in report.comparison


@dataclass(frozen=True)
class KneeModel:
    """TTFT p50 against cores and load for one configuration, and the knee it implies.

    ``gpu_s`` is G, ``cpu_s`` is S, ``threads`` is k, ``load`` is the calibration's load (requests
    in flight when closed, requests per second when open), ``decode_s`` is Zd (see the module's
    docstring); ``fit_error_rms`` is the in-sample RMS of log(predicted / measured).
    """

    gpu_s: float
    cpu_s: float
    threads: int
    load: float
    decode_s: float
    loop: Loop = "closed"
    fit_error_rms: float = 0.0
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, float]:
        """The model's parameters, named with their units."""
        load_name = "concurrency_requests" if self.loop == "closed" else "request_rate_rps"
        return {"gpu_ttft_s": self.gpu_s, "cpu_work_s": self.cpu_s, "cpu_threads": float(self.threads),
                load_name: self.load, "decode_s": self.decode_s}

    def predict_ttft_p50(self, cores: int, load: float | None = None) -> float:
        """TTFT p50 in seconds at ``cores`` and ``load`` (default: the calibration's load); inf if overloaded."""
        if isinstance(cores, bool) or not float(cores).is_integer() or cores < 1:
            raise ValueError(f"cores: must be an integer >= 1, got {cores!r}")
        load = self.load if load is None else float(load)
        if not load > 0:
            raise ValueError(f"load: must be > 0, got {load!r}")
        servers = min(int(cores), self.threads)
        if self.loop == "open":
            return self.gpu_s + open_residence_s(load, self.cpu_s, servers)
        return self.gpu_s + closed_residence_s(load, self.gpu_s + self.decode_s, self.cpu_s, servers)

    def within_calibration(self, cores: int) -> bool:
        """Whether ``cores`` lies inside the calibrated core counts (interpolation, not extrapolation)."""
        fitted = self.inputs.get("cores") or []
        return bool(fitted) and min(fitted) <= cores <= max(fitted)

    def knee(self, cores: Sequence[int], tolerance: float = TOLERANCE, load: float | None = None) -> int:
        """The fewest of ``cores`` whose predicted TTFT p50 is within ``tolerance`` of the best of them."""
        if not len(cores):
            raise ValueError("cores: empty")
        cores = sorted(int(c) for c in cores)
        return knee_of(cores, [self.predict_ttft_p50(c, load) for c in cores], tolerance)


def closed_residence_s(requests: float, delay_s: float, work_s: float, servers: int) -> float:
    """Mean time a request spends in the CPU stage of the closed network (product form, exact).

    ``P(j requests at the CPU) ∝ delay_s^(N-j) / (N-j)! * work_s^j / prod(min(i, servers), i <= j)``;
    throughput ``X = (N - L) / delay_s`` with ``L`` the mean there, and ``R = L / X`` (Little).
    A fractional ``requests`` interpolates between its two integers.
    """
    lo = max(1, math.floor(requests))
    if requests <= lo:
        return _closed_residence(lo, delay_s, work_s, servers)
    w = requests - lo
    return ((1 - w) * _closed_residence(lo, delay_s, work_s, servers)
            + w * _closed_residence(lo + 1, delay_s, work_s, servers))


def _closed_residence(n: int, delay_s: float, work_s: float, servers: int) -> float:
    if delay_s <= 0:  # nothing but the CPU stage: all n requests are always there
        return n * work_s / min(n, servers)
    j, const = _state_terms(n, servers)
    log_w = (n - j) * math.log(delay_s) + j * math.log(work_s) + const
    p = np.exp(log_w - log_w.max())
    p /= p.sum()
    at_cpu = float((j * p).sum())
    throughput = (n - at_cpu) / delay_s
    return at_cpu / throughput


@lru_cache(maxsize=256)
def _state_terms(n: int, servers: int) -> tuple[np.ndarray, np.ndarray]:
    """``j`` and the part of ``log P(j)`` that depends on neither time: ``-log (N-j)! - log prod min(i, m)``."""
    j = np.arange(n + 1)
    log_rate = np.concatenate([[0.0], np.cumsum(np.log(np.minimum(np.arange(1, n + 1), servers)))])
    return j, -gammaln(n - j + 1) - log_rate


def open_residence_s(rate_rps: float, work_s: float, servers: int) -> float:
    """M/M/m mean response time ``S + C(m, a) S / (m - a)`` with ``a = λS`` (Erlang C); inf if ``a >= m``."""
    a = rate_rps * work_s
    if a >= servers:
        return math.inf
    terms = [a ** i / math.factorial(i) for i in range(servers)]
    last = a ** servers / math.factorial(servers) * servers / (servers - a)
    wait_prob = last / (sum(terms) + last)
    return work_s + wait_prob * work_s / (servers - a)


def knee_of(cores: Sequence[int], ttft_s: Sequence[float], tolerance: float = TOLERANCE) -> int:
    """The fewest cores whose TTFT p50 is within ``tolerance`` of the best (the rule of report.comparison)."""
    best = min(ttft_s)
    return min(c for c, t in zip(cores, ttft_s) if t <= best * (1 + tolerance))


def rule_of_thumb_cores(gpus: int) -> int:
    """The vLLM docs' rule of thumb: 2 + N cores for N GPUs."""
    return 2 + int(gpus)


def default_threads(config_rows: pd.DataFrame) -> int:
    """k = 1 + api_servers + gpus: the engine core, each API server, one GPU worker per GPU."""
    return 1 + _first_int(config_rows, "api_servers", 1) + _first_int(config_rows, "gpus", 1)


def cannot_fit(config_rows: pd.DataFrame, loop: Loop = "closed") -> str | None:
    """Why :func:`fit` returns None for these rows, or None when it can fit."""
    usable = _usable(_checked(config_rows), loop)
    if _first_int(config_rows, "gpus", 1) == 0:
        return "gpus=0: the forward pass runs on the replica's own cores, which this model does not describe"
    if len(usable) < MIN_CORE_COUNTS:
        needs = "TTFT p50" + (", throughput and E2E p50" if loop == "closed" else " and throughput")
        return (f"{len(usable)} core count(s) with {needs} and most requests answered; the fit needs {MIN_CORE_COUNTS} "
                f"(two parameters, and one more to check them)")
    return None


def fit(config_rows: pd.DataFrame, *, threads: Threads = None, loop: Loop = "closed") -> KneeModel | None:
    """The model fitted to one configuration's ``report.comparison`` rows, or None (see :func:`cannot_fit`).

    ``threads``: k; None takes :func:`default_threads`; ``"fit"`` chooses k from 1 to the most cores
    measured by the in-sample error, with at least :data:`MIN_CORE_COUNTS_FOR_THREADS` core counts
    (else it takes the default). Raises ValueError naming the column when the rows are not one
    configuration's, one per core count.
    """
    if cannot_fit(config_rows, loop) is not None:
        return None
    rows = _usable(_checked(config_rows), loop)
    if threads == "fit":
        if len(rows) >= MIN_CORE_COUNTS_FOR_THREADS:
            fits = [_fit_with(rows, config_rows, k, loop) for k in range(1, int(rows["cores"].max()) + 1)]
            best = min(fits, key=lambda m: m.fit_error_rms - 1e-9 * m.threads)  # ties: the most threads
            best.inputs["threads_from"] = "fit"
            return best
        threads = None
    k = default_threads(config_rows) if threads is None else int(threads)
    if k < 1:
        raise ValueError(f"threads: must be >= 1 or 'fit', got {threads!r}")
    model = _fit_with(rows, config_rows, k, loop)
    model.inputs["threads_from"] = "1 + api_servers + gpus" if threads is None else "given"
    return model


def _fit_with(rows: pd.DataFrame, config_rows: pd.DataFrame, k: int, loop: Loop) -> KneeModel:
    """G and S fitted by least squares on log TTFT p50, with k, the load and Zd fixed."""
    cores = rows["cores"].astype(int).to_numpy()
    ttft = rows["ttft_p50_s"].to_numpy(float)
    rps = rows["request_throughput_rps"].to_numpy(float)
    conc = rows["concurrency"].dropna() if "concurrency" in rows else pd.Series(dtype=float)
    if loop == "closed":
        load = float(conc.median()) if len(conc) else float(np.median(rps * rows["e2e_p50_s"].to_numpy(float)))
        load, decode = max(load, 1.0), max(0.0, float(np.median(rows["e2e_p50_s"].to_numpy(float) - ttft)))
    else:
        load, decode = float(np.median(rps)), 0.0

    def model(theta: np.ndarray) -> KneeModel:
        return KneeModel(gpu_s=float(math.exp(theta[0])), cpu_s=float(math.exp(theta[1])), threads=k,
                         load=load, decode_s=decode, loop=loop)

    def residuals(theta: np.ndarray) -> np.ndarray:
        m = model(theta)
        pred = np.array([m.predict_ttft_p50(int(c)) for c in cores])
        return np.log(np.minimum(pred, 1e6) / ttft)

    floor = float(ttft.min())
    lower, upper = np.log([floor * 1e-4, floor * 1e-4]), np.log([floor, 10 * float(ttft.max())])
    grid = [np.log([g * floor, s * floor]) for g in (0.1, 0.3, 0.5, 0.7, 0.9) for s in (0.01, 0.05, 0.2, 0.5, 2.0)]
    starts = sorted(grid, key=lambda th: float(np.sum(residuals(th) ** 2)))[:2]  # the best of a coarse grid
    best = min((least_squares(residuals, np.clip(th, lower + 1e-9, upper - 1e-9), bounds=(lower, upper))
                for th in starts), key=lambda r: r.cost)
    load_from = ("concurrency" if len(conc) else "request_throughput_rps * e2e_p50_s") if loop == "closed" \
        else "request_throughput_rps"
    inputs = {"config": {c: _plain(config_rows[c].dropna().iloc[0]) for c in CONFIG
                         if c in config_rows and config_rows[c].notna().any()},
              "cores": [int(c) for c in cores], "ttft_p50_s": [float(t) for t in ttft],
              "request_throughput_rps": [float(v) for v in rps], "loop": loop, "threads": k, "load_from": load_from}
    if loop == "closed":
        inputs["e2e_p50_s"] = [float(v) for v in rows["e2e_p50_s"]]
    fitted = model(best.x)
    rms = float(np.sqrt(np.mean(residuals(best.x) ** 2)))
    return KneeModel(gpu_s=fitted.gpu_s, cpu_s=fitted.cpu_s, threads=k, load=load, decode_s=decode, loop=loop,
                     fit_error_rms=rms, inputs=inputs)


def holdout(config_rows: pd.DataFrame, *, tolerance: float = TOLERANCE, threads: Threads = None,
            loop: Loop = "closed") -> pd.DataFrame:
    """Leave one core count out: fit on the others, predict the one left out.

    Columns: ``cores, measured_s, predicted_s, error`` (``predicted / measured - 1``), ``fitted_s``
    (the fit on all core counts, in sample), ``knee_measured``, ``knee_predicted`` (the fit on all
    core counts, over the measured ones), ``knee_holdout`` (the fit without this core count, over all
    of them) and ``note`` (why a figure is missing). Empty when no core count has a TTFT p50.
    """
    rows = _usable(_checked(config_rows), loop)
    cols = ["cores", "measured_s", "predicted_s", "error", "fitted_s", "knee_measured", "knee_predicted",
            "knee_holdout", "note"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    cores = [int(c) for c in rows["cores"]]
    measured = [float(t) for t in rows["ttft_p50_s"]]
    full = fit(config_rows, threads=threads, loop=loop)
    knee_measured = knee_of(cores, measured, tolerance)
    knee_predicted = full.knee(cores, tolerance) if full is not None else None
    out = []
    for i, c in enumerate(cores):
        rest = config_rows[config_rows["cores"].astype(float) != c]
        m = fit(rest, threads=threads, loop=loop)
        pred = m.predict_ttft_p50(c) if m is not None else math.nan
        out.append({"cores": c, "measured_s": measured[i], "predicted_s": pred, "error": pred / measured[i] - 1,
                    "fitted_s": full.predict_ttft_p50(c) if full is not None else math.nan,
                    "knee_measured": knee_measured, "knee_predicted": knee_predicted,
                    "knee_holdout": m.knee(cores, tolerance) if m is not None else None,
                    "note": "" if m is not None else f"without cores={c}: {cannot_fit(rest, loop)}"})
    return pd.DataFrame(out, columns=cols)


def _checked(config_rows: pd.DataFrame) -> pd.DataFrame:
    """The rows, if they are one configuration's, one per core count; else ValueError naming the column."""
    for col in ("cores", "ttft_p50_s"):
        if col not in config_rows:
            raise ValueError(f"config rows: no column {col!r} (pass report.comparison() rows)")
    for col in CONFIG:
        if col in config_rows and config_rows[col].nunique(dropna=True) > 1:
            values = sorted(map(str, config_rows[col].dropna().unique()))
            raise ValueError(f"config rows: column {col!r} holds several configurations ({', '.join(values)}); "
                             f"fit one configuration at a time")
    cores = pd.to_numeric(config_rows["cores"], errors="coerce")
    for idx, v in cores.items():
        if not (v >= 1 and float(v).is_integer()):
            raise ValueError(f"config rows: column 'cores', row {idx}: {config_rows.at[idx, 'cores']!r} "
                             f"is not an integer >= 1")
    dup = cores[cores.duplicated()]
    if len(dup):
        raise ValueError(f"config rows: column 'cores': {int(dup.iloc[0])} appears more than once "
                         f"(pass report.comparison() rows: repeats aggregated, one row per core count)")
    for col in ("ttft_p50_s", "request_throughput_rps", "e2e_p50_s", "concurrency"):
        if col in config_rows:
            bad = pd.to_numeric(config_rows[col], errors="coerce").isna() & config_rows[col].notna()
            if bad.any():
                idx = bad[bad].index[0]
                raise ValueError(f"config rows: column {col!r}, row {idx}: {config_rows.at[idx, col]!r} is not a number")
    return config_rows


def _usable(rows: pd.DataFrame, loop: Loop) -> pd.DataFrame:
    """Rows with what the fit needs: a TTFT p50, and the throughput (and E2E p50, when closed); not those
    where most requests timed out, whose TTFT describes the few that finished (as in report.comparison)."""
    need = ["ttft_p50_s", "request_throughput_rps"] + (["e2e_p50_s"] if loop == "closed" else [])
    timeouts = pd.to_numeric(rows["timeout_rate"], errors="coerce") if "timeout_rate" in rows else None
    ok = pd.Series(True, index=rows.index) if timeouts is None else ~(timeouts > TIMEOUT_MAJORITY)
    for col in need:
        v = pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(math.nan, index=rows.index)
        ok &= np.isfinite(v) & (v > 0)
    kept = rows[ok]
    return kept.assign(cores=kept["cores"].astype(int)).sort_values("cores")


def _first_int(rows: pd.DataFrame, col: str, default: int) -> int:
    v = pd.to_numeric(rows[col], errors="coerce").dropna() if col in rows else pd.Series(dtype=float)
    return int(v.iloc[0]) if len(v) else default


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


__all__ = ["KneeModel", "cannot_fit", "closed_residence_s", "default_threads", "fit", "holdout", "knee_of",
           "open_residence_s", "rule_of_thumb_cores"]
