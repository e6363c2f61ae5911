"""SweepController's writer thread: observers and progress run on one thread fed by a queue, so a lane
starts its next trial while the last one's results are written (issue 16).

Fakes only (an in-process executor, recording observers); overlap and order are forced by events
(an observer gated on an executor's event), never by sleeping, and write times come from a step clock.
``slow_s`` only widens the window in which two calls at once, or a writer left behind, would show;
no assertion needs it to pass.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from orchestrator.control.controller import WRITER_THREAD, SweepController, _Writer
from orchestrator.control.trial import TrialState
from orchestrator.plan.expand import chains, expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus

WAIT = 5.0  # generous upper bound on any event wait; a passing test never waits this long


def plan(cores=(1, 2, 3), *, workloads=("w",), start=("fresh",), max_failures=1):
    return expand(parse_spec({
        "name": "wr", "max_failures": max_failures,
        "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": w, "kind": "agentic", "sessions": 1, "turns": 1} for w in workloads],
        "grid": {"cores": list(cores), "start": list(start)},
    }))


class Log:
    """One ordered list of events from every thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple] = []

    def add(self, *event):
        with self.lock:
            self.events.append(event)

    def index(self, *event):
        return self.events.index(event)

    def of(self, kind):
        return [e for e in self.events if e[0] == kind]


class FakeExecutor:
    """No lanes: the controller's sequential path. outcomes: cores -> ErrorKinds per attempt (NONE = ok)."""

    def __init__(self, log: Log, outcomes=None, interrupt_at=None):
        self.log = log
        self.outcomes = {k: list(v) for k, v in (outcomes or {}).items()}
        self.interrupt_at = interrupt_at
        self.started = {}  # (trial_id, attempt) -> Event, set when that execute begins
        self.guard = threading.Lock()

    def event(self, trial, attempt=1):
        with self.guard:
            return self.started.setdefault((trial.trial_id, attempt), threading.Event())

    def execute(self, trial, *, attempt=1):
        self.log.add("execute", trial.cores, attempt, threading.current_thread().name, trial.trial_id)
        self.event(trial, attempt).set()
        if trial.cores == self.interrupt_at:
            raise KeyboardInterrupt("signal 15")
        kinds = self.outcomes.get(trial.cores)
        kind = kinds.pop(0) if kinds else ErrorKind.NONE
        if kind is ErrorKind.NONE:
            return TrialResult(trial.trial_id, TrialStatus.COMPLETED, metrics={"attempt": attempt})
        return TrialResult.failed(trial.trial_id, kind, f"attempt {attempt}", metrics={"attempt": attempt})


class FakeLane:
    def __init__(self, ex):
        self.ex = ex

    def execute(self, trial, *, attempt=1):
        return self.ex.execute(trial, attempt=attempt)

    def close(self):
        pass


class LaneExecutor(FakeExecutor):
    def lane(self):
        return FakeLane(self)

    def capacity(self, trials):
        return 4


class Observer:
    """Records every callback with the thread it ran on; ``slow_s`` sleeps in on_trial_result;
    ``gate(trial, result)`` (optional) runs first in on_trial_result, to block the writer on an event."""

    def __init__(self, log: Log, slow_s=0.0, gate=None, name="obs"):
        self.log, self.slow_s, self.gate, self.name = log, slow_s, gate, name
        self.busy = threading.Lock()
        self.clashes = 0
        self.end_results = None

    def _enter(self):
        if not self.busy.acquire(blocking=False):
            self.clashes += 1
            return False
        return True

    def on_sweep_start(self, plan):
        self.log.add("sweep_start", self.name)

    def on_trial_start(self, trial):
        held = self._enter()
        try:
            self.log.add("trial_start", self.name, trial.cores, threading.current_thread().name)
        finally:
            if held:
                self.busy.release()

    def on_trial_result(self, trial, result):
        held = self._enter()
        try:
            self.log.add("result_begin", self.name, trial.cores, result.metrics.get("attempt"))
            if self.gate is not None:
                self.gate(trial, result)
            time.sleep(self.slow_s)
            self.log.add("result_end", self.name, trial.cores, result.metrics.get("attempt"),
                         threading.current_thread().name, trial.trial_id)
        finally:
            if held:
                self.busy.release()

    def on_sweep_end(self, plan, results):
        self.end_results = list(results)
        self.log.add("sweep_end", self.name, len(results), threading.current_thread().name)


class StepClock:
    """The controller's clock: moves only by ``advance``; ``main_read`` is set once the main thread reads it
    (run()'s thread reads it only to stamp when it queues the sweep's end)."""

    def __init__(self):
        self.now = 0.0
        self.main_read = threading.Event()

    def __call__(self):
        if threading.current_thread() is threading.main_thread():
            self.main_read.set()
        return self.now

    def advance(self, s):
        self.now += s


def writer_threads():
    return [t for t in threading.enumerate() if t.name.startswith(WRITER_THREAD)]


# ---------------------------------------------------------------------- (a) the next trial does not wait
@pytest.mark.parametrize("executor", [FakeExecutor, LaneExecutor], ids=["single-lane", "two-repin-lanes"])
def test_next_trial_starts_while_a_slow_observer_writes_the_last_result(executor):
    # lanes: two repin chains, each on a lane of its own, running its three trials on one replica
    p = plan(cores=(3, 2, 1), workloads=("w1", "w2"), start=("repin",)) if executor is LaneExecutor else plan()
    first, second = chains(p.trials)[0][:2] if executor is LaneExecutor else p.trials[:2]
    log = Log()
    ex = executor(log)
    seen = {}

    def gate(trial, result):
        if trial.trial_id == first.trial_id:  # the writer is busy here; the lane must reach its next trial
            seen["second_started"] = ex.event(second).wait(WAIT)

    obs = Observer(log, gate=gate)
    c = SweepController(p, ex, observers=[obs])
    results = c.run()
    assert c.lanes_used == (2 if executor is LaneExecutor else 1)
    assert all(r.ok for r in results) and len(results) == len(p.trials)
    assert seen["second_started"], "the second trial's execute waited for the first trial's write"
    second_execute = next(i for i, e in enumerate(log.events) if e[0] == "execute" and e[4] == second.trial_id)
    first_written = next(i for i, e in enumerate(log.events) if e[0] == "result_end" and e[5] == first.trial_id)
    assert second_execute < first_written
    assert {e[4] for e in log.of("result_end")} == {WRITER_THREAD}  # written on the writer, not on a lane
    assert obs.clashes == 0


def test_retries_are_decided_without_waiting_for_the_writer():
    p = plan(cores=(1, 2), max_failures=2)
    log = Log()
    ex = FakeExecutor(log, outcomes={1: [ErrorKind.NODE_DIED, ErrorKind.SERVER_DIED, ErrorKind.NONE]})
    seen = {}

    def gate(trial, result):  # block the first write until the lane has retried twice and moved on
        if "third_attempt" not in seen:
            seen["third_attempt"] = ex.event(p.trials[0], 3).wait(WAIT)
            seen["next_trial"] = ex.event(p.trials[1], 1).wait(WAIT)

    obs = Observer(log, gate=gate)
    c = SweepController(p, ex, observers=[obs])
    results = c.run()
    assert seen == {"third_attempt": True, "next_trial": True}
    assert [r.ok for r in results] == [True, True]
    t1 = c.trials[p.trials[0].trial_id]
    assert t1.attempts == 3 and t1.history.count(TrialState.RETRYING) == 2
    assert [e[3] for e in log.of("result_end") if e[2] == 1] == [1, 2, 3]


# ---------------------------------------------------------------------- (b) the end comes after every write
def test_sweep_end_sees_every_result_after_every_write():
    p = plan(cores=(1, 2, 3, 4))
    log = Log()
    clock = StepClock()

    def gate(trial, result):  # each write takes 0.1 s on the clock; the first waits until the end is queued
        clock.main_read.wait(WAIT)
        clock.advance(0.1)

    obs = Observer(log, gate=gate)
    c = SweepController(p, FakeExecutor(log), observers=[obs], clock=clock)
    results = c.run()
    assert clock.main_read.is_set()
    assert obs.end_results == results and len(results) == 4
    end = log.index(*log.of("sweep_end")[0])
    assert end == len(log.events) - 1
    assert all(log.index(*e) < end for e in log.of("result_end"))
    assert len(log.of("result_end")) == 4
    assert c.write_s == pytest.approx([0.1] * 4)
    # the end was queued with all four writes still queued before it: it waited for all of them
    assert c.write_wait_s == pytest.approx(0.4)


def test_sweep_end_after_every_write_with_lanes():
    p = plan(cores=(1, 2, 3, 4, 5, 6))
    log = Log()
    obs = Observer(log, slow_s=0.05)
    c = SweepController(p, LaneExecutor(log), observers=[obs])
    results = c.run()
    assert c.lanes_used == 4
    assert sorted(r.trial_id for r in obs.end_results) == sorted(t.trial_id for t in p.trials)
    assert log.events[-1][0] == "sweep_end" and len(log.of("result_end")) == 6
    assert len(results) == 6 and obs.clashes == 0


# ---------------------------------------------------------------------- (c) per trial: start, then result
def test_start_comes_before_result_for_every_attempt_and_progress_sees_a_snapshot():
    p = plan(cores=(1, 2, 3, 4, 5, 6), max_failures=1)
    log = Log()
    ex = LaneExecutor(log, outcomes={2: [ErrorKind.SERVER_DIED, ErrorKind.NONE]})
    obs = Observer(log, slow_s=0.02)
    progress = []

    def on_progress(trial, spec, result):
        progress.append((spec.cores, trial.state, trial.attempts, result is not None))

    c = SweepController(p, ex, observers=[obs], on_progress=on_progress)
    c.run()
    for t in p.trials:
        mine = [e[0] for e in log.events if e[0] in ("trial_start", "result_begin", "result_end")
                and e[2] == t.cores]
        n = 2 if t.cores == 2 else 1
        assert mine == ["trial_start", "result_begin", "result_end"] * n, (t.cores, mine)
    # progress got the trial as it was when queued, not as it is when the writer gets to it
    assert [x for x in progress if x[0] == 2] == [
        (2, TrialState.RUNNING, 1, False), (2, TrialState.RETRYING, 1, True),
        (2, TrialState.RUNNING, 2, False), (2, TrialState.COMPLETED, 2, True)]
    assert all(x[1] is TrialState.RUNNING for x in progress if not x[3])
    assert obs.clashes == 0


# ---------------------------------------------------------------------- (d) a raising observer
def test_an_observer_raising_does_not_stop_later_writes(caplog):
    p = plan(cores=(1, 2, 3))
    log = Log()

    class Broken(Observer):
        def on_trial_result(self, trial, result):
            if trial.cores == 1:
                raise ValueError("observer bug")
            super().on_trial_result(trial, result)

    broken, fine = Broken(log, name="broken"), Observer(log, name="fine")
    caplog.set_level(logging.ERROR)
    c = SweepController(p, FakeExecutor(log), observers=[broken, fine])
    results = c.run()
    assert len(results) == 3 and all(r.ok for r in results)
    assert [e[2] for e in log.of("result_end") if e[1] == "fine"] == [1, 2, 3]
    assert [e[2] for e in log.of("result_end") if e[1] == "broken"] == [2, 3]
    assert broken.end_results == results and fine.end_results == results
    assert len(c.write_s) == 3
    failed = [r for r in caplog.records if "on_trial_result failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None  # logged once, by the CallbackList


def test_a_base_exception_from_a_call_does_not_kill_the_writer(caplog):
    done = []
    w = _Writer(name=f"{WRITER_THREAD}-test")

    def bad():
        raise SystemExit(3)

    caplog.set_level(logging.ERROR)
    w.submit(bad)
    w.submit(done.append, 1)
    w.close()
    w.join(WAIT)
    assert not w.alive() and done == [1]
    assert any("sweep writer" in r.getMessage() for r in caplog.records)


def test_a_call_after_close_is_made_once_the_writer_ended(caplog):
    order = []
    late_came = threading.Event()

    class Hook(logging.Handler):  # set when submit() says a call came after close (before it waits)
        def emit(self, record):
            if "came after the sweep's writer closed" in record.getMessage():
                late_came.set()

    caplog.set_level(logging.WARNING, logger="orchestrator.control.controller")
    logger = logging.getLogger("orchestrator.control.controller")
    hook = Hook()
    logger.addHandler(hook)
    try:
        w = _Writer(name=f"{WRITER_THREAD}-test")
        # the queued call is still being made when the late one comes
        w.submit(lambda: order.append(("queued", late_came.wait(WAIT))))
        w.close()
        w.submit(order.append, "late")  # waits for the writer to end, then runs here
    finally:
        logger.removeHandler(hook)
    assert order == [("queued", True), "late"] and not w.alive()


# ---------------------------------------------------------------------- (e) interrupt on the single-lane path
def test_keyboard_interrupt_from_the_executor_writes_what_was_queued_then_ends_then_unwinds():
    p = plan(cores=(1, 2, 3))
    log = Log()
    ex = FakeExecutor(log, interrupt_at=3)
    seen = {}

    def gate(trial, result):  # the results of 1 and 2 are still queued when 3 raises
        seen.setdefault("third_executed", ex.event(p.trials[2]).wait(WAIT))

    obs = Observer(log, gate=gate)
    c = SweepController(p, ex, observers=[obs])
    with pytest.raises(KeyboardInterrupt):
        c.run()
    assert seen == {"third_executed": True}
    assert log.index("execute", 3, 1, "MainThread", p.trials[2].trial_id) < log.index(*log.of("result_end")[0])
    assert [e[2] for e in log.of("result_end")] == [1, 2]
    assert [e[2] for e in log.of("trial_start")] == [1, 2, 3]
    assert log.events[-1][:3] == ("sweep_end", "obs", 2)
    assert [r.trial_id for r in obs.end_results] == [t.trial_id for t in p.trials[:2]]
    assert not writer_threads()


# ---------------------------------------------------------------------- (f) no writer left behind
def test_no_writer_thread_is_left_after_run_returns():
    before = writer_threads()
    assert not before
    c = SweepController(plan(), LaneExecutor(Log()), observers=[Observer(Log(), slow_s=0.05)])
    c.run()
    assert not writer_threads()
    c = SweepController(plan(), FakeExecutor(Log()), observers=[Observer(Log(), slow_s=0.05)])
    c.run()
    assert not writer_threads()


def test_no_writer_thread_is_left_after_run_raises():
    log = Log()
    obs = Observer(log)

    def finished():
        raise RuntimeError("tracking server said no")

    c = SweepController(plan(), FakeExecutor(log), observers=[obs], finished=finished)
    with pytest.raises(RuntimeError):
        c.run()
    assert not writer_threads()
    assert obs.end_results is None  # as before: only a normal end or an interrupt ends the sweep for observers
