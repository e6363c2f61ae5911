"""A window's figures from what the node sampled (pure): the requests' span in the sampler's time, the
telemetry rows inside it, the CPU accounting and the per-role figures between two counter readings, and when
a GPU profile's capture starts inside a run. The replica actor (``replica_actor``) calls them at a window's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.node.accounting import CoreReading, span_figures
from orchestrator.node.attribution import RoleWindow, Snapshot, span_window
from orchestrator.node.restrict import throttling
from orchestrator.node.telemetry import rows_in_span, span_readings
from orchestrator.values.wire import WindowSpan


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
    cores and tree (:class:`~orchestrator.node.accounting.CoreReading`), its processes by role, and its
    cgroup's ``cpu.stat`` (empty without one: affinity)."""

    cores: CoreReading
    roles: Snapshot
    cgroup: Mapping[str, int] = field(default_factory=dict)


def window_counters(readings: Sequence[tuple[float, CounterReading]], t0: float, t1: float, root: int,
                    ncores: int) -> tuple[dict[str, float], RoleWindow | None, dict[str, float]]:
    """The CPU accounting (with a quota's throttling) and the per-role figures over ``[t0, t1]`` (the
    requests' span, in the sampler's seconds) from the sampler's counter readings ``(t, reading)`` (pure).

    All come from the same two readings, the first and the last inside the span
    (:func:`~orchestrator.node.telemetry.span_readings`), their differences scaled to the span's length;
    the foreign share divides by the span's seconds times ``ncores``. Returns (accounting metrics, role
    window or None without two readings apart, {``accounting_s``: the seconds between the two readings}).
    """
    pair = span_readings([t for t, _ in readings], t0, t1)
    if pair is None:
        return {}, None, {}
    (ta, a), (tb, b) = readings[pair[0]], readings[pair[1]]
    covered, span_s = tb - ta, max(0.0, t1 - t0)
    accounting = span_figures(a.cores, b.cores, covered, span_s, ncores)
    accounting.update(throttling(a.cgroup, b.cgroup, span_s / covered if covered > 0 else 0.0))
    return (accounting, span_window(a.roles, b.roles, root, covered, span_s), {"accounting_s": round(covered, 3)})


def profile_delay(run_s: float, capture_s: float) -> float:
    """When the GPU capture starts after a run of ``run_s`` opens: a quarter in (the load has ramped up),
    at most 10 s, and early enough that a ``capture_s`` capture ends inside the run."""
    return max(0.0, min(10.0, run_s / 4, run_s - capture_s - 1.0))


__all__ = ["CounterReading", "profile_delay", "span_bounds", "window_counters", "window_series"]
