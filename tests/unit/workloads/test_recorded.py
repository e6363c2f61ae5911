"""Recorded sessions: the spec, the loader (abench plain and zstd, chat), every bad line naming
file:line, gaps, max_context_tokens, trace vs live history, the chat client path, records and
the prompt-token ratio."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from pathlib import Path

import pytest
import zstandard
from pydantic import TypeAdapter, ValidationError

from orchestrator.plan.models import _ensure_chat_template
from orchestrator.values.shapes import CHATML_TEMPLATE, LLAMA3, QWEN3
from workloads.client import StreamingClient
from workloads.loaders import TraceError, load_sessions
from workloads.loaders.recorded import estimate_tokens
from workloads.loadgen import ClosedLoop, LoadGenerator
from workloads.metrics import prompt_tokens_vs_recorded, summarize
from workloads.protocols import Request, chat_transcript
from workloads.records import RequestRecord, frame_to_records, records_to_frame
from workloads.run_workload import run_workload_sync
from workloads.spec import RecordedWorkload, WorkloadSpec
from workloads.text import bundled_tokenizer_path
from workloads.trace import Message

DATA = Path(__file__).resolve().parent / "data"
ABENCH = DATA / "abench_small.jsonl"
CHAT = DATA / "chat_small.jsonl"
S = 1_000_000_000


def spec(path: Path = ABENCH, **kw) -> RecordedWorkload:
    return RecordedWorkload(name="rec", path=path, **kw)


# --- spec -------------------------------------------------------------------------------

def test_spec_is_in_the_union_and_strict() -> None:
    parsed = TypeAdapter(WorkloadSpec).validate_python({"kind": "recorded", "name": "r", "path": "x.jsonl"})
    assert isinstance(parsed, RecordedWorkload) and parsed.mode == "trace" and parsed.format == "auto"
    with pytest.raises(ValidationError):
        RecordedWorkload(name="r", path=Path("x"), text_style="code")  # no synthetic text here
    with pytest.raises(ValidationError, match="gap_scale"):
        RecordedWorkload(name="r", path=Path("x"), gap_scale=2.0)  # only with gaps='scale'
    assert all(f.description for f in RecordedWorkload.model_fields.values())


# --- loader -----------------------------------------------------------------------------

def test_abench_sessions_turns_and_counts() -> None:
    a, b = load_sessions(spec())
    assert (a.session_id, b.session_id) == ("deepswe-1", "lmcache-7") and a.is_chat
    t0, t1, t2 = a.turns
    assert t0.messages == (Message("system", "You are a coding agent. Use the tools to fix the bug."),
                           Message("user", "The test test_add in utils_test.py fails. Fix it."))
    assert t1.messages == (Message("tool", "def add(a, b):\n    return a - b\n"),)  # tool_call_id ignored
    assert [t.output_tokens for t in a.turns] == [7, 14, 8]
    assert [t.recorded_prompt_tokens for t in a.turns] == [40, 75, 110]
    assert [a.planned_prompt_tokens(k) for k in range(3)] == [40, 75, 110]
    assert t2.recorded_answer == "Done: test_add passes now."
    assert [t.think_s for t in a.turns] == [0.0, 1.5, 0.2505]  # pre_gap_ms, kept
    # Session 2: null system prompt, no input_tokens (estimated), a recorded 0 forced to 1.
    assert b.turns[0].messages[0].role == "user" and len(b.turns[0].messages) == 1
    assert b.turns[0].recorded_prompt_tokens is None and b.turns[1].output_tokens == 1
    first = len(b.turns[0].messages[0].content)
    assert b.turns[0].prompt_tokens_estimate == estimate_tokens(first) == -(-first // 4)
    chars = first + len("High hit rate, few evictions.") + len("And what would you tune?")
    assert b.turns[1].prompt_tokens_estimate == estimate_tokens(chars)


def test_zstd_file_gives_the_same_sessions(tmp_path: Path) -> None:
    packed = tmp_path / "abench_small.jsonl.zst"
    packed.write_bytes(zstandard.ZstdCompressor().compress(ABENCH.read_bytes()))
    assert load_sessions(spec(packed)) == load_sessions(spec())
    # Two frames (files joined with cat), and a frame split across reads of the stream.
    lines = ABENCH.read_bytes().split(b"\n", 1)
    joined = tmp_path / "joined.zst"
    joined.write_bytes(b"".join(zstandard.ZstdCompressor().compress(part + b"\n") for part in lines))
    assert load_sessions(spec(joined)) == load_sessions(spec())


def test_chat_jsonl_turns_end_at_assistant_messages() -> None:
    a, b = load_sessions(spec(CHAT))
    assert a.session_id == "chat-a" and b.session_id == "chat_small-2"  # id, else <stem>-<line>
    assert [len(t.messages) for t in a.turns] == [2, 1]  # the trailing unanswered question is dropped
    assert a.turns[1].messages == (Message("user", "Now three even numbers."),)
    assert a.turns[0].recorded_answer == "2, 3, 5."
    assert a.turns[0].output_tokens == estimate_tokens(len("2, 3, 5.")) and a.turns[0].recorded_prompt_tokens is None
    assert load_sessions(spec(CHAT, format="chat")) == [a, b]


@pytest.mark.parametrize(("gaps", "scale", "expected"), [("keep", 1.0, [0.0, 1.5, 0.2505]),
                                                         ("scale", 0.5, [0.0, 0.75, 0.12525]),
                                                         ("drop", 1.0, [0.0, 0.0, 0.0])])
def test_gaps(gaps: str, scale: float, expected: list[float]) -> None:
    session = load_sessions(spec(gaps=gaps, gap_scale=scale))[0]
    assert [t.think_s for t in session.turns] == pytest.approx(expected)


def test_max_context_tokens_ends_sessions_before_the_turn(tmp_path: Path) -> None:
    a, b = load_sessions(spec(max_context_tokens=100))
    assert len(a.turns) == 2  # recorded input_tokens 40, 75, then 110 > 100
    assert len(b.turns) == 2  # estimated, small
    (only,) = load_sessions(spec(max_context_tokens=64, max_sessions=1))
    assert len(only.turns) == 1
    big = _write(tmp_path, {"messages": [{"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "y"}]})
    with pytest.raises(TraceError, match="no session's first turn fits max_context_tokens 64"):
        load_sessions(spec(big, max_context_tokens=64))


def _write(tmp_path: Path, *lines: object, name: str = "bad.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_output_tokens_fixed_and_modes() -> None:
    fixed = load_sessions(spec(output_tokens="fixed", fixed_output_tokens=3))
    assert {t.output_tokens for s in fixed for t in s.turns} == {3}
    live = load_sessions(spec(mode="live"))
    assert all(t.recorded_answer is None for s in live for t in s.turns)
    # Live mode estimates count the server's answers at their forced length.
    chars = len(live[1].turns[0].messages[0].content) + len(live[1].turns[1].messages[0].content)
    assert live[1].turns[1].prompt_tokens_estimate == estimate_tokens(chars) + 6


def test_max_sessions_stops_reading() -> None:
    assert [s.session_id for s in load_sessions(spec(max_sessions=1))] == ["deepswe-1"]


def test_session_rate_gives_seeded_arrivals() -> None:
    a = load_sessions(spec(session_rate_per_s=2.0))
    assert a[0].start_s == 0.0 and a[1].start_s > 0 and a == load_sessions(spec(session_rate_per_s=2.0))


GOOD_TURN = {"input_delta": [{"role": "user", "content": "hi"}], "assistant_text": "ok", "output_tokens": 2}
GOOD = {"system_prompt": "s", "turns": [GOOD_TURN]}


def _turn(**kw) -> dict:
    return {"system_prompt": "s", "turns": [{**GOOD_TURN, **kw}]}


def _without(key: str) -> dict:
    return {"system_prompt": "s", "turns": [{k: v for k, v in GOOD_TURN.items() if k != key}]}


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({"system_prompt": "s"}, "missing field 'turns'"),
    ({"system_prompt": 3, "turns": [GOOD_TURN]}, "system_prompt must be a string or null"),
    ({"turns": []}, "turns must be a non-empty list"),
    ({"turns": ["x"]}, r"turns\[0\] must be an object"),
    (_without("input_delta"), r"turns\[0\]: missing field 'input_delta'"),
    (_without("assistant_text"), r"turns\[0\]: missing field 'assistant_text'"),
    (_without("output_tokens"), r"turns\[0\]: missing field 'output_tokens'"),
    (_turn(input_delta="hi"), r"input_delta must be a list of messages"),
    (_turn(input_delta=["hi"]), r"input_delta\[0\] must be an object"),
    (_turn(input_delta=[{"content": "x"}]), r"input_delta\[0\].role must be a non-empty string"),
    (_turn(input_delta=[{"role": "user", "content": None}]), r"input_delta\[0\].content must be a string"),
    (_turn(assistant_text=5), r"assistant_text must be a string"),
    (_turn(output_tokens=-1), r"output_tokens must be an int >= 0"),
    (_turn(output_tokens=True), r"output_tokens must be an int >= 0"),
    (_turn(input_tokens="9"), r"input_tokens must be an int >= 0"),
    (_turn(cached_tokens=1.5), r"cached_tokens must be an int >= 0"),
    (_turn(pre_gap_ms=-3), r"pre_gap_ms must be a number of ms >= 0"),
    (_turn(pre_gap_ms="1"), r"pre_gap_ms must be a number of ms >= 0"),
    ({"system_prompt": "", "turns": [{**GOOD_TURN, "input_delta": []}]}, "first turn has no messages"),
    ({**GOOD, "session_id": ""}, "session_id must be a non-empty string"),
    ({**GOOD, "session_id": "dup"}, "duplicate session id 'dup'"),
    ({"messages": []}, "missing field 'turns'"),  # the first line decided the format
])
def test_bad_abench_lines_name_file_and_line(tmp_path: Path, line: object, message: str) -> None:
    first = {**GOOD, "session_id": "dup"}
    path = _write(tmp_path, first, "", line)  # a blank line 2 is skipped: the bad one is line 3
    with pytest.raises(TraceError, match=rf"^bad\.jsonl:3: .*{message}") as err:
        load_sessions(spec(path))
    assert err.value.line == 3 and err.value.path == path


@pytest.mark.parametrize(("line", "message"), [
    ({"id": "c"}, "missing field 'messages'"),
    ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
    ({"messages": [{"role": "assistant", "content": "a"}]}, "start with an assistant message"),
    ({"messages": [{"role": "user", "content": 1}, {"role": "assistant", "content": "a"}]},
     r"messages\[0\].content must be a string"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "id": [1]},
     "id must be a non-empty string or an int"),
])
def test_bad_chat_lines_name_file_and_line(tmp_path: Path, line: object, message: str) -> None:
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(TraceError, match=rf"^bad\.jsonl:2: .*{message}"):
        load_sessions(spec(_write(tmp_path, good, line)))


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"^none\.jsonl:0: no such trace file"):
        load_sessions(spec(tmp_path / "none.jsonl"))
    with pytest.raises(TraceError, match=r"^bad\.jsonl:0: file has no sessions"):
        load_sessions(spec(_write(tmp_path, "")))
    with pytest.raises(TraceError, match=r"^bad\.jsonl:1: missing field 'turns'"):  # explicit format wins
        load_sessions(spec(CHAT.parent / "chat_small.jsonl", format="abench").model_copy(
            update={"path": _write(tmp_path, json.loads(CHAT.read_text().splitlines()[0]))}))
    with pytest.raises(TraceError, match=r"^bad\.jsonl:1: cannot tell the format"):
        load_sessions(spec(_write(tmp_path, {"prompt": "x"})))
    broken = tmp_path / "broken.jsonl.zst"
    broken.write_bytes(zstandard.ZstdCompressor().compress(ABENCH.read_bytes())[:40])
    with pytest.raises(TraceError, match=r"^broken\.jsonl\.zst:0: zstd: the file ends inside a frame"):
        load_sessions(spec(broken))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError, match=r"^latin\.jsonl:2: not UTF-8 text"):
        load_sessions(spec(latin))


def test_trace_error_survives_pickling() -> None:
    err = TraceError(Path("/x/trace.jsonl"), 17, "hash_ids must be a list of ints")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is TraceError and str(back) == "trace.jsonl:17: hash_ids must be a list of ints"
    assert (back.path, back.line, back.problem) == (err.path, 17, err.problem)


# --- load generator: history in trace vs live mode ---------------------------------------

def _replay(virtual, fake_backend, sessions, *, keep_prompts: bool = True):
    holder = {}

    async def main(clock):
        holder["backend"] = backend = fake_backend(clock)
        return await LoadGenerator(backend, ClosedLoop(2), lambda blocks: "", clock=clock,
                                   keep_prompts=keep_prompts).run(sessions, window_s=100.0, timeout_s=10.0)
    return virtual(main), holder["backend"]


def test_trace_mode_history_holds_recorded_answers(virtual, fake_backend) -> None:
    sessions = load_sessions(spec(max_sessions=1))
    result, backend = _replay(virtual, fake_backend, sessions)
    reqs = [req for req, _ in backend.sent]
    assert [r.request_id for r in reqs] == ["deepswe-1:0", "deepswe-1:1", "deepswe-1:2"]
    third = reqs[2].messages
    assert [m.role for m in third] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert third[2].content == "Let me read utils.py first."  # recorded, not the fake's " a0 a0 ..."
    assert third[4].content == "The bug is the minus sign; I will replace it with a plus."
    assert all(r.max_tokens == t.output_tokens for r, t in zip(reqs, sessions[0].turns))
    assert [r.recorded_prompt_tokens for r in result.records] == [40, 75, 110]
    # Gaps are think time: turn 1 is scheduled 1.5 s after turn 0 ended.
    rec = result.records
    assert rec[1].scheduled_ns - rec[0].end_ns == 1.5 * S and rec[2].scheduled_ns - rec[1].end_ns == 0.2505 * S
    # keep_prompts keeps the transcripts; each is the one sent, and a prefix of the next.
    assert result.prompt("deepswe-1:2") == chat_transcript(third) == reqs[2].prompt
    assert result.prompt("deepswe-1:1") == reqs[1].prompt and reqs[2].prompt.startswith(reqs[1].prompt)


def test_live_mode_history_holds_server_answers(virtual, fake_backend) -> None:
    sessions = load_sessions(spec(mode="live"))
    result, backend = _replay(virtual, fake_backend, sessions)
    assert all(r.status == "ok" for r in result.records) and len(result.records) == 5
    third = next(req for req, _ in backend.sent if req.request_id == "deepswe-1:2").messages
    assert third[2] == Message("assistant", " a0" * 7) and third[4] == Message("assistant", " a1" * 14)
    assert result.prompt("lmcache-7:1").endswith("assistant\n" + " a0" * 6 + "\n\nuser\nAnd what would you tune?\n\n")


# --- chat client, records, metrics ---------------------------------------------------------

def _chat_request(max_tokens: int = 4) -> Request:
    messages = (Message("system", "be brief"), Message("user", "two words please"))
    return Request(request_id="s:0", session_id="s", turn=0, prompt=chat_transcript(messages), max_tokens=max_tokens,
                   scheduled_ns=time.monotonic_ns(), timeout_s=5.0, cut_ns=None, planned_prompt_tokens=9,
                   messages=messages, recorded_prompt_tokens=12)


@pytest.mark.parametrize("continuous", [True, False])
def test_chat_request_streams_delta_content(sse_server, continuous: bool) -> None:
    sse_server.behaviour.tokens_per_chunk = 2

    async def main():
        async with StreamingClient(sse_server.base_url, "ok", max_connections=1, continuous_usage=continuous) as c:
            return await c.send(_chat_request(5))
    record, answer = asyncio.run(main())
    assert record.status == "ok" and answer == " ans" * 5
    assert record.completion_tokens == 5 and len(record.token_ns) == (5 if continuous else 3)
    assert record.prompt_tokens == 2 + 3 + 3 + 3 and record.recorded_prompt_tokens == 12
    body = sse_server.behaviour.seen[0]
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two words please"}]
    assert "prompt" not in body and body["min_tokens"] == body["max_tokens"] == 5 and body["ignore_eos"] is True
    assert body["temperature"] == 0 and body["stream"] is True and body["stream_options"]["include_usage"] is True


def _record(**kw) -> RequestRecord:
    base = dict(request_id="s:0", session_id="s", turn=0, scheduled_ns=0, sent_ns=1, first_token_ns=2, token_ns=(2,),
                end_ns=3, prompt_tokens=110, completion_tokens=1, cached_tokens=None, client_prompt_tokens=100,
                tokenize_ns=0, status="ok")
    return RequestRecord(**{**base, **kw})


def test_records_round_trip_recorded_prompt_tokens(tmp_path: Path) -> None:
    records = [_record(recorded_prompt_tokens=100), _record(request_id="s:1", recorded_prompt_tokens=None)]
    records_to_frame(records).to_parquet(tmp_path / "r.parquet")
    import pandas as pd
    assert frame_to_records(pd.read_parquet(tmp_path / "r.parquet")) == records
    old = records_to_frame(records).drop(columns=["recorded_prompt_tokens"])  # written before the field existed
    assert [r.recorded_prompt_tokens for r in frame_to_records(old)] == [None, None]


def test_prompt_tokens_vs_recorded_ratio() -> None:
    records = [_record(recorded_prompt_tokens=100), _record(prompt_tokens=90, recorded_prompt_tokens=100),
               _record(recorded_prompt_tokens=None), _record(status="error", recorded_prompt_tokens=1)]
    assert prompt_tokens_vs_recorded(records) == [1.1, 0.9]
    assert summarize(records)["prompt_tokens_vs_recorded_ratio_mean"] == pytest.approx(1.0)
    assert "prompt_tokens_vs_recorded_ratio_mean" not in summarize([_record()])


# --- model folders get a chat template ------------------------------------------------------

def test_chat_template_added_only_where_missing(tmp_path: Path) -> None:
    bare = tmp_path / "llama.json"
    bare.write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end_of_text|>"}))
    _ensure_chat_template(bare, LLAMA3)
    config = json.loads(bare.read_text())
    assert config["chat_template"] == LLAMA3.chat_template and "<|start_header_id|>" in config["chat_template"]
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["bos_token"] == "<|begin_of_text|>"
    missing = tmp_path / "new.json"
    _ensure_chat_template(missing, QWEN3)
    assert json.loads(missing.read_text()) == {"tokenizer_class": "PreTrainedTokenizerFast",
                                               "chat_template": CHATML_TEMPLATE}
    shipped = tmp_path / "qwen.json"
    shipped.write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer", "chat_template": "{{ real }}"}))
    _ensure_chat_template(shipped, QWEN3)
    assert json.loads(shipped.read_text())["chat_template"] == "{{ real }}"


# --- the runner: chat path end to end --------------------------------------------------------

def test_run_workload_recorded_against_the_sse_server(sse_server) -> None:
    run = run_workload_sync(spec(concurrency=2, gaps="drop", max_duration_s=30, request_timeout_s=5),
                            base_url=sse_server.base_url, model="ok",
                            tokenizer_path=str(bundled_tokenizer_path("qwen3")))
    assert [r.status for r in run.records].count("ok") == 5 and run.turns_unsent == 0
    assert all("messages" in b for b in sse_server.behaviour.seen)
    assert all(r.tokenize_ns > 0 and r.client_prompt_tokens > 0 for r in run.records)  # transcripts counted
    assert {r.request_id: r.recorded_prompt_tokens for r in run.records}["deepswe-1:2"] == 110
    assert not any("min_tokens" in w for w in run.warnings)
