"""Which node a trial runs on: the driver's book of the cluster's nodes and the trials on each.

Ray's placement groups reserve resources, but two things a sweep needs are not Ray resources:
*one trial per node* (``placement: exclusive``, the faithful default: neighbours share memory
bandwidth, PCIe and the page cache) and *a node's hardware* as the trial names it (``H100``:
the node's ``ray.io/accelerator-type`` label, or an ``accelerator_type:H100`` resource). So the
executor picks the node here, then pins the trial's placement group to it (a
``bundle_label_selector`` on ``ray.io/node-id``); the node's core agent then hands out the
actual, disjoint cores.

The book is pure bookkeeping over an injected inventory (``Node`` records; the executor reads
them from ``ray.nodes()``), so it is tested without Ray. :meth:`NodeBook.acquire` blocks until
a node that fits has room, and fails at once, with the reason, when no node of the cluster could
ever hold the trial. Nodes that join or die are seen at the next look (``refresh_s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from orchestrator.plan.expand import replica_key
from orchestrator.values.results import TrialResult
from orchestrator.values.trial import TrialSpec

Policy = Literal["exclusive", "packed"]
ACCEL_LABEL = "ray.io/accelerator-type"
NODE_LABEL = "ray.io/node-id"  # every Ray node carries it; a placement group is pinned to a node through it


@dataclass(frozen=True)
class Node:
    node_id: str
    cpus: float
    gpus: float = 0.0
    hardware: frozenset[str] = frozenset()  # accelerator types: labels and accelerator_type:X resources

    @classmethod
    def from_ray(cls, info: dict[str, Any]) -> Node:
        res, labels = info.get("Resources", {}) or {}, info.get("Labels", {}) or {}
        kinds = {k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")}
        if labels.get(ACCEL_LABEL):
            kinds.add(labels[ACCEL_LABEL])
        return cls(info["NodeID"], float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0)), frozenset(kinds))


@dataclass(frozen=True)
class Need:
    """What one trial holds on its node: its replica's cores, its client's, GPUs, and the hardware it names.

    ``client_shared``: the client may run on the replica's cores when the node is too small for both
    (``client.isolation: prefer``); such a trial fits a node of ``cores`` cores, but packs beside
    others only with room for its client's own cores too, since that is what the core agent gives it."""

    cores: int
    gpus: int
    hardware: str
    client: int = 0
    client_shared: bool = False

    @property
    def held(self) -> int:
        """Cores it takes on a node shared with other trials."""
        return self.cores + self.client

    def matches(self, node: Node) -> bool:
        """The node is of the trial's hardware and is big enough, when empty."""
        kind_ok = self.hardware.lower() == "cpu" or self.hardware in node.hardware
        least = self.cores if self.client_shared else self.held
        return kind_ok and node.cpus >= least and node.gpus >= self.gpus

    def __str__(self) -> str:
        client = f" + {self.client} client" if self.client else ""
        return f"{self.cores}{client} cores, {self.gpus} GPUs of {self.hardware}"


def need_of(trial: TrialSpec, cores: int | None = None) -> Need:
    """What the trial holds on its node: the replica's cores and, unless it shares them, the client's."""
    iso = trial.client.isolation
    return Need(cores=cores or trial.cores, gpus=trial.gpus, hardware=trial.hardware,
                client=0 if iso == "share" else trial.client.cores, client_shared=iso != "require")


def group_max_cores(trials: Iterable[TrialSpec]) -> dict[str, int]:
    """Per replica group (``plan.expand.replica_key``), its largest core count over ``trials``."""
    out: dict[str, int] = {}
    for t in trials:
        k = replica_key(t)
        out[k] = max(out.get(k, 0), t.cores)
    return out


def lease_cores(trial: TrialSpec, max_cores: dict[str, int]) -> int:
    """The cores a trial's lease reserves: its own on a fresh start; a repin or sized group's largest count
    (``max_cores``, from :func:`group_max_cores`: its replica starts there)."""
    return trial.cores if trial.start == "fresh" else max_cores.get(replica_key(trial), trial.cores)


class _Executes(Protocol):
    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult: ...


class BookedExecutor:
    """What the controller calls on an executor whose trials lease nodes from a :class:`NodeBook`, the same for
    the Ray executor and the simulated one: ``execute`` on a default lane, ``capacity``, ``lease_cores`` and
    ``cancel``. A subclass sets ``book``, ``max_cores`` (:func:`group_max_cores`) and ``_default = None``, and
    makes its lanes (``lane()``)."""

    book: NodeBook
    max_cores: dict[str, int]
    _default: _Executes | None

    def lane(self) -> _Executes:
        raise NotImplementedError

    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        if self._default is None:
            self._default = self.lane()
        return self._default.execute(trial, attempt=attempt)

    def capacity(self, trials: list[TrialSpec]) -> int:
        """How many of ``trials`` the cluster holds at once under the policy (what the controller runs)."""
        return self.book.capacity([need_of(t, self.lease_cores(t)) for t in trials])

    def lease_cores(self, trial: TrialSpec) -> int:
        """The cores a trial's lease reserves (:func:`lease_cores`)."""
        return lease_cores(trial, self.max_cores)

    def cancel(self) -> None:
        """The sweep is stopping: trials waiting for a node stop waiting."""
        self.book.cancel()


class CannotPlace(RuntimeError):
    """No node of the cluster could ever hold the trial; the message says why."""


class Cancelled(RuntimeError):
    """The book was cancelled (the sweep is stopping) while a trial waited for a node."""


@dataclass
class _Use:
    cores: int = 0
    gpus: int = 0
    owners: dict[str, Need] = field(default_factory=dict)


class NodeBook:
    """Thread-safe: lanes acquire and release nodes concurrently."""

    def __init__(self, inventory: Callable[[], list[Node]], policy: Policy = "exclusive",
                 refresh_s: float = 2.0) -> None:
        self.inventory = inventory
        self.policy = policy
        self.refresh_s = refresh_s
        self._use: dict[str, _Use] = {}
        self._avoid: dict[str, set[str]] = {}  # trial id -> nodes where an attempt of it died
        self._cond = threading.Condition()
        self._cancelled = False

    # ------------------------------------------------------------------ queries
    def _has_room(self, node: Node, need: Need) -> bool:
        use = self._use.get(node.node_id)
        if use is None or not use.owners:
            return True
        if self.policy == "exclusive":
            return False
        return use.cores + need.held <= node.cpus and use.gpus + need.gpus <= node.gpus

    def why_never(self, need: Need, nodes: list[Node] | None = None) -> str | None:
        """None if some node could hold ``need`` when empty; else the reason, naming what the nodes have."""
        nodes = self.inventory() if nodes is None else nodes
        if any(need.matches(n) for n in nodes):
            return None
        have = "; ".join(f"{n.node_id[:8]}: {n.cpus:g} CPU, {n.gpus:g} GPU"
                         f"{', ' + ','.join(sorted(n.hardware)) if n.hardware else ''}" for n in nodes)
        return f"no node can ever hold {need}; nodes: {have or 'none'}"

    def capacity(self, needs: list[Need]) -> int:
        """How many of these trials the cluster could hold at once (at least 1)."""
        nodes = self.inventory()
        if not needs:
            return 1
        if self.policy == "exclusive":
            return max(1, sum(1 for n in nodes if any(need.matches(n) for need in needs)))
        total = 0
        for n in nodes:
            fitting = [need for need in needs if need.matches(n)]
            if fitting:
                small = min(fitting, key=lambda x: x.held)
                by_gpu = int(n.gpus // small.gpus) if small.gpus else 1 << 30
                total += max(1, min(int(n.cpus // small.held), by_gpu))
        return max(1, total)

    def in_use(self) -> dict[str, list[str]]:
        """Node id -> the owners holding room on it now."""
        with self._cond:
            return {n: sorted(u.owners) for n, u in self._use.items() if u.owners}

    def neighbours(self, node_id: str, owner: str) -> list[str]:
        with self._cond:
            use = self._use.get(node_id)
            return sorted(o for o in (use.owners if use else {}) if o != owner)

    # ------------------------------------------------------------------ acquire / release
    def acquire(self, owner: str, need: Need, *, trial_id: str | None = None,
                timeout_s: float | None = None) -> str:
        """Reserve room for ``need`` on a node and return its id; blocks while every fitting node is full.

        A node where an earlier attempt of ``trial_id`` died is taken only when no other node fits."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._cancelled:
                    raise Cancelled("the sweep is stopping")
                nodes = self.inventory()
                why = self.why_never(need, nodes)
                if why:
                    raise CannotPlace(why)
                avoid = self._avoid.get(trial_id or owner, set())
                fitting = [n for n in nodes if need.matches(n)]
                if any(n.node_id not in avoid for n in fitting):
                    fitting = [n for n in fitting if n.node_id not in avoid]
                free = [n for n in fitting if self._has_room(n, need)]
                if free:
                    # The emptiest node first (packed fills evenly); ties by id, so runs are reproducible.
                    node = min(free, key=lambda n: (self._use.get(n.node_id, _Use()).cores, n.node_id))
                    use = self._use.setdefault(node.node_id, _Use())
                    use.cores += need.held
                    use.gpus += need.gpus
                    use.owners[owner] = need
                    return node.node_id
                wait = self.refresh_s
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no node free for {need} after {timeout_s:g} s")
                    wait = min(wait, left)
                self._cond.wait(timeout=wait)

    def release(self, node_id: str, owner: str) -> None:
        with self._cond:
            use = self._use.get(node_id)
            if use is not None and owner in use.owners:
                need = use.owners.pop(owner)
                use.cores -= need.held
                use.gpus -= need.gpus
            self._cond.notify_all()

    def avoid(self, trial_id: str, node_id: str) -> None:
        """An attempt of ``trial_id`` died on ``node_id``: its retry goes elsewhere when it can."""
        with self._cond:
            self._avoid.setdefault(trial_id, set()).add(node_id)

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()


__all__ = ["ACCEL_LABEL", "NODE_LABEL", "Cancelled", "CannotPlace", "Need", "Node", "NodeBook", "Policy", "group_max_cores",
           "lease_cores", "need_of"]
