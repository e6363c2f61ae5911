"""Two repin groups in a row on one node, through the real executor: the second group's re-pin must work.

The node's core agent is an actor that is not detached, so it lives only as long as the handle that
created it; a handle Ray gives back by name (``get_if_exists``) is weak. With each lease keeping the
handle it was given, the first lease on the node held the creating one: closing the first repin group
(after the second group's lease was made) ended the agent, and the second group's 1-core trial failed
in 0 s as ``node_died: ... all references to the actor were removed``.

It is also the test of the live re-pin itself: no other vLLM starts for a re-pinned trial, its
prefix cache is reset, and it is re-pinned in seconds.
"""

from __future__ import annotations

import psutil
import pytest
from itest import agentic, sweep

from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.node.cores import parse_cpulist
from orchestrator.plan.expand import chains, expand

pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(1200)]


def _plan():
    return expand(sweep("it-repin-groups", workloads=[agentic("wa"), agentic("wb")], cores=[2, 1], start="repin",
                        protocol={"share_start": True}))


def _vllm_pids() -> set[int]:
    """vLLM's API servers started by this test process (through its Ray), never anyone else's."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "vllm" in cmd and " serve " in f" {cmd} " and "select.select" not in cmd:  # not the lifeline's watchdog
            out.add(p.pid)
    return out


def test_second_repin_group_re_pins_its_own_replica(vllm_left, local_ray, tmp_path):
    plan = _plan()
    assert [(t.workload.name, t.cores) for t in plan.trials] == [("wa", 2), ("wa", 1), ("wb", 2), ("wb", 1)]
    assert [len(c) for c in chains(plan.trials)] == [2, 2]  # one repin group (one replica) per workload
    ex = RayTrialExecutor(tmp_path, plan=plan)
    results, servers = [], []
    try:
        for t in plan.trials:  # one lane, as the controller runs a node of this size
            results.append(ex.execute(t))
            servers.append(_vllm_pids())
    finally:
        ex.close()
    for t, r in zip(plan.trials, results):
        assert r.ok, f"{t.workload.name} at {t.cores} core(s): {r.error_kind.value}: {r.message}"
    assert [r.params["repinned"] for r in results] == ["False", "True", "False", "True"]
    assert [len(parse_cpulist(r.params["replica_cpus"])) for r in results] == [2, 1, 2, 1]
    # a re-pin reuses its group's replica (no other vLLM starts); each group has its own
    assert servers[0] == servers[1] and servers[2] == servers[3] and len(servers[0]) == 1 and servers[0] != servers[2]
    for r in results[1::2]:
        assert r.params["prefix_cache_reset"] == "True" and r.metrics["repin_s"] < 5
    for t, r in zip(plan.trials, results):
        assert r.metrics["requests"] > 0 and r.metrics["timeouts"] == 0
        assert (tmp_path / "trials" / t.trial_id / "attempt-1" / "vllm.log").stat().st_size > 0
    assert vllm_left() == []
