"""knee_costs(): the starved configuration, its knee and one more GPU, priced, from constructed rows."""

import math

import pandas as pd
import pytest

from orchestrator.observe.analysis.cost import OUT_COLUMNS, knee_cost_ratio, knee_costs

CONFIG = {"model": "m", "hardware": "H200", "gpus": 1, "vllm_variant": "default", "api_servers": 1, "workload": "w",
          "text_style": "agent-mix", "restriction": "cpuset", "start": "fresh"}
PRICES = {"core_hour_usd": 0.05, "gpu_hour_usd": 4.0}


def rows(*points, **over):
    """Comparison rows: (cores, ttft_p50_s, request_throughput_rps[, status]) per core count."""
    out = []
    for p in points:
        status = p[3] if len(p) > 3 else "COMPLETED"
        out.append({**CONFIG, **over, "cores": p[0], "ttft_p50_s": p[1], "request_throughput_rps": p[2],
                    "status": status})
    return pd.DataFrame(out)


def per_1k(cores, gpus, rps):
    return (cores * 0.05 + gpus * 4.0) / (rps * 3600) * 1000


CFG = rows((1, 0.40, 5.0), (2, 0.195, 7.5), (4, 0.19, 7.8), (8, 0.18, 8.0))


def test_starved_knee_and_an_unmeasured_gpu():
    c = knee_costs(CFG, **PRICES)
    assert list(c.columns) == OUT_COLUMNS and list(c["option"]) == ["starved", "knee", "one more GPU"]
    starved, knee, gpu = (c.iloc[i] for i in range(3))
    assert (starved["cores"], knee["cores"], gpu["cores"], gpu["gpus"]) == (1, 2, 1, 2)
    assert math.isclose(starved["usd_per_hour"], 4.05) and math.isclose(knee["usd_per_hour"], 4.10)
    assert math.isclose(starved["usd_per_1k_requests"], per_1k(1, 1, 5.0))
    assert math.isclose(knee["usd_per_1k_requests"], per_1k(2, 1, 7.5))
    assert math.isclose(knee_cost_ratio(c), per_1k(2, 1, 7.5) / per_1k(1, 1, 5.0))
    assert knee["ttft_p50_s"] == 0.195 and starved["ttft_p50_s"] == 0.40
    # Not measured: no TTFT, and the stated assumption (the starved throughput) prices it.
    assert not gpu["measured"] and math.isnan(gpu["ttft_p50_s"]) and math.isnan(gpu["request_throughput_rps"])
    assert math.isclose(gpu["usd_per_hour"], 8.05) and math.isclose(gpu["usd_per_1k_requests"], per_1k(1, 2, 5.0))
    assert "not measured" in gpu["note"] and "2 GPUs at 1 core" in gpu["note"] and "assumes" in gpu["note"]


def test_a_trial_with_one_more_gpu_is_used_when_the_sweep_has_it():
    table = pd.concat([CFG, rows((1, 0.38, 5.2), (8, 0.15, 9.0), gpus=2), rows((1, 0.1, 50.0), gpus=2, model="x")])
    c = knee_costs(CFG, **PRICES, table=table)
    gpu = c[c["option"] == "one more GPU"].iloc[0]
    assert gpu["measured"] and gpu["ttft_p50_s"] == 0.38 and gpu["request_throughput_rps"] == 5.2
    assert math.isclose(gpu["usd_per_1k_requests"], per_1k(1, 2, 5.2)) and "measured: " in gpu["note"]
    # The same sweep without that core count: back to the stated assumption.
    c = knee_costs(CFG, **PRICES, table=table[table["cores"] != 1])
    assert not c.iloc[2]["measured"]


def test_the_fewest_cores_already_at_the_knee():
    c = knee_costs(rows((2, 0.20, 7.5), (4, 0.19, 7.8)), **PRICES)
    assert c.iloc[0]["cores"] == c.iloc[1]["cores"] == 2 and knee_cost_ratio(c) == 1.0
    assert "already there" in c.iloc[1]["note"]


def test_a_starved_configuration_that_failed():
    c = knee_costs(rows((1, float("nan"), float("nan"), "FAILED"), (4, 0.2, 7.0)), **PRICES)
    assert math.isnan(c.iloc[0]["usd_per_1k_requests"]) and "no completed trial at 1 core" in c.iloc[0]["note"]
    assert c.iloc[1]["cores"] == 4 and knee_cost_ratio(c) is None
    assert math.isnan(c.iloc[2]["usd_per_1k_requests"])  # the starved throughput it would assume is unknown


def test_nothing_completed_has_no_knee():
    c = knee_costs(rows((1, float("nan"), float("nan"), "FAILED")), **PRICES)
    assert c.iloc[1]["note"].startswith("no core count has a completed trial") and knee_cost_ratio(c) is None


def test_repeats_fold_into_the_median_and_the_mean():
    raw = rows((1, 0.40, 5.0), (1, 0.50, 4.0), (1, 0.30, 6.0), (2, 0.20, 7.0), (2, 0.9, 0.0, "FAILED"))
    c = knee_costs(raw, **PRICES)
    assert c.iloc[0]["ttft_p50_s"] == 0.40 and math.isclose(c.iloc[0]["request_throughput_rps"], 5.0)
    assert c.iloc[1]["cores"] == 2 and c.iloc[1]["request_throughput_rps"] == 7.0


def test_a_cpu_configuration_prices_its_first_gpu():
    c = knee_costs(rows((1, 0.04, 20.0), (2, 0.03, 30.0), gpus=0), **PRICES)
    assert math.isclose(c.iloc[0]["usd_per_hour"], 0.05) and c.iloc[2]["gpus"] == 1
    assert math.isclose(c.iloc[2]["usd_per_hour"], 4.05)


@pytest.mark.parametrize("call, match", [
    (lambda: knee_costs(CFG, core_hour_usd=-1, gpu_hour_usd=4.0), "core_hour_usd"),
    (lambda: knee_costs(CFG, core_hour_usd=0.05, gpu_hour_usd=float("nan")), "gpu_hour_usd"),
    (lambda: knee_costs(CFG, **PRICES, tolerance=-0.1), "tolerance"),
    (lambda: knee_costs(CFG.drop(columns=["gpus"]), **PRICES), "'gpus'"),
    (lambda: knee_costs(CFG.drop(columns=["cores"]), **PRICES), "'cores'"),
    (lambda: knee_costs(CFG.iloc[:0], **PRICES), "no rows"),
    (lambda: knee_costs(pd.concat([CFG, rows((1, 0.3, 5.0), workload="v")]), **PRICES), "column 'workload' takes w, v"),
    (lambda: knee_costs(CFG.assign(gpus="one"), **PRICES), "'gpus' holds 'one'"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
