"""The measurement sequence (orchestrator.control.measure) against fake actors and a fake clock.

What it pins down: the window's figures are taken over the requests' span only (the workload's
set-up before it and its tokenize-after behind it, idle time for the GPU, no longer dilute the
means; nor do the client's connection set-up and tail inside the load call, which the sampler sees), the order of the harness and its references per repeat, and a server found dead at any
step of the sequence is SERVER_DIED.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import Remote, TickClock, agentic_trial

from orchestrator.control.measure import STEPS, Window, WindowSequence, order_label, order_of
from orchestrator.node.restrict import Verification
from orchestrator.node.telemetry import TelemetrySampler
from orchestrator.node.window_figures import window_series
from orchestrator.observe.summary import summarize_series
from orchestrator.values.results import ErrorKind, TrialFailure, TrialStatus
from orchestrator.values.wire import BareRun, CoreGrant, ReplicaUp, ServerStatus, WindowFigures, WindowSpan
from workloads.records import RequestRecord
from workloads.run_workload import WorkloadRun

NS = 1_000_000_000
OK = Verification(True, "affinity", "0", 1, 1)


class FakeGpu:
    """An NVML stand-in: 95% busy while the load runs, idle otherwise."""

    def __init__(self) -> None:
        self.busy = False

    def read(self) -> dict[int, dict[str, float]]:
        return {0: {"util": 95.0 if self.busy else 0.0, "mem_gib": 10.0}}

    def close(self) -> None:
        pass


class FakeReplica:
    def __init__(self, clock: TickClock, gpu: FakeGpu, calls: list[str]) -> None:
        self.reset = "True"  # the prefix_cache_reset param begin_window gives (orchestrator.values.figures)
        self.clock, self.gpu, self.calls = clock, gpu, calls
        self.alive = True
        self.sampler: TelemetrySampler | None = None
        self.figures: WindowFigures | None = None

    def _serving(self) -> None:
        if not self.alive:
            raise ConnectionRefusedError("[Errno 111] Connection refused")

    def verify(self) -> Verification:
        return OK if self.alive else Verification(False, "affinity", "0", 0, 0, ("pid 1 is gone",))

    def status(self) -> ServerStatus:
        return ServerStatus(self.alive, "" if self.alive else "INFO engine started\nKilled")

    def begin_gpu_profile(self, delay_s: float) -> bool:
        return False

    def reset_prefix_cache(self) -> bool:
        self._serving()
        return True

    def begin_side_accounting(self) -> None:
        pass

    def end_side_accounting(self) -> dict[str, float]:
        return {}

    def begin_window(self, client: list[int], gpu_ids: list[int]) -> dict[str, Any]:
        self._serving()  # the reset and the before-scrape
        self.calls.append("begin_window")
        self.sampler = TelemetrySampler(replica_cpus=[0], client_cpus=[1], hz=0, clock=self.clock.now,
                                        gpu_reader=self.gpu, cpu_percent=lambda: [100.0 if self.gpu.busy else 2.0] * 2)
        self.sampler.start()
        self.clock.listeners.append(self.sampler.sample_now)
        return {"prefix_cache_reset": self.reset}

    def end_window(self, requests: int, span: WindowSpan | None) -> WindowFigures:
        self.calls.append("end_window")
        self.clock.listeners.clear()
        rows = self.sampler.stop()
        span_rows, facts = window_series(rows, self.sampler.started_at, self.sampler.sampled_s, span)
        self._serving()  # the after-scrape
        self.figures = WindowFigures(server={}, rows=rows, span_rows=span_rows, alive=True, block_size=32, span=facts)
        return self.figures


class FakeWorkload:
    """Set-up 5 s and tokenize-after 5 s with the GPU idle; the requests 10 s with it busy. ``connect_s``
    and ``tail_s``: idle time inside the load call before the first send and after the last completion
    (the client's connections opening and closing), which the sampler sees but the span leaves out."""

    def __init__(self, clock: TickClock, gpu: FakeGpu, calls: list[str], connect_s: float = 0.0,
                 tail_s: float = 0.0) -> None:
        self.clock, self.gpu, self.calls = clock, gpu, calls
        self.connect_s, self.tail_s = connect_s, tail_s
        self.run: WorkloadRun | None = None

    def pin(self, cpus: list[int]) -> Verification:
        return OK

    def verify(self) -> Verification:
        return OK

    def prepare(self, spec_json: str, tokenizer: str, trace: Any) -> int:
        self.calls.append("prepare")
        self.clock.advance(5.0)
        return 2

    def load(self, base_url: str, model: str) -> WorkloadRun:
        self.calls.append("load")
        self.clock.advance(self.connect_s)
        start = int(self.clock.now() * NS)
        self.gpu.busy = True
        self.clock.advance(10.0)
        self.gpu.busy = False
        end = int(self.clock.now() * NS)
        self.clock.advance(self.tail_s)
        records = tuple(RequestRecord(
            request_id=f"s{i}:0", session_id=f"s{i}", turn=0, scheduled_ns=start, sent_ns=start,
            first_token_ns=start + NS // 2, token_ns=(start + NS // 2,), end_ns=end, prompt_tokens=100,
            completion_tokens=1, cached_tokens=0, client_prompt_tokens=100, tokenize_ns=0, status="ok")
            for i in range(2))
        self.run = WorkloadRun(records=records, client_cpu_s=0.1, wall_s=10.0, warnings=(), client_cores=1,
                               window_start_ns=start, window_end_ns=end - NS)
        return self.run

    def finish(self) -> WorkloadRun:
        self.calls.append("finish")
        self.clock.advance(5.0)
        assert self.run is not None
        return self.run

    def bare(self, *args: Any) -> BareRun:
        self.calls.append("bare")
        return BareRun([{"request_id": "s0:0", "ttft_s": 0.5, "status": "ok"}])


def _trial(repeat: int = 0, crosscheck: bool = False):
    return agentic_trial(repeat=repeat, crosscheck=crosscheck)


def _sequence(tmp_path: Path, *, repeat: int = 0, crosscheck: bool = False, on_step: Any = None,
              connect_s: float = 0.0, tail_s: float = 0.0, references: bool | None = None):
    clock, gpu, calls = TickClock(), FakeGpu(), []
    replica = FakeReplica(clock, gpu, calls)
    window = Window(trial=_trial(repeat, crosscheck), tdir=tmp_path, replica=Remote(replica),
                    workload=Remote(FakeWorkload(clock, gpu, calls, connect_s, tail_s)),
                    up=ReplicaUp(base_url="http://127.0.0.1:1", tokenizer_path="tok", params={}),
                    alloc=CoreGrant(replica=[0], client=[1], client_isolated=True, host={}), gpu_ids=[0],
                    trace=None, warmup=True, references=references)
    return WindowSequence(window, get=lambda x: x, on_step=on_step), replica, calls


def test_window_means_cover_the_requests_span_not_setup_or_tokenize_after(tmp_path: Path) -> None:
    seq, replica, calls = _sequence(tmp_path)
    result = seq.run({"window_on_start": 1}, [], 0.0)
    assert result.status is TrialStatus.COMPLETED, result.message
    # set-up before the window opens, client-side tokenization after it closes
    assert calls == ["prepare", "begin_window", "load", "end_window", "finish"]
    m = result.metrics
    assert m["gpu0_util_mean"] == pytest.approx(95.0)
    assert m["replica_cpu_util_mean"] == pytest.approx(100.0)
    assert m["window_span_s"] == pytest.approx(10.0, abs=0.01)
    assert m["window_drain_s"] == pytest.approx(1.0, abs=0.01)
    # the sampler never saw the 5 s of set-up nor the 5 s of tokenize-after: 10 s at 10 Hz, all busy
    gpu_rows = [r for r in result.telemetry if r["name"] == "gpu0_util"]
    assert len(gpu_rows) == 100 and summarize_series(result.telemetry)["gpu0_util_mean"] == pytest.approx(95.0)


@pytest.mark.parametrize("reset,warned", [("True", False), ("off", False), ("False", True)])
def test_a_failed_prefix_cache_reset_is_a_warning(tmp_path: Path, reset: str, warned: bool) -> None:
    seq, replica, _ = _sequence(tmp_path)
    replica.reset = reset
    result = seq.run({"window_on_start": 1}, [], 0.0)
    assert result.status is TrialStatus.COMPLETED, result.message
    assert result.params["prefix_cache_reset"] == reset
    assert any("prefix cache could not be reset" in w for w in result.warnings) is warned


def test_trial_metrics_are_the_span_rows_means_not_every_rows(tmp_path: Path) -> None:
    # The client opens its connections for 3 s before the first send and closes them for 2 s after the
    # last completion, inside the load call: the sampler records that idle time, the span leaves it out.
    seq, replica, _ = _sequence(tmp_path, connect_s=3.0, tail_s=2.0)
    result = seq.run({"window_on_start": 1}, [], 0.0)
    assert result.status is TrialStatus.COMPLETED, result.message
    figures = replica.figures
    assert figures is not None
    every, in_span = summarize_series(figures.rows), summarize_series(figures.span_rows)
    # the rows outside the span carry other values: a mean over every row is not the span's
    assert every["gpu0_util_mean"] == pytest.approx(95.0 * 10 / 15, abs=1)
    assert every["replica_cpu_util_mean"] == pytest.approx((100.0 * 10 + 2.0 * 5) / 15, abs=1)
    assert in_span["gpu0_util_mean"] == pytest.approx(95.0) and in_span["replica_cpu_util_mean"] == pytest.approx(100.0)
    m = result.metrics
    for name in ("gpu0_util_mean", "replica_cpu_util_mean", "client_cpu_util_mean"):
        assert m[name] == pytest.approx(in_span[name]), name
    assert m["window_span_s"] == pytest.approx(10.0, abs=0.01) and m["telemetry_outside_span_s"] == pytest.approx(5.0)
    assert len(result.telemetry) == len(figures.rows)  # every row is still kept, for the telemetry artifact


def test_means_over_every_sampled_row_would_be_diluted_by_idle_setup(tmp_path: Path) -> None:
    # The sampler started before the set-up (as it did when the workload built its text inside the
    # window): the rows outside the span are idle and the span's mean ignores them.
    clock, gpu = TickClock(), FakeGpu()
    sampler = TelemetrySampler(hz=0, clock=clock.now, gpu_reader=gpu, cpu_percent=lambda: [])
    sampler.start()
    clock.listeners.append(sampler.sample_now)
    clock.advance(5.0)  # set-up: idle
    start = int(clock.now() * NS)
    gpu.busy = True
    clock.advance(10.0)  # the requests
    gpu.busy = False
    end = int(clock.now() * NS)
    clock.advance(5.0)  # tokenize-after: idle
    rows = sampler.stop()
    span_rows, facts = window_series(rows, sampler.started_at, sampler.sampled_s, WindowSpan(start, end, end))
    assert summarize_series(rows)["gpu0_util_mean"] == pytest.approx(95.0 * 10 / 20, abs=3)
    assert summarize_series(span_rows)["gpu0_util_mean"] == pytest.approx(95.0)
    assert facts["window_span_s"] == pytest.approx(10.0) and facts["telemetry_outside_span_s"] == pytest.approx(10.0)


def test_order_rotates_with_the_repeat_and_the_bench_follows_the_harness() -> None:
    assert [order_of(["bare"], r) for r in range(3)] == [["harness", "bare"], ["bare", "harness"], ["harness", "bare"]]
    assert order_label(order_of(["bare"], 1)) == "bare-first" and order_label(["harness", "bare"]) == "harness-first"
    three = [order_of(["bare", "vllm-bench"], r) for r in range(3)]
    assert three == [["harness", "bare", "vllm-bench"], ["bare", "harness", "vllm-bench"],
                     ["harness", "vllm-bench", "bare"]]
    for order in three:  # vllm bench serve replays what the harness sent: always after it
        assert order.index("harness") < order.index("vllm-bench")
    assert order_of([], 5) == ["harness"]


def test_bare_first_on_odd_repeats(tmp_path: Path) -> None:
    seq, _, calls = _sequence(tmp_path, repeat=1, crosscheck=True)
    result = seq.run({"window_on_start": 1}, [], 0.0)
    assert result.ok, result.message
    assert calls.index("bare") < calls.index("begin_window")
    assert result.params["crosscheck_order"] == "bare-first"
    assert "crosscheck_ttft_p50_ratio" in result.metrics and (tmp_path / "bare.jsonl").exists()


@pytest.mark.parametrize("crosscheck,references,runs", [(False, True, True), (True, False, False),
                                                         (True, None, True), (False, None, False)])
def test_the_executors_decision_overrides_the_protocols(tmp_path: Path, crosscheck: bool,
                                                         references: bool | None, runs: bool) -> None:
    """crosscheck: auto: the executor decides per window (Window.references); None leaves it to the protocol."""
    seq, _, calls = _sequence(tmp_path, crosscheck=crosscheck, references=references)
    result = seq.run({"window_on_start": 1}, [], 0.0)
    assert result.ok, result.message
    assert ("bare" in calls) is runs and ("crosscheck_ttft_p50_ratio" in result.metrics) is runs


@pytest.mark.parametrize("step", ["reset", "scrape", "crosscheck", "verify"])
def test_a_server_found_dead_at_any_step_is_server_died(tmp_path: Path, step: str) -> None:
    assert step in STEPS
    holder: dict[str, FakeReplica] = {}

    def kill(name: str) -> None:
        if name == step:
            holder["replica"].alive = False

    seq, replica, _ = _sequence(tmp_path, crosscheck=True, on_step=kill)
    holder["replica"] = replica
    with pytest.raises(TrialFailure) as info:
        seq.run({"window_on_start": 1}, [], 0.0)
    assert info.value.kind is ErrorKind.SERVER_DIED and info.value.kind.retryable
    assert f"during the {step}" in str(info.value) and "Killed" in str(info.value)  # the log's end


def test_references_table_puts_the_three_clients_side_by_side_with_their_spread() -> None:
    import pandas as pd

    from orchestrator.observe.report.comparison import references

    rows = []
    for rep, (h, b, v) in enumerate([(0.50, 0.60, 0.62), (0.55, 0.58, 0.60), (0.52, 0.70, 0.64)]):
        rows.append({"model": "m", "workload": "w", "start": "repin", "cores": 1, "repeat": rep, "status": "COMPLETED",
                     "crosscheck_ttft_p50_harness_s": h, "crosscheck_ttft_p90_harness_s": 2 * h,
                     "crosscheck_ttft_p50_bare_s": b, "crosscheck_ttft_p90_bare_s": 2 * b,
                     "crosscheck_vllm_bench_ttft_p50_s": v, "crosscheck_vllm_bench_ttft_p90_s": 2 * v,
                     "gpu0_util_mean": 70.0 + rep})
    rows.append({**rows[0], "repeat": 3, "status": "FAILED"})  # a failed repeat is left out
    out = references(pd.DataFrame(rows))
    assert len(out) == 1
    r = out.iloc[0]
    assert r["repeats"] == 3 and r["harness_p50_s"] == pytest.approx(0.52) and r["bare_p50_s"] == pytest.approx(0.60)
    assert r["vllm_bench_p50_s"] == pytest.approx(0.62) and r["vllm_bench_p90_s"] == pytest.approx(1.24)
    assert r["harness_vs_bare"] == pytest.approx(0.50 / 0.60)  # the median of the per-repeat ratios (0.83, 0.95, 0.74)
    assert r["bare_p50_spread"] == pytest.approx((0.70 - 0.58) / 0.60)
    assert r["gpu0_util_mean"] == pytest.approx(71.0)
    assert references(pd.DataFrame([{"status": "COMPLETED", "cores": 1}])).empty
