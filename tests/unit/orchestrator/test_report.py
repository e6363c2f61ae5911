"""Comparison table, speedups and knee: pure."""

import math

from orchestrator.observe.report.comparison import comparison, render, results_frame
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus


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
    from orchestrator.observe.report.comparison import calibration

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

    from orchestrator.observe.report.comparison import costs

    df = pd.DataFrame([
        {"trial_id": "a", "gpus": 1, "cores": 1, "status": "COMPLETED", "ttft_p50_s": 0.3, "request_throughput_rps": 5.0},
        {"trial_id": "b", "gpus": 1, "cores": 8, "status": "COMPLETED", "ttft_p50_s": 0.1, "request_throughput_rps": 8.0},
    ])
    out = costs(df, core_hour_usd=0.05, gpu_hour_usd=4.0).set_index("trial_id")
    assert math.isclose(out.loc["a", "hourly_usd"], 4.05)
    assert math.isclose(out.loc["b", "core_share"], 0.4 / 4.4)
    assert math.isclose(out.loc["b", "usd_per_1k_requests"], 4.4 / (8.0 * 3600) * 1000)
    assert out.loc["b", "usd_per_1k_requests"] < out.loc["a", "usd_per_1k_requests"]


def test_repeats_are_aggregated_with_their_spread_flagged():
    from orchestrator.observe.report.comparison import spread_warnings

    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 4]}, "repeats": 3,
    }))
    # cores=1 repeats agree within 4%; cores=4 repeats disagree by 50%.
    ttft = {(1, 0): 1.00, (1, 1): 1.02, (1, 2): 0.98, (4, 0): 0.40, (4, 1): 0.60, (4, 2): 0.50}
    results = [TrialResult(t.trial_id, TrialStatus.COMPLETED,
                           metrics={"ttft_p50_s": ttft[(t.cores, t.repeat)], "requests": 10, "timeouts": 1})
               for t in p.trials]
    df = comparison(results_frame(p.trials, results)).set_index("cores")
    assert len(df) == 2 and list(df["repeats"]) == [3, 3]
    assert math.isclose(df.loc[1, "ttft_p50_s"], 1.00) and math.isclose(df.loc[4, "ttft_p50_s"], 0.50)
    assert math.isclose(df.loc[1, "p50_spread"], 0.04) and df.loc[1, "spread_flag"] == ""
    assert math.isclose(df.loc[4, "p50_spread"], 0.40) and df.loc[4, "spread_flag"] == "!"
    assert df.loc[4, "requests"] == 30 and df.loc[4, "timeouts"] == 3
    assert math.isclose(df.loc[4, "speedup_p50"], 2.0)
    warned = spread_warnings(df.reset_index())
    assert len(warned) == 1 and "cores=4" in warned[0] and "40%" in warned[0]


def test_interleaved_and_shuffled_orders_never_run_one_configuration_in_a_row():
    spec = {
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 4, 12]}, "repeats": 3,
    }
    interleaved = expand(parse_spec(spec)).trials
    assert [t.cores for t in interleaved[:4]] == [1, 2, 4, 12] and [t.repeat for t in interleaved[:4]] == [0] * 4
    shuffled = expand(parse_spec({**spec, "protocol": {"order": "shuffled", "seed": 3}})).trials
    assert sorted(t.trial_id for t in shuffled) == sorted(t.trial_id for t in interleaved)
    assert [t.trial_id for t in shuffled] != [t.trial_id for t in interleaved]
    again = expand(parse_spec({**spec, "protocol": {"order": "shuffled", "seed": 3}})).trials
    assert [t.trial_id for t in again] == [t.trial_id for t in shuffled]  # seeded: the same order every time


def test_shared_start_groups_the_windows_of_one_core_count():
    from orchestrator.control.ray_executor import start_key

    spec = {
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "a", "kind": "agentic", "sessions": 1, "turns": 1},
                      {"name": "u", "kind": "agentic", "sessions": 1, "turns": 1, "text_style": "uniform"}],
        "grid": {"cores": [1, 12]}, "repeats": 2, "protocol": {"share_start": True, "crosscheck": [12]},
    }
    trials = expand(parse_spec(spec)).trials
    assert [(t.cores, t.repeat, t.workload.name) for t in trials] == [
        (1, 0, "a"), (1, 0, "u"), (1, 1, "a"), (1, 1, "u"), (12, 0, "a"), (12, 0, "u"), (12, 1, "a"), (12, 1, "u")]
    assert len({start_key(t) for t in trials[:4]}) == 1 and start_key(trials[0]) != start_key(trials[4])
    assert [t.protocol.crosschecks(t.cores) for t in trials] == [False] * 4 + [True] * 4


def test_a_core_count_where_most_requests_timed_out_gets_no_speedup_or_knee():
    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 4]},
    }))
    # at 1 core the few requests that finished were quick ones: their TTFT would look like the best
    metrics = {1: {"ttft_p50_s": 0.09, "timeout_rate": 0.8}, 2: {"ttft_p50_s": 0.3, "timeout_rate": 0.0},
               4: {"ttft_p50_s": 0.1, "timeout_rate": 0.0}}
    results = [TrialResult(t.trial_id, TrialStatus.COMPLETED, metrics=metrics[t.cores]) for t in p.trials]
    df = comparison(results_frame(p.trials, results)).set_index("cores")
    assert math.isnan(df.loc[1, "speedup_p50"]) and df.loc[1, "knee"] == ""
    assert df.loc[4, "knee"] == "<- knee" and math.isclose(df.loc[4, "speedup_p50"], 3.0)


def test_outbox_payloads_and_mlflow_runs_give_the_same_rows():
    from types import SimpleNamespace

    from orchestrator.observe import outbox
    from orchestrator.observe.report.comparison import payloads_frame, runs_frame

    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [2]},
    }))
    t = p.trials[0]
    payload = outbox.trial_payload(t, TrialResult(t.trial_id, TrialStatus.COMPLETED, metrics={"ttft_p50_s": 0.2}))
    run = SimpleNamespace(data=SimpleNamespace(params=payload["params"], tags={**payload["tags"], "superseded": "false"},
                                               metrics={**payload["metrics"], "ts/replica_cpu_util": 50.0}),
                          info=SimpleNamespace(status="FINISHED"))
    a, b = payloads_frame([payload]), runs_frame([run])
    assert "ts/replica_cpu_util" not in b.columns  # a series' last sample is no summary figure
    assert a.to_dict("records") == b.to_dict("records")
    row = a.iloc[0]
    assert (row["cores"], row["gpus"], row["repeat"], row["status"], row["ttft_p50_s"]) == (2, 0, 0, "COMPLETED", 0.2)


def test_attribution_metrics_reach_the_comparison_and_the_diagnosis():
    from orchestrator.observe.analysis.diagnosis import diagnose

    p = expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 4]}, "repeats": 2,
    }))
    tok = {1: 0.30, 2: 0.12, 4: 0.05}  # the API server's CPU per request grows as cores shrink
    results = [TrialResult(t.trial_id, TrialStatus.COMPLETED, metrics={
        "ttft_p50_s": 0.1 + tok[t.cores], "requests": 10, "timeouts": 0, "server_ttft_s_mean": 0.1 + tok[t.cores],
        "server_frontend_s_mean": tok[t.cores], "cpu_s_per_req_api_server": tok[t.cores] + 0.01 * t.repeat,
        "cpu_s_per_req_api_server.tokenization": tok[t.cores] * 0.8, "cpu_s_per_req_engine_core": 0.02})
        for t in p.trials]
    df = comparison(results_frame(p.trials, results)).set_index("cores")
    assert math.isclose(df.loc[1, "cpu_s_per_req_api_server"], 0.305)  # the mean of the two repeats
    assert math.isclose(df.loc[4, "cpu_s_per_req_api_server.tokenization"], 0.04)
    d = diagnose(df.reset_index())
    assert d.stage == "frontend" and "api_server" in d.sentence
