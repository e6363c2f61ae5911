"""The replica actor: owns one vLLM replica on its node (start restricted to its cores, verify every thread,
re-pin, the window's start state, telemetry and figures, stop). Files it produces travel back as bytes, so the
driver needs no shared disk.
"""

from __future__ import annotations

import platform
import socket
import threading
import time
from pathlib import Path
from typing import Any

import ray

from orchestrator.infra import survivors
from orchestrator.node.accounting import CoreAccounting
from orchestrator.node.attribution import RoleAccounting, RoleWindow
from orchestrator.node.cores import format_cpulist
from orchestrator.node.gpu_profile import GpuProfileCapture
from orchestrator.node.prefix_cache import reset_prefix_cache
from orchestrator.node.replica import ReplicaError, VllmReplica, free_port
from orchestrator.node.restrict import Verification, tree_pids
from orchestrator.node.serve_replica import ServeReplica
from orchestrator.node.stacks import StackSampler, coverage
from orchestrator.node.telemetry import TelemetrySampler, delta, scrape
from orchestrator.node.window_figures import CounterReading, profile_delay, span_bounds, window_counters, window_series
from orchestrator.plan.models import ModelError, build_shape, tokenizer_file
from orchestrator.values.figures import PrefixCacheReset
from orchestrator.values.trial import TrialSpec
from orchestrator.values.wire import NodeError, ReplicaUp, ServerStatus, WindowFigures, WindowSpan
from workloads.bare import pin


def pin_process(cpus: list[int]) -> None:
    """Pin this process and every thread it has now to ``cpus``: Ray starts its own threads before
    any actor method runs, so the process mask alone is not enough."""
    pin(set(cpus))


def _gpu_name() -> str:
    try:
        import pynvml  # optional: nvidia-ml-py, on GPU machines only

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no GPU: a CPU node
        return "none"


@ray.remote(num_cpus=0, max_concurrency=2)  # type: ignore[call-overload]  # Ray's stubs lack max_concurrency
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
            cls = ServeReplica
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
            assert replica.pid is not None  # started
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
        assert root is not None, "start() first"
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
            reset = PrefixCacheReset.DONE if self.reset_prefix_cache() else PrefixCacheReset.FAILED
        else:
            reset = PrefixCacheReset.OFF
        facts["prefix_cache_reset"] = reset.value
        self.before = scrape(self.replica.base_url)
        tel = t.telemetry
        root = self.replica.pid
        assert root is not None, "start() first"
        # The CPU accounting, the roles and the cgroup's cpu.stat are read by the sampler, every period, with
        # its samples: end_window takes the figures from the readings inside the requests' span (window_counters).
        replica = self.replica
        cores = CoreAccounting(tuple(sorted(replica.cores)), lambda: tree_pids(root)).start()
        roles = RoleAccounting(root, lambda: tree_pids(root))
        self.accounting, self.roles = cores, roles
        self.sampler = TelemetrySampler(replica_cpus=sorted(self.replica.cores), client_cpus=client_cpus,
                                        metrics_url=self.replica.base_url if tel.metrics_hz > 0 else None,
                                        hz=tel.host_hz, metrics_hz=tel.metrics_hz or 1.0,
                                        gpu_indices=gpu_ids or None, gpu_reader=tel.gpu and t.gpus > 0,
                                        counters=lambda: CounterReading(cores.read(), roles.read(),
                                                                        replica.cpu_stat()))
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
            root = self.replica.pid
            assert root is not None, "start() first"
            accounting, roles, facts = window_counters(readings, t0, t1, root, len(self.replica.cores))
            span_facts.update(facts)
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


__all__ = ["ReplicaActor", "pin_process"]
