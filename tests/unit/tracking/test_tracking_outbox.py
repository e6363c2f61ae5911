"""Unit tests of orchestrator.observe.outbox: payloads for MLflow, and the local outbox round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from orchestrator.observe import outbox
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan
from workloads.records import RequestRecord


def _plan(name: str = "unit-sweep") -> SweepPlan:
    return expand(parse_spec({
        "name": name, "description": "unit test sweep",
        "models": [{"kind": "shape", "name": "tiny-llama", "shape": "tiny-llama"}],
        "workloads": [{"kind": "agentic", "name": "agentic-short", "sessions": 2, "turns": 2}],
        "grid": {"cores": [1, 2], "vllm": [{"name": "default", "args": ["--enforce-eager", "--block-size", "32"]}]},
    }))


def _record(i: int) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", session_id="s0", turn=i, scheduled_ns=10, sent_ns=20,
                         first_token_ns=30 if i else None, token_ns=(30, 40, 50), end_ns=60, prompt_tokens=100,
                         completion_tokens=3, cached_tokens=None, client_prompt_tokens=100, tokenize_ns=0,
                         status="ok" if i else "error", error=None if i else "refused")


def _result(trial_id: str, artifacts: Path | None = None) -> TrialResult:
    return TrialResult(
        trial_id=trial_id, status=TrialStatus.COMPLETED, records=(_record(0), _record(1)),
        metrics={"ttft_s_p50": 0.5, "bad": float("nan"), "none": None, "server:odd": 2},
        params={"vllm_version": "0.32.0", "restriction": "cpuset", "cores": "2"},
        telemetry=({"t": 0.1, "name": "replica_cpu_util", "value": 50.0},
                   {"t": 0.2, "name": "replica_cpu_util", "value": 70.0}),
        artifacts_dir=str(artifacts) if artifacts else None, started_at=1000.0, ended_at=1010.0)


def test_run_name_and_params_are_written_once_with_actual_values():
    trial = _plan().trials[1]
    assert outbox.run_name(trial) == "tiny-llama c2 agentic-short r0"
    params = outbox.trial_params(trial, {"restriction": "cpuset", "cores": "2", "vllm_version": "0.32.0"})
    assert params["cores"] == "2" and params["tp"] == "1" and params["load_format"] == "dummy"
    assert params["vllm_args"] == "--enforce-eager --block-size 32"
    assert params["restriction"] == "affinity" and params["restriction_actual"] == "cpuset"  # a fallback is visible
    assert "cores_actual" not in params                       # same value: not repeated
    assert params["vllm_version"] == "0.32.0"
    assert params["workload_sessions"] == "2" and params["workload_task_tokens"] == "64-256"
    assert all(isinstance(v, str) for v in params.values())


def test_trial_payload_metrics_are_finite_and_keys_safe():
    trial = _plan().trials[0]
    failed = TrialResult.failed(trial.trial_id, ErrorKind.STARTUP_TIMEOUT, "not healthy after 600 s")
    p = outbox.trial_payload(trial, failed)
    assert p["status"] == "FAILED" and p["tags"]["error_kind"] == "startup_timeout"
    assert p["tags"]["error_message"] == "not healthy after 600 s" and p["tags"]["trial_id"] == trial.trial_id
    ok = outbox.trial_payload(trial, _result(trial.trial_id))
    assert ok["status"] == "FINISHED"
    assert ok["metrics"]["ttft_s_p50"] == 0.5                  # the executor's summary, as it is
    assert ok["metrics"]["server_odd"] == 2.0 and ok["metrics"]["num_records"] == 2.0
    assert ok["metrics"]["trial_duration_s"] == 10.0
    assert not {"bad", "none"} & set(ok["metrics"])
    assert all(math.isfinite(v) for v in ok["metrics"].values())
    assert ok["trial_spec"]["cores"] == 1 and ok["upload_id"] != p["upload_id"]


def test_sweep_payload_holds_plan_and_spec():
    plan = _plan()
    s = outbox.sweep_payload(plan, experiment="exp", git_commit="abc123", spec_yaml="name: unit-sweep\n")
    assert s["tags"] == {"sweep": "unit-sweep", "orchestrator.kind": "sweep", "git_commit": "abc123",
                         "mlflow.source.git.commit": "abc123", "mlflow.note.content": "unit test sweep"}
    assert [r["trial_id"] for r in s["plan"]] == [t.trial_id for t in plan.trials]
    assert s["params"]["cores"] == "1 2" and s["params"]["trials_planned"] == "2"
    assert json.loads(json.dumps(s))["spec"]["name"] == "unit-sweep"


def test_outbox_roundtrip(tmp_path: Path):
    plan = _plan()
    trial = plan.trials[1]
    arts = tmp_path / "arts"
    (arts / "sub").mkdir(parents=True)
    (arts / "vllm.log").write_text("INFO started\n")
    (arts / "sub" / "cores.json").write_text('{"replica": [0, 1]}')
    result = _result(trial.trial_id, arts)
    box = tmp_path / "outbox"
    payload = outbox.trial_payload(trial, result)
    staged = outbox.stage_trial(box, payload, records=outbox.records_frame(result.records),
                                telemetry=outbox.telemetry_frame(result.telemetry), artifacts_dir=arts)
    assert outbox.pending(box) == []                          # staged folders are invisible
    outbox.write_sweep(box, outbox.sweep_payload(plan, experiment="e", git_commit=None, spec_yaml=None))
    path = outbox.commit(staged)

    [entry] = outbox.pending(box)
    assert entry.path == path and entry.trial_id == trial.trial_id and entry.sweep == "unit-sweep"
    assert entry.payload == json.loads(json.dumps(payload))
    records = pd.read_parquet(entry.file("records.parquet"))
    assert list(records["request_id"]) == ["r0", "r1"] and list(records["token_ns"][1]) == [30, 40, 50]
    assert pd.isna(records["first_token_ns"][0])
    tele = pd.read_parquet(entry.file("telemetry.parquet"))
    assert tele.to_dict("records") == [{"t": 0.1, "name": "replica_cpu_util", "value": 50.0},
                                       {"t": 0.2, "name": "replica_cpu_util", "value": 70.0}]
    assert (entry.path / "artifacts" / "sub" / "cores.json").read_text() == '{"replica": [0, 1]}'
    assert outbox.sweeps(box) == ["unit-sweep"]
    assert outbox.read_sweep(box, "unit-sweep")["plan"][1]["trial_id"] == trial.trial_id

    outbox.write_sweep_end(box, "unit-sweep", {"results": 1})
    assert outbox.read_sweep_end(box, "unit-sweep") == {"results": 1}
    outbox.discard(entry.path)
    assert outbox.pending(box) == []
    assert not outbox.remove_sweep_if_empty(box, "unit-sweep")  # the end marker still waits for a sync
    outbox.clear_sweep_end(box, "unit-sweep")
    assert outbox.remove_sweep_if_empty(box, "unit-sweep")
    assert outbox.sweeps(box) == [] and not any(box.iterdir())


def test_outbox_orders_entries_and_filters_by_sweep(tmp_path: Path):
    a, b = _plan("sweep-a"), _plan("sweep-b")
    paths = []
    for plan in (a, b, a):
        for trial in plan.trials[:1]:
            p = outbox.trial_payload(trial, TrialResult.failed(trial.trial_id, ErrorKind.NODE_DIED, "lost"))
            outbox.write_sweep(tmp_path, outbox.sweep_payload(plan, experiment="e", git_commit=None, spec_yaml=None))
            paths.append(outbox.commit(outbox.stage_trial(tmp_path, p)))
    assert [e.path for e in outbox.pending(tmp_path)] == sorted(paths, key=lambda p: p.name)
    assert len(outbox.pending(tmp_path, "sweep-a")) == 2 and len(outbox.pending(tmp_path, "sweep-b")) == 1
    assert sorted(outbox.sweeps(tmp_path)) == ["sweep-a", "sweep-b"]
    e = outbox.pending(tmp_path, "sweep-b")[0]
    assert e.file("records.parquet") is None and e.file("artifacts") is None   # a failed trial has none


def test_a_claimed_entry_is_hidden_given_back_and_reclaimed_from_a_dead_process(tmp_path: Path):
    import os
    import subprocess

    plan = _plan()
    paths = []
    for trial in plan.trials:
        p = outbox.trial_payload(trial, TrialResult.failed(trial.trial_id, ErrorKind.NODE_DIED, "lost"))
        paths.append(outbox.commit(outbox.stage_trial(tmp_path, p)))
    claimed = outbox.claim(paths[0])
    assert claimed is not None and claimed.name == f".claimed-{os.getpid()}-{paths[0].name}"
    assert outbox.entry_paths(tmp_path) == [paths[1]]          # no other uploader sees it
    assert outbox.claim(paths[0]) is None                      # nor takes it
    assert outbox.load(claimed).trial_id == plan.trials[0].trial_id
    assert outbox.unclaim(claimed) == paths[0] and outbox.entry_paths(tmp_path) == paths
    assert outbox.reclaim(tmp_path) == 0

    gone = subprocess.Popen(["true"])
    gone.wait()                                                # a process that is gone (a killed driver)
    dead = paths[0].with_name(f".claimed-{gone.pid}-{paths[0].name}")
    os.rename(paths[0], dead)
    alive = paths[1].with_name(f".claimed-{os.getppid()}-{paths[1].name}")  # a live process's claim stays
    os.rename(paths[1], alive)
    assert outbox.entry_paths(tmp_path) == []
    assert outbox.reclaim(tmp_path, "unit-sweep") == 1
    assert outbox.entry_paths(tmp_path) == [paths[0]] and alive.exists()
