"""SimExecutor: the controller's executor on simulated nodes, in virtual time.

What it is for: running the real :class:`~orchestrator.control.controller.SweepController` and the real
:class:`~orchestrator.control.placement.NodeBook` at 512 nodes on a laptop, to see what limits the
controller (``benchmarks/scale_sim.py``). Nothing of a trial runs: a trial holds its node for a duration
drawn from measured ones (:class:`Durations`) and ends; the clock is virtual.

**The clock.** :class:`VirtualClock` is a discrete-event clock over the controller's own threads. Each
lane (``executor.lane()``, one controller thread each) that waits in the simulation (its trial's end, a
free node) is *blocked*; once every lane the controller started is blocked, the clock jumps to the earliest
pending event and wakes only the lane it belongs to. So exactly one lane runs controller code at a time,
and a sweep of hours of virtual time runs in seconds. The controller starts its lanes one by one, so the
clock also waits until as many lanes as the controller runs (``lanes_expected``; the benchmark passes
``lambda: controller.lanes_used``) have joined: else the first lane's trial would end before the last
lane had asked for a node. The controller itself reads wall time only for ``write_s`` (injectable,
``clock=``), its interrupt grace and its wait for lanes (real-time waits of a thread the simulation does
not touch); nothing in it had to change.

**The node book.** The executor asks the real book for a node the way the Ray executor does (``need_of``,
``lease_cores``, ``replica_key``/``start_key`` for warm leases), through ``acquire_or_queue``: when no node is
free the lane queues in the book and waits in *virtual* time until the book hands it a node (a release, or a
node joining), exactly the hand-off the Ray executor's blocking ``acquire`` waits for in real time; no other
lane is woken. The book reads the inventory when it changes (``refresh`` at a fault), not at every look. A
trial no node can ever hold fails at once as CANNOT_FIT, from the book.

**Faults.** A :class:`Fault` takes a node down at a virtual time: ``node_lost`` for good, ``raylet_died``
with the node back under a new node id after ``restart_s`` (as Ray does: a restarted raylet is a new
node). The trial on it ends then as the retryable NODE_DIED, the book is told to avoid that node for the
trial's retry (as the Ray executor does), and the node leaves the inventory.

Pure bookkeeping, no Ray and no I/O; seeded (a trial's duration is drawn from its trial id and attempt).
"""

from __future__ import annotations

import hashlib
import heapq
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.control.placement import (
    BookedExecutor,
    Cancelled,
    CannotPlace,
    Need,
    Node,
    NodeBook,
    Policy,
    group_max_cores,
    need_of,
)
from orchestrator.plan.expand import replica_key, start_key
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan, TrialSpec


class SimDeadlock(RuntimeError):
    """Every lane waits for a node and nothing in the simulation can free one (a bug, never a sweep's)."""


class VirtualClock:
    """A discrete-event clock shared by the threads that take part (see the module docstring)."""

    def __init__(self, lanes_expected: Callable[[], int] = lambda: 0, pace: float | None = None) -> None:
        self.now = 0.0
        self.lanes_expected = lanes_expected
        # Virtual seconds per real second, or None: as fast as the controller goes. Paced, an event waits for its
        # real time to come (the lanes wait anyway), so observers see results arrive as a fleet would send them.
        self.pace = pace
        self._real0: float | None = None
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, Callable[[], bool]]] = []
        self._seq = 0
        self._joined = 0
        self._left = 0
        self._blocked = 0
        self.events = 0  # events fired, for the figures

    # -- who takes part
    def join(self) -> None:
        with self._lock:
            self._joined += 1

    def leave(self) -> None:
        with self._lock:
            self._left += 1
            self._advance()

    # -- waiting
    def at(self, t: float, fn: Callable[[], bool]) -> None:
        """Call ``fn`` (under the clock's lock) when the clock reaches ``t``; ``fn`` says whether it woke a lane."""
        with self._lock:
            self._push(t, fn)

    def _push(self, t: float, fn: Callable[[], bool]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn))

    def sleep_until(self, t: float, woken: threading.Event | None = None) -> None:
        """Block the calling lane until the clock reaches ``t``, or until ``woken`` is set by an earlier event (a node
        that died cuts its trial short)."""
        woken = woken or threading.Event()
        with self._lock:
            self._push(t, _setter(woken))
            self._blocked += 1
            self._advance()
        woken.wait()

    def block(self, woken: threading.Event) -> None:
        """Block the calling lane until an event sets ``woken`` (the book handed the lane a node: ``SimExecutor.acquire``)."""
        with self._lock:
            self._blocked += 1
            self._advance()
        woken.wait()

    def _advance(self) -> None:
        """Under the lock: while every lane is blocked, fire the earliest event; stop once one woke a lane."""
        while self._joined >= self.lanes_expected() and self._blocked == self._joined - self._left and self._heap:
            t, _, fn = heapq.heappop(self._heap)
            if self.pace:
                self._real0 = time.monotonic() if self._real0 is None else self._real0
                time.sleep(max(0.0, self._real0 + t / self.pace - time.monotonic()))
            self.now = t
            self.events += 1
            if fn():
                self._blocked -= 1
                return
        if self._joined > self._left and self._blocked == self._joined - self._left and not self._heap \
                and self._joined >= self.lanes_expected():
            raise SimDeadlock(f"all {self._blocked} lane(s) wait and no event is pending at t={self.now:.0f} s")


@dataclass(frozen=True)
class Durations:
    """Measured trial durations (seconds, a lane's execute from start to end) to draw from.

    ``started``: trials that started their replica (placing, start-up, warm-up, window, stop);
    ``warm``: a later trial on a live replica (re-pinned, or a shared start's next window)."""

    started: tuple[float, ...]
    warm: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.started or not self.warm:
            raise ValueError("Durations need at least one started and one warm duration")

    def draw(self, rng: random.Random, *, warm: bool) -> float:
        pool = self.warm if warm else self.started
        return pool[rng.randrange(len(pool))]

    def mean_trial_s(self, warm_share: float) -> float:
        """The mean duration when ``warm_share`` of the trials run on a live replica."""
        return (warm_share * sum(self.warm) / len(self.warm)
                + (1 - warm_share) * sum(self.started) / len(self.started))


@dataclass(frozen=True)
class SimNode:
    node_id: str
    cpus: int
    gpus: int
    hardware: str  # the node's accelerator type ("" for none)

    def ray_info(self) -> dict[str, Any]:
        """What ``ray.nodes()`` says of such a node (the inventory parses it as the Ray executor's does)."""
        res: dict[str, float] = {"CPU": float(self.cpus), "GPU": float(self.gpus)}
        labels = {"ray.io/accelerator-type": self.hardware} if self.hardware else {}
        return {"NodeID": self.node_id, "Alive": True, "Resources": res, "Labels": labels}


def fleet(counts: dict[str, int], *, cpus: int = 128, gpus: int = 8) -> list[SimNode]:
    """``counts`` nodes of each hardware type, ids ``<type>-<n>``, in a reproducible order."""
    return [SimNode(f"{hw.lower()}-{i:04d}", cpus, gpus, hw) for hw, n in counts.items() for i in range(n)]


FaultKind = Literal["node_lost", "raylet_died"]


@dataclass(frozen=True)
class Fault:
    at_s: float
    node_id: str
    kind: FaultKind = "node_lost"
    restart_s: float = 60.0  # raylet_died: the node is back, as a new node id, after this long


@dataclass
class _Lease:
    node: str
    owner: str
    key: str
    start: str


@dataclass
class SimStats:
    """What the simulation itself did (not the controller): events, and its own CPU in the lanes."""

    attempts: int = 0
    node_died: int = 0
    cannot_fit: int = 0
    sim_cpu_s: float = 0.0   # CPU of the simulation's own code in the lanes (the book's calls excluded)
    book_cpu_s: float = 0.0  # CPU inside the real NodeBook's acquire/release
    lanes: int = 0
    held_s: float = 0.0  # virtual node-seconds held by trials (waiting for a node not counted)
    by_node: dict[str, int] = field(default_factory=dict)  # attempts per node id
    holds: list[tuple[str, float, float]] = field(default_factory=list)  # (node id, from, to): each trial's hold
    last_acquire: dict[str, float] = field(default_factory=dict)  # kind of node -> when a lane last got one


class SimExecutor(BookedExecutor):
    """The controller's executor on simulated nodes (see the module docstring); ``lane()`` per controller thread."""

    def __init__(self, nodes: Sequence[SimNode], durations: Durations, *, plan: SweepPlan,
                 faults: Iterable[Fault] = (), seed: int = 0, policy: Policy | None = None,
                 lanes_expected: Callable[[], int] = lambda: 0,
                 records: Callable[[TrialSpec, random.Random], tuple[Any, ...]] | None = None,
                 epoch: float = 1.8e9, pace: float | None = None) -> None:
        self.clock = VirtualClock(lanes_expected, pace)
        self.durations = durations
        self.seed = seed
        self.records = records  # the request records of a completed window (a knee search reads them)
        self.epoch = epoch  # virtual time 0 as a Unix time, for started_at/ended_at
        self.policy: Policy = policy or plan.spec.placement
        self._nodes: dict[str, tuple[SimNode, float, float]] = {n.node_id: (n, 0.0, float("inf")) for n in nodes}
        # The inventory is read when it changes (a node lost or back: ``refresh``), as Ray's node events would tell.
        self.book = NodeBook(self._inventory, self.policy, refresh_s=float("inf"), clock=lambda: self.clock.now)
        self._woken: list[threading.Event] = []  # lanes the book handed a node (or told to look again), to wake
        self.max_cores = group_max_cores(plan.trials)
        self.stats = SimStats()
        self._lock = threading.Lock()
        self._running: dict[str, set[threading.Event]] = {}  # node id -> its trials' ends, to cut them short
        self._cut: dict[str, float] = {}  # node id -> when its node died (the trial on it fails)
        self._seq = 0
        self._tl = threading.local()  # this thread's CPU in the book, so a lane's own share can be told apart
        self._default: SimLane | None = None
        for f in faults:
            self._schedule(f)

    # ------------------------------------------------------------------ the inventory
    def _inventory(self) -> list[Node]:
        """The nodes alive now, parsed from Ray-style records as the Ray executor's inventory parses them."""
        now = self.clock.now
        return [Node.from_ray(n.ray_info()) for n, up, down in self._nodes.values() if up <= now < down]

    def lifetimes(self) -> list[tuple[SimNode, float, float]]:
        """Every node the simulation had, with when it was up (a restarted raylet is a node of its own)."""
        return list(self._nodes.values())

    def alive(self, node_id: str) -> bool:
        n = self._nodes.get(node_id)
        return n is not None and n[1] <= self.clock.now < n[2]

    def _schedule(self, f: Fault) -> None:
        if f.node_id not in self._nodes:
            raise ValueError(f"fault on unknown node {f.node_id}")

        def down() -> bool:
            node, up, _ = self._nodes[f.node_id]
            self._nodes[f.node_id] = (node, up, f.at_s)
            if f.kind == "raylet_died":
                back = SimNode(f"{node.node_id}-r{int(f.at_s)}", node.cpus, node.gpus, node.hardware)
                self._nodes[back.node_id] = (back, f.at_s + f.restart_s, float("inf"))
                self.clock._push(f.at_s + f.restart_s, self._nodes_changed)
            self._cut[f.node_id] = f.at_s
            for ev in self._running.get(f.node_id, ()):  # the trials on it end now
                self.clock._push(f.at_s, _setter(ev))
            return self._nodes_changed()

        self.clock.at(f.at_s, down)

    def _nodes_changed(self) -> bool:
        """Under the clock's lock: a node left or is back; the book reads the inventory and hands what it frees to
        waiting lanes (an event: it wakes no lane itself)."""
        self._book_call(self.book.refresh)
        self._wake_handed()
        return False

    def _wake_handed(self) -> None:
        """Under the clock's lock: the lanes the book handed a node since the last call wake at the current time."""
        woken, self._woken = self._woken, []
        for ev in woken:
            self.clock._push(self.clock.now, _setter(ev))

    # ------------------------------------------------------------------ the executor interface
    def lane(self) -> SimLane:
        lane = SimLane(self)
        self.stats.lanes += 1
        return lane

    # execute, capacity, lease_cores, cancel: placement.BookedExecutor

    def close(self) -> None:
        if self._default is not None:
            self._default.close()

    # ------------------------------------------------------------------ what a lane calls
    def rng(self, trial: TrialSpec, attempt: int) -> random.Random:
        digest = hashlib.sha256(f"{self.seed}/{trial.trial_id}/{attempt}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def acquire(self, trial: TrialSpec, attempt: int) -> _Lease:
        """A node from the real book; waits in virtual time while none is free. Raises CannotPlace, Cancelled."""
        need: Need = need_of(trial, self.lease_cores(trial))
        with self._lock:
            self._seq += 1
            owner = f"{trial.trial_id}#{attempt}.{self._seq}"
        while True:
            woken = threading.Event()
            handed: list[str | None] = []

            def wake(node: str | None, woken: threading.Event = woken, handed: list[str | None] = handed) -> None:
                handed.append(node)  # under the book's lock: the lane is woken once the book call returns
                self._woken.append(woken)

            node = self._book_call(self.book.acquire_or_queue, owner, need, wake, trial_id=trial.trial_id)
            if node is None:
                with self.clock._lock:
                    self._wake_handed()
                self.clock.block(woken)  # until the book hands this lane a node (or asks it to look again)
                node = handed[0] if handed else None
            if node is not None:
                self.stats.last_acquire[self.kind_of(trial)] = self.clock.now
                return _Lease(node, owner, replica_key(trial), start_key(trial))

    def release(self, lease: _Lease) -> None:
        self._book_call(self.book.release, lease.node, lease.owner)
        with self.clock._lock:
            self._wake_handed()

    def _book_call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """``fn`` of the real book, its CPU counted as the book's."""
        t0 = time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            self._book_cpu(time.thread_time() - t0)

    def _book_cpu(self, seconds: float) -> None:
        self.stats.book_cpu_s += seconds
        self._tl.book = self.thread_book_cpu() + seconds

    def thread_book_cpu(self) -> float:
        """CPU seconds the calling thread spent in the book so far."""
        return float(getattr(self._tl, "book", 0.0))

    def hold(self, lease: _Lease, seconds: float) -> float | None:
        """Hold ``lease``'s node for ``seconds`` of virtual time; the time its node died instead, if it did."""
        if not self.alive(lease.node):
            return self.clock.now
        t0 = self.clock.now
        end = threading.Event()
        with self.clock._lock:  # only this lane runs now (the others wait on the clock): no event fires in between
            self._running.setdefault(lease.node, set()).add(end)
        self.clock.sleep_until(t0 + seconds, end)
        with self.clock._lock:
            self._running.get(lease.node, set()).discard(end)
            self.stats.held_s += self.clock.now - t0
            self.stats.holds.append((lease.node, t0, self.clock.now))
            died = self._cut.get(lease.node)
        return died if died is not None and died <= self.clock.now else None


def _setter(ev: threading.Event) -> Callable[[], bool]:
    def fn() -> bool:
        if ev.is_set():  # already woken (a node died first): this later event is stale
            return False
        ev.set()
        return True

    return fn


class SimLane:
    """One trial at a time, keeping a warm lease between a repin group's trials (or a shared start's windows)."""

    def __init__(self, ex: SimExecutor) -> None:
        self.ex = ex
        self._warm: _Lease | None = None
        self._closed = False
        ex.clock.join()

    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        t_cpu = time.thread_time()
        book0 = self.ex.thread_book_cpu()
        try:
            return self._execute(trial, attempt)
        finally:  # this thread's CPU in the call, less its share in the real book
            self.ex.stats.sim_cpu_s += (time.thread_time() - t_cpu) - (self.ex.thread_book_cpu() - book0)

    def _execute(self, trial: TrialSpec, attempt: int) -> TrialResult:
        ex = self.ex
        ex.stats.attempts += 1
        started = ex.clock.now
        repin = trial.start == "repin"
        share = trial.protocol.share_start and not repin
        warm = self._warm
        if warm is not None and not ((repin and warm.key == replica_key(trial))
                                     or (share and warm.start == start_key(trial))):
            self._close_warm()
        lease = self._warm
        ok = False
        try:
            if lease is None:
                try:
                    lease = ex.acquire(trial, attempt)
                except CannotPlace as exc:
                    ex.stats.cannot_fit += 1
                    return self._failed(trial, ErrorKind.CANNOT_FIT, str(exc), started, {})
                except Cancelled as exc:
                    return self._failed(trial, ErrorKind.INTERNAL, str(exc), started, {})
                is_warm = False
            else:
                is_warm = True
            ex.stats.by_node[lease.node] = ex.stats.by_node.get(lease.node, 0) + 1
            rng = ex.rng(trial, attempt)
            seconds = ex.durations.draw(rng, warm=is_warm)
            died = ex.hold(lease, seconds)
            facts = {"node_id": lease.node, "sim_warm": str(is_warm)}
            if died is not None:
                ex.stats.node_died += 1
                ex.book.avoid(trial.trial_id, lease.node)
                return self._failed(trial, ErrorKind.NODE_DIED, f"node {lease.node} died at t={died:.0f} s",
                                    started, facts)
            ok = True
            records = ex.records(trial, rng) if ex.records is not None else ()
            return TrialResult(trial.trial_id, TrialStatus.COMPLETED, records=records,
                               metrics={"trial_duration_s": ex.clock.now - started}, params=facts,
                               started_at=ex.epoch + started, ended_at=ex.epoch + ex.clock.now)
        finally:
            if lease is not None:
                if (repin or share) and ok:
                    self._warm = lease
                else:
                    ex.release(lease)
                    if lease is self._warm:
                        self._warm = None

    def _failed(self, trial: TrialSpec, kind: ErrorKind, message: str, started: float,
                facts: dict[str, str]) -> TrialResult:
        return TrialResult.failed(trial.trial_id, kind, message, params=facts, started_at=self.ex.epoch + started,
                                  ended_at=self.ex.epoch + self.ex.clock.now)

    def _close_warm(self) -> None:
        if self._warm is not None:
            self.ex.release(self._warm)
            self._warm = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_warm()
        self.ex.clock.leave()


__all__ = ["Durations", "Fault", "SimDeadlock", "SimExecutor", "SimLane", "SimNode", "SimStats", "VirtualClock",
           "fleet"]
