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

Every failure becomes data (``TrialResult.failed``); actor and node loss map to
the retryable ``NODE_DIED``. Capacity is released in exactly one place:
:meth:`_Lease.close`, called from ``finally`` (fresh) or when the warm replica
is no longer wanted (repin, and :meth:`RayTrialExecutor.close`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.node.cores import format_cpulist
from orchestrator.node.actors import profile_delay, BareRun, CoreGrant, NodeError, ReplicaActor, ReplicaUp, WorkloadActor, core_agent
from orchestrator.control.placement import NODE_LABEL, Cancelled, CannotPlace, Need, Node, NodeBook, Policy
from orchestrator.plan.expand import SweepPlan, TrialSpec, replica_key, start_key
from orchestrator.control.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.observe.windows import timeline_from_events
from orchestrator.observe.summary import (crosscheck_load, crosscheck_metrics, load_warnings, replay_fidelity_of,
                                          sessions_of, summarize_trial)


class TrialFailure(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self):
        return type(self), (self.kind, str(self))


def bundle_for(trial: TrialSpec, cores: int | None = None) -> dict[str, float]:
    """Ray resources of the trial's placement group (bookkeeping; enforcement is ours). The node, and so
    its hardware, is chosen by the :class:`~orchestrator.control.placement.NodeBook`, not by a resource."""
    bundle: dict[str, float] = {"CPU": float(cores or trial.cores)}
    if trial.gpus:
        bundle["GPU"] = float(trial.gpus)
    return bundle


def need_of(trial: TrialSpec, cores: int | None = None) -> Need:
    """What the trial holds on its node: the replica's cores and, unless it shares them, the client's."""
    iso = trial.client.isolation
    return Need(cores=cores or trial.cores, gpus=trial.gpus, hardware=trial.hardware,
                client=0 if iso == "share" else trial.client.cores, client_shared=iso != "require")


def _inventory() -> list[Node]:
    """The cluster's alive nodes that can run trials (a head with ``CPU: 0`` cannot)."""
    return [Node.from_ray(n) for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]


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
    closed: bool = False
    start_key: str = ""
    alloc: CoreGrant | None = None  # the cores a shared start keeps for its windows
    up: ReplicaUp | None = None  # what the start returned (URL, tokenizer, params)
    windows: int = 0  # windows measured on this start so far
    gpus: int = 0
    cores: int = 0
    held_from: float = 0.0  # when the placement group was ready (time.monotonic())
    events: list[tuple[str, float]] = field(default_factory=list)  # orchestrator.observe.windows events
    timelines: list[Any] | None = None  # the executor's list this lease's timeline goes to when it closes

    def mark(self, event: str) -> None:
        self.events.append((event, time.monotonic()))

    def release_cores(self) -> None:
        for owner in self.owners:
            self.agent.release.remote(owner)
        self.owners.clear()

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


class RayTrialExecutor:
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
        self.max_cores: dict[str, int] = {}
        for t in plan.trials if plan else ():
            k = replica_key(t)
            self.max_cores[k] = max(self.max_cores.get(k, 0), t.cores)
        self._lanes: list[_Lane] = []
        self._default: _Lane | None = None
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._traces: dict[str, tuple[str, Any]] = {}
        self.timelines: list[Any] = []  # one orchestrator.observe.windows.LeaseTimeline per closed lease

    # ------------------------------------------------------------------ public
    def lane(self) -> "_Lane":
        """A new lane: runs one trial at a time, keeps its own warm replica (repin, shared start)."""
        lane = _Lane(self)
        self._lanes.append(lane)
        return lane

    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        if self._default is None:
            self._default = self.lane()
        return self._default.execute(trial, attempt=attempt)

    def capacity(self, trials: list[TrialSpec]) -> int:
        """How many of ``trials`` the cluster holds at once under the policy (what the controller runs)."""
        return self.book.capacity([need_of(t, self.lease_cores(t)) for t in trials])

    def lease_cores(self, trial: TrialSpec) -> int:
        """The cores a trial's lease reserves: a repin or sized group's largest count (its replica starts there)."""
        if trial.start == "fresh":
            return trial.cores
        return self.max_cores.get(replica_key(trial), trial.cores)  # repin, sized: the group's most

    def cancel(self) -> None:
        """The sweep is stopping: trials waiting for a node stop waiting."""
        self.book.cancel()

    def close(self) -> None:
        """Stop every lane's warm replica, if one is left. Safe to call more than once."""
        for lane in self._lanes:
            lane.close()

    def _trace(self, trial: TrialSpec) -> tuple[str, Any] | None:
        """The workload's trace file, through Ray's object store: ``(content hash, ObjectRef of its bytes)``.

        A worker node has no access to the driver's disk, so the file is read here once and put in
        the object store; the workload actor writes it to a node-local file named by its hash."""
        path = getattr(trial.workload, "path", None)
        if path is None:
            return None
        key = str(path)
        with self._seq_lock:
            if key not in self._traces:
                data = Path(path).read_bytes()
                self._traces[key] = (hashlib.sha256(data).hexdigest()[:16], ray.put(data))
            return self._traces[key]

    def _owner(self, trial: TrialSpec, attempt: int) -> str:
        with self._seq_lock:
            self._seq += 1
            return f"{trial.trial_id}#{attempt}.{self._seq}"

    # ------------------------------------------------------------------ steps
    def _lease(self, trial: TrialSpec, key: str, cores: int, *, attempt: int = 1) -> _Lease:
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
        replica = ReplicaActor.options(
            scheduling_strategy=strategy, num_gpus=trial.gpus, name=f"replica-{trial.trial_id}",
        ).remote(trial.model_dump_json(), node_dir)
        lease = _Lease(key, pg, strategy, replica, None, {}, book=self.book, node=node, owner=owner,
                       start_key=start_key(trial), gpus=trial.gpus, cores=cores, held_from=t0 + waited + pg_ready,
                       timelines=self.timelines)
        try:
            lease.facts = ray.get(replica.node_facts.remote())
            lease.agent = core_agent(lease.facts["node_id"])
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
        alloc = ray.get(lease.agent.allocate.remote(trial.trial_id, cores, trial.client.cores,
                                                    trial.client.isolation, gpu_ids))
        if isinstance(alloc, NodeError):
            raise TrialFailure(ErrorKind(alloc.kind), alloc.message)
        lease.owners.append(trial.trial_id)
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
        return up

    def _measure(self, trial: TrialSpec, tdir: Path, lease: _Lease, started: float) -> TrialResult:
        shared = trial.start != "repin" and lease.started  # a later window of a shared start
        alloc = lease.alloc if shared else self._allocate(trial, lease)
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
        checks = {"replica_start": ray.get(lease.replica.verify.remote())}
        workload = WorkloadActor.options(scheduling_strategy=lease.strategy).remote()
        spec_json = trial.workload.model_dump_json()
        trace = self._trace(trial)
        bare: BareRun | NodeError | None = None
        try:
            checks["client"] = ray.get(workload.pin.remote(alloc.client))
            proto = trial.protocol
            if proto.warmup_s > 0 and not shared:  # unmeasured: same load shape, other seed; reset below
                warm = trial.workload.model_copy(update={"seed": trial.workload.seed + 1, "max_duration_s": proto.warmup_s,
                                                         "client_tokenize": "off"})
                lease.mark("warmup")
                # telemetry.gpu_profile: captured here, where the stall of vLLM's trace write costs no window
                profiling = ray.get(lease.replica.begin_gpu_profile.remote(
                    profile_delay(proto.warmup_s, trial.telemetry.gpu_profile.seconds)))
                ray.get(workload.run.remote(warm.model_dump_json(), up.base_url, trial.model.name,
                                            up.tokenizer_path, trace))
                if profiling:
                    ray.get(lease.replica.end_gpu_profile.remote())
                lease.mark("warmup_end")
            params["warmup_s"] = proto.warmup_s

            bare_load: dict[str, float] = {}  # other work on the replica's cores during the bare run

            def cross_check() -> BareRun | NodeError:
                # Same start state as the window: an empty prefix cache on the same warm server.
                if not ray.get(lease.replica.reset_prefix_cache.remote()):
                    return NodeError("internal", "the prefix cache could not be reset before the bare run")
                ray.get(lease.replica.begin_side_accounting.remote())
                lease.mark("crosscheck")
                try:
                    return ray.get(workload.bare.remote(spec_json, up.base_url, trial.model.name,
                                                        up.tokenizer_path, _bare_timeout(trial), trace))
                finally:
                    lease.mark("crosscheck_end")
                    bare_load.update(ray.get(lease.replica.end_side_accounting.remote()))

            # Odd repeats run the bare client first, so an order effect between the two runs
            # shows up as a difference between repeats instead of hiding in the ratio.
            xcheck = proto.crosschecks(trial.cores)
            bare_first = xcheck and trial.repeat % 2 == 1
            if xcheck:
                params["crosscheck_order"] = "bare-first" if bare_first else "harness-first"
            if bare_first:
                bare = cross_check()
            params.update(ray.get(lease.replica.begin_window.remote(alloc.client, gpu_ids)))
            lease.mark("window")
            run = ray.get(workload.run.remote(spec_json, up.base_url, trial.model.name, up.tokenizer_path, trace))
            lease.mark("window_end")
            window = ray.get(lease.replica.end_window.remote(len(run.records)))
            checks["client_end"] = ray.get(workload.verify.remote())
            if xcheck and not bare_first and window["alive"]:
                bare = cross_check()
        finally:
            ray.kill(workload)
        if window["alive"]:
            checks["replica_end"] = ray.get(lease.replica.verify.remote())
        (tdir / "verified_cores.json").write_text(json.dumps(checks, indent=2))
        warnings.extend(run.warnings)
        if params.get("prefix_cache_reset") is False:
            warnings.append("the prefix cache could not be reset before the window: it did not start empty")
        metrics = summarize_trial(run, window["server"], window["rows"], slo=trial.slo)
        metrics.update(window.get("accounting", {}))
        metrics.update(window.get("attribution", {}))
        params.update(window.get("attribution_params", {}))
        fidelity = replay_fidelity_of(sessions_of(trial), run.records, window.get("block_size"),
                                      metrics.get("prefix_hit_rate"))
        if fidelity is not None:
            metrics.update(fidelity.metrics)
            params["replay_fidelity"] = fidelity.diagnosis
        if up.repin_s is not None and lease.windows == 1:
            metrics["repin_s"] = up.repin_s
        if lease.windows == 1 and not params.get("repinned"):  # the start this window followed
            metrics.update(up.startup)
        if isinstance(bare, NodeError):
            warnings.append(f"cross-check failed: {bare.message}")
        elif bare is not None:
            (tdir / "bare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bare.rows))
            metrics.update(crosscheck_metrics(run.records, bare.rows))
            metrics.update(crosscheck_load(metrics, bare_load))
        warnings.extend(load_warnings(metrics))
        status, kind, message = TrialStatus.COMPLETED, ErrorKind.NONE, ""
        bad = [k for k, v in checks.items() if not v.get("ok", False)]
        if not window["alive"]:
            status, kind, message = TrialStatus.FAILED, ErrorKind.SERVER_DIED, "vLLM exited during the window"
        elif bad:
            status, kind = TrialStatus.FAILED, ErrorKind.RESTRICTION_VIOLATED
            message = "threads outside their core set in: " + ", ".join(
                f"{k} ({'; '.join(checks[k].get('violations', [])[:3])})" for k in bad)
        return TrialResult(trial_id=trial.trial_id, status=status, error_kind=kind, message=message,
                           records=tuple(run.records), metrics=metrics, params=_flat(params),
                           warnings=tuple(warnings), artifacts_dir=str(tdir), telemetry=tuple(window["rows"]),
                           started_at=started, ended_at=time.time())

    def _failed(self, trial: TrialSpec, tdir: Path, kind: ErrorKind, message: str, facts: dict,
                started: float) -> TrialResult:
        (tdir / "error.txt").write_text(f"{kind.value}: {message}\n")
        return TrialResult.failed(trial.trial_id, kind, message, params=_flat(facts), artifacts_dir=str(tdir),
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
            self.close()
        lease: _Lease | None = self._warm
        facts: dict[str, Any] = {}
        ok = False
        try:
            if lease is None:
                lease = ex._lease(trial, key, ex.lease_cores(trial), attempt=attempt)
            facts = lease.facts
            result = ex._measure(trial, tdir, lease, started)
            ok = result.ok
            if not ok:  # measured, then failed (the server died in the window, a thread escaped its cores)
                (tdir / "error.txt").write_text(f"{result.error_kind.value}: {result.message}\n")
                if result.error_kind is ErrorKind.SERVER_DIED:
                    ex.book.avoid(trial.trial_id, lease.node)
            return result
        except TrialFailure as exc:
            return ex._failed(trial, tdir, exc.kind, str(exc), facts, started)
        except (RayActorError, ray.exceptions.NodeDiedError) as exc:
            # An exception in an actor's constructor is our bug, not a lost node: never retried.
            kind = ErrorKind.INTERNAL if "creation task" in str(exc) else ErrorKind.NODE_DIED
            if lease is not None and kind is ErrorKind.NODE_DIED:
                ex.book.avoid(trial.trial_id, lease.node)  # the retry goes to another node when there is one
            return ex._failed(trial, tdir, kind, _last_line(str(exc)), facts, started)
        except RayTaskError as exc:
            kind = _task_error_kind(exc.cause, str(exc))  # str() holds the remote traceback
            return ex._failed(trial, tdir, kind, _last_line(str(exc.cause or exc)), facts, started)
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


def _bare_timeout(trial: TrialSpec) -> float:
    """The bare run's own deadline: its window, every request's deadline after it, and start-up slack."""
    w = trial.workload
    return w.max_duration_s + w.request_timeout_s + 120.0


def _last_line(text: str) -> str:
    """The informative end of a Ray traceback (the full text goes to the trial's artifacts)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("^")]
    return " | ".join(lines[-3:])[:500] if lines else text


def _task_error_kind(cause: BaseException | None, traceback: str = "") -> ErrorKind:
    """The kind of an exception raised inside a Ray task (``RayTaskError.cause``).

    A bad input met on the node (a trace line, a model folder or tokenizer, the spec, the text
    corpus) is the user's to fix, so it is the final ``CONFIG``: retrying it would fail the same
    way. So is a plain ValueError raised by a loader (its traceback passes through
    ``workloads/loaders/``). Anything else raised in a task is our bug: ``INTERNAL``.
    """
    from orchestrator.plan.models import ModelError
    from orchestrator.plan.spec import SpecError
    from workloads.corpus import CorpusError
    from workloads.loaders import TraceError

    if isinstance(cause, (TraceError, ModelError, SpecError, CorpusError)):
        return ErrorKind.CONFIG
    if isinstance(cause, ValueError) and "workloads/loaders/" in traceback:
        return ErrorKind.CONFIG
    return ErrorKind.INTERNAL


def _flat(params: dict[str, Any]) -> dict[str, str]:
    """MLflow params are strings; core sets use the Linux cpu-list form ("0-3,8") everywhere."""
    out = {}
    for k, v in params.items():
        if isinstance(v, (list, tuple, set, frozenset)):
            v = format_cpulist(v) if k.endswith("_cpus") else ",".join(str(x) for x in sorted(v))
        out[k] = str(v)
    return out


__all__ = ["RayTrialExecutor", "bundle_for", "need_of", "replica_key"]
