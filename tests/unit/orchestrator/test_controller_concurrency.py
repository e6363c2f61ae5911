"""SweepController with lanes: concurrency bounds, chains on one lane, retries, resume, observers, interrupts.

The fake executor waits in every execute and records, under a lock, in what order each attempt
started and ended and on which lane, so overlap is measured, not assumed. Where a test is about
overlap it makes the executes meet at a barrier, so the overlap does not depend on how fast the
machine is (the barrier breaks, and the test fails, if the controller never runs them together).
Plus ``chains()`` on real expanded plans.
"""

from __future__ import annotations

import _thread
import itertools
import logging
import signal
import threading
import time
from collections import Counter

import pytest

from orchestrator.control.controller import WRITER_THREAD, SweepController
from orchestrator.control.trial import TrialState
from orchestrator.plan.expand import chain_key, chains, expand, replica_key, start_key
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus

DUR = 0.2
WAIT = 10.0  # upper bound on a barrier or event wait: a passing test never waits this long


def spec(cores=(1, 2, 3, 4, 5, 6, 7, 8), *, workloads=("w",), start=("fresh",), repeats=1, **top):
    protocol = top.pop("protocol", {})
    return parse_spec({
        "name": "cc", "repeats": repeats,
        "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": w, "kind": "agentic", "sessions": 1, "turns": 1} for w in workloads],
        "grid": {"cores": list(cores), "start": list(start)},
        "protocol": protocol,
        **top,
    })


def plan(*args, **kw):
    return expand(spec(*args, **kw))


class FakeLane:
    def __init__(self, ex: LaneExecutor, name: str) -> None:
        self.ex, self.name = ex, name
        self.closed = 0

    def execute(self, trial, *, attempt=1):
        assert not self.closed, f"{self.name} used after close"
        return self.ex._run(trial, attempt, self.name)

    def close(self):
        self.closed += 1


class LaneExecutor:
    """outcomes: trial_id -> ErrorKinds consumed per attempt (NONE = success); durations: trial_id -> s."""

    def __init__(self, capacity=4, outcomes=None, durations=None, on_execute=None):
        self.cap = capacity
        self.outcomes = {k: list(v) for k, v in (outcomes or {}).items()}
        self.durations = durations or {}
        self.on_execute = on_execute
        self.lock = threading.Lock()
        self.runs: list[dict] = []  # one per attempt: trial_id, attempt, lane, start, end (sequence numbers), cancelled
        self.seq = itertools.count()  # start and end events, in the order they happened (under the lock)
        self.lanes: list[FakeLane] = []
        self.inflight = 0
        self.max_inflight = 0
        self.capacity_calls: list[int] = []
        self.cancelled = threading.Event()

    def lane(self):
        with self.lock:
            lane = FakeLane(self, f"lane-{len(self.lanes)}")
            self.lanes.append(lane)
            return lane

    def capacity(self, trials):
        self.capacity_calls.append(len(trials))
        return self.cap

    def cancel(self):
        self.cancelled.set()

    def execute(self, trial, *, attempt=1):  # the controller's sequential path
        return self._run(trial, attempt, "default")

    def _run(self, trial, attempt, lane):
        with self.lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            start = next(self.seq)
        woken = False  # the execute returned because of cancel(), not because its duration ran out
        try:
            if self.on_execute is not None:
                self.on_execute(trial, attempt, lane)
            woken = self.cancelled.wait(self.durations.get(trial.trial_id, DUR))
            with self.lock:
                kinds = self.outcomes.get(trial.trial_id)
                kind = kinds.pop(0) if kinds else ErrorKind.NONE
            if self.cancelled.is_set():
                kind = ErrorKind.NODE_DIED
            if kind is ErrorKind.INTERNAL:
                raise RuntimeError("executor bug")
            if kind is ErrorKind.NONE:
                return TrialResult(trial.trial_id, TrialStatus.COMPLETED, metrics={"attempt": attempt})
            return TrialResult.failed(trial.trial_id, kind, f"attempt {attempt} failed")
        finally:
            with self.lock:
                self.inflight -= 1
                self.runs.append({"trial_id": trial.trial_id, "attempt": attempt, "lane": lane,
                                  "start": start, "end": next(self.seq), "cancelled": woken})

    # ---- views
    def attempts_of(self, trial_id):
        return [r["attempt"] for r in sorted(self.runs, key=lambda r: r["start"]) if r["trial_id"] == trial_id]

    def overlap(self) -> int:
        """Most attempts in flight at once, from the recorded start and end events."""
        edges = sorted([(r["start"], 1) for r in self.runs] + [(r["end"], -1) for r in self.runs])
        most = now = 0
        for _, d in edges:
            now += d
            most = max(most, now)
        return most


class Recorder:
    """Every callback and progress call, with a non-blocking lock to catch two at once."""

    def __init__(self, hold_s=0.005):
        self.hold_s = hold_s
        self.busy = threading.Lock()
        self.clashes = 0
        self.calls: list[tuple] = []

    def _enter(self, *event):
        if not self.busy.acquire(blocking=False):
            self.clashes += 1
            self.calls.append(event)
            return
        try:
            self.calls.append(event)
            time.sleep(self.hold_s)  # widen the window in which a second call would clash
        finally:
            self.busy.release()

    def on_sweep_start(self, plan):
        self._enter("sweep_start")

    def on_trial_start(self, trial):
        self._enter("trial_start", trial.trial_id)

    def on_trial_result(self, trial, result):
        self._enter("trial_result", trial.trial_id, result.status, result.error_kind)

    def on_sweep_end(self, plan, results):
        self._enter("sweep_end", len(results))

    def progress(self, trial, spec, result):
        self._enter("progress", spec.trial_id, trial.state, result is not None)

    def count(self, kind):
        return Counter(c[1] for c in self.calls if c[0] == kind)


def assert_one_final_result_per_trial(results, trial_ids):
    ids = [r.trial_id for r in results]
    assert len(ids) == len(set(ids)) and set(ids) == set(trial_ids)


def assert_lanes_closed(ex):
    assert all(lane.closed == 1 for lane in ex.lanes), [(lane.name, lane.closed) for lane in ex.lanes]


# ---------------------------------------------------------------------- how many at once
def meet(parties):
    """An ``on_execute`` hook: each execute waits until ``parties`` executes are in flight together."""
    barrier = threading.Barrier(parties, timeout=WAIT)
    return lambda trial, attempt, lane: barrier.wait()


def test_independent_trials_run_up_to_capacity_at_once():
    p = plan()  # 8 fresh trials, each a chain of its own
    # each execute waits until 4 are in flight: only 4 lanes side by side get past it (twice), whatever the load
    ex = LaneExecutor(capacity=4, durations=dict.fromkeys([t.trial_id for t in p.trials], 0), on_execute=meet(4))
    c = SweepController(p, ex)
    results = c.run()
    assert ex.max_inflight == 4 and ex.overlap() == 4
    assert c.lanes_used == 4 and len(ex.lanes) == 4
    assert all(r.ok for r in results), [r.message for r in results if not r.ok]
    assert_one_final_result_per_trial(results, [t.trial_id for t in p.trials])
    assert_lanes_closed(ex)
    assert ex.capacity_calls == [8]
    assert {r["lane"] for r in ex.runs} == {lane.name for lane in ex.lanes}


def test_max_concurrent_argument_caps_lanes():
    p = plan()
    ex = LaneExecutor(capacity=4)
    c = SweepController(p, ex, max_concurrent=2)
    results = c.run()
    assert ex.max_inflight == 2 and ex.overlap() == 2 and c.lanes_used == 2
    assert_one_final_result_per_trial(results, [t.trial_id for t in p.trials])
    assert_lanes_closed(ex)


def test_max_concurrent_trials_from_the_spec_caps_lanes():
    p = plan(cores=(1, 2, 3, 4, 5, 6), max_concurrent_trials=2)
    ex = LaneExecutor(capacity=8)
    results = SweepController(p, ex).run()
    assert ex.max_inflight == 2
    assert len(results) == 6 and all(r.ok for r in results)


def test_capacity_one_runs_sequentially():
    p = plan(cores=(1, 2, 3, 4))
    ex = LaneExecutor(capacity=1)
    c = SweepController(p, ex)
    results = c.run()
    assert ex.max_inflight == 1 and ex.overlap() == 1 and c.lanes_used == 1
    assert [r["trial_id"] for r in sorted(ex.runs, key=lambda r: r["start"])] == [t.trial_id for t in p.trials]
    assert [r.trial_id for r in results] == [t.trial_id for t in p.trials]
    assert_lanes_closed(ex)


def test_fewer_chains_than_capacity_uses_one_lane_per_chain():
    p = plan(cores=(1, 2, 3))
    ex = LaneExecutor(capacity=10)
    c = SweepController(p, ex)
    c.run()
    assert c.lanes_used == 3 and len(ex.lanes) == 3 and ex.max_inflight == 3


# ---------------------------------------------------------------------- chains
def _check_chains_ran_whole(p, ex):
    """Every chain ran on one lane, in plan order, one trial after another."""
    groups = chains(p.trials)
    by_id = {r["trial_id"]: r for r in ex.runs}
    for group in groups:
        runs = [by_id[t.trial_id] for t in group]
        assert len({r["lane"] for r in runs}) == 1, "a chain was split across lanes"
        for a, b in zip(runs, runs[1:]):
            assert a["end"] <= b["start"], "two trials of one chain overlapped or ran out of order"
    return groups


def test_repin_groups_stay_on_one_lane_in_order():
    p = plan(cores=(4, 3, 2, 1), workloads=("w1", "w2"), start=("repin", "fresh"))
    groups = chains(p.trials)
    assert sorted(len(g) for g in groups) == [1] * 8 + [4, 4]  # 2 repin chains, 8 fresh singletons
    ex = LaneExecutor(capacity=4)
    results = SweepController(p, ex).run()
    _check_chains_ran_whole(p, ex)
    assert ex.max_inflight == 4  # chains run side by side
    repin = [g for g in groups if g[0].start == "repin"]
    for g in repin:
        assert [t.cores for t in g] == [4, 3, 2, 1]
    assert_one_final_result_per_trial(results, [t.trial_id for t in p.trials])
    assert_lanes_closed(ex)


def test_two_repin_chains_alone_overlap_each_other_but_not_themselves():
    p = plan(cores=(3, 2, 1), workloads=("w1", "w2"), start=("repin",))
    # the k-th trial of each chain waits for the k-th of the other: only chains run side by side get past
    ex = LaneExecutor(capacity=4, durations=dict.fromkeys([t.trial_id for t in p.trials], 0), on_execute=meet(2))
    c = SweepController(p, ex)
    results = c.run()
    groups = _check_chains_ran_whole(p, ex)
    assert c.lanes_used == 2 and ex.max_inflight == 2 and ex.overlap() == 2
    assert all(r.ok for r in results), [r.message for r in results if not r.ok]
    # interleaved: in the order they started, each pair of trials is one of each chain (3 x DUR, not 6 x DUR)
    chain_of = {t.trial_id: i for i, g in enumerate(groups) for t in g}
    started = [chain_of[r["trial_id"]] for r in sorted(ex.runs, key=lambda r: r["start"])]
    assert [sorted(started[i:i + 2]) for i in range(0, 6, 2)] == [[0, 1]] * 3, started


def test_shared_start_windows_stay_on_one_lane_in_order():
    p = plan(cores=(1, 2), workloads=("w1", "w2"), repeats=2, protocol={"share_start": True})
    groups = chains(p.trials)
    assert [len(g) for g in groups] == [4, 4]
    ex = LaneExecutor(capacity=4)
    c = SweepController(p, ex)
    results = c.run()
    _check_chains_ran_whole(p, ex)
    assert c.lanes_used == 2 and ex.max_inflight == 2
    assert_one_final_result_per_trial(results, [t.trial_id for t in p.trials])
    assert_lanes_closed(ex)


# ---------------------------------------------------------------------- retries, out of order
def test_retry_when_trials_finish_out_of_order():
    p = plan(cores=(1, 2, 3, 4, 5, 6), max_failures=1)
    ids = [t.trial_id for t in p.trials]
    # later trials are shorter, so they finish first; trial 1 (cores 2) dies once, then succeeds
    durations = {tid: 0.05 + 0.05 * (len(ids) - i) for i, tid in enumerate(ids)}
    ex = LaneExecutor(capacity=3, outcomes={ids[1]: [ErrorKind.SERVER_DIED, ErrorKind.NONE]}, durations=durations)
    rec = Recorder()
    c = SweepController(p, ex, observers=[rec], on_progress=rec.progress)
    results = c.run()
    assert ex.attempts_of(ids[1]) == [1, 2]
    assert all(ex.attempts_of(t) == [1] for t in ids if t != ids[1])
    assert all(r.ok for r in results)
    assert_one_final_result_per_trial(results, ids)
    t = c.trials[ids[1]]
    assert t.attempts == 2 and TrialState.RETRYING in t.history and t.state is TrialState.COMPLETED
    assert rec.count("trial_result")[ids[1]] == 2 and rec.count("trial_start")[ids[1]] == 2
    assert rec.clashes == 0
    finish_order = [r["trial_id"] for r in sorted(ex.runs, key=lambda r: r["end"])]
    assert finish_order != sorted(finish_order, key=ids.index), "the trials did not finish out of order"
    assert_lanes_closed(ex)


def test_retries_are_bounded_and_config_errors_never_retried():
    p = plan(cores=(1, 2, 3, 4), max_failures=2)
    ids = [t.trial_id for t in p.trials]
    ex = LaneExecutor(capacity=4, durations=dict.fromkeys(ids, 0.05), outcomes={
        ids[0]: [ErrorKind.NODE_DIED] * 5,               # retryable, never recovers: 1 + 2 attempts
        ids[1]: [ErrorKind.CONFIG],                       # never retried
        ids[2]: [ErrorKind.INTERNAL],                     # the executor raises: INTERNAL, not retried
        ids[3]: [ErrorKind.STARTUP_TIMEOUT, ErrorKind.NONE],
    })
    c = SweepController(p, ex)
    results = {r.trial_id: r for r in c.run()}
    assert ex.attempts_of(ids[0]) == [1, 2, 3] and results[ids[0]].error_kind is ErrorKind.NODE_DIED
    assert ex.attempts_of(ids[1]) == [1] and results[ids[1]].error_kind is ErrorKind.CONFIG
    assert ex.attempts_of(ids[2]) == [1] and results[ids[2]].error_kind is ErrorKind.INTERNAL
    assert "executor bug" in results[ids[2]].message
    assert ex.attempts_of(ids[3]) == [1, 2] and results[ids[3]].ok
    assert [c.trials[i].state for i in ids] == [TrialState.FAILED] * 3 + [TrialState.COMPLETED]
    assert len(results) == 4
    assert_lanes_closed(ex)


def test_a_retry_runs_on_the_same_lane_as_its_first_attempt():
    p = plan(cores=(1, 2, 3, 4), max_failures=1)
    ids = [t.trial_id for t in p.trials]
    ex = LaneExecutor(capacity=2, durations=dict.fromkeys(ids, 0.05),
                      outcomes={i: [ErrorKind.NODE_DIED, ErrorKind.NONE] for i in ids})
    SweepController(p, ex).run()
    for tid in ids:
        lanes = {r["lane"] for r in ex.runs if r["trial_id"] == tid}
        assert len(lanes) == 1 and ex.attempts_of(tid) == [1, 2]


# ---------------------------------------------------------------------- resume
def test_resume_skips_finished_trials():
    p = plan()
    ids = [t.trial_id for t in p.trials]
    done = {ids[0], ids[3], ids[7]}
    ex = LaneExecutor(capacity=4, durations=dict.fromkeys(ids, 0.05))
    rec = Recorder()
    c = SweepController(p, ex, finished=lambda: set(done), observers=[rec], on_progress=rec.progress)
    results = c.run()
    assert {r["trial_id"] for r in ex.runs} == set(ids) - done
    assert_one_final_result_per_trial(results, set(ids) - done)
    assert all(c.trials[i].state is TrialState.SKIPPED for i in done)
    assert ex.capacity_calls == [5]  # capacity is asked about what is left to run
    assert not (set(rec.count("trial_start")) & done)
    assert {c[1] for c in rec.calls if c[0] == "progress" and c[2] is TrialState.SKIPPED} == done


def test_resume_inside_a_repin_chain_keeps_the_rest_together():
    p = plan(cores=(4, 3, 2, 1), workloads=("w1", "w2"), start=("repin",))
    ids = [t.trial_id for t in p.trials]
    done = {ids[1]}  # the 3-core trial of the first chain
    ex = LaneExecutor(capacity=4, durations=dict.fromkeys(ids, 0.05))
    c = SweepController(p, ex, finished=lambda: set(done))
    results = c.run()
    assert_one_final_result_per_trial(results, set(ids) - done)
    first = [r for r in sorted(ex.runs, key=lambda r: r["start"]) if r["trial_id"] in ids[:4]]
    assert [r["trial_id"] for r in first] == [ids[0], ids[2], ids[3]]
    assert len({r["lane"] for r in first}) == 1


# ---------------------------------------------------------------------- observers
def test_observers_see_one_result_per_attempt_never_two_calls_at_once():
    p = plan(cores=(1, 2, 3, 4, 5, 6, 7, 8), max_failures=1)
    ids = [t.trial_id for t in p.trials]
    outcomes = {ids[2]: [ErrorKind.SERVER_DIED, ErrorKind.NONE], ids[5]: [ErrorKind.NODE_DIED, ErrorKind.NONE]}
    ex = LaneExecutor(capacity=4, outcomes=outcomes, durations=dict.fromkeys(ids, 0.1))
    rec = Recorder(hold_s=0.01)
    c = SweepController(p, ex, observers=[rec], on_progress=rec.progress)
    results = c.run()
    assert rec.clashes == 0, "two callbacks ran at once"
    attempts = Counter(r["trial_id"] for r in ex.runs)
    assert rec.count("trial_result") == attempts == rec.count("trial_start")
    assert attempts[ids[2]] == 2 and attempts[ids[5]] == 2 and sum(attempts.values()) == 10
    assert rec.calls[0] == ("sweep_start",) and rec.calls[-1] == ("sweep_end", 8)
    assert ex.max_inflight == 4  # the callbacks were concurrent candidates
    # progress: one call at start and one with the result, per attempt
    assert Counter(c[1] for c in rec.calls if c[0] == "progress") == Counter({k: 2 * v for k, v in attempts.items()})
    assert_one_final_result_per_trial(results, ids)


def test_slow_observer_does_not_break_concurrency_or_ordering():
    p = plan(cores=(1, 2, 3, 4))
    rec = Recorder(hold_s=0.03)
    ex = LaneExecutor(capacity=4, durations=dict.fromkeys([t.trial_id for t in p.trials], 0.05))
    c = SweepController(p, ex, observers=[rec], on_progress=rec.progress)
    c.run()
    assert rec.clashes == 0
    for tid in (t.trial_id for t in p.trials):
        mine = [e[0] for e in rec.calls if len(e) > 1 and e[1] == tid and e[0] != "progress"]
        assert mine == ["trial_start", "trial_result"]


# ---------------------------------------------------------------------- interrupt
@pytest.fixture
def plain_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test: an earlier test in this process may
    have left another one installed (the CLI's, or Ray's), which interrupt_main() would call instead."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def test_keyboard_interrupt_cancels_the_executor_and_ends_the_sweep(plain_sigint):
    p = plan(cores=(1, 2, 3, 4, 5, 6, 7, 8))
    ids = [t.trial_id for t in p.trials]
    both = threading.Barrier(2, timeout=WAIT)

    def interrupt(trial, attempt, lane):
        both.wait()  # the first two trials are both in flight
        if trial.trial_id == ids[1]:
            _thread.interrupt_main()

    # the executes would run WAIT s: only the cancel ends them (each run records whether the cancel woke it)
    ex = LaneExecutor(capacity=2, durations=dict.fromkeys(ids, WAIT), on_execute=interrupt)
    rec = Recorder(hold_s=0.0)
    c = SweepController(p, ex, observers=[rec], max_failures=3)
    with pytest.raises(KeyboardInterrupt):
        c.run()
    assert ex.cancelled.is_set()
    assert [r["cancelled"] for r in ex.runs] == [True, True], "an execute ran its full time: the cancel did not end it"
    assert rec.calls[-1][0] == "sweep_end"
    ran = {r["trial_id"] for r in ex.runs}
    assert ran == {ids[0], ids[1]}  # nothing new started after the interrupt, nothing retried
    assert all(ex.attempts_of(t) == [1] for t in ran)
    assert rec.calls[-1] == ("sweep_end", 2)
    assert_lanes_closed(ex)


class EndWatch(Recorder):
    """A Recorder that also keeps what ``on_sweep_end`` got, the thread of each call, and an event for the end."""

    def __init__(self):
        super().__init__(hold_s=0.0)
        self.ended = threading.Event()
        self.end_results = None
        self.threads: list[tuple[str, str]] = []  # (call, thread name)

    def on_trial_result(self, trial, result):
        self.threads.append(("trial_result", threading.current_thread().name))
        super().on_trial_result(trial, result)

    def on_sweep_end(self, plan, results):
        self.end_results = list(results)
        self.threads.append(("sweep_end", threading.current_thread().name))
        super().on_sweep_end(plan, results)
        self.ended.set()


def test_a_lane_result_that_comes_after_the_sweep_stopped_waiting_is_written_and_counted_at_the_end(
        plain_sigint, caplog):
    """The race: an interrupted sweep ended for the observers while a lane was still returning its trial
    (on CPython 3.11 an interrupt landing in Thread.join() marks the running lane as ended; or the lane
    outlived the wait); on_sweep_end got 1 result of 2 and the late one was written after it, in the lane.

    Here one trial's execute is held until run() has been left, whatever run() does meanwhile; the sweep
    gives up waiting for its lane at once (lane_grace_s = 0). Its result must still be written, by the
    writer, and on_sweep_end must come after it and count it."""
    p = plan(cores=(1, 2))
    held, other = (t.trial_id for t in p.trials)
    both = threading.Barrier(2, timeout=WAIT)
    release = threading.Event()

    def on_execute(trial, attempt, lane):
        both.wait()  # both trials in flight, one on each lane
        if trial.trial_id == other:
            _thread.interrupt_main()
        else:
            release.wait()  # held past run(): set by the test once run() has raised

    ex = LaneExecutor(capacity=2, durations=dict.fromkeys([held, other], WAIT), on_execute=on_execute)
    rec = EndWatch()
    c = SweepController(p, ex, observers=[rec], max_failures=3)
    c.lane_grace_s = 0.0  # an attribute, so this test also runs against a controller without the parameter
    caplog.set_level(logging.WARNING)
    try:
        with pytest.raises(KeyboardInterrupt):
            c.run()
        sweep_ended_before_release = rec.ended.is_set()
    finally:
        release.set()
    assert rec.ended.wait(WAIT), "on_sweep_end was never made"
    got = sorted(r.trial_id for r in rec.end_results)
    assert got == sorted([held, other]), f"on_sweep_end counted {len(got)} result(s) of 2"
    assert not sweep_ended_before_release, "on_sweep_end was made while a lane still held a result"
    assert rec.count("trial_result") == Counter([held, other])
    assert rec.calls[-1] == ("sweep_end", 2)  # after every write
    assert {name for _, name in rec.threads} == {WRITER_THREAD}  # all on the writer, none late in a lane
    assert not [r for r in caplog.records if "came after the sweep's writer closed" in r.getMessage()]
    assert all(r["cancelled"] for r in ex.runs)
    assert c._writer is not None and c._writer.join(WAIT)  # the writer ends once the held lane is done
    assert_lanes_closed(ex)


# ---------------------------------------------------------------------- chains() on real plans
def test_chains_of_fresh_trials_are_singletons():
    p = plan(cores=(1, 2, 4), workloads=("a", "b"), repeats=2)
    assert all(chain_key(t) is None for t in p.trials)
    assert [len(g) for g in chains(p.trials)] == [1] * 12


def test_chains_of_repin_groups():
    p = plan(cores=(1, 2, 4), workloads=("a", "b"), repeats=2, start=("repin",))
    groups = chains(p.trials)
    assert [len(g) for g in groups] == [6, 6]  # one replica per workload, re-pinned down, both repeats
    for g in groups:
        assert len({replica_key(t) for t in g}) == 1 and len({t.workload.name for t in g}) == 1
        assert [t.cores for t in g] == [4, 2, 1, 4, 2, 1]
    assert replica_key(groups[0][0]) != replica_key(groups[1][0])
    assert [t for g in groups for t in g] == list(p.trials)  # chains cut, never reorder


def test_chains_of_shared_starts():
    p = plan(cores=(1, 2), workloads=("a", "b"), repeats=2, protocol={"share_start": True})
    groups = chains(p.trials)
    assert [len(g) for g in groups] == [4, 4]
    for g in groups:
        assert len({start_key(t) for t in g}) == 1 and len({t.cores for t in g}) == 1
        assert {(t.workload.name, t.repeat) for t in g} == {("a", 0), ("b", 0), ("a", 1), ("b", 1)}
    assert [t for g in groups for t in g] == list(p.trials)


def test_chains_of_a_mixed_plan_with_calibration():
    p = expand(parse_spec({
        "name": "mix", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 4], "start": ["fresh"], "calibrate": [1]},
    }))
    groups = chains(p.trials)
    fresh = [g for g in groups if g[0].start == "fresh"]
    repin = [g for g in groups if g[0].start == "repin"]
    assert [len(g) for g in fresh] == [1, 1, 1]
    assert len(repin) == 1 and [t.cores for t in repin[0]] == [4, 1]  # started on the most cores
    assert sum(len(g) for g in groups) == len(p.trials)


def test_chains_only_join_consecutive_trials():
    p = plan(cores=(2, 1), workloads=("a", "b"), start=("repin",))
    a1, a2, b1, b2 = p.trials
    assert [len(g) for g in chains([a1, b1, a2, b2])] == [1, 1, 1, 1]
    assert [len(g) for g in chains([a1, a2, b1, b2])] == [2, 2]
    assert chains([]) == []
    assert chain_key(a1).startswith("repin:")
    s = plan(cores=(1,), protocol={"share_start": True}).trials[0]
    assert chain_key(s).startswith("start:")


# ---------------------------------------------------------------------- lanes that die
class NoLanes(LaneExecutor):
    def lane(self):
        raise RuntimeError("no lane today")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_when_every_lane_dies_each_trial_still_gets_a_failed_result():
    p = plan(cores=(1, 2, 3))
    ids = [t.trial_id for t in p.trials]
    rec = Recorder(hold_s=0.0)
    c = SweepController(p, NoLanes(capacity=3), observers=[rec])
    results = c.run()
    assert_one_final_result_per_trial(results, ids)
    assert all(r.error_kind is ErrorKind.INTERNAL and "its lane ended before it finished" in r.message for r in results)
    assert all(c.trials[i].state is TrialState.FAILED for i in ids)
    assert rec.count("trial_result") == Counter(ids)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_raising_progress_callback_does_not_lose_trials_silently():
    p = plan(cores=(1, 2, 3, 4))
    ids = [t.trial_id for t in p.trials]

    def progress(trial, spec, result):
        if spec.trial_id == ids[1] and result is None:
            raise OSError("broken pipe")

    ex = LaneExecutor(capacity=2, durations=dict.fromkeys(ids, 0.05))
    c = SweepController(p, ex, on_progress=progress)
    try:
        results = c.run()
    except OSError:
        return  # raising, as the sequential path does, is fine too
    assert_one_final_result_per_trial(results, ids)
    assert all(c.trials[i].done for i in ids)


def test_shuffled_order_keeps_shared_start_windows_together():
    p = plan(cores=(1, 2), workloads=("w1", "w2"), repeats=2,
             protocol={"share_start": True, "order": "shuffled", "seed": 1})
    assert sorted(len(g) for g in chains(p.trials)) == [4, 4]
