"""The report's optional sections: diagnosis, predicted knee and knee costs, per configuration.

They come from modules of their own (``orchestrator.observe.diagnosis``, ``.predict``, ``.cost``)
that a version of the package may not have: a missing module leaves its section out of the page
(and says so once), and a module that raises costs only its own section, never the report. Each is
given the configuration's rows of :func:`report.comparison` (one per core count).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pandas as pd

from orchestrator.observe.report import COLUMNS, attribution_columns
from orchestrator.observe.report_tables import ReportOptions

OPTIONAL = {"diagnosis": "diagnosis", "predict": "predicted knee", "cost": "knee costs"}


@dataclass(frozen=True)
class Extras:
    """What the optional modules said about one configuration (None: not available or not asked)."""

    diagnosis: Any | None = None           # diagnosis.Diagnosis: stage, sentence, evidence
    model_params: dict[str, float] | None = None
    model_inputs: dict[str, Any] | None = None  # what the model was fitted on (logged with the prediction)
    predicted_knee: int | None = None
    unfitted: str | None = None            # why no knee model could be fitted
    predicted: pd.DataFrame | None = None  # cores, predicted_s: the model's TTFT p50 at the measured cores
    holdout: pd.DataFrame | None = None    # cores, measured_s, predicted_s, error
    knee_costs: pd.DataFrame | None = None
    notes: tuple[str, ...] = ()            # sections that failed, with the error


def optional_module(name: str) -> ModuleType | None:
    """``orchestrator.observe.<name>``, or None when this version of the package does not have it."""
    full = f"orchestrator.observe.{name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name == full:
            return None
        raise


def missing_sections() -> list[str]:
    """The optional sections whose module is absent (named for the page's footnote)."""
    return [label for name, label in OPTIONAL.items() if optional_module(name) is None]


def _config_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.reindex(columns=[*COLUMNS, *attribution_columns(rows)]).sort_values("cores").reset_index(drop=True)


def _call(fn: Any, *args: Any, **optional: Any) -> Any:
    """``fn(*args, **optional)``, passing only the keyword arguments ``fn`` takes (``tolerance``, ``table``: the
    modules may or may not take them)."""
    try:
        accepted = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepted = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    return fn(*args, **{k: v for k, v in optional.items() if takes_any or k in accepted})


def extras_for(rows: pd.DataFrame, opts: ReportOptions, table: pd.DataFrame | None = None) -> Extras:
    """Run each available optional module on one configuration's rows (see the module docstring); ``table``:
    the whole sweep's comparison, where the cost module looks for the same configuration with one more GPU."""
    config_rows = _config_rows(rows)
    found: dict[str, Any] = {}
    notes: list[str] = []

    def attempt(label: str, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 (another module's trouble costs its section only)
            notes.append(f"{label}: {type(exc).__name__}: {exc}")

    diagnosis = _safe_module("diagnosis", notes)
    if diagnosis is not None:
        attempt("diagnosis", lambda: found.update(
            diagnosis=_call(diagnosis.diagnose, config_rows, tolerance=opts.tolerance)))
    predict = _safe_module("predict", notes)
    if predict is not None:
        attempt("predicted knee", lambda: found.update(_prediction(predict, config_rows, opts.tolerance)))
    cost = _safe_module("cost", notes)
    if cost is not None and opts.priced:
        whole = table.reindex(columns=[*COLUMNS, *attribution_columns(table)]) if table is not None else None
        attempt("knee costs", lambda: found.update(knee_costs=_call(
            cost.knee_costs, config_rows, core_hour_usd=opts.core_hour_usd, gpu_hour_usd=opts.gpu_hour_usd,
            tolerance=opts.tolerance, table=whole)))
    return Extras(**found, notes=tuple(notes))


def _safe_module(name: str, notes: list[str]) -> ModuleType | None:
    try:
        return optional_module(name)
    except Exception as exc:  # noqa: BLE001 (a module that fails to import costs its section only)
        notes.append(f"{OPTIONAL[name]}: cannot import orchestrator.observe.{name}: {type(exc).__name__}: {exc}")
        return None


def _prediction(predict: ModuleType, config_rows: pd.DataFrame, tolerance: float) -> dict[str, Any]:
    model = predict.fit(config_rows)
    if model is None:  # too few core counts to fit
        why = getattr(predict, "cannot_fit", None)
        return {"unfitted": (why(config_rows) if why is not None else None) or "too few core counts"}
    cores = [int(c) for c in config_rows["cores"]]
    out: dict[str, Any] = {
        "model_params": dict(model.params),
        "model_inputs": dict(model.inputs),
        "predicted_knee": int(model.knee(cores, tolerance)),
        "predicted": pd.DataFrame({"cores": cores, "predicted_s": [float(model.predict_ttft_p50(c)) for c in cores]}),
    }
    holdout = _call(predict.holdout, config_rows, tolerance=tolerance)
    if holdout is not None and len(holdout):
        out["holdout"] = holdout
    return out


__all__ = ["OPTIONAL", "Extras", "extras_for", "missing_sections", "optional_module"]
