"""What the terminal shows while a sweep runs: where the sweep stands, what each running trial is doing,
and, at the end, the trials' warnings.

- **Live** (a terminal): one line for the sweep (trials done, failed and left, and an ETA from the
  trial times measured so far, :func:`eta_s`), then one line per running trial (one per lane when
  lanes run side by side): its phase and how long it has been in it, and the trial's time so far.
  A trial's end (``COMPLETED in 139 s``, a failure with its kind, a skip) is printed above it, to stay.
- **Plain** (no terminal: CI, ``ray job submit``'s log, a pipe): the same events as lines, one per
  trial start, phase change and end, nothing redrawn.
- **Warnings** are kept to the end (:func:`warning_lines`): one that most trials share (the same
  text once its figures are taken out, :func:`warning_key`) is one line with its count; the others
  are printed with their trial.

The phases come from the executor and the controller's writer (``on_phase``, see
:data:`orchestrator.control.controller.Phase`); trial starts and ends from the controller's
``on_progress``. What is known of the window is its length so far, against the workload's
``max_duration_s``: the requests are sent inside one call to the workload actor, which reports
nothing until the window ends. :class:`SweepState` and the functions here are pure and take the
time as an argument; :class:`SweepDisplay` adds the clock, a lock (events come from the lanes and
the writer) and the console.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.text import Text

from orchestrator.control.controller import Phase
from orchestrator.control.trial import Trial, TrialState
from orchestrator.values.results import TrialResult
from orchestrator.values.trial import SweepPlan, TrialSpec

PHASE_LABELS: dict[str, str] = {"placing": "placing", "starting": "starting replica",
                                "repinning": "re-pinning replica", "warmup": "warm-up", "window": "window",
                                "crosscheck": "cross-check", "stopping": "stopping replica", "writing": "writing"}


def label_of(spec: TrialSpec) -> str:
    """How a trial is named on every line: ``[id] model workload gpus= cores=``."""
    return f"[{spec.trial_id}] {spec.model.name} {spec.workload.name} gpus={spec.gpus} cores={spec.cores}"


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta_s(durations: Sequence[float], pending: int, running_elapsed: Sequence[float], lanes: int) -> float | None:
    """Seconds until the sweep ends, from the trial times measured so far; None before the first is measured.

    With ``m`` the mean of ``durations`` (completed trials), a running trial has ``max(m - elapsed, 0)``
    left and a pending one ``m``; the lanes share that work:
    ``(sum(max(m - e, 0) for e in running_elapsed) + pending * m) / max(lanes, 1)``."""
    if not durations:
        return None
    m = sum(durations) / len(durations)
    work = sum(max(m - e, 0.0) for e in running_elapsed) + pending * m
    return work / max(lanes, 1)


@dataclass
class Running:
    """A trial being run: since when (first seen, this attempt or an earlier one), its phase and since when."""

    label: str
    since: float
    attempt: int = 1
    phase: str | None = None
    phase_since: float = 0.0
    window_s: float | None = None  # the window's longest (the workload's max_duration_s)


@dataclass
class SweepState:
    """Where a sweep stands, from the events it has seen (pure: every time is passed in)."""

    total: int
    labels: dict[str, str] = field(default_factory=dict)  # trial id -> label_of
    windows: dict[str, float] = field(default_factory=dict)  # trial id -> its window's longest, seconds
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    durations: list[float] = field(default_factory=list)  # seconds, completed trials
    running: dict[str, Running] = field(default_factory=dict)
    lanes: int = 1  # the most trials seen running at once
    ended: set[str] = field(default_factory=set)  # final (completed, failed) or skipped
    warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)  # trial id -> its final result's

    @classmethod
    def of(cls, plan: SweepPlan) -> SweepState:
        return cls(len(plan), {t.trial_id: label_of(t) for t in plan.trials},
                   {t.trial_id: float(t.workload.max_duration_s) for t in plan.trials
                    if getattr(t.workload, "max_duration_s", None)})

    @property
    def left(self) -> int:
        return self.total - self.completed - self.failed - self.skipped

    def _entry(self, trial_id: str, now: float) -> Running:
        r = self.running.get(trial_id)
        if r is None:
            r = self.running[trial_id] = Running(self.labels.get(trial_id, f"[{trial_id}]"), now,
                                                 window_s=self.windows.get(trial_id))
            self.lanes = max(self.lanes, len(self.running))
        return r

    def start(self, trial_id: str, attempt: int, now: float) -> None:
        """An attempt began (the lane's phases may have come first: the controller's events pass the writer)."""
        self._entry(trial_id, now).attempt = attempt

    def phase(self, trial_id: str, phase: Phase | str, now: float) -> bool:
        """The trial entered ``phase``; False when it was in it already, or has ended."""
        if trial_id in self.ended:
            return False
        r = self._entry(trial_id, now)
        if r.phase == phase:
            return False
        r.phase, r.phase_since = phase, now
        return True

    def end(self, trial_id: str, state: TrialState, now: float, warnings: Sequence[str] = ()) -> float:
        """The attempt ended in ``state``; returns the trial's seconds so far. A retry stays running."""
        r = self.running.get(trial_id)
        took = now - r.since if r is not None else 0.0
        if state is TrialState.RETRYING:
            return took
        self.running.pop(trial_id, None)
        self.ended.add(trial_id)
        self.warnings[trial_id] = tuple(warnings)
        if state is TrialState.COMPLETED:
            self.completed += 1
            self.durations.append(took)
        else:
            self.failed += 1
        return took

    def skip(self, trial_id: str) -> None:
        self.skipped += 1
        self.running.pop(trial_id, None)
        self.ended.add(trial_id)

    def eta(self, now: float) -> float | None:
        return eta_s(self.durations, self.left - len(self.running), [now - r.since for r in self.running.values()],
                     self.lanes)


def phase_text(r: Running, now: float) -> str:
    """``window 35 s (at most 2 min 00 s)``, ``warm-up 4 s``; ``running`` before (or without) a phase."""
    if r.phase is None:
        return "running"
    text = f"{PHASE_LABELS.get(r.phase, r.phase)} {duration(now - r.phase_since)}"
    if r.phase == "window" and r.window_s:
        text += f" (at most {duration(r.window_s)})"
    return text


def phase_line(r: Running, now: float) -> str:
    """The plain line of a phase change: ``[id] ...: window (at most 2 min 00 s), 1 min 05 s into the trial``."""
    phase = PHASE_LABELS.get(r.phase or "", r.phase or "running")
    if r.phase == "window" and r.window_s:
        phase += f" (at most {duration(r.window_s)})"
    return f"{r.label}: {phase}, {duration(now - r.since)} into the trial"


def status_lines(state: SweepState, now: float) -> list[str]:
    """What the live display shows: the sweep's line, then one per running trial, oldest first."""
    done = f"{state.completed + state.skipped} done" + (f" ({state.skipped} skipped)" if state.skipped else "")
    head = f"{done}, {state.failed} failed, {state.left} left of {state.total} trials"
    if state.left:
        eta = state.eta(now)
        head += f" · ETA {duration(eta)}" if eta is not None else " · ETA after the first trial"
    lines = [head]
    for r in sorted(state.running.values(), key=lambda r: r.since):
        attempt = f" (attempt {r.attempt})" if r.attempt > 1 else ""
        lines.append(f"  {r.label}{attempt}: {phase_text(r, now)} · trial {duration(now - r.since)}")
    return lines


def end_line(label: str, trial: Trial, result: TrialResult, took: float) -> str:
    """A trial attempt's end, as printed: ``COMPLETED in 139 s``, or the failure's kind and message."""
    detail = f" {result.error_kind.value}: {result.message}" if not result.ok else ""
    warned = f" ({len(result.warnings)} warning{'s' if len(result.warnings) > 1 else ''}, listed at the end)" \
        if result.warnings and trial.done else ""
    return f"{label}: {trial.state.value} in {took:.0f} s{detail}{warned}"


# ---------------------------------------------------------------- warnings

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_LIST = re.compile(r"#(?:\s*[,\-]\s*#)+")  # "0, 1", "0-3,8": a core list is one figure


def warning_key(text: str) -> str:
    """A warning with its figures taken out: ``client [1], replica [0, 1]`` and ``client [4], replica [0-3]``
    are the same warning."""
    return _LIST.sub("#", _NUMBER.sub("#", text))


def warning_lines(warnings: Mapping[str, Sequence[str]], trials: int | None = None) -> list[str]:
    """The sweep's warnings, each once: first those seen on a few trials, with their trial
    (``[id] warning: ...``, in trial order), then one line for each warning that more than half of
    ``trials`` (by default, every trial in ``warnings``) and at least two share
    (``warning on 7 of 8 trials: ...``, the first trial's text, saying when the figures differ)."""
    trials = len(warnings) if trials is None else trials
    seen: dict[str, list[tuple[str, str]]] = {}
    for tid, texts in warnings.items():
        for text in dict.fromkeys(texts):  # a trial's repeats of one warning count once
            seen.setdefault(warning_key(text), []).append((tid, text))
    common = {k for k, hits in seen.items() if len({t for t, _ in hits}) >= 2 and len({t for t, _ in hits}) > trials / 2}
    out = [f"[{tid}] warning: {text}" for tid, texts in warnings.items() for text in dict.fromkeys(texts)
           if warning_key(text) not in common]
    for key in (k for k in seen if k in common):
        hits = seen[key]
        n = len({t for t, _ in hits})
        first_tid, first = hits[0]
        varies = f" (figures differ; this is [{first_tid}]'s)" if len({x for _, x in hits}) > 1 else ""
        out.append(f"warning on {n} of {trials} trials{varies}: {first}")
    return out


# ---------------------------------------------------------------- the display

class SweepDisplay:
    """The controller's ``on_progress`` and the executor's ``on_phase``, drawn on ``console``.

    Use as a context manager around the sweep: live while inside when the console is a terminal
    (``live``: force it either way), plain lines otherwise; leaving prints the warnings."""

    def __init__(self, console: Console, plan: SweepPlan, *, clock: Callable[[], float] = time.monotonic,
                 live: bool | None = None, refresh_per_second: float = 1.0) -> None:
        self.console = console
        self.clock = clock
        self.state = SweepState.of(plan)
        self.live = console.is_terminal if live is None else live
        self._lock = threading.Lock()
        self._refresh = refresh_per_second
        self._live: Live | None = None

    # ------------------------------------------------------------------ events
    def on_progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        label = label_of(spec)
        now = self.clock()
        with self._lock:  # print outside it: a live refresh holds the console while it asks for the lines
            if trial.state is TrialState.SKIPPED:
                self.state.skip(spec.trial_id)
                line: str | None = f"{label}: already finished in MLflow, skipped"
            elif result is None:
                self.state.start(spec.trial_id, trial.attempts, now)
                line = None if self.live else f"{label}: running (attempt {trial.attempts})"
            else:
                took = self.state.end(spec.trial_id, trial.state, now, result.warnings)
                line = end_line(label, trial, result, took)
        if line is not None:
            self.console.print(line, soft_wrap=True, markup=False)

    def on_phase(self, trial_id: str, phase: Phase) -> None:
        now = self.clock()
        with self._lock:
            changed = self.state.phase(trial_id, phase, now)
            line = phase_line(self.state.running[trial_id], now) if changed and not self.live else None
        if line is not None:
            self.console.print(line, soft_wrap=True, markup=False)

    # ------------------------------------------------------------------ drawing
    def lines(self) -> list[str]:
        with self._lock:
            return status_lines(self.state, self.clock())

    def _renderable(self) -> Text:
        try:
            return Text("\n".join(self.lines()), no_wrap=True, overflow="ellipsis")
        except Exception as exc:  # noqa: BLE001 - a display bug must not stop the refresh, or the sweep
            return Text(f"(progress display failed: {type(exc).__name__}: {exc})")

    def __enter__(self) -> SweepDisplay:
        if self.live:
            self._live = Live(console=self.console, get_renderable=self._renderable,
                              refresh_per_second=self._refresh, transient=True, redirect_stderr=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        with self._lock:
            lines = warning_lines(self.state.warnings)
        for line in lines:
            self.console.print(line, soft_wrap=True, markup=False)


__all__ = ["PHASE_LABELS", "Running", "SweepDisplay", "SweepState", "duration", "end_line", "eta_s", "label_of",
           "phase_line", "phase_text", "status_lines", "warning_key", "warning_lines"]
