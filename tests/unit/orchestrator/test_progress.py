"""The terminal's progress: the ETA, the live lines, the plain fallback and the warnings kept to the end (pure,
a fake clock, no Ray)."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from orchestrator.control.controller import SweepController
from orchestrator.control.trial import Trial, TrialState
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.progress import (
    PHASE_LABELS,
    SweepDisplay,
    SweepState,
    duration,
    eta_s,
    status_lines,
    warning_key,
    warning_lines,
)
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def plan_of(cores=(1, 2, 4)):
    return expand(parse_spec({
        "name": "t", "models": [{"name": "m", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1, "max_duration_s": 120}],
        "grid": {"cores": list(cores)},
    }))


def trial_in(tid: str, *states: TrialState) -> Trial:
    t = Trial(tid)
    for s in states:
        t.transition(s)
    return t


def ok(tid: str, *warnings: str) -> TrialResult:
    return TrialResult(tid, TrialStatus.COMPLETED, warnings=tuple(warnings))


# ---------------------------------------------------------------- ETA

def test_eta_is_the_mean_trial_time_over_what_is_left_shared_by_the_lanes():
    assert eta_s([], pending=3, running_elapsed=[10.0], lanes=1) is None  # nothing measured yet
    assert math.isclose(eta_s([100.0, 200.0], pending=2, running_elapsed=[], lanes=1), 300.0)
    # a running trial has the mean less its elapsed left, never less than nothing
    assert math.isclose(eta_s([100.0], pending=0, running_elapsed=[30.0, 250.0], lanes=1), 70.0)
    assert math.isclose(eta_s([100.0], pending=4, running_elapsed=[], lanes=2), 200.0)


def test_durations_read_as_a_person_would():
    assert [duration(s) for s in (4.4, 65, 3600 + 7 * 60)] == ["4 s", "1 min 05 s", "1 h 07 min"]


# ---------------------------------------------------------------- the state and its lines

def test_the_state_renders_the_sweep_line_and_one_line_per_running_trial():
    plan = plan_of()
    a, b, c = (t.trial_id for t in plan.trials)
    st = SweepState.of(plan)
    assert status_lines(st, 0.0) == ["0 done, 0 failed, 3 left of 3 trials · ETA after the first trial"]
    st.phase(a, "placing", 0.0)  # the lane's phase before the writer's start event
    st.start(a, 1, 1.0)
    st.phase(a, "starting", 2.0)
    st.phase(a, "window", 50.0)
    lines = status_lines(st, 80.0)
    assert lines[1] == f"  [{a}] m w gpus=0 cores=1: window 30 s (at most 2 min 00 s) · trial 1 min 20 s"
    assert st.end(a, TrialState.COMPLETED, 100.0) == 100.0
    st.start(b, 1, 100.0)
    st.phase(b, "warmup", 110.0)
    st.start(c, 1, 105.0)  # a second lane
    assert st.lanes == 2
    lines = status_lines(st, 120.0)
    # left: b (80 s to go of the 100 s mean), c (85 s), none pending; two lanes
    assert lines[0] == "1 done, 0 failed, 2 left of 3 trials · ETA 1 min 22 s"
    assert lines[1:] == [f"  [{b}] m w gpus=0 cores=2: warm-up 10 s · trial 20 s",
                         f"  [{c}] m w gpus=0 cores=4: running · trial 15 s"]
    st.end(b, TrialState.RETRYING, 130.0)  # a retry stays running
    assert b in st.running and st.failed == 0
    st.start(b, 2, 131.0)
    st.end(b, TrialState.FAILED, 140.0)
    st.skip(c)
    assert not st.phase(b, "writing", 141.0)  # a late phase of an ended trial brings it back to nothing
    assert status_lines(st, 150.0) == ["2 done (1 skipped), 1 failed, 0 left of 3 trials"]


# ---------------------------------------------------------------- the display

def test_without_a_terminal_each_event_is_one_plain_line():
    plan = plan_of(cores=(1,))
    [spec] = plan.trials
    tid = spec.trial_id
    console, clock = Console(record=True, width=200), Clock()
    assert not console.is_terminal
    display = SweepDisplay(console, plan, clock=clock)
    with display:
        display.on_progress(trial_in(tid, TrialState.RUNNING), spec, None)
        display.on_phase(tid, "placing")
        clock.t += 3
        display.on_phase(tid, "starting")
        display.on_phase(tid, "starting")  # no change: no line
        clock.t += 60
        display.on_phase(tid, "window")
        clock.t += 76
        display.on_phase(tid, "writing")
        display.on_progress(trial_in(tid, TrialState.RUNNING, TrialState.COMPLETED), spec,
                            ok(tid, "client shares cores with the replica (node too small): client [1], replica [0]"))
    label = f"[{tid}] m w gpus=0 cores=1"
    assert console.export_text().splitlines() == [
        f"{label}: running (attempt 1)",
        f"{label}: placing, 0 s into the trial",
        f"{label}: starting replica, 3 s into the trial",
        f"{label}: window (at most 2 min 00 s), 1 min 03 s into the trial",
        f"{label}: writing, 2 min 19 s into the trial",
        f"{label}: COMPLETED in 139 s (1 warning, listed at the end)",
        f"[{tid}] warning: client shares cores with the replica (node too small): client [1], replica [0]",
    ]


def test_failures_and_skips_keep_their_lines():
    plan = plan_of(cores=(1, 2))
    a, b = plan.trials
    console = Console(record=True, width=200)
    display = SweepDisplay(console, plan, clock=Clock())
    with display:
        display.on_progress(trial_in(a.trial_id, TrialState.SKIPPED), a, None)
        display.on_progress(trial_in(b.trial_id, TrialState.RUNNING, TrialState.FAILED), b,
                            TrialResult.failed(b.trial_id, ErrorKind.CANNOT_FIT, "no node"))
    assert console.export_text().splitlines() == [
        f"[{a.trial_id}] m w gpus=0 cores=1: already finished in MLflow, skipped",
        f"[{b.trial_id}] m w gpus=0 cores=2: FAILED in 0 s cannot_fit: no node"]


def test_on_a_terminal_the_live_lines_are_drawn_and_the_ends_stay():
    plan = plan_of(cores=(1,))
    [spec] = plan.trials
    console, clock = Console(record=True, width=120, force_terminal=True), Clock()
    display = SweepDisplay(console, plan, clock=clock, refresh_per_second=50)
    with display:
        display.on_progress(trial_in(spec.trial_id, TrialState.RUNNING), spec, None)
        display.on_phase(spec.trial_id, "crosscheck")
        clock.t += 5
        assert display.lines()[1].endswith(": cross-check 5 s · trial 5 s")
        display.on_progress(trial_in(spec.trial_id, TrialState.RUNNING, TrialState.COMPLETED), spec, ok(spec.trial_id))
    text = console.export_text()
    assert f"[{spec.trial_id}] m w gpus=0 cores=1: COMPLETED in 5 s" in text
    assert "running (attempt 1)" not in text and "into the trial" not in text  # no plain lines on a terminal


def test_a_display_that_raises_never_fails_a_trial():
    class FakeExecutor:
        def execute(self, trial, *, attempt=1):
            return ok(trial.trial_id)

    plan = plan_of(cores=(1, 2))

    def broken(*_a):
        raise RuntimeError("display bug")

    c = SweepController(plan, FakeExecutor(), on_progress=broken, on_phase=broken)
    assert [r.status for r in c.run()] == [TrialStatus.COMPLETED] * 2


# ---------------------------------------------------------------- warnings

def test_a_warning_differing_only_in_figures_is_one_warning():
    assert warning_key("client shares cores: client [1], replica [0, 1]") == \
        warning_key("client shares cores: client [4], replica [0-3,8]")
    assert warning_key("dispatch lag p99 1.2 ms is 1.0% of TTFT p50 116 ms") == \
        warning_key("dispatch lag p99 3 ms is 2.5% of TTFT p50 96.1 ms")
    assert warning_key("cross-check (bare) failed") != warning_key("cross-check (vllm-bench) failed")


@pytest.mark.parametrize("n", [8])
def test_a_warning_most_trials_share_is_one_line_with_its_count(n):
    lag = "dispatch lag p99 {} ms is 1.0% of TTFT p50 116 ms: the client may be the bottleneck"
    warnings = {f"t{i}": (lag.format(i + 1),) for i in range(n - 1)}
    warnings[f"t{n - 1}"] = ()
    warnings["t3"] += ("the prefix cache could not be reset before the window: it did not start empty",)
    assert warning_lines(warnings) == [
        "[t3] warning: the prefix cache could not be reset before the window: it did not start empty",
        f"warning on 7 of 8 trials (figures differ; this is [t0]'s): {lag.format(1)}"]


def test_warnings_on_a_few_trials_print_with_their_trial():
    same = "client shares cores with the replica (node too small): client [1], replica [0, 1]"
    assert warning_lines({"a": (same,), "b": (same,), "c": (), "d": ()}) == [
        f"[a] warning: {same}", f"[b] warning: {same}"]  # 2 of 4: not most
    assert warning_lines({"a": (same,), "b": (same,), "c": ()}) == [f"warning on 2 of 3 trials: {same}"]
    assert warning_lines({"a": (same, same)}) == [f"[a] warning: {same}"]  # one trial is never "most"


def test_the_lease_tells_its_trial_s_phases_and_a_broken_hook_is_only_logged():
    from orchestrator.control.ray_executor import PHASE_OF_EVENT, _Lease

    seen = []
    lease = _Lease("k", None, None, None, None, {}, trial="t1", on_phase=lambda tid, ph: seen.append((tid, ph)))
    for event in ("start", "ready", "warmup", "warmup_end", "window", "window_end", "crosscheck", "stop"):
        lease.mark(event)
    assert seen == [("t1", "starting"), ("t1", "warmup"), ("t1", "window"), ("t1", "crosscheck"), ("t1", "stopping")]
    assert [e for e, _ in lease.events][:2] == ["start", "ready"]  # the timeline keeps every event
    assert set(PHASE_OF_EVENT.values()) <= set(PHASE_LABELS)

    def broken(*_a):
        raise RuntimeError("display bug")

    _Lease("k", None, None, None, None, {}, trial="t1", on_phase=broken).mark("window")  # does not raise
