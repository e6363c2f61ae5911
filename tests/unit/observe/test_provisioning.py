"""Cores per GPU: the CDF, the shares below 2/4/8 and below a knee, checked against hand counts; the command."""

import math

import pandas as pd
import pytest
from click.testing import CliRunner

from orchestrator.observe.provisioning import cli as provisioning_cli
from orchestrator.observe.provisioning.analysis import (
    cdf_figure,
    cdf_table,
    ecdf,
    median,
    render_shares,
    render_starvation,
    share_below,
    shares_table,
    starvation_table,
    sweep_knees,
)
from orchestrator.observe.provisioning.cli import provisioning
from orchestrator.observe.provisioning.cluster_traces import combine, load_trace

POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")
# Cores per GPU, by hand: p0 12/1 = 12, p1 2/0.5 = 4, p2 8/8 = 1, p4 3/1 = 3; p3 has no GPU.
# Sorted 1, 3, 4, 12: median 3.5; below 2: 1/4, below 4: 2/4, below 8: 3/4.
PODS = [POD_HEADER,
        "p0,12000,16384,1,1000,,LS,Running,0,100,0",
        "p1,2000,12288,1,500,V100M16,LS,Running,5,60,10",
        "p2,8000,1024,8,1000,V100M16,BE,Pending,7,9,",
        "p3,4000,1024,0,0,,BE,Running,0,50,0",
        "p4,3000,1024,1,1000,,LS,Succeeded,1,12,2"]
# Nodes: 96/8 = 12 (G2), 16/2 = 8 (P100), 8/1 = 8 (P100); one without a GPU.
NODES = ["sn,cpu_milli,memory_mib,gpu,model", "n0,96000,393216,8,G2", "n1,32000,262144,0,",
         "n2,16000,262144,2,P100", "n3,8000,262144,1,P100"]


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def frame(tmp_path):
    return combine([load_trace(write(tmp_path, "pods.csv", PODS)), load_trace(write(tmp_path, "nodes.csv", NODES))])


def test_ecdf_share_and_median_by_hand():
    c = ecdf([4, 1, 2, 2])
    assert list(c["cores_per_gpu"]) == [1, 2, 4] and list(c["cdf"]) == [0.25, 0.75, 1.0]
    assert share_below([4, 1, 2, 2], 2) == 0.25 and share_below([4, 1, 2, 2], 4) == 0.75
    assert median([1, 2, 3, 4]) == 2.5 and median([4, 1, 2, 2]) == 2.0 and median([7]) == 7.0
    # weighted: 1 weighs 3 of 4, so it is the median; 4 weighs half, so the median is between 1 and 4
    assert median([1, 4], [3, 1]) == 1.0 and median([1, 4], [1, 1]) == 2.5
    assert share_below([1, 4], 2, [3, 1]) == 0.75
    assert math.isnan(median([])) and math.isnan(share_below([], 2)) and ecdf([]).empty


def test_shares_per_trace_and_gpu_type(frame):
    t = shares_table(frame).set_index(["trace", "gpu_type"])
    pods = t.loc[("pods.csv", "all")]
    assert (pods["kind"], pods["count"], pods["counted"]) == ("requests", 4, 4)
    assert pods["cores_per_gpu_median"] == 3.5
    assert (pods["below_2"], pods["below_4"], pods["below_8"]) == (0.25, 0.5, 0.75)
    v100 = t.loc[("pods.csv", "V100M16")]  # p1 (4) and p2 (1)
    assert v100["cores_per_gpu_median"] == 2.5 and v100["below_2"] == 0.5 and v100["below_8"] == 1.0
    assert t.loc[("pods.csv", "(none named)"), "cores_per_gpu_median"] == 7.5  # p0 (12) and p4 (3)
    nodes = t.loc[("nodes.csv", "all")]
    assert nodes["kind"] == "nodes" and nodes["count"] == 3 and nodes["cores_per_gpu_median"] == 8.0
    assert nodes["below_8"] == 0.0 and t.loc[("nodes.csv", "G2"), "cores_per_gpu_median"] == 12.0


def test_weights_gpus_and_gpu_time(frame):
    pods = frame[frame["trace"] == "pods.csv"]
    by_gpus = shares_table(pods, weight="gpus").iloc[0]
    # GPUs: p0 1, p1 0.5, p2 8, p4 1 (10.5); below 4: p2 and p4, 9 of 10.5; p2 alone holds the median
    assert by_gpus["below_4"] == pytest.approx(9 / 10.5) and by_gpus["cores_per_gpu_median"] == 1.0
    by_time = shares_table(pods, weight="gpu-time").iloc[0]
    # p2 was never scheduled (no duration): left out. GPU-seconds: p0 100, p1 25, p4 10 (135)
    assert by_time["counted"] == 3 and by_time["below_4"] == pytest.approx(10 / 135)
    assert by_time["below_8"] == pytest.approx(35 / 135) and by_time["cores_per_gpu_median"] == 12.0
    nodes = shares_table(frame[frame["trace"] == "nodes.csv"], weight="gpu-time").iloc[0]
    assert nodes["counted"] == 3 and nodes["below_8"] == 0.0  # nodes by their GPUs: 8 of 11 at 12
    assert nodes["cores_per_gpu_median"] == 12.0
    with pytest.raises(ValueError, match="weight must be one of"):
        shares_table(pods, weight="hours")


def test_cdf_points_by_hand(frame):
    c = cdf_table(frame)
    pods = c[(c["trace"] == "pods.csv") & (c["gpu_type"] == "all")]
    assert list(pods["cores_per_gpu"]) == [1, 3, 4, 12] and list(pods["cdf"]) == [0.25, 0.5, 0.75, 1.0]
    nodes = c[(c["trace"] == "nodes.csv") & (c["gpu_type"] == "all")]
    assert list(nodes["cores_per_gpu"]) == [8, 12] and list(nodes["cdf"]) == pytest.approx([2 / 3, 1.0])


def test_knee_share_counts_jobs_strictly_below_and_only_requests(frame):
    s = starvation_table(frame, {"k4": 4.0, "k3.5": 3.5, "k13": 13.0})
    assert set(s["trace"]) == {"pods.csv"}  # nodes are hardware, not requests
    whole = s[s["gpu_type"] == "all"].set_index("knee")["starving"]
    assert whole["k4"] == 0.5 and whole["k3.5"] == 0.5 and whole["k13"] == 1.0  # 4 is not below 4
    assert s[(s["gpu_type"] == "V100M16") & (s["knee"] == "k4")]["starving"].item() == 0.5
    assert render_starvation(s).row_count == len(s) == 9
    assert render_shares(shares_table(frame)).row_count == 6


def test_summary_without_cores_answers_nothing_but_is_shown(tmp_path):
    summary = write(tmp_path, "cluster_summary.csv", [
        "id,job_num,cpu_job_num,gpu_job_num,avg_gpu_num,med_gpu_num", "Seren,1031550,367737,663813,5.68,1.0"])
    frame = combine([load_trace(summary)])
    row = shares_table(frame).iloc[0]
    assert row["count"] == 663813 and row["counted"] == 0 and math.isnan(row["below_8"])
    assert starvation_table(frame, {"k": 2.0}).empty


def _comparison(gpus, ttft):
    from orchestrator.observe.report.comparison import comparison, results_frame
    from orchestrator.plan.expand import expand
    from orchestrator.plan.load import parse_spec
    from orchestrator.values.results import TrialResult, TrialStatus

    p = expand(parse_spec({"name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
                           "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
                           "grid": {"cores": [2, 4, 8], "gpus": gpus, "hardware": ["H200" if gpus[0] else "cpu"]}}))
    results = [TrialResult(t.trial_id, TrialStatus.COMPLETED, metrics={"ttft_p50_s": ttft[(t.gpus, t.cores)]})
               for t in p.trials]
    return comparison(results_frame(p.trials, results))


def test_sweep_knees_from_the_comparison_table():
    # 1 GPU: best 0.19 s at 8 cores, 4 cores within 10% -> knee 4 cores = 4 per GPU.
    # 2 GPUs: 2 cores already within 10% of the best -> knee 2 cores = 1 per GPU.
    ttft = {(1, 2): 0.5, (1, 4): 0.2, (1, 8): 0.19, (2, 2): 0.3, (2, 4): 0.3, (2, 8): 0.29}
    assert sweep_knees(_comparison([1, 2], ttft), "paper") == {"paper gpus=1": 4.0, "paper gpus=2": 1.0}
    assert sweep_knees(_comparison([0], {(0, 2): 0.5, (0, 4): 0.2, (0, 8): 0.2}), "smoke") == {}


def test_figure_has_both_panels(frame):
    fig = cdf_figure(cdf_table(frame), {"k": 4.0})
    left, right = fig.axes
    assert len(left.lines) >= 2 and len(right.lines) >= 3  # CDF steps plus the 2/4/8 and knee lines
    assert "requested by jobs" in left.get_title() and "hardware" in right.get_title()


def test_command_prints_and_writes_the_tables(tmp_path):
    pods, nodes = write(tmp_path, "pods.csv", PODS), write(tmp_path, "nodes.csv", NODES)
    out = tmp_path / "out"
    res = CliRunner().invoke(provisioning, [str(pods), str(nodes), "--knee-cores-per-gpu", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 job(s) without a GPU left out" in res.output and "1 node(s) without a GPU left out" in res.output
    shares = pd.read_csv(out / "shares.csv").set_index(["trace", "gpu_type"])
    assert shares.loc[("pods.csv", "all"), "below_4"] == 0.5 and shares.loc[("nodes.csv", "all"), "below_8"] == 0.0
    starving = pd.read_csv(out / "starvation.csv")
    assert starving[starving["gpu_type"] == "all"]["starving"].item() == 0.5
    assert (out / "cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(pd.read_csv(out / "cdf.csv")) == len(cdf_table(combine([load_trace(pods), load_trace(nodes)])))


def test_command_takes_the_knee_of_a_sweep(tmp_path, monkeypatch):
    seen = []

    def knees(sweep, home):
        seen.append((sweep, home))
        return {f"{sweep} gpus=1": 3.5}

    monkeypatch.setattr(provisioning_cli, "measured_knees", knees)
    out = tmp_path / "out"
    res = CliRunner().invoke(provisioning, [str(write(tmp_path, "pods.csv", PODS)), "--sweep", "paper", "--home",
                                            "h", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert seen == [("paper", "h")]
    s = pd.read_csv(out / "starvation.csv")
    assert s[s["gpu_type"] == "all"][["knee", "starving"]].values.tolist() == [["paper gpus=1", 0.5]]


def test_sweep_without_an_mlflow_store_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(provisioning, [str(write(tmp_path, "pods.csv", PODS)), "--sweep", "paper",
                                            "--home", str(tmp_path / "home"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 1 and "--sweep paper: no MLFLOW_TRACKING_URI and no local MLflow store" in res.output
    assert not (tmp_path / "out").exists()


def test_command_refuses_a_bad_trace_with_exit_2(tmp_path):
    bad = write(tmp_path, "pods.csv", [POD_HEADER, "p0,lots,16384,1,1000,,LS,Running,0,100,0"])
    res = CliRunner().invoke(provisioning, [str(bad), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "pods.csv:2: column 'cpu_milli' is 'lots'" in res.output
    assert not (tmp_path / "out").exists()
    res = CliRunner().invoke(provisioning, [str(write(tmp_path, "x.csv", ["a,b", "1,2"])), "--out", str(tmp_path)])
    assert res.exit_code == 2 and "unknown header (a, b)" in res.output
