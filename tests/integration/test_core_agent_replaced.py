"""A node's core agent that dies (OOM killer, ray.kill) is replaced, and the replacement keeps the books.

Against a real local Ray (no vLLM: the leases never start a replica). Before the fix the executor kept the
dead agent's handle for the node forever, so every later lease on the node failed in its allocation.
"""

from __future__ import annotations

import time

import pytest
import ray
from ray.exceptions import ActorDiedError

from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.plan.expand import replica_key
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
from orchestrator.values.trial import TrialSpec
from workloads.spec import AgenticWorkload

pytestmark = [pytest.mark.integration, pytest.mark.whole_node, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)  # a Ray of its own, never a `ray start` cluster of another test
    yield
    ray.shutdown()


def trial(repeat: int) -> TrialSpec:
    """One replica core, the client on it (``share``): two such trials pack onto a 2-core node."""
    return TrialSpec(sweep="agent", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=0,
                     cores=1, restriction="affinity", start="fresh", vllm=VllmVariant(name="v", args=()),
                     workload=AgenticWorkload(name="w", sessions=1, turns=1), api_servers=1,
                     server=ServerSpec(), client=ClientSpec(cores=1, isolation="share"), repeat=repeat)


def held(agent) -> dict[str, frozenset[int]]:
    """The agent's own books: allocator owner -> cores."""
    return ray.get(agent.__ray_call__.remote(lambda a: a.allocator.held()), timeout=60)


def kill_and_wait(agent) -> None:
    ray.kill(agent)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(agent.describe.remote(), timeout=10)
        except ActorDiedError:
            return
        time.sleep(0.2)
    raise AssertionError("the killed agent still answers")


def test_a_killed_core_agent_is_replaced_and_still_holds_the_cores_of_open_leases(local_ray, tmp_path) -> None:
    ex = RayTrialExecutor(tmp_path, policy="packed")
    a, b = trial(0), trial(1)
    leases = []
    try:
        leases.append(lease_a := ex.open_lease(a, replica_key(a), 1))
        grant_a = ex._allocate(a, lease_a)
        node = lease_a.facts["node_id"]
        first = ex._agent(node)
        assert held(first) == {f"{a.trial_id}/replica": frozenset(grant_a.replica)}

        kill_and_wait(first)  # as the OOM killer would: lease A's replica (and its cores) live on

        leases.append(lease_b := ex.open_lease(b, replica_key(b), 1))
        grant_b = ex._allocate(b, lease_b)  # the next lease on the node works
        new = ex._agent(node)
        assert new is not first and lease_a.agent is new and lease_b.agent is new
        # The replacement did not hand out A's core again: it holds it, under A's own owner.
        assert set(grant_b.replica).isdisjoint(grant_a.replica), (grant_a, grant_b)
        assert held(new) == {f"{a.trial_id}/replica": frozenset(grant_a.replica),
                             f"{b.trial_id}/replica": frozenset(grant_b.replica)}

        lease_a.close(None)  # A releases on the replacement, which knows its cores
        assert held(new) == {f"{b.trial_id}/replica": frozenset(grant_b.replica)}
        ex._allocate(b, lease_b)  # a re-pin: B gives its core back first, then takes one again
        assert list(held(new)) == [f"{b.trial_id}/replica"]
        lease_b.close(None)
        assert held(new) == {} and ex._agent(node) is new  # a live agent is kept
    finally:
        for lease in leases:
            lease.close(None)
        ex.close()
