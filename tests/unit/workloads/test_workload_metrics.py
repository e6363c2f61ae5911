"""Metrics against hand-computed records, the record <-> DataFrame/Parquet round trip, and the
dispatch-lag warning that ``runner.diagnose`` derives from them."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workloads import metrics
from workloads.loadgen import LoadResult
from workloads.records import RequestRecord, frame_to_records, records_to_frame
from workloads.run_workload import diagnose

S = 1_000_000_000  # ns per second
MS = 1_000_000


def rec(rid: str, *, scheduled: int, sent: int, tokens: tuple[int, ...], end: int, status: str = "ok",
        prompt: int = 100, cached: int | None = 50, tokenize_ns: int = 0) -> RequestRecord:
    return RequestRecord(
        request_id=rid, session_id="s", turn=0, scheduled_ns=scheduled, sent_ns=sent,
        first_token_ns=tokens[0] if tokens else None, token_ns=tokens, end_ns=end, prompt_tokens=prompt,
        completion_tokens=len(tokens), cached_tokens=cached, client_prompt_tokens=prompt,
        tokenize_ns=tokenize_ns, status=status, error=None if status == "ok" else status)


# r1: sent at 0, tokens at 100, 110, 110 (a 2-token chunk), 130 ms, end 130 ms.
R1 = rec("r1", scheduled=0, sent=0, tokens=(100 * MS, 110 * MS, 110 * MS, 130 * MS), end=130 * MS,
         prompt=100, cached=80, tokenize_ns=2 * MS)
# r2: scheduled at 1 s, sent 1 ms late, first token 300 ms after send, 3 tokens 50 ms apart.
R2 = rec("r2", scheduled=1 * S, sent=1 * S + 1 * MS,
         tokens=(1 * S + 301 * MS, 1 * S + 351 * MS, 1 * S + 401 * MS), end=1 * S + 401 * MS,
         prompt=300, cached=120, tokenize_ns=4 * MS)
# r3: timed out after 2 s with one token; never part of latency distributions.
R3 = rec("r3", scheduled=2 * S, sent=2 * S, tokens=(2 * S + 500 * MS,), end=4 * S, status="timeout", prompt=999)


def test_per_request_formulas() -> None:
    recs = [R1, R2, R3]
    assert metrics.ttft_s(recs) == pytest.approx([0.100, 0.300])
    assert metrics.e2e_s(recs) == pytest.approx([0.130, 0.400])  # r2 from its (late) send
    # Per token: the 2-token chunk gives a 0 gap; r3 (timeout) contributes nothing.
    assert metrics.itl_s(recs) == pytest.approx([0.010, 0.0, 0.020, 0.050, 0.050])
    # tpot = (end - first) / (n - 1): r1 30 ms / 3, r2 100 ms / 2.
    assert metrics.tpot_s(recs) == pytest.approx([0.010, 0.050])
    assert metrics.dispatch_lag_s(recs) == pytest.approx([0.0, 0.001, 0.0])
    assert metrics.tokenize_s(recs) == pytest.approx([0.002, 0.004])  # 0 = not measured
    assert metrics.duration_s(recs) == pytest.approx(4.0)


def test_goodput_applies_every_slo() -> None:
    recs = [R1, R2, R3]
    assert metrics.goodput_count(recs, ttft_slo_s=0.2, tpot_slo_s=None) == 1  # r2's TTFT 0.3 fails
    assert metrics.goodput_count(recs, ttft_slo_s=None, tpot_slo_s=0.02) == 1  # r2's TPOT 0.05 fails
    assert metrics.goodput_count(recs, ttft_slo_s=1.0, tpot_slo_s=1.0) == 2  # the timeout never counts


def test_summarize_hand_computed() -> None:
    out = metrics.summarize([R1, R2, R3], ttft_slo_s=0.2)
    assert out["requests"] == 3 and out["ok"] == 2 and out["timeouts"] == 1 and out["errors"] == 0
    assert out["timeout_rate"] == pytest.approx(1 / 3)
    assert out["ttft_p50_s"] == pytest.approx(0.2)  # linear interpolation of 0.1 and 0.3
    assert out["ttft_mean_s"] == pytest.approx(0.2)
    assert out["ttft_p99_s"] == pytest.approx(0.1 + 0.99 * 0.2)
    assert out["e2e_p50_s"] == pytest.approx((0.130 + 0.400) / 2)
    assert out["itl_p50_s"] == pytest.approx(0.020)
    assert out["tpot_p50_s"] == pytest.approx(0.030)
    assert out["dispatch_lag_p50_s"] == pytest.approx(0.0)
    assert out["tokenize_p50_s"] == pytest.approx(0.003)
    assert out["prompt_tokens_total"] == 400 and out["prompt_tokens_mean"] == 200
    assert out["completion_tokens_total"] == 7
    assert out["cached_tokens_total"] == 200
    assert out["prefix_hit_rate"] == pytest.approx(0.5)
    assert out["request_throughput_rps"] == pytest.approx(2 / 4.0)
    assert out["output_throughput_tps"] == pytest.approx(7 / 4.0)
    assert out["goodput_rps"] == pytest.approx(1 / 4.0)


def test_summarize_names_are_mlflow_safe_and_never_nan() -> None:
    out = metrics.summarize([R1, R2, R3], ttft_slo_s=0.2, tpot_slo_s=0.1)
    expected = {"requests", "ok", "timeouts", "errors", "timeout_rate", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "ttft_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "itl_p50_s", "itl_p90_s",
                "itl_p99_s", "tpot_p50_s", "tpot_p90_s", "dispatch_lag_p50_s", "dispatch_lag_p99_s",
                "tokenize_p50_s", "prompt_tokens_mean", "prompt_tokens_total", "completion_tokens_total",
                "cached_tokens_total", "prefix_hit_rate", "request_throughput_rps", "output_throughput_tps",
                "goodput_rps"}
    assert expected <= set(out)
    for name, value in out.items():
        assert name.replace("_", "").isalnum(), name
        assert isinstance(value, float) and math.isfinite(value), (name, value)


def test_summarize_omits_distributions_without_ok_requests() -> None:
    out = metrics.summarize([R3])
    assert out["timeouts"] == 1 and out["timeout_rate"] == 1.0
    assert not any(k.startswith(("ttft_", "e2e_", "itl_", "tpot_")) for k in out)
    assert "prefix_hit_rate" not in out and "goodput_rps" not in out
    assert "dispatch_lag_p99_s" in out  # lag is a client fact, known for every sent request
    assert metrics.summarize([]) == {"requests": 0.0, "ok": 0.0, "timeouts": 0.0, "errors": 0.0, "cut": 0.0}


def test_prefix_hit_rate_absent_when_server_does_not_report_cache() -> None:
    r = rec("x", scheduled=0, sent=0, tokens=(1 * MS, 2 * MS), end=2 * MS, cached=None)
    out = metrics.summarize([r])
    assert "prefix_hit_rate" not in out and "cached_tokens_total" not in out
    assert out["prompt_tokens_total"] == 100


def test_percentile_empty_is_none() -> None:
    assert metrics.percentile([], 50) is None
    assert metrics.percentile([1.0, 3.0], 50) == 2.0


def test_invalid_status_rejected() -> None:
    with pytest.raises(ValueError, match="status"):
        rec("bad", scheduled=0, sent=0, tokens=(), end=0, status="lost")


def test_frame_round_trip_through_parquet(tmp_path) -> None:
    recs = [R1, R2, R3, rec("r4", scheduled=5, sent=6, tokens=(), end=7, status="error", cached=None)]
    frame = records_to_frame(recs)
    assert list(frame["token_ns"][0]) == list(R1.token_ns)
    path = tmp_path / "records.parquet"
    frame.to_parquet(path)
    back = frame_to_records(pd.read_parquet(path))
    assert back == recs
    assert back[3].cached_tokens is None and back[3].first_token_ns is None and back[3].error == "error"


def test_empty_frame_round_trip() -> None:
    frame = records_to_frame([])
    assert len(frame) == 0 and "token_ns" in frame.columns
    assert frame_to_records(frame) == []


def test_client_tokenize_cost_and_first_cached_tokens() -> None:
    # R1: 2 ms for 100 tokens, R2: 4 ms for 300; R3 was not tokenized. (2 + 4) ms / 0.4k tokens.
    assert math.isclose(metrics.tokenize_ms_per_1k([R1, R2, R3]), 15.0)
    assert metrics.tokenize_ms_per_1k([R3]) is None
    assert metrics.first_cached_tokens([R2, R1]) == 80  # R1 was sent first, whatever the order
    # two opening requests of a shared prefix, the earliest sent served second: the window still started cold
    late = rec("a", scheduled=0, sent=0, tokens=(90 * MS,), end=90 * MS, prompt=300, cached=256)
    early = rec("b", scheduled=0, sent=1 * MS, tokens=(50 * MS,), end=50 * MS, prompt=300, cached=0)
    after = rec("c", scheduled=0, sent=95 * MS, tokens=(99 * MS,), end=99 * MS, prompt=300, cached=0)
    assert metrics.first_cached_tokens([late, early]) == 0
    assert metrics.first_cached_tokens([late, after]) == 256  # sent after a first token: not an opening request
    assert metrics.first_cached_tokens([]) is None
    out = metrics.summarize([R1, R2, R3])
    assert math.isclose(out["client_tokenize_ms_per_1k"], 15.0) and out["window_first_cached_tokens"] == 80


# --- the dispatch-lag warning (runner.diagnose, pure) --------------------------------------------

def _lag_warnings(lag_ms: float, ttft_ms: float | None, n: int = 100) -> list[str]:
    """Warnings about dispatch lag for ``n`` requests, each sent ``lag_ms`` late, with TTFT
    ``ttft_ms`` (None: every request failed without a token)."""
    lag, records = int(lag_ms * MS), []
    for i in range(n):
        sent = i * S + lag
        if ttft_ms is None:
            records.append(rec(f"r{i}", scheduled=i * S, sent=sent, tokens=(), end=sent + MS, status="error"))
        else:
            first = sent + int(ttft_ms * MS)
            records.append(rec(f"r{i}", scheduled=i * S, sent=sent, tokens=(first,), end=first))
    result = LoadResult(records=tuple(records), start_ns=0, window_end_ns=n * S, sessions_started=n,
                        sessions_unstarted=0, turns_unsent=0, slot_waits=0)
    warnings = diagnose(result, [], client_cpu_s=0.0, wall_s=float(n), client_cores=1)
    return [w for w in warnings if "dispatch lag" in w]


def test_lag_below_one_percent_of_ttft_does_not_warn() -> None:
    # The H200 agentic trials: lag p99 2-5 ms against TTFT p50 of 300-800 ms warned on every trial.
    assert _lag_warnings(2.9, 300) == []
    assert _lag_warnings(5.0, 800) == []


def test_lag_above_one_percent_of_ttft_warns_with_its_share() -> None:
    assert _lag_warnings(3.1, 300) == [
        "dispatch lag p99 3.1 ms is 1.0% of TTFT p50 300 ms: the client may be the bottleneck"]
    assert _lag_warnings(12.0, 400) == [
        "dispatch lag p99 12.0 ms is 3.0% of TTFT p50 400 ms: the client may be the bottleneck"]


def test_lag_within_the_timer_resolution_never_warns() -> None:
    # 2% of a 40 ms TTFT (vLLM-CPU's tiny model), but inside the loop timer's ~1 ms.
    assert _lag_warnings(0.8, 40) == []
    assert _lag_warnings(1.5, 40) == [
        "dispatch lag p99 1.5 ms is 3.8% of TTFT p50 40 ms: the client may be the bottleneck"]


def test_lag_without_any_ttft_is_judged_by_the_floor_alone() -> None:
    assert _lag_warnings(0.5, None) == []
    assert _lag_warnings(1.5, None) == [
        "dispatch lag p99 1.5 ms exceeds the timer's 1 ms and no TTFT to compare it with: "
        "the client may be the bottleneck"]
