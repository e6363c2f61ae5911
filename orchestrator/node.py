"""What runs on a node: the per-node core agent, the replica actor and the workload actor.

Ray's CPU resources are bookkeeping only; these actors enforce the restriction:
the core agent hands out disjoint core sets on its node, the replica actor
starts vLLM restricted to its set (and verifies every thread), and the workload
actor pins itself to the client's set, disjoint from the replica's.
Files produced on the node travel back as bytes, so the driver needs no shared disk.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import urllib.request
from pathlib import Path
from typing import Any

import ray

from orchestrator.cores import CannotFit, CoreAllocator, NodeTopology, verify_self
from orchestrator.models import build_shape
from orchestrator.plan import TrialSpec
from orchestrator.replica import ReplicaError, VllmReplica, free_port
from orchestrator.telemetry import TelemetrySampler, delta, scrape


@ray.remote(num_cpus=0)
class NodeCoreAgent:
    """One per node (named ``cores-<node_id>``): the only owner of that node's core bookkeeping."""

    def __init__(self) -> None:
        self.topology = NodeTopology.detect()
        self.allocator = CoreAllocator(self.topology)

    def describe(self) -> dict[str, Any]:
        return {"cpus": list(self.topology.cpus), "cpu_model": self.topology.cpu_model,
                "numa": {str(k): list(v) for k, v in self.topology.numa.items()},
                "gpu_numa": {str(k): v for k, v in self.topology.gpu_numa.items()}}

    def allocate(self, trial_id: str, replica_cores: int, client_cores: int, isolation: str,
                 gpu_ids: list[int]) -> dict[str, Any]:
        numa = {self.topology.gpu_numa[g] for g in gpu_ids if g in self.topology.gpu_numa}
        prefer = numa.pop() if len(numa) == 1 else None
        try:
            a = self.allocator.allocate_trial(trial_id, replica_cores, client_cores, isolation, prefer)
        except CannotFit as exc:
            return {"error": str(exc)}
        return {"replica": sorted(a.replica), "client": sorted(a.client), "client_isolated": a.client_isolated}

    def release(self, trial_id: str) -> None:
        self.allocator.release(trial_id)


def core_agent(node_id: str) -> Any:
    """The core agent of ``node_id``, created on that node the first time it is asked for."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeCoreAgent.options(
        name=f"cores-{node_id}", get_if_exists=True, lifetime=None,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote()


def _gpu_name() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no GPU: a CPU node
        return "none"


@ray.remote(num_cpus=0, max_concurrency=2)
class ReplicaActor:
    """Owns one vLLM replica on its node: start, verify, telemetry, stop. Never outlives the trial.

    Two calls may run at once so that ``stop()`` can interrupt a ``start()`` still waiting for
    health (a sweep stopped mid-start); the driver otherwise calls one method at a time.
    """

    def __init__(self, trial_json: str, workdir: str) -> None:
        self.trial = TrialSpec.model_validate_json(trial_json)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.replica: VllmReplica | None = None
        self.sampler: TelemetrySampler | None = None
        self.before: Any = None
        self.tokenizer_path = ""
        self._lock = threading.Lock()
        self._stopped = False

    def node_facts(self) -> dict[str, str]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
                "gpu_name": _gpu_name(), "platform": platform.platform(),
                "gpu_ids": ",".join(str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", []))}

    def model_dir(self) -> str:
        """Build (or reuse) the model folder on this node; shapes are cached per name."""
        m = self.trial.model
        if m.kind == "shape":
            return str(build_shape(m.shape, self.workdir.parent.parent / "models" / m.shape))
        return m.id

    def start(self, cores: list[int]) -> dict[str, Any]:
        """Start vLLM restricted to ``cores`` and wait until healthy; errors come back as data."""
        model_dir = self.model_dir()
        if self.trial.start == "repin":
            # A shared replica's prefix cache must be emptied between trials; vLLM only exposes
            # /reset_prefix_cache in dev mode.
            os.environ["VLLM_SERVER_DEV_MODE"] = "1"
        # Compile caches live beside the trials and are shared by them, so restarts are warm.
        replica = VllmReplica(self.trial, model_dir, frozenset(cores), free_port(), self.workdir,
                              self.trial.restriction, scratch_dir=self.workdir.parent.parent / "scratch")
        with self._lock:  # either stop() comes first and nothing starts, or it sees the process to kill
            if self._stopped:
                return {"error_kind": "internal", "message": "stopped before vLLM started"}
            self.replica = replica
            try:
                replica.start()
            except ReplicaError as exc:
                return {"error_kind": exc.kind.value, "message": str(exc)}
        try:
            replica.wait_healthy(self.trial.server.startup_timeout_s)
        except ReplicaError as exc:
            return {"error_kind": exc.kind.value, "message": str(exc)}
        self.tokenizer_path = str(Path(model_dir) / "tokenizer.json")
        return {"base_url": self.replica.base_url, "model_dir": model_dir, "tokenizer_path": self.tokenizer_path,
                "params": self.replica.params()}

    def repin(self, cores: list[int]) -> dict[str, Any]:
        """Move the live replica to ``cores`` and empty its prefix cache, so the next trial starts cold."""
        assert self.replica is not None
        try:
            seconds = self.replica.repin(frozenset(cores))
        except ReplicaError as exc:
            return {"error_kind": exc.kind.value, "message": str(exc)}
        req = urllib.request.Request(self.replica.base_url + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            reset = resp.status == 200
        return {"base_url": self.replica.base_url, "tokenizer_path": self.tokenizer_path, "repin_s": seconds,
                "params": {**self.replica.params(), "repinned": True, "prefix_cache_reset": reset}}

    def files(self) -> dict[str, bytes]:
        """The node-side files so far (the replica keeps running)."""
        return {f.name: f.read_bytes() for f in self.workdir.iterdir()
                if f.is_file() and f.stat().st_size < 64 << 20}

    def verify(self) -> dict[str, Any]:
        assert self.replica is not None
        return self.replica.verify().as_dict()

    def begin_window(self, client_cpus: list[int]) -> None:
        assert self.replica is not None
        self.before = scrape(self.replica.base_url)
        self.sampler = TelemetrySampler(replica_cpus=sorted(self.replica.cores), client_cpus=client_cpus,
                                        metrics_url=self.replica.base_url)
        self.sampler.start()

    def end_window(self) -> dict[str, Any]:
        assert self.replica is not None
        rows = self.sampler.stop() if self.sampler else []
        alive = self.replica.alive()
        try:
            after = scrape(self.replica.base_url) if alive else None
        except OSError:  # the server died or stopped answering: the trial fails as SERVER_DIED, not here
            after, alive = None, False
        server = delta(self.before, after) if self.before is not None and after is not None else {}
        return {"server": server, "rows": rows, "alive": alive}

    def stop(self) -> dict[str, bytes]:
        """Stop everything this actor started and return the node-side artifacts as bytes."""
        with self._lock:
            self._stopped = True
        if self.sampler is not None:
            self.sampler.stop()
        if self.replica is not None:
            self.replica.stop()
        return self.files()


@ray.remote(num_cpus=0)
class WorkloadActor:
    """Replays one workload from cores disjoint from the replica's (verified on every thread)."""

    def pin(self, cpus: list[int]) -> dict[str, Any]:
        os.sched_setaffinity(0, cpus)
        for tid in os.listdir("/proc/self/task"):  # Ray's threads exist already; pin each
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass
        return verify_self(frozenset(cpus)).as_dict()

    def run(self, workload_json: str, base_url: str, model: str, tokenizer_path: str) -> Any:
        from pydantic import TypeAdapter

        from workloads import run_workload_sync
        from workloads.spec import WorkloadSpec

        spec = TypeAdapter(WorkloadSpec).validate_json(workload_json)
        return run_workload_sync(spec, base_url=base_url, model=model, tokenizer_path=tokenizer_path)


__all__ = ["NodeCoreAgent", "ReplicaActor", "WorkloadActor", "core_agent"]
