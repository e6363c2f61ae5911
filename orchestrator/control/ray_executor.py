"""RayTrialExecutor: runs one TrialSpec on a Ray cluster and returns a TrialResult.

Placement: the driver's :class:`~orchestrator.control.placement.NodeBook` picks a node of the
trial's hardware with room under the sweep's policy (``exclusive``: one trial per node;
``packed``: several, on disjoint cores), then a placement group with one bundle
``{"CPU": cores, "GPU": gpus}``, pinned to that node (``bundle_label_selector`` on
``ray.io/node-id``, STRICT_PACK), reserves it; the node's core agent then gives the replica and
the client real, disjoint cores. A trial no node can ever hold fails at once as CANNOT_FIT.

Concurrency: each :meth:`RayTrialExecutor.lane` runs one trial at a time with its own warm
replica; the controller runs several lanes on threads (Ray's API is thread-safe).

Two start modes:
- ``fresh``: every trial starts its own vLLM, pinned from the start (compile
  caches are shared, so restarts are warm). Faithful; the default.
- ``repin``: consecutive trials that differ only in cores share one live
  replica, re-pinned between trials (and its prefix cache reset). Fast; its
  thread pools keep their startup size, so reports flag it.
- ``fresh`` with ``protocol.share_start``: consecutive trials that differ only
  in workload or repeat are windows of one start pinned to their cores, each
  from the prefix-cache reset (the protocol's start state); the warm-up runs
  once per start.

What happens on a replica that answers, from the warm-up to the verification, is
:mod:`orchestrator.control.measure`'s; this module places, leases, starts and re-pins.

A display follows each trial through :attr:`RayTrialExecutor.on_phase` (the controller's
:data:`~orchestrator.control.controller.Phase`): ``placing`` when a lane takes the trial, then the
lease's own events (:data:`PHASE_OF_EVENT`: start, warm-up, window, cross-check, stop) as
:meth:`_Lease.mark` records them, for the trial on the lease now.

Every failure becomes data (``TrialResult.failed``); actor and node loss map to
the retryable ``NODE_DIED``, a server found dead at any step of the window to ``SERVER_DIED``. Capacity is released in exactly one place:
:meth:`_Lease.close`, called from ``finally`` (fresh) or when the warm replica
is no longer wanted (repin, and :meth:`RayTrialExecutor.close`).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnschedulableError, GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.control.controller import Phase, PhaseHook, notify_phase
from orchestrator.control.measure import Window, WindowSequence, flat_params
from orchestrator.control.placement import (
    NODE_LABEL,
    BookedExecutor,
    Cancelled,
    CannotPlace,
    Node,
    NodeBook,
    Policy,
    group_max_cores,
    need_of,
)
from orchestrator.node.actors import ReplicaActor, WorkloadActor, core_agent
from orchestrator.observe.time_use import STEP, timeline_from_events
from orchestrator.plan.expand import replica_key, start_key
from orchestrator.plan.load import SpecError
from orchestrator.plan.models import ModelError
from orchestrator.plan.references import ReferencePlan
from orchestrator.values.results import ErrorKind, TrialFailure, TrialResult
from orchestrator.values.trial import SweepPlan, TrialSpec
from orchestrator.values.wire import CoreGrant, NodeError, ReplicaUp
from workloads.corpus import CorpusError
from workloads.loaders import WorkloadInputError, trace_path


def bundle_for(trial: TrialSpec, cores: int | None = None) -> dict[str, float]:
    """Ray resources of the trial's placement group (bookkeeping; enforcement is ours). The node, and so
    its hardware, is chosen by the :class:`~orchestrator.control.placement.NodeBook`, not by a resource."""
    bundle: dict[str, float] = {"CPU": float(cores or trial.cores)}
    if trial.gpus:
        bundle["GPU"] = float(trial.gpus)
    return bundle


# Lease events (``_Lease.mark``, orchestrator.observe.time_use) that start a phase a display shows; the
# others (ready, warmup_end, window_end, ...) end one, and the next event says what follows.
PHASE_OF_EVENT: dict[str, Phase] = {"start": "starting", "repin": "repinning", "warmup": "warmup", "window": "window",
                                    "crosscheck": "crosscheck", "stop": "stopping"}


def _inventory() -> list[Node]:
    """The cluster's alive nodes that can run trials (a head with ``CPU: 0`` cannot)."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]  # Ray's API is untyped
    return [Node.from_ray(n) for n in nodes if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]


@dataclass
class _Lease:
    """A reserved node slot with its replica actor: what one fresh trial, or one repin group, holds."""

    key: str
    pg: Any
    strategy: Any
    replica: Any
    agent: Any
    facts: dict[str, Any]
    book: NodeBook | None = None
    node: str = ""
    owner: str = ""  # this lease's name in the book
    started: bool = False
    owners: list[str] = field(default_factory=list)  # core-agent allocations to release
    # What the node's agent holds for this lease (its allocator's owners, ``<trial_id>/replica`` and
    # ``/client``, and their cores), so a replacement agent can hold them too (RayTrialExecutor._agent).
    grants: dict[str, frozenset[int]] = field(default_factory=dict)
    # The executor's lock over its agents: a release never races the re-registration of a replacement agent.
    agents_lock: Any = field(default_factory=threading.Lock)
    closed: bool = False
    start_key: str = ""
    alloc: CoreGrant | None = None  # the cores a shared start keeps for its windows
    up: ReplicaUp | None = None  # what the start returned (URL, tokenizer, params)
    windows: int = 0  # windows measured on this start so far
    gpus: int = 0
    cores: int = 0
    held_from: float = 0.0  # when the placement group was ready (time.monotonic())
    events: list[tuple[str, float]] = field(default_factory=list)  # orchestrator.observe.time_use events
    timelines: list[Any] | None = None  # the executor's list this lease's timeline goes to when it closes
    trial: str = ""  # the trial whose time the lease spends now (a display's; stopping a warm one: the next's)
    on_phase: PhaseHook | None = None
    # The lease's WorkloadActor, made at its first window and kept for the next ones (a window's text is built
    # by ``prepare`` and its client re-pinned by ``pin``, so nothing of one window reaches the next): no actor
    # process start between two windows of a repin group or a shared start.
    workload: Any = None

    def drop_workload(self) -> None:
        if self.workload is not None:
            ray.kill(self.workload)
            self.workload = None

    def mark(self, event: str) -> None:
        self.events.append((event, time.monotonic()))
        if event in PHASE_OF_EVENT and self.trial:
            notify_phase(self.on_phase, self.trial, PHASE_OF_EVENT[event])

    def release_cores(self) -> None:
        with self.agents_lock:
            for owner in self.owners:
                self.agent.release.remote(owner)
            self.owners.clear()
            self.grants.clear()

    def close(self, tdir: Path | None) -> None:
        """Stop the replica, bring its files to ``tdir``, release cores and the placement group. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.mark("stop")
        try:
            files = ray.get(self.replica.stop.remote(), timeout=180)
            if tdir is not None:
                _write_files(tdir, files)
        except Exception as exc:  # the actor is gone; its process group died with it
            if tdir is not None:
                (tdir / "collect-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
        ray.kill(self.replica)
        self.drop_workload()
        self.mark("stopped")
        if self.timelines is not None:
            self.timelines.append(timeline_from_events(self.owner, self.events, gpus=self.gpus, cores=self.cores,
                                                       node=self.node, held_from=self.held_from))
        self.release_cores()
        remove_placement_group(self.pg)
        if self.book is not None:
            self.book.release(self.node, self.owner)


def _write_files(tdir: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (tdir / name).write_bytes(data)


class RayTrialExecutor(BookedExecutor):
    """Runs trials on Ray; ``home`` is the driver's folder for trial artifacts.

    ``execute`` runs one trial at a time on a default lane; :meth:`lane` gives the controller more
    lanes, to run trials concurrently. Give it the plan so a repin group can reserve its largest
    core count up front, and so the placement policy is the sweep's.
    """

    def __init__(self, home: Path, *, plan: SweepPlan | None = None, placement_timeout_s: float = 300.0,
                 policy: Policy | None = None) -> None:
        self.home = Path(home).resolve()
        self.placement_timeout_s = placement_timeout_s
        self.policy: Policy = policy or (plan.spec.placement if plan else "exclusive")
        self.book = NodeBook(_inventory, self.policy)
        self.max_cores = group_max_cores(plan.trials if plan else ())
        # crosscheck: auto: which windows run the reference clients (the plan's ends of each configuration)
        self.references = ReferencePlan(plan.trials if plan else ())
        self._lanes: list[_Lane] = []
        self._default: _Lane | None = None
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._traces: dict[str, tuple[str, Any]] = {}
        self._agents: dict[str, Any] = {}  # node id -> its core agent's handle, for the executor's life (_agent)
        self._leases: list[_Lease] = []  # the open leases: what a replacement agent must hold (_agent)
        self.timelines: list[Any] = []  # one orchestrator.observe.time_use.LeaseTimeline per closed lease
        # Called with each step's name before it runs (orchestrator.control.measure.STEPS): fault tests kill there.
        self.on_step: Callable[[str], None] | None = None
        # Told each trial's phase as it starts (a live display; see the module docstring). Never raises into a trial.
        self.on_phase: PhaseHook | None = None

    # ------------------------------------------------------------------ public
    def lane(self) -> _Lane:
        """A new lane: runs one trial at a time, keeps its own warm replica (repin, shared start)."""
        lane = _Lane(self)
        self._lanes.append(lane)
        return lane

    # execute, capacity, lease_cores, cancel: placement.BookedExecutor

    def close(self) -> None:
        """Stop every lane's warm replica, if one is left, then let the core agents go. Safe to call more than once."""
        for lane in self._lanes:
            lane.close()
        with self._seq_lock:
            self._agents.clear()  # the last handle of each: the agent ends with its bookkeeping

    def _trace(self, trial: TrialSpec) -> tuple[str, Any] | None:
        """The workload's trace file, through Ray's object store: ``(content hash, ObjectRef of its bytes)``.

        A worker node has no access to the driver's disk, so the file is read here once and put in
        the object store; the workload actor writes it to a node-local file named by its hash."""
        path = trace_path(trial.workload)
        if path is None:
            return None
        key = str(path)
        with self._seq_lock:
            if key not in self._traces:
                data = Path(path).read_bytes()
                self._traces[key] = (hashlib.sha256(data).hexdigest()[:16], ray.put(data))
            return self._traces[key]

    def _agent(self, node_id: str, dead: Any = None) -> Any:
        """The core agent of ``node_id``: one per node, created by this executor and kept until :meth:`close`.

        An actor that is not detached lives as long as the handle that created it, and a handle Ray
        gives back by name is weak. Kept on a lease, the creating handle went with the first lease on
        the node and took the agent with it: a later lease's calls then failed as ``node_died`` (all
        references to the actor were removed), and a lease after that made a new agent that knew
        nothing of the cores its neighbours held.

        ``dead``: a handle of this node's agent that a call found dead (``ActorDiedError``: OOM-killed,
        ``ray.kill``, its worker crashed; a restarted node comes back under a new node id, so a new agent).
        If it is still the cached one, a new agent replaces it and first holds every core the open leases
        on the node were granted, under the same owners: it hands none of them out again, and each lease,
        re-pointed to it, releases its own as before (when it closes, or re-pins). Another lane that found
        the same agent dead meanwhile gets that replacement, not a second one."""
        with self._seq_lock:
            agent = self._agents.get(node_id)
            if agent is None or (dead is not None and agent is dead):
                self._leases = [lease for lease in self._leases if not lease.closed]
                mine = [lease for lease in self._leases if lease.facts.get("node_id") == node_id]
                agent = core_agent(node_id)
                held = {owner: cpus for lease in mine for owner, cpus in lease.grants.items()}
                if held:  # raises what a dead node raises (ActorUnschedulableError): the caller's to map
                    ray.get(agent.hold.remote(held))
                for lease in mine:
                    lease.agent = agent
                self._agents[node_id] = agent
            return agent

    def _phase(self, trial_id: str, phase: Phase) -> None:
        """What a lease tells: to :attr:`on_phase` as it is now (set after the executor was made, or changed)."""
        notify_phase(self.on_phase, trial_id, phase)

    def _owner(self, trial: TrialSpec, attempt: int) -> str:
        with self._seq_lock:
            self._seq += 1
            return f"{trial.trial_id}#{attempt}.{self._seq}"

    # ------------------------------------------------------------------ steps
    # ------------------------------------------------------------------ what a lane calls
    def open_lease(self, trial: TrialSpec, key: str, cores: int, *, attempt: int = 1) -> _Lease:
        """A node for ``trial`` from the book, its placement group and replica actor (``cores`` reserved)."""
        bundle = bundle_for(trial, cores)
        owner = self._owner(trial, attempt)
        t0 = time.monotonic()
        try:
            node = self.book.acquire(owner, need_of(trial, cores), trial_id=trial.trial_id)
        except CannotPlace as exc:
            raise TrialFailure(ErrorKind.CANNOT_FIT, str(exc)) from None
        except Cancelled as exc:
            raise TrialFailure(ErrorKind.INTERNAL, str(exc)) from None
        waited = time.monotonic() - t0
        pg = placement_group([bundle], strategy="STRICT_PACK", name=f"trial-{trial.trial_id}-{attempt}",
                             bundle_label_selector=[{NODE_LABEL: node}])
        try:
            ray.get(pg.ready(), timeout=self.placement_timeout_s)
        except GetTimeoutError:
            remove_placement_group(pg)
            self.book.release(node, owner)
            raise TrialFailure(ErrorKind.CANNOT_FIT, f"placement group {bundle} not ready on node {node[:8]} "
                               f"after {self.placement_timeout_s:.0f} s") from None
        except BaseException:
            remove_placement_group(pg)
            self.book.release(node, owner)
            raise
        pg_ready = time.monotonic() - t0 - waited
        strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
        node_dir = str(self.home / "node" / "trials" / trial.trial_id / f"attempt-{attempt}")
        replica = ReplicaActor.options(  # type: ignore[attr-defined]  # Ray's decorator
            scheduling_strategy=strategy, num_gpus=trial.gpus, name=f"replica-{trial.trial_id}",
        ).remote(trial.model_dump_json(), node_dir)
        lease = _Lease(key, pg, strategy, replica, None, {}, book=self.book, node=node, owner=owner,
                       start_key=start_key(trial), gpus=trial.gpus, cores=cores, held_from=t0 + waited + pg_ready,
                       timelines=self.timelines, trial=trial.trial_id, on_phase=self._phase,
                       agents_lock=self._seq_lock)
        try:
            lease.facts = ray.get(replica.node_facts.remote())
            lease.agent = self._agent(lease.facts["node_id"])
            with self._seq_lock:  # from now on a replacement agent holds its grants and re-points it
                self._leases = [*(open_ for open_ in self._leases if not open_.closed), lease]
        except BaseException:
            ray.kill(replica)
            remove_placement_group(pg)
            self.book.release(node, owner)
            raise
        lease.facts.update(placement=self.policy, node_wait_s=round(waited, 3), pg_ready_s=round(pg_ready, 3),
                           replica_actor_s=round(time.monotonic() - t0 - waited - pg_ready, 3))
        return lease

    def _allocate(self, trial: TrialSpec, lease: _Lease) -> CoreGrant:
        gpu_ids = [int(g) for g in lease.facts["gpu_ids"].split(",") if g]
        lease.release_cores()  # a repinned replica gives back the previous trial's cores first
        cores = lease.cores if trial.start == "sized" else trial.cores  # sized: all of them to start on
        args = (trial.trial_id, cores, trial.client.cores, trial.client.isolation, gpu_ids)
        try:
            alloc = ray.get(lease.agent.allocate.remote(*args))
        except ActorDiedError as died:  # the node's agent is gone (OOM, ray.kill): a new one, then once more
            try:
                lease.agent = self._agent(lease.facts["node_id"], dead=lease.agent)
                alloc = ray.get(lease.agent.allocate.remote(*args))
            except ActorUnschedulableError:  # its node is gone too: the lane's NODE_DIED, as before
                raise died from None
        if isinstance(alloc, NodeError):
            raise TrialFailure(ErrorKind(alloc.kind), alloc.message)
        with self._seq_lock:
            lease.owners.append(trial.trial_id)
            lease.grants[f"{trial.trial_id}/replica"] = frozenset(alloc.replica)
            if alloc.client_isolated:  # a shared client's cores are the replica's (or not held at all)
                lease.grants[f"{trial.trial_id}/client"] = frozenset(alloc.client)
        assert isinstance(alloc, CoreGrant), f"the core agent answered {type(alloc).__name__}"
        return alloc

    def _bring_up(self, trial: TrialSpec, lease: _Lease, cores: list[int], sized_for: list[int] | None = None) -> ReplicaUp:
        """Start the replica on ``cores`` (sized for, then pinned to, ``sized_for`` under ``start: sized``),
        or re-pin the warm one there. Returns what to record."""
        fresh = not lease.started
        lease.windows = 0
        lease.mark("start" if fresh else "repin")
        up = ray.get(lease.replica.start.remote(cores, sized_for) if fresh else lease.replica.repin.remote(cores))
        if isinstance(up, NodeError):
            lease.mark("start_failed")
            raise TrialFailure(ErrorKind(up.kind), up.message)
        lease.mark("ready" if fresh else "repinned")
        lease.started = True
        assert isinstance(up, ReplicaUp), f"the replica actor answered {type(up).__name__}"
        return up

    def measure(self, trial: TrialSpec, tdir: Path, lease: _Lease, started: float) -> TrialResult:
        """One window of ``trial`` on ``lease``: cores, the replica up (or re-pinned, or shared), then the
        measurement sequence (:class:`~orchestrator.control.measure.WindowSequence`)."""
        shared = trial.start != "repin" and lease.started  # a later window of a shared start
        lease.trial = trial.trial_id
        lease.mark(STEP + "cores")
        alloc = lease.alloc if shared else self._allocate(trial, lease)
        assert alloc is not None, "a shared start's later window keeps the start's cores"
        gpu_ids = [int(g) for g in lease.facts["gpu_ids"].split(",") if g]
        # sized: the replica starts on every allocated core and is pinned to the first trial.cores of them
        # (the allocator's order: one NUMA node first); the window, its checks and accounting use those.
        start_cores = alloc.replica
        sized_for = list(alloc.replica[:trial.cores]) if trial.start == "sized" and not shared else None
        if sized_for is not None:
            alloc = replace(alloc, replica=sized_for)
        params: dict[str, Any] = {**lease.facts, **alloc.host, "replica_cpus": alloc.replica,
                                  "client_cpus": alloc.client, "client_isolated": alloc.client_isolated,
                                  "text_style": trial.factors()["text_style"], "api_servers": trial.api_servers}
        warnings: list[str] = []
        if not alloc.client_isolated:
            why = "client.isolation: share" if trial.client.isolation == "share" else "node too small"
            warnings.append(f"client shares cores with the replica ({why}): client {alloc.client}, "
                            f"replica {alloc.replica}")
        up = lease.up if shared else self._bring_up(trial, lease, start_cores, sized_for)
        assert up is not None, "a shared start's later window keeps what the start returned"
        lease.alloc, lease.up = alloc, up
        lease.windows += 1
        params.update(up.params)
        params["window_on_start"] = lease.windows  # 1 = the first window after this start (or re-pin)
        # packed: the trials sharing the node now (owners are "<trial_id>#<attempt>.<n>")
        params["neighbours"] = ",".join(sorted({o.split("#")[0] for o in self.book.neighbours(lease.node, lease.owner)}))
        if shared:
            params["start_shared_with"] = lease.owners[0]
        if params.get("repinned"):
            warnings.append("replica re-pinned live: its thread pools keep their startup size")
        lease.mark(STEP + "client")
        if lease.workload is None:  # one client process per lease: each window re-pins and re-verifies it
            lease.workload = WorkloadActor.options(  # type: ignore[attr-defined]  # Ray's decorator
                scheduling_strategy=lease.strategy).remote()
        claim = self.references.claim(trial)  # crosscheck: auto (None otherwise)
        if claim is not None:
            params["crosscheck_why"] = claim
        window = Window(trial=trial, tdir=tdir, replica=lease.replica, workload=lease.workload, up=up, alloc=alloc,
                        gpu_ids=gpu_ids, trace=self._trace(trial), warmup=not shared, mark=lease.mark,
                        references=(claim is not None) if trial.protocol.crosscheck == "auto" else None)
        ratio = None
        try:
            result = WindowSequence(window, on_step=self.on_step).run(params, warnings, started)
            ratio = result.metrics.get("crosscheck_ttft_p50_ratio") if result.ok else None
            return result
        except BaseException:  # a window that did not end cleanly: the next one gets a fresh client
            lease.drop_workload()
            raise
        finally:
            self.references.record(trial, claim, ratio)

    def failed(self, trial: TrialSpec, tdir: Path, kind: ErrorKind, message: str, facts: dict[str, Any],
               started: float) -> TrialResult:
        """A FAILED result of ``kind``, with ``error.txt`` in the attempt's folder."""
        (tdir / "error.txt").write_text(f"{kind.value}: {message}\n")
        return TrialResult.failed(trial.trial_id, kind, message, params=flat_params(facts), artifacts_dir=str(tdir),
                                  started_at=started, ended_at=time.time())


class _Lane:
    """One trial at a time, with the warm replica a repin group or a shared start keeps between trials."""

    def __init__(self, ex: RayTrialExecutor) -> None:
        self.ex = ex
        self._warm: _Lease | None = None
        self._warm_dir: Path | None = None

    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        """Run attempt ``attempt`` of ``trial``; its artifacts go to ``trials/<trial_id>/attempt-<n>/``, so a
        retry never mixes its logs with the failed attempt's (``error.txt`` stays with the attempt that failed)."""
        ex = self.ex
        started = time.time()
        tdir = ex.home / "trials" / trial.trial_id / f"attempt-{attempt}"
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "trial_spec.json").write_text(trial.model_dump_json(indent=2))
        repin = trial.start == "repin"
        share = trial.protocol.share_start and trial.start != "repin"
        key = replica_key(trial)
        warm = self._warm
        if warm is not None and not ((repin and warm.key == key) or (share and warm.start_key == start_key(trial))):
            warm.trial = trial.trial_id  # stopping the last trial's replica is this trial's wait
            self.close()
        notify_phase(ex.on_phase, trial.trial_id, "placing")  # a node and cores (a warm lease: cores only)
        lease: _Lease | None = self._warm
        facts: dict[str, Any] = {}
        ok = False
        try:
            if lease is None:
                lease = ex.open_lease(trial, key, ex.lease_cores(trial), attempt=attempt)
            facts = lease.facts
            result = ex.measure(trial, tdir, lease, started)
            lease.mark(STEP + "next")  # until the next trial's first step: the controller, the writer
            ok = result.ok
            if not ok:  # measured, then failed (the server died in the window, a thread escaped its cores)
                (tdir / "error.txt").write_text(f"{result.error_kind.value}: {result.message}\n")
                if result.error_kind is ErrorKind.SERVER_DIED:
                    ex.book.avoid(trial.trial_id, lease.node)
            return result
        except TrialFailure as exc:
            if exc.kind is ErrorKind.SERVER_DIED and lease is not None:
                ex.book.avoid(trial.trial_id, lease.node)
            return ex.failed(trial, tdir, exc.kind, str(exc), facts, started)
        except (RayActorError, ray.exceptions.NodeDiedError) as exc:
            # An exception in an actor's constructor is our bug, not a lost node: never retried.
            kind = ErrorKind.INTERNAL if getattr(exc, "actor_init_failed", False) else ErrorKind.NODE_DIED
            if lease is not None and kind is ErrorKind.NODE_DIED:
                ex.book.avoid(trial.trial_id, lease.node)  # the retry goes to another node when there is one
                ex.book.refresh()  # the book reads the cluster now, not at its next refresh: the node may be gone
            return ex.failed(trial, tdir, kind, _last_line(str(exc)), facts, started)
        except RayTaskError as exc:
            kind = _task_error_kind(exc.cause)
            return ex.failed(trial, tdir, kind, _last_line(str(exc.cause or exc)), facts, started)
        finally:
            if lease is not None:
                if (repin or share) and ok:
                    self._warm, self._warm_dir = lease, tdir
                    _write_files(tdir, ray.get(lease.replica.files.remote()))
                else:
                    lease.close(tdir)
                    if lease is self._warm:
                        self._warm = self._warm_dir = None

    def close(self) -> None:
        """Stop the warm replica, if one is left. Safe to call more than once."""
        if self._warm is not None:
            self._warm.close(self._warm_dir)
            self._warm = self._warm_dir = None


def _last_line(text: str) -> str:
    """The informative end of a Ray traceback (the full text goes to the trial's artifacts)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("^")]
    return " | ".join(lines[-3:])[:500] if lines else text


def _task_error_kind(cause: BaseException | None) -> ErrorKind:
    """The kind of an exception raised inside a Ray task (``RayTaskError.cause``), by its type.

    A bad input met on the node (a trace line or a workload setting that makes no load, a model folder or
    tokenizer, the spec, the text corpus) is the user's to fix, so it is the final ``CONFIG``: retrying it
    would fail the same way. Anything else raised in a task is our bug: ``INTERNAL``.
    """
    if isinstance(cause, (WorkloadInputError, ModelError, SpecError, CorpusError)):
        return ErrorKind.CONFIG
    return ErrorKind.INTERNAL


__all__ = ["RayTrialExecutor", "bundle_for", "need_of", "replica_key"]
