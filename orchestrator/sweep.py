"""run_sweep: wire the pipeline together for one sweep (services, controller, executor, tracking, report).

    SweepSpec ─expand─▶ SweepPlan ─SweepController─▶ RayTrialExecutor ─▶ TrialResult ─▶ MLflow + table

Wiring only: what each part does is in its own module (preflight, the home lock, the local servers,
the controller and executor, the tracker, the report, the terminal's tables and progress lines).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console

from orchestrator.control.controller import SweepController
from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.control.search import Outcome, SearchTrial, from_history
from orchestrator.control.trial import TrialState
from orchestrator.infra import survivors
from orchestrator.infra.homelock import HomeBusy, home_lock
from orchestrator.infra.local_servers import mlflow_server, ray_cluster, ui_command
from orchestrator.observe.report.comparison import results_frame
from orchestrator.observe.report.console import print_tables
from orchestrator.observe.report.writer import load_sweep, write_sweep_report
from orchestrator.observe.sweep_record import log_time_use, reference_history, tracked_frame
from orchestrator.observe.tracking import MlflowTracker
from orchestrator.plan.expand import expand
from orchestrator.plan.preflight import errors, preflight
from orchestrator.progress import SweepDisplay
from orchestrator.values.sweep_spec import SweepSpec
from orchestrator.values.trial import SweepPlan

log = logging.getLogger(__name__)


def run_sweep(spec: SweepSpec, spec_path: Path, home: Path, *, console: Console, resume: bool = True) -> int:
    """Run every trial; return 0 if all trials completed (or were already done), 1 if one failed,
    2 if the sweep's inputs are wrong (``orchestrator.plan.preflight``: then nothing was started)."""
    # Before any service: a bad trace line or model folder must not cost a Ray, MLflow and vLLM start.
    problems = preflight(spec, spec_path, for_run=True)
    for problem in problems:
        console.print(str(problem), soft_wrap=True)  # one line each, however long
    if bad := errors(problems):
        console.print(f"{len(bad)} input error(s) in {spec_path}: nothing was started")
        return 2

    home.mkdir(parents=True, exist_ok=True)
    try:
        with home_lock(home):  # one run per home, for the whole run; a dead holder's lock is free
            for line in survivors.reap(home):  # what a run that died (SIGKILL) left running
                console.print(line)
            return _run_locked(spec, spec_path, home, console=console, resume=resume)
    except HomeBusy as exc:
        console.print(f"error: {exc}")
        return 2


def _run_locked(spec: SweepSpec, spec_path: Path, home: Path, *, console: Console, resume: bool) -> int:
    """The run itself, with the home locked. Services are recorded in ``home/services.json`` while they run."""
    plan: SweepPlan = expand(spec)
    searched = " (candidates of a knee search: it runs a subset)" if spec.search.kind == "knee" else ""
    console.print(f"sweep {spec.name}: {len(plan)} trials{searched}; state in {home}")
    with mlflow_server(home / "mlflow", record_in=home) as ml, ray_cluster(record_in=home):
        console.print(f"MLflow tracking at {ml.uri}")
        tracker = MlflowTracker(ml.uri, outbox_dir=home / "outbox", spec_path=spec_path)
        executor = RayTrialExecutor(home, plan=plan)
        display = SweepDisplay(console, plan)  # live on a terminal, lines otherwise; the warnings when it ends
        executor.on_phase = display.on_phase
        if resume:  # crosscheck: auto: the ends earlier runs ran the references at are not run again
            executor.references.resume(reference_history(ml.uri, plan))
        controller = SweepController(
            plan, executor, observers=[tracker],
            finished=(lambda: tracker.finished_trial_ids(spec.name)) if resume else set,
            on_progress=display.on_progress, on_phase=display.on_phase,
            history=lambda: search_history(spec.name, ml.uri, home / "outbox"))
        try:
            with display:
                results = controller.run()
        finally:
            executor.close()
        search_lines = _search_end(controller.outcomes, tracker, spec.name)
        states = {tid: t.state for tid, t in controller.trials.items()}
        time_use = log_time_use(executor.timelines, tracker, spec.name) + executor.references.summary()
        frame = tracked_frame(ml.uri, plan)
        report_line = write_sweep_report(spec, home, ml.uri)  # while MLflow still runs, to log the report to it
    if frame is None:  # MLflow unreachable: this run's results only (the rest is in the outbox)
        frame = results_frame(plan.trials, results)
    table = print_tables(console, frame, spec.name, spec.protocol.spread_warn)
    csv = home / "reports" / f"{spec.name}.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False)
    console.print(f"table written to {csv}")
    for line in [*time_use, *search_lines]:
        console.print(line, soft_wrap=True)
    console.print(report_line, soft_wrap=True)
    if ml.proc is not None:
        console.print(f"MLflow UI: {ui_command(home)}")
    else:
        console.print(f"MLflow UI: {ml.uri}")
    failed = [tid for tid, s in states.items() if s is TrialState.FAILED]
    if failed:
        console.print(f"{len(failed)} trial(s) failed: {', '.join(failed)}")
    return 1 if failed else 0


def search_history(sweep: str, uri: str, outbox_dir: Path) -> dict[str, SearchTrial]:
    """A knee search's finished trials of earlier runs (their TTFTs from ``records.parquet``), read as the report
    reads them; empty (logged) when they cannot be read: the search then counts them as run, without a window."""
    try:
        data = load_sweep(sweep, uri=uri, outbox_dir=outbox_dir)
    except Exception as exc:  # noqa: BLE001 (resume must not crash the sweep)
        log.warning("knee search of %s: earlier trials not read (%s): they count as run, without windows", sweep, exc)
        return {}
    return from_history(data.trials, data.records)


def _search_end(outcomes: list[Outcome], tracker: MlflowTracker, sweep: str) -> list[str]:
    """How each knee search ended: lines for the terminal, and tags ``search_stop_reason`` and ``search_knee``
    on the sweep's parent run (one configuration: the reason and sentence; several: "label: ..." joined by "; ")."""
    if not outcomes:
        return []
    one = len(outcomes) == 1
    tags = {"search_stop_reason": "; ".join(o.stop.value if one else f"{o.label}: {o.stop.value}" for o in outcomes),
            "search_knee": "; ".join(o.estimate.sentence() if one else f"{o.label}: {o.estimate.sentence()}"
                                     for o in outcomes)}
    tracker.tag_sweep(sweep, tags)
    return [o.line() for o in outcomes]


__all__ = ["run_sweep", "search_history"]
