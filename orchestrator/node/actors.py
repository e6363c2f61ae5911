"""What runs on a node, by job: the per-node core agent (``core_agent``), the replica actor
(``replica_actor``) and the workload actor (``workload_actor``). Ray's CPU resources are bookkeeping only;
these actors enforce the restriction: the core agent hands out disjoint core sets on its node, the replica
actor starts vLLM restricted to its set (and verifies every thread), and the workload actor pins itself to
the client's set, disjoint from the replica's. The driver (``control.ray_executor``) imports them from here.
"""

from __future__ import annotations

from orchestrator.node.core_agent import NodeCoreAgent, core_agent
from orchestrator.node.replica_actor import ReplicaActor
from orchestrator.node.workload_actor import WorkloadActor

__all__ = ["NodeCoreAgent", "ReplicaActor", "WorkloadActor", "core_agent"]
