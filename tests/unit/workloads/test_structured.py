"""Structured output: which turns are constrained, what both clients send for them, and what is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from workloads.client import _BodyEncoder
from workloads.loaders import generate_agentic, load_sessions
from workloads.protocols import Request
from workloads.spec import AgenticWorkload, RecordedWorkload, StructuredOutput, TokenRange, ToolSchema
from workloads.structured import constrain, length_fields, response_format, shipped_tools

AGENTIC = AgenticWorkload(name="a", sessions=40, turns=5, concurrency=4, system_prompt_tokens=16,
                          task_tokens=TokenRange(min=4, max=8), tool_output_tokens=TokenRange(min=4, max=8),
                          output_tokens=TokenRange(min=3, max=5), max_duration_s=30, request_timeout_s=10)
ABENCH = Path(__file__).resolve().parent / "data" / "abench_small.jsonl"
TOOLS = (ToolSchema(name="bash", parameters={"type": "object", "properties": {"command": {"type": "string"}},
                                             "required": ["command"]}),
         ToolSchema(name="finish", parameters={"type": "object", "properties": {"message": {"type": "string"}}}))


def _names(sessions: list) -> dict[str, str | None]:
    return {f"{s.session_id}:{k}": (t.response_format.name if t.response_format else None)
            for s in sessions for k, t in enumerate(s.turns)}


def test_the_shipped_tool_set_is_nine_object_schemas_each_a_strict_json_schema_format() -> None:
    tools = shipped_tools("coding-agent")
    assert [t.name for t in tools] == ["bash", "str_replace_editor", "read_file", "grep", "list_dir", "run_tests",
                                       "web_fetch", "think", "finish"]
    for t in tools:
        value = json.loads(response_format(t).json)
        assert value == {"type": "json_schema", "json_schema": {"name": t.name, "schema": t.parameters, "strict": True}}
        assert t.parameters["required"] and set(t.parameters["required"]) <= set(t.parameters["properties"])


def test_turns_are_constrained_by_a_seeded_draw_per_session_and_turn() -> None:
    sessions = generate_agentic(AGENTIC)
    all_of = _names(constrain(sessions, StructuredOutput(tools=TOOLS), seed=0))
    assert set(all_of.values()) == {"bash", "finish"} and len(all_of) == 200
    half = _names(constrain(sessions, StructuredOutput(tools=TOOLS, fraction=0.5), seed=0))
    assert 70 <= sum(v is not None for v in half.values()) <= 130
    assert half == _names(constrain(sessions, StructuredOutput(tools=TOOLS, fraction=0.5), seed=0))
    assert half != _names(constrain(sessions, StructuredOutput(tools=TOOLS, fraction=0.5), seed=1))
    # A session's draws do not depend on which other sessions were loaded, or in which order.
    alone = _names(constrain(sessions[7:8], StructuredOutput(tools=TOOLS, fraction=0.5), seed=0))
    assert alone == {k: v for k, v in half.items() if k in alone}
    assert constrain(sessions, None, seed=0) is sessions


def test_a_loaded_workload_carries_its_formats_and_free_text_carries_none() -> None:
    free = RecordedWorkload(name="r", path=ABENCH)
    assert all(t.response_format is None for s in load_sessions(free) for t in s.turns)
    structured = free.model_copy(update={"structured_output": StructuredOutput()})
    names = set(_names(load_sessions(structured)).values())
    assert names and names <= {t.name for t in shipped_tools("coding-agent")}


def test_free_text_forces_the_length_and_structured_output_sends_only_a_cap_and_its_format() -> None:
    assert length_fields(48, None) == {"max_tokens": 48, "min_tokens": 48, "ignore_eos": True}
    fmt = response_format(TOOLS[0])
    assert length_fields(48, fmt) == {"max_tokens": 48, "response_format": json.loads(fmt.json)}
    req = Request(request_id="s:0", session_id="s", turn=0, prompt="p", max_tokens=48, scheduled_ns=0,
                  timeout_s=1.0, cut_ns=None, planned_prompt_tokens=1, response_format=fmt)
    body = json.loads(_BodyEncoder("m", continuous_usage=True, sessions=1).encode(req))
    assert body["response_format"]["json_schema"]["name"] == "bash" and body["max_tokens"] == 48
    assert "min_tokens" not in body and "ignore_eos" not in body and body["stream"] is True


def test_bad_tool_sets_are_refused_with_the_field() -> None:
    with pytest.raises(ValidationError, match="parameters must be an object schema"):
        ToolSchema(name="t", parameters={"type": "string"})
    with pytest.raises(ValidationError, match="tool names must be unique"):
        StructuredOutput(tools=(TOOLS[0], TOOLS[0]))
    with pytest.raises(ValidationError, match="at least one tool"):
        StructuredOutput(tools=())
    with pytest.raises(ValidationError, match="fraction"):
        StructuredOutput(fraction=0)


def test_a_free_text_workload_dumps_as_it_did_before_the_field_so_trial_ids_stay() -> None:
    assert "structured_output" not in AGENTIC.model_dump(mode="json")
    assert "structured_output" in AGENTIC.model_copy(
        update={"structured_output": StructuredOutput()}).model_dump(mode="json")
