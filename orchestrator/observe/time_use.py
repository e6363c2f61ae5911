"""How much of the time a sweep held its replicas was spent measuring: the share inside windows.

Users pay for GPU hours, and a sweep spends most of them starting vLLM, so this share is the figure
every start-up saving is judged by. A *lease* is one node slot held for one replica (its GPUs and
cores, from the request to start it until it is stopped): a fresh trial, a repin group or a shared
start. Its held time is cut into phases, each moment counted once:

- ``starting``: the replica start (or a re-pin) was requested until it answered, or failed;
- ``warmup``: the protocol's unmeasured warm-up run;
- ``window``: a measurement window;
- ``crosscheck``: the bare client's replay of a window;
- ``teardown``: the stop was requested until the replica was gone;
- ``idle``: held and none of the above (core allocation, checks, results between windows).

Idle time is split further by what the executor was doing then: the last *step* it entered before
the moment (a ``step:<name>`` event: ``prepare`` builds the window's text, ``reset`` empties the prefix
cache, ``scrape`` ends the window's telemetry, ``verify`` re-reads every thread's cores, ``finish``
hands the records back, ``result`` builds the trial's result and ``next`` runs from the executor's
return to the next trial's first step: the controller and writer). The ``<unit>_idle_in_<step>_s``
figures add up to ``<unit>_idle_s``; the moments before the first step are ``idle_in_other``.

Where two spans overlap, the moment goes to the first of ``window, crosscheck, warmup, starting,
teardown``. Across leases the time is weighted by what the lease holds: GPU-seconds, a lease's held
time times its GPUs; a CPU-only lease (0 GPUs) counts its cores instead, in core-seconds, and the two
units are never added. Overlapping leases on one node each count their own. All pure; times are
seconds on any one clock the sweep shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PHASES = ("starting", "warmup", "window", "crosscheck", "teardown", "idle")
PRIORITY = ("window", "crosscheck", "warmup", "starting", "teardown")  # who gets a moment two spans share
# Event names for ``timeline_from_events``: what each begins or ends.
BEGINS = {"start": "starting", "repin": "starting", "warmup": "warmup", "window": "window",
          "crosscheck": "crosscheck", "stop": "teardown"}
STEP = "step:"  # ``step:<name>``: the executor entered a step (what the idle time after it is spent on)
ENDS = {"ready": "starting", "repinned": "starting", "start_failed": "starting", "warmup_end": "warmup",
        "window_end": "window", "crosscheck_end": "crosscheck", "stopped": "teardown"}


@dataclass(frozen=True)
class Span:
    """One phase of a lease, from ``start`` to ``end`` (seconds)."""

    phase: str
    start: float
    end: float

    def __post_init__(self) -> None:
        if self.phase not in PRIORITY:
            raise ValueError(f"unknown phase {self.phase!r}: one of {', '.join(PRIORITY)}")
        if self.end < self.start:
            raise ValueError(f"{self.phase} span ends ({self.end}) before it starts ({self.start})")


@dataclass(frozen=True)
class LeaseTimeline:
    """One lease: held from ``held_from`` to ``held_to`` with ``gpus`` GPUs and ``cores`` cores on ``node``."""

    lease: str
    held_from: float
    held_to: float
    gpus: int = 0
    cores: int = 0
    spans: tuple[Span, ...] = ()
    node: str = ""
    steps: tuple[tuple[str, float], ...] = ()  # (step, entered at), in order: what the idle time was spent on

    def __post_init__(self) -> None:
        if self.held_to < self.held_from:
            raise ValueError(f"lease {self.lease} is released ({self.held_to}) before it is held ({self.held_from})")
        if self.gpus < 0 or self.cores < 0:
            raise ValueError(f"lease {self.lease}: negative gpus or cores")

    @property
    def unit(self) -> str:
        """``gpu`` when the lease holds GPUs, else ``core``: what its time is weighted by."""
        return "gpu" if self.gpus > 0 else "core"

    @property
    def weight(self) -> int:
        return self.gpus if self.gpus > 0 else self.cores


@dataclass(frozen=True)
class LeaseShare:
    """A lease's held seconds by phase (unweighted), and the share of them inside windows."""

    lease: str
    node: str
    unit: str
    weight: int
    held_s: float
    phases: dict[str, float]
    idle: dict[str, float] = field(default_factory=dict)  # idle seconds by step (add up to phases["idle"])

    @property
    def window_share(self) -> float | None:
        """window seconds / held seconds (None for a lease held no time)."""
        return self.phases["window"] / self.held_s if self.held_s > 0 else None


@dataclass(frozen=True)
class UnitShare:
    """All leases of one unit: held ``unit``-seconds by phase (each lease's seconds times its weight)."""

    unit: str
    leases: int
    held: float
    phases: dict[str, float] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)  # weighted idle seconds by step

    @property
    def window_share(self) -> float | None:
        """sum(window_s * weight) / sum(held_s * weight) over the leases (None when nothing was held)."""
        return self.phases["window"] / self.held if self.held > 0 else None


def _pieces(t: LeaseTimeline) -> list[tuple[str, float, float]]:
    """The held time cut into ``(phase, from, to)`` pieces: spans clipped to the held time, a moment in
    several spans given to the first in ``PRIORITY``, what no span covers ``idle``; step entries cut too."""
    lo, hi = t.held_from, t.held_to
    spans = [(s.phase, max(lo, s.start), min(hi, s.end)) for s in t.spans]
    spans = [s for s in spans if s[2] > s[1]]
    steps = [at for _, at in t.steps if lo < at < hi]
    cuts = sorted({lo, hi, *(s[1] for s in spans), *(s[2] for s in spans), *steps})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        covering = [p for p, s, e in spans if s <= a and e >= b]
        out.append((min(covering, key=PRIORITY.index) if covering else "idle", a, b))
    return out


def phase_seconds(t: LeaseTimeline) -> dict[str, float]:
    """Seconds of each phase within the lease's held time; they add up to the held time.

    Spans are clipped to the held time; a moment in several spans goes to the first in ``PRIORITY``;
    what no span covers is ``idle``."""
    out = dict.fromkeys(PHASES, 0.0)
    for phase, a, b in _pieces(t):
        out[phase] += b - a
    return out


def idle_seconds(t: LeaseTimeline) -> dict[str, float]:
    """The lease's idle seconds by the step the executor had last entered (``other`` before any); they add
    up to :func:`phase_seconds`'s ``idle``."""
    out: dict[str, float] = {}
    for phase, a, b in _pieces(t):
        if phase != "idle":
            continue
        entered = [name for name, at in t.steps if at <= a]
        step = entered[-1] if entered else "other"
        out[step] = out.get(step, 0.0) + b - a
    return out


def lease_share(t: LeaseTimeline) -> LeaseShare:
    """The lease's phases and window share."""
    return LeaseShare(t.lease, t.node, t.unit, t.weight, t.held_to - t.held_from, phase_seconds(t), idle_seconds(t))


def unit_shares(timelines: Iterable[LeaseTimeline]) -> dict[str, UnitShare]:
    """The whole sweep, per unit (``gpu``, ``core``): weighted held time by phase and the window share."""
    acc: dict[str, tuple[int, float, dict[str, float], dict[str, float]]] = {}
    for t in timelines:
        s = lease_share(t)
        n, held, phases, idle = acc.get(s.unit, (0, 0.0, dict.fromkeys(PHASES, 0.0), {}))
        for step, v in s.idle.items():
            idle[step] = idle.get(step, 0.0) + v * s.weight
        acc[s.unit] = (n + 1, held + s.held_s * s.weight,
                       {p: phases[p] + s.phases[p] * s.weight for p in PHASES}, idle)
    return {u: UnitShare(u, n, held, phases, idle) for u, (n, held, phases, idle) in sorted(acc.items())}


def between_leases(timelines: Iterable[LeaseTimeline]) -> dict[str, float]:
    """Per unit, the seconds a node held by the sweep had no lease at all, between one lease's release
    and the next lease's hold on that node (writing results, starting the next replica's actor,
    reserving its placement group), weighted by the next lease's GPUs (or cores). A sweep that keeps
    a node reserved pays for these too. Overlapping leases leave no gap."""
    by_node: dict[str, list[LeaseTimeline]] = {}
    for t in timelines:
        by_node.setdefault(t.node, []).append(t)
    out: dict[str, float] = {}
    for leases in by_node.values():
        leases.sort(key=lambda t: t.held_from)
        free_from = leases[0].held_to
        for t in leases[1:]:
            if t.held_from > free_from:
                out[t.unit] = out.get(t.unit, 0.0) + (t.held_from - free_from) * t.weight
            free_from = max(free_from, t.held_to)
    return out


def share_metrics(shares: dict[str, UnitShare], between: dict[str, float] | None = None) -> dict[str, float]:
    """Flat figures for the sweep's run: ``<unit>_held_s``, ``<unit>_<phase>_s`` and ``<unit>_window_share``
    (e.g. ``gpu_window_share``), each unit labelled, never added to another; with ``between``
    (:func:`between_leases`) also ``<unit>_between_leases_s`` and ``<unit>_node_window_share``, the
    window seconds over held plus between-lease seconds."""
    out: dict[str, float] = {}
    for u, s in shares.items():
        out[f"{u}_held_s"] = round(s.held, 3)
        out.update({f"{u}_{p}_s": round(v, 3) for p, v in s.phases.items()})
        out.update({f"{u}_idle_in_{step}_s": round(v, 3) for step, v in sorted(s.idle.items())})
        if s.window_share is not None:
            out[f"{u}_window_share"] = round(s.window_share, 4)
        if between is not None:
            gap = between.get(u, 0.0)
            out[f"{u}_between_leases_s"] = round(gap, 3)
            if s.held + gap > 0:
                out[f"{u}_node_window_share"] = round(s.phases["window"] / (s.held + gap), 4)
    return out


_UNIT_NAMES = {"gpu": ("GPU-held", "GPU-s"), "core": ("core-held (CPU-only replicas)", "core-s")}


def describe_time_use(metrics: dict[str, float]) -> list[str]:
    """One line per unit of :func:`share_metrics`'s figures (also read back from the sweep's run), e.g.
    ``GPU-held time: 1200 GPU-s, 21.0% inside windows (starting 62.5%, warmup 4.1%, ...)``."""
    out = []
    for unit, (what, sec) in _UNIT_NAMES.items():
        held = metrics.get(f"{unit}_held_s")
        if not held:
            continue
        rest = ", ".join(f"{p} {metrics.get(f'{unit}_{p}_s', 0.0) / held:.1%}" for p in PHASES if p != "window")
        share = metrics.get(f"{unit}_window_share", metrics.get(f"{unit}_window_s", 0.0) / held)
        line = f"{what} time: {held:.0f} {sec}, {share:.1%} inside measurement windows ({rest})"
        gap = metrics.get(f"{unit}_between_leases_s")
        if gap is not None:
            line += (f"; {gap:.0f} {sec} more between leases on the same node, "
                     f"{metrics.get(f'{unit}_node_window_share', 0.0):.1%} inside windows counting them")
        out.append(line)
        idle = sorted(((k[len(f"{unit}_idle_in_"):-2], v) for k, v in metrics.items()
                       if k.startswith(f"{unit}_idle_in_") and k.endswith("_s") and v >= 0.0005 * held),
                      key=lambda kv: (-kv[1], kv[0]))  # the steps that show at one decimal
        if idle:
            out.append("  idle by step: " + ", ".join(f"{step} {v / held:.1%}" for step, v in idle))
    return out


def timeline_from_events(lease: str, events: Sequence[tuple[str, float]], *, gpus: int = 0, cores: int = 0,
                         node: str = "", held_from: float | None = None, held_to: float | None = None) -> LeaseTimeline:
    """A lease from what its executor saw, as ``(event, time)`` in order of time.

    Events come in pairs, one phase each: ``start``/``ready`` (starting), ``repin``/``repinned``,
    ``warmup``/``warmup_end``, ``window``/``window_end``, ``crosscheck``/``crosscheck_end``,
    ``stop``/``stopped`` (teardown). ``start_failed`` ends a start that never answered. A phase
    still open at the next ``stop`` (or at the end) ends there. ``step:<name>`` events are the steps
    idle time is split by. The lease is held from ``held_from`` (default: the first event) to
    ``held_to`` (default: the last)."""
    if not events:
        raise ValueError(f"lease {lease}: no events")
    open_at: dict[str, float] = {}
    spans: list[Span] = []
    steps: list[tuple[str, float]] = []
    for name, at in events:
        if name.startswith(STEP):
            steps.append((name[len(STEP):], at))
        elif name in BEGINS:
            if name == "stop":
                spans += [Span(p, s, at) for p, s in open_at.items()]
                open_at.clear()
            open_at[BEGINS[name]] = at
        elif name in ENDS:
            if ENDS[name] in open_at:
                spans.append(Span(ENDS[name], open_at.pop(ENDS[name]), at))
        else:
            raise ValueError(f"lease {lease}: unknown event {name!r}")
    last = events[-1][1] if held_to is None else held_to
    spans += [Span(p, s, max(s, last)) for p, s in open_at.items()]
    first = events[0][1] if held_from is None else held_from
    return LeaseTimeline(lease, first, last, gpus, cores, tuple(sorted(spans, key=lambda s: s.start)), node,
                         tuple(steps))


__all__ = ["BEGINS", "ENDS", "PHASES", "PRIORITY", "LeaseShare", "between_leases", "LeaseTimeline", "Span", "UnitShare", "describe_time_use",
           "idle_seconds", "lease_share", "STEP",
           "phase_seconds", "share_metrics", "timeline_from_events", "unit_shares"]
