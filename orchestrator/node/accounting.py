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

Over a measured window, the figures cover the requests' span only (first send to last completion):
the window's sampler (:class:`~orchestrator.node.telemetry.TelemetrySampler`) takes a
:class:`CoreReading` (:meth:`CoreAccounting.read`) every period, and :func:`span_figures` takes the
two readings inside the span, scales their difference to the span's length and divides by the
span's capacity (span seconds x cores). :meth:`CoreAccounting.stop` (start to stop, nothing
between) is for a run whose span is its whole life (the bare cross-check's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import psutil


def busy_seconds(times: Sequence[object], cores: Iterable[int]) -> float:
    """Summed non-idle CPU seconds of ``cores`` in one ``psutil.cpu_times(percpu=True)`` reading."""
    total = 0.0
    for c in cores:
        t = times[c]
        idle = t.idle + getattr(t, "iowait", 0.0)  # type: ignore[attr-defined]
        allt = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # type: ignore[call-overload]
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


@dataclass(frozen=True)
class CoreReading:
    """One reading of the cumulative counters: the replica's cores' busy seconds, its tree's CPU seconds."""

    busy_s: float
    tree_s: float


def core_figures(busy_s: float, tree_s: float, seconds: float, ncores: int) -> dict[str, float]:
    """The figures of ``busy_s`` and ``tree_s`` used over ``seconds`` on ``ncores`` cores (pure):
    ``replica_cores_busy_s``, ``replica_tree_cpu_s``, ``replica_cores_foreign_cpu_s`` and, with a
    capacity, ``replica_cores_foreign_frac`` = foreign / (``seconds`` x ``ncores``)."""
    foreign = max(0.0, busy_s - tree_s)
    out = {"replica_cores_busy_s": busy_s, "replica_tree_cpu_s": tree_s, "replica_cores_foreign_cpu_s": foreign}
    capacity = seconds * ncores
    if capacity > 0:
        out["replica_cores_foreign_frac"] = foreign / capacity  # of the cores' whole time over ``seconds``
    return out


def span_figures(a: CoreReading, b: CoreReading, covered_s: float, span_s: float, ncores: int) -> dict[str, float]:
    """The figures over a span of ``span_s`` seconds from two readings ``covered_s`` apart, taken inside
    it (pure; :func:`~orchestrator.node.telemetry.span_readings` picks them): the differences are
    scaled by ``span_s / covered_s`` (the rates inside the span, over the whole span) and the foreign
    share divides by the span's capacity."""
    k = span_s / covered_s if covered_s > 0 else 0.0
    return core_figures((b.busy_s - a.busy_s) * k, (b.tree_s - a.tree_s) * k, span_s, ncores)


@dataclass
class CoreAccounting:
    """``start()`` fixes the tree's processes and takes the first reading; ``read()`` takes one (the
    window's sampler, every period); ``stop()`` gives the figures from start to now. Collaborators
    injectable for tests."""

    cores: tuple[int, ...]
    pids: Callable[[], list[int]]
    percpu: Callable[[], Sequence[object]] = lambda: psutil.cpu_times(percpu=True)
    _busy0: float = 0.0
    _tree0: float = 0.0
    clock: Callable[[], float] = time.monotonic
    _pids0: tuple[int, ...] = ()
    _t0: float = 0.0
    tree: Callable[[Iterable[int]], float] = tree_cpu_seconds

    def start(self) -> CoreAccounting:
        self._t0 = self.clock()
        # Same processes in every reading (a new child would bring its whole history in), plus
        # none: the server forks its workers before it is healthy.
        self._pids0 = tuple(self.pids())
        first = self.read()
        self._busy0, self._tree0 = first.busy_s, first.tree_s
        return self

    def read(self) -> CoreReading:
        """The counters now (after :meth:`start`, which fixes the processes)."""
        return CoreReading(busy_seconds(self.percpu(), self.cores), self.tree(self._pids0))

    def stop(self) -> dict[str, float]:
        last = self.read()
        return core_figures(last.busy_s - self._busy0, last.tree_s - self._tree0, self.clock() - self._t0,
                            len(self.cores))


__all__ = ["CoreAccounting", "CoreReading", "busy_seconds", "core_figures", "span_figures", "tree_cpu_seconds"]
