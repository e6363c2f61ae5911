"""The per-node core agent: the only owner of a node's core bookkeeping (one per node and executor).

Ray's CPU resources are bookkeeping only: this actor hands out disjoint core sets on its node (the replica's
and the client's), and the replica and workload actors enforce them (``replica_actor``, ``workload_actor``).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.node.cores import CannotFit, CoreAllocator, Isolation, NodeTopology
from orchestrator.node.hostfacts import host_facts
from orchestrator.values.wire import CoreGrant, NodeError


@ray.remote(num_cpus=0)
class NodeCoreAgent:
    """One per node and executor (:func:`core_agent`): the only owner of that node's core bookkeeping."""

    def __init__(self) -> None:
        self.topology = NodeTopology.detect()
        self.allocator = CoreAllocator(self.topology)

    def describe(self) -> dict[str, Any]:
        return {"cpus": list(self.topology.cpus), "cpu_model": self.topology.cpu_model,
                "numa": {str(k): list(v) for k, v in self.topology.numa.items()},
                "gpu_numa": {str(k): v for k, v in self.topology.gpu_numa.items()}}

    def allocate(self, trial_id: str, replica_cores: int, client_cores: int, isolation: Isolation,
                 gpu_ids: list[int]) -> CoreGrant | NodeError:
        numa = {self.topology.gpu_numa[g] for g in gpu_ids if g in self.topology.gpu_numa}
        prefer = numa.pop() if len(numa) == 1 else None
        try:
            a = self.allocator.allocate_trial(trial_id, replica_cores, client_cores, isolation, prefer)
        except CannotFit as exc:
            return NodeError("cannot_fit", str(exc))
        return CoreGrant(replica=sorted(a.replica), client=sorted(a.client), client_isolated=a.client_isolated,
                         host=dict(host_facts(a.replica, a.client, gpu_ids, self.topology)))

    def release(self, trial_id: str) -> None:
        self.allocator.release(trial_id)

    def hold(self, held: dict[str, frozenset[int]]) -> None:
        """Hold ``held`` (allocator owner -> cores) at once: a replacement agent takes over the cores its dead
        predecessor had granted to open leases, so none is handed out again. A core the node no longer has,
        or one held already, is skipped: the new agent never fails over the old one's books."""
        for owner, cpus in held.items():
            free = self.allocator.free
            if wanted := frozenset(cpus) & free:
                self.allocator.allocate(owner, len(wanted), avoid=free - wanted)


def core_agent(node_id: str) -> Any:
    """A new core agent on ``node_id``; it lives as long as the handle returned, so the caller keeps
    that handle for as long as it hands out cores on the node (the executor: one per node, until it closes).

    Unnamed on purpose: a handle Ray gives back by name is weak (it does not keep the actor alive), so
    an agent found by name could die under its user, and one named per node could clash with the
    previous executor's agent while that one is still going away."""
    return NodeCoreAgent.options(  # type: ignore[attr-defined]  # Ray's decorator
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote()


__all__ = ["NodeCoreAgent", "core_agent"]
