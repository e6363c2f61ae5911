"""Enforce, change and verify a process tree's cores: the effects behind ``orchestrator.node.cores``.

Three *modes* restrict a replica to a core set:

- ``cpuset``: a cgroup of its own whose ``cpuset.cpus`` is the set. The launcher joins the cgroup
  *before* it execs the server, so every process and thread ever created is inside. Writing a
  new ``cpuset.cpus`` re-pins the whole tree live.
- ``affinity``: ``sched_setaffinity`` in the launcher before exec; every child inherits it. A
  live change must visit every thread of every process (``/proc/<pid>/task/<tid>``).
- ``quota``: CFS bandwidth (``cpu.max = n*100000 100000``), what Kubernetes CPU limits and
  ``docker --cpus`` do: throttling, not pinning; the affinity stays the whole node.

cgroup v2 is used where the unified hierarchy has the controllers; on a hybrid host whose
``cpuset``/``cpu`` controllers sit on v1 hierarchies (``/sys/fs/cgroup/cpuset``), v1 is used.
Where neither is writable, ``choose_mode`` falls back to affinity and says why; the trial
records it. Our cgroups live under one root (``cpusweep``) so a crash leaves them findable.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from orchestrator.node.cores import format_cpulist, parse_cpulist
from orchestrator.values.sweep_spec import RestrictionMode

Mode = RestrictionMode
PERIOD_US = 100_000
ROOT_NAME = os.environ.get("CPUSWEEP_CGROUP_ROOT_NAME", "cpusweep")
CGROUP_BASE = Path(os.environ.get("CPUSWEEP_CGROUP_BASE", "/sys/fs/cgroup"))


class RestrictionError(RuntimeError):
    """A restriction could not be set up, changed or removed."""


# ---------------------------------------------------------------- cgroup layout

@dataclass(frozen=True)
class CgroupLayout:
    """Where a controller's cgroups are made: ``version`` 2 (unified) or 1 (one hierarchy per controller)."""

    version: int
    base: Path  # the mount point (v2) or the folder holding the v1 controller mounts

    def hierarchy(self, controller: str) -> Path:
        return self.base if self.version == 2 else self.base / controller

    def root(self, controller: str) -> Path:
        return self.hierarchy(controller) / ROOT_NAME

    def group(self, controller: str, name: str) -> Path:
        return self.root(controller) / name


def _read(path: Path) -> str:
    return path.read_text().strip()


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        raise RestrictionError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from None


def detect_layout(base: Path | None = None) -> CgroupLayout | None:
    """v2 if the unified mount offers cpuset and cpu, else v1 if both are mounted, else None."""
    base = base or CGROUP_BASE
    controllers = base / "cgroup.controllers"
    if controllers.is_file() and {"cpuset", "cpu"} <= set(_read(controllers).split()):
        return CgroupLayout(2, base)
    if (base / "cpuset" / "cpuset.cpus").is_file() and (base / "cpu" / "cpu.cfs_quota_us").is_file():
        return CgroupLayout(1, base)
    return None


def _ensure_root(layout: CgroupLayout, controller: str) -> Path:
    """Create our root cgroup for ``controller`` (idempotent), enabling the controller on the way."""
    root = layout.root(controller)
    parent = root.parent
    if layout.version == 2:
        if controller not in _read(parent / "cgroup.subtree_control").split():
            _write(parent / "cgroup.subtree_control", f"+{controller}")
        root.mkdir(exist_ok=True)
        if controller not in _read(root / "cgroup.subtree_control").split():
            _write(root / "cgroup.subtree_control", f"+{controller}")
    else:
        root.mkdir(exist_ok=True)
        if controller == "cpuset":  # a v1 cpuset starts empty and accepts no task until both are set
            if not _read(root / "cpuset.cpus"):
                _write(root / "cpuset.cpus", _read(parent / "cpuset.cpus"))
            if not _read(root / "cpuset.mems"):
                _write(root / "cpuset.mems", _read(parent / "cpuset.mems"))
    return root


def _make_group(layout: CgroupLayout, controller: str, name: str) -> Path:
    root = _ensure_root(layout, controller)
    group = root / name
    group.mkdir(exist_ok=True)
    if layout.version == 1 and controller == "cpuset":
        _write(group / "cpuset.mems", _read(root / "cpuset.mems"))
    return group


def parse_cpu_stat(path: Path) -> dict[str, int]:
    """``key value`` lines of a cgroup's ``cpu.stat`` as integers; empty when the file cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    if "throttled_time" in out and "throttled_usec" not in out:  # cgroup v1 counts nanoseconds
        out["throttled_usec"] = out["throttled_time"] // 1000
    return out


def throttling(before: Mapping[str, int], after: Mapping[str, int], scale: float = 1.0) -> dict[str, float]:
    """What CFS bandwidth control did between two ``cpu.stat`` readings (pure): the periods the group ran
    in, the share of them it was throttled in, and the seconds its threads waited throttled; the counts and
    seconds multiplied by ``scale`` (a window's span over the readings' distance, as the CPU accounting
    scales its differences), the share not. Empty when either reading lacks the counters (no cpu controller
    on the group: cpuset, affinity)."""
    keys = ("nr_periods", "nr_throttled", "throttled_usec")
    if not all(k in before and k in after for k in keys):
        return {}
    periods = after["nr_periods"] - before["nr_periods"]
    throttled = after["nr_throttled"] - before["nr_throttled"]
    return {"cgroup_periods": periods * scale, "cgroup_throttled_periods": throttled * scale,
            "cgroup_throttled_frac": throttled / periods if periods > 0 else 0.0,
            "cgroup_throttled_s": (after["throttled_usec"] - before["throttled_usec"]) / 1e6 * scale}


def _quota_text(n_cores: int) -> str:
    return f"{n_cores * PERIOD_US} {PERIOD_US}"


def _set_cpus(layout: CgroupLayout, group: Path, cpus: frozenset[int]) -> None:
    _write(group / "cpuset.cpus", format_cpulist(cpus))


def _set_quota(layout: CgroupLayout, group: Path, n_cores: int) -> None:
    if layout.version == 2:
        _write(group / "cpu.max", _quota_text(n_cores))
    else:
        _write(group / "cpu.cfs_period_us", str(PERIOD_US))
        _write(group / "cpu.cfs_quota_us", str(n_cores * PERIOD_US))


def read_quota(layout: CgroupLayout, group: Path) -> str:
    """The group's CFS bandwidth as ``"<quota> <period>"`` (``"max …"`` when unlimited)."""
    if layout.version == 2:
        return _read(group / "cpu.max")
    quota = int(_read(group / "cpu.cfs_quota_us"))
    return f"{'max' if quota < 0 else quota} {_read(group / 'cpu.cfs_period_us')}"


def _remove_group(group: Path, timeout_s: float = 5.0) -> None:
    """rmdir the cgroup, retrying while the kernel still counts exiting tasks. Idempotent."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > deadline:
                left = _read(group / "cgroup.procs") if (group / "cgroup.procs").exists() else ""
                raise RestrictionError(f"cannot remove cgroup {group}: {exc.strerror}; procs left: "
                                       f"{left.split() or 'none'}") from None
            time.sleep(0.05)


# ---------------------------------------------------------------- the modes, one class each

class ModeKind:
    """How one restriction mode holds a process tree to its cores. One subclass per mode, one instance each in
    :data:`MODES`; a new mode is a new subclass there (and its name in ``values.sweep_spec.RestrictionMode``).

    ``controller``: the cgroup controller its group lives under (None: no cgroup); ``pins``: whether it sets
    the threads' affinity to the cores (a quota leaves the whole node and limits time instead)."""

    name: str = ""
    controller: str | None = None
    pins: bool = True

    def configure(self, layout: CgroupLayout, group: Path, cpus: frozenset[int]) -> None:
        """Write the group's limit for ``cpus``."""

    def probe(self, layout: CgroupLayout, group: Path) -> None:
        """Write a limit to a throwaway group, to learn whether this machine lets us (``choose_mode``)."""
        self.configure(layout, group, frozenset(os.sched_getaffinity(0)))

    def launch_affinity(self, cpus: frozenset[int], node_cpus: frozenset[int]) -> frozenset[int]:
        """The affinity the launcher sets before it execs the server."""
        return cpus if self.pins else node_cpus

    def repin(self, layout: CgroupLayout | None, groups: dict[str, Path], root_pid: int, cpus: frozenset[int]) -> None:
        """Move the live tree to ``cpus``."""
        set_tree_affinity(root_pid, cpus)

    def reading(self, layout: CgroupLayout, group: Path) -> str:
        """What the group's limit reads now, as :meth:`wanted` writes it."""
        raise NotImplementedError

    def wanted(self, expected: frozenset[int]) -> str:
        """The group's limit for ``expected``, as :meth:`reading` reads it."""
        raise NotImplementedError

    def violation(self, pid: int, group: Path, seen: str, expected: frozenset[int]) -> str:
        """The verification's words for a process whose group reads ``seen`` instead of :meth:`wanted`."""
        raise NotImplementedError

    def describe(self, cpus: frozenset[int]) -> dict[str, str]:
        """What the trial's params record of the limit beyond the mode and the cores."""
        return {}


class Cpuset(ModeKind):
    """A cgroup cpuset: the tree's threads may run only on the cores (and their affinity is set to them)."""

    name, controller = "cpuset", "cpuset"

    def configure(self, layout: CgroupLayout, group: Path, cpus: frozenset[int]) -> None:
        _set_cpus(layout, group, cpus)

    def repin(self, layout: CgroupLayout | None, groups: dict[str, Path], root_pid: int, cpus: frozenset[int]) -> None:
        assert layout is not None
        _set_cpus(layout, groups["cpuset"], cpus)
        set_tree_affinity(root_pid, cpus)  # v2 keeps a thread's own narrower mask; reset it to the set

    def reading(self, layout: CgroupLayout, group: Path) -> str:
        return format_cpulist(parse_cpulist(_read(group / "cpuset.cpus")))

    def wanted(self, expected: frozenset[int]) -> str:
        return format_cpulist(expected)

    def violation(self, pid: int, group: Path, seen: str, expected: frozenset[int]) -> str:
        return f"pid {pid}: cgroup {group} cpuset.cpus {seen}, want {format_cpulist(expected)}"


class Affinity(ModeKind):
    """``sched_setaffinity`` on every thread, no cgroup: what works anywhere (and what a thread may undo)."""

    name = "affinity"


class Quota(ModeKind):
    """CFS bandwidth (``cpu.max = n*100000 100000``): n cores of time per period, the affinity left the node."""

    name, controller, pins = "quota", "cpu", False

    def configure(self, layout: CgroupLayout, group: Path, cpus: frozenset[int]) -> None:
        _set_quota(layout, group, len(cpus))

    def probe(self, layout: CgroupLayout, group: Path) -> None:
        _set_quota(layout, group, 1)

    def repin(self, layout: CgroupLayout | None, groups: dict[str, Path], root_pid: int, cpus: frozenset[int]) -> None:
        assert layout is not None
        _set_quota(layout, groups["cpu"], len(cpus))

    def reading(self, layout: CgroupLayout, group: Path) -> str:
        return read_quota(layout, group)

    def wanted(self, expected: frozenset[int]) -> str:
        return _quota_text(len(expected))

    def violation(self, pid: int, group: Path, seen: str, expected: frozenset[int]) -> str:
        return f"pid {pid}: cgroup {group} cpu.max {seen!r}, want {self.wanted(expected)!r}"

    def describe(self, cpus: frozenset[int]) -> dict[str, str]:
        return {"cpu_max": _quota_text(len(cpus))}


MODES: dict[str, ModeKind] = {m.name: m for m in (Cpuset(), Affinity(), Quota())}


def mode_of(name: str) -> ModeKind:
    """The mode called ``name``; an unknown one is an error."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown restriction mode {name!r}; known: {', '.join(MODES)}") from None


@functools.cache
def _probe(mode: str, base: str) -> str | None:
    """None if ``mode`` can be set up here, else the reason (cached per process)."""
    layout = detect_layout(Path(base))
    if layout is None:
        return f"no cgroup with cpuset and cpu controllers under {base} (neither v2 nor v1)"
    kind = mode_of(mode)
    controller = kind.controller
    assert controller is not None, f"{mode} needs no cgroup"
    probe = f"probe-{os.getpid()}"
    try:
        group = _make_group(layout, controller, probe)
        kind.probe(layout, group)
        _remove_group(group)
    except (OSError, RestrictionError) as exc:
        return f"cgroup v{layout.version} {controller} not writable: {exc}"
    return None


def choose_mode(requested: str, base: Path | None = None) -> tuple[str, str | None]:
    """The mode that will actually run, and why it differs from ``requested`` (None if it does not)."""
    if mode_of(requested).controller is None:
        return requested, None
    why = _probe(requested, str(base or CGROUP_BASE))
    if why is None:
        return requested, None
    return "affinity", f"{requested} unavailable ({why}); fell back to affinity"


# ---------------------------------------------------------------- the launcher

# Runs as ``python -S -c LAUNCHER spec cmd…``: joins the cgroups and sets the affinity of its own
# process, then execs the command in place (same pid), so nothing ever runs unrestricted.
# A separate exec, not a preexec_fn: preexec_fn is unsafe in a threaded parent such as a Ray actor.
LAUNCHER = (
    "import json,os,sys\n"
    "s=json.loads(sys.argv[1])\n"
    "for p in s['procs']:\n"
    "    f=open(p,'w'); f.write(str(os.getpid())); f.close()\n"
    "if s['cpus']: os.sched_setaffinity(0, s['cpus'])\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


@dataclass
class Restriction:
    """One process tree's restriction: ``prepare()``, ``wrap(cmd)`` to launch, ``repin``, ``verify``, ``cleanup()``.

    ``mode`` is what actually runs (see ``choose_mode``); ``node_cpus`` is the affinity a quota
    tree keeps (the whole node).
    """

    name: str
    mode: str
    cpus: frozenset[int]
    node_cpus: frozenset[int] = field(default_factory=lambda: frozenset(os.sched_getaffinity(0)))
    base: Path | None = None
    groups: dict[str, Path] = field(default_factory=dict)

    @property
    def kind(self) -> ModeKind:
        return mode_of(self.mode)

    @property
    def layout(self) -> CgroupLayout | None:
        return detect_layout(self.base) if self.kind.controller is not None else None

    def prepare(self) -> None:
        """Create and configure the cgroup (cpuset, quota); nothing for affinity."""
        if not self.cpus:
            raise RestrictionError(f"{self.name}: empty core set")
        kind = self.kind
        if kind.controller is None:
            return
        layout = self.layout
        if layout is None:
            raise RestrictionError(f"{self.name}: mode {self.mode} needs cgroups, none found")
        group = _make_group(layout, kind.controller, self.name)
        self.groups[kind.controller] = group
        kind.configure(layout, group, self.cpus)

    def launch_affinity(self) -> frozenset[int]:
        return self.kind.launch_affinity(self.cpus, self.node_cpus)

    def wrap(self, cmd: list[str], python: str | None = None) -> list[str]:
        """``cmd`` prefixed by the launcher that restricts itself, then execs ``cmd``."""
        spec = {"procs": [str(g / "cgroup.procs") for g in self.groups.values()],
                "cpus": sorted(self.launch_affinity())}
        return [python or sys.executable, "-S", "-c", LAUNCHER, json.dumps(spec, separators=(",", ":")), *cmd]

    def repin(self, root_pid: int, cpus: frozenset[int]) -> None:
        """Move the live tree to ``cpus`` (quota: to ``len(cpus)`` cores of bandwidth)."""
        self.kind.repin(self.layout, self.groups, root_pid, frozenset(cpus))
        self.cpus = frozenset(cpus)

    def verify(self, root_pid: int, *, strict: bool = False) -> Verification:
        return verify_tree(root_pid, self.cpus, self.mode, strict=strict, base=self.base)

    def cleanup(self) -> None:
        """Remove our cgroups (their processes must be gone). Idempotent."""
        for controller, group in list(self.groups.items()):
            _remove_group(group)
            del self.groups[controller]

    def cpu_stat(self) -> dict[str, int]:
        """The counters of the group's ``cpu.stat`` (with the cpu controller ``nr_periods``, ``nr_throttled`` and
        ``throttled_usec``, v1's ``throttled_time`` converted; v2 adds ``usage_usec``); empty for affinity."""
        for group in self.groups.values():
            return parse_cpu_stat(group / "cpu.stat")
        return {}

    def describe(self) -> dict[str, str]:
        out = {"restriction_mode": self.mode, "restriction_cpus": format_cpulist(self.cpus)}
        for controller, group in self.groups.items():
            out[f"cgroup_{controller}"] = str(group)
        out.update(self.kind.describe(self.cpus))
        return out


# ---------------------------------------------------------------- process trees

def tree_pids(root_pid: int) -> list[int]:
    """The root and all its descendants that exist now (psutil; processes may vanish meanwhile)."""
    try:
        root = psutil.Process(root_pid)
        kids = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [root_pid] + [k.pid for k in kids]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process. A zombie is not, nor a process whose main thread is a zombie while
    its other threads are still on their way out (a SIGKILLed server: ``waitpid`` reports it only after its
    last thread has exited, so until then ``Popen.poll()`` still says it runs)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return []


def thread_cpus(pid: int, tid: int) -> frozenset[int] | None:
    """A thread's ``Cpus_allowed_list``; None if it has exited."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return parse_cpulist(line.split(":", 1)[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def set_tree_affinity(root_pid: int, cpus: frozenset[int], passes: int = 5) -> int:
    """sched_setaffinity on every thread of every process of the tree; repeated until a pass changes
    nothing, because a thread spawned mid-pass copies its creator's old mask. Returns threads set."""
    changed_total = 0
    for _ in range(passes):
        changed = 0
        for pid in tree_pids(root_pid):
            for tid in thread_ids(pid):
                if thread_cpus(pid, tid) == cpus:
                    continue
                try:
                    os.sched_setaffinity(tid, cpus)
                    changed += 1
                except (ProcessLookupError, FileNotFoundError):
                    pass
        changed_total += changed
        if not changed:
            return changed_total
    return changed_total


def process_cgroup(pid: int, layout: CgroupLayout, controller: str) -> Path | None:
    """The folder of ``pid``'s cgroup for ``controller``; None if the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if (layout.version == 2 and ctrls == "") or (layout.version == 1 and controller in ctrls.split(",")):
            return layout.hierarchy(controller) / path.lstrip("/")
    return None


# ---------------------------------------------------------------- verification

@dataclass(frozen=True)
class Verification:
    """What every thread of a tree was allowed, against the assignment.

    ``ok`` means no thread may run outside ``expected`` (a thread narrowed to a subset, as vLLM's
    OMP binding does, is fine unless ``strict``), and for quota that every process's cgroup
    has ``cpu.max = len(expected)*100000 100000``. ``allowed`` maps ``"pid/tid"`` to its cpu list.
    """

    ok: bool
    mode: str
    expected: str
    processes: int
    threads: int
    violations: tuple[str, ...] = ()
    allowed: dict[str, str] = field(default_factory=dict)
    quota: str | None = None

    def summary(self) -> dict[str, int]:
        """cpu list → number of threads allowed exactly that."""
        out: dict[str, int] = {}
        for cpus in self.allowed.values():
            out[cpus] = out.get(cpus, 0) + 1
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["violations"] = list(self.violations)
        d["summary"] = self.summary()
        return d


def verify_tree(root_pid: int, expected: frozenset[int], mode: str = "affinity", *, strict: bool = False,
                base: Path | None = None) -> Verification:
    """Read ``Cpus_allowed_list`` of every thread of every process under ``root_pid`` and compare."""
    expected = frozenset(expected)
    pids = tree_pids(root_pid)
    if not pids:
        return Verification(False, mode, format_cpulist(expected), 0, 0, (f"pid {root_pid} is gone",))
    violations: list[str] = []
    allowed: dict[str, str] = {}
    quota_seen: str | None = None
    kind = mode_of(mode)
    controller = kind.controller
    layout = detect_layout(base) if controller is not None else None
    nproc = 0
    for pid in pids:
        tids = thread_ids(pid)
        if not tids:
            continue  # exited while we looked
        nproc += 1
        if controller is not None:
            group = process_cgroup(pid, layout, controller) if layout else None
            if layout and not _in_assigned_group(group, kind, layout, expected):
                # An exiting task is moved to the root cgroup (v1) before it is a zombie: look again.
                time.sleep(0.05)
                if _exiting(pid):
                    continue
                group = process_cgroup(pid, layout, controller)
            try:
                if group is None:
                    violations.append(f"pid {pid}: no {controller} cgroup found")
                else:
                    seen = kind.reading(layout, group)  # type: ignore[arg-type]
                    if not kind.pins:  # the limit is time, not cores: record what it read
                        quota_seen = seen
                    if seen != kind.wanted(expected):
                        violations.append(kind.violation(pid, group, seen, expected))
            except FileNotFoundError:
                violations.append(f"pid {pid}: cgroup {group} unreadable")
        for tid in tids:
            cpus = thread_cpus(pid, tid)
            if cpus is None:
                continue
            allowed[f"{pid}/{tid}"] = format_cpulist(cpus)
            if not kind.pins:
                continue  # throttled, not pinned: any cpu is allowed
            if not cpus <= expected or (strict and cpus != expected):
                violations.append(f"pid {pid} tid {tid}: allowed {format_cpulist(cpus)}, "
                                  f"want {'exactly' if strict else 'within'} {format_cpulist(expected)}")
    return Verification(ok=not violations and nproc > 0, mode=mode, expected=format_cpulist(expected),
                        processes=nproc, threads=len(allowed), violations=tuple(violations), allowed=allowed,
                        quota=quota_seen)


def _in_assigned_group(group: Path | None, kind: ModeKind, layout: Any, expected: frozenset[int]) -> bool:
    try:
        return group is not None and kind.reading(layout, group) == kind.wanted(expected)
    except FileNotFoundError:
        return False


def _exiting(pid: int) -> bool:
    """True for a process that is gone or a zombie (its cgroup no longer says where it ran)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def verify_self(expected: frozenset[int], *, strict: bool = True) -> Verification:
    """Verify this process (the workload client) and its children are within ``expected``."""
    return verify_tree(os.getpid(), expected, "affinity", strict=strict)


__all__ = ["Affinity", "CgroupLayout", "Cpuset", "LAUNCHER", "MODES", "Mode", "ModeKind", "Quota", "Restriction",
           "RestrictionError", "Verification", "mode_of",
           "parse_cpu_stat", "throttling",
           "choose_mode", "detect_layout", "process_cgroup", "set_tree_affinity",
           "pid_alive", "thread_cpus", "tree_pids", "verify_self", "verify_tree"]
