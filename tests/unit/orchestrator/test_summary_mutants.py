"""Mutation-testing kills for the trial summary (orchestrator/observe/summary.py) and the cross-check
ratios (``crosscheck_metrics``, ``crosscheck_load``, ``workloads.bare.crosscheck_ratio``); see tests/MUTATION.md."""

from __future__ import annotations

import math

import pytest

from orchestrator.observe.summary import (
    FOREIGN_WARN,
    LOAD_GAP,
    crosscheck_load,
    crosscheck_metrics,
    in_flight_mean,
    summarize_series,
    summarize_trial,
)
from workloads.bare import crosscheck_ratio
from workloads.records import RequestRecord

MS = 1_000_000


def rec(rid: str, ttft_ms: float, sent_ms: float = 0.0, end_ms: float | None = None, status: str = "ok") -> RequestRecord:
    sent = int(sent_ms * MS)
    first = sent + int(ttft_ms * MS)
    end = int(end_ms * MS) if end_ms is not None else first
    return RequestRecord(request_id=rid, session_id=rid.split(":")[0], turn=int(rid.split(":")[1]),
                         scheduled_ns=sent, sent_ns=sent, first_token_ns=first, token_ns=(first,), end_ns=end,
                         prompt_tokens=10, completion_tokens=1, cached_tokens=0, client_prompt_tokens=10,
                         tokenize_ns=0, status=status)


def ok(ttft_s: float | None, status: str = "ok") -> dict:
    return {"ttft_s": ttft_s, "status": status}


HARNESS = [rec(f"a:{i}", ms) for i, ms in enumerate((100, 200, 300, 400, 1000))]  # p50 0.3, p90 0.76
BARE = [ok(0.1), ok(0.2), ok(0.3), ok(0.5), ok(None), ok(7.0, "timeout")]          # p50 0.25, p90 0.44


def test_crosscheck_ratio_figures() -> None:
    out = crosscheck_ratio([0.1, 0.2, 0.3, 0.4, 1.0], [0.1, 0.2, 0.3, 0.5])
    assert out["harness_count"] == 5.0 and out["bare_count"] == 4.0
    assert out["ttft_p50_harness_s"] == pytest.approx(0.3) and out["ttft_p50_bare_s"] == pytest.approx(0.25)
    assert out["ttft_p50_ratio"] == pytest.approx(0.3 / 0.25)
    assert out["ttft_p90_ratio"] == pytest.approx(0.76 / 0.44)
    assert set(out) == {"harness_count", "bare_count", "ttft_p50_ratio", "ttft_p90_ratio", "ttft_p50_harness_s",
                        "ttft_p50_bare_s"}


def test_crosscheck_ratio_without_a_side_or_with_a_zero_bare_has_no_ratio() -> None:
    for h, b in (([], [0.2]), ([0.2], []), ([0.2], [0.0])):
        out = crosscheck_ratio(h, b)
        assert out["ttft_p50_ratio"] is None and out["ttft_p90_ratio"] is None
    assert crosscheck_ratio([0.2], [0.0])["ttft_p50_bare_s"] == 0.0
    assert crosscheck_ratio([], [])["harness_count"] == 0.0


def test_crosscheck_metrics_against_the_bare_client() -> None:
    out = crosscheck_metrics(HARNESS, BARE)
    assert out == pytest.approx({
        "crosscheck_harness_count": 5.0, "crosscheck_bare_count": 4.0,
        "crosscheck_ttft_p50_ratio": 0.3 / 0.25, "crosscheck_ttft_p90_ratio": 0.76 / 0.44,
        "crosscheck_ttft_p50_harness_s": 0.3, "crosscheck_ttft_p50_bare_s": 0.25,
        "crosscheck_ttft_p90_harness_s": 0.76, "crosscheck_ttft_p90_bare_s": 0.44})
    assert all(type(v) is float for v in out.values())


def test_crosscheck_metrics_without_bare_rows_drops_the_ratios() -> None:
    out = crosscheck_metrics(HARNESS, [ok(0.1, "error")])
    assert out == pytest.approx({"crosscheck_harness_count": 5.0, "crosscheck_bare_count": 0.0,
                                 "crosscheck_ttft_p50_harness_s": 0.3, "crosscheck_ttft_p90_harness_s": 0.76})


def test_crosscheck_metrics_against_another_reference() -> None:
    out = crosscheck_metrics(HARNESS, BARE, who="vllm-bench")
    assert out == pytest.approx({
        "crosscheck_vllm_bench_ttft_p50_ratio": 0.3 / 0.25, "crosscheck_vllm_bench_ttft_p90_ratio": 0.76 / 0.44,
        "crosscheck_vllm_bench_ttft_p50_s": 0.25, "crosscheck_vllm_bench_ttft_p90_s": 0.44,
        "crosscheck_vllm_bench_count": 4.0})
    assert all(type(v) is float for v in out.values())
    assert crosscheck_metrics(HARNESS, [], who="vllm-bench") == {"crosscheck_vllm_bench_count": 0.0}


def test_crosscheck_load_edges() -> None:
    def comparable(h: float, b: float) -> float:
        return crosscheck_load({"replica_cores_foreign_frac": h}, {"replica_cores_foreign_frac": b})["crosscheck_comparable"]

    assert comparable(0.0, LOAD_GAP) == 1.0          # a gap of exactly LOAD_GAP still compares
    assert comparable(0.0, LOAD_GAP + 0.001) == 0.0
    assert comparable(0.05, 0.0) == 1.0              # the gap is absolute, whichever run had more
    assert comparable(0.099, 0.06) == 1.0            # both just under FOREIGN_WARN
    assert comparable(FOREIGN_WARN, 0.08) == 0.0     # at FOREIGN_WARN: not quiet
    assert comparable(0.08, FOREIGN_WARN) == 0.0
    out = crosscheck_load({"replica_cores_foreign_frac": 0.07}, {"replica_cores_foreign_frac": 0.01})
    assert out == pytest.approx({"crosscheck_bare_foreign_frac": 0.01, "crosscheck_foreign_gap": 0.06,
                                 "crosscheck_comparable": 0.0})
    assert crosscheck_load({}, {"replica_cores_foreign_frac": 0.01}) == {"crosscheck_bare_foreign_frac": 0.01}


def test_in_flight_mean_is_littles_law() -> None:
    # 0.2 s + 0.4 s outstanding over the span 0.1 .. 0.5 s
    records = [rec("a:0", 10, sent_ms=100, end_ms=300), rec("b:0", 10, sent_ms=100, end_ms=500, status="error")]
    assert in_flight_mean(records) == pytest.approx(0.6 / 0.4)
    assert in_flight_mean([rec("a:0", 10, sent_ms=100, end_ms=300)]) == pytest.approx(1.0)


def test_summarize_series_means_and_maxima_skip_missing_values() -> None:
    rows = [{"name": "cpu", "value": 1.0}, {"name": "cpu", "value": 3}, {"name": "cpu", "value": None},
            {"name": "cpu", "value": float("nan")}, {"name": "gpu", "value": -2.0}, {"name": "gpu", "value": -4.0},
            {"name": "none", "value": None}]
    assert summarize_series(rows) == {"cpu_mean": 2.0, "cpu_max": 3.0, "gpu_mean": -3.0, "gpu_max": -2.0}
    assert list(summarize_series(rows)) == ["cpu_mean", "cpu_max", "gpu_mean", "gpu_max"]


class _Run:
    def __init__(self, records, client_cpu_s=0.25, wall_s=2.0):
        self.records, self.client_cpu_s, self.wall_s = tuple(records), client_cpu_s, wall_s


def test_summarize_trial_merges_client_server_and_series() -> None:
    records = [rec("a:0", 100, sent_ms=0, end_ms=500), rec("b:0", 300, sent_ms=0, end_ms=1000)]
    server = {"server_prompt_tokens": 20.0, "server_gone": float("nan"), "server_none": None}
    rows = [{"name": "cpu", "value": 2.0}, {"name": "cpu", "value": 4.0}]
    out = summarize_trial(_Run(records), server, iter(rows))
    assert out["client_cpu_s"] == 0.25 and out["window_s"] == 2.0
    assert out["server_prompt_tokens"] == 20.0 and "server_gone" not in out and "server_none" not in out
    assert out["cpu_mean"] == 3.0 and out["cpu_max"] == 4.0
    assert out["client_in_flight_mean"] == pytest.approx(1.5)
    assert out["ttft_p50_s"] == pytest.approx(0.2)
    assert "slo_ttft_s" not in out and "slo_tpot_s" not in out
    assert all(type(v) is float and not math.isnan(v) for v in out.values())


def test_summarize_trial_records_the_slo() -> None:
    class Slo:
        ttft_s, tpot_s = 0.15, 0.5

    records = [rec("a:0", 100, sent_ms=0, end_ms=500), rec("b:0", 300, sent_ms=0, end_ms=1000)]
    out = summarize_trial(_Run(records, wall_s=1.0), {}, [], slo=Slo())
    assert out["slo_ttft_s"] == 0.15 and out["slo_tpot_s"] == 0.5
    assert out["goodput_rps"] == pytest.approx(1.0)  # only a:0 within the TTFT SLO, over 1 s


def test_in_flight_mean_over_a_one_nanosecond_span() -> None:
    r = rec("a:0", 0, sent_ms=0, end_ms=0)
    one_ns = RequestRecord(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "end_ns": 1})
    assert in_flight_mean([one_ns]) == 1.0
