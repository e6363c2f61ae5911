"""StreamingClient and run_workload against a tiny in-test SSE server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import pickle
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workloads.client import StreamingClient, _BodyEncoder
from workloads.protocols import Request
from workloads.run_workload import run_workload, run_workload_sync
from workloads.spec import AgenticWorkload, MooncakeWorkload, TokenRange
from workloads.text import TextFactory, bundled_tokenizer_path, token_counter
from workloads.trace import Message

DATA_MOONCAKE = Path(__file__).resolve().parent / "data" / "mooncake_small.jsonl"


def request(prompt: str = " one two three", max_tokens: int = 5, *, timeout_s: float = 5.0,
            cut_ns: int | None = None) -> Request:
    now = time.monotonic_ns()
    return Request(request_id="s:0", session_id="s", turn=0, prompt=prompt, max_tokens=max_tokens,
                   scheduled_ns=now, timeout_s=timeout_s, cut_ns=cut_ns, planned_prompt_tokens=42)


def send(base_url: str, model: str, req: Request, **client_kw):
    async def main():
        async with StreamingClient(base_url, model, max_connections=4, **client_kw) as client:
            return await client.send(req)
    return asyncio.run(main())


def test_ok_stream_record(sse_server) -> None:
    sse_server.behaviour.itl_s = 0.002
    record, answer = send(sse_server.base_url, "ok", request(max_tokens=5))
    assert record.status == "ok" and record.error is None
    assert answer == " tok" * 5
    assert record.completion_tokens == 5 and len(record.token_ns) == 5
    assert record.prompt_tokens == 3  # from server usage
    assert record.client_prompt_tokens == 42 and record.tokenize_ns == 0  # plan; no client tokenizer
    assert record.cached_tokens == 3
    assert record.scheduled_ns <= record.sent_ns < record.first_token_ns <= record.end_ns
    assert list(record.token_ns) == sorted(record.token_ns)
    body = sse_server.behaviour.seen[0]
    assert body["min_tokens"] == body["max_tokens"] == 5 and body["ignore_eos"] is True
    assert body["stream"] is True and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_multi_token_chunks_stamp_every_token_with_chunk_arrival(sse_server) -> None:
    sse_server.behaviour.tokens_per_chunk = 3
    sse_server.behaviour.itl_s = 0.01
    record, _ = send(sse_server.base_url, "ok", request(max_tokens=7))
    assert record.completion_tokens == 7 and len(record.token_ns) == 7
    t = record.token_ns
    assert t[0] == t[1] == t[2] and t[3] == t[4] == t[5] and t[6] > t[5] > t[2]


def test_without_continuous_usage_counts_one_token_per_text_chunk(sse_server) -> None:
    sse_server.behaviour.tokens_per_chunk = 2
    record, _ = send(sse_server.base_url, "ok", request(max_tokens=6), continuous_usage=False)
    assert len(record.token_ns) == 3  # 3 chunks: the documented approximation
    assert record.completion_tokens == 6  # the final usage chunk still has the true count
    assert "continuous_usage_stats" not in sse_server.behaviour.seen[0]["stream_options"]


def test_cached_tokens_absent_is_none(sse_server) -> None:
    sse_server.behaviour.cached_tokens = None
    record, _ = send(sse_server.base_url, "ok", request())
    assert record.status == "ok" and record.cached_tokens is None


def test_client_side_tokenization(sse_server, qwen3_factory: TextFactory) -> None:
    prompt = qwen3_factory.block(5, 300)
    with ThreadPoolExecutor(1) as pool:
        record, _ = send(sse_server.base_url, "ok", request(prompt), count_tokens=token_counter(qwen3_factory.tokenizer), executor=pool)
    assert record.client_prompt_tokens == 300 and record.tokenize_ns > 0


def test_stalled_server_times_out_without_hanging(sse_server) -> None:
    # The server stalls for an hour: a record at all means the request's own deadline ended the wait
    # (a hang fails at the 60 s test timeout), and "timeout" with the deadline in its text means it was
    # that deadline, not another error. Not before it: the record spans at least the 0.3 s.
    record, answer = send(sse_server.base_url, "stall", request(timeout_s=0.3))
    assert record.status == "timeout" and record.error == "no complete answer within 0.300 s"
    assert answer == "" and record.first_token_ns is None and record.token_ns == ()
    assert record.end_ns - record.sent_ns >= 0.3e9 - 1e6  # the loop may fire a timer within its clock resolution


def test_cut_before_deadline_gives_cut(sse_server) -> None:
    req = request(timeout_s=10.0, cut_ns=time.monotonic_ns() + 200_000_000)
    record, _ = send(sse_server.base_url, "stall", req)
    assert record.status == "cut"


def test_refused_connection_is_an_error_record(refused_url) -> None:
    record, answer = send(refused_url, "ok", request())
    assert record.status == "error" and "Connect" in record.error and answer == ""
    assert record.prompt_tokens == 42 and record.completion_tokens == 0


@pytest.mark.parametrize(("mode", "message"), [
    ("http500", "HTTP 500: "), ("error_event", "out of KV cache"), ("garbage", "malformed SSE data"),
    ("no_done", "without [DONE]"),
])
def test_server_failures_are_error_records(sse_server, mode: str, message: str) -> None:
    record, _ = send(sse_server.base_url, mode, request())
    assert record.status == "error" and message in record.error


def test_send_requires_context_manager() -> None:
    client = StreamingClient("http://127.0.0.1:1", "m", max_connections=1)
    with pytest.raises(RuntimeError, match="async with"):
        asyncio.run(client.send(request()))


def _agentic(**kw) -> AgenticWorkload:
    base = dict(name="ag", sessions=4, concurrency=2, turns=3, system_prompt_tokens=200,
                task_tokens=TokenRange(min=10, max=20), tool_output_tokens=TokenRange(min=50, max=100),
                output_tokens=TokenRange(min=4, max=8), max_duration_s=30, request_timeout_s=5)
    base.update(kw)
    return AgenticWorkload(**base)


def test_run_workload_agentic_end_to_end(sse_server, qwen3_factory: TextFactory) -> None:
    tok = str(bundled_tokenizer_path("qwen3"))
    run = asyncio.run(run_workload(_agentic(), base_url=sse_server.base_url, model="ok", tokenizer_path=tok))
    assert len(run.records) == 12 and all(r.status == "ok" for r in run.records)
    assert run.sessions_started == 4 and run.turns_unsent == 0
    assert run.client_cpu_s > 0 and run.wall_s > 0 and run.client_cores >= 1
    assert all(r.tokenize_ns > 0 for r in run.records)  # client_tokenize="after", the default
    prompts = {b["prompt"] for b in sse_server.behaviour.seen}
    counted = {r.client_prompt_tokens for r in run.records}
    assert counted == {len(qwen3_factory.tokenizer.encode(p).ids) for p in prompts}  # the exact prompts sent
    # Turn 2's prompt holds turn 1's real answer (" tok" x n): client count > plan of our blocks.
    prompts = [b["prompt"] for b in sse_server.behaviour.seen]
    assert any(" tok tok" in p for p in prompts)
    assert not any("min_tokens" in w for w in run.warnings)
    assert all(r.completion_tokens == len(r.token_ns) for r in run.records)
    assert pickle.loads(pickle.dumps(run)) == run  # it crosses a Ray actor boundary


def test_run_workload_sync_mooncake_and_warnings(sse_server) -> None:
    sse_server.behaviour.cached_tokens = None
    spec = MooncakeWorkload(name="m", path=DATA_MOONCAKE, time_scale=0.01, max_duration_s=30, client_tokenize="off")
    run = run_workload_sync(spec, base_url=sse_server.base_url, model="ok",
                            tokenizer_path=str(bundled_tokenizer_path("qwen3")))
    assert [r.status for r in run.records] == ["ok"] * 4
    assert [r.client_prompt_tokens for r in run.records] == [1100, 600, 512, 1030]  # plan, not measured
    assert all(r.tokenize_ns == 0 for r in run.records)
    assert any("--enable-prompt-tokens-details" in w for w in run.warnings)


def test_run_workload_inflight_tokenization(sse_server) -> None:
    run = run_workload_sync(_agentic(sessions=2, client_tokenize="inflight"), base_url=sse_server.base_url,
                            model="ok", tokenizer_path=str(bundled_tokenizer_path("qwen3")))
    assert len(run.records) == 6 and all(r.status == "ok" and r.tokenize_ns > 0 for r in run.records)
    # The first prompt is the 200-token system prefix plus a 10-20 token task, counted exactly.
    first = [r for r in run.records if r.turn == 0]
    assert all(210 <= r.client_prompt_tokens <= 220 for r in first)


def test_run_workload_against_dead_server_returns_error_records(refused_url) -> None:
    run = run_workload_sync(_agentic(), base_url=refused_url, model="ok",
                            tokenizer_path=str(bundled_tokenizer_path("qwen3")))
    assert len(run.records) == 4 and all(r.status == "error" for r in run.records)  # first turns only
    assert run.turns_unsent == 8
    assert any("4 of 4 requests ended with status error" in w for w in run.warnings)


# --- request bodies: encoded incrementally, byte for byte what json.dumps gives ---------------

def _dumps_body(model: str, req: Request) -> bytes:
    """The body as the client built it before incremental encoding: one json.dumps of it all."""
    head: dict = {"model": model}
    if req.messages is None:
        head["prompt"] = req.prompt
    else:
        head["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
    return json.dumps({**head, "max_tokens": req.max_tokens, "min_tokens": req.max_tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True, "continuous_usage_stats": True}}).encode()


def _req(session: str, prompt: str, messages: tuple[Message, ...] | None = None, max_tokens: int = 48) -> Request:
    return Request(request_id=f"{session}:0", session_id=session, turn=0, prompt=prompt, max_tokens=max_tokens,
                   scheduled_ns=0, timeout_s=1.0, cut_ns=None, planned_prompt_tokens=1, messages=messages)


def test_bodies_match_json_dumps_as_prompts_grow_and_diverge() -> None:
    # Characters JSON escapes (quotes, backslashes, controls, non-ASCII, astral, a lone surrogate)
    # at random split points; sessions that grow, restart, interleave and outnumber the cache.
    alphabet = 'ab "\\\n\t\x00é\u2028😀\ud800/'
    rng = random.Random(7)
    encoder = _BodyEncoder('model "x"', continuous_usage=True, sessions=3)
    prompts: dict[str, str] = {}
    chats: dict[str, tuple[Message, ...]] = {}
    for _ in range(300):
        sid = f"s{rng.randrange(5)}"
        grow = rng.random() < 0.85
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        prompts[sid] = prompts.get(sid, "") + text if grow else text
        new = tuple(Message(rng.choice(("user", "assistant", "tool")), text) for _ in range(rng.randrange(0, 3)))
        chats[sid] = chats.get(sid, ()) + new if grow else new
        for req in (_req(sid, prompts[sid], max_tokens=rng.choice((1, 48))), _req(sid + "c", "", chats[sid])):
            assert encoder.encode(req) == _dumps_body('model "x"', req)


def test_body_cache_is_bounded() -> None:
    encoder = _BodyEncoder("m", continuous_usage=True, sessions=2)
    for i in range(10):
        encoder.encode(_req(f"s{i}", "x" * 100))
    assert len(encoder._cache) == 2 and encoder._bytes == 200


def test_continuous_usage_off_leaves_it_out_of_the_body() -> None:
    body = json.loads(_BodyEncoder("m", continuous_usage=False, sessions=1).encode(_req("s", "p")))
    assert body["stream_options"] == {"include_usage": True} and body["prompt"] == "p"


# --- connections opened on entry ----------------------------------------------------------------

async def _counting_server() -> tuple[asyncio.Server, list[bytes]]:
    """A raw HTTP/1.1 server that answers every request 404 (kept alive) and notes each
    connection's first request line."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append((await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0])
            while True:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


def test_entering_opens_the_pool_before_the_first_request() -> None:
    async def main():
        server, seen = await _counting_server()
        async with server:
            port = server.sockets[0].getsockname()[1]
            async with StreamingClient(f"http://127.0.0.1:{port}", "m", max_connections=3):
                opened = list(seen)
            async with StreamingClient(f"http://127.0.0.1:{port}", "m", max_connections=3, warm=False):
                cold = len(seen) - len(opened)
        return opened, cold

    opened, cold = asyncio.run(main())
    assert opened == [b"GET /v1/models HTTP/1.1"] * 3 and cold == 0


def test_entering_a_refused_server_does_not_raise(refused_url) -> None:
    async def main():
        async with StreamingClient(refused_url, "m", max_connections=2) as client:
            return await client.send(request())

    record, _ = asyncio.run(main())
    assert record.status == "error"  # the failure is the request's record, not the entry's


def test_tokenize_after_measures_an_even_sample_and_leaves_the_rest_planned() -> None:
    from types import SimpleNamespace

    from workloads.records import RequestRecord
    from workloads.run_workload import _tokenize_after

    records = tuple(RequestRecord(request_id=f"r{i}", session_id="s", turn=i, scheduled_ns=0, sent_ns=0,
                                  first_token_ns=1, token_ns=(1,), end_ns=2, prompt_tokens=7, completion_tokens=1,
                                  cached_tokens=None, client_prompt_tokens=7, tokenize_ns=0, status="ok")
                    for i in range(100))
    result = SimpleNamespace(records=records, prompt=lambda rid: "x" * int(rid[1:]))
    out = _tokenize_after(result, len, 32)
    measured = [i for i, r in enumerate(out) if r.tokenize_ns > 0]
    assert measured == list(range(0, 100, 4))  # every 4th: 25 prompts, at most 32, spread over the window
    assert all(out[i].client_prompt_tokens == i for i in measured)  # the count of the prompt sent
    assert all(r.client_prompt_tokens == 7 and r.tokenize_ns == 0 for i, r in enumerate(out) if i not in measured)
    assert all(r.tokenize_ns > 0 for r in _tokenize_after(result, len, 100))  # a small window: every prompt
