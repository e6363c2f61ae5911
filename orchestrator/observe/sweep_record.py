"""What a finished sweep reads from and adds to MLflow beyond its trials' runs.

The trials as MLflow holds them (so resumed, skipped trials are in the final table too), and the run's
time-use figures (the share of replica-held time inside windows), logged to the sweep's parent run through
the tracker. Neither may fail a finished sweep: an unreachable MLflow gives None or a warning line.
"""

from __future__ import annotations

import pandas as pd
from mlflow.tracking import MlflowClient

from orchestrator.observe.report.comparison import runs_frame
from orchestrator.observe.time_use import between_leases, describe_time_use, share_metrics, unit_shares
from orchestrator.observe.tracking import MlflowTracker, mlflow_server_ok, trial_runs
from orchestrator.values.trial import SweepPlan


def tracked_frame(uri: str, plan: SweepPlan) -> pd.DataFrame | None:
    """The sweep's trials as MLflow holds them (so resumed, skipped trials are in the table too)."""
    if not mlflow_server_ok(uri):
        return None
    ids = {t.trial_id for t in plan.trials}
    frame = runs_frame(r for r in trial_runs(MlflowClient(uri), plan.spec.name) if r.data.tags.get("trial_id") in ids)
    return frame if len(frame) else None


def log_time_use(timelines: list, tracker: MlflowTracker, sweep: str) -> list[str]:
    """This run's share of replica-held time inside windows: logged to the sweep's run (through the tracker, the one
    MLflow writer), and as lines to print."""
    if not timelines:
        return []
    figures = share_metrics(unit_shares(timelines), between_leases(timelines))
    trouble = tracker.log_sweep_metrics(sweep, figures)
    lines = describe_time_use(figures)
    return lines if trouble is None else [*lines, f"warning: the time-use figures were not logged: {trouble}"]


__all__ = ["log_time_use", "tracked_frame"]
