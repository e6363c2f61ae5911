"""What the terminal shows while a sweep runs: one line per trial event (start, skip, end, warnings)."""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Console

from orchestrator.control.trial import Trial, TrialState
from orchestrator.values.results import TrialResult
from orchestrator.values.trial import TrialSpec


def progress_lines(console: Console) -> Callable[[Trial, TrialSpec, TrialResult | None], None]:
    """The controller's ``on_progress`` callback: a line per trial event on ``console``."""
    started: dict[str, float] = {}

    def on_progress(trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        label = f"[{spec.trial_id}] {spec.model.name} {spec.workload.name} gpus={spec.gpus} cores={spec.cores}"
        if trial.state is TrialState.SKIPPED:
            console.print(f"{label}: already finished in MLflow, skipped")
        elif trial.state is TrialState.RUNNING:
            started[spec.trial_id] = time.monotonic()
            console.print(f"{label}: running (attempt {trial.attempts})")
        elif result is not None:
            took = time.monotonic() - started.get(spec.trial_id, time.monotonic())
            detail = f" {result.error_kind.value}: {result.message}" if not result.ok else ""
            console.print(f"{label}: {trial.state.value} in {took:.0f} s{detail}")
            for w in result.warnings:
                console.print(f"  warning: {w}")
    return on_progress


__all__ = ["progress_lines"]
