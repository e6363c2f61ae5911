"""The bare cross-check client, run as ``python -m workloads.bare`` against the tiny SSE server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.bare import crosscheck_ratio, parse_cpus, percentile
from workloads.loaders import generate_agentic
from workloads.spec import AgenticWorkload, MooncakeWorkload, TokenRange
from workloads.text import bundled_tokenizer_path

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(__file__).resolve().parent / "data"

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
