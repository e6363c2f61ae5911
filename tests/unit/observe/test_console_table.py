"""The table a finished sweep prints fits a 120-column terminal and keeps its answer; the CSV keeps every column."""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from orchestrator.observe.report.comparison import COLUMNS, comparison
from orchestrator.observe.report.console import for_terminal, print_tables


def printed(frame: pd.DataFrame, width: int = 120) -> tuple[list[str], pd.DataFrame]:
    console = Console(width=width, record=True, highlight=False, markup=False)
    table = print_tables(console, frame, "synthetic")
    return console.export_text().splitlines(), table


def test_the_table_fits_120_columns_with_the_key_columns(sweep):
    lines, table = printed(sweep.trials)
    assert max(len(line) for line in lines) <= 120
    header = next(line for line in lines if "configuration" in line)
    for column in ("configuration", "cores", "TTFT p50 ms", "speedup", "timeouts", "knee"):
        assert column in header
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == len(table) == 8  # one line each: nothing wrapped
    by = table.set_index(["workload", "cores"])
    for workload in ("chat", "code"):
        for cores in (1, 2, 4, 8):
            [row] = [r for r in rows if f"m {workload} " in r and f"│ {cores:5d} │" in r]
            cell = by.loc[(workload, cores)]
            assert ("<- knee" in row) == (cell["knee"] == "<- knee")
            assert ("]!" in row) == (cell["spread_flag"] == "!")  # the repeats' range, flagged when they disagree
            if cell["status"] == "FAILED":
                assert "failed" in row  # code at 1 core: vLLM never got healthy
            else:
                assert f"{1000 * cell['ttft_p50_s']:.1f} [" in row
                assert f"{int(cell['timeouts'])}/{int(cell['requests'])}" in row  # timeouts of requests
    assert "E2E p50" not in header and "TTFT p99" not in header  # in the CSV and the report only


def test_the_returned_frame_keeps_every_column_for_the_csv(sweep):
    _, table = printed(sweep.trials)
    assert set(COLUMNS) <= set(table.columns)
    assert "configuration" not in table and "ttft_p50_lo" not in table  # added for the terminal only


def test_the_interval_is_the_repeats_range_and_absent_with_one_repeat(sweep):
    table = comparison(sweep.trials)
    shown = for_terminal(table, sweep.trials).set_index(["workload", "cores"])
    chat2 = sweep.trials[(sweep.trials["workload"] == "chat") & (sweep.trials["cores"] == 2)]["ttft_p50_s"]
    assert shown.loc[("chat", 2), "ttft_p50_lo"] == chat2.min() and shown.loc[("chat", 2), "ttft_p50_hi"] == chat2.max()
    assert shown.loc[("chat", 2), "configuration"] == "m chat"
    one = sweep.trials[sweep.trials["repeat"] == 0]
    lines, _ = printed(one)
    assert not any("[" in line and "-" in line.split("[", 1)[1] for line in lines if line.startswith("│"))


def test_many_varying_factors_still_fit(sweep):
    frame = pd.concat([sweep.trials.assign(restriction=r, start=s, vllm_variant=v)
                       for r in ("affinity", "cpuset") for s in ("fresh", "sized") for v in ("default", "chunked")])
    lines, table = printed(frame)
    assert max(len(line) for line in lines) <= 120
    text = "\n".join(lines)
    assert "vllm_variant=chunked" in text and "restriction=cpuset" in text  # the label wraps in its column
