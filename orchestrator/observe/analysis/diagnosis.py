"""Which stage saturates first as one configuration's cores shrink, and what would fix it (pure).

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

The input is the comparison rows of one configuration (``orchestrator.observe.report.comparison``:
one row per core count), or its raw trial rows (one per trial; repeats are folded here the same
way: the median TTFT p50, the mean of the other figures). Columns it reads, each optional but
``cores``: ``ttft_p50_s``, ``status``, ``timeout_rate``, ``server_ttft_s_mean``,
``server_frontend_s_mean``, ``replica_cpu_util_mean``, ``gpu<N>_util_mean``,
``server_num_requests_running_mean``, ``client_in_flight_mean`` (else ``workload_concurrency``),
``api_servers``, the CPU attribution ``cpu_s_per_req_<role>`` and ``runq_wait_s_<role>``, and the GPU
profile's ``gpu_profile_busy_frac`` and ``gpu_profile_gap_us_p99``. What is absent (or NaN) is left out
of the evidence and the verdict says what it could not tell. The knee follows the comparison's rule: a core
count where most requests timed out is not a candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Diagnosis:
    """The stage that saturates first (``frontend``, ``engine``, ``gpu`` or ``unknown``) and what is said of it.

    - ``sentence``: the whole verdict in one sentence: the stage, the fix, the figures behind it, the mechanism;
    - ``headline``: the verdict in one plain sentence for the report's reader: the stage, the fix and the figure
      that decides it (the report says the knee and what starving costs before it);
    - ``detail``: the mechanism's figures in one sentence (CPU time per request, the wait for a core, the GPU
      profile), empty when the trials recorded none;
    - ``evidence``: the figures by name, in seconds, percent (0-100), fractions and counts; ``_lo`` and ``_hi``:
      at the fewest and the most cores with a result.

    No sentence names a part larger than its whole, a share above 100% or below 0: when the frontend and the rest
    of server TTFT move apart, each movement is said on its own, with the net.
    """

    stage: str
    sentence: str
    evidence: dict[str, float] = field(default_factory=dict)
    headline: str = ""
    detail: str = ""


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


def _get(p: pd.Series, col: str) -> float | None:
    v = p.get(col)
    return None if v is None or pd.isna(v) else float(v)


def _ms(v: float) -> str:
    return f"{1000 * v:.0f}"


def _n(cores: int) -> str:
    return f"{cores} core" if cores == 1 else f"{cores} cores"


def _pct(v: float) -> str:
    """A fraction as a percent, within 0-100% (a share cannot leave it; a figure that does is noise)."""
    return f"{min(max(v, 0.0), 1.0):.0%}"


def _busy(v: float) -> str:
    """A utilisation already in percent, within 0-100%."""
    return f"{min(max(v, 0.0), 100.0):.0f}%"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _why_failed(rows: pd.DataFrame, cores: list[int]) -> str:
    """``1, 2 cores (timeout)``: the core counts without a result and the error kinds recorded for them."""
    where = f"{', '.join(str(c) for c in cores)} core{'s' if cores != [1] else ''}"
    if "error_kind" not in rows:
        return where
    sel = rows[pd.to_numeric(rows["cores"], errors="coerce").isin(cores)]
    kinds = sorted({str(k) for k in sel["error_kind"].dropna() if str(k) not in ("", "none")})
    return f"{where} ({', '.join(kinds)})" if kinds else where


def _growth(lo: pd.Series, hi: pd.Series, prefix: str) -> list[tuple[float, str, float, float]]:
    """(growth, column, at the most cores, at the fewest) of every ``prefix`` column, most grown first."""
    grown = []
    for col in lo.index:
        if str(col).startswith(prefix):
            a, b = _get(hi, col), _get(lo, col)
            if a is not None and b is not None:
                grown.append((b - a, str(col), a, b))
    return sorted(grown, reverse=True)


def _attribution(lo: pd.Series, hi: pd.Series, ev: dict[str, float]) -> list[str]:
    """The mechanism behind the knee, as clauses: the CPU role (or category) whose seconds per request
    grow most from the most to the fewest cores; the role whose wait for a core (run-queue wait)
    grows most, which is what starvation grows when the work per request does not; and the GPU
    profile's busy fraction and long kernel gaps at both ends, the device side of the same."""
    lo_n, hi_n = int(lo.name), int(hi.name)
    out = []
    cpu = next(iter(_growth(lo, hi, ATTRIBUTION)), None)
    if cpu is not None:
        delta, col, a, b = cpu
        ev[f"{col}_hi"], ev[f"{col}_lo"] = a, b
        if b >= CPU_GROWS * a and delta >= CPU_GROWS_S:
            out.append(f"of the CPU time per request, {col[len(ATTRIBUTION):]} grows most "
                       f"({1000 * a:.1f} to {1000 * b:.1f} ms from {hi_n} to {lo_n} cores)")
        else:
            out.append(f"the CPU time per request grows by less than {_pct(CPU_GROWS - 1)} or "
                       f"{1000 * CPU_GROWS_S:.0f} ms")
    waits = [w for w in _growth(lo, hi, WAIT)[:2] if w[0] > 0.05]  # the two roles whose wait for a core grows most
    for _, col, a, b in waits:
        ev[f"{col}_hi"], ev[f"{col}_lo"] = a, b
    if waits:
        who = " and ".join(f"the {c[len(WAIT):]} {b:.2f} s ({a:.2f} s at {hi_n})" for _, c, a, b in waits)
        out.append(f"waiting for a core per window at {_n(lo_n)}: {who}")
    busy_lo, busy_hi = _get(lo, GPU_PROFILE_BUSY), _get(hi, GPU_PROFILE_BUSY)
    if busy_lo is not None and busy_hi is not None:
        ev["gpu_profile_busy_frac_lo"], ev["gpu_profile_busy_frac_hi"] = busy_lo, busy_hi
        gpu = f"the GPU was busy {_pct(busy_lo)} of the time at {_n(lo_n)} against {_pct(busy_hi)} at {hi_n}"
        gap_lo, gap_hi = _get(lo, GPU_PROFILE_GAP), _get(hi, GPU_PROFILE_GAP)
        if gap_lo is not None and gap_hi is not None:
            ev["gpu_profile_gap_us_p99_lo"], ev["gpu_profile_gap_us_p99_hi"] = gap_lo, gap_hi
            gpu += f" (kernel gaps p99 {gap_lo:.0f} against {gap_hi:.0f} us)"
        out.append(gpu)
    return out


def _knee(pts: pd.DataFrame, tolerance: float) -> int | None:
    """The fewest cores within ``tolerance`` of the best TTFT p50, among the core counts where most requests
    did not time out (the comparison's rule); None when there is none."""
    ok = pts[~(pts["timeout_rate"] > TIMEOUT_MAJORITY)] if "timeout_rate" in pts else pts
    if ok.empty:
        return None
    best = ok["ttft_p50_s"].min()
    return int(ok.index[ok["ttft_p50_s"] <= best * (1 + tolerance)].min())


def _split(d_fe: float, d_srv: float, span: str = "") -> tuple[int, int, str]:
    """How server TTFT's change from the most to the fewest cores divides between the frontend and the rest
    (queue and prefill), in whole ms: (frontend, rest, the clause). The rest is the net less the frontend as
    written, so the parts add up; when they move apart each is said on its own, so no part is larger than its whole."""
    net, fe = round(1000 * d_srv), round(1000 * d_fe)
    rest = net - fe
    if fe >= 0 and rest >= 0:
        return fe, rest, f"{fe} of the {net} ms added to server TTFT{span} is frontend"
    if rest < 0:
        return fe, rest, (f"frontend time grew by {fe} ms{span} while the rest of server TTFT (queue and prefill) "
                          f"fell by {-rest} ms; net {net:+d} ms")
    return fe, rest, (f"the rest of server TTFT (queue and prefill) grew by {rest} ms{span} while frontend time "
                      f"fell by {-fe} ms; net {net:+d} ms")


def _grows(growth: float, c_hi: int, c_lo: int) -> str:
    verb = "grows" if growth >= 1 else "falls to"
    return f"TTFT p50 {verb} {growth:.2f}x from {c_hi} to {c_lo} cores"


def _flat(growth: float, c_lo: int, c_hi: int) -> str:
    if growth >= 1:
        return f"TTFT p50 stays within {_pct(growth - 1)} from {c_lo} to {c_hi} cores"
    return f"TTFT p50 is {_pct(1 - growth)} lower at {_n(c_lo)} than at {c_hi}"


def _evidence(lo: pd.Series, hi: pd.Series) -> dict[str, float]:
    ev: dict[str, float] = {"cores_lo": float(lo.name), "cores_hi": float(hi.name),
                            "ttft_p50_s_lo": float(lo["ttft_p50_s"]), "ttft_p50_s_hi": float(hi["ttft_p50_s"])}
    for col in ("server_ttft_s_mean", "server_frontend_s_mean", "replica_cpu_util_mean", "gpu_util_mean"):
        for end, p in (("lo", lo), ("hi", hi)):
            if (v := _get(p, col)) is not None:
                ev[f"{col}_{end}"] = v
    for end in ("lo", "hi"):
        srv, fe = ev.get(f"server_ttft_s_mean_{end}"), ev.get(f"server_frontend_s_mean_{end}")
        if srv is not None and fe is not None and srv > 0:
            ev[f"server_rest_s_mean_{end}"] = srv - fe  # queue and prefill
            ev[f"frontend_share_{end}"] = fe / srv
    running = _get(hi, "server_num_requests_running_mean")
    in_flight = _get(hi, "client_in_flight_mean") or _get(hi, "workload_concurrency")
    if running is not None:
        ev["server_num_requests_running_mean"] = running
    if in_flight:
        ev["client_in_flight_mean"] = in_flight
        if running is not None:  # the gauge and the client's count are sampled apart: a share, at most 1
            ev["running_share"] = min(running / in_flight, 1.0)
    return ev


def diagnose(config_rows: pd.DataFrame, *, tolerance: float = TOLERANCE) -> Diagnosis:
    """The stage of one configuration that saturates first as its cores shrink (see the module docstring).

    Raises ValueError when ``config_rows`` has no ``cores`` column or holds more than one configuration.
    """
    _one_configuration(config_rows)
    pts, failed = _points(config_rows)
    if pts.empty:
        if config_rows.empty:
            return Diagnosis("unknown", "unknown: no trial of this configuration has a result yet.", {},
                             "No trial of this configuration has a result yet.")
        why = (f"every trial failed or had no ok request at {_why_failed(config_rows, failed)}" if failed else
               "no trial recorded its core count")
        return Diagnosis("unknown", f"unknown: no trial of this configuration has a TTFT to compare: {why}.",
                         {"core_counts": float(len(failed)), "core_counts_failed": float(len(failed))},
                         f"No trial of this configuration has a TTFT to compare: {why}.")
    lo, hi = pts.iloc[0], pts.iloc[-1]
    c_lo, c_hi = int(lo.name), int(hi.name)
    ev = _evidence(lo, hi)
    share = {end: ev[f"frontend_share_{end}"] for end in ("lo", "hi") if f"frontend_share_{end}" in ev}
    running, in_flight = ev.get("server_num_requests_running_mean"), ev.get("client_in_flight_mean")
    cpu_hi, gpu_hi = _get(hi, "replica_cpu_util_mean"), _get(hi, "gpu_util_mean")
    failed_below = [c for c in failed if c < c_lo]
    failures = f"at {_why_failed(config_rows, failed_below)} every trial failed; " if failed_below else ""
    if failed:
        ev["core_counts_failed"] = float(len(failed))
    clauses = _attribution(lo, hi, ev)
    attribution = "".join(f"; {c}" for c in clauses)
    detail = _cap("; ".join(clauses)) + "." if clauses else ""

    def verdict(stage: str, sentence: str, headline: str) -> Diagnosis:
        return Diagnosis(stage, sentence, ev, headline, detail)

    # Frontend-bound even at the most cores: the API server's one thread is the queue.
    top_flat: bool | None = None
    if len(pts) > 1:
        prev = pts.iloc[-2]
        ev["ttft_p50_top_step"] = float(prev["ttft_p50_s"] / hi["ttft_p50_s"])
        top_flat = ev["ttft_p50_top_step"] <= 1 + tolerance
    spare = cpu_hi is not None and cpu_hi < SPARE_CPU
    stuck = "running_share" not in ev or ev["running_share"] <= STUCK_RUNNING
    if share.get("hi", 0) >= FRONTEND_MOST and stuck and (top_flat or (top_flat is None and spare)):
        servers, per = "", ""
        if "api_servers" in config_rows and config_rows["api_servers"].notna().any():
            per = f"this configuration runs {config_rows['api_servers'].iloc[0]}"
            servers = f" (the api_servers axis; {per})"
        part = (f"{_ms(ev['server_frontend_s_mean_hi'])} of {_ms(ev['server_ttft_s_mean_hi'])} ms of server TTFT is "
                f"frontend (tokenization and request handling)")
        s = f"frontend-bound; more cores do not help; try more API servers{servers}: {failures}at {_n(c_hi)} {part}"
        head = f"Frontend-bound, and more cores do not help: at {_n(c_hi)} {part}"
        if running is not None:
            engine = (f", and only {running:.1f} of {in_flight:.0f} requests in flight were running in the engine"
                      if in_flight else f", and {running:.1f} requests were running in the engine on average")
            s, head = s + engine, head + engine
        head += f"; try more API servers{f' ({per})' if per else ''}."
        if top_flat:
            prev = pts.iloc[-2]
            s += (f"; TTFT p50 went from {_ms(prev['ttft_p50_s'])} to {_ms(hi['ttft_p50_s'])} ms from "
                  f"{int(prev.name)} to {c_hi} cores")
            knee = _knee(pts, tolerance)
            if knee is not None:
                ev["knee_cores"] = float(knee)
                if knee > c_lo:
                    s += f" (cores helped up to the knee at {knee})"
        if cpu_hi is not None:
            s += f"; the replica's cores were {_busy(cpu_hi)} busy"
        return verdict("frontend", s + attribution + ".", head)

    if len(pts) == 1:
        facts = [f"{_ms(ev['server_frontend_s_mean_hi'])} of {_ms(ev['server_ttft_s_mean_hi'])} ms of server TTFT "
                 f"is frontend"] if "hi" in share else []
        facts += [f"replica CPU {_busy(cpu_hi)} busy"] if cpu_hi is not None else []
        facts += [f"GPU {_busy(gpu_hi)} busy"] if gpu_hi is not None else []
        at = f"; at {_n(c_hi)} " + ", ".join(facts) if facts else ""
        only = (f"only {_n(c_hi)} {'has' if c_hi == 1 else 'have'} a result, so nothing shows what other core "
                f"counts would change{at}.")
        return verdict("unknown", f"unknown: {failures}{only}", _cap(only))

    growth = float(lo["ttft_p50_s"] / hi["ttft_p50_s"])
    ev["ttft_growth"] = growth
    knee = _knee(pts, tolerance)
    if knee is not None:
        ev["knee_cores"] = float(knee)
    t_lo, t_hi = _get(lo, "timeout_rate") or 0.0, _get(hi, "timeout_rate") or 0.0
    timeouts = ""
    if t_lo - t_hi > 0.01:
        ev["timeout_rate_lo"], ev["timeout_rate_hi"] = t_lo, t_hi
        timeouts = f", and {_pct(t_lo)} of its requests time out at {_n(c_lo)} ({_pct(t_hi)} at {c_hi})"
    grows = _grows(growth, c_hi, c_lo) + timeouts
    cpu_lo = _get(lo, "replica_cpu_util_mean")
    cpu = (f"; replica CPU {_busy(cpu_lo)} busy at {_n(c_lo)}" + (" (saturated)" if cpu_lo >= CPU_BUSY else "")
           if cpu_lo is not None else "")
    span = f" from {c_hi} to {c_lo} cores"

    if failed_below and growth <= 1 + tolerance and not timeouts:
        why = (f"the failed trials carry no figures to say which stage gave out, but the fix is cores: {c_lo} is the "
               f"fewest cores that work")
        return verdict("unknown", f"unknown stage, but the fix is cores: {failures}{_flat(growth, c_lo, c_hi)}, so "
                                  f"{c_lo} is the fewest cores that work; the failed trials carry no figures to say "
                                  f"which stage gave out.", _cap(why) + ".")
    if growth > 1 + tolerance or timeouts:
        fix = "the fix is cores" + (f" (the knee is at {knee})" if knee is not None else "")
        if len(share) < 2:
            return verdict("unknown", f"unknown stage, but {fix}: {failures}{grows}, and these trials carry no "
                                      f"server TTFT breakdown (server_frontend_s_mean) to tell the frontend from "
                                      f"the engine{cpu}{attribution}.",
                           f"The stage is unknown, but more cores fix it: these trials carry no server TTFT "
                           f"breakdown to tell the frontend from the engine{cpu}.")
        d_srv = ev["server_ttft_s_mean_lo"] - ev["server_ttft_s_mean_hi"]
        d_fe = ev["server_frontend_s_mean_lo"] - ev["server_frontend_s_mean_hi"]
        fe, rest, added = _split(d_fe, d_srv)
        if fe + rest <= 0:
            lost = (f"server TTFT does not grow ({_ms(ev['server_ttft_s_mean_hi'])} to "
                    f"{_ms(ev['server_ttft_s_mean_lo'])} ms{span}): the time is lost before vLLM's clock starts, in "
                    f"the API server's request handling")
            return verdict("frontend", f"frontend-bound as cores shrink; {fix}: {failures}{grows}, but {lost}"
                                       f"{cpu}{attribution}.",
                           f"Frontend-bound as cores shrink, and more cores fix it: {lost}{cpu}.")
        said = _split(d_fe, d_srv, span)[2]
        if fe >= rest:
            handling = (f" (tokenization and request handling, {_ms(ev['server_frontend_s_mean_hi'])} to "
                        f"{_ms(ev['server_frontend_s_mean_lo'])} ms)" if rest >= 0 else "")
            return verdict("frontend", f"frontend-bound as cores shrink; {fix}: {failures}{grows}, and {added}"
                                       f"{handling}{cpu}{attribution}.",
                           f"Frontend-bound as cores shrink, and more cores fix it: {said}"
                           f"{' (tokenization and request handling)' if rest >= 0 else ''}{cpu}.")
        loop = "; the rest is queue and prefill, the engine core's loop"
        engine, said = (f"but only {added}{loop}", f"only {said}{loop}") if fe >= 0 else (f"and {added}", said)
        return verdict("engine", f"engine-bound as cores shrink; {fix}: {failures}{grows}, {engine}{cpu}"
                                 f"{attribution}.",
                       f"Engine-bound as cores shrink, and more cores fix it: {said}{cpu}.")

    flat = _flat(growth, c_lo, c_hi)
    gpu_lo = _get(lo, "gpu_util_mean")
    if gpu_lo is not None and gpu_lo >= GPU_BUSY:
        busy = f"{flat} while the GPU is {_busy(gpu_lo)} busy at {_n(c_lo)}"
        return verdict("gpu", f"gpu-bound; more cores do not help: {busy}; the fix is GPUs (more, or faster ones), "
                              f"not cores.",
                       f"GPU-bound, and more cores do not help: {busy}; the fix is GPUs (more, or faster ones).")
    facts = [f"GPU {_busy(gpu_lo)} busy"] if gpu_lo is not None else []
    facts += [f"replica CPU {_busy(cpu_lo)} busy"] if cpu_lo is not None else []
    if "lo" in share:
        facts.append(f"{_ms(ev['server_frontend_s_mean_lo'])} of {_ms(ev['server_ttft_s_mean_lo'])} ms of server "
                     f"TTFT frontend")
    at = f" ({', '.join(facts)} at {_n(c_lo)})" if facts else ""
    none = f"no stage saturates between {c_lo} and {c_hi} cores: {flat}{at}; the fewest cores tested suffice for " \
           f"this load."
    return verdict("unknown", f"unknown: {none}", _cap(none))


__all__ = ["CPU_BUSY", "Diagnosis", "FRONTEND_MOST", "GPU_BUSY", "SPARE_CPU", "STUCK_RUNNING", "TOLERANCE",
           "diagnose"]
