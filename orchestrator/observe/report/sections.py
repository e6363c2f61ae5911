"""The report's analysis sections per configuration: the diagnosis, the predicted knee and the knee's costs.

Each is a plain call into :mod:`orchestrator.observe.analysis` on the configuration's rows of
:func:`~orchestrator.observe.report.comparison.comparison` (one per core count). A section whose analysis
raises costs only that section, never the report: the page names the section and the error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from orchestrator.observe.analysis import cost, diagnosis, predict
from orchestrator.observe.report.comparison import COLUMNS, attribution_columns
from orchestrator.observe.report.tables import ReportOptions


@dataclass(frozen=True)
class Extras:
    """What the analyses said about one configuration (None: not asked, or its section failed)."""

    diagnosis: diagnosis.Diagnosis | None = None
    model_params: dict[str, float] | None = None
    model_inputs: dict[str, Any] | None = None  # what the model was fitted on (logged with the prediction)
    predicted_knee: int | None = None
    unfitted: str | None = None            # why no knee model could be fitted
    predicted: pd.DataFrame | None = None  # cores, predicted_s: the model's TTFT p50 at the measured cores
    holdout: pd.DataFrame | None = None    # cores, measured_s, predicted_s, error
    knee_costs: pd.DataFrame | None = None
    notes: tuple[str, ...] = ()            # sections that failed, with the error


def _config_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.reindex(columns=[*COLUMNS, *attribution_columns(rows)]).sort_values("cores").reset_index(drop=True)


def prediction(config_rows: pd.DataFrame, tolerance: float) -> dict[str, Any]:
    """The fitted queueing model's knee and its TTFT p50 at the measured cores, with the hold-out check;
    ``unfitted`` says why when too few core counts were measured."""
    model = predict.fit(config_rows)
    if model is None:
        return {"unfitted": predict.cannot_fit(config_rows) or "too few core counts"}
    cores = [int(c) for c in config_rows["cores"]]
    out: dict[str, Any] = {
        "model_params": dict(model.params),
        "model_inputs": dict(model.inputs),
        "predicted_knee": int(model.knee(cores, tolerance)),
        "predicted": pd.DataFrame({"cores": cores, "predicted_s": [float(model.predict_ttft_p50(c)) for c in cores]}),
    }
    held = predict.holdout(config_rows, tolerance=tolerance)
    if held is not None and len(held):
        out["holdout"] = held
    return out


def extras_for(rows: pd.DataFrame, opts: ReportOptions, table: pd.DataFrame | None = None) -> Extras:
    """Run each analysis on one configuration's rows; ``table``: the whole sweep's comparison, where the cost
    analysis looks for the same configuration with one more GPU."""
    config_rows = _config_rows(rows)
    found: dict[str, Any] = {}
    notes: list[str] = []

    def attempt(label: str, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            found.update(fn())
        except Exception as exc:  # noqa: BLE001 (one analysis's trouble costs its section only)
            notes.append(f"{label}: {type(exc).__name__}: {exc}")

    attempt("diagnosis", lambda: {"diagnosis": diagnosis.diagnose(config_rows, tolerance=opts.tolerance)})
    attempt("predicted knee", lambda: prediction(config_rows, opts.tolerance))
    if (prices := opts.prices) is not None:
        whole = table.reindex(columns=[*COLUMNS, *attribution_columns(table)]) if table is not None else None
        attempt("knee costs", lambda: {"knee_costs": cost.knee_costs(
            config_rows, core_hour_usd=prices[0], gpu_hour_usd=prices[1], tolerance=opts.tolerance,
            table=whole)})
    return Extras(**found, notes=tuple(notes))


__all__ = ["Extras", "extras_for", "prediction"]
