"""What a node needs from the driver, without the driver's disk: the trace file through Ray's object
store (``localize``) and the tokenizer of a model folder or hub id (``tokenizer_file``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.node.workload_actor import localize
from orchestrator.plan.models import ModelError, tokenizer_file


def test_a_trace_is_written_node_local_by_its_hash_and_the_spec_points_there(tmp_path: Path, monkeypatch):
    (tmp_path / "node-tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node-tmp"))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    spec = json.dumps({"name": "w", "kind": "recorded", "path": "/driver/only/sessions.jsonl"})
    out = json.loads(localize(spec, ("abc123", b'{"session_id": "s"}\n')))
    local = Path(out["path"])
    assert local.parent == tmp_path / "node-tmp" / "orchestrator-traces"
    assert local.name == "abc123-sessions.jsonl" and local.read_bytes() == b'{"session_id": "s"}\n'
    assert out["name"] == "w" and out["kind"] == "recorded"
    again = json.loads(localize(spec, ("abc123", b"ignored: the copy of this hash exists")))
    assert again["path"] == str(local) and local.read_bytes() == b'{"session_id": "s"}\n'
    assert localize(spec, None) == spec  # no trace: unchanged


def test_the_tokenizer_of_a_folder_and_of_a_hub_id(tmp_path: Path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tokenizer.json").write_text("{}")
    assert tokenizer_file(tmp_path / "m") == str(tmp_path / "m" / "tokenizer.json")
    (tmp_path / "bare").mkdir()
    with pytest.raises(ModelError, match="has no tokenizer.json"):
        tokenizer_file(tmp_path / "bare")
    # A hub id is not a folder: it is looked up on the hub (here offline, with an empty cache).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="no-such-org/no-such-model: cannot get tokenizer.json"):
        tokenizer_file("no-such-org/no-such-model")
