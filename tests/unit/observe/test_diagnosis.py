"""diagnose(): which stage saturates first as cores shrink, from constructed comparison rows."""

import math

import pandas as pd
import pytest

from orchestrator.observe.analysis.diagnosis import diagnose

CONFIG = {"model": "llama-3.1-8b", "hardware": "H200", "gpus": 1, "vllm_variant": "default", "api_servers": 1,
          "workload": "long", "text_style": "uniform", "restriction": "cpuset", "start": "fresh"}
COLS = ["cores", "ttft_p50_s", "server_ttft_s_mean", "server_frontend_s_mean", "replica_cpu_util_mean",
        "gpu0_util_mean", "server_num_requests_running_mean", "client_in_flight_mean"]


def frame(*points, status="COMPLETED", **extra):
    """Comparison rows of one configuration, one point (tuple in COLS order) per core count."""
    rows = [{**CONFIG, "status": status, **dict(zip(COLS, p))} for p in points]
    df = pd.DataFrame(rows)
    for k, v in extra.items():
        df[k] = v
    return df


# The worked example: one H200, 16 long agentic sessions, text that tokenizes slowly. At 12 cores
# 911 of 968 ms of server TTFT is frontend and 2.8 of the 16 requests in flight run in the engine;
# more cores stopped helping after 4.
WORKED = frame((1, 1.238, 1.116, 1.067, 73.0, 60.0, 3.7, 16.0),
               (2, 0.800, 0.815, 0.765, 47.0, 50.0, 4.8, 16.0),
               (4, 0.640, 0.577, 0.529, 26.0, 55.0, 4.5, 16.0),
               (12, 0.650, 0.968, 0.911, 9.0, 53.0, 2.8, 16.0))


def test_the_worked_example_says_try_more_api_servers():
    d = diagnose(WORKED)
    assert d.stage == "frontend"
    assert d.sentence.startswith("frontend-bound; more cores do not help; try more API servers")
    assert "911 of 968 ms of server TTFT is frontend" in d.sentence
    assert "2.8 of 16 requests in flight" in d.sentence and "this configuration runs 1" in d.sentence
    assert math.isclose(d.evidence["frontend_share_hi"], 0.911 / 0.968)
    assert math.isclose(d.evidence["running_share"], 2.8 / 16)
    assert d.evidence["cores_hi"] == 12 and d.evidence["knee_cores"] == 4
    assert "cores helped up to the knee at 4" in d.sentence
    assert d.headline.startswith("Frontend-bound, and more cores do not help: at 12 cores 911 of 968 ms of server "
                                 "TTFT is frontend") and d.headline.endswith("try more API servers (this "
                                                                             "configuration runs 1).")


def test_the_worked_example_at_one_core_count():
    # Only the 12-core row: the replica's idle cores show that more cores would not help.
    d = diagnose(WORKED[WORKED["cores"] == 12])
    assert d.stage == "frontend"
    assert d.sentence.startswith("frontend-bound; more cores do not help; try more API servers")
    assert "911 of 968 ms" in d.sentence and "9% busy" in d.sentence


def test_frontend_that_cores_fix():
    # The frontend holds most of what grows, but at the most cores it is not the whole queue,
    # and the engine runs half of what is in flight: cores, not API servers.
    d = diagnose(frame((1, 0.529, 0.524, 0.431, 71.0, 56.0, 7.0, 16.0),
                       (2, 0.243, 0.251, 0.172, 43.0, 59.0, 7.8, 16.0),
                       (4, 0.235, 0.240, 0.152, 21.0, 60.0, 7.6, 16.0),
                       (12, 0.230, 0.236, 0.147, 8.0, 62.0, 8.4, 16.0)))
    assert d.stage == "frontend"
    assert d.sentence.startswith("frontend-bound as cores shrink; the fix is cores (the knee is at 2)")
    assert "284 of the 288 ms added to server TTFT is frontend" in d.sentence
    assert "API servers" not in d.sentence
    assert math.isclose(d.evidence["ttft_growth"], 0.529 / 0.230)


def test_engine_loop():
    d = diagnose(frame((1, 0.90, 0.85, 0.10, 97.0, 40.0, 12.0, 16.0),
                       (4, 0.32, 0.30, 0.08, 60.0, 70.0, 15.0, 16.0),
                       (8, 0.30, 0.28, 0.07, 35.0, 72.0, 15.5, 16.0)))
    assert d.stage == "engine"
    assert d.sentence.startswith("engine-bound as cores shrink; the fix is cores (the knee is at 4)")
    assert "3.00x from 8 to 1 cores" in d.sentence and "only 30 of the 570 ms" in d.sentence
    assert "97% busy at 1 core (saturated)" in d.sentence
    assert d.headline.startswith("Engine-bound as cores shrink, and more cores fix it: only 30 of the 570 ms added "
                                 "to server TTFT from 8 to 1 cores is frontend; the rest is queue and prefill")


def test_gpu():
    d = diagnose(frame((1, 0.31, 0.30, 0.02, 40.0, 96.0, 15.9, 16.0),
                       (2, 0.30, 0.29, 0.02, 22.0, 97.0, 15.9, 16.0),
                       (8, 0.30, 0.29, 0.02, 6.0, 97.0, 15.9, 16.0)))
    assert d.stage == "gpu"
    assert "not cores" in d.sentence and "96% busy" in d.sentence and "within 3%" in d.sentence


def test_flat_with_an_idle_gpu_names_no_stage():
    d = diagnose(frame((1, 0.31, 0.30, 0.02, 40.0, 30.0, 15.9, 16.0), (8, 0.30, 0.29, 0.02, 6.0, 31.0, 15.9, 16.0)))
    assert d.stage == "unknown" and "no stage saturates between 1 and 8 cores" in d.sentence


def test_the_role_that_grows_most_is_cited():
    df = frame((1, 0.90, 0.85, 0.10, 97.0, 40.0, 12.0, 16.0), (8, 0.30, 0.28, 0.07, 35.0, 72.0, 15.5, 16.0))
    df["cpu_s_per_req_api_server"] = [0.012, 0.010]
    df["cpu_s_per_req_engine_core"] = [0.030, 0.009]
    df["cpu_s_per_req_workers"] = [0.005, float("nan")]
    d = diagnose(df)
    assert d.stage == "engine" and "engine_core grows most (9.0 to 30.0 ms from 8 to 1 cores)" in d.sentence
    assert d.evidence["cpu_s_per_req_engine_core_lo"] == 0.030


def test_missing_columns_are_tolerated():
    # Only TTFT: it grows, but nothing tells the frontend from the engine.
    d = diagnose(pd.DataFrame({"cores": [1, 2, 4], "ttft_p50_s": [0.9, 0.4, 0.3]}))
    assert d.stage == "unknown"
    assert "the fix is cores (the knee is at 4)" in d.sentence and "server_frontend_s_mean" in d.sentence
    assert "API servers" not in d.sentence and d.evidence["ttft_growth"] == 3.0
    # No running gauge and no in-flight count: the frontend verdict still stands on its shares.
    d = diagnose(WORKED.drop(columns=["server_num_requests_running_mean", "client_in_flight_mean"]))
    assert d.stage == "frontend" and "requests in flight" not in d.sentence
    # The workload's concurrency stands in for the measured in-flight count.
    d = diagnose(WORKED.drop(columns=["client_in_flight_mean"]).assign(workload_concurrency="16"))
    assert "2.8 of 16 requests in flight" in d.sentence
    # NaN where a figure was not recorded: left out, never "nan" in a sentence.
    d = diagnose(WORKED.assign(server_frontend_s_mean=float("nan"), replica_cpu_util_mean=float("nan")))
    assert d.stage == "unknown" and "nan" not in (d.sentence + d.headline).lower()
    assert "server_frontend_s_mean_lo" not in d.evidence


def test_one_core_count_without_spare_cores():
    d = diagnose(frame((4, 0.30, 0.29, 0.10, 80.0, 60.0, 12.0, 16.0)))
    assert d.stage == "unknown" and "only 4 cores have a result" in d.sentence
    assert "100 of 290 ms" in d.sentence and d.evidence["cores_lo"] == 4


def test_all_failed_is_unknown_with_the_reason():
    df = frame((1, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), 16.0),
               (2, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), 16.0),
               status="FAILED", error_kind="timeout")
    d = diagnose(df)
    assert d.stage == "unknown"
    assert "every trial failed or had no ok request at 1, 2 cores (timeout)" in d.sentence
    assert d.evidence["core_counts_failed"] == 2
    assert diagnose(df.iloc[:0]).stage == "unknown"


def test_failures_at_the_fewest_cores_count_as_starvation():
    df = frame((1, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), 16.0),
               (2, 0.30, 0.29, 0.02, 22.0, 97.0, 15.9, 16.0),
               (8, 0.30, 0.29, 0.02, 6.0, 97.0, 15.9, 16.0))
    df.loc[0, "status"] = "FAILED"
    d = diagnose(df)
    assert d.stage == "unknown" and "at 1 core every trial failed" in d.sentence
    assert "the fix is cores" in d.sentence and "2 is the fewest cores that work" in d.sentence


def test_repeats_fold_into_one_point_per_core_count():
    # Raw trial rows: two repeats per core count, one of them failed.
    df = frame((1, 0.50, 0.52, 0.43, 70.0, 55.0, 7.0, 16.0), (1, 0.56, 0.53, 0.44, 72.0, 57.0, 7.0, 16.0),
               (4, 0.23, 0.24, 0.15, 20.0, 60.0, 8.0, 16.0), (4, float("nan"), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    df["repeat"] = [0, 1, 0, 1]
    df.loc[3, "status"] = "FAILED"
    d = diagnose(df)
    assert math.isclose(d.evidence["ttft_p50_s_lo"], 0.53) and math.isclose(d.evidence["ttft_p50_s_hi"], 0.23)
    assert math.isclose(d.evidence["replica_cpu_util_mean_lo"], 71.0)


def test_bad_input_names_the_column():
    with pytest.raises(ValueError, match="'cores'"):
        diagnose(pd.DataFrame({"ttft_p50_s": [0.1]}))
    two = pd.concat([WORKED, WORKED.assign(gpus=2)])
    with pytest.raises(ValueError, match="column 'gpus' takes 1, 2"):
        diagnose(two)


def test_the_growing_wait_and_the_gpu_side_explain_a_flat_cpu_cost():
    """The H200 pattern: CPU work per request flat, the wait for a core and the GPU's idle gaps growing."""
    df = frame((1, 0.60, 0.55, 0.10, 97.0, 40.0, 12.0, 16.0), (12, 0.24, 0.22, 0.07, 35.0, 72.0, 15.5, 16.0))
    df["cpu_s_per_req_engine_core"] = [0.039, 0.039]
    df["runq_wait_s_engine_core"] = [11.70, 0.0014]
    df["runq_wait_s_api_server"] = [11.30, 0.0006]
    df["gpu_profile_busy_frac"] = [0.71, 0.91]
    df["gpu_profile_gap_us_p99"] = [71.1, 8.1]
    d = diagnose(df)
    assert "grows most" not in d.sentence and "the CPU time per request grows by less than 20%" in d.sentence
    assert ("waiting for a core per window at 1 core: the engine_core 11.70 s (0.00 s at 12) and the api_server "
            "11.30 s (0.00 s at 12)") in d.sentence
    assert "the GPU was busy 71% of the time at 1 core against 91% at 12 (kernel gaps p99 71 against 8 us)" in d.sentence
    assert d.evidence["runq_wait_s_engine_core_lo"] == 11.70 and d.evidence["gpu_profile_busy_frac_hi"] == 0.91
    assert d.detail.startswith("The CPU time per request grows by less than 20% or 2 ms; waiting for a core")
    assert d.evidence["cpu_s_per_req_engine_core_lo"] == 0.039  # flat, and shown as such


def test_a_core_count_where_most_requests_time_out_is_no_knee():
    # At 1 core the few requests that finish are fast, but 80% time out: the knee is where most finish.
    df = frame((1, 0.20, 0.20, 0.05, 90.0, 40.0, 2.0, 16.0), (4, 0.30, 0.29, 0.05, 50.0, 70.0, 8.0, 16.0),
               (8, 0.29, 0.28, 0.05, 30.0, 72.0, 8.0, 16.0))
    df["timeout_rate"] = [0.8, 0.0, 0.0]
    d = diagnose(df)
    assert d.evidence["knee_cores"] == 4 and "TTFT p50 falls to 0.69x from 8 to 1 cores" in d.sentence
    assert "80% of its requests time out at 1 core (0% at 8)" in d.sentence


def test_the_decision_is_data_and_the_prose_only_says_it():
    """stage.decide names the case and keeps the figures; diagnosis.explain turns exactly that into sentences."""
    from orchestrator.observe.analysis.diagnosis import explain
    from orchestrator.observe.analysis.stage import decide

    f = decide(WORKED)
    assert (f.case, f.stage, f.c_lo, f.c_hi, f.knee, f.prev, f.top_flat) == ("frontend_queue", "frontend", 1, 12, 4,
                                                                               (4, 0.640), True)
    assert f.api_servers == 1 and f.evidence["knee_cores"] == 4.0
    assert explain(f) == diagnose(WORKED)
    engine = decide(frame((1, 1.2, 1.1, 0.2, 95.0, 50.0, 10.0, 16.0), (8, 0.4, 0.38, 0.15, 40.0, 60.0, 12.0, 16.0)))
    assert (engine.case, engine.stage, engine.growth) == ("engine", "engine", pytest.approx(3.0))
    assert engine.split == (pytest.approx(0.05), pytest.approx(0.72))
    assert decide(frame().reindex(columns=["cores"])).case == "no_trials"
