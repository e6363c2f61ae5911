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
ever hold the trial. Nodes that join or die are seen at the next read of the inventory (at most
every ``refresh_s``, or at :meth:`NodeBook.refresh`).

**Kinds of node.** A trial waits for a node of its kind (:func:`kind_key`: its accelerator type, or
any node for a CPU trial). The controller runs each kind's trials on lanes of their own, as many as
that kind's nodes hold (:meth:`BookedExecutor.kind_of`), so an H100 node never idles while H100
trials are pending behind H200 trials that wait for an H200 node; and a release hands its node to
the oldest trial waiting for that kind, waking that one lane only.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections import deque
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

    def kind_of(self, trial: TrialSpec) -> str:
        """The kind of node the trial waits for (:func:`kind_key`): the controller gives each kind lanes of its
        own, so a trial waiting for one kind never holds a lane a free node of another kind could use."""
        return kind_key(trial.hardware)

    def cancel(self) -> None:
        """The sweep is stopping: trials waiting for a node stop waiting."""
        self.book.cancel()


class CannotPlace(RuntimeError):
    """No node of the cluster could ever hold the trial; the message says why."""


class Cancelled(RuntimeError):
    """The book was cancelled (the sweep is stopping) while a trial waited for a node."""


def _shapes(nodes: Iterable[Node]) -> str:
    """What the nodes have, one entry per shape (CPUs, GPUs, hardware), with a node id (its first 8 characters)
    and how many nodes have it: a short sentence at 4096 nodes too."""
    by_shape: dict[tuple[float, float, tuple[str, ...]], list[str]] = {}
    for n in nodes:
        by_shape.setdefault((n.cpus, n.gpus, tuple(sorted(n.hardware))), []).append(n.node_id)
    out = []
    for (cpus, gpus, hw), ids in by_shape.items():
        what = f"{cpus:g} CPU, {gpus:g} GPU{', ' + ','.join(hw) if hw else ''}"
        first = min(ids)[:8]
        out.append(f"{first}: {what}" if len(ids) == 1 else f"{len(ids)} nodes like {first}: {what}")
    return "; ".join(out)


def _insert(ids: list[str], node_id: str) -> None:
    """Into the ascending ``ids``, once."""
    i = bisect.bisect_left(ids, node_id)
    if i == len(ids) or ids[i] != node_id:
        ids.insert(i, node_id)


def _discard(ids: list[str] | None, node_id: str) -> None:
    """Out of the ascending ``ids``, if there."""
    if ids:
        i = bisect.bisect_left(ids, node_id)
        if i < len(ids) and ids[i] == node_id:
            del ids[i]


ANY = "*"  # the kind key of a trial that fits any node (hardware "cpu"), and of every node


def kind_key(hardware: str) -> str:
    """The queue a trial of ``hardware`` waits in, and lanes are counted by: its accelerator type, or
    :data:`ANY` for a CPU trial (which fits a node of any kind)."""
    return ANY if hardware.lower() == "cpu" else hardware


@dataclass
class _Use:
    cores: int = 0
    gpus: int = 0
    owners: dict[str, Need] = field(default_factory=dict)


@dataclass
class BookStats:
    """What the book did, for the scale figures: each counts calls or events since the book was made."""

    acquires: int = 0         # nodes handed out (by a free look or a hand-off)
    releases: int = 0         # releases of a held node
    handoffs: int = 0         # waiters woken with a node (each wake-up carries the node it is for)
    wakeups: int = 0          # waiters woken at all (hand-offs, plus cancel and inventory changes)
    inventory_reads: int = 0  # calls of the inventory (``ray.nodes()`` on a cluster)
    waits: int = 0            # times a caller found no free node and queued


@dataclass(eq=False)
class _Waiter:
    seq: int
    owner: str
    need: Need
    avoid_key: str
    wake: Callable[[str | None], None]  # called under the book's lock with the node handed over, or None
    done: bool = False


class NodeBook:
    """Thread-safe: lanes acquire and release nodes concurrently.

    **Waiting.** A trial that finds no free node queues, first come first served, in its kind's queue
    (:func:`kind_key`). A release hands the node straight to the oldest queued trial that takes it (one
    wake-up, carrying the node; under ``packed``, as many as now fit): no other waiter is woken and none
    looks at the cluster again. A cancel wakes every waiter; so does an inventory read that finds nodes
    joined or gone (each is handed a free node that fits it, or looks again and learns it can never fit).

    **The inventory** (``ray.nodes()`` on a cluster) is read at most once per ``refresh_s`` (by ``clock``),
    or when :meth:`refresh` is called (a node died), not once per look: the free nodes of each kind are kept
    in an index, so a look costs the same at 8 nodes as at 4096 (``exclusive``; ``packed`` still scans the
    nodes of the trial's kind for the emptiest). ``refresh_s`` 0 reads it at every look.
    """

    def __init__(self, inventory: Callable[[], list[Node]], policy: Policy = "exclusive",
                 refresh_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.inventory = inventory
        self.policy = policy
        self.refresh_s = refresh_s
        self.clock = clock
        self.stats = BookStats()
        self._use: dict[str, _Use] = {}
        self._avoid: dict[str, set[str]] = {}  # trial id -> nodes where an attempt of it died
        self._lock = threading.RLock()
        self._cancelled = False
        self._nodes: dict[str, Node] = {}
        self._read_at: float | None = None
        self._by_kind: dict[str, list[str]] = {}  # kind key -> ids of its nodes, ascending
        self._free: dict[str, list[str]] = {}  # exclusive: kind key -> ids of its free nodes, ascending
        self._never: dict[tuple[str, int, int], bool] = {}  # (kind, least cores, gpus) -> no node fits
        self._shapes: str | None = None  # what the nodes have, for CannotPlace (None: not said since the last read)
        self._queues: dict[str, deque[_Waiter]] = {}  # kind key -> waiters, oldest first
        self._seq = 0

    # ------------------------------------------------------------------ the inventory
    def _nodes_now(self, force: bool = False) -> dict[str, Node]:
        """Under the lock: the cached inventory, read again when stale (or ``force``)."""
        now = self.clock()
        if force or self._read_at is None or now - self._read_at >= self.refresh_s:
            self._read(self.inventory())
            self._read_at = now
        return self._nodes

    def _read(self, nodes: list[Node]) -> None:
        self.stats.inventory_reads += 1
        before = self._nodes
        self._nodes = now = {n.node_id: n for n in nodes}
        gone = [nid for nid, n in before.items() if now.get(nid) != n]
        new = [nid for nid, n in now.items() if before.get(nid) != n]
        if not gone and not new:
            return
        self._never.clear()
        self._shapes = None
        if len(gone) + len(new) > 64 or not before:  # many changed (the first read): index them afresh
            by_kind: dict[str, list[str]] = {}
            for nid in sorted(now):
                for k in self._kinds_of(now[nid]):
                    by_kind.setdefault(k, []).append(nid)
            self._by_kind = by_kind
            self._free = {k: [nid for nid in ids if not self._held(nid)] for k, ids in by_kind.items()}
        else:  # a few nodes lost, back or changed: their index entries only
            for nid in gone:
                for k in self._kinds_of(before[nid]):
                    for index in (self._by_kind, self._free):
                        _discard(index.get(k), nid)
            for nid in new:
                for k in self._kinds_of(now[nid]):
                    _insert(self._by_kind.setdefault(k, []), nid)
                    if not self._held(nid):
                        _insert(self._free.setdefault(k, []), nid)
        if before:  # nodes joined or left: each waiter gets a free node that fits it, or looks again
            self._wake_all_waiters()

    def refresh(self) -> None:
        """Read the inventory now (a node died or joined); waiters are handed what it frees."""
        with self._lock:
            self._nodes_now(force=True)

    def _held(self, node_id: str) -> bool:
        use = self._use.get(node_id)
        return use is not None and bool(use.owners)

    def _kinds_of(self, node: Node) -> tuple[str, ...]:
        return (ANY, *node.hardware)

    # ------------------------------------------------------------------ queries
    def _has_room(self, node: Node, need: Need) -> bool:
        use = self._use.get(node.node_id)
        if use is None or not use.owners:
            return True
        if self.policy == "exclusive":
            return False
        return use.cores + need.held <= node.cpus and use.gpus + need.gpus <= node.gpus

    def _candidates(self, need: Need) -> list[str]:
        return self._by_kind.get(kind_key(need.hardware), [])

    def why_never(self, need: Need) -> str | None:
        """None if some node could hold ``need`` when empty; else the reason, naming what the nodes have."""
        with self._lock:
            have = self._nodes_now()
            key = (kind_key(need.hardware), need.cores if need.client_shared else need.held, need.gpus)
            never = self._never.get(key)
            if never is None:
                never = self._never[key] = not any(need.matches(have[nid]) for nid in self._candidates(need))
            if not never:
                return None
            if self._shapes is None:  # what the nodes have, said once an inventory
                self._shapes = _shapes(have.values())
            return f"no node can ever hold {need}; nodes: {self._shapes or 'none'}"

    def capacity(self, needs: list[Need]) -> int:
        """How many of these trials the cluster could hold at once (at least 1); reads the inventory afresh."""
        with self._lock:
            nodes = list(self._nodes_now(force=True).values())
        distinct = list(dict.fromkeys(needs))
        if not distinct:
            return 1
        if self.policy == "exclusive":
            return max(1, sum(1 for n in nodes if any(need.matches(n) for need in distinct)))
        total = 0
        for n in nodes:
            fitting = [need for need in distinct if need.matches(n)]
            if fitting:
                small = min(fitting, key=lambda x: x.held)
                by_gpu = int(n.gpus // small.gpus) if small.gpus else 1 << 30
                total += max(1, min(int(n.cpus // small.held), by_gpu))
        return max(1, total)

    def in_use(self) -> dict[str, list[str]]:
        """Node id -> the owners holding room on it now."""
        with self._lock:
            return {n: sorted(u.owners) for n, u in self._use.items() if u.owners}

    def neighbours(self, node_id: str, owner: str) -> list[str]:
        with self._lock:
            use = self._use.get(node_id)
            return sorted(o for o in (use.owners if use else {}) if o != owner)

    def waiting(self) -> int:
        """Trials queued for a node now."""
        with self._lock:
            return sum(1 for q in self._queues.values() for w in q if not w.done)

    # ------------------------------------------------------------------ choosing a node
    def _pick(self, need: Need, avoid_key: str) -> Node | None:
        """Under the lock: the node to give ``need`` now, or None. The lowest id among free fitting nodes
        (``packed``: the emptiest, then the lowest id). A node where an attempt of the trial died is taken
        only when no other node of the cluster fits it at all."""
        avoid = self._avoid.get(avoid_key, ())
        nodes = self._nodes
        fallback: Node | None = None
        if self.policy == "exclusive":
            for nid in self._free.get(kind_key(need.hardware), ()):
                node = nodes[nid]
                if not need.matches(node):
                    continue
                if nid in avoid:
                    fallback = fallback or node
                    continue
                return node
        else:
            best: tuple[int, str] | None = None
            for nid in self._candidates(need):
                node = nodes[nid]
                if not need.matches(node) or not self._has_room(node, need):
                    continue
                if nid in avoid:
                    fallback = fallback or node
                    continue
                key = (self._use.get(nid, _Use()).cores, nid)
                if best is None or key < best:
                    best = key
            if best is not None:
                return nodes[best[1]]
        if fallback is not None and not any(nid not in avoid and need.matches(nodes[nid])
                                            for nid in self._candidates(need)):
            return fallback
        return None

    def _book(self, node: Node, owner: str, need: Need) -> str:
        use = self._use.setdefault(node.node_id, _Use())
        use.cores += need.held
        use.gpus += need.gpus
        use.owners[owner] = need
        if self.policy == "exclusive":
            for k in self._kinds_of(node):
                _discard(self._free.get(k), node.node_id)
        self.stats.acquires += 1
        return node.node_id

    def _freed(self, node_id: str) -> None:
        """Under the lock: ``node_id`` has room again: into the free index, then handed to the oldest waiter
        that takes it (``packed``: to each waiter in turn while room lasts)."""
        node = self._nodes.get(node_id)
        if node is None:
            return
        if self.policy == "exclusive" and not self._held(node_id):
            for k in self._kinds_of(node):
                _insert(self._free.setdefault(k, []), node_id)
        queues = [q for k in self._kinds_of(node) if (q := self._queues.get(k))]
        for waiter in heapq.merge(*queues, key=lambda w: w.seq):
            if waiter.done or not waiter.need.matches(node) or not self._has_room(node, waiter.need):
                continue
            got = self._pick(waiter.need, waiter.avoid_key)
            if got is None:
                continue
            self._hand(waiter, self._book(got, waiter.owner, waiter.need))
            self.stats.handoffs += 1
            if not self._has_room(node, Need(1, 0, ANY)):
                break
        for q in queues:
            while q and q[0].done:
                q.popleft()

    def _hand(self, waiter: _Waiter, node_id: str | None) -> None:
        waiter.done = True
        self.stats.wakeups += 1
        waiter.wake(node_id)

    def _wake_all_waiters(self) -> None:
        """Under the lock: every waiter is handed a free node that fits it now, or woken to look again."""
        waiters = sorted((w for q in self._queues.values() for w in q if not w.done), key=lambda w: w.seq)
        self._queues = {}
        for w in waiters:
            got = None if self._cancelled else self._pick(w.need, w.avoid_key)
            if got is not None:
                self.stats.handoffs += 1
                self._hand(w, self._book(got, w.owner, w.need))
            else:
                self._hand(w, None)

    # ------------------------------------------------------------------ acquire / release
    def acquire_or_queue(self, owner: str, need: Need, wake: Callable[[str | None], None], *,
                         trial_id: str | None = None) -> str | None:
        """A node for ``need`` now, or None and ``wake`` queued: called later, under the book's lock, with the
        node handed over (already booked to ``owner``), or with None when the caller should look again (the
        inventory changed, or the book was cancelled). Raises CannotPlace, Cancelled."""
        with self._lock:
            if self._cancelled:
                raise Cancelled("the sweep is stopping")
            why = self.why_never(need)  # reads the inventory again when it is stale
            if why:
                raise CannotPlace(why)
            avoid_key = trial_id or owner
            node = self._pick(need, avoid_key)
            if node is not None:
                return self._book(node, owner, need)
            self._seq += 1
            self._queues.setdefault(kind_key(need.hardware), deque()).append(
                _Waiter(self._seq, owner, need, avoid_key, wake))
            self.stats.waits += 1
            return None

    def acquire(self, owner: str, need: Need, *, trial_id: str | None = None,
                timeout_s: float | None = None) -> str:
        """Reserve room for ``need`` on a node and return its id; blocks while every fitting node is full.

        A node where an earlier attempt of ``trial_id`` died is taken only when no other node fits. While it
        waits, the caller keeps its place in the queue; every ``refresh_s`` it has the inventory read again if
        nobody has (a node that joined is handed to the oldest waiter it fits; one that left may leave the trial
        nowhere to go: CannotPlace)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            handed: list[str | None] = []
            woken = threading.Event()

            def wake(node: str | None, handed: list[str | None] = handed, woken: threading.Event = woken) -> None:
                handed.append(node)
                woken.set()

            node = self.acquire_or_queue(owner, need, wake, trial_id=trial_id)
            if node is not None:
                return node
            while True:
                wait = self.refresh_s if self.refresh_s > 0 else 0.05  # looks at the inventory at least this often
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                woken.wait(timeout=wait)
                with self._lock:
                    if not handed:
                        self._nodes_now()  # read again if stale: what joined or left is handed or woken now
                    if handed:
                        if handed[0] is not None:
                            return handed[0]
                        break  # woken to look again: the cluster changed, or the sweep is stopping
                    why = self.why_never(need)
                    if why:
                        self._drop_waiter(owner)
                        raise CannotPlace(why)
                    if deadline is not None and time.monotonic() >= deadline:
                        self._drop_waiter(owner)
                        raise TimeoutError(f"no node free for {need} after {timeout_s:g} s")

    def _drop_waiter(self, owner: str) -> None:
        for q in self._queues.values():
            for w in q:
                if w.owner == owner and not w.done:
                    w.done = True

    def release(self, node_id: str, owner: str) -> None:
        with self._lock:
            use = self._use.get(node_id)
            if use is not None and owner in use.owners:
                need = use.owners.pop(owner)
                use.cores -= need.held
                use.gpus -= need.gpus
                self.stats.releases += 1
                self._freed(node_id)

    def avoid(self, trial_id: str, node_id: str) -> None:
        """An attempt of ``trial_id`` died on ``node_id``: its retry goes elsewhere when it can."""
        with self._lock:
            self._avoid.setdefault(trial_id, set()).add(node_id)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._wake_all_waiters()


__all__ = ["ACCEL_LABEL", "ANY", "NODE_LABEL", "BookStats", "Cancelled", "CannotPlace", "Need", "Node", "NodeBook",
           "Policy", "group_max_cores", "kind_key", "lease_cores", "need_of"]
