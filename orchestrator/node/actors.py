"""What runs on a node: the per-node core agent, the replica actor and the workload actor.

Ray's CPU resources are bookkeeping only; these actors enforce the restriction:
the core agent hands out disjoint core sets on its node, the replica actor
starts vLLM restricted to its set (and verifies every thread), and the workload
actor pins itself to the client's set, disjoint from the replica's.
Files produced on the node travel back as bytes, so the driver needs no shared disk.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from orchestrator.infra import survivors
from orchestrator.node.accounting import CoreAccounting, CoreReading, span_figures
from orchestrator.node.attribution import RoleAccounting, RoleWindow, Snapshot, span_window
from orchestrator.node.cores import CannotFit, CoreAllocator, NodeTopology, format_cpulist
from orchestrator.node.gpu_profile import GpuProfileCapture
from orchestrator.node.hostfacts import host_facts
from orchestrator.plan.models import ModelError, build_shape, tokenizer_file
from orchestrator.values.trial import TrialSpec
from orchestrator.node.replica import ReplicaError, VllmReplica, free_port
from orchestrator.node.restrict import throttling, tree_pids, verify_self
from orchestrator.node.stacks import StackSampler, coverage
from orchestrator.node.restrict import Verification
from orchestrator.node.telemetry import TelemetrySampler, delta, rows_in_span, scrape, span_readings
from orchestrator.values.wire import BareRun, CoreGrant, NodeError, ReplicaUp, ServerStatus, WindowFigures, WindowSpan


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

    def allocate(self, trial_id: str, replica_cores: int, client_cores: int, isolation: str,
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
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeCoreAgent.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
    ).remote()


def span_bounds(span: WindowSpan, started_at: float) -> tuple[float, float]:
    """The span in the sampler's seconds (row ``t``, counter reading ``t``), given the sampler's start on
    the monotonic clock (pure)."""
    return span.start_ns / 1e9 - started_at, span.end_ns / 1e9 - started_at


def window_series(rows: list[dict[str, Any]], started_at: float, sampled_s: float, span: WindowSpan,
                  wall_offset: float | None = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The telemetry rows inside the requests' span, and the span's facts (pure).

    ``started_at`` is the sampler's start on the monotonic clock (row ``t`` 0), ``sampled_s`` how long
    it sampled. Returns (rows in the span, {``window_span_s``, ``window_drain_s``,
    ``telemetry_outside_span_s``}): what the means are taken over, and how much sampled time was left out;
    with ``wall_offset`` (``time.time() - time.monotonic()``) also the span's bounds in Unix seconds."""
    t0, t1 = span_bounds(span, started_at)
    facts = {"window_span_s": round(max(0.0, t1 - t0), 3),
             "window_drain_s": round(max(0.0, (span.end_ns - span.window_end_ns) / 1e9), 3),
             "telemetry_outside_span_s": round(max(0.0, sampled_s - max(0.0, t1 - t0)), 3)}
    if wall_offset is not None:  # the span on the wall clock, to line it up with samplers of other tools
        facts["window_span_start_unix"] = round(span.start_ns / 1e9 + wall_offset, 3)
        facts["window_span_end_unix"] = round(span.end_ns / 1e9 + wall_offset, 3)
    return rows_in_span(rows, t0, t1), facts


@dataclass(frozen=True)
class CounterReading:
    """One reading of a window's cumulative counters (the sampler takes one every period): the replica's
    cores and tree (:class:`~orchestrator.node.accounting.CoreReading`) and its processes by role."""

    cores: CoreReading
    roles: Snapshot


def window_counters(readings: Sequence[tuple[float, CounterReading]], t0: float, t1: float, root: int,
                    ncores: int) -> tuple[dict[str, float], RoleWindow | None, dict[str, float]]:
    """The CPU accounting and the per-role figures over ``[t0, t1]`` (the requests' span, in the sampler's
    seconds) from the sampler's counter readings ``(t, reading)`` (pure).

    Both come from the same two readings, the first and the last inside the span
    (:func:`~orchestrator.node.telemetry.span_readings`), their differences scaled to the span's length;
    the foreign share divides by the span's seconds times ``ncores``. Returns (accounting metrics, role
    window or None without two readings apart, {``accounting_s``: the seconds between the two readings}).
    """
    pair = span_readings([t for t, _ in readings], t0, t1)
    if pair is None:
        return {}, None, {}
    (ta, a), (tb, b) = readings[pair[0]], readings[pair[1]]
    covered, span_s = tb - ta, max(0.0, t1 - t0)
    return (span_figures(a.cores, b.cores, covered, span_s, ncores),
            span_window(a.roles, b.roles, root, covered, span_s), {"accounting_s": round(covered, 3)})


def pin_process(cpus: list[int]) -> None:
    """Pin this process and every thread it has now to ``cpus``: Ray starts its own threads before
    any actor method runs, so the process mask alone is not enough."""
    from workloads.bare import pin

    pin(set(cpus))


def reset_prefix_cache(base_url: str, attempts: int = 20, wait_s: float = 0.25) -> bool:
    """POST /reset_prefix_cache until vLLM says it worked. vLLM refuses while blocks are still held
    (a request finishing, a KV transfer), answering ``{"success": false}``; older releases answer a bare 200."""
    for _ in range(attempts):
        req = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
            ok = resp.status == 200
        try:
            ok = ok and bool(json.loads(body).get("success", True))
        except (ValueError, AttributeError):
            pass  # not JSON: the status is all there is
        if ok:
            return True
        time.sleep(wait_s)
    return False


def profile_delay(run_s: float, capture_s: float) -> float:
    """When the GPU capture starts after a run of ``run_s`` opens: a quarter in (the load has ramped up),
    at most 10 s, and early enough that a ``capture_s`` capture ends inside the run."""
    return max(0.0, min(10.0, run_s / 4, run_s - capture_s - 1.0))


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
        # workdir is <home>/node/trials/<trial_id>/attempt-<n>: models and compile caches are shared
        # by every trial under <home>/node; <home>/services.json lists what a dead run left behind.
        self.node_home = self.workdir.parents[2]
        self.home = self.workdir.parents[3]
        self.replica: VllmReplica | None = None
        self.sampler: TelemetrySampler | None = None
        self.accounting: CoreAccounting | None = None
        self.side_accounting: CoreAccounting | None = None
        self.roles: RoleAccounting | None = None
        self.stacks: StackSampler | None = None
        self.gpu_capture: GpuProfileCapture | None = None
        self._profiled: str | None = None  # where this start's GPU profile was captured: warmup, window
        self._profile_result: tuple[dict[str, float], dict[str, str]] | None = None
        self._windows = 0
        self.before: Any = None
        self.cpu_stat_before: dict[str, int] = {}
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
            return str(build_shape(m.shape, self.node_home / "models" / m.shape))
        return m.id

    def start(self, cores: list[int], sized_for: list[int] | None = None) -> ReplicaUp | NodeError:
        """Start vLLM restricted to ``cores`` and wait until healthy; errors come back as data.

        ``sized_for`` (``start: sized``): start on ``cores`` with thread pools sized for these, a subset,
        and pin the healthy server to them; the pin's seconds come back as ``repin_s``."""
        model_dir = self.model_dir()
        try:  # before vLLM starts: a model without a usable tokenizer is the user's to fix
            self.tokenizer_path = tokenizer_file(model_dir)
        except ModelError as exc:
            return NodeError("config", str(exc))
        # Compile caches live beside the trials and are shared by them, so restarts are warm.
        cls = VllmReplica
        if self.trial.server.stack == "ray-serve":  # Ray Serve LLM on a Ray of its own, same interface
            from orchestrator.node.serve_replica import ServeReplica as cls
        replica = cls(self.trial, model_dir, frozenset(cores), free_port(), self.workdir,
                      self.trial.restriction, scratch_dir=self.node_home / "scratch",
                      sized_for=frozenset(sized_for) if sized_for else None)
        with self._lock:  # either stop() comes first and nothing starts, or it sees the process to kill
            if self._stopped:
                return NodeError("internal", "stopped before vLLM started")
            self.replica = replica
            try:
                replica.start()
            except ReplicaError as exc:
                return NodeError(exc.kind.value, str(exc))
            # So that the next run ends this server if the driver dies without stopping it.
            survivors.record(self.home, "vllm", replica.pid)
        try:
            replica.wait_healthy(self.trial.server.startup_timeout_s)
        except ReplicaError as exc:
            return NodeError(exc.kind.value, str(exc))

        phases = self.replica.startup()  # figures are metrics, cache states and sources are params
        extra: dict[str, Any] = {}
        pinned_s = None
        if sized_for:
            extra["sized_start_cpus"] = format_cpulist(replica.cores)
            try:
                pinned_s = replica.repin(frozenset(sized_for))
            except ReplicaError as exc:
                return NodeError(exc.kind.value, str(exc))
        return ReplicaUp(base_url=self.replica.base_url, tokenizer_path=self.tokenizer_path,
                         params={**self.replica.params(), "repinned": False, **extra,
                                 **{k: v for k, v in phases.items() if isinstance(v, str)}},
                         model_dir=model_dir, repin_s=pinned_s,
                         startup={k: float(v) for k, v in phases.items() if not isinstance(v, str)})

    def repin(self, cores: list[int]) -> ReplicaUp | NodeError:
        """Move the live replica to ``cores`` and empty its prefix cache, so the next trial starts cold."""
        assert self.replica is not None
        self._profiled = None  # a profile per core count of a repin group
        try:
            seconds = self.replica.repin(frozenset(cores))
        except ReplicaError as exc:
            return NodeError(exc.kind.value, str(exc))
        # The prefix cache is emptied by begin_window, as for every window of a repin group.
        return ReplicaUp(base_url=self.replica.base_url, tokenizer_path=self.tokenizer_path,
                         params={**self.replica.params(), "repinned": True}, repin_s=seconds)

    def files(self) -> dict[str, bytes]:
        """The node-side files so far (the replica keeps running)."""
        return {f.name: f.read_bytes() for f in self.workdir.iterdir()
                if f.is_file() and f.stat().st_size < 64 << 20}

    def verify(self) -> Verification:
        assert self.replica is not None
        return self.replica.verify()

    def status(self) -> ServerStatus:
        """Is the server process still running? With the end of its log when it is not."""
        if self.replica is None:
            return ServerStatus(False, "no server was started")
        if self.replica.alive():
            return ServerStatus(True)
        log = getattr(self.replica, "log_path", None)
        tail = ""
        if log is not None and Path(log).exists():
            tail = Path(log).read_bytes()[-4000:].decode(errors="replace")
        return ServerStatus(False, tail)

    def reset_prefix_cache(self) -> bool:
        assert self.replica is not None
        return reset_prefix_cache(self.replica.base_url)

    def begin_side_accounting(self) -> None:
        """Start counting other work on the replica's cores outside the window (the bare cross-check's run)."""
        assert self.replica is not None
        root = self.replica.pid
        self.side_accounting = CoreAccounting(tuple(sorted(self.replica.cores)), lambda: tree_pids(root)).start()

    def end_side_accounting(self) -> dict[str, float]:
        side, self.side_accounting = self.side_accounting, None
        return side.stop() if side is not None else {}

    def begin_window(self, client_cpus: list[int], gpu_ids: list[int]) -> dict[str, Any]:
        """Set the window's start state (the protocol), take the before-scrape, start sampling.

        This actor moves onto the client's cores first, so its sampling threads never run on the
        cores under test (Ray placed it anywhere on the node).
        """
        assert self.replica is not None
        pin_process(client_cpus)
        t = self.trial
        facts: dict[str, Any] = {"telemetry_cpus": format_cpulist(client_cpus)}
        if t.protocol.reset_prefix_cache or t.start == "repin":
            facts["prefix_cache_reset"] = self.reset_prefix_cache()
        else:
            facts["prefix_cache_reset"] = "off"
        self.before = scrape(self.replica.base_url)
        self.cpu_stat_before = self.replica.cpu_stat()
        tel = t.telemetry
        root = self.replica.pid
        # The CPU accounting and the roles are read by the sampler, every period, with its samples:
        # end_window takes the figures from the readings inside the requests' span (window_counters).
        cores = CoreAccounting(tuple(sorted(self.replica.cores)), lambda: tree_pids(root)).start()
        roles = RoleAccounting(root, lambda: tree_pids(root))
        self.accounting, self.roles = cores, roles
        self.sampler = TelemetrySampler(replica_cpus=sorted(self.replica.cores), client_cpus=client_cpus,
                                        metrics_url=self.replica.base_url if tel.metrics_hz > 0 else None,
                                        hz=tel.host_hz, metrics_hz=tel.metrics_hz or 1.0,
                                        gpu_indices=gpu_ids or None, gpu_reader=tel.gpu and t.gpus > 0,
                                        counters=lambda: CounterReading(cores.read(), roles.read()))
        self.sampler.start()
        st = tel.stacks
        self.stacks = (StackSampler(root, rate_hz=st.rate_hz, native=st.native, gpu=t.gpus > 0).start()
                       if st.enabled else None)
        if self._profiled is None and t.telemetry.gpu_profile.enabled:  # no warm-up captured it
            if t.gpus > 0:  # inside the window, once the load runs
                self.begin_gpu_profile(profile_delay(t.workload.max_duration_s, t.telemetry.gpu_profile.seconds))
                if self.gpu_capture is not None:
                    self._profiled = "window"
            else:  # a CPU trial: never a stall inside a window
                facts["gpu_profile_status"] = ("not captured: a CPU-only trial captures only in a warm-up "
                                               "(protocol.warmup_s)")
        if self._profile_result is not None or self.gpu_capture is not None:  # this window carries it
            facts["gpu_profile_in"] = self._profiled
        return facts

    def begin_gpu_profile(self, delay_s: float) -> bool:
        """Start the GPU profile's capture ``delay_s`` from now (``telemetry.gpu_profile``); False when off.

        The executor calls it around the unmeasured warm-up when there is one: vLLM writes the trace
        inside its engine loop at /stop_profile, which stalls every request for seconds, so a capture
        inside the measured window would cost that window its TTFT."""
        gp = self.trial.telemetry.gpu_profile
        if not gp.enabled or self.replica is None or self.replica.profile_dir is None:
            return False
        self.gpu_capture = GpuProfileCapture(base_url=self.replica.base_url, trace_dir=self.replica.profile_dir,
                                             seconds=gp.seconds, delay_s=delay_s).start()
        return True

    def end_gpu_profile(self) -> tuple[dict[str, float], dict[str, str]]:
        """Finish the capture begun by :meth:`begin_gpu_profile`: (metrics, params), kept for the window's
        figures; the next window of this start captures nothing more."""
        capture, self.gpu_capture = self.gpu_capture, None
        if capture is None:
            return {}, {}
        self._profile_result = capture.stop(timeout_s=self._profile_timeout())
        self._profiled = "warmup"
        return self._profile_result

    def _profile_timeout(self) -> float:
        return max(120.0, 10 * self.trial.telemetry.gpu_profile.seconds)

    def end_window(self, requests: int | None = None, span: WindowSpan | None = None) -> WindowFigures:
        """Stop sampling and take the after-scrape; ``requests`` (sent in the window) makes the per-request
        CPU figures of the attribution.

        ``span`` (the requests' first send to last completion) bounds every figure of the window: the
        samples the means are taken over (:func:`window_series`), the counter readings the CPU accounting
        and the roles come from (:func:`window_counters`), and the seconds the server's token rates divide
        by. Without a span (no request recorded), the sampler's whole life."""
        assert self.replica is not None
        sampler, self.sampler = self.sampler, None
        rows = sampler.stop() if sampler else []  # with the counters' last reading
        span_rows, span_facts = rows, {}
        accounting: dict[str, float] = {}
        roles: RoleWindow | None = None
        span_s: float | None = None
        if sampler is not None:
            readings = sampler.counter_readings
            if span is not None:
                span_rows, facts = window_series(rows, sampler.started_at, sampler.sampled_s, span,
                                                 wall_offset=time.time() - time.monotonic())
                span_facts.update(facts)
                t0, t1 = span_bounds(span, sampler.started_at)
                span_s = max(0.0, t1 - t0)
            else:
                t0, t1 = (readings[0][0], readings[-1][0]) if readings else (0.0, 0.0)
            accounting, roles, facts = window_counters(readings, t0, t1, self.replica.pid, len(self.replica.cores))
            span_facts.update(facts)
        # CFS bandwidth control over the window (quota; the group's own counters, begin_window to here)
        accounting.update(throttling(self.cpu_stat_before, self.replica.cpu_stat()))
        self.accounting = self.roles = None
        attribution, attribution_params = self._attribution(requests, roles)
        if self.gpu_capture is not None:  # captured in this window
            capture, self.gpu_capture = self.gpu_capture, None
            self._profile_result = capture.stop(timeout_s=self._profile_timeout())
        if self._profile_result is not None:  # this window's capture, or the warm-up's before it
            attribution.update(self._profile_result[0])
            attribution_params.update(self._profile_result[1])
            self._profile_result = None
        alive = self.replica.alive()
        try:
            after = scrape(self.replica.base_url) if alive else None
        except OSError:  # the server died or stopped answering: the trial fails as SERVER_DIED, not here
            after, alive = None, False
        server = delta(self.before, after, span_s) if self.before is not None and after is not None else {}
        block = self.before.block_size() if self.before is not None else None
        return WindowFigures(server=server, rows=rows, span_rows=span_rows, alive=alive,
                             block_size=block or self.trial.server.block_size, accounting=accounting,
                             attribution=attribution, attribution_params=attribution_params, span=span_facts)

    def _attribution(self, requests: int | None, roles: RoleWindow | None) -> tuple[dict[str, float], dict[str, str]]:
        """CPU time per process role over the span (``roles``, from :func:`window_counters`), and with
        ``telemetry.stacks`` the sampled stacks by category, sharing out the span's CPU time (py-spy's raw
        stacks carry no time, so their shares are of the whole window); the collapsed stacks are written
        beside the trial's files (``stacks-w<window>-<role>.collapsed``)."""
        metrics, params = (roles.metrics(requests), roles.params()) if roles is not None else ({}, {})
        self._windows += 1
        if self.stacks is not None:
            window, self.stacks = self.stacks.stop(roles), None
            stack_metrics = window.metrics(requests)
            metrics.update(stack_metrics)
            metrics.update(coverage(stack_metrics, metrics))
            params.update(window.params())
            for name, data in window.files().items():
                (self.workdir / name.replace("stacks-", f"stacks-w{self._windows}-", 1)).write_bytes(data)
        return metrics, params

    def stop(self) -> dict[str, bytes]:
        """Stop everything this actor started and return the node-side artifacts as bytes."""
        with self._lock:
            self._stopped = True
        if self.sampler is not None:
            self.sampler.stop()
        if self.stacks is not None:  # a window cut short: py-spy must not outlive it
            self.stacks.stop()
        if self.replica is not None:
            report = self.replica.stop()
            if self.replica.pid is not None and not report.get("leftover_pids"):
                survivors.forget(self.home, self.replica.pid)
        return self.files()


def localize(workload_json: str, trace: tuple[str, Any] | None) -> str:
    """The workload with its trace ``path`` pointing at a node-local copy of the driver's file.

    ``trace`` is ``(content hash, bytes)`` (Ray resolves the driver's ObjectRef before the call), or
    ``(hash, ObjectRef)`` nested in a tuple, fetched here. The copy lives under the node's temp folder,
    named by the hash, so every trial on the node shares one copy and a changed file is a new one."""
    if trace is None:
        return workload_json
    digest, data = trace
    if isinstance(data, ray.ObjectRef):
        data = ray.get(data)
    spec = json.loads(workload_json)
    name = Path(spec["path"]).name
    local = Path(tempfile.gettempdir()) / "orchestrator-traces" / f"{digest}-{name}"
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_suffix(local.suffix + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, local)
    spec["path"] = str(local)
    return json.dumps(spec)


@ray.remote(num_cpus=0)
class WorkloadActor:
    """Replays one workload from cores disjoint from the replica's (verified on every thread)."""

    def __init__(self) -> None:
        self.cpus: frozenset[int] = frozenset()
        self._prepared: Any = None  # workloads.run_workload.Prepared, built before the window
        self._prepared_for: tuple[str, str] | None = None  # the (workload, tokenizer) it was built for
        self._loaded: Any = None  # workloads.run_workload.Loaded, the window's load phase

    def pin(self, cpus: list[int]) -> Verification:
        pin_process(cpus)
        self.cpus = frozenset(cpus)
        return self.verify()

    def verify(self) -> Verification:
        """Every thread of this process, against the client's cores (at the window's start and end)."""
        return verify_self(self.cpus)

    def bare(self, workload_json: str, base_url: str, model: str, tokenizer_path: str,
             timeout_s: float, trace: tuple[str, Any] | None = None) -> BareRun | NodeError:
        """Replay the workload with the bare client (workloads.bare) in a plain child process on this
        actor's cores: no actor and no telemetry in the request path. Returns its per-request rows."""
        workload_json = localize(workload_json, trace)
        with tempfile.TemporaryDirectory(prefix="bare-") as tmp:
            spec_path, out_path = Path(tmp) / "workload.json", Path(tmp) / "bare.jsonl"
            spec_path.write_text(workload_json)
            cmd = [sys.executable, "-m", "workloads.bare", "--base-url", base_url, "--model", model,
                   "--tokenizer", tokenizer_path, "--workload-json", str(spec_path), "--out", str(out_path),
                   "--cpus", ",".join(str(c) for c in sorted(self.cpus))]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if proc.returncode != 0:
                return NodeError("internal", f"bare client exited with {proc.returncode}: {proc.stderr.strip()[-800:]}")
            rows = [json.loads(line) for line in out_path.read_text().splitlines() if line.strip()]
        return BareRun([r for r in rows if "request_id" in r])

    def run(self, workload_json: str, base_url: str, model: str, tokenizer_path: str,
            trace: tuple[str, Any] | None = None) -> Any:
        """Prepare, load and tokenize in one call (the unmeasured warm-up)."""
        from workloads import run_workload_sync

        spec = _workload_spec(localize(workload_json, trace))
        return run_workload_sync(spec, base_url=base_url, model=model, tokenizer_path=tokenizer_path)

    def prepare(self, workload_json: str, tokenizer_path: str, trace: tuple[str, Any] | None = None) -> int:
        """Build the window's text and sessions now, before its span opens; returns the session count.

        The same workload as the last window's (the next window of this lease: a re-pin, a repeat) reuses what
        was built: the text is rendered from seeds in the spec, and a load reads the sessions without changing
        them, so it is the same text. Only the tokenizer's word cache is cleared, so every window starts as a
        freshly built one did. (Building took 1.25 s per window on the H200's recorded agent sessions, 6% of
        a re-pinned grid's GPU-held time.)"""
        from workloads.run_workload import prepare

        key = (localize(workload_json, trace), tokenizer_path)
        if self._prepared is None or self._prepared_for != key:
            self._prepared, self._prepared_for = prepare(_workload_spec(key[0]), tokenizer_path), key
        else:
            clear = getattr(self._prepared.factory.tokenizer.model, "_clear_cache", None)
            if clear is not None:
                clear()
        self._loaded = None
        return len(self._prepared.sessions)

    def load(self, base_url: str, model: str) -> Any:
        """The window's requests and nothing else (``prepare`` first); ``finish`` adds the client counts."""
        from workloads.run_workload import load_sync

        assert self._prepared is not None, "prepare() first"
        self._loaded = load_sync(self._prepared, base_url=base_url, model=model)
        return self._loaded.run

    def bench(self, base_url: str, model: str, model_dir: str, timeout_s: float) -> BareRun | NodeError:
        """Replay the prompts the last window sent with vLLM's own ``vllm bench serve`` (``workloads.benchserve``),
        turn-major at the window's concurrency, from a child process on this actor's cores; after ``load``."""
        from workloads import benchserve
        from workloads.run_workload import strategy_for

        if self._prepared is None or self._loaded is None:
            return NodeError("internal", "vllm bench serve replays a window's prompts: run the window first")
        spec, result = self._prepared.spec, self._loaded.result
        if spec.client_tokenize != "after":
            return NodeError("internal", "vllm bench serve needs the window's prompts, kept only with "
                                         "client_tokenize: after")
        try:
            items = benchserve.window_items(self._prepared.sessions, [r.request_id for r in result.records],
                                            result.prompt)
        except benchserve.BenchServeError as exc:
            return NodeError("internal", f"vllm bench serve: {exc}")
        with tempfile.TemporaryDirectory(prefix="benchserve-") as tmp:
            out = benchserve.run_bench_serve(base_url, model, model_dir, items, strategy_for(spec).slots, tmp,
                                             cpus=sorted(self.cpus), timeout_s=timeout_s)
        if isinstance(out, benchserve.BenchServeFailure):
            return NodeError("internal", f"vllm bench serve ({out.kind}): {out.message}"[-1200:])
        return BareRun([dict(r) for r in out.rows], client="vllm-bench")

    def finish(self) -> Any:
        """The window's run with ``client_tokenize: after`` applied, outside the measured span."""
        from workloads.run_workload import tokenize_after

        assert self._prepared is not None and self._loaded is not None, "load() first"
        return tokenize_after(self._prepared, self._loaded)


def _workload_spec(workload_json: str) -> Any:
    from pydantic import TypeAdapter

    from workloads.spec import WorkloadSpec

    return TypeAdapter(WorkloadSpec).validate_json(workload_json)


__all__ = ["CounterReading", "NodeCoreAgent", "ReplicaActor", "WorkloadActor", "core_agent", "localize",
           "span_bounds", "window_counters", "window_series"]
