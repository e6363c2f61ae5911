"""Who used the replica's cores during the window: the replica itself, or something else.

Why: restricting the replica to N cores keeps *it* on them, but nothing keeps other processes
off them (Ray's raylet and workers, the tracking server, the kernel's interrupts). At 1 core a
neighbour that wakes up now and then is a real slowdown that no per-thread check of the replica
can see. The accounting is cheap and exact enough to tell: the busy time of the replica's cores
(``/proc/stat`` per CPU, via psutil) minus the CPU time the replica's own process tree used (it
can run nowhere else) is the time *other* work took on those cores.

    foreign_s = sum over the replica's cores of (busy_after - busy_before)
                - (tree_cpu_after - tree_cpu_before)

Busy excludes idle and iowait; guest time is already in user. A process of the tree that exits
inside the window takes its CPU time with it, so ``foreign_s`` can only be over-estimated by
that; the replica's processes live as long as the server. Under ``quota`` mode the tree may run
on any core, so the figure is only meaningful for ``cpuset`` and ``affinity``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import psutil


def busy_seconds(times: Sequence[object], cores: Iterable[int]) -> float:
    """Summed non-idle CPU seconds of ``cores`` in one ``psutil.cpu_times(percpu=True)`` reading."""
    total = 0.0
    for c in cores:
        t = times[c]
        idle = t.idle + getattr(t, "iowait", 0.0)  # type: ignore[attr-defined]
        allt = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # type: ignore[arg-type]
        total += allt - idle
    return total


def tree_cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (threads included; vanished ones count 0)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system
    return total


@dataclass
class CoreAccounting:
    """Start at the window's start, ``stop()`` at its end; collaborators injectable for tests."""

    cores: tuple[int, ...]
    pids: Callable[[], list[int]]
    percpu: Callable[[], Sequence[object]] = lambda: psutil.cpu_times(percpu=True)
    _busy0: float = 0.0
    _tree0: float = 0.0
    clock: Callable[[], float] = time.monotonic
    _pids0: tuple[int, ...] = ()
    _t0: float = 0.0

    def start(self) -> "CoreAccounting":
        self._t0 = self.clock()
        self._pids0 = tuple(self.pids())
        self._tree0 = tree_cpu_seconds(self._pids0)
        self._busy0 = busy_seconds(self.percpu(), self.cores)
        return self

    def stop(self) -> dict[str, float]:
        busy = busy_seconds(self.percpu(), self.cores) - self._busy0
        # Same processes as at the start (a new child would bring its whole history in), plus
        # none: the server forks its workers before it is healthy.
        tree = tree_cpu_seconds(self._pids0) - self._tree0
        foreign = max(0.0, busy - tree)
        capacity = (self.clock() - self._t0) * len(self.cores)
        out = {"replica_cores_busy_s": busy, "replica_tree_cpu_s": tree, "replica_cores_foreign_cpu_s": foreign}
        if capacity > 0:
            out["replica_cores_foreign_frac"] = foreign / capacity  # of the cores' whole time in the window
        return out


__all__ = ["CoreAccounting", "busy_seconds", "tree_cpu_seconds"]
