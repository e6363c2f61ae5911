"""A knee search in the report: the "why each point" table, in the order the search ran, what it cost against a
3-repeat grid, and the files and page section (none for a grid)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orchestrator.observe.report.comparison import trial_row
from orchestrator.observe.report.data import SweepData
from orchestrator.observe.report.search import WHY_COLUMNS, cost_table, visible, why_table
from orchestrator.observe.report.tables import ReportOptions
from orchestrator.observe.report.writer import write_report

ORDER = [(8, "most cores"), (1, "fewest cores"), (4, "bisect"), (2, "bisect"), (4, "narrow the interval")]


def searched(trials: pd.DataFrame, gpus: int = 1) -> pd.DataFrame:
    """``trials`` with chat's search trials marked as a knee search ran them (ORDER), 20 s each."""
    out = trials.copy()
    out["gpus"] = gpus
    seen: dict[int, int] = {}
    for step, (cores, reason) in enumerate(ORDER, 1):
        repeat = seen[cores] = seen.get(cores, -1) + 1
        at = (out["workload"] == "chat") & (out["cores"] == cores) & (out["repeat"] == repeat)
        assert at.sum() == 1
        out.loc[at, ["search_reason", "search_step", "search_grid_cores", "trial_duration_s"]] = [
            reason, str(step), "1 2 4 8", 20.0 + step]
    return out


def test_why_each_point_in_the_order_the_search_ran(sweep):
    why = why_table(searched(sweep.trials).iloc[::-1], labels={})
    assert list(zip(why["cores"], why["reason"])) == ORDER
    assert list(why["step"]) == [1, 2, 3, 4, 5] and list(why["repeat"]) == [0, 0, 0, 0, 1]
    assert list(visible(why).columns) == WHY_COLUMNS


def test_a_grid_has_no_why_table(sweep):
    assert why_table(sweep.trials, labels={}).empty and cost_table(why_table(sweep.trials, labels={})).empty


def test_cost_against_a_three_repeat_grid_of_fresh_starts(sweep):
    trials = searched(sweep.trials, gpus=2)
    trials.loc[trials["search_reason"].notna(), "startup_s"] = 15.0  # every trial started its own vLLM
    [row] = cost_table(why_table(trials, labels={})).to_dict("records")
    spent = sum(20.0 + s for s in range(1, 6))
    assert row["trials"] == 5 and row["gpus"] == 2 and row["grid_core_counts"] == 4 and row["starts"] == 5
    assert row["spent_gpu_s"] == pytest.approx(spent * 2)
    assert row["grid_x3_gpu_s"] == pytest.approx(spent / 5 * 4 * 3 * 2)  # 12 trials of the mean, each a start
    assert row["share_of_grid"] == pytest.approx(5 / 12)
    [cpu] = cost_table(why_table(searched(sweep.trials, gpus=0), labels={})).to_dict("records")
    assert cpu["spent_gpu_s"] == pytest.approx(spent)  # a CPU trial counts its seconds once


def test_a_re_pinned_search_charges_the_grid_its_one_start_once(sweep):
    """The H200 search of 2026-12-04: a cold start of 226 s in its first trial, then re-pinned windows of
    10-14 s; the grid it is set against pays that start once, not once per mean trial."""
    trials = searched(sweep.trials, gpus=1)
    first = trials["search_step"] == "1"
    trials.loc[first, ["trial_duration_s", "startup_s"]] = [240.0, 226.0]
    why = why_table(trials, labels={})
    [row] = cost_table(why).to_dict("records")
    windows = [240.0 - 226.0] + [20.0 + s for s in range(2, 6)]
    assert row["starts"] == 1 and row["start_s"] == pytest.approx(226.0)
    assert row["mean_window_s"] == pytest.approx(sum(windows) / 5)
    assert row["grid_x3_gpu_s"] == pytest.approx(226.0 + 12 * sum(windows) / 5)
    assert row["share_of_grid"] == pytest.approx((240.0 + sum(windows[1:])) / (226.0 + 12 * sum(windows) / 5))


def test_the_report_writes_and_shows_the_search(sweep, tmp_path: Path):
    data = SweepData(sweep="syn", kind="outbox", source="a test outbox", trials=searched(sweep.trials),
                     records=sweep.records)
    files = write_report(data, tmp_path / "r", ReportOptions(n_boot=50))
    why = pd.read_csv(files.csvs["search"])
    assert list(why.columns) == WHY_COLUMNS and list(why["reason"]) == [r for _, r in ORDER]
    assert len(pd.read_csv(files.csvs["search cost"])) == 1
    page = files.index.read_text()
    assert "Knee search: why each point" in page and "narrow the interval" in page and "search.csv" in page
    grid = write_report(SweepData(sweep="syn", kind="outbox", source="x", trials=sweep.trials, records=sweep.records),
                        tmp_path / "r", ReportOptions(n_boot=50))  # the same folder, written again for a grid
    assert "search" not in grid.csvs and "Knee search" not in grid.index.read_text()
    assert not (tmp_path / "r" / "search.csv").exists() and not (tmp_path / "r" / "search_cost.csv").exists()


def test_a_tracked_trial_row_keeps_its_search_params():
    params = {"cores": "2", "repeat": "0", "search_reason": "bisect", "search_step": "3", "search_grid_cores": "1 2 4"}
    row = trial_row(params, {"trial_id": "t"}, {}, True)
    assert (row["search_reason"], row["search_step"], row["search_grid_cores"]) == ("bisect", "3", "1 2 4")
    assert "search_reason" not in trial_row({"cores": "2"}, {"trial_id": "t"}, {}, True)
