"""`orchestrator report` against a REAL MLflow server, and from the outbox alone.

A small constructed sweep (cores 1, 2, 4; two repeats; synthetic per-request records whose TTFT
falls with cores; most requests time out at 1 core) is logged through the real ``MlflowTracker``.
The report command then runs through click's CliRunner. Checked: the page names its source, the
PNGs and CSVs are there, the CSV's figures are those of the logged records, the sweep's SLO and the
command line's are combined, and the folder is logged under ``report/`` of the parent run. The
second case logs to a server that is not there, so everything lands in the outbox, and the report
is built from it. No vLLM or Ray.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from mlflow import MlflowClient
from orchestrator.cli import main
from orchestrator.infra.net import free_port
from orchestrator.observe.tracking import CallbackList, MlflowTracker, parent_run
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan, TrialSpec
from workloads.metrics import summarize, ttft_s
from workloads.records import RequestRecord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
N = 60  # requests per trial


@pytest.fixture
def server(mlflow_uri: str) -> str:
    """The session's real MLflow server (tests/conftest.py)."""
    return mlflow_uri


def _plan(name: str) -> SweepPlan:
    return expand(parse_spec({
        "name": name, "models": [{"kind": "shape", "name": "tiny-llama", "shape": "tiny-llama"}],
        "workloads": [{"kind": "agentic", "name": "agentic-short", "sessions": 2, "turns": 2}],
        "grid": {"cores": [1, 2, 4]}, "repeats": 2, "slo": {"ttft_s": 0.1},
    }))


def _records(trial: TrialSpec) -> list[RequestRecord]:
    rng = np.random.default_rng(10 * trial.cores + trial.repeat)
    base = 0.03 + 0.24 / trial.cores
    out, t = [], 0
    for i in range(N):
        ok = trial.cores > 1 or rng.random() < 0.3  # at 1 core, 70% of the requests time out
        first = t + 1000 + int(base * rng.lognormal(0, 0.25) * 1e9) if ok else None
        tokens = tuple(first + 15_000_000 * k for k in range(5)) if ok else ()
        out.append(RequestRecord(request_id=f"r{i}", session_id=f"s{i % 2}", turn=i // 2, scheduled_ns=t,
                                 sent_ns=t + 1000, first_token_ns=first, token_ns=tokens,
                                 end_ns=tokens[-1] + 1 if ok else t + 30 * 10**9, prompt_tokens=300,
                                 completion_tokens=len(tokens), cached_tokens=256, client_prompt_tokens=300,
                                 tokenize_ns=500, status="ok" if ok else "timeout"))
        t += 40_000_000
    return out


def _log(plan: SweepPlan, uri: str, outbox_dir: Path) -> dict[str, list[RequestRecord]]:
    tracker = MlflowTracker(uri, outbox_dir=outbox_dir, health_timeout_s=0.5)
    cbs = CallbackList([tracker])
    cbs.on_sweep_start(plan)
    logged, results = {}, []
    for trial in plan.trials:
        recs = _records(trial)
        metrics = summarize(recs, ttft_slo_s=0.1)
        metrics.update(server_ttft_s_mean=0.03 + 0.24 / trial.cores, server_frontend_s_mean=0.2 / trial.cores)
        result = TrialResult(trial.trial_id, TrialStatus.COMPLETED, records=tuple(recs), metrics=metrics,
                             started_at=time.time() - 5, ended_at=time.time())
        cbs.on_trial_start(trial)
        cbs.on_trial_result(trial, result)
        logged[trial.trial_id] = recs
        results.append(result)
    cbs.on_sweep_end(plan, results)
    return logged


def _expected_p50(plan: SweepPlan, logged: dict[str, list[RequestRecord]], cores: int) -> float:
    return float(np.median([np.percentile(ttft_s(logged[t.trial_id]), 50) for t in plan.trials if t.cores == cores]))


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for f in client.list_artifacts(run_id, path):
        out |= _artifacts(client, run_id, f.path) if f.is_dir else {f.path}
    return out


def test_report_from_mlflow_is_written_and_logged_to_the_parent_run(server: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch):
    plan = _plan("rep-mlflow")
    home = tmp_path / "home"
    logged = _log(plan, server, home / "outbox")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    res = CliRunner().invoke(main, ["report", "rep-mlflow", "--home", str(home), "--tpot-slo", "0.05"])
    assert res.exit_code == 0, res.output
    folder = home / "reports" / "rep-mlflow"
    assert f"trials read from MLflow at {server}" in res.output and f"report written to {folder / 'index.html'}" in res.output

    page = (folder / "index.html").read_text()
    assert f"Trials read from MLflow at {server}: 6 trial(s), 1 configuration(s)" in page
    assert "TTFT &lt;= 0.1 s and TPOT &lt;= 0.05 s (from the command line and the sweep&#x27;s slo)" in page
    assert "<script" not in page and "not recorded" in page  # no GPU utilisation on these trials
    pngs = {p.name for p in (folder / "plots").glob("*.png")}
    assert pngs == {"config-1-ttft.png", "config-1-side.png", "config-1-goodput.png", "config-1-knee.png", "heatmap.png"}
    knee = pd.read_csv(folder / "knee.csv").iloc[0]  # the knee from every window's requests; 1 core timed out
    assert knee["cores"] == "2 4" and knee["statistic"] == "p90" and knee["low"] <= knee["knee"] <= knee["high"]
    assert f"knee with its interval (p90 TTFT of every window), {knee['configuration']}: {knee['sentence']}" in res.output

    agg = pd.read_csv(folder / "aggregated.csv").set_index("cores")
    for cores in (2, 4):
        r = agg.loc[cores]
        assert r["repeats"] == 2 and r["ci_repeats"] == 2 and r["ci_requests"] == 2 * N
        assert r["ttft_p50_s"] == pytest.approx(_expected_p50(plan, logged, cores))
        assert r["ttft_p50_lo"] <= r["ttft_p50_s"] <= r["ttft_p50_hi"] < r["ttft_p99_hi"]
    assert agg.loc[1, "cell"] == "timeout" and agg.loc[1, "timeout_rate"] > 0.5
    assert agg.loc[4, "frontend_share"] == pytest.approx(0.05 / 0.09)
    assert agg.loc[4, "slo_goodput_rps"] > agg.loc[2, "slo_goodput_rps"]
    heat = pd.read_csv(folder / "heatmap.csv", index_col="configuration", dtype=str)
    assert list(heat.iloc[0]) == ["timeout", "1.00", f"{agg.loc[4, 'speedup_p50']:.2f}"]
    assert len(pd.read_csv(folder / "trials.csv")) == 6

    client = MlflowClient(server)
    parent = parent_run(client, "rep-mlflow")
    assert f"report logged to MLflow run {parent.info.run_id}" in res.output
    arts = _artifacts(client, parent.info.run_id, "report")
    assert {"report/index.html", "report/aggregated.csv", "report/heatmap.csv", "report/trials.csv",
            "report/knee.csv", "report/plots/heatmap.png", "report/plots/config-1-ttft.png",
            "report/plots/config-1-knee.png"} <= arts
    remote = client.download_artifacts(parent.info.run_id, "report/aggregated.csv", str(tmp_path))
    assert Path(remote).read_bytes() == (folder / "aggregated.csv").read_bytes()


def test_report_from_the_outbox_when_mlflow_is_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    plan = _plan("rep-offline")
    home = tmp_path / "home"
    down = f"http://127.0.0.1:{free_port()}"
    logged = _log(plan, down, home / "outbox")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", down)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["report", "rep-offline", "--home", str(home), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"trials read from the local outbox {home / 'outbox'} (MLflow at {down} is unreachable)" in res.output
    assert "report logged" not in res.output
    page = (out / "index.html").read_text()
    assert "Trials read from the local outbox" in page and "TTFT &lt;= 0.1 s (from the sweep&#x27;s slo)" in page
    agg = pd.read_csv(out / "aggregated.csv").set_index("cores")
    assert agg.loc[2, "ci_requests"] == 2 * N
    assert agg.loc[2, "ttft_p50_s"] == pytest.approx(_expected_p50(plan, logged, 2))
    assert (out / "plots" / "heatmap.png").stat().st_size > 1000
