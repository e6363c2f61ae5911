"""The report folder: offline page, PNGs, CSVs, reproducibility, optional sections, the CLI from the outbox."""

from __future__ import annotations

import dataclasses
import json
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from orchestrator.observe.report import sections
from orchestrator.observe.report.data import SweepData
from orchestrator.observe.report.tables import ReportOptions, Slo
from orchestrator.observe.report.writer import write_report


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]


def _data(sweep, slo: Slo = Slo()) -> SweepData:
    return SweepData(sweep="syn", kind="outbox", source="a test outbox", trials=sweep.trials, records=sweep.records,
                     slo=slo)


def test_the_folder_is_offline_readable_with_plots_and_csvs(sweep, tmp_path: Path):
    files = write_report(_data(sweep, Slo(0.3, None, "the sweep's slo")), tmp_path / "r", ReportOptions(n_boot=200))
    page = files.index.read_text()
    parser = _Links()
    parser.feed(page)
    assert "script" not in parser.tags and "link" not in parser.tags
    assert parser.links and not [u for u in parser.links if "://" in u or u.startswith("/")]
    for link in parser.links:
        if not link.startswith("#"):
            assert (files.folder / link).is_file(), link
    pngs = sorted(p.name for p in (files.folder / "plots").glob("*.png"))
    assert pngs == ["config-1-goodput.png", "config-1-knee.png", "config-1-side.png", "config-1-ttft.png",
                    "config-2-goodput.png", "config-2-knee.png", "config-2-side.png", "config-2-ttft.png", "heatmap.png"]
    assert all((files.folder / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert "a test outbox" in page and "TTFT &lt;= 0.3 s (from the sweep&#x27;s slo)" in page
    assert "not recorded" in page and "timeout" in page
    assert "the knee is 8 cores, the fewest within 10% of the best, and the most cores tested" in page
    assert "At 1 core 58% of requests time out; at 2 cores TTFT p50 is 2.4x the best" in page
    assert " = " not in page.split("<body>")[1]  # the evidence is a table, no key = value pairs
    assert "Predicted knee" in page or "no knee model" in page.lower() or "too few" in page  # the real analyses ran


def test_csvs_hold_the_tables(sweep, tmp_path: Path):
    files = write_report(_data(sweep), tmp_path / "r", ReportOptions(n_boot=100))
    agg = pd.read_csv(files.csvs["aggregated"])
    assert len(agg) == 8 and {"ttft_p50_lo", "ttft_p99_hi", "cell", "knee"} <= set(agg.columns)
    assert (agg["ttft_p50_lo"].dropna() <= agg.loc[agg["ttft_p50_lo"].notna(), "ttft_p50_s"]).all()
    trials = pd.read_csv(files.csvs["trials"])
    assert len(trials) == 16 and trials.set_index("trial_id").loc["chat-c2-r0", "records"] == 80
    heat = pd.read_csv(files.csvs["heatmap"], index_col="configuration", dtype=str)
    assert heat.loc["m code", "1"] == "timeout" and float(heat.loc["m code", "8"]) == pytest.approx(
        agg[(agg["workload"] == "code") & (agg["cores"] == 8)]["speedup_p50"].iloc[0], abs=0.005)


def test_the_same_inputs_write_the_same_files(sweep, tmp_path: Path):
    a = write_report(_data(sweep), tmp_path / "a", ReportOptions(n_boot=100, seed=3))
    b = write_report(_data(sweep), tmp_path / "b", ReportOptions(n_boot=100, seed=3))
    for name in ("index.html", "aggregated.csv", "trials.csv", "heatmap.csv", "knee.csv", "plots/config-1-ttft.png",
                 "plots/config-1-knee.png"):
        assert (a.folder / name).read_bytes() == (b.folder / name).read_bytes(), name


def test_figures_of_configurations_gone_since_are_removed(sweep, tmp_path: Path):
    (tmp_path / "r" / "plots").mkdir(parents=True)
    (tmp_path / "r" / "plots" / "config-9-ttft.png").write_bytes(b"old")
    write_report(_data(sweep), tmp_path / "r", ReportOptions(n_boot=20))
    assert not (tmp_path / "r" / "plots" / "config-9-ttft.png").exists()


@dataclasses.dataclass(frozen=True)
class _Diagnosis:
    stage: str
    sentence: str
    evidence: dict


class _Model:
    params = {"a": 0.05, "b": 0.4}
    inputs = {"cores": [1, 2, 4, 8]}

    def predict_ttft_p50(self, cores: int) -> float:
        return 0.05 + 0.4 / cores

    def knee(self, cores, tolerance: float) -> int:
        return 4


def test_the_analysis_sections_render_what_the_analyses_return(sweep, tmp_path: Path, monkeypatch):
    seen = {}

    def diagnose(rows, *, tolerance):
        seen["rows"] = rows
        return _Diagnosis("frontend", f"tokenization starves below {int(rows['cores'].max())} cores", {"share": 0.6})

    def holdout(rows, *, tolerance):
        return pd.DataFrame({"cores": rows["cores"], "measured_s": rows["ttft_p50_s"],
                             "predicted_s": rows["ttft_p50_s"] * 1.1, "error": 0.1})

    def knee_costs(rows, *, core_hour_usd, gpu_hour_usd, tolerance, table):
        return pd.DataFrame({"option": ["starved", "knee", "one more GPU"], "usd_per_hour": [1.0, 1.2, 5.0],
                             "usd_per_1k_requests": [0.3, 0.2, 0.9]})

    monkeypatch.setattr(sections.diagnosis, "diagnose", diagnose)
    monkeypatch.setattr(sections.predict, "fit", lambda rows: _Model())
    monkeypatch.setattr(sections.predict, "holdout", holdout)
    monkeypatch.setattr(sections.cost, "knee_costs", knee_costs)
    files = write_report(_data(sweep), tmp_path / "r", ReportOptions(n_boot=50, core_hour_usd=0.05, gpu_hour_usd=4))
    page = files.index.read_text()
    assert "Tokenization starves below 8 cores." in page  # no headline: the sentence, as a sentence
    assert "<td class='l'>share</td><td class='l'>60%</td>" in page  # a key it does not know
    assert "Predicted knee: <b>4 cores</b> (observed: 8 cores)" in page and "one more GPU" in page
    assert (files.folder / "plots" / "config-1-holdout.png").is_file()
    assert "usd_per_1k_requests" in page
    logged = json.loads((files.folder / "predictions.json").read_text())[0]
    assert logged["predicted_knee"] == 4 and logged["params"] == {"a": 0.05, "b": 0.4}
    assert logged["inputs"] == {"cores": [1, 2, 4, 8]} and len(logged["holdout"]) == 4
    assert list(seen["rows"]["cores"]) == [1, 2, 4, 8] and "ttft_p50_lo" not in seen["rows"]  # comparison() rows


def test_a_failing_optional_module_costs_only_its_section(sweep, tmp_path: Path, monkeypatch):
    def broken(rows, *, tolerance):
        raise ZeroDivisionError("no cores")

    monkeypatch.setattr(sections.diagnosis, "diagnose", broken)
    files = write_report(_data(sweep), tmp_path / "r", ReportOptions(n_boot=20))
    page = files.index.read_text()
    assert "diagnosis: ZeroDivisionError: no cores" in page and "config-2-ttft.png" in page


def test_the_report_command_reads_the_outbox_when_there_is_no_mlflow(tmp_path: Path, make_records, make_outbox,
                                                                     monkeypatch):
    from orchestrator.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    make_outbox(tmp_path / "home" / "outbox", lambda t: make_records(0.02 + 0.2 / t.cores, 40, seed=t.repeat),
                slo={"ttft_s": 0.15})
    out = tmp_path / "rep"
    res = CliRunner().invoke(main, ["report", "box-sweep", "--home", str(tmp_path / "home"), "--out", str(out),
                                    "--tpot-slo", "0.05", "--csv", str(tmp_path / "t.csv")])
    assert res.exit_code == 0, res.output
    assert "trials read from the local outbox" in res.output and f"report written to {out / 'index.html'}" in res.output
    assert "knee with its interval (p90 TTFT of every window), tiny-llama agentic-short: " in res.output
    page = (out / "index.html").read_text()
    assert "TTFT &lt;= 0.15 s and TPOT &lt;= 0.05 s (from the command line and the sweep&#x27;s slo)" in page
    assert len(pd.read_csv(tmp_path / "t.csv")) == 3


def test_the_report_command_decides_the_knee_on_the_statistic_asked(tmp_path: Path, make_records, make_outbox,
                                                                    monkeypatch):
    from orchestrator.cli import KNEE_STATISTICS, main
    from orchestrator.observe.analysis.knee import STATISTICS

    assert sorted(KNEE_STATISTICS) == sorted(STATISTICS) and KNEE_STATISTICS[0] == ReportOptions().knee_statistic
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    make_outbox(tmp_path / "home" / "outbox", lambda t: make_records(0.02 + 0.2 / t.cores, 40, seed=t.repeat))
    res = CliRunner().invoke(main, ["report", "box-sweep", "--home", str(tmp_path / "home"), "--out",
                                    str(tmp_path / "rep"), "--knee-statistic", "mean"])
    assert res.exit_code == 0, res.output
    assert "knee with its interval (mean TTFT of every window), tiny-llama agentic-short: " in res.output
    knees = pd.read_csv(tmp_path / "rep" / "knee.csv")
    assert set(knees["statistic"]) == {"mean"}
    assert "The mean was the default before p90" in (tmp_path / "rep" / "index.html").read_text()
    bad = CliRunner().invoke(main, ["report", "box-sweep", "--home", str(tmp_path / "home"), "--knee-statistic", "p99"])
    assert bad.exit_code == 2 and "'p99' is not one of" in bad.output


def test_the_report_command_names_what_is_missing(tmp_path: Path, monkeypatch):
    from orchestrator.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(main, ["report", "nothing", "--home", str(tmp_path)])
    assert res.exit_code == 1 and "no trials of sweep 'nothing': no MLFLOW_TRACKING_URI and no local MLflow" in res.output


def test_a_sweeps_report_failure_is_a_warning_line(tmp_path: Path):
    from orchestrator.observe.report.writer import write_sweep_report
    from orchestrator.plan.load import parse_spec

    spec = parse_spec({"name": "gone", "models": [{"name": "m", "shape": "tiny-llama"}],
                       "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
                       "grid": {"cores": [1]}})
    line = write_sweep_report(spec, tmp_path, None)
    assert line.startswith("warning: the report was not written: ReportInputError: no trials of sweep 'gone'")


def test_a_sweeps_report_lands_in_its_home(tmp_path: Path, make_records, make_outbox):
    from orchestrator.observe.report.writer import write_sweep_report

    plan = make_outbox(tmp_path / "outbox", lambda t: make_records(0.1 / t.cores, 20, seed=t.repeat), cores=(1, 2))
    line = write_sweep_report(plan.spec, tmp_path, None)
    index = tmp_path / "reports" / "box-sweep" / "index.html"
    knee, written = line.split("\n")
    assert knee.startswith("knee with its interval (p90 TTFT of every window), tiny-llama agentic-short: ")
    assert knee.endswith(pd.read_csv(tmp_path / "reports" / "box-sweep" / "knee.csv")["sentence"].iloc[0])
    assert written == f"report written to {index}" and "Trials read from the local outbox" in index.read_text()


def test_each_configuration_has_its_knee_with_an_interval(sweep, tmp_path: Path):
    """knee.csv and the page: the knee from every window's requests (p90, a monotone fit, a bootstrap of
    windows then requests), its interval and whether it is settled; a core count where most requests time
    out does not count, as for the table's knee."""
    files = write_report(_data(sweep), tmp_path / "r", ReportOptions(n_boot=200))
    knees = pd.read_csv(files.csvs["knee"])
    knees = knees[knees["metric"] == "ttft"].set_index("configuration")
    assert sorted(knees.index) == ["m chat", "m code"]
    code = knees.loc["m code"]
    assert code["cores"].split() == ["2", "4", "8"]  # 1 core: most requests time out
    for name, k in knees.iterrows():
        assert k["low"] <= k["knee"] <= k["high"] and k["statistic"] == "p90" and k["level"] == 0.9
        fitted = [float(x) for x in k["fitted_s"].split()]
        assert fitted == sorted(fitted, reverse=True), name  # never rises with cores
        assert sum(float(s.split(":")[1]) for s in k["shares"].split()) == pytest.approx(1.0)
        assert f"Knee with its interval: {k['sentence']}" in files.index.read_text()
    assert "Why p90" in files.index.read_text()


def test_knee_csv_holds_ttfts_then_tpots_knee_per_configuration(sweep, tmp_path: Path):
    files = write_report(_data(sweep), tmp_path / "r", ReportOptions(n_boot=100))
    knees = pd.read_csv(files.csvs["knee"])
    assert list(knees["metric"]) == ["ttft", "ttft", "tpot", "tpot"]
    tpot = knees[knees["metric"] == "tpot"].set_index("configuration")
    # Every token of the synthetic records comes 20 ms after the last: decode is flat, its knee the fewest cores.
    assert [float(x) for x in tpot.loc["m chat", "figures_s"].split()] == pytest.approx([0.02] * 3, rel=1e-6)
    assert tpot.loc["m chat", "knee"] == 2 and tpot.loc["m code", "knee"] == 2
    page = files.index.read_text()
    assert page.count("decode needs no more cores than the first token") == 2
    assert "Decode needs more cores" not in page
