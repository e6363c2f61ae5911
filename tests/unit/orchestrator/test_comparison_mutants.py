"""Mutation-testing kills for the comparison table and its knee (orchestrator/observe/report/comparison.py:
``aggregate``, ``comparison``); see tests/MUTATION.md."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from orchestrator.observe.report.comparison import COLUMNS, CONFIG, aggregate, comparison


def trial(i: int, cores: int, p50: float | None, status: str = "COMPLETED", **kw) -> dict:
    return {"trial_id": f"t{i}", "model": "m", "workload": kw.pop("workload", "w"), "cores": cores,
            "status": status, "ttft_p50_s": p50, **kw}


def test_aggregate_of_nothing_has_the_columns_without_speedup_and_knee() -> None:
    out = aggregate(pd.DataFrame())
    assert out.empty and list(out.columns) == [c for c in COLUMNS if c not in ("speedup_p50", "knee")]


def test_aggregate_over_repeats() -> None:
    df = pd.DataFrame([
        trial(1, 2, 1.0, requests=10, timeouts=1, ttft_p90_s=2.0, replica_cpu_util_mean=0.5, cpu_s_per_req_api=1.0),
        trial(2, 2, 2.0, requests=10, timeouts=3, ttft_p90_s=4.0, replica_cpu_util_mean=0.7, cpu_s_per_req_api=3.0),
        trial(3, 2, 4.0, requests=10, timeouts=5, ttft_p90_s=9.0, replica_cpu_util_mean=0.9, cpu_s_per_req_api=5.0),
        trial(4, 2, 100.0, status="FAILED", requests=10, timeouts=10, ttft_p90_s=100.0, replica_cpu_util_mean=9.0,
              cpu_s_per_req_api=99.0),
    ])
    row = aggregate(df).iloc[0]
    assert row["repeats"] == 4 and row["trials"] == "t1,t2,t3,t4"
    assert row["status"] == "3/4 ok"
    assert row["requests"] == 40 and row["timeouts"] == 19   # sums over every repeat
    assert row["ttft_p50_s"] == 2.0 and row["ttft_p90_s"] == 4.0  # medians over the completed ones
    assert row["replica_cpu_util_mean"] == pytest.approx(0.7)   # means over the completed ones
    assert row["cpu_s_per_req_api"] == pytest.approx(3.0)       # attribution columns too
    assert row["p50_spread"] == pytest.approx((4.0 - 1.0) / 2.0) and row["spread_flag"] == "!"
    assert all(row[c] == "-" for c in CONFIG if c not in ("model", "workload"))
    assert math.isnan(row["e2e_p50_s"])


def test_status_and_spread_edges() -> None:
    df = pd.DataFrame([trial(1, 1, 1.0), trial(2, 1, 1.1), trial(3, 2, None, status="FAILED"),
                       trial(4, 4, 1.0), trial(5, 4, 1.0999), trial(6, 8, 0.0), trial(7, 8, 0.0)])
    out = aggregate(df).set_index("cores")
    assert out.loc[1, "status"] == "COMPLETED" and out.loc[2, "status"] == "FAILED"
    assert out.loc[1, "p50_spread"] == pytest.approx(0.1 / 1.05) and out.loc[1, "spread_flag"] == ""
    assert out.loc[4, "spread_flag"] == "" and aggregate(df, spread_warn=0.09).set_index("cores").loc[4, "spread_flag"] == "!"
    assert math.isnan(out.loc[2, "p50_spread"]) and out.loc[2, "spread_flag"] == ""
    assert math.isnan(out.loc[8, "p50_spread"])  # a zero median has no relative spread
    assert pd.isna(out.loc[2, "requests"])  # no figure at all: not 0
    one = aggregate(pd.DataFrame([trial(1, 1, 0.5)])).iloc[0]
    assert one["p50_spread"] == 0.0 and one["spread_flag"] == ""


def test_configurations_stay_apart_and_missing_factors_match() -> None:
    df = pd.DataFrame([trial(1, 1, 1.0, workload="a"), trial(2, 1, 3.0, workload="b"),
                       trial(3, 1, 2.0, workload=None), trial(4, 1, 4.0, workload=None)])
    out = aggregate(df)
    assert sorted(out["workload"]) == ["-", "a", "b"]
    assert out.set_index("workload").loc["-", "ttft_p50_s"] == 3.0


def knees(df: pd.DataFrame, **kw) -> dict[int, str]:
    out = comparison(df, **kw)
    return dict(zip(out["cores"], out["knee"]))


def test_the_knee_is_the_fewest_cores_within_the_tolerance_of_the_best() -> None:
    df = pd.DataFrame([trial(1, 1, 0.5), trial(2, 2, 0.221), trial(3, 4, 0.21), trial(4, 8, 0.2)])
    assert knees(df) == {1: "", 2: "", 4: "<- knee", 8: ""}              # 0.221 is 10.5% over 0.2
    assert knees(df, tolerance=0.106) == {1: "", 2: "<- knee", 4: "", 8: ""}
    assert knees(df, tolerance=0.0) == {1: "", 2: "", 4: "", 8: "<- knee"}
    edge = pd.DataFrame([trial(1, 1, 0.5), trial(2, 2, 0.25), trial(3, 4, 0.2)])
    assert knees(edge, tolerance=0.25) == {1: "", 2: "<- knee", 4: ""}   # exactly at the band edge: inside


def test_speedup_is_against_the_fewest_usable_cores() -> None:
    df = pd.DataFrame([trial(1, 1, None, status="FAILED"), trial(2, 2, 0.8), trial(3, 4, 0.4), trial(4, 8, 0.2)])
    out = comparison(df).set_index("cores")
    assert math.isnan(out.loc[1, "speedup_p50"])
    assert out.loc[2, "speedup_p50"] == 1.0 and out.loc[4, "speedup_p50"] == 2.0 and out.loc[8, "speedup_p50"] == 4.0
    assert out.loc[8, "knee"] == "<- knee" and out.loc[1, "knee"] == ""


def test_timeout_majority_edge() -> None:
    df = pd.DataFrame([trial(1, 1, 0.1, timeout_rate=0.5), trial(2, 2, 0.1, timeout_rate=0.51), trial(3, 4, 0.4)])
    out = comparison(df).set_index("cores")
    assert out.loc[1, "knee"] == "<- knee" and out.loc[1, "speedup_p50"] == 1.0   # half timed out: still counts
    assert math.isnan(out.loc[2, "speedup_p50"]) and out.loc[2, "knee"] == ""
    assert out.loc[4, "speedup_p50"] == 0.25


def test_each_configuration_gets_its_own_knee_and_the_table_is_sorted() -> None:
    df = pd.DataFrame([trial(1, 4, 0.1, workload="b"), trial(2, 1, 1.0, workload="b"), trial(3, 1, 0.1, workload="a"),
                       trial(4, 4, 0.1, workload="a")])
    out = comparison(df)
    assert list(zip(out["workload"], out["cores"], out["knee"])) == [
        ("a", 1, "<- knee"), ("a", 4, ""), ("b", 1, ""), ("b", 4, "<- knee")]
    assert list(out.columns[:len(COLUMNS)]) == COLUMNS
    assert list(out["speedup_p50"]) == [1.0, 1.0, 1.0, 10.0]


def test_a_configuration_without_any_figure_has_no_knee() -> None:
    df = pd.DataFrame([trial(1, 1, None, status="FAILED"), trial(2, 2, None, status="FAILED")])
    out = comparison(df)
    assert list(out["knee"]) == ["", ""] and out["speedup_p50"].isna().all()
    assert comparison(pd.DataFrame()).empty and list(comparison(pd.DataFrame()).columns) == COLUMNS


def test_comparison_passes_its_spread_warning_on() -> None:
    df = pd.DataFrame([trial(1, 1, 1.0), trial(2, 1, 1.08)])
    assert list(comparison(df)["spread_flag"]) == [""]
    assert list(comparison(df, spread_warn=0.05)["spread_flag"]) == ["!"]


def test_aggregate_rows_come_sorted_by_configuration_and_cores() -> None:
    df = pd.DataFrame([trial(1, 8, 0.1, workload="b"), trial(2, 2, 0.3, workload="a"), trial(3, 1, 0.5, workload="b"),
                       trial(4, 4, 0.2, workload="a")])
    out = aggregate(df)
    assert list(zip(out["workload"], out["cores"])) == [("a", 2), ("a", 4), ("b", 1), ("b", 8)]


def test_a_configuration_without_figures_does_not_stop_the_next_ones_knee() -> None:
    df = pd.DataFrame([trial(1, 1, None, status="FAILED", workload="a"), trial(2, 2, None, status="FAILED", workload="a"),
                       trial(3, 1, 0.5, workload="b"), trial(4, 2, 0.1, workload="b")])
    out = comparison(df)
    assert list(zip(out["workload"], out["cores"], out["knee"])) == [
        ("a", 1, ""), ("a", 2, ""), ("b", 1, ""), ("b", 2, "<- knee")]
    assert list(out["speedup_p50"].fillna(-1)) == [-1, -1, 1.0, 5.0]


def test_sums_of_a_single_repeat_and_means_of_unreadable_values() -> None:
    df = pd.DataFrame([trial(1, 1, 0.5, requests=10, timeouts=0, gpu0_util_mean="n/a"),
                       trial(2, 2, 0.5, requests=10, timeouts=0, gpu0_util_mean=0.4)])
    out = aggregate(df).set_index("cores")
    assert out.loc[1, "requests"] == 10 and out.loc[1, "timeouts"] == 0
    assert math.isnan(out.loc[1, "gpu0_util_mean"]) and out.loc[2, "gpu0_util_mean"] == 0.4


def test_spread_edges_zero_median_and_exactly_the_warning() -> None:
    zero = aggregate(pd.DataFrame([trial(1, 1, 0.0), trial(2, 1, 0.0), trial(3, 1, 0.3)])).iloc[0]
    assert math.isnan(zero["p50_spread"]) and zero["spread_flag"] == ""
    df = pd.DataFrame([trial(1, 1, 0.9), trial(2, 1, 1.0), trial(3, 1, 1.1)])
    at_edge = aggregate(df, spread_warn=(1.1 - 0.9) / 1.0).iloc[0]
    assert at_edge["p50_spread"] == (1.1 - 0.9) / 1.0 and at_edge["spread_flag"] == ""
