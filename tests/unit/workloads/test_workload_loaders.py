"""Loaders: fixture files (never skipped), the real shared traces (skipped if absent), bad lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter

from workloads.loaders import TraceError, load_sessions
from workloads.spec import AgenticWorkload, AzureWorkload, MooncakeWorkload, TokenRange, WorkloadSpec
from workloads.text import TextFactory

DATA = Path(__file__).resolve().parent / "data"
# CI runs from a fresh clone with ../shared/ beside the repository.
SHARED = (Path(__file__).resolve().parents[3] / ".." / "shared" / "traces").resolve()
MOONCAKE = SHARED / "mooncake-fast25" / "conversation_trace.jsonl"
AZURE = sorted((SHARED / "azure-llm-inference-2023").glob("*.csv"))


def _need(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"shared trace {path} absent (expected ../shared/traces beside the repository)")


# --- Mooncake -------------------------------------------------------------------------

def test_mooncake_fixture_blocks_offsets_and_prefix(qwen3_factory: TextFactory) -> None:
    spec = MooncakeWorkload(name="m", path=DATA / "mooncake_small.jsonl", time_scale=0.5)
    sessions = load_sessions(spec, qwen3_factory)
    assert [s.start_s for s in sessions] == [0.0, 0.0, 0.75, 1.5]  # ms x time_scale
    assert [s.turns[0].output_tokens for s in sessions] == [20, 5, 1, 7]
    first = sessions[0].turns[0].append
    assert [(b.hash_id, b.tokens) for b in first] == [(0, 512), (1, 512), (2, 76)]
    texts = [qwen3_factory.render(s.turns[0].append) for s in sessions]
    assert [qwen3_factory.count(t) for t in texts] == [1100, 600, 512, 1030]
    # Hash id 0 is shared by lines 1, 2 and 5: identical leading 512 tokens, so the cache hits.
    assert texts[1].startswith(qwen3_factory.block(0, 512)) and texts[0].startswith(qwen3_factory.block(0, 512))
    assert texts[3].startswith(qwen3_factory.render([(0, 512), (1, 512)]))
    assert len({s.session_id for s in sessions}) == 4
    assert sessions[2].session_id == "mooncake_small-4"  # named by line number (line 3 is blank)


def test_mooncake_max_requests_and_clip() -> None:
    spec = MooncakeWorkload(name="m", path=DATA / "mooncake_small.jsonl", max_requests=2, max_context_tokens=700)
    sessions = load_sessions(spec)
    assert len(sessions) == 2
    assert [b.tokens for b in sessions[0].turns[0].append] == [512, 188]  # prefix kept, then clipped
    assert sessions[1].turns[0].append_tokens == 600


@pytest.mark.parametrize(("line", "message"), [
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": "0"}', "hash_ids must be a list of ints"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0.5]}', "hash_ids must be a list of ints"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [true]}', "hash_ids must be a list of ints"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [0]}', "needs 2 blocks"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 2, "hash_ids": []}', "input_length must be an int >= 1"),
    ('{"timestamp": 0, "input_length": 10, "output_length": "2", "hash_ids": [0]}', "output_length must be an int"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": [0]}', "timestamp must be"),
    ('{"input_length": 10, "output_length": 2, "hash_ids": [0]}', "missing field 'timestamp'"),
    ('{"timestamp": 0, "input_length": 10', "invalid JSON"),
    ('[1, 2]', "must be a JSON object"),
])
def test_mooncake_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}'
    path = tmp_path / "conversation_trace.jsonl"
    path.write_text("\n".join([good] * 16 + [line, good]) + "\n")
    with pytest.raises(TraceError) as info:
        load_sessions(MooncakeWorkload(name="m", path=path))
    assert str(info.value).startswith("conversation_trace.jsonl:17: ")
    assert message in str(info.value)
    assert info.value.line == 17


def test_missing_and_empty_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nope.jsonl:0: no such trace file"):
        load_sessions(MooncakeWorkload(name="m", path=tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        load_sessions(MooncakeWorkload(name="m", path=tmp_path / "empty.jsonl"))


def test_mooncake_real_trace() -> None:
    _need(MOONCAKE)
    sessions = load_sessions(MooncakeWorkload(name="m", path=MOONCAKE))
    assert len(sessions) == 12_031  # SOURCE.md: 12,031 lines
    assert sessions[0].turns[0].append_tokens == 6758 and sessions[0].turns[0].output_tokens == 500
    assert sessions[-1].start_s == pytest.approx(3536.999)
    starts = [s.start_s for s in sessions]
    assert starts == sorted(starts)


# --- Azure ----------------------------------------------------------------------------

def test_azure_fixture(qwen3_factory: TextFactory) -> None:
    sessions = load_sessions(AzureWorkload(name="a", path=DATA / "azure_small.csv"))
    assert [s.start_s for s in sessions] == pytest.approx([0.0, 4.314579, 4.31941, 13.31941], abs=1e-9)
    assert [s.turns[0].append_tokens for s in sessions] == [374, 396, 12, 1000]
    assert [s.turns[0].output_tokens for s in sessions] == [44, 109, 1, 3]
    texts = [qwen3_factory.render(s.turns[0].append) for s in sessions]
    assert [qwen3_factory.count(t) for t in texts] == [374, 396, 12, 1000]
    assert texts[0][:50] != texts[1][:50]  # no prefix sharing in this trace


@pytest.mark.parametrize(("row", "message"), [
    ("2023-11-16 18:15:46.68,abc,3", "ContextTokens must be an int >= 1, got 'abc'"),
    ("2023-11-16 18:15:46.68,10,0", "GeneratedTokens must be an int >= 1, got 0"),
    ("16/11/2023 18:15,10,3", "TIMESTAMP"),
    ("2023-11-16 18:15:46.68,10", "expected 3 fields, got 2"),
])
def test_azure_malformed_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        load_sessions(AzureWorkload(name="a", path=path))
    assert str(info.value).startswith("AzureLLMInferenceTrace_conv.csv:3: ")
    assert message in str(info.value)


def test_azure_bad_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time,ctx,gen\n1,2,3\n")
    with pytest.raises(TraceError, match="t.csv:1: header must be"):
        load_sessions(AzureWorkload(name="a", path=path))


@pytest.mark.parametrize("index", [0, 1])
def test_azure_real_traces(index: int) -> None:
    if len(AZURE) <= index:
        pytest.skip(f"shared Azure traces absent under {SHARED}")
    sessions = load_sessions(AzureWorkload(name="a", path=AZURE[index]))
    assert len(sessions) in (8_819, 19_366)  # SOURCE.md row counts
    assert all(s.turns[0].append_tokens >= 1 for s in sessions)
    assert sessions[0].start_s == 0.0 and sessions[-1].start_s > 3000


# --- agentic --------------------------------------------------------------------------

def _agentic(**kw) -> AgenticWorkload:
    base = dict(name="ag", sessions=4, turns=30, system_prompt_tokens=1000, task_tokens=TokenRange(min=50, max=60),
                tool_output_tokens=TokenRange(min=200, max=400), output_tokens=TokenRange(min=10, max=20),
                max_context_tokens=6000, think_time_s=0.5)
    base.update(kw)
    return AgenticWorkload(**base)


def test_agentic_shared_prefix_growth_and_limit() -> None:
    sessions = load_sessions(_agentic())
    assert len(sessions) == 4
    system = {s.turns[0].append[0] for s in sessions}
    assert len(system) == 1 and next(iter(system)).tokens == 1000  # identical prefix block everywhere
    tasks = {s.turns[0].append[1].hash_id for s in sessions}
    assert len(tasks) == 4  # own task per session
    for s in sessions:
        assert all(s.start_s is None for s in sessions)
        assert s.turns[0].think_s == 0.0 and all(t.think_s == 0.5 for t in s.turns[1:])
        assert all(len(t.append) == 1 and 200 <= t.append_tokens <= 400 for t in s.turns[1:])
        last = len(s.turns) - 1
        assert s.planned_prompt_tokens(last) + s.turns[last].output_tokens <= 6000
        assert len(s.turns) < 30  # the context limit, not the turn count, ended it
        # One more turn of the smallest size would not have fit.
        assert s.planned_prompt_tokens(last) + s.turns[last].output_tokens + 200 + 10 > 6000 - 400


def test_agentic_is_deterministic_and_per_session_stable() -> None:
    a = load_sessions(_agentic(sessions=3))
    b = load_sessions(_agentic(sessions=5))
    assert a == b[:3]  # session i does not depend on how many sessions there are
    assert load_sessions(_agentic(seed=1)) != load_sessions(_agentic(seed=2))


def test_agentic_poisson_arrivals() -> None:
    sessions = load_sessions(_agentic(sessions=200, session_rate_per_s=10.0))
    starts = [s.start_s for s in sessions]
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert 200 / 10 * 0.7 < starts[-1] < 200 / 10 * 1.3  # mean gap 1/rate


def test_agentic_first_turn_too_big() -> None:
    with pytest.raises(ValueError, match="exceeds max_context_tokens"):
        load_sessions(_agentic(system_prompt_tokens=10_000))


def test_spec_union_dispatches_on_kind() -> None:
    spec = TypeAdapter(WorkloadSpec).validate_python(
        {"kind": "mooncake", "name": "m", "path": str(DATA / "mooncake_small.jsonl")})
    assert isinstance(spec, MooncakeWorkload) and len(load_sessions(spec)) == 4
