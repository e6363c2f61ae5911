"""Report tables from trials and records: intervals, goodput under SLOs, heatmap cells, knees (pure)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.observe.report.tables import (
    ReportOptions,
    Slo,
    aggregated_table,
    config_labels,
    configurations,
    heatmap_table,
    knee,
    merge_slo,
    slo_goodput,
    trial_table,
    ttft_values,
)
from workloads.metrics import duration_s, goodput_count
from workloads.records import frame_to_records

OPTS = ReportOptions(n_boot=300, slo=Slo(0.2, 0.05, "the command line"))


@pytest.fixture(scope="module")
def table(sweep) -> pd.DataFrame:
    return aggregated_table(sweep.trials, sweep.records, OPTS)


def _row(table: pd.DataFrame, workload: str, cores: int) -> pd.Series:
    [row] = [r for _, r in table.iterrows() if r["workload"] == workload and r["cores"] == cores]
    return row


def test_one_row_per_configuration_and_cores_repeats_aggregated(table):
    assert len(table) == 8 and set(table["repeats"]) == {2}
    assert [len(rows) for _, rows in configurations(table)] == [4, 4]


def test_intervals_hold_the_tables_figure_which_the_records_reproduce(sweep, table):
    r = _row(table, "chat", 4)
    per_repeat = [np.percentile(ttft_values(sweep.records[f"chat-c4-r{i}"]), 50) for i in (0, 1)]
    assert r["ttft_p50_s"] == pytest.approx(np.median(per_repeat))  # the logged metric equals the records' figure
    for p in ("p50", "p90", "p99"):
        assert r[f"ttft_{p}_lo"] <= r[f"ttft_{p}_s"] <= r[f"ttft_{p}_hi"]
    assert r["ttft_p50_hi"] < r["ttft_p90_lo"] or r["ttft_p50_hi"] < r["ttft_p90_s"]
    assert (r["ci_repeats"], r["ci_requests"]) == (2, 160)


def test_cells_timeout_and_failed_are_labels_not_numbers(table):
    chat1, code1 = _row(table, "chat", 1), _row(table, "code", 1)
    assert chat1["cell"] == "timeout" and math.isnan(chat1["speedup_p50"])  # 60% of its requests timed out
    assert code1["cell"] == "timeout" and code1["status"] == "FAILED"      # startup_timeout
    assert _row(table, "chat", 2)["cell"] == "" and _row(table, "chat", 2)["speedup_p50"] == pytest.approx(1.0)
    heat = heatmap_table(table)
    assert list(heat.columns) == [1, 2, 4, 8] and list(heat.index) == ["m chat", "m code"]
    assert heat.loc["m chat", 1] == "timeout" and heat.loc["m code", 1] == "timeout"
    assert heat.loc["m chat", 8] == f"{_row(table, 'chat', 8)['speedup_p50']:.2f}"
    assert float(heat.loc["m chat", 8]) > 1.5  # base(2) / base(8) = 0.25 / 0.1


def test_a_failure_that_is_not_a_timeout_reads_failed(sweep):
    trials = sweep.trials.copy()
    trials.loc[trials["trial_id"].str.startswith("code-c1"), "error_kind"] = "server_died"
    table = aggregated_table(trials, sweep.records, OPTS)
    assert heatmap_table(table).loc["m code", 1] == "failed"


def test_knee_is_the_fewest_cores_within_the_tolerance(sweep):
    loose = aggregated_table(sweep.trials, sweep.records, ReportOptions(n_boot=50, tolerance=0.7))
    strict = aggregated_table(sweep.trials, sweep.records, ReportOptions(n_boot=50, tolerance=0.05))
    chat = dict(configurations(loose))[("m", "cpu", 0, "default", 1, "vllm", "chat", "agent-mix", "affinity", "fresh")]
    assert knee(chat) == 4  # 0.15 is within 70% of 0.1 (and the 1-core timeout cell never counts)
    assert knee(configurations(strict)[0][1]) == 8


def test_side_figures_of_cpu_trials_stay_missing(table):
    chat, code = _row(table, "chat", 2), _row(table, "code", 2)
    assert chat["frontend_share"] == pytest.approx(0.15 / 0.25)
    assert math.isnan(code["frontend_share"]) and math.isnan(code["gpu0_util_mean"])


def test_goodput_counts_requests_meeting_every_slo(sweep, table):
    frame = sweep.records["chat-c4-r0"]
    recs = frame_to_records(frame)
    rps, share = slo_goodput(frame, OPTS.slo)
    good = goodput_count(recs, ttft_slo_s=0.2, tpot_slo_s=0.05)
    assert 0 < good < len(recs) and rps == pytest.approx(good / duration_s(recs)) and share == good / len(recs)
    trials = trial_table(sweep.trials, sweep.records, OPTS.slo).set_index("trial_id")
    assert trials.loc["chat-c4-r0", "slo_goodput_rps"] == pytest.approx(rps)
    assert _row(table, "chat", 4)["slo_goodput_rps"] == pytest.approx(trials.loc[["chat-c4-r0", "chat-c4-r1"],
                                                                                "slo_goodput_rps"].mean())
    assert _row(table, "chat", 8)["slo_met_share"] > _row(table, "chat", 2)["slo_met_share"]
    assert math.isnan(slo_goodput(frame, Slo())[0])


def test_trials_without_records_have_no_interval(sweep):
    table = aggregated_table(sweep.trials, {}, ReportOptions(n_boot=50))
    r = _row(table, "chat", 4)
    assert not math.isnan(r["ttft_p50_s"]) and math.isnan(r["ttft_p50_lo"]) and r["ci_repeats"] == 0


def test_flags_win_over_the_sweeps_slo_target_by_target():
    sweep = Slo(1.0, 0.1, "the sweep's slo")
    assert merge_slo(Slo(0.5, None, "x"), sweep) == Slo(0.5, 0.1, "the command line and the sweep's slo")
    assert merge_slo(Slo(), sweep) == Slo(1.0, 0.1, "the sweep's slo")
    assert merge_slo(Slo(0.5, 0.2), sweep).source == "the command line"
    assert not merge_slo(Slo(), Slo()).given and Slo().describe() == "none"


def test_labels_name_only_the_factors_that_vary(sweep):
    trials = sweep.trials.copy()
    trials.loc[trials["workload"] == "code", "gpus"] = 2
    labels = config_labels(aggregated_table(trials, {}, ReportOptions(n_boot=10)))
    assert sorted(labels.values()) == ["m chat gpus=0", "m code gpus=2"]


def test_an_empty_sweep_gives_empty_tables():
    table = aggregated_table(pd.DataFrame(), {}, OPTS)
    assert table.empty and "ttft_p50_lo" in table.columns and heatmap_table(table).empty
