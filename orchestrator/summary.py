"""Pure merge of one trial's raw outcome into flat, MLflow-safe summary metrics."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping


def summarize_trial(run: Any, server: Mapping[str, float], rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Workload metrics (from the request records) + server /metrics deltas + telemetry means.

    ``run`` is a ``workloads.WorkloadRun``; NaN and None values are dropped, since
    MLflow cannot compare them.
    """
    from orchestrator.telemetry import summarize_series
    from workloads.metrics import summarize

    out: dict[str, float] = {}
    out.update(summarize(run.records))
    out.update(server)
    out.update(summarize_series(list(rows)))
    out["client_cpu_s"] = float(run.client_cpu_s)
    out["window_s"] = float(run.wall_s)
    return {k: float(v) for k, v in out.items() if v is not None and not math.isnan(float(v))}


__all__ = ["summarize_trial"]
