"""Comparison table, speedups and knee: pure."""

import math

from orchestrator.plan import expand
from orchestrator.report import comparison, render, results_frame
from orchestrator.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.spec import parse_spec


def test_speedup_and_knee():
    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 4, 8]},
    }))
    ttft = {1: 0.80, 2: 0.30, 4: 0.105, 8: 0.100}
    results = [TrialResult(t.trial_id, TrialStatus.COMPLETED,
                           metrics={"ttft_p50_s": ttft[t.cores], "requests": 10, "timeouts": 0})
               for t in p.trials]
    df = comparison(results_frame(p.trials, results))
    by = df.set_index("cores")
    assert math.isclose(by.loc[1, "speedup_p50"], 1.0)
    assert math.isclose(by.loc[8, "speedup_p50"], 8.0)
    assert by.loc[4, "knee"] == "<- knee" and by.loc[8, "knee"] == ""
    assert render(df).row_count == 4


def test_failed_trials_stay_in_the_table_without_speedup():
    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2]},
    }))
    results = [TrialResult.failed(p.trials[0].trial_id, ErrorKind.STARTUP_TIMEOUT, "slow"),
               TrialResult(p.trials[1].trial_id, TrialStatus.COMPLETED, metrics={"ttft_p50_s": 0.2})]
    df = comparison(results_frame(p.trials, results)).set_index("cores")
    assert df.loc[1, "status"] == "FAILED" and math.isnan(df.loc[1, "speedup_p50"])
    assert math.isclose(df.loc[2, "speedup_p50"], 1.0)


def test_calibration_pairs_fresh_and_repin():
    from orchestrator.report import calibration

    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 4], "start": ["fresh"], "calibrate": [1]},
    }))
    ttft = {("fresh", 1): 0.77, ("fresh", 4): 0.2, ("repin", 4): 0.2, ("repin", 1): 0.70}
    results = [TrialResult(t.trial_id, TrialStatus.COMPLETED,
                           metrics={"ttft_p50_s": ttft[(t.start, t.cores)], "ttft_p90_s": 2 * ttft[(t.start, t.cores)]})
               for t in p.trials]
    cal = calibration(results_frame(p.trials, results)).set_index("cores")
    assert math.isclose(cal.loc[1, "p50_ratio"], 0.70 / 0.77)
    assert set(cal.index) == {1, 4}


def test_costs_of_cores_against_gpus():
    import pandas as pd

    from orchestrator.report import costs

    df = pd.DataFrame([
        {"trial_id": "a", "gpus": 1, "cores": 1, "status": "COMPLETED", "ttft_p50_s": 0.3, "request_throughput_rps": 5.0},
        {"trial_id": "b", "gpus": 1, "cores": 8, "status": "COMPLETED", "ttft_p50_s": 0.1, "request_throughput_rps": 8.0},
    ])
    out = costs(df, core_hour_usd=0.05, gpu_hour_usd=4.0).set_index("trial_id")
    assert math.isclose(out.loc["a", "hourly_usd"], 4.05)
    assert math.isclose(out.loc["b", "core_share"], 0.4 / 4.4)
    assert math.isclose(out.loc["b", "usd_per_1k_requests"], 4.4 / (8.0 * 3600) * 1000)
    assert out.loc["b", "usd_per_1k_requests"] < out.loc["a", "usd_per_1k_requests"]
