"""The bare cross-check client, run as ``python -m workloads.bare`` against the tiny SSE server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from workloads.bare import BareClient, crosscheck_ratio, parse_cpus, percentile
from workloads.loaders import generate_agentic, load_sessions
from workloads.records import frame_to_records, records_to_frame
from workloads.run_workload import run_workload_sync
from workloads.spec import AgenticWorkload, MooncakeWorkload, RecordedWorkload, StructuredOutput, TokenRange, ToolSchema
from workloads.text import bundled_tokenizer_path

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(__file__).resolve().parent / "data"
ABENCH = DATA / "abench_small.jsonl"  # deepswe-1: 3 turns (gaps 0, 1500, 250.5 ms); lmcache-7: 2 turns

SPEC = AgenticWorkload(name="bare", sessions=3, turns=3, concurrency=2, system_prompt_tokens=64,
                       task_tokens=TokenRange(min=8, max=16), tool_output_tokens=TokenRange(min=8, max=16),
                       output_tokens=TokenRange(min=3, max=5), max_duration_s=30, request_timeout_s=10)


def run_bare(tmp_path: Path, base_url: str, spec_json: str, model: str = "ok",
             extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list[dict]]:
    spec_path, out = tmp_path / "workload.json", tmp_path / "bare.jsonl"
    spec_path.write_text(spec_json)
    cmd = [sys.executable, "-m", "workloads.bare", "--base-url", base_url, "--model", model,
           "--tokenizer", str(bundled_tokenizer_path("qwen3")), "--workload-json", str(spec_path),
           "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, rows


def test_replays_every_turn_with_the_products_body(sse_server, tmp_path: Path) -> None:
    cpu = str(sorted(os.sched_getaffinity(0))[-1])
    proc, rows = run_bare(tmp_path, sse_server.base_url, SPEC.model_dump_json(), extra=("--cpus", cpu))
    assert proc.returncode == 0, proc.stderr
    *requests, last = rows
    sessions = generate_agentic(SPEC)
    assert sorted(r["request_id"] for r in requests) == sorted(
        f"{s.session_id}:{k}" for s in sessions for k in range(len(s.turns)))
    assert all(r["status"] == "ok" and r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"] for r in requests)
    planned = {f"{s.session_id}:{k}": t.output_tokens for s in sessions for k, t in enumerate(s.turns)}
    assert all(r["completion_tokens"] == planned[r["request_id"]] for r in requests)
    assert last["summary"] is True and last["count"] == last["ok"] == len(requests)
    assert last["ttft_p50_s"] > 0 and last["wall_s"] > 0
    seen = sse_server.behaviour.seen
    body = seen[0]
    assert set(body) == {"model", "prompt", "max_tokens", "min_tokens", "ignore_eos", "temperature", "stream",
                         "stream_options"}
    assert body["min_tokens"] == body["max_tokens"] and body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    # Turn k+1's prompt is turn k's prompt plus the real answer, then the next tool output.
    prompts = [b["prompt"] for b in seen]
    for p in prompts:
        longer = [q for q in prompts if q != p and q.startswith(p)]
        for q in longer:
            assert q[len(p):].startswith(" tok")
    assert sum(1 for p in prompts if any(q != p and q.startswith(p + " tok") for q in prompts)) == 6


def test_trace_replays_open_loop(sse_server, tmp_path: Path) -> None:
    spec = MooncakeWorkload(name="mc", path=DATA / "mooncake_small.jsonl", time_scale=0.1, max_duration_s=30,
                            request_timeout_s=10)
    proc, rows = run_bare(tmp_path, sse_server.base_url, spec.model_dump_json())
    assert proc.returncode == 0, proc.stderr
    assert rows[-1]["ok"] == rows[-1]["count"] == len(rows) - 1 >= 3


def test_failed_requests_are_rows(sse_server, tmp_path: Path) -> None:
    proc, rows = run_bare(tmp_path, sse_server.base_url, SPEC.model_dump_json(), model="http500")
    assert proc.returncode == 0, proc.stderr
    assert {r["status"] for r in rows[:-1]} == {"error"} and "HTTP 500" in rows[0]["error"]
    assert len(rows) - 1 == SPEC.sessions  # a failed turn ends its session
    assert rows[-1]["ok"] == 0 and rows[-1]["ttft_p50_s"] is None


def test_bad_workload_file_exits_nonzero(sse_server, tmp_path: Path) -> None:
    proc, rows = run_bare(tmp_path, sse_server.base_url, '{"kind": "agentic", "name": "x", "sesions": 1}')
    assert proc.returncode == 2 and "bad workload file" in proc.stderr and rows == []
    proc, _ = run_bare(tmp_path, sse_server.base_url, "not json")
    assert proc.returncode == 2 and "bad workload file" in proc.stderr


def test_unreachable_server_exits_nonzero(refused_url: str, tmp_path: Path) -> None:
    proc, rows = run_bare(tmp_path, refused_url, SPEC.model_dump_json())
    assert proc.returncode == 2 and "cannot reach the server" in proc.stderr and rows == []


def test_crosscheck_ratio_and_helpers() -> None:
    r = crosscheck_ratio([0.2, 0.4, 0.6], [0.1, 0.2, 0.3])
    assert r["ttft_p50_ratio"] == pytest.approx(2.0) and r["ttft_p90_ratio"] == pytest.approx(2.0)
    assert r["harness_count"] == 3.0 and r["bare_count"] == 3.0
    assert r["ttft_p50_harness_s"] == pytest.approx(0.4) and r["ttft_p50_bare_s"] == pytest.approx(0.2)
    empty = crosscheck_ratio([0.2], [])
    assert empty["ttft_p50_ratio"] is None and empty["bare_count"] == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)  # numpy's linear interpolation
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}


# --- recorded (chat) sessions ---------------------------------------------------------------

CHAT_FIELDS = {"model", "messages", "max_tokens", "min_tokens", "ignore_eos", "temperature", "stream", "stream_options"}


def recorded(mode: str, **kw) -> RecordedWorkload:
    return RecordedWorkload(name="rec", path=ABENCH, mode=mode, max_duration_s=30, request_timeout_s=10,
                            **{"concurrency": 2, "gaps": "drop", **kw})


def expected_histories(spec: RecordedWorkload, answer) -> dict[int, list[list[dict]]]:
    """Per session (by turn count) the messages each turn must carry: the recorded deltas so far, each
    answer in between as an assistant message (``answer(turn_index, turn)`` gives its text)."""
    out = {}
    for session in load_sessions(spec):
        history, per_turn = [], []
        for k, turn in enumerate(session.turns):
            history += [{"role": m.role, "content": m.content} for m in turn.messages]
            per_turn.append(list(history))
            history.append({"role": "assistant", "content": answer(k, turn)})
        out[session.session_id] = per_turn
    return out


def by_history(bodies: list[dict]) -> dict[str, dict]:
    return {json.dumps(b["messages"]): b for b in bodies}


@pytest.mark.parametrize("mode", ["trace", "live"])
def test_chat_sessions_replay_the_recorded_history(sse_server, tmp_path: Path, mode: str) -> None:
    spec = recorded(mode)
    proc, rows = run_bare(tmp_path, sse_server.base_url, spec.model_dump_json())
    assert proc.returncode == 0, proc.stderr
    *requests, last = rows
    sessions = load_sessions(spec)
    planned = {f"{s.session_id}:{k}": t.output_tokens for s in sessions for k, t in enumerate(s.turns)}
    assert sorted(r["request_id"] for r in requests) == sorted(planned)
    assert all(r["status"] == "ok" and 0 < r["ttft_s"] <= r["e2e_s"] for r in requests), requests
    assert {r["request_id"]: r["completion_tokens"] for r in requests} == planned
    assert last["ok"] == last["count"] == 5
    seen = sse_server.behaviour.seen
    assert all(set(b) == CHAT_FIELDS for b in seen)
    assert all(b["min_tokens"] == b["max_tokens"] and b["ignore_eos"] is True and b["temperature"] == 0 for b in seen)
    assert all(b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True} for b in seen)
    # Trace mode carries the recorded answers; live mode the fake server's own answer, " ans" once per forced token.
    answer = (lambda k, turn: turn.recorded_answer) if mode == "trace" else (  # noqa: E731
        lambda k, turn: " ans" * turn.output_tokens)
    want = expected_histories(spec, answer)
    sent = by_history(seen)
    for sid, per_turn in want.items():
        for k, messages in enumerate(per_turn):
            assert json.dumps(messages) in sent, (sid, k)
            assert sent[json.dumps(messages)]["max_tokens"] == planned[f"{sid}:{k}"]
    assert len(seen) == 5
    if mode == "trace":
        third = sent[json.dumps(want["deepswe-1"][2])]["messages"]
        assert third[2] == {"role": "assistant", "content": "Let me read utils.py first."}
        assert want["lmcache-7"][1][1] == {"role": "assistant", "content": "High hit rate, few evictions."}


@pytest.mark.parametrize("mode", ["trace", "live"])
def test_chat_bodies_equal_the_products(sse_server, tmp_path: Path, mode: str) -> None:
    """The product (run_workload_sync) and the bare client send the very same bodies for one workload."""
    spec = recorded(mode)
    run = run_workload_sync(spec, base_url=sse_server.base_url, model="ok",
                            tokenizer_path=str(bundled_tokenizer_path("qwen3")))
    assert [r.status for r in run.records] == ["ok"] * 5
    product = sorted(json.dumps(b, sort_keys=True) for b in sse_server.behaviour.seen)
    sse_server.behaviour.seen.clear()
    proc, rows = run_bare(tmp_path, sse_server.base_url, spec.model_dump_json())
    assert proc.returncode == 0, proc.stderr
    assert sorted(json.dumps(b, sort_keys=True) for b in sse_server.behaviour.seen) == product
    assert {r.request_id: r.prompt_tokens for r in run.records} == {r["request_id"]: r["prompt_tokens"] for r in rows[:-1]}


def test_chat_sessions_run_closed_loop_with_think_time(sse_server, tmp_path: Path) -> None:
    # One slot: sessions one after the other, turns in order. Gaps scaled to 0.3 s and 75 ms (deepswe-1's).
    spec = recorded("trace", concurrency=1, gaps="scale", gap_scale=0.2)
    proc, rows = run_bare(tmp_path, sse_server.base_url, spec.model_dump_json())
    assert proc.returncode == 0, proc.stderr
    order = [len(b["messages"]) for b in sse_server.behaviour.seen]
    # deepswe-1: system+user, then +assistant+tool twice; lmcache-7: user, then +assistant+user.
    assert order == [2, 4, 6, 1, 3], order
    assert [r["request_id"] for r in rows[:-1]] == ["deepswe-1:0", "deepswe-1:1", "deepswe-1:2", "lmcache-7:0",
                                                     "lmcache-7:1"]
    assert rows[-1]["wall_s"] >= 0.3 + 0.0501  # the think times were waited for


def test_chat_session_ends_at_a_failed_turn(refused_url: str) -> None:
    """A chat turn that fails ends its session, as in the product: one error row per session."""
    spec = recorded("trace")

    async def main() -> list[dict]:
        async with aiohttp.ClientSession(trust_env=False) as http:
            client = BareClient(http, refused_url + "/v1/completions", "ok", spec, None,
                                chat_url=refused_url + "/v1/chat/completions")
            await client.run(load_sessions(spec))
            return client.rows
    rows = asyncio.run(main())
    assert sorted(r["request_id"] for r in rows) == ["deepswe-1:0", "lmcache-7:0"]
    assert all(r["status"] == "error" and r["ttft_s"] is None and "Connect" in r["error"] for r in rows), rows


# ---------------------------------------------------------------- the text style (workloads.bare.prepare)

@pytest.mark.parametrize("style", ["code", "uniform"])
def test_the_bare_client_renders_the_specs_text_style(style: str) -> None:
    """The cross-check replays the product's text: its factory has the spec's style, not a default."""
    from workloads.bare import prepare

    spec = SPEC.model_copy(update={"text_style": style, "sessions": 1, "turns": 1})
    factory, sessions = prepare(spec, str(bundled_tokenizer_path("qwen3")))
    assert factory.style == style and len(sessions) == 1


def test_a_bad_text_style_is_a_clear_error_not_a_silent_default() -> None:
    from workloads.bare import BareError, prepare

    spec = SPEC.model_construct(**{**dict(SPEC), "text_style": "poetry"})  # past the spec's own validation
    with pytest.raises(BareError, match=r"bad text_style 'poetry': unknown text style 'poetry'; expected one of"):
        prepare(spec, str(bundled_tokenizer_path("qwen3")))


def test_a_factory_that_refuses_the_style_is_never_replaced_by_the_default(monkeypatch) -> None:
    """The removed fallback built ``TextFactory(tok)`` (the default style) on any TypeError."""
    import workloads.bare as bare
    from workloads.bare import prepare

    made: list[str] = []

    class OldFactory:  # the signature before TextFactory took ``style``
        def __init__(self, tokenizer, **kwargs) -> None:
            if kwargs:
                raise TypeError(f"unexpected keyword argument {next(iter(kwargs))!r}")
            made.append("default")

    monkeypatch.setattr(bare, "TextFactory", OldFactory)  # bare imports it at its top
    with pytest.raises(TypeError, match="style"):
        prepare(SPEC.model_copy(update={"text_style": "code"}), str(bundled_tokenizer_path("qwen3")))
    assert made == []


_TOOLS = (ToolSchema(name="bash", parameters={"type": "object", "properties": {"command": {"type": "string"}}}),
          ToolSchema(name="finish", parameters={"type": "object", "properties": {"message": {"type": "string"}}}))


def test_the_harness_and_the_bare_client_send_the_same_formats_and_records_keep_the_schema(
        sse_server, tmp_path: Path) -> None:
    spec = SPEC.model_copy(update={"sessions": 4, "turns": 3,
                                      "structured_output": StructuredOutput(tools=_TOOLS, fraction=0.5)})
    run = run_workload_sync(spec, base_url=sse_server.base_url, model="ok",
                            tokenizer_path=str(bundled_tokenizer_path("qwen3")))
    planned = {f"{s.session_id}:{k}": (t.response_format.name if t.response_format else None)
               for s in load_sessions(spec) for k, t in enumerate(s.turns)}
    assert {r.request_id: r.response_schema for r in run.records} == planned
    assert {None, "bash", "finish"} >= set(planned.values()) and len(set(planned.values())) >= 2
    harness = {json.dumps(b.get("response_format"), sort_keys=True) for b in sse_server.behaviour.seen}
    forced = [b for b in sse_server.behaviour.seen if "response_format" not in b]
    assert all(b["min_tokens"] == b["max_tokens"] and b["ignore_eos"] for b in forced)
    sse_server.behaviour.seen.clear()
    proc, rows = run_bare(tmp_path, sse_server.base_url, spec.model_dump_json())
    assert proc.returncode == 0, proc.stderr
    assert {json.dumps(b.get("response_format"), sort_keys=True) for b in sse_server.behaviour.seen} == harness
    back = frame_to_records(records_to_frame(run.records))
    assert [r.response_schema for r in back] == [r.response_schema for r in run.records]
