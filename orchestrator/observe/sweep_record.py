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
from orchestrator.values.trial import SweepPlan, TrialSpec


def tracked_frame(uri: str, plan: SweepPlan) -> pd.DataFrame | None:
    """The sweep's trials as MLflow holds them (so resumed, skipped trials are in the table too)."""
    if not mlflow_server_ok(uri):
        return None
    ids = {t.trial_id for t in plan.trials}
    frame = runs_frame(r for r in trial_runs(MlflowClient(uri), plan.spec.name) if r.data.tags.get("trial_id") in ids)
    return frame if len(frame) else None


def reference_history(uri: str, plan: SweepPlan) -> list[tuple[TrialSpec, str | None, float | None]]:
    """The plan's trials that earlier runs finished, oldest first, each with why it ran the references
    (``crosscheck_why``) and their harness/bare TTFT p50 ratio: what ``ReferencePlan.resume`` takes. Empty when
    MLflow is unreachable (the references may then run again at an end)."""
    if not mlflow_server_ok(uri):
        return []
    by_id = {t.trial_id: t for t in plan.trials}
    runs = [r for r in trial_runs(MlflowClient(uri), plan.spec.name)
            if r.info.status == "FINISHED" and r.data.tags.get("trial_id") in by_id]
    return [(by_id[r.data.tags["trial_id"]], r.data.params.get("crosscheck_why"),
             r.data.metrics.get("crosscheck_ttft_p50_ratio")) for r in sorted(runs, key=lambda r: r.info.start_time)]


def log_time_use(timelines: list, tracker: MlflowTracker, sweep: str) -> list[str]:
    """This run's share of replica-held time inside windows: logged to the sweep's run (through the tracker, the one
    MLflow writer), and as lines to print."""
    if not timelines:
        return []
    figures = share_metrics(unit_shares(timelines), between_leases(timelines))
    trouble = tracker.log_sweep_metrics(sweep, figures)
    lines = describe_time_use(figures)
    return lines if trouble is None else [*lines, f"warning: the time-use figures were not logged: {trouble}"]


__all__ = ["log_time_use", "reference_history", "tracked_frame"]
