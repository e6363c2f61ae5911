"""One Ray Serve LLM replica's life (``server.stack: ray-serve``), behind ``VllmReplica``'s interface.

Many teams serve vLLM through Ray Serve (``ray.serve.llm``): an HTTP proxy, an OpenAI ingress replica
and Serve's controller stand in front of the LLMServer replica that runs vLLM, and all of them use
CPU. This stack serves the trial's model that way, on the same OpenAI-compatible endpoint
(``http://127.0.0.1:<port>``), under the same physical restriction, verified the same way.

Serve runs on a Ray instance of its own, started on the trial's node by :mod:`orchestrator.node.serve_host`
in a process this class launches, not in the cluster of the trial actor, because there:

- Serve is one instance per cluster, with one controller and one HTTP port for every proxy, fixed
  when it first starts. Concurrent trials, or a user's own app, would share it, and
  ``serve.shutdown`` would end theirs.
- the trial's placement group already holds the node's GPUs, so the placement group that Serve LLM
  asks for would never be scheduled;
- Serve's controller lives on the head node, out of reach of the trial's cores.

On a Ray of its own, every process of the stack descends from one launcher: that Ray's GCS, raylet and
agents, Serve's controller and proxy, the ingress and LLMServer replicas, vLLM's engine core and
workers. So they are restricted from their first instruction, verified per thread, ended by one
group kill, and ended by the lifeline when the trial actor dies. That Ray sees only the trial's GPUs
(``CUDA_VISIBLE_DEVICES``), and the trial's cores as its CPUs. In production the raylet and its
agents share the node as well.

``server.serve_frontend`` says where the processes that do not serve run. ``inside`` (the default):
the whole tree is on the trial's cores. ``outside``: the tree starts on the node's other cores, and
Ray's ``worker_process_setup_hook`` (``serve_host.pin_worker``) moves the LLMServer replica's worker
onto the trial's cores, into the trial's cgroup under cpuset or quota, before the actor's
constructor starts vLLM; vLLM's engine core and workers then start there. ``process_sets()`` names the
three sets: ``serving``, ``frontend`` (controller, proxy, ingress) and ``ray``. ``verify()`` checks
every thread of the serving set (inside: of the whole tree) against the trial's cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from orchestrator.infra.lifeline import Lifeline
from orchestrator.infra.net import http_ok
from orchestrator.node.cores import format_cpulist
from orchestrator.node.hostfacts import vllm_version
from orchestrator.node.replica import ReplicaError, VllmReplica, inherited_env
from orchestrator.node.restrict import Restriction, Verification, mode_of, thread_cpus, thread_ids, tree_pids
from orchestrator.node.serve_host import (
    CGROUP_ENV,
    CPUS_ENV,
    Role,
    engine_kwargs,
    host_spec,
    llm_config,
    process_sets,
    roots,
)
from orchestrator.node.startup import read_log
from orchestrator.values.results import ErrorKind
from orchestrator.values.trial import TrialSpec

# What a Ray worker inherits from the cluster it runs in; the serve host must start a Ray of its own.
OUTER_RAY_ENV = ("RAY_ADDRESS", "RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_CLIENT_MODE", "RAY_NODE_ID",
                 "RAY_LD_PRELOAD_ON_WORKERS", "RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_NODE_IP_ADDRESS")
HOST_MAIN = "import sys\nfrom orchestrator.node.serve_host import main\nsys.exit(main(sys.argv[1:]))\n"
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


def frontend_cpus(cores: frozenset[int], node_cpus: frozenset[int], where: str) -> frozenset[int]:
    """The cores Serve's frontend and Ray's own processes run on: the trial's (inside), or the node's others."""
    if where == "inside":
        return frozenset(cores)
    rest = frozenset(node_cpus) - frozenset(cores)
    if not rest:
        raise ValueError(f"serve_frontend: outside needs a core beside the trial's {format_cpulist(cores)}")
    return rest


def host_env(base: Mapping[str, str], added: Mapping[str, str]) -> dict[str, str]:
    """The serve host's environment: ``base`` less what ties a process to the cluster it runs in, plus
    ``added`` less the hook's variables (only the LLMServer's runtime env has those, which is how its
    workers are told apart), the project on the path (for the hook) and plain log lines."""
    env = {k: v for k, v in inherited_env(base).items() if k not in OUTER_RAY_ENV}
    env.update({k: v for k, v in added.items() if k not in (CPUS_ENV, CGROUP_ENV)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, base.get("PYTHONPATH", "")) if p)
    env.update({"RAY_COLOR_PREFIX": "0", "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"})
    return env


# ---------------------------------------------------------------- verification of process sets

def verify_pids(pids: Sequence[int], expected: frozenset[int], mode: str, *, strict: bool = False) -> Verification:
    """Every thread of exactly these processes (not their children) within ``expected`` (affinity)."""
    allowed: dict[str, str] = {}
    violations: list[str] = []
    nproc = 0
    pins = mode_of(mode).pins  # a quota limits time, not cores: any cpu is allowed
    for pid in pids:
        tids = thread_ids(pid)
        nproc += bool(tids)
        for tid in tids:
            cpus = thread_cpus(pid, tid)
            if cpus is None:
                continue
            allowed[f"{pid}/{tid}"] = format_cpulist(cpus)
            if pins and (not cpus <= expected or (strict and cpus != expected)):
                violations.append(f"pid {pid} tid {tid}: allowed {format_cpulist(cpus)}, want "
                                  f"{'exactly' if strict else 'within'} {format_cpulist(expected)}")
    return Verification(ok=not violations and nproc > 0, mode=mode, expected=format_cpulist(expected),
                        processes=nproc, threads=len(allowed), violations=tuple(violations), allowed=allowed)


def merge(parts: Sequence[Verification], expected: frozenset[int], mode: str) -> Verification:
    """One Verification for several trees; not ok when there is none."""
    if not parts:
        return Verification(False, mode, format_cpulist(expected), 0, 0, ("no LLMServer replica process found",))
    allowed: dict[str, str] = {}
    for p in parts:
        allowed.update(p.allowed)
    return Verification(ok=all(p.ok for p in parts), mode=mode, expected=format_cpulist(expected),
                        processes=sum(p.processes for p in parts), threads=len(allowed),
                        violations=tuple(v for p in parts for v in p.violations), allowed=allowed,
                        quota=next((p.quota for p in parts if p.quota), None))


# ---------------------------------------------------------------- the replica

_KINDS = {"config": ErrorKind.CONFIG, "startup_timeout": ErrorKind.STARTUP_TIMEOUT}


class ServeReplica(VllmReplica):
    """The trial's Ray Serve LLM app, restricted to ``cores``, behind ``VllmReplica``'s interface.

    Teardown is ``VllmReplica.stop`` (one process group killed whole, each process seen in the tree
    checked gone by pid, cgroup and port released), after the host has deleted the app and shut Serve
    and Ray down; ``stop()`` adds what that teardown did and which Serve processes were left."""

    def __init__(self, trial: TrialSpec, model_dir: str, cores: frozenset[int], port: int, workdir: Path,
                 mode: str = "affinity", *, python: str | None = None, scratch_dir: str | Path | None = None,
                 stop_grace_s: float = 30.0, sized_for: frozenset[int] | None = None) -> None:
        super().__init__(trial, model_dir, cores, port, workdir, mode, python=python, scratch_dir=scratch_dir,
                         stop_grace_s=stop_grace_s, sized_for=sized_for)
        self.frontend = trial.server.serve_frontend
        self.node_cpus = frozenset(os.sched_getaffinity(0))
        self.status_path, self.spec_path = self.workdir / "serve-status.json", self.workdir / "serve-spec.json"
        tmp = Path(tempfile.gettempdir())  # Ray's socket paths under it must stay within 107 bytes
        self.temp_dir = (tmp if len(str(tmp)) <= 24 else Path("/tmp")) / f"cpusweep-serve-{port}"
        self.resolved_args = [self.python, "-c", HOST_MAIN, str(self.spec_path)]
        self.frontend_restriction: Restriction | None = None
        self.config: dict[str, Any] | None = None
        self._sets: dict[Role, list[int]] = {}

    def params(self) -> dict[str, str]:
        """Facts to record with the trial (strings, for MLflow params)."""
        st = self._status()
        p = {"vllm_version": vllm_version(), "server_stack": "ray-serve", "ray_version": st.get("ray_version", ""),
             "serve_version": st.get("serve_version", ""), "restriction_requested": self.mode_requested,
             "restriction_mode": self.mode_used, "restriction_fallback": self.fallback_reason or "",
             "replica_cpus": format_cpulist(self.cores), "port": str(self.port), "serve_frontend": self.frontend,
             "serve_frontend_cpus": format_cpulist(self.frontend_restriction.cpus) if self.frontend_restriction else "",
             "serve_command": json.dumps(self.resolved_args), "server_env": json.dumps(self.env_recorded, sort_keys=True),
             "serve_llm_config": json.dumps(_without_env(self.config), sort_keys=True),
             "serve_deployment": json.dumps(st.get("deployment", {}), sort_keys=True),
             "serve_pids": json.dumps(self._sets, sort_keys=True)}
        if self.healthy_after_s is not None:
            p["startup_s"] = f"{self.healthy_after_s:.1f}"
        return p

    def _status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------ life
    def start(self) -> None:
        """Launch the serve host, restricted from its first instruction (see the module docstring)."""
        if self.proc is not None:
            raise RuntimeError("replica already started")
        try:
            fe_cpus = frontend_cpus(self.cores, self.node_cpus, self.frontend)
            engine_kwargs(self.trial)
        except ValueError as exc:
            raise ReplicaError(ErrorKind.CONFIG, f"ray-serve: {exc}") from None
        self._prepare()
        inside = self.frontend == "inside"
        launcher = self.restriction if inside else Restriction(f"{self.restriction.name}-frontend", "affinity", fe_cpus)
        self.frontend_restriction = launcher
        self.env_recorded[CPUS_ENV] = format_cpulist(self.restriction.launch_affinity())
        self.env_recorded[CGROUP_ENV] = json.dumps([] if inside else [str(g / "cgroup.procs")
                                                                     for g in self.restriction.groups.values()])
        self.config = llm_config(self.trial, self.model_dir, self.env_recorded)
        self.spec_path.write_text(json.dumps(host_spec(self.trial, self.config, self.port, self.status_path,
                                                       self.temp_dir), indent=1))
        self.status_path.unlink(missing_ok=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # a crashed start's
        self.lifeline = Lifeline(grace_s=self.stop_grace_s)
        cmd = launcher.wrap(self.lifeline.wrap(self.resolved_args, self.python), self.python)
        self._launch(cmd, host_env(os.environ, self.env_recorded),
                     header=f"# serve frontend: {self.frontend} on {format_cpulist(fe_cpus)}\n")

    def alive(self) -> bool:
        return super().alive() and self._status().get("state") != "failed"

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until the app is RUNNING and /health and /v1/models answer 200; returns seconds since start.
        On any failure the replica is stopped before raising ``ReplicaError`` (with the log's tail)."""
        if self.proc is None:
            raise RuntimeError("start() first")
        deadline = self.started_at + timeout_s
        while True:
            st = self._status()
            code = self.proc.poll()
            if code is not None or st.get("state") == "failed":
                if code is None:  # the host tears down what it started, then exits
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        code = self.proc.wait(timeout=self.stop_grace_s)
                kind = _KINDS.get(st.get("error_kind", ""), ErrorKind.SERVER_DIED)
                why = st.get("message") or f"the serve host exited with code {code}"
                self.stop()
                raise ReplicaError(kind, f"Ray Serve LLM app not healthy: {why}", self._tail())
            if st.get("state") == "running" and http_ok(self.base_url + "/health") \
                    and http_ok(self.base_url + "/v1/models"):
                self.healthy_after_s = time.monotonic() - self.started_at
                with open(self.log_path, "ab") as log:
                    log.write(f"# healthy after: {self.healthy_after_s:.3f} s\n".encode())
                self._remember_tree()
                self.process_sets()
                return self.healthy_after_s
            if time.monotonic() > deadline:
                self.stop()
                raise ReplicaError(ErrorKind.STARTUP_TIMEOUT, f"Ray Serve LLM app not healthy after {timeout_s:.0f} s",
                                   self._tail())
            time.sleep(poll_s)

    def startup(self) -> dict[str, float | str]:
        """``VllmReplica.startup`` (vLLM's phases, from the same log), and Serve's own: the local Ray's
        start, Serve's start, and the deployment until the app ran."""
        out = super().startup()
        st = self._status()
        marks = [st.get(k) for k in ("ray_started_s", "serve_started_s", "running_s")]
        for name, (a, b) in zip(("serve_ray", "serve_start", "serve_deploy"), zip([0.0, *marks], marks)):
            if a is not None and b is not None:
                out[f"startup_{name}_s"] = round(b - a, 3)
        return out

    def _tail(self, n_bytes: int = 6000) -> str:
        size = self.log_path.stat().st_size if self.log_path.exists() else 0
        return read_log(self.log_path, max(self._log_offset, size - n_bytes))

    # ------------------------------------------------------------ processes
    def process_table(self) -> dict[int, tuple[int, str, bool]]:
        """``{pid: (ppid, title, started with the LLMServer's runtime env)}`` of the host's tree now."""
        out: dict[int, tuple[int, str, bool]] = {}
        for pid in tree_pids(self.proc.pid) if self.proc is not None else []:
            try:
                p = psutil.Process(pid)
                out[pid] = (p.ppid(), " ".join(p.cmdline()).strip(), CPUS_ENV in p.environ())
            except psutil.Error:
                continue
        return out

    def process_sets(self) -> dict[Role, list[int]]:
        """The tree's processes by role (:func:`process_sets`); the last answer is recorded in ``params()``."""
        self._sets = process_sets(self.process_table())
        return self._sets

    def verify(self, *, strict: bool = False) -> Verification:
        """Every thread of the serving processes against the trial's cores (inside: of the whole tree)."""
        if self.proc is None:
            raise RuntimeError("start() first")
        self._remember_tree()
        table = self.process_table()
        self._sets = sets = process_sets(table)
        serving = roots(sets["serving"], table)
        if self.frontend == "inside":
            v = self.restriction.verify(self.proc.pid, strict=strict)
            return v if serving else replace(v, ok=False, violations=(*v.violations, "no LLMServer replica process"))
        return merge([self.restriction.verify(r, strict=strict) for r in serving], self.cores, self.mode_used)

    def verify_frontend(self) -> Verification:
        """Every thread of the frontend and Ray's own processes against the cores they were given."""
        assert self.frontend_restriction is not None, "start() first"
        sets = self.process_sets()
        return verify_pids(sets["frontend"] + sets["ray"], self.frontend_restriction.cpus,
                           self.frontend_restriction.mode)

    def repin(self, cores: frozenset[int]) -> float:
        """Move the live serving processes (inside: the whole tree) to ``cores``; outside, the rest to the
        node's other cores. Returns the seconds it took. Thread pools keep their startup size."""
        if not self.alive():
            raise ReplicaError(ErrorKind.SERVER_DIED, "cannot re-pin: the Serve app is not running", self._tail())
        cores = frozenset(cores)
        t0 = time.perf_counter()
        if self.frontend == "inside":
            self.restriction.repin(self.proc.pid, cores)  # type: ignore[union-attr]
        else:
            try:
                rest = frontend_cpus(cores, self.node_cpus, "outside")
            except ValueError as exc:
                raise ReplicaError(ErrorKind.CONFIG, f"cannot re-pin: {exc}") from None
            table = self.process_table()
            sets = process_sets(table)
            for root in roots(sets["serving"], table):
                self.restriction.repin(root, cores)
            _pin(sets["frontend"] + sets["ray"], rest)
            self.frontend_restriction = replace(self.frontend_restriction, cpus=rest)  # type: ignore[type-var]
        self.cores = cores
        return time.perf_counter() - t0

    def stop(self) -> dict[str, Any]:
        """Ask the host to delete the app and shut Serve and Ray down (SIGTERM, up to ``stop_grace_s``),
        then ``VllmReplica.stop``. Idempotent; the report adds ``teardown`` and ``serve_pids_left``."""
        if self.stop_report is not None:
            return self.stop_report
        serve_pids: set[int] = set()
        if self.proc is not None:
            self._remember_tree()
            if self.proc.poll() is None:
                serve_pids = {p for role in ("serving", "frontend") for p in self.process_sets()[role]}
                try:
                    os.kill(self.proc.pid, signal.SIGTERM)
                    self.proc.wait(timeout=self.stop_grace_s)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        report = super().stop()
        report["teardown"] = self._status().get("teardown", {})
        report["serve_pids_left"] = sorted(p for p in serve_pids if p in self._seen and _running(self._seen[p]))
        if self.frontend_restriction is not None and self.frontend_restriction is not self.restriction:
            self.frontend_restriction.cleanup()
        self._keep_serve_logs()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return report

    def _keep_serve_logs(self, per_file: int = 1 << 20) -> None:
        """Serve's own logs (controller, proxy, replicas) into ``serve.log`` in the workdir, last MiB of each."""
        files = sorted(self.temp_dir.glob("session_*/logs/serve/*.log"))
        if not files:
            return
        with open(self.workdir / "serve.log", "ab") as out:
            for f in files:
                out.write(f"# ---- {f.name}\n".encode())
                out.write(read_log(f, max(0, f.stat().st_size - per_file)).encode())


def _pin(pids: Sequence[int], cpus: frozenset[int], passes: int = 3) -> None:
    """Every thread of exactly these processes to ``cpus`` (repeated: a thread started mid-pass copies the old mask)."""
    for _ in range(passes):
        changed = 0
        for pid in pids:
            for tid in thread_ids(pid):
                if thread_cpus(pid, tid) not in (None, cpus):
                    try:
                        os.sched_setaffinity(tid, cpus)
                        changed += 1
                    except OSError:
                        pass
        if not changed:
            return


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _without_env(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config as recorded: its env vars are recorded once, as ``server_env``."""
    if not config:
        return {}
    return {**config, "runtime_env": {k: v for k, v in config["runtime_env"].items() if k != "env_vars"}}


__all__ = ["OUTER_RAY_ENV", "ServeReplica", "frontend_cpus", "host_env", "merge", "verify_pids"]
