"""The workload actor: replays one workload from cores disjoint from the replica's, verified on every thread
(the product's client, the bare client, and vLLM's own ``vllm bench serve``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import ray
from pydantic import TypeAdapter

from orchestrator.node.replica_actor import pin_process
from orchestrator.node.restrict import Verification, verify_self
from orchestrator.values.wire import BareRun, NodeError
from workloads import benchserve, run_workload_sync
from workloads.run_workload import load_sync, prepare, strategy_for, tokenize_after
from workloads.spec import WorkloadSpec


def localize(workload_json: str, trace: tuple[str, Any] | None) -> str:
    """The workload with its trace ``path`` pointing at a node-local copy of the driver's file.

    ``trace`` is ``(content hash, bytes)`` (Ray resolves the driver's ObjectRef before the call), or
    ``(hash, ObjectRef)`` nested in a tuple, fetched here. The copy lives under the node's temp folder,
    named by the hash, so every trial on the node shares one copy and a changed file is a new one."""
    if trace is None:
        return workload_json
    digest, data = trace
    if isinstance(data, ray.ObjectRef):
        data = ray.get(data)
    spec = json.loads(workload_json)
    name = Path(spec["path"]).name
    local = Path(tempfile.gettempdir()) / "orchestrator-traces" / f"{digest}-{name}"
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_suffix(local.suffix + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, local)
    spec["path"] = str(local)
    return json.dumps(spec)


@ray.remote(num_cpus=0)
class WorkloadActor:
    """Replays one workload from cores disjoint from the replica's (verified on every thread)."""

    def __init__(self) -> None:
        self.cpus: frozenset[int] = frozenset()
        self._prepared: Any = None  # workloads.run_workload.Prepared, built before the window
        self._prepared_for: tuple[str, str] | None = None  # the (workload, tokenizer) it was built for
        self._loaded: Any = None  # workloads.run_workload.Loaded, the window's load phase

    def pin(self, cpus: list[int]) -> Verification:
        pin_process(cpus)
        self.cpus = frozenset(cpus)
        return self.verify()

    def verify(self) -> Verification:
        """Every thread of this process, against the client's cores (at the window's start and end)."""
        return verify_self(self.cpus)

    def bare(self, workload_json: str, base_url: str, model: str, tokenizer_path: str,
             timeout_s: float, trace: tuple[str, Any] | None = None) -> BareRun | NodeError:
        """Replay the workload with the bare client (workloads.bare) in a plain child process on this
        actor's cores: no actor and no telemetry in the request path. Returns its per-request rows."""
        workload_json = localize(workload_json, trace)
        with tempfile.TemporaryDirectory(prefix="bare-") as tmp:
            spec_path, out_path = Path(tmp) / "workload.json", Path(tmp) / "bare.jsonl"
            spec_path.write_text(workload_json)
            cmd = [sys.executable, "-m", "workloads.bare", "--base-url", base_url, "--model", model,
                   "--tokenizer", tokenizer_path, "--workload-json", str(spec_path), "--out", str(out_path),
                   "--cpus", ",".join(str(c) for c in sorted(self.cpus))]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if proc.returncode != 0:
                return NodeError("internal", f"bare client exited with {proc.returncode}: {proc.stderr.strip()[-800:]}")
            rows = [json.loads(line) for line in out_path.read_text().splitlines() if line.strip()]
        return BareRun([r for r in rows if "request_id" in r])

    def run(self, workload_json: str, base_url: str, model: str, tokenizer_path: str,
            trace: tuple[str, Any] | None = None) -> Any:
        """Prepare, load and tokenize in one call (the unmeasured warm-up)."""
        spec = _workload_spec(localize(workload_json, trace))
        return run_workload_sync(spec, base_url=base_url, model=model, tokenizer_path=tokenizer_path)

    def prepare(self, workload_json: str, tokenizer_path: str, trace: tuple[str, Any] | None = None) -> int:
        """Build the window's text and sessions now, before its span opens; returns the session count.

        The same workload as the last window's (the next window of this lease: a re-pin, a repeat) reuses what
        was built: the text is rendered from seeds in the spec, and a load reads the sessions without changing
        them, so it is the same text. Only the tokenizer's word cache is cleared, so every window starts as a
        freshly built one did. (Building took 1.25 s per window on the H200's recorded agent sessions, 6% of
        a re-pinned grid's GPU-held time.)"""
        key = (localize(workload_json, trace), tokenizer_path)
        if self._prepared is None or self._prepared_for != key:
            self._prepared, self._prepared_for = prepare(_workload_spec(key[0]), tokenizer_path), key
        else:
            clear = getattr(self._prepared.factory.tokenizer.model, "_clear_cache", None)
            if clear is not None:
                clear()
        self._loaded = None
        return len(self._prepared.sessions)

    def load(self, base_url: str, model: str) -> Any:
        """The window's requests and nothing else (``prepare`` first); ``finish`` adds the client counts."""
        assert self._prepared is not None, "prepare() first"
        self._loaded = load_sync(self._prepared, base_url=base_url, model=model)
        return self._loaded.run

    def bench(self, base_url: str, model: str, model_dir: str, timeout_s: float) -> BareRun | NodeError:
        """Replay the prompts the last window sent with vLLM's own ``vllm bench serve`` (``workloads.benchserve``),
        turn-major at the window's concurrency, from a child process on this actor's cores; after ``load``."""
        if self._prepared is None or self._loaded is None:
            return NodeError("internal", "vllm bench serve replays a window's prompts: run the window first")
        spec, result = self._prepared.spec, self._loaded.result
        if spec.client_tokenize != "after":
            return NodeError("internal", "vllm bench serve needs the window's prompts, kept only with "
                                         "client_tokenize: after")
        try:
            items = benchserve.window_items(self._prepared.sessions, [r.request_id for r in result.records],
                                            result.prompt)
        except benchserve.BenchServeError as exc:
            return NodeError("internal", f"vllm bench serve: {exc}")
        with tempfile.TemporaryDirectory(prefix="benchserve-") as tmp:
            out = benchserve.run_bench_serve(base_url, model, model_dir, items, strategy_for(spec).slots, tmp,
                                             cpus=sorted(self.cpus), timeout_s=timeout_s)
        if isinstance(out, benchserve.BenchServeFailure):
            return NodeError("internal", f"vllm bench serve ({out.kind}): {out.message}"[-1200:])
        return BareRun([dict(r) for r in out.rows], client="vllm-bench")

    def finish(self) -> Any:
        """The window's run with ``client_tokenize: after`` applied, outside the measured span."""
        assert self._prepared is not None and self._loaded is not None, "load() first"
        return tokenize_after(self._prepared, self._loaded)


def _workload_spec(workload_json: str) -> Any:
    return TypeAdapter(WorkloadSpec).validate_json(workload_json)


__all__ = ["WorkloadActor", "localize"]
