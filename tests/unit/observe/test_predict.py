"""The predicted knee: the queueing maths, the fit, the hold-out check and bad input (pure)."""

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.observe.analysis.predict import (
    KneeModel,
    cannot_fit,
    closed_residence_s,
    default_threads,
    fit,
    holdout,
    knee_of,
    open_residence_s,
    rule_of_thumb_cores,
)

TRUE = {"gpu_s": 0.15, "cpu_s": 0.07, "threads": 3, "requests": 16, "decode_s": 0.75}


def mva(requests: int, delay_s: float, work_s: float, servers: int) -> tuple[float, float]:
    """Load-dependent mean value analysis (Reiser-Lavenberg): the CPU stage's residence time and the
    throughput, computed another way than the module's product form, so the two check each other."""
    p = [1.0]  # p[j]: probability of j requests at the CPU stage, with n - 1 requests in the network
    r = x = 0.0
    for n in range(1, requests + 1):
        r = sum(j * work_s / min(j, servers) * p[j - 1] for j in range(1, n + 1))
        x = n / (delay_s + r)
        new = [x * work_s / min(j, servers) * p[j - 1] for j in range(1, n + 1)]
        p = [1.0 - sum(new), *new]
    return r, x


def rows_from(cores, *, gpu_s=TRUE["gpu_s"], cpu_s=TRUE["cpu_s"], threads=TRUE["threads"],
              requests=TRUE["requests"], decode_s=TRUE["decode_s"], noise=None, seed=0) -> pd.DataFrame:
    """Comparison-like rows of one configuration, generated from the closed model with :func:`mva`."""
    rng = np.random.default_rng(seed)
    out = []
    for c in cores:
        r, x = mva(requests, gpu_s + decode_s, cpu_s, min(c, threads))
        ttft = gpu_s + r
        if noise:
            ttft *= math.exp(rng.normal(0, noise))
        out.append({"model": "m", "workload": "w", "gpus": 1, "api_servers": 1, "cores": c, "ttft_p50_s": ttft,
                    "e2e_p50_s": ttft + decode_s, "request_throughput_rps": x})
    return pd.DataFrame(out)


def test_product_form_agrees_with_mean_value_analysis():
    for n, servers in [(1, 1), (8, 1), (16, 2), (16, 3), (12, 12)]:
        r, _ = mva(n, 0.9, 0.07, servers)
        assert math.isclose(closed_residence_s(n, 0.9, 0.07, servers), r, rel_tol=1e-9)


def test_closed_stage_without_queue_is_its_work_and_single_server_is_the_repairman():
    assert math.isclose(closed_residence_s(4, 1.0, 0.2, 4), 0.2)  # a server for every request: no queue
    # machine repairman (N requests, one server): p0 = 1 / sum_j N!/(N-j)! (S/Z)^j, X = (1 - p0) / S
    n, z, s = 6, 0.5, 0.1
    p0 = 1 / sum(math.factorial(n) / math.factorial(n - j) * (s / z) ** j for j in range(n + 1))
    x = (1 - p0) / s
    assert math.isclose(closed_residence_s(n, z, s, 1), n / x - z, rel_tol=1e-9)


def test_open_stage_matches_mm1_and_mm2():
    assert math.isclose(open_residence_s(5.0, 0.1, 1), 0.1 / (1 - 0.5))
    rho = 15.0 * 0.1 / 2
    assert math.isclose(open_residence_s(15.0, 0.1, 2), 0.1 / (1 - rho ** 2))
    assert open_residence_s(25.0, 0.1, 2) == math.inf


def test_fit_recovers_the_parameters_and_predicts_unmeasured_cores_and_loads():
    m = fit(rows_from([1, 2, 4, 12]))
    assert isinstance(m, KneeModel)
    assert m.threads == 3 and math.isclose(m.load, TRUE["requests"], rel_tol=1e-9)
    assert math.isclose(m.gpu_s, TRUE["gpu_s"], rel_tol=0.02)
    assert math.isclose(m.cpu_s, TRUE["cpu_s"], rel_tol=0.02)
    for c in (3, 6, 8, 16):  # core counts the calibration did not measure
        assert math.isclose(m.predict_ttft_p50(c), rows_from([c])["ttft_p50_s"][0], rel_tol=0.02)
    for n in (4, 8, 24):  # loads it did not measure
        truth = rows_from([1, 2], requests=n)["ttft_p50_s"]
        assert math.isclose(m.predict_ttft_p50(1, load=n), truth[0], rel_tol=0.02)
        assert math.isclose(m.predict_ttft_p50(2, load=n), truth[1], rel_tol=0.02)
    assert set(m.params) == {"gpu_ttft_s", "cpu_work_s", "cpu_threads", "concurrency_requests", "decode_s"}
    assert m.inputs["cores"] == [1, 2, 4, 12] and m.inputs["config"]["workload"] == "w"
    assert m.fit_error_rms < 1e-3
    assert m.within_calibration(3) and not m.within_calibration(16)


def test_knee_of_the_fitted_model_is_the_true_knee():
    cores = [1, 2, 3, 4, 6, 8, 12, 16]
    truth = rows_from(cores)
    m = fit(rows_from([1, 2, 4, 12]))
    assert m.knee(cores) == knee_of(cores, list(truth["ttft_p50_s"]))
    assert knee_of([1, 2, 4, 8], [0.80, 0.30, 0.105, 0.100]) == 4  # the rule of report.comparison
    assert m.knee(cores, tolerance=10.0) == 1


def test_holdout_on_model_data_is_within_two_percent_and_keeps_the_knee():
    rows = rows_from([1, 2, 3, 4, 8])
    h = holdout(rows)
    assert list(h["cores"]) == [1, 2, 3, 4, 8]
    assert (h["error"].abs() < 0.02).all()
    assert np.allclose(h["predicted_s"], h["measured_s"], rtol=0.02)
    assert (h["knee_holdout"] == h["knee_measured"]).all() and (h["knee_predicted"] == h["knee_measured"]).all()
    assert (h["note"] == "").all()


def test_too_few_core_counts_gives_none_and_says_why():
    assert fit(rows_from([1, 4])) is None
    assert "needs 3" in cannot_fit(rows_from([1, 4]))
    failed = rows_from([1, 2, 4])
    failed.loc[0, "ttft_p50_s"] = float("nan")  # a failed core count has no TTFT
    assert fit(failed) is None
    starved = rows_from([1, 2, 4]).assign(timeout_rate=[0.6, 0.0, 0.0])  # most of 1 core's requests timed out
    assert fit(starved) is None and "2 core count(s)" in cannot_fit(starved)
    h = holdout(rows_from([1, 2, 4]))  # leaving one out leaves two
    assert h["predicted_s"].isna().all() and h["note"].str.contains("without cores=").all()
    assert h["knee_predicted"].notna().all()
    assert holdout(rows_from([1, 2, 4]).iloc[0:0]).empty


def test_closed_loop_needs_throughput_and_e2e():
    rows = rows_from([1, 2, 4]).drop(columns=["e2e_p50_s"])
    assert fit(rows) is None and "E2E" in cannot_fit(rows)


def test_cpu_only_configuration_is_refused():
    rows = rows_from([1, 2, 4]).assign(gpus=0)
    assert fit(rows) is None and "gpus=0" in cannot_fit(rows)


def test_noisy_and_odd_data_do_not_crash():
    for seed in range(5):
        rows = rows_from([1, 2, 4, 8, 12], noise=0.10, seed=seed)
        m = fit(rows)
        assert m is not None and m.gpu_s > 0 and m.cpu_s > 0 and math.isfinite(m.fit_error_rms)
        h = holdout(rows)
        assert h["predicted_s"].map(math.isfinite).all()
        assert h["knee_holdout"].isin([1, 2, 4, 8, 12]).all()
    rising = rows_from([1, 2, 4]).assign(ttft_p50_s=[0.2, 0.3, 0.4])  # more cores, slower: no CPU queue to fit
    m = fit(rising)
    assert m is not None and all(math.isfinite(m.predict_ttft_p50(c)) for c in (1, 2, 4, 64))


def test_open_loop_fit_recovers_rate_and_parameters():
    rate, g, s = 12.0, 0.1, 0.06
    rows = pd.DataFrame([{"cores": c, "gpus": 1, "ttft_p50_s": g + open_residence_s(rate, s, min(c, 3)),
                          "request_throughput_rps": rate} for c in (1, 2, 4, 8)])
    m = fit(rows, loop="open")
    assert m is not None and m.loop == "open" and "request_rate_rps" in m.params
    assert math.isclose(m.gpu_s, g, rel_tol=0.02) and math.isclose(m.cpu_s, s, rel_tol=0.02)
    assert math.isclose(m.predict_ttft_p50(1, load=8.0), g + s / (1 - 8.0 * s), rel_tol=0.02)
    assert m.predict_ttft_p50(1, load=20.0) == math.inf


def test_threads_are_fitted_only_where_the_core_counts_allow():
    rows = rows_from([1, 2, 3, 4, 6, 8, 12, 16], threads=5, cpu_s=0.2)
    m = fit(rows, threads="fit")
    assert m.threads == 5 and m.inputs["threads_from"] == "fit"
    assert math.isclose(m.cpu_s, 0.2, rel_tol=0.02)
    few = fit(rows_from([1, 2, 4, 8], threads=5, cpu_s=0.2), threads="fit")
    assert few.threads == 3 and few.inputs["threads_from"] == "1 + api_servers + gpus"
    h = holdout(rows_from([1, 2, 3, 4, 6], threads=3, cpu_s=0.2), threads="fit")
    assert (h["error"].abs() < 0.02).all()


def test_threads_come_from_the_configuration_or_the_caller():
    assert default_threads(rows_from([1]).assign(api_servers=2, gpus=4)) == 7
    assert default_threads(pd.DataFrame({"cores": [1]})) == 3
    assert fit(rows_from([1, 2, 4, 12]), threads=8).threads == 8
    assert rule_of_thumb_cores(1) == 3 and rule_of_thumb_cores(8) == 10


@pytest.mark.parametrize("change, words", [
    (lambda d: d.drop(columns=["ttft_p50_s"]), ["ttft_p50_s"]),
    (lambda d: d.assign(workload=["a", "b", "a"]), ["workload", "a, b"]),
    (lambda d: d.assign(cores=[1, 2, 2]), ["cores", "2"]),
    (lambda d: d.assign(cores=[1, 0, 4]), ["cores", "row 1"]),
    (lambda d: d.assign(ttft_p50_s=["0.5", "fast", "0.2"]), ["ttft_p50_s", "row 1", "fast"]),
])
def test_bad_input_names_the_column(change, words):
    with pytest.raises(ValueError) as err:
        fit(change(rows_from([1, 2, 4])))
    assert all(w in str(err.value) for w in words)


def test_predict_rejects_bad_cores_and_load():
    m = fit(rows_from([1, 2, 4, 12]))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="cores"):
            m.predict_ttft_p50(bad)
    with pytest.raises(ValueError, match="load"):
        m.predict_ttft_p50(2, load=0)
    with pytest.raises(ValueError, match="empty"):
        m.knee([])
