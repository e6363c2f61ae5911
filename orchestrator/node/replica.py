"""One vLLM replica's life: command, environment, start restricted, health, re-pin, verify, stop.

The command and environment are pure functions of the TrialSpec (``build_vllm_command``,
``server_env``), so a trial's resolved server invocation is known, recorded and testable
before anything runs. ``VllmReplica`` owns the effects: it launches the server through the
restriction launcher (``orchestrator.node.restrict``), so vLLM and every process it forks start
already confined; and ``stop()`` is the one place the replica's processes, cgroup and port
are released (idempotent; kills the whole process group, then checks nothing is left). It also
times its start: ``startup()`` gives the phases read from ``vllm.log`` (``orchestrator.node.startup``)
and the state of the compile cache, probed before the launch.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from orchestrator.infra.lifeline import Lifeline
from orchestrator.infra.net import free_port, http_ok, port_is_free
from orchestrator.node.cores import format_cpulist, thread_env
from orchestrator.node.gpu_profile import profiler_launch
from orchestrator.node.hostfacts import vllm_version
from orchestrator.node.restrict import (
    Restriction,
    RestrictionError,
    Verification,
    choose_mode,
    mode_of,
    pid_alive,
    tree_pids,
)
from orchestrator.node.startup import compile_cache_entries, first_start, parse_startup, read_log, startup_record
from orchestrator.values.results import ErrorKind
from orchestrator.values.trial import TrialSpec
from workloads.vllm_cli import VLLM_CLI_SHIM

# gpu/README.md section 5: NVLink multicast is off on the lent multi-GPU machines and must stay off.
MULTICAST_OFF_ENV = {
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
MULTICAST_OFF_COMPILATION_CONFIG = '{"pass_config":{"fuse_allreduce_rms":false}}'
# `vllm serve`, vLLM's own CLI, for every distribution (workloads.vllm_cli says why the shim).
# (`python -m vllm.entrypoints.openai.api_server` is deprecated and ignores --api-server-count.)
VLLM_SERVE_SHIM = VLLM_CLI_SHIM


class ReplicaError(RuntimeError):
    """A replica that failed to start or died; ``kind`` tells the controller whether to retry."""

    def __init__(self, kind: ErrorKind, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n--- vllm.log tail ---\n{log_tail}" if log_tail else ""))
        self.kind = kind
        self.message = message
        self.log_tail = log_tail

    def __reduce__(self):  # Ray pickles exceptions: rebuild from the three arguments, not the joined text
        return type(self), (self.kind, self.message, self.log_tail)


def _has_flag(args: tuple[str, ...] | list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") or a.startswith(flag + ".") for a in args)


SERVER_SCRIPT_ENV = "ORCHESTRATOR_SERVER_SCRIPT"
"""A server script run in place of ``vllm serve`` (with the same address flags and the variant's args), for
benchmarks of the orchestrator itself (``benchmarks/standin.py``); never set by a sweep, and recorded as the
``server_script`` param of every trial it ran."""


def build_vllm_command(trial: TrialSpec, model_dir: str, port: int, python: str,
                       server_script: str | None = None) -> list[str]:
    """The server command for ``trial`` (pure). ``trial.vllm.args`` come last, untouched, so they win.

    ``server_script`` (see :data:`SERVER_SCRIPT_ENV`) runs that script instead of vLLM, with ``--host``,
    ``--port``, ``--model``, ``--max-model-len`` and the variant's args (e.g. the stand-in's ``--ttft-ms``)."""
    s = trial.server
    if server_script:
        return [python, server_script, "--host", "127.0.0.1", "--port", str(port), "--model", trial.model.name,
                "--max-model-len", str(s.max_model_len), *trial.vllm.args]
    cmd = [python, "-c", VLLM_SERVE_SHIM, "serve", str(model_dir), "--served-model-name", trial.model.name,
           "--host", "127.0.0.1", "--port", str(port), "--load-format", s.load_format,
           "--max-model-len", str(s.max_model_len)]
    if trial.api_servers > 1:
        cmd += ["--api-server-count", str(trial.api_servers)]
    if s.block_size is not None:
        cmd += ["--block-size", str(s.block_size)]
    cmd.append("--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching")
    if trial.gpus > 1:
        cmd += ["--tensor-parallel-size", str(trial.gpus)]
        if not _has_flag(trial.vllm.args, "--compilation-config") and not _has_flag(trial.vllm.args, "-cc"):
            cmd += ["--compilation-config", MULTICAST_OFF_COMPILATION_CONFIG]
    if s.kv_cache_bytes is not None:  # a start-up cut on GPUs and CPUs (server_env leaves out vLLM-CPU's own size)
        cmd += ["--kv-cache-memory-bytes", str(s.kv_cache_bytes)]
    if trial.gpus > 0 and isinstance(s.cudagraph_sizes, tuple):  # no CUDA graphs on CPU
        cmd += ["--cudagraph-capture-sizes", *(str(n) for n in s.cudagraph_sizes)]
    cmd.append("--enable-prompt-tokens-details")  # cached-token counts per response, for prefix-hit accounting
    return cmd + list(trial.vllm.args)


def scratch_paths(scratch_dir: str | Path, cache_root: str | Path | None = None) -> dict[str, str]:
    """TMPDIR, the vLLM cache root and the RPC socket folder.

    The cache root holds vLLM's torch.compile cache, so warm restarts compile less (on the H200,
    vLLM 0.26, the 8B shape: 204 s cold, 74 s warm; vLLM-CPU 0.32 finds its entry but fails to
    load it and compiles again, 2-3x faster): shared by every trial of a home, or by every home when
    ``cache_root`` is given (``VLLM_CACHE_ROOT`` in the node's environment). Unix socket paths are
    limited to 107 bytes, so a long scratch path gets a short RPC folder under /tmp."""
    root = Path(scratch_dir)
    rpc = root / "rpc"
    if len(str(rpc)) > 60:
        rpc = Path(tempfile.gettempdir()) / f"cpusweep-rpc-{os.getuid()}"
    cache = Path(cache_root) if cache_root else root / "vllm-cache"
    return {"TMPDIR": str(root / "tmp"), "VLLM_CACHE_ROOT": str(cache), "VLLM_RPC_BASE_PATH": str(rpc)}


def omp_bind(cores: frozenset[int], mode: str) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: the replica's own cores when pinned (its OMP pool then spans
    exactly them); ``nobind`` under quota, where the tree may run anywhere but only for n cores' time."""
    return format_cpulist(cores) if mode_of(mode).pins else "nobind"


CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a server inherits of ``environ``: all but vLLM-CPU's KV cache size, which only the trial sets
    (:func:`server_env`; a user's own goes in ``server.cpu_kvcache_gib`` or ``vllm.env``)."""
    return {k: v for k, v in environ.items() if k != CPU_KV_ENV}


def server_env(trial: TrialSpec, cores: frozenset[int], scratch_dir: str | Path, mode: str = "affinity",
               cache_root: str | Path | None = None) -> dict[str, str]:
    """The environment added for the server (pure); recorded with the trial. ``trial.vllm.env`` wins.

    ``cores`` are the cores its threads will run on in the window: thread pools are sized for them,
    also under ``start: sized``, where the server starts on more cores and is pinned to these before
    the window."""
    env = thread_env(len(cores))
    env.update(scratch_paths(scratch_dir, cache_root))
    if trial.protocol.reset_prefix_cache or trial.start == "repin":
        env["VLLM_SERVER_DEV_MODE"] = "1"  # serves POST /reset_prefix_cache (the protocol's start state)
    if trial.gpus == 0:
        # vLLM-CPU's VLLM_CPU_KVCACHE_SPACE (whole GiB) overrides --kv-cache-memory-bytes, and an empty
        # value fails vLLM's int() at engine start: with kv_cache_bytes it is left out (inherited_env
        # drops an inherited one)
        if trial.server.kv_cache_bytes is None:
            env[CPU_KV_ENV] = str(trial.server.cpu_kvcache_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(cores, mode)
    if trial.gpus >= 2:
        env.update(MULTICAST_OFF_ENV)
    env.update(trial.vllm.env)
    return env


def _tail(path: Path, n_bytes: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class VllmReplica:
    """A vLLM server restricted to ``cores``. Use as a context manager, or call ``stop()`` in ``finally``.

    ``mode`` is the requested restriction; ``mode_used``/``fallback_reason`` record what ran.
    """

    def __init__(self, trial: TrialSpec, model_dir: str, cores: frozenset[int], port: int, workdir: Path,
                 mode: str = "affinity", *, python: str | None = None, scratch_dir: str | Path | None = None,
                 stop_grace_s: float = 20.0, sized_for: frozenset[int] | None = None) -> None:
        """``sized_for`` (``start: sized``): the cores the window will run on, a subset of ``cores``; the
        server starts on ``cores`` with its thread pools sized for ``sized_for``, and ``repin(sized_for)``
        follows once it is healthy."""
        self.trial = trial
        self.model_dir = str(model_dir)
        self.cores = frozenset(cores)
        self.sized_for = frozenset(sized_for) if sized_for else None
        self.port = port
        self.workdir = Path(workdir)
        self.mode_requested = mode
        self.mode_used, self.fallback_reason = choose_mode(mode)
        self.python = python or sys.executable
        self.scratch_dir = Path(scratch_dir or os.environ.get("CPUSWEEP_SCRATCH", str(Path.home() / ".cache" / "cpusweep")))
        self.stop_grace_s = stop_grace_s
        self.server_script = os.environ.get(SERVER_SCRIPT_ENV) or None
        self.resolved_args = build_vllm_command(trial, self.model_dir, port, self.python, self.server_script)
        self.profile_dir: Path | None = None
        profile_env: dict[str, str] = {}
        if trial.telemetry.gpu_profile.enabled and trial.server.stack == "vllm":
            self.profile_dir = self.workdir / "gpu-profile"  # vLLM's workers write their traces here
            extra, profile_env = profiler_launch(self.profile_dir)  # flags or environment, by vLLM release
            at = len(self.resolved_args) - len(trial.vllm.args)  # before the user's flags, which win
            self.resolved_args[at:at] = extra
        self.env_recorded = {**profile_env, **server_env(trial, self.sized_for or self.cores, self.scratch_dir,
                                                         self.mode_used, os.environ.get("VLLM_CACHE_ROOT"))}
        # One socket folder per live replica (ports are unique while it runs), removed by stop().
        self.rpc_dir = Path(self.env_recorded["VLLM_RPC_BASE_PATH"]) / str(port)
        self.env_recorded["VLLM_RPC_BASE_PATH"] = str(self.rpc_dir)
        self.restriction = Restriction(f"{trial.trial_id}-{port}", self.mode_used, self.cores)
        self.log_path = self.workdir / "vllm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lifeline: Lifeline | None = None
        self.started_at = 0.0
        self.launched_wall: float | None = None  # time.time() at the launch, for the log's clock
        self.healthy_after_s: float | None = None
        self._log_offset = 0  # where this start's part of vllm.log begins
        self._cache_before: frozenset[str] | None = None
        self._model_first_start: bool | None = None
        self.stop_report: dict[str, Any] | None = None
        self._seen: dict[int, psutil.Process] = {}  # our tree's processes (psutil guards against pid reuse)

    # ------------------------------------------------------------ facts
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @staticmethod
    def version() -> str:
        return vllm_version()

    def params(self) -> dict[str, str]:
        """Facts to record with the trial (strings, for MLflow params)."""
        p = {"vllm_version": vllm_version(), "server_stack": self.trial.server.stack,
             "restriction_requested": self.mode_requested,
             "restriction_mode": self.mode_used, "restriction_fallback": self.fallback_reason or "",
             "replica_cpus": format_cpulist(self.cores), "port": str(self.port),
             "vllm_command": json.dumps(self.resolved_args), "server_env": json.dumps(self.env_recorded, sort_keys=True)}
        if self.server_script:
            p["server_script"] = self.server_script  # not vLLM: a benchmark's stand-in
        if self.healthy_after_s is not None:
            p["startup_s"] = f"{self.healthy_after_s:.1f}"
        return p

    # ------------------------------------------------------------ life
    def start(self) -> None:
        """Launch the server, already restricted (the launcher restricts itself, then execs vLLM)."""
        if self.proc is not None:
            raise RuntimeError("replica already started")
        self._prepare()
        # The launcher restricts itself, the lifeline's prelude forks vLLM's watchdog, then vLLM is exec'd in
        # place: restricted from the first instruction, and ended with its workers when this actor dies.
        self.lifeline = Lifeline(grace_s=self.stop_grace_s)
        cmd = self.restriction.wrap(self.lifeline.wrap(self.resolved_args, self.python), self.python)
        self._launch(cmd, {**inherited_env(os.environ), **self.env_recorded})

    def _prepare(self) -> None:
        """The work and scratch folders, and the restriction's set-up (a cgroup under cpuset)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        for key in ("TMPDIR", "VLLM_CACHE_ROOT", "VLLM_RPC_BASE_PATH"):
            Path(self.env_recorded[key]).mkdir(parents=True, exist_ok=True)
        try:
            self.restriction.prepare()
        except RestrictionError as exc:
            self.restriction.cleanup()
            raise ReplicaError(ErrorKind.INTERNAL, f"cannot set up {self.mode_used} restriction: {exc}") from None

    def _launch(self, cmd: list[str], env: dict[str, str], header: str = "") -> None:
        """Probe the caches for ``startup()``, write the launch header into the log, and start ``cmd``
        in a session of its own under the lifeline made by the caller."""
        assert self.lifeline is not None
        self._cache_before = compile_cache_entries(self.env_recorded["VLLM_CACHE_ROOT"])
        self._model_first_start = first_start(self.model_dir, self.scratch_dir / "model-starts")
        self.started_at, self.launched_wall = time.monotonic(), time.time()
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            log.write(f"# launch: {json.dumps(cmd)}\n# restriction: {json.dumps(self.restriction.describe())}\n"
                      f"{header}# launched: {datetime.fromtimestamp(self.launched_wall).isoformat()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=str(self.workdir), start_new_session=True,
                                         pass_fds=self.lifeline.pass_fds)
        self.lifeline.started()

    def alive(self) -> bool:
        """Running and not on its way out. ``poll()`` alone is not enough: a killed server's main thread is a
        zombie at once, but ``waitpid`` reports it only when its last thread has exited (seconds on a loaded
        machine), and a trial read in between must not pass as served by a live server."""
        return self.proc is not None and self.proc.poll() is None and pid_alive(self.proc.pid)

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until /health and /v1/models answer 200; returns seconds since start.

        Fails fast if the server exits. On any failure the replica is stopped before raising, so a
        failed start never leaves workers behind.
        """
        if self.proc is None:
            raise RuntimeError("start() first")
        deadline = self.started_at + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise ReplicaError(ErrorKind.SERVER_DIED, f"vLLM exited with code {code} before it was healthy",
                                   _tail(self.log_path))
            if http_ok(self.base_url + "/health") and http_ok(self.base_url + "/v1/models"):
                self.healthy_after_s = time.monotonic() - self.started_at
                with open(self.log_path, "ab") as log:  # O_APPEND: whole lines beside vLLM's own
                    log.write(f"# healthy after: {self.healthy_after_s:.3f} s\n".encode())
                self._remember_tree()
                return self.healthy_after_s
            if time.monotonic() > deadline:
                self.stop()
                raise ReplicaError(ErrorKind.STARTUP_TIMEOUT, f"vLLM not healthy after {timeout_s:.0f} s",
                                   _tail(self.log_path))
            time.sleep(poll_s)

    def startup(self) -> dict[str, float | str]:
        """This start's phases and cache states (``orchestrator.node.startup.startup_record``): floats
        for metrics, strings for params. After ``wait_healthy``; before it, the phases logged so far."""
        if self.launched_wall is None:
            raise RuntimeError("start() first")
        log = parse_startup(read_log(self.log_path, self._log_offset), datetime.fromtimestamp(self.launched_wall),
                            self.healthy_after_s)
        return startup_record(log, cache_before=self._cache_before, model_first_start=self._model_first_start,
                              load_format=self.trial.server.load_format)

    def cpu_stat(self) -> dict[str, int]:
        """The server's cgroup ``cpu.stat`` counters (``Restriction.cpu_stat``; empty under affinity)."""
        return self.restriction.cpu_stat()

    def verify(self, *, strict: bool = False) -> Verification:
        """Every thread of every process of the server, against the assignment."""
        if self.proc is None:
            raise RuntimeError("start() first")
        self._remember_tree()
        return self.restriction.verify(self.proc.pid, strict=strict)

    def repin(self, cores: frozenset[int]) -> float:
        """Move the live server to ``cores``; returns the seconds it took. Thread pools keep their startup size."""
        if not self.alive():
            raise ReplicaError(ErrorKind.SERVER_DIED, "cannot re-pin: vLLM is not running", _tail(self.log_path))
        t0 = time.perf_counter()
        self.restriction.repin(self.proc.pid, frozenset(cores))  # type: ignore[union-attr]
        self.cores = frozenset(cores)
        return time.perf_counter() - t0

    def _remember_tree(self) -> None:
        if self.proc is None:
            return
        for pid in tree_pids(self.proc.pid):
            if pid not in self._seen and pid != os.getpid():
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._seen[pid] = psutil.Process(pid)

    def _group_members(self, pgid: int) -> list[psutil.Process]:
        """Live (non-zombie) processes of our process group, and those seen in our tree that still run
        (``is_running`` is False for a recycled pid, so an unrelated process is never touched)."""
        out = {}
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                    out[p.pid] = p
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                continue
        for pid, p in self._seen.items():
            try:
                if pid not in out and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out[pid] = p
            except psutil.NoSuchProcess:
                continue
        return list(out.values())

    def stop(self) -> dict[str, Any]:
        """SIGTERM the process group, wait, SIGKILL, confirm nothing is left, drop the cgroup, check the port.
        Idempotent; returns (and keeps in ``stop_report``) what it found."""
        if self.stop_report is not None:
            return self.stop_report
        report: dict[str, Any] = {"leftover_pids": [], "cgroup_removed": True, "port_free": True}
        if self.proc is not None:
            pgid = self.proc.pid
            self._remember_tree()
            _killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace_s  # the server and its workers share the grace period
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=self.stop_grace_s)
            while self._group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            for _ in range(3):
                if not (left := self._group_members(pgid)):
                    break
                _killpg(pgid, signal.SIGKILL)
                for p in left:  # also one that left the group (setsid) but was seen in our tree
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
                psutil.wait_procs(left, timeout=5)
            if self.proc.poll() is None:
                self.proc.wait(timeout=5)
            report["leftover_pids"] = [p.pid for p in self._group_members(pgid)]
            report["exit_code"] = self.proc.returncode
        if self.lifeline is not None:
            self.lifeline.cut()
        try:
            self.restriction.cleanup()
        except RestrictionError as exc:
            report["cgroup_removed"] = False
            report["cgroup_error"] = str(exc)
        deadline = time.monotonic() + 10
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)
        report["port_free"] = port_is_free(self.port)
        if self.trial.gpus > 0:
            report["gpu_pids_left"] = _gpu_pids(set(self._seen))
        shutil.rmtree(self.rpc_dir, ignore_errors=True)
        self.stop_report = report
        return report

    def __enter__(self) -> VllmReplica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _gpu_pids(pids: set[int], timeout_s: float = 15.0) -> list[int]:
    """Our pids that NVML still shows holding GPU memory (waits for the driver to let go)."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py, on GPU machines only
    except ImportError:
        return []
    pynvml.nvmlInit()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            held = set()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                held |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)} & pids
            if not held or time.monotonic() > deadline:
                return sorted(held)
            time.sleep(0.5)
    finally:
        pynvml.nvmlShutdown()


__all__ = ["CPU_KV_ENV", "MULTICAST_OFF_ENV", "SERVER_SCRIPT_ENV", "VLLM_SERVE_SHIM", "ReplicaError", "VllmReplica", "build_vllm_command", "free_port", "inherited_env",
           "port_is_free", "scratch_paths", "server_env"]
