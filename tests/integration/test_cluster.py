"""A sweep across a local multi-node Ray cluster, with real vLLM-CPU replicas.

``ray.cluster_utils.Cluster`` starts a head that runs nothing (``CPU: 0``) and worker raylets of
one core each, each its own Ray node with a hardware label (``ray.io/accelerator-type``) and its
own physical core (``ORCH_NODE_CPUS``), as separate machines would be. Checked: trials of two
hardware types run at the same time, each on a node of its type, on disjoint cores; a trial no
node can hold fails at once as CANNOT_FIT; a raylet killed mid-trial is a retryable NODE_DIED,
retried on the other node, and leaves no vLLM behind.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import ray
from itest import agentic, sweep
from ray.cluster_utils import Cluster

from orchestrator.control.controller import SweepController
from orchestrator.control.placement import ACCEL_LABEL
from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.infra.local_servers import ray_on_loopback
from orchestrator.node.cores import NODE_CPUS_ENV
from orchestrator.plan.expand import expand
from orchestrator.values.results import ErrorKind, TrialStatus

pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(1500)]
CPUS = sorted(os.sched_getaffinity(0))


def _spec(hardware: list[str], **extra):
    load = agentic(sessions=4, turns=20, think_time_s=0.2, request_timeout_s=60, max_duration_s=8)
    return sweep("cluster", workloads=[load], grid={"hardware": hardware}, server={"startup_timeout_s": 600}, **extra)


@pytest.fixture
def cluster():
    if len(CPUS) < 2:
        pytest.skip("needs 2 cores: one per simulated node")
    with ray_on_loopback():
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        yield c
        ray.shutdown()
        c.shutdown()


def _node(c: Cluster, kind: str, cpu: int):
    return c.add_node(num_cpus=1, labels={ACCEL_LABEL: kind}, env_vars={NODE_CPUS_ENV: str(cpu)})


def test_trials_of_two_hardware_types_run_at_once_each_on_its_own_node(vllm_left, cluster, tmp_path: Path):
    a, b = _node(cluster, "simA", CPUS[0]), _node(cluster, "simB", CPUS[1])
    ray.init(address=cluster.address, log_to_driver=False)
    # Every simA trial is listed before any simB trial: lanes taking the plan in order would have both wait for
    # the simA node while the simB node idled until the first simA trial ended.
    plan = expand(_spec(["simA", "simB", "simC"], repeats=2))
    assert [t.hardware for t in plan.trials] == ["simA", "simA", "simB", "simB", "simC", "simC"]
    ex = RayTrialExecutor(tmp_path, plan=plan)
    assert ex.capacity(list(plan.trials)) == 2  # exclusive: one trial per node that fits any of them
    controller = SweepController(plan, ex)
    t0 = time.monotonic()
    results = {r.trial_id: r for r in controller.run()}
    ex.close()
    assert controller.lanes_used == 3  # one a kind: simA's node, simB's node, and simC's (which fail at once)
    by_hw: dict[str, list] = {}
    for t in plan.trials:
        by_hw.setdefault(t.hardware, []).append(results[t.trial_id])

    for cannot in by_hw["simC"]:
        assert cannot.status is TrialStatus.FAILED and cannot.error_kind is ErrorKind.CANNOT_FIT
        assert "no node can ever hold" in cannot.message and "simA" in cannot.message
        assert cannot.ended_at - cannot.started_at < 5  # at once, not after a placement timeout

    for hw, node, cpu in (("simA", a, CPUS[0]), ("simB", b, CPUS[1])):
        for r in by_hw[hw]:
            assert r.ok, r.message
            assert r.params["node_id"] == node.node_id and r.params["replica_cpus"] == str(cpu)
            assert r.params["placement"] == "exclusive" and r.params["neighbours"] == ""
            assert r.metrics["requests"] > 0 and float(r.params["pg_ready_s"]) < 30
    # Both kinds busy at once while both had trials pending: the first trial of each overlapped the other's.
    (a0, a1), (b0, b1) = by_hw["simA"], by_hw["simB"]
    overlap = min(a0.ended_at, b0.ended_at) - max(a0.started_at, b0.started_at)
    assert overlap > 5, f"the first simA and simB trials overlapped {overlap:.1f} s only"  # each window alone is 8 s
    assert a1.started_at >= a0.ended_at - 1 and b1.started_at >= b0.ended_at - 1  # one trial a node at a time
    print(f"4 trials on 2 nodes in {time.monotonic() - t0:.0f} s, the first two overlapping {overlap:.0f} s")
    assert vllm_left() == []


def test_a_raylet_killed_mid_trial_is_retried_on_the_other_node(vllm_left, cluster, tmp_path: Path):
    nodes = {n.node_id: n for n in (_node(cluster, "simX", CPUS[0]), _node(cluster, "simX", CPUS[1]))}
    ray.init(address=cluster.address, log_to_driver=False)
    plan = expand(_spec(["simX"], max_failures=1))
    trial = plan.trials[0]
    ex = RayTrialExecutor(tmp_path, plan=plan)
    killed: list[str] = []

    def kill_the_trials_node() -> None:
        log = tmp_path / "node" / "trials" / trial.trial_id / "attempt-1" / "vllm.log"
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not killed:
            if log.exists() and b"INFO" in log.read_bytes():  # vLLM is starting on that node
                for node_id in ex.book.in_use():
                    killed.append(node_id)
                    cluster.remove_node(nodes[node_id], allow_graceful=False)  # SIGKILL to its raylet
                    return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_the_trials_node, daemon=True)
    killer.start()
    controller = SweepController(plan, ex)
    [result] = controller.run()
    ex.close()
    killer.join(timeout=5)
    assert killed, "the trial's vLLM was never seen starting"
    assert result.ok, result.message
    assert controller.trials[trial.trial_id].attempts == 2
    assert result.params["node_id"] != killed[0]  # the retry went to the node that was left
    first = tmp_path / "trials" / trial.trial_id / "attempt-1" / "error.txt"
    assert first.read_text().startswith("node_died"), first.read_text()
    deadline = time.monotonic() + 30  # the dead node's vLLM follows its actor (the lifeline)
    while vllm_left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_left() == []
