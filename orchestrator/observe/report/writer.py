"""The sweep report as a folder: ``index.html``, ``plots/*.png`` and three CSVs (effects).

Layout of ``<out>/`` (``orchestrator report`` defaults to ``<home>/reports/<sweep>/``)::

    index.html       the page (orchestrator.observe.report.html): offline, PNGs by relative path
    aggregated.csv   one row per configuration x cores, with the TTFT intervals (tables.aggregated_table)
    trials.csv       one row per trial (tables.trial_table)
    heatmap.csv      configurations x cores: speedup, "timeout" or "failed" (tables.heatmap_table)
    knee.csv         per configuration: the knee from every window's requests and its interval
                     (orchestrator.observe.analysis.knee), the figures and the monotone fit behind it
    search.csv       a knee search only: why each trial ran, in order (orchestrator.observe.report.search)
    search_cost.csv  a knee search only: GPU-seconds spent per configuration against a 3-repeat grid
    predictions.json per configuration: the knee model's parameters, its inputs, the predicted knee
                     and the held-out check (orchestrator.observe.analysis.predict), or why there is none
    plots/           config-<n>-{ttft,side,goodput,holdout}.png, heatmap.png (orchestrator.observe.report.plots)

:func:`publish` reads the sweep (MLflow, else the outbox: :mod:`orchestrator.observe.report.data`),
writes the folder and logs it under ``report/`` to the sweep's parent run when the trials came from
MLflow. The same inputs and seed write the same files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from orchestrator.observe import stats
from orchestrator.observe.analysis.knee import decode_needs_more, estimate_knee
from orchestrator.observe.report import plots, search
from orchestrator.observe.report.comparison import CONFIG, calibration, costs, drift_warning, references
from orchestrator.observe.report.data import ReportInputError, SweepData, from_mlflow, from_outbox, pending_note
from orchestrator.observe.report.html import Page, Section, render
from orchestrator.observe.report.sections import extras_for
from orchestrator.observe.report.tables import (
    ReportOptions,
    aggregated_table,
    config_labels,
    configurations,
    heatmap_table,
    knee,
    knee_windows,
    merge_slo,
    tpot_values,
    trial_table,
)
from orchestrator.observe.time_use import describe_time_use
from orchestrator.values.sweep_spec import SweepSpec

log = logging.getLogger(__name__)
CSVS = {"aggregated": "aggregated.csv", "trials": "trials.csv", "heatmap": "heatmap.csv",
        "start modes": "start_modes.csv", "references": "references.csv", "knee": "knee.csv"}
_COST_COLUMNS = ["cores", "gpus", "ttft_p50_s", "request_throughput_rps", "hourly_usd", "core_share",
                 "usd_per_1k_requests"]


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote, and the aggregated table it is built on."""

    folder: Path
    index: Path
    csvs: dict[str, Path]
    plots: list[Path]
    table: pd.DataFrame
    opts: ReportOptions
    knees: tuple[tuple[str, Any, Any], ...] = ()  # (configuration, TTFT's and TPOT's KneeEstimate), as on the page

    def knee_lines(self) -> list[str]:
        """One line per configuration for the terminal: its knee with its interval, and a second where the
        time per output token needs more cores than TTFT."""
        out = []
        for label, k, decode in self.knees:
            out.append(f"knee with its interval ({k.statistic} TTFT of every window), {label}: {k.sentence()}")
            if decode_needs_more(k, decode):
                out.append(f"  decode needs more: knee of the {decode.statistic} time per output token, {label}: "
                           f"{decode.sentence()}")
        return out


@dataclass(frozen=True)
class Published:
    """:func:`publish`'s outcome: the files, where the trials came from, and the MLflow run they went to."""

    files: ReportFiles
    data: SweepData
    logged_to: str | None = None   # the parent run id holding report/
    warning: str | None = None     # why the folder was not logged


def _section(i: int, key: tuple[Any, ...], rows: pd.DataFrame, label: str, opts: ReportOptions,
             plot_dir: Path, table: pd.DataFrame, windows: dict[int, Any],
             tpot_windows: dict[int, Any]) -> tuple[Section, list[Path]]:
    anchor = f"config-{i + 1}"
    extras = extras_for(rows, opts, table)
    observed = knee(rows)
    at = "|".join(map(str, key))
    interval = estimate_knee(windows, stat=opts.knee_statistic, tolerance=opts.tolerance, level=opts.knee_level,
                             n_boot=opts.n_boot, seed=stats.cell_seed(opts.seed, "knee|" + at))
    # The same rule on the time per output token: decode can need more cores than the first token does
    # (structured output on the H200: TPOT 4.3x at 2 cores, TTFT 1.2x; benchmarks/results/h200/questions-2).
    decode = estimate_knee(tpot_windows, stat=opts.knee_statistic, tolerance=opts.tolerance,
                           level=opts.knee_level, n_boot=opts.n_boot, seed=stats.cell_seed(opts.seed, "tpot|" + at))
    written = [plots.ttft_plot(rows, plot_dir / f"{anchor}-ttft.png", title=label, knee=observed,
                               predicted=extras.predicted),
               plots.side_plot(rows, plot_dir / f"{anchor}-side.png", title=label),
               plots.knee_plot(interval, plot_dir / f"{anchor}-knee.png", title=label)]
    if opts.slo.given:
        written.append(plots.goodput_plot(rows, plot_dir / f"{anchor}-goodput.png", title=label, slo=opts.slo))
    if extras.holdout is not None:
        written.append(plots.holdout_plot(extras.holdout, plot_dir / f"{anchor}-holdout.png", title=label))
    names = {p.stem.removeprefix(f"{anchor}-"): f"plots/{p.name}" for p in written}
    bill = None
    if (prices := opts.prices) is not None:
        bill = costs(rows, core_hour_usd=prices[0], gpu_hour_usd=prices[1])
        bill = bill.reindex(columns=[c for c in _COST_COLUMNS if c in bill])
    section = Section(anchor=anchor, label=label, factors=dict(zip(CONFIG, key)), rows=rows, knee=observed,
                      extras=extras, plots=names, costs=bill, knee_estimate=interval, tpot_knee_estimate=decode)
    return section, written


KNEE_COLUMNS = ["configuration", "metric", "knee", "low", "high", "level", "settled", "statistic", "tolerance", "cores",
                "figures_s", "fitted_s", "windows", "requests", "shares", "sentence"]


def _knee_record(s: Section, metric: str = "ttft") -> dict[str, Any]:
    k = s.knee_estimate if metric == "ttft" else s.tpot_knee_estimate
    join = lambda xs, fmt="{}": " ".join(fmt.format(x) for x in xs)  # noqa: E731
    return {"configuration": s.label, "metric": metric, "knee": k.knee, "low": k.low, "high": k.high, "level": k.level,
            "settled": k.settled, "statistic": k.statistic, "tolerance": k.tolerance, "cores": join(k.cores),
            "figures_s": join(k.figures, "{:.4f}"), "fitted_s": join(k.fitted, "{:.4f}"), "windows": join(k.windows),
            "requests": join(k.requests), "shares": join(f"{c}:{v:.3f}" for c, v in k.shares.items()),
            "sentence": k.sentence()}


def _prediction_record(s: Section) -> dict[str, Any]:
    x = s.extras
    holdout = x.holdout.to_dict(orient="records") if x.holdout is not None else None
    return {"configuration": {k: str(v) for k, v in s.factors.items()}, "observed_knee": s.knee,
            "predicted_knee": x.predicted_knee, "params": x.model_params, "inputs": x.model_inputs,
            "holdout": holdout, "not_fitted": x.unfitted}


def write_report(data: SweepData, out_dir: Path, opts: ReportOptions) -> ReportFiles:
    """Write the report folder of ``data`` into ``out_dir`` (see the module docstring). ``opts.slo`` holds
    the command line's SLOs; a target it leaves out is taken from the sweep's own ``slo:``."""
    opts = dataclasses.replace(opts, slo=merge_slo(opts.slo, data.slo))
    out_dir = Path(out_dir)
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    for old in plot_dir.glob("*.png"):  # a configuration gone since the last report leaves no figure behind
        old.unlink()
    per_trial = trial_table(data.trials, data.records, opts.slo)
    table = aggregated_table(data.trials, data.records, opts, per_trial)
    heat = heatmap_table(table)
    csvs = {name: out_dir / file for name, file in CSVS.items()}
    table.to_csv(csvs["aggregated"], index=False)
    per_trial.to_csv(csvs["trials"], index=False)
    heat.to_csv(csvs["heatmap"])
    modes = calibration(per_trial)
    modes.to_csv(csvs["start modes"], index=False)
    refs = references(per_trial)
    refs.to_csv(csvs["references"], index=False)
    labels = config_labels(table)
    sections, written = [], []
    for i, (key, rows) in enumerate(configurations(table)):
        section, files = _section(i, key, rows, labels[key], opts, plot_dir, table,
                                  knee_windows(rows, data.records, per_trial),
                                  knee_windows(rows, data.records, per_trial, tpot_values))
        sections.append(section)
        written += files
    knees = [_knee_record(s, m) for m in ("ttft", "tpot") for s in sections]  # TTFT's rows first
    pd.DataFrame(knees, columns=KNEE_COLUMNS).to_csv(csvs["knee"], index=False)
    why = search.why_table(per_trial, labels)
    spent = search.cost_table(why)
    searched = {"search": out_dir / "search.csv", "search cost": out_dir / "search_cost.csv"}
    for old in searched.values():  # a search's tables do not outlive it in a folder written again
        old.unlink(missing_ok=True)
    if not why.empty:
        csvs.update(searched)
        search.visible(why).to_csv(csvs["search"], index=False)
        spent.to_csv(csvs["search cost"], index=False)
    (out_dir / "time_use.json").write_text(json.dumps(dict(data.time_use), indent=2, sort_keys=True), encoding="utf-8")
    (out_dir / "predictions.json").write_text(json.dumps(
        [_prediction_record(s) for s in sections], indent=2, default=str), encoding="utf-8")
    heat_png = None
    if len(table):
        written.append(plots.heatmap_plot(table, labels, plot_dir / "heatmap.png"))
        heat_png = "plots/heatmap.png"
    page = Page(sweep=data.sweep, source=data.source, opts=opts, trials=len(data.trials), sections=sections,
                heatmap=heat, heatmap_png=heat_png, csvs={f"{n} ({p.name})": p.name for n, p in csvs.items()},
                notes=(*data.notes, *filter(None, [drift_warning(data.trials)])),
                time_use=describe_time_use(dict(data.time_use)),
                start_modes=modes, references=refs, search=search.visible(why) if not why.empty else None,
                search_costs=spent if not why.empty else None)
    index = out_dir / "index.html"
    index.write_text(render(page), encoding="utf-8")
    return ReportFiles(folder=out_dir, index=index, csvs=csvs, plots=written, table=table, opts=opts,
                       knees=tuple((s.label, s.knee_estimate, s.tpot_knee_estimate) for s in sections))


def load_sweep(sweep: str, *, uri: str | None, outbox_dir: Path, offline: str = "no MLflow tracking URI") -> SweepData:
    """The sweep's trials from MLflow at ``uri``, or from the outbox when MLflow is unreachable, fails or has no
    trials of it (``offline``: why there is no ``uri``). :class:`ReportInputError` when neither has any."""
    from orchestrator.observe.tracking import mlflow_server_ok  # heavy: MLflow stays off write_report's path

    reason = offline
    if uri:
        reason = f"MLflow at {uri} is unreachable"
        if mlflow_server_ok(uri):
            from mlflow import MlflowClient  # heavy: MLflow stays off write_report's path

            try:
                data = from_mlflow(MlflowClient(uri), sweep, source=f"MLflow at {uri}")
            except ReportInputError:
                raise
            except Exception as exc:  # noqa: BLE001 (a server that answers /health but fails a search)
                data, reason = None, f"MLflow at {uri} failed: {type(exc).__name__}: {exc}"
            else:
                reason = f"MLflow at {uri} has no trials of {sweep!r}"
            if data is not None:
                note = pending_note(outbox_dir, sweep)
                return dataclasses.replace(data, notes=(*data.notes, note)) if note else data
    data = from_outbox(outbox_dir, sweep, reason=reason)
    if data is None:
        raise ReportInputError(f"no trials of sweep {sweep!r}: {reason}, and none in the outbox {outbox_dir}")
    return data


def publish(sweep: str, *, uri: str | None, outbox_dir: Path, out_dir: Path, opts: ReportOptions,
            offline: str = "no MLflow tracking URI") -> Published:
    """Read the sweep (:func:`load_sweep`), write its report into ``out_dir`` and, when it came from MLflow, log
    the folder as ``report/`` artifacts of its parent run (a failure to log is a warning, not an error)."""
    data = load_sweep(sweep, uri=uri, outbox_dir=outbox_dir, offline=offline)
    files = write_report(data, out_dir, opts)
    if data.kind != "mlflow" or not uri:
        return Published(files, data)
    if data.parent_run_id is None:
        return Published(files, data, warning=f"sweep {sweep!r} has no parent run in MLflow to log the report to")
    from orchestrator.observe.tracking import log_report  # heavy: MLflow stays off write_report's path

    try:
        log_report(uri, data.parent_run_id, files.folder)
    except Exception as exc:  # noqa: BLE001 (the folder is written; MLflow trouble only costs the copy)
        log.warning("report of %s not logged to MLflow: %s", sweep, exc)
        return Published(files, data, warning=f"not logged to MLflow: {type(exc).__name__}: {exc}")
    return Published(files, data, logged_to=data.parent_run_id)


def write_sweep_report(spec: SweepSpec, home: Path, uri: str | None) -> str:
    """Write the sweep's report (``orchestrator.observe.report.writer.publish``) into ``home/reports/<sweep>/``;
    return the line that says where it is. Never raises: a finished sweep must not fail over its report."""
    try:
        done = publish(spec.name, uri=uri, outbox_dir=home / "outbox", out_dir=home / "reports" / spec.name,
                       opts=ReportOptions())
    except Exception as exc:  # noqa: BLE001 (the sweep's results are safe in MLflow or the outbox)
        return f"warning: the report was not written: {type(exc).__name__}: {exc}"
    logged = f" (logged to MLflow run {done.logged_to} under report/)" if done.logged_to else ""
    return "\n".join([*done.files.knee_lines(), f"report written to {done.files.index}{logged}"])


__all__ = ["CSVS", "Published", "ReportFiles", "load_sweep", "publish", "write_report", "write_sweep_report"]
