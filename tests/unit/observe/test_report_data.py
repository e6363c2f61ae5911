"""Loading a report's input: the outbox as the tracker writes it, records files, the sweep's SLOs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.observe import outbox
from orchestrator.observe.report.data import (
    ReportInputError,
    first_slo,
    from_outbox,
    pending_note,
    read_records,
    slo_of,
)
from orchestrator.observe.report.tables import Slo
from orchestrator.observe.report.writer import load_sweep
from workloads.records import records_to_frame


def test_outbox_entries_become_trials_with_records(tmp_path: Path, make_records, make_outbox):
    box = tmp_path / "outbox"
    plan = make_outbox(box, lambda t: None if t.cores == 4 else make_records(0.1 / t.cores, 30, seed=t.repeat),
                       slo={"ttft_s": 0.5, "tpot_s": None})
    data = from_outbox(box, "box-sweep", reason="MLflow at x is unreachable")
    assert data is not None and data.kind == "outbox" and "unreachable" in data.source
    assert len(data.trials) == len(plan.trials) == 6
    assert set(data.records) == {t.trial_id for t in plan.trials if t.cores != 4}
    row = data.trials.set_index("trial_id").loc[plan.trials[0].trial_id]
    assert (row["model"], row["workload"], row["gpus"], row["api_servers"]) == ("tiny-llama", "agentic-short", 0, 1)
    assert row["status"] == "COMPLETED" and row["requests"] == 30
    failed = data.trials[data.trials["cores"] == 4]
    assert set(failed["status"]) == {"FAILED"} and set(failed["error_kind"]) == {"startup_timeout"}
    assert data.slo == Slo(0.5, None, "the sweep's slo")


def test_of_several_entries_of_a_trial_the_finished_one_counts(tmp_path: Path, make_records, make_outbox):
    box = tmp_path / "outbox"
    plan = make_outbox(box, lambda t: make_records(0.1, 10), cores=(1,))
    t = plan.trials[0]
    from orchestrator.values.results import ErrorKind, TrialResult
    later = outbox.trial_payload(t, TrialResult.failed(t.trial_id, ErrorKind.NODE_DIED, "lost"))
    outbox.commit(outbox.stage_trial(box, later))
    data = from_outbox(box, "box-sweep", reason="test")
    assert data.trials.set_index("trial_id").loc[t.trial_id, "status"] == "COMPLETED"
    assert pending_note(box, "box-sweep").startswith("2 result(s)")


def test_an_empty_outbox_and_no_mlflow_is_a_clear_error(tmp_path: Path):
    assert from_outbox(tmp_path / "none", "s", reason="r") is None
    with pytest.raises(ReportInputError, match="no trials of sweep 's': no MLflow tracking URI, and none in the outbox"):
        load_sweep("s", uri=None, outbox_dir=tmp_path / "none")


def test_an_unreachable_server_falls_back_to_the_outbox(tmp_path: Path, make_records, make_outbox):
    make_outbox(tmp_path / "outbox", lambda t: make_records(0.1, 10), cores=(1,))
    data = load_sweep("box-sweep", uri="http://127.0.0.1:9", outbox_dir=tmp_path / "outbox")
    assert data.kind == "outbox" and "MLflow at http://127.0.0.1:9 is unreachable" in data.source


def test_bad_records_files_are_named(tmp_path: Path, make_records):
    bad = tmp_path / "records.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ReportInputError, match="trial t1: cannot read records.parquet"):
        read_records(bad, "trial t1")
    records_to_frame(make_records(0.1, 3)).drop(columns=["first_token_ns"]).to_parquet(bad)
    with pytest.raises(ReportInputError, match=r"trial t1: records.parquet lacks the record columns \['first_token_ns'\]"):
        read_records(bad, "trial t1")
    assert isinstance(read_records(_good(tmp_path, make_records), "t"), pd.DataFrame)


def _good(tmp_path: Path, make_records) -> Path:
    p = tmp_path / "good.parquet"
    records_to_frame(make_records(0.1, 3)).to_parquet(p)
    return p


def test_a_bad_outbox_records_file_is_a_note_not_a_crash(tmp_path: Path, make_records, make_outbox):
    box = tmp_path / "outbox"
    plan = make_outbox(box, lambda t: make_records(0.1, 10), cores=(1,))
    entry = next(e for e in outbox.pending(box) if e.trial_id == plan.trials[0].trial_id)
    (entry.path / "records.parquet").write_bytes(b"garbage")
    data = from_outbox(box, "box-sweep", reason="test")
    assert plan.trials[0].trial_id not in data.records
    assert any(plan.trials[0].trial_id in n and "cannot read records.parquet" in n for n in data.notes)


@pytest.mark.parametrize("data,want", [
    ({"slo": {"ttft_s": 2, "tpot_s": 0.1}}, (2.0, 0.1)),
    ({"slo": json.dumps({"ttft_s": 1.5})}, (1.5, None)),
    ({"slo_ttft_s": "0.8", "slo_tpot_s": ""}, (0.8, None)),
    ({"slo": None}, (None, None)),
    ({}, (None, None)),
])
def test_slos_are_read_from_nested_or_flat_fields(data, want):
    slo = slo_of(data, "spec.json")
    assert (slo.ttft_s, slo.tpot_s) == want


@pytest.mark.parametrize("data,match", [
    ({"slo": {"ttft_s": "fast"}}, r"spec.json: field 'slo.ttft_s': expected a number of seconds, got 'fast'"),
    ({"slo_tpot_s": "-1"}, r"spec.json: field 'slo_tpot_s': an SLO must be more than 0 s"),
    ({"slo": "{oops"}, r"spec.json: field 'slo' is not JSON"),
])
def test_bad_slos_name_the_record_and_field(data, match):
    with pytest.raises(ReportInputError, match=match):
        slo_of(data, "spec.json")


def test_the_first_record_with_slos_wins():
    assert first_slo([({}, "params"), ({"slo": {"tpot_s": 0.2}}, "spec"), ({"slo_ttft_s": 9}, "plan")]).tpot_s == 0.2


class _Client:
    """MLflow's artifact calls, as a client that lists ``listed`` and fails downloads with ``fail``."""

    def __init__(self, listed: dict[str, bytes], fail: Exception | None = None, list_fail: Exception | None = None):
        self.listed, self.fail, self.list_fail = listed, fail, list_fail

    def list_artifacts(self, run_id: str):
        if self.list_fail is not None:
            raise self.list_fail
        return [type("FileInfo", (), {"path": name})() for name in self.listed]

    def download_artifacts(self, run_id: str, name: str, dst: str) -> str:
        if self.fail is not None:
            raise self.fail
        out = Path(dst) / name
        out.write_bytes(self.listed[name])
        return str(out)


def test_an_absent_artifact_is_none_and_a_failed_read_is_an_error(tmp_path: Path):
    from orchestrator.observe.report.data import ArtifactReadError, _artifact, _download_json

    assert _artifact(_Client({}), "r1", "records.parquet", tmp_path) is None  # not recorded
    assert _download_json(_Client({"spec.json": b'{"a": 1}'}), "r1", "spec.json", tmp_path) == {"a": 1}
    assert _download_json(_Client({"plan.json": b"{}"}), "r1", "spec.json", tmp_path) is None
    with pytest.raises(ArtifactReadError, match="run r1: records.parquet is recorded but could not be downloaded: "
                                                "ConnectionError: refused"):
        _artifact(_Client({"records.parquet": b""}, fail=ConnectionError("refused")), "r1", "records.parquet",
                  tmp_path)
    with pytest.raises(ArtifactReadError, match="run r2: could not list its artifacts: TimeoutError"):
        _download_json(_Client({}, list_fail=TimeoutError("slow")), "r2", "spec.json", tmp_path)
    with pytest.raises(ArtifactReadError, match="run r3: spec.json is not readable JSON"):
        _download_json(_Client({"spec.json": b"{not json"}), "r3", "spec.json", tmp_path)
