"""A CFS quota (``restriction: quota``) with one and two API servers, through the real executor and vLLM-CPU.

What a Kubernetes CPU limit sets: ``cpu.max`` on the server's cgroup, its affinity left as the whole node.
Each window records what the bandwidth control did, from the group's own ``cpu.stat`` (periods, throttled
periods and seconds), and each API-server count is a start of its own, counted by the role attribution.
Where this machine's cgroups cannot take a quota, the executor falls back to affinity and records why; the
test then skips, naming the fallback.
"""

from __future__ import annotations

import pytest
from itest import agentic, sweep

from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.node.restrict import choose_mode
from orchestrator.plan.expand import expand

pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(900)]


def test_quota_windows_record_throttling_per_api_server_count(vllm_left, local_ray, tmp_path):
    mode, why = choose_mode("quota")
    if mode != "quota":
        pytest.skip(f"no CFS quota on this machine's cgroups ({why})")
    plan = expand(sweep("it-quota", workloads=[agentic("w", sessions=4, concurrency=4)], cores=[1],
                        grid={"restriction": ["quota"], "api_servers": [1, 2]}))
    assert [t.api_servers for t in plan.trials] == [1, 2]
    ex = RayTrialExecutor(tmp_path, plan=plan)
    try:
        results = [ex.execute(t) for t in plan.trials]
    finally:
        ex.close()
    for t, r in zip(plan.trials, results):
        assert r.ok, f"{t.api_servers} API server(s): {r.error_kind.value}: {r.message}"
        assert r.params["restriction_mode"] == "quota"
        assert r.params["api_servers"] == str(t.api_servers)
        assert r.metrics["api_server_processes"] == t.api_servers
        m = r.metrics
        # the group ran in the window, and what CFS did is a share of those periods and non-negative seconds
        assert m["cgroup_periods"] > 0, m
        assert 0 <= m["cgroup_throttled_periods"] <= m["cgroup_periods"]
        assert m["cgroup_throttled_frac"] == pytest.approx(m["cgroup_throttled_periods"] / m["cgroup_periods"])
        assert m["cgroup_throttled_s"] >= 0
        assert m["requests"] > 0 and m["timeouts"] == 0
    assert vllm_left() == []
