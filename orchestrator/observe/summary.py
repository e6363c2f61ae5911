"""Pure merge of one trial's raw outcome into flat, MLflow-safe summary metrics.

Besides the client's latency figures (``workloads.metrics.summarize``, which also gives the text's
tokenization cost and the window's first cached tokens) and the server's /metrics deltas, a trial
records the ideal prefix-cache hit rates of what was sent (``workloads.cachesim``) beside the
measured one, so a replay that reuses less than its trace allows is visible, and the harness's
TTFT against the bare client's.

Two figures say where the requests in flight are: ``client_in_flight_mean`` (what the client had
outstanding, by Little's law) beside ``server_num_requests_running_mean`` (the mean of vLLM's
``vllm:num_requests_running`` gauge over the window, from the telemetry series): when far fewer
run in the engine than are in flight, the rest wait before it, in the API server.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workloads import cachesim
from workloads.bare import crosscheck_ratio, percentile
from workloads.loaders import load_sessions
from workloads.metrics import summarize, ttft_s

log = logging.getLogger(__name__)


def sessions_of(trial: Any) -> list[Any] | None:
    """The trial's sessions as its loader builds them (deterministic), for replay-fidelity figures."""
    try:
        return load_sessions(trial.workload)
    except Exception as exc:  # noqa: BLE001 (figures about the run must never fail the run)
        log.warning("cannot rebuild the sessions of trial %s: %s", trial.trial_id, exc)
        return None


def special_tokens(sessions: Sequence[Any], records: Sequence[Any]) -> int:
    """Tokens the server adds to every prompt (a BOS), measured: the median over first turns of the
    server's prompt tokens minus the plan's. A first turn is all plan, so nothing else differs."""
    planned = {f"{s.session_id}:0": s.planned_prompt_tokens(0) for s in sessions}
    extra = sorted(r.prompt_tokens - planned[r.request_id] for r in records
                   if r.status == "ok" and r.request_id in planned)
    return max(0, extra[len(extra) // 2]) if extra else 0


def replay_fidelity_of(sessions: Sequence[Any] | None, records: Sequence[Any], block_size: int | None,
                       measured_hit_rate: float | None) -> Any:
    """Ideal prefix-cache hit rates of what was sent, and the gaps to the measured one
    (``workloads.cachesim.ReplayFidelity``), or None where the plan cannot be rebuilt."""
    if not sessions or not block_size:
        return None
    try:
        plan = cachesim.segments_for(sessions, records, bos_tokens=special_tokens(sessions, records))
    except Exception as exc:  # noqa: BLE001 (figures about the run must never fail the run)
        log.warning("cannot rebuild what was sent: %s", exc)
        return None
    requests = cachesim.known_requests(plan)
    if not requests:
        return None
    return cachesim.replay_fidelity(measured_hit_rate, cachesim.ideal_unbounded_hit_rate(requests, block_size),
                                    cachesim.ideal_after_prefill_hit_rate(requests, block_size))


def crosscheck_metrics(records: Sequence[Any], ref_rows: Iterable[Mapping[str, Any]],
                       who: str = "bare") -> dict[str, float]:
    """The harness's TTFT against a reference client's on the same workload and start state.

    ``bare`` (the bare client): ``crosscheck_ttft_p{50,90}_ratio`` (harness / bare), both sides' p50
    and p90 (``crosscheck_ttft_p50_harness_s``, ``crosscheck_ttft_p50_bare_s``, ...) and counts. Any
    other reference (``vllm-bench``): ``crosscheck_vllm_bench_ttft_p{50,90}_ratio`` (harness / it), its
    p50 and p90 (``crosscheck_vllm_bench_ttft_p50_s``) and its count."""
    ref = [float(r["ttft_s"]) for r in ref_rows if r.get("status") == "ok" and r.get("ttft_s") is not None]
    harness = ttft_s(records)
    ratio = crosscheck_ratio(harness, ref)
    if who == "bare":
        ratio["ttft_p90_harness_s"], ratio["ttft_p90_bare_s"] = percentile(harness, 90), percentile(ref, 90)
        return {f"crosscheck_{k}": float(v) for k, v in ratio.items() if v is not None}
    name = "crosscheck_" + who.replace("-", "_")
    out = {f"{name}_ttft_p50_ratio": ratio["ttft_p50_ratio"], f"{name}_ttft_p90_ratio": ratio["ttft_p90_ratio"],
           f"{name}_ttft_p50_s": percentile(ref, 50), f"{name}_ttft_p90_s": percentile(ref, 90),
           f"{name}_count": float(len(ref))}
    return {k: float(v) for k, v in out.items() if v is not None}


FOREIGN_WARN = 0.10  # other work's share of the replica's cores above which a window's TTFT is not the replica's alone
LOAD_GAP = 0.05      # the most the two runs of a cross-check may differ in that share and still be compared


def crosscheck_load(metrics: Mapping[str, float], bare_load: Mapping[str, float]) -> dict[str, float]:
    """Whether the two runs of a cross-check saw the same neighbours on the replica's cores.

    The ratio compares two runs one after the other, so any change in other work on the
    replica's cores between them moves it: on a shared 2-core machine, foreign shares of 23%
    and 76% gave harness/bare ratios from 0.46 to 2.41 with the same harness. ``crosscheck_comparable``
    is 1 when both shares are known, differ by at most ``LOAD_GAP`` and are both under ``FOREIGN_WARN``.
    """
    out: dict[str, float] = {}
    harness, bare = metrics.get("replica_cores_foreign_frac"), bare_load.get("replica_cores_foreign_frac")
    if bare is None:
        return out
    out["crosscheck_bare_foreign_frac"] = float(bare)
    if harness is not None:
        out["crosscheck_foreign_gap"] = abs(float(harness) - float(bare))
        out["crosscheck_comparable"] = float(out["crosscheck_foreign_gap"] <= LOAD_GAP
                                             and max(float(harness), float(bare)) < FOREIGN_WARN)
    return out


def load_warnings(metrics: Mapping[str, float]) -> list[str]:
    """Warnings for a trial whose replica's cores were shared with other work (the figures above)."""
    out = []
    foreign = metrics.get("replica_cores_foreign_frac")
    if foreign is not None and foreign > FOREIGN_WARN:
        out.append(f"other work took {foreign:.0%} of the replica's cores during the window: its TTFT is not the "
                   "replica's alone (run on a quiet node, or keep the run's own services off those cores)")
    if metrics.get("crosscheck_comparable") == 0.0:
        out.append(f"cross-check not comparable: other work took {foreign or 0:.0%} of the replica's cores during the "
                   f"window and {metrics.get('crosscheck_bare_foreign_frac', 0):.0%} during the bare run, so its "
                   "ratio measures the neighbours, not the harness")
    return out


def in_flight_mean(records: Sequence[Any]) -> float | None:
    """Mean requests the client had outstanding over the run (Little's law):
    ``sum(end_ns - sent_ns) / (max(end_ns) - min(sent_ns))`` over every record, whatever its status;
    None without records or with a zero span."""
    if not records:
        return None
    span = max(r.end_ns for r in records) - min(r.sent_ns for r in records)
    return sum(r.end_ns - r.sent_ns for r in records) / span if span > 0 else None


def summarize_trial(run: Any, server: Mapping[str, float], rows: Iterable[Mapping[str, Any]], *,
                    slo: Any = None) -> dict[str, float]:
    """Workload metrics (from the request records) + server /metrics deltas + telemetry means.

    ``run`` is a ``workloads.WorkloadRun``; ``slo`` an ``orchestrator.values.sweep_spec.SloSpec`` (or None):
    with it, ``goodput_rps`` (ok requests within every given SLO per second of the run) and the SLO
    itself (``slo_ttft_s``, ``slo_tpot_s``) are recorded. NaN and None values are dropped, since
    MLflow cannot compare them.
    """
    ttft_slo = getattr(slo, "ttft_s", None)
    tpot_slo = getattr(slo, "tpot_s", None)
    out: dict[str, float | None] = {}
    out.update(summarize(run.records, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo))
    out["slo_ttft_s"], out["slo_tpot_s"] = ttft_slo, tpot_slo
    out["client_in_flight_mean"] = in_flight_mean(run.records)
    out.update(server)
    out.update(summarize_series(list(rows)))
    out["client_cpu_s"] = float(run.client_cpu_s)
    out["window_s"] = float(run.wall_s)
    return {k: float(v) for k, v in out.items() if v is not None and not math.isnan(float(v))}


def summarize_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """``<name>_mean`` and ``<name>_max`` of every series (NaN and None values skipped)."""
    by_name: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        v = r.get("value")
        if v is None:
            continue
        v = float(v)
        if math.isnan(v):
            continue
        by_name[str(r["name"])].append(v)
    out: dict[str, float] = {}
    for name, vals in sorted(by_name.items()):
        out[f"{name}_mean"] = sum(vals) / len(vals)
        out[f"{name}_max"] = max(vals)
    return out


__all__ = ["FOREIGN_WARN", "LOAD_GAP", "crosscheck_load", "crosscheck_metrics", "in_flight_mean", "load_warnings", "replay_fidelity_of", "sessions_of", "special_tokens", "summarize_series",
           "summarize_trial"]
