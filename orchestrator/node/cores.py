"""Which cores each replica and client of a node gets: pure logic, no effects.

The *restriction* (cgroup cpuset, affinity or quota) that enforces these sets lives in
``orchestrator.node.restrict``; this module only decides. Ray's CPU resources are logical, so
several trials sharing a node would overlap unless one allocator per node hands out
disjoint core sets. Terms used below:

- *cpu list*: the Linux text form of a core set, e.g. ``"0-3,8"`` (``Cpus_allowed_list``,
  ``cpuset.cpus``, ``/sys/devices/system/node/node0/cpulist``).
- *owner*: whoever holds cores, e.g. ``"<trial_id>/replica"``. One owner, one set.
"""

from __future__ import annotations

import glob
import os
import platform
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Isolation = Literal["require", "prefer", "share"]


# ---------------------------------------------------------------- cpu lists

def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-3,8"`` → ``{0,1,2,3,8}``. Empty or whitespace text is the empty set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"bad cpu range {part!r} in {text!r}")
            cpus.update(range(a, b + 1))
        else:
            cpus.add(int(part))
    if any(c < 0 for c in cpus):
        raise ValueError(f"negative cpu in {text!r}")
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``{0,1,2,3,8}`` → ``"0-3,8"`` (sorted, ranges collapsed); the empty set is ``""``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in _runs(sorted(set(cpus))))


def _runs(sorted_cpus: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ids as (first, last) pairs."""
    runs: list[tuple[int, int]] = []
    for c in sorted_cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs


# ---------------------------------------------------------------- topology

NODE_CPUS_ENV = "ORCH_NODE_CPUS"
HOUSEKEEPING_ENV = "ORCH_HOUSEKEEPING_CPUS"


def housekeeping_cpus() -> frozenset[int]:
    """The cores the placement hands out last: ``ORCH_HOUSEKEEPING_CPUS`` (a cpulist), else core 0."""
    return parse_cpulist(os.environ.get(HOUSEKEEPING_ENV) or "0")


@dataclass(frozen=True)
class NodeTopology:
    """The cores this process may use on this node, grouped by NUMA node, and each GPU's NUMA node.

    ``cpus`` is this process's affinity, not ``os.cpu_count()``: a Ray worker or container may
    already be restricted, and we can only hand out what we have.
    """

    cpus: tuple[int, ...]
    numa: dict[int, tuple[int, ...]] = field(default_factory=dict)
    gpu_numa: dict[int, int] = field(default_factory=dict)
    cpu_model: str = ""
    #: Cores handed out last: the kernel's housekeeping cores (interrupts, timers, the OS's daemons).
    #: Core 0 unless ``ORCH_HOUSEKEEPING_CPUS`` (a cpulist) names others, as a node booted with
    #: ``isolcpus``/``nohz_full`` or a second test lane on one machine does.
    housekeeping: frozenset[int] = frozenset({0})

    def __post_init__(self) -> None:
        if not self.numa:  # one node holding everything
            object.__setattr__(self, "numa", {0: tuple(sorted(self.cpus))})

    @classmethod
    def synthetic(cls, n_cpus: int, numa_nodes: int = 1, gpu_numa: dict[int, int] | None = None) -> NodeTopology:
        """A fake node of ``n_cpus`` split evenly over ``numa_nodes`` (for tests and planning)."""
        per = max(1, n_cpus // numa_nodes)
        numa = {n: tuple(c for c in range(n_cpus) if min(c // per, numa_nodes - 1) == n) for n in range(numa_nodes)}
        return cls(cpus=tuple(range(n_cpus)), numa=numa, gpu_numa=dict(gpu_numa or {}), cpu_model="synthetic")

    @classmethod
    def detect(cls, sysfs: str = "/sys") -> NodeTopology:
        """Read this node: affinity, NUMA cpulists, GPU NUMA nodes (NVML, else PCI sysfs), CPU model.

        ``ORCH_NODE_CPUS`` (a cpulist) narrows the node to those cores: several simulated nodes on one
        machine (a local multi-node Ray cluster in tests and benchmarks) then hand out disjoint cores."""
        usable = frozenset(os.sched_getaffinity(0))
        if os.environ.get(NODE_CPUS_ENV):
            usable &= parse_cpulist(os.environ[NODE_CPUS_ENV])
        numa: dict[int, tuple[int, ...]] = {}
        for path in sorted(glob.glob(f"{sysfs}/devices/system/node/node[0-9]*/cpulist")):
            node = int(path.rsplit("/", 2)[-2][4:])
            with open(path) as f:
                mine = parse_cpulist(f.read()) & usable
            if mine:
                numa[node] = tuple(sorted(mine))
        covered = frozenset(c for cs in numa.values() for c in cs)
        if not numa or covered != usable:  # sysfs missing or odd: one node is the honest fallback
            numa = {0: tuple(sorted(usable))}
        return cls(cpus=tuple(sorted(usable)), numa=numa, gpu_numa=_detect_gpu_numa(sysfs), cpu_model=_cpu_model(),
                   housekeeping=housekeeping_cpus())

    def node_of(self, cpu: int) -> int:
        for node, cpus in self.numa.items():
            if cpu in cpus:
                return node
        return 0


def _pci_numa(sysfs: str, bus_id: str) -> int:
    try:
        with open(f"{sysfs}/bus/pci/devices/{bus_id.lower()}/numa_node") as f:
            return max(int(f.read().strip()), 0)  # -1 means "no NUMA info": treat as node 0
    except (OSError, ValueError):
        return 0


def _detect_gpu_numa(sysfs: str) -> dict[int, int]:
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py, on GPU machines only

        pynvml.nvmlInit()
        try:
            out = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).busId
                bus = bus.decode() if isinstance(bus, bytes) else bus
                out[i] = _pci_numa(sysfs, bus[-12:])  # NVML pads the domain to 8 hex digits; sysfs uses 4
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver, no GPU: fall back to sysfs
        pass
    gpus = []
    for dev in sorted(glob.glob(f"{sysfs}/bus/pci/devices/*")):
        try:
            with open(f"{dev}/vendor") as f:
                vendor = f.read().strip()
            with open(f"{dev}/class") as f:
                klass = f.read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith("0x03"):  # NVIDIA VGA or 3D controller
            gpus.append(os.path.basename(dev))
    return {i: _pci_numa(sysfs, bus) for i, bus in enumerate(gpus)}  # PCI bus order = CUDA_DEVICE_ORDER=PCI_BUS_ID


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------- allocation

class CannotFit(RuntimeError):
    """The node cannot give the asked-for cores; never retried on the same node."""


@dataclass(frozen=True)
class Allocation:
    """A trial's cores. ``client_isolated=False`` means the client shares the replica's cores."""

    replica: frozenset[int]
    client: frozenset[int]
    client_isolated: bool

    def describe(self) -> dict[str, str]:
        return {"replica_cpus": format_cpulist(self.replica), "client_cpus": format_cpulist(self.client),
                "client_isolated": str(self.client_isolated).lower()}


class CoreAllocator:
    """Hands out disjoint core sets to concurrent owners on one node (thread-safe, no effects).

    Choice order, so that co-located trials stay fast and predictable:
    1. the preferred NUMA node (the GPUs' node), then the node with the most free cores;
    2. within a node, the smallest contiguous run that fits (less fragmentation), else the largest runs;
    3. the housekeeping cores last (core 0 unless ``ORCH_HOUSEKEEPING_CPUS`` says otherwise): interrupts,
       the kernel and the Ray raylet tend to live there.
    Only if no single node can fit does a set spill across nodes.
    """

    def __init__(self, topology: NodeTopology) -> None:
        self.topology = topology
        self._held: dict[str, frozenset[int]] = {}
        self._lock = threading.Lock()

    @property
    def free(self) -> frozenset[int]:
        with self._lock:
            return self._free()

    def held(self) -> dict[str, frozenset[int]]:
        with self._lock:
            return dict(self._held)

    def _free(self) -> frozenset[int]:
        used = frozenset().union(*self._held.values()) if self._held else frozenset()
        return frozenset(self.topology.cpus) - used

    def allocate(self, owner: str, n: int, *, prefer_numa: int | None = None,
                 avoid: frozenset[int] = frozenset()) -> frozenset[int]:
        """Reserve ``n`` cores for ``owner``; raises CannotFit with wanted/has/free counts."""
        if n < 1:
            raise ValueError(f"{owner}: asked for {n} cores; at least 1 is needed")
        with self._lock:
            if owner in self._held:
                raise ValueError(f"{owner} already holds cores {format_cpulist(self._held[owner])}")
            cpus = self._pick(owner, n, prefer_numa, avoid)
            self._held[owner] = cpus
            return cpus

    def _pick(self, owner: str, n: int, prefer_numa: int | None, avoid: frozenset[int]) -> frozenset[int]:
        total = len(self.topology.cpus)
        free = self._free() - avoid
        if n > total or n > len(free):
            raise CannotFit(f"{owner}: wanted {n} cores, node has {total}, free {len(free)}"
                            + (f" (avoiding {format_cpulist(avoid)})" if avoid else ""))
        nodes = sorted(self.topology.numa, key=lambda nd: (nd != prefer_numa, -len(free & set(self.topology.numa[nd])), nd))
        for node in nodes:  # a single node first
            node_free = free & frozenset(self.topology.numa[node])
            if len(node_free) >= n:
                return _pick_within(node_free, n, self.topology.housekeeping)
        picked: set[int] = set()  # spill over nodes in preference order
        for node in nodes:
            node_free = free & frozenset(self.topology.numa[node])
            take = min(n - len(picked), len(node_free))
            if take:
                picked |= _pick_within(node_free, take, self.topology.housekeeping)
        return frozenset(picked)

    def release(self, owner: str) -> None:
        """Free ``owner``'s cores, and those of every ``owner/…`` sub-owner. Idempotent."""
        with self._lock:
            for key in [k for k in self._held if k == owner or k.startswith(owner + "/")]:
                del self._held[key]

    def allocate_trial(self, trial_id: str, replica_cores: int, client_cores: int, isolation: Isolation = "require",
                       prefer_numa: int | None = None) -> Allocation:
        """Reserve a replica's cores and, disjoint from them, its client's; ``release(trial_id)`` frees both.

        With ``isolation="prefer"`` on a node too small for disjoint sets, the client shares
        the replica's highest cores and ``client_isolated`` is False (record it: the client then
        competes with the server). With ``"require"`` that case raises CannotFit. ``"share"``
        always shares (``client_cores`` of the replica's own cores, at most all of them).
        """
        total = len(self.topology.cpus)
        if client_cores > total:
            raise CannotFit(f"{trial_id}/client: wanted {client_cores} cores, node has {total}")
        replica = self.allocate(f"{trial_id}/replica", replica_cores, prefer_numa=prefer_numa)
        if isolation == "share":  # asked for: the client always runs on the replica's (highest) cores
            return Allocation(replica=replica, client=frozenset(sorted(replica, reverse=True)[:client_cores]),
                              client_isolated=False)
        try:
            client = self.allocate(f"{trial_id}/client", client_cores, prefer_numa=prefer_numa, avoid=replica)
            return Allocation(replica=replica, client=client, client_isolated=True)
        except CannotFit as exc:
            if isolation == "require":
                self.release(f"{trial_id}/replica")
                raise CannotFit(f"{exc}; the client needs cores disjoint from the replica's "
                                f"{format_cpulist(replica)} (client isolation 'require')") from None
        with self._lock:  # share: the replica's highest cores first, then any free ones
            pool = sorted(replica, reverse=True) + sorted(self._free(), reverse=True)
        return Allocation(replica=replica, client=frozenset(pool[:client_cores]), client_isolated=False)


def _pick_within(free: frozenset[int], n: int, housekeeping: frozenset[int] = frozenset({0})) -> frozenset[int]:
    """n cores of ``free``: best-fitting contiguous run, housekeeping cores only when nothing else is left."""
    pool = sorted(free - housekeeping)
    if len(pool) < n:  # housekeeping cores are needed (the caller checked that ``free`` has n cores)
        return frozenset(pool) | frozenset(sorted(free & housekeeping)[:n - len(pool)])
    runs = [list(range(a, b + 1)) for a, b in _runs(pool)]
    fitting = [r for r in runs if len(r) >= n]
    if fitting:
        best = min(fitting, key=lambda r: (len(r), -r[0]))  # smallest run; ties: the higher one
        return frozenset(best[-n:])
    picked: list[int] = []
    for run in sorted(runs, key=lambda r: (-len(r), -r[0])):
        picked.extend(run[-(n - len(picked)):])
        if len(picked) >= n:
            break
    return frozenset(picked[:n])


# ---------------------------------------------------------------- thread pools

def thread_env(n_cores: int) -> dict[str, str]:
    """Thread-pool sizes for a process restricted to ``n_cores`` (record them with the trial).

    Libraries size pools from ``os.cpu_count()``, which ignores affinity and cgroups; an
    oversized pool on few cores thrashes. Rayon is what HF tokenizers use.
    """
    n = str(max(1, n_cores))
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        "RAYON_NUM_THREADS": n,
        "TOKENIZERS_PARALLELISM": "true" if n_cores > 1 else "false",
    }


__all__ = ["Allocation", "CannotFit", "CoreAllocator", "Isolation", "NodeTopology", "format_cpulist",
           "parse_cpulist", "thread_env"]
