"""Sampled Python stacks of the replica during the window (py-spy), named by category per process role.

Why: the role accounting (:mod:`orchestrator.node.attribution`) says *which process* used the CPU;
the stacks say *what for*: tokenizing, the HTTP loop, scheduling, the shared-memory broadcast
spin, the forward pass (:mod:`orchestrator.node.stack_categories`). A switch of the sweep
(``telemetry.stacks``), off by default: benchmarks/results/attribution.md states its cost.

One ``py-spy record --pid ROOT --subprocesses --threads --format raw --nonblocking`` follows the
whole tree, children started later included, and is stopped with SIGINT (by its pid) at the window's
end, when it writes the collapsed stacks. ``--nonblocking`` reads the processes without stopping
them (a blocking sample would stall the server it measures). ``--idle`` is not used: raw output does
not mark idle samples, so with it a sleeping thread would look like a running one; without it py-spy
keeps the samples of threads the kernel reports runnable, and ``idle`` holds the few caught in a
wait function (a thread waking up).

Samples count time on a CPU *or waiting for one*, so the CPU-seconds of a category are the threads'
kernel-measured CPU time shared out by their samples (given the role accounting's window to
:meth:`StackSampler.stop`; see :func:`~orchestrator.node.stack_categories.apportion`). py-spy sees
Python threads only: the CPU of threads that never run Python (zmq's I/O threads) is in the role's
CPU time but in no category; ``stacks_coverage_<role>`` (:func:`coverage`) says how much was seen.

A Ray Serve LLM replica (``server.stack: ray-serve``) is one tree too, whose processes the role accounting
knows only as vLLM's: its engine core, the serve host at the root, the rest ``other``. Here Serve's processes
are named by their titles (:func:`~orchestrator.node.serve_host.serve_role`): ``serve_controller``,
``serve_proxy``, ``serve_ingress``, ``serve_llm_server`` (vLLM's OpenAI layer inside Serve),
``serve_vllm_worker`` (vLLM's GPU worker, a Ray actor under Serve, where ``vllm serve`` at TP=1 runs the model
inside its engine core), and ``serve_ray`` for the rest that is neither vLLM's engine core nor its workers
(Ray's GCS, raylet, agents, idle workers, the host, the watchdog). The stacks' categories use those roles,
and every window of such a tree records ``cpu_s_<role>`` (and ``cpu_s_per_req_<role>``, ``<role>_processes``)
for them from the kernel's CPU time of each process over the span, whether or not py-spy sampled them (or
ran at all).

py-spy runs as a child of the caller and inherits its affinity: start it after the caller has
moved onto the client's cores, never from the replica's. Nothing here raises: py-spy missing, not
allowed to attach (ptrace), or the process gone, the window records ``stacks_status`` and goes on.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from orchestrator.node.attribution import ProcDesc, RoleWindow, classify
from orchestrator.node.restrict import tree_pids
from orchestrator.node.serve_host import SERVE_ROLES, serve_role
from orchestrator.node.stack_categories import (
    RoleCategories,
    Stack,
    apportion,
    by_role,
    category_metrics,
    normalize_labels,
    parse_collapsed,
    render_collapsed,
)

SUMMARY = re.compile(r"Samples: (\d+) Errors: (\d+)")


def find_py_spy() -> str | None:
    """The py-spy beside this interpreter (a virtual environment's bin), else the one on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which("py-spy")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tree_cmdlines(root: int) -> dict[int, str]:
    """pid -> command line (argv joined by spaces) of the tree under ``root``, as py-spy prints it in its labels."""
    out = {}
    for pid in tree_pids(root):
        try:
            out[pid] = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
    return out


# py-spy writes its stacks when SIGINT stops it. A Ray actor's threads block SIGINT (SigBlk bit 2 in
# /proc/<pid>/status) and a child inherits the mask across exec, so a py-spy started from an actor
# never saw the signal and was killed with nothing written: exec it with SIGINT unblocked and default.
SIGINT_RESTORED = (sys.executable, "-S", "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); os.execv(sys.argv[1], sys.argv[1:])")


def py_spy_command(py_spy: str, pid: int, rate_hz: float, out: str, native: bool = False,
                   max_s: float = 3600.0) -> list[str]:
    """The ``py-spy record`` command line (pure); ``max_s`` caps it should nobody stop it."""
    cmd = [py_spy, "record", "--pid", str(pid), "--rate", f"{rate_hz:g}", "--format", "raw", "--subprocesses",
           "--threads", "--duration", str(max(1, round(max_s))), "--output", out]
    # py-spy reads native stacks only from a stopped process: --native pauses the replica at every sample.
    return cmd + (["--native"] if native else ["--nonblocking"])


def roles_from_labels(stacks: Sequence[Stack], root: int) -> dict[int, str]:
    """pid -> role from the process labels py-spy put in front of the stacks (outer label = parent)."""
    descs: dict[int, ProcDesc] = {}
    for s in stacks:
        parent = 0
        for pid, title in s.procs:
            descs.setdefault(pid, ProcDesc(pid, parent, title, (title,)))
            parent = pid
    return classify(list(descs.values()), root)


KEEP_IN_SERVE = frozenset({"engine_core", "gpu_worker"})  # vLLM's own processes keep their roles under Serve


def serve_roles(roles: Mapping[int, str], titles: Mapping[int, str]) -> dict[int, str]:
    """``roles`` (pid -> role, the accounting's) with a Ray Serve tree's processes named by their titles
    (pid -> title or argv joined) as :func:`~orchestrator.node.serve_host.serve_role` says; the rest but vLLM's
    engine core and workers is ``serve_ray``. A tree with no Serve title (``vllm serve``) comes back as it was."""
    named = {pid: r for pid, t in titles.items() if (r := serve_role(t)) is not None}
    if not named:
        return dict(roles)
    out = {}
    for pid in set(roles) | set(titles):
        accounted = roles.get(pid, "other")
        out[pid] = named.get(pid) or (accounted if accounted in KEEP_IN_SERVE else "serve_ray")
    return out


def serve_cpu_metrics(roles: Mapping[int, str], process_cpu: Mapping[int, float],
                      requests: int | None = None) -> dict[str, float]:
    """Per Serve role (every one of ``SERVE_ROLES``, zeros if absent): ``cpu_s_<role>`` = the CPU seconds of
    its processes in the window (``process_cpu``: pid -> user + system), ``<role>_processes``, and with
    ``requests`` > 0 ``cpu_s_per_req_<role>``. Nothing for a tree without Serve roles."""
    if not any(r in SERVE_ROLES for r in roles.values()):
        return {}
    out: dict[str, float] = {}
    for role in SERVE_ROLES:
        pids = [p for p, r in roles.items() if r == role and p in process_cpu]
        cpu = sum(process_cpu[p] for p in pids)
        out[f"cpu_s_{role}"] = cpu
        out[f"{role}_processes"] = float(len(pids))
        if requests:
            out[f"cpu_s_per_req_{role}"] = cpu / requests
    return out


@dataclass(frozen=True)
class StackWindow:
    """The window's stacks and what became of the sampling; :meth:`metrics` derives the figures."""

    status: str  # "ok", or why there are no (or partial) stacks
    rate_hz: float
    stacks: tuple[Stack, ...] = ()
    roles: Mapping[int, str] = field(default_factory=dict)  # pid -> role
    gpu: bool = False
    samples: int = 0  # py-spy's own count, over every thread
    errors: int = 0  # samples py-spy could not take
    thread_cpu: Mapping[tuple[int, int], float] | None = None  # (pid, tid) -> on-CPU seconds in the window
    process_cpu: Mapping[int, float] | None = None  # pid -> CPU seconds in the window

    @property
    def basis(self) -> str:
        """What the CPU-seconds were shared out from: ``thread_cpu``, ``process_cpu`` or ``samples``."""
        return "thread_cpu" if self.thread_cpu else "process_cpu" if self.process_cpu else "samples"

    def per_role(self) -> dict[str, RoleCategories]:
        return apportion(self.stacks, self.rate_hz, self.roles, self.thread_cpu or None, self.process_cpu or None,
                         self.gpu)

    def metrics(self, requests: int | None = None) -> dict[str, float]:
        """Per role: ``stacks_cpu_s_<role>[.<category>]``, with ``requests`` also ``cpu_s_per_req_<role>.<category>``
        (see :func:`~orchestrator.node.stack_categories.category_metrics`); ``stacks_samples``, ``stacks_errors``."""
        out: dict[str, float] = {}
        for role, acc in sorted(self.per_role().items()):
            out.update(category_metrics(role, acc, requests))
        out.update(serve_cpu_metrics(self.roles, self.process_cpu or {}, requests))
        if self.stacks or self.samples:
            out["stacks_samples"] = float(self.samples)
            out["stacks_errors"] = float(self.errors)
        return out

    def params(self) -> dict[str, str]:
        return {"stacks_status": self.status, "stacks_rate_hz": f"{self.rate_hz:g}", "stacks_cpu_basis": self.basis}

    def files(self) -> dict[str, bytes]:
        """``stacks-<role>.collapsed``: the role's stacks as collapsed text, ready for a flame graph."""
        return {f"stacks-{role}.collapsed": render_collapsed(st) for role, st in by_role(self.stacks, self.roles).items()}


def coverage(stack_metrics: Mapping[str, float], role_metrics: Mapping[str, float]) -> dict[str, float]:
    """``stacks_coverage_<role>`` = stacks_cpu_s_<role> / cpu_s_<role>: the share of a role's measured CPU
    time that its sampled stacks account for (near 1: the categories tell the whole story)."""
    out = {}
    for key, v in stack_metrics.items():
        if key.startswith("stacks_cpu_s_") and "." not in key:
            role = key[len("stacks_cpu_s_"):]
            cpu = role_metrics.get(f"cpu_s_{role}", 0.0)
            if cpu > 0:
                out[f"stacks_coverage_{role}"] = v / cpu
    return out


@dataclass
class StackSampler:
    """``start()`` at the window's start, ``stop()`` at its end. Never raises; failures are ``status``."""

    root: int
    rate_hz: float = 49.0
    native: bool = False
    gpu: bool = False
    py_spy: str | None = None  # default: :func:`find_py_spy`
    cmdlines: Callable[[int], Mapping[int, str]] | None = None  # root -> {pid: argv joined}; default: tree_cmdlines
    stop_timeout_s: float = 15.0
    max_s: float = 3600.0
    _proc: subprocess.Popen[bytes] | None = None
    _dir: Path | None = None
    _status: str = "off"
    _known: dict[int, str] = field(default_factory=dict)

    def start(self) -> StackSampler:
        if not _alive(self.root):
            self._status = f"the replica's process {self.root} is gone"
            return self
        try:  # the titles name Serve's processes even where py-spy cannot run
            self._known = dict((self.cmdlines or tree_cmdlines)(self.root))
        except OSError:
            self._known = {}
        exe = self.py_spy or find_py_spy()
        if not exe or not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            self._status = f"py-spy not found ({exe or 'not installed'})"
            return self
        self._dir = Path(tempfile.mkdtemp(prefix="stacks-"))
        try:
            with open(self._dir / "stderr", "wb") as err:
                self._proc = subprocess.Popen(
                    [*SIGINT_RESTORED, *py_spy_command(exe, self.root, self.rate_hz, str(self._dir / "raw.txt"),
                                                       self.native, self.max_s)],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
        except OSError as exc:
            self._status = f"py-spy could not start: {exc}"
            return self
        self._status = "running"
        return self

    def stop(self, accounting: RoleWindow | None = None) -> StackWindow:
        """Stop py-spy and read its stacks. ``accounting``, the role accounting of the same window, names
        the processes' roles and gives the CPU time the samples share out; without it, samples / rate."""
        if self._proc is None:  # no stacks; a Serve tree's roles still get their CPU time
            if accounting is None:
                return StackWindow(self._status, self.rate_hz, gpu=self.gpu)
            return StackWindow(self._status, self.rate_hz, (), serve_roles(accounting.pid_roles, self._known),
                               self.gpu, process_cpu=dict(accounting.process_cpu_s))
        proc, self._proc = self._proc, None
        assert self._dir is not None
        exited_early = proc.poll() is not None
        if not exited_early:
            try:
                os.kill(proc.pid, signal.SIGINT)
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                pass
        try:
            return self._read(proc.returncode, exited_early, accounting)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _read(self, rc: int | None, exited_early: bool, accounting: RoleWindow | None) -> StackWindow:
        assert self._dir is not None
        err = (self._dir / "stderr").read_text(errors="replace") if (self._dir / "stderr").exists() else ""
        raw = self._dir / "raw.txt"
        text = raw.read_text(errors="replace") if raw.exists() else ""
        stacks = tuple(parse_collapsed(normalize_labels(text, self._known)))
        m = SUMMARY.search(err)
        samples, errors = (int(m.group(1)), int(m.group(2))) if m else (sum(s.samples for s in stacks), 0)
        if stacks:
            status = "ok" if not exited_early else "partial: py-spy ended before the window did"
        else:
            tail = " ".join(line.strip() for line in err.strip().splitlines()[-3:] if "py-spy>" not in line[:8])
            why = tail[-300:] or ("stopped before it wrote anything" if not exited_early else "no output")
            status = f"no stacks (py-spy exit {rc}): {why}"
        pid_roles = roles_from_labels(stacks, self.root)
        titles = {**{pid: t for s in stacks for pid, t in s.procs}, **self._known}
        if accounting is None:
            return StackWindow(status, self.rate_hz, stacks, serve_roles(pid_roles, titles), self.gpu, samples,
                               errors)
        pid_roles.update(accounting.pid_roles)
        return StackWindow(status, self.rate_hz, stacks, serve_roles(pid_roles, titles), self.gpu, samples, errors,
                           dict(accounting.thread_cpu_s), dict(accounting.process_cpu_s))


__all__ = ["StackSampler", "StackWindow", "coverage", "find_py_spy", "py_spy_command", "roles_from_labels",
           "serve_cpu_metrics", "serve_roles", "tree_cmdlines"]
