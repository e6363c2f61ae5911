"""SweepController: runs a plan through an executor, applying retries and resume, several trials at once.

It imports no Ray: the executor is injected (anything with ``execute(trial) -> TrialResult``),
and so are the observers. Retry policy lives here and only here: a retryable failure (node
lost, server died, startup timeout) is run again up to ``max_failures`` times; a config error
never is.

**Concurrency.** The plan is cut into *chains* (:func:`orchestrator.plan.expand.chains`): trials that
must run one after another on one replica (a repin group, the windows of a shared start) form
one chain, every other trial is a chain of its own. Up to ``max_concurrent`` lanes run chains
side by side, each on its own thread with its own executor lane (``executor.lane()``: its own
warm replica, its own node). How many trials the cluster can hold at once is the executor's to
say (``executor.capacity(trials)``); the controller takes the smaller of that and the cap. An
executor without lanes (a test's fake) runs one trial at a time, as before. Observers and the
progress callback are called under one lock, so they never run concurrently, and trials finish
in any order.

An interrupt (Ctrl-C, or SIGTERM turned into one by the cli) still ends the sweep for the
observers: the lanes are told to stop (``executor.cancel()`` ends what is in flight), then
``on_sweep_end`` gets the results so far, then the interrupt goes on unwinding. A tracker tells
an interrupted sweep from a complete one by the trials that have no result.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable, Iterable, Protocol

from orchestrator.control.callbacks import Callback, CallbackList
from orchestrator.plan.expand import SweepPlan, TrialSpec, chains
from orchestrator.control.results import ErrorKind, TrialResult
from orchestrator.control.trial import Trial, TrialState

log = logging.getLogger(__name__)


class Lane(Protocol):
    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        """Run one attempt (1, 2, ... for retries) of ``trial``; each attempt keeps its own artifacts."""
        ...


class Executor(Lane, Protocol):
    """Runs trials. Optional, for concurrency: ``lane()`` (a new :class:`Lane` with ``close()``),
    ``capacity(trials) -> int`` (trials the cluster can hold at once), ``cancel()``."""


class SweepController:
    """Drive every trial of ``plan`` to a final state; never raises for a failed trial."""

    def __init__(self, plan: SweepPlan, executor: Executor, *, observers: Iterable[Callback] = (),
                 finished: Callable[[], set[str]] = set, max_failures: int | None = None,
                 max_concurrent: int | None = None,
                 on_progress: Callable[[Trial, TrialSpec, TrialResult | None], None] | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.observers = CallbackList(observers)
        self.finished = finished
        self.max_failures = plan.spec.max_failures if max_failures is None else max_failures
        self.max_concurrent = plan.spec.max_concurrent_trials if max_concurrent is None else max_concurrent
        self.on_progress = on_progress or (lambda *_: None)
        self.trials = {t.trial_id: Trial(t.trial_id) for t in plan.trials}
        self.lanes_used = 0
        self._emit = threading.Lock()  # observers and progress: one at a time
        self._stop = threading.Event()

    # ------------------------------------------------------------------ the sweep
    def run(self) -> list[TrialResult]:
        self.observers.on_sweep_start(self.plan)
        results: list[TrialResult] = []
        try:
            done_before = self.finished()
            todo = []
            for spec in self.plan.trials:
                if spec.trial_id in done_before:
                    self.trials[spec.trial_id].transition(TrialState.SKIPPED)
                    self._progress(self.trials[spec.trial_id], spec, None)
                else:
                    todo.append(spec)
            groups = chains(todo)
            lanes = self._lanes(todo, len(groups))
            self.lanes_used = lanes
            if lanes <= 1:
                for spec in todo:
                    results.append(self._run_one(self.trials[spec.trial_id], spec, self.executor))
            else:
                self._run_lanes(groups, lanes, results)
        except KeyboardInterrupt:
            log.warning("sweep %s interrupted after %d result(s)", self.plan.spec.name, len(results))
            with self._emit:
                self.observers.on_sweep_end(self.plan, list(results))
            raise
        with self._emit:
            self.observers.on_sweep_end(self.plan, list(results))
        return results

    def _lanes(self, todo: list[TrialSpec], groups: int) -> int:
        if not hasattr(self.executor, "lane") or groups <= 1:
            return 1
        bounds = [groups]
        if self.max_concurrent is not None:
            bounds.append(self.max_concurrent)
        capacity = getattr(self.executor, "capacity", None)
        if capacity is not None:
            bounds.append(capacity(todo))
        return max(1, min(bounds))

    def _run_lanes(self, groups: list[list[TrialSpec]], lanes: int, results: list[TrialResult]) -> None:
        queue = deque(groups)
        take = threading.Lock()

        def lane_main() -> None:
            lane = self.executor.lane()
            try:
                while not self._stop.is_set():
                    with take:
                        if not queue:
                            return
                        chain = queue.popleft()
                    for spec in chain:
                        if self._stop.is_set():
                            return
                        result = self._run_one(self.trials[spec.trial_id], spec, lane)
                        with take:
                            results.append(result)
            finally:
                close = getattr(lane, "close", None)
                if close is not None:
                    close()

        threads = [threading.Thread(target=lane_main, name=f"lane-{i}", daemon=True) for i in range(lanes)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # short waits, so Ctrl-C (SIGINT to the main thread) lands here
        except KeyboardInterrupt:
            self._stop.set()
            cancel = getattr(self.executor, "cancel", None)
            if cancel is not None:
                cancel()
            for t in threads:
                t.join(timeout=30)
            raise
        # A lane that died (a bug) leaves trials without a final state: each gets one, and says why.
        for spec in (s for chain in groups for s in chain):
            trial = self.trials[spec.trial_id]
            if not trial.done:
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, "its lane ended before it finished")
                trial.transition(TrialState.FAILED)
                self._result(trial, spec, result)
                results.append(result)

    # ------------------------------------------------------------------ one trial
    def _run_one(self, trial: Trial, spec: TrialSpec, lane: Lane) -> TrialResult:
        while True:
            trial.transition(TrialState.RUNNING)
            with self._emit:
                self._call_progress(trial, spec, None)
                self.observers.on_trial_start(spec)
            try:
                result = lane.execute(spec, attempt=trial.attempts)
            except Exception as exc:  # an executor bug is still data
                log.exception("executor raised for trial %s", spec.trial_id)
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")
            if result.ok:
                trial.transition(TrialState.COMPLETED)
            elif result.error_kind.retryable and trial.attempts <= self.max_failures and not self._stop.is_set():
                trial.transition(TrialState.RETRYING)
            else:
                trial.transition(TrialState.FAILED)
            self._result(trial, spec, result)
            if trial.done:
                return result

    def _result(self, trial: Trial, spec: TrialSpec, result: TrialResult) -> None:
        with self._emit:
            self.observers.on_trial_result(spec, result)
            self._call_progress(trial, spec, result)

    def _progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        with self._emit:
            self._call_progress(trial, spec, result)

    def _call_progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        try:  # a console that went away (a closed pipe) must not end a lane, or the sweep
            self.on_progress(trial, spec, result)
        except Exception:  # noqa: BLE001
            log.exception("progress callback failed for trial %s", spec.trial_id)


__all__ = ["Executor", "Lane", "SweepController"]
