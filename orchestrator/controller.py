"""SweepController: runs a plan through an executor, applying retries and resume.

It imports no Ray: the executor is injected (anything with
``execute(trial) -> TrialResult``), and so are the observers. Retry policy lives
here and only here: a retryable failure (node lost, server died, startup
timeout) is run again up to ``max_failures`` times; a config error never is.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Protocol

from orchestrator.plan import SweepPlan, TrialSpec
from orchestrator.results import ErrorKind, TrialResult
from orchestrator.trial import Trial, TrialState

log = logging.getLogger(__name__)


class Executor(Protocol):
    def execute(self, trial: TrialSpec) -> TrialResult: ...


class Observer(Protocol):
    def on_sweep_start(self, plan: SweepPlan) -> None: ...
    def on_trial_start(self, trial: TrialSpec) -> None: ...
    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None: ...
    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None: ...


class SweepController:
    """Drive every trial of ``plan`` to a final state; never raises for a failed trial."""

    def __init__(self, plan: SweepPlan, executor: Executor, *, observers: Iterable[Observer] = (),
                 finished: Callable[[], set[str]] = set, max_failures: int | None = None,
                 on_progress: Callable[[Trial, TrialSpec, TrialResult | None], None] | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.observers = list(observers)
        self.finished = finished
        self.max_failures = plan.spec.max_failures if max_failures is None else max_failures
        self.on_progress = on_progress or (lambda *_: None)
        self.trials = {t.trial_id: Trial(t.trial_id) for t in plan.trials}

    def _notify(self, method: str, *args: object) -> None:
        for obs in self.observers:
            try:
                getattr(obs, method)(*args)
            except Exception:  # an observer must never kill the sweep
                log.exception("observer %s.%s failed", type(obs).__name__, method)

    def run(self) -> list[TrialResult]:
        self._notify("on_sweep_start", self.plan)
        done_before = self.finished()
        results: list[TrialResult] = []
        for spec in self.plan.trials:
            trial = self.trials[spec.trial_id]
            if spec.trial_id in done_before:
                trial.transition(TrialState.SKIPPED)
                self.on_progress(trial, spec, None)
                continue
            result = self._run_one(trial, spec)
            results.append(result)
        self._notify("on_sweep_end", self.plan, results)
        return results

    def _run_one(self, trial: Trial, spec: TrialSpec) -> TrialResult:
        while True:
            trial.transition(TrialState.RUNNING)
            self.on_progress(trial, spec, None)
            self._notify("on_trial_start", spec)
            try:
                result = self.executor.execute(spec)
            except Exception as exc:  # an executor bug is still data
                log.exception("executor raised for trial %s", spec.trial_id)
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")
            if result.ok:
                trial.transition(TrialState.COMPLETED)
            elif result.error_kind.retryable and trial.attempts <= self.max_failures:
                trial.transition(TrialState.RETRYING)
            else:
                trial.transition(TrialState.FAILED)
            self._notify("on_trial_result", spec, result)
            self.on_progress(trial, spec, result)
            if trial.done:
                return result


__all__ = ["Executor", "Observer", "SweepController"]
