"""SweepController: runs a plan through an executor, applying retries and resume.

It imports no Ray: the executor is injected (anything with
``execute(trial) -> TrialResult``), and so are the observers. Retry policy lives
here and only here: a retryable failure (node lost, server died, startup
timeout) is run again up to ``max_failures`` times; a config error never is.

An interrupt (Ctrl-C, or SIGTERM turned into one by the cli) still ends the sweep for the
observers: ``on_sweep_end`` gets the results so far, then the interrupt goes on unwinding. A
tracker tells an interrupted sweep from a complete one by the trials that have no result.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Protocol

from orchestrator.callbacks import Callback, CallbackList
from orchestrator.plan import SweepPlan, TrialSpec
from orchestrator.results import ErrorKind, TrialResult
from orchestrator.trial import Trial, TrialState

log = logging.getLogger(__name__)


class Executor(Protocol):
    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        """Run one attempt (1, 2, ... for retries) of ``trial``; each attempt keeps its own artifacts."""
        ...


class SweepController:
    """Drive every trial of ``plan`` to a final state; never raises for a failed trial."""

    def __init__(self, plan: SweepPlan, executor: Executor, *, observers: Iterable[Callback] = (),
                 finished: Callable[[], set[str]] = set, max_failures: int | None = None,
                 on_progress: Callable[[Trial, TrialSpec, TrialResult | None], None] | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.observers = CallbackList(observers)
        self.finished = finished
        self.max_failures = plan.spec.max_failures if max_failures is None else max_failures
        self.on_progress = on_progress or (lambda *_: None)
        self.trials = {t.trial_id: Trial(t.trial_id) for t in plan.trials}

    def run(self) -> list[TrialResult]:
        self.observers.on_sweep_start(self.plan)
        results: list[TrialResult] = []
        try:
            done_before = self.finished()
            for spec in self.plan.trials:
                trial = self.trials[spec.trial_id]
                if spec.trial_id in done_before:
                    trial.transition(TrialState.SKIPPED)
                    self.on_progress(trial, spec, None)
                    continue
                result = self._run_one(trial, spec)
                results.append(result)
        except KeyboardInterrupt:
            log.warning("sweep %s interrupted after %d result(s)", self.plan.spec.name, len(results))
            self.observers.on_sweep_end(self.plan, results)
            raise
        self.observers.on_sweep_end(self.plan, results)
        return results

    def _run_one(self, trial: Trial, spec: TrialSpec) -> TrialResult:
        while True:
            trial.transition(TrialState.RUNNING)
            self.on_progress(trial, spec, None)
            self.observers.on_trial_start(spec)
            try:
                result = self.executor.execute(spec, attempt=trial.attempts)
            except Exception as exc:  # an executor bug is still data
                log.exception("executor raised for trial %s", spec.trial_id)
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")
            if result.ok:
                trial.transition(TrialState.COMPLETED)
            elif result.error_kind.retryable and trial.attempts <= self.max_failures:
                trial.transition(TrialState.RETRYING)
            else:
                trial.transition(TrialState.FAILED)
            self.observers.on_trial_result(spec, result)
            self.on_progress(trial, spec, result)
            if trial.done:
                return result


__all__ = ["Executor", "SweepController"]
