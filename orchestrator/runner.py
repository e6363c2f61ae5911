"""run_sweep: wire the pipeline together for one sweep (services, controller, executor, tracking, report).

    SweepSpec ─expand─▶ SweepPlan ─SweepController─▶ RayTrialExecutor ─▶ TrialResult ─▶ MLflow + table
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from orchestrator.control.controller import SweepController
from orchestrator.plan.expand import SweepPlan, TrialSpec, expand
from orchestrator.observe.report import calibration, comparison, references, render, results_frame, spread_warnings
from orchestrator.control.results import TrialResult
from orchestrator.plan.spec import SweepSpec
from orchestrator.control.trial import Trial, TrialState


def print_tables(console: Console, frame, sweep_name: str, spread_warn: float = 0.10, tolerance: float = 0.10):
    """Print the comparison (and each start mode against fresh, when the sweep has more than one); return it.

    Repeats are aggregated; a configuration whose repeats disagree by more than ``spread_warn`` at
    TTFT p50 is flagged in the table ("!") and named below it. ``tolerance``: the knee's (see
    ``report.comparison``)."""
    table = comparison(frame, tolerance=tolerance, spread_warn=spread_warn)
    if len(table):
        console.print(render(table, title=f"{sweep_name}: TTFT against cores"))
        for line in spread_warnings(table, spread_warn):
            console.print(f"  warning: {line}")
    calib = calibration(frame)
    if len(calib):
        console.print("start modes against fresh starts at the same cores (ratio = mode / fresh):")
        console.print(calib.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    refs = references(frame)
    if len(refs):
        console.print("the harness against the reference clients (TTFT s, medians over repeats; "
                      "harness_vs_*: below 1 = the harness reads less):")
        show = [c for c in ("cores", "repeats", "harness_p50_s", "bare_p50_s", "vllm_bench_p50_s", "harness_p90_s",
                            "bare_p90_s", "vllm_bench_p90_s", "harness_vs_bare", "harness_vs_vllm_bench",
                            "gpu0_util_mean") if c in refs]
        console.print(refs[[c for c in ("workload",) if c in refs] + show].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
    return table


def _progress(console: Console):
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


def _tracked_frame(uri: str, plan: SweepPlan):
    """The sweep's trials as MLflow holds them (so resumed, skipped trials are in the table too)."""
    from mlflow.tracking import MlflowClient

    from orchestrator.observe.report import runs_frame
    from orchestrator.observe.tracking import mlflow_server_ok, trial_runs

    if not mlflow_server_ok(uri):
        return None
    ids = {t.trial_id for t in plan.trials}
    frame = runs_frame(r for r in trial_runs(MlflowClient(uri), plan.spec.name) if r.data.tags.get("trial_id") in ids)
    return frame if len(frame) else None


def write_sweep_report(spec: SweepSpec, home: Path, uri: str | None) -> str:
    """Write the sweep's report (``orchestrator.observe.report_writer.publish``) into ``home/reports/<sweep>/``;
    return the line that says where it is. Never raises: a finished sweep must not fail over its report."""
    from orchestrator.observe.report_tables import ReportOptions
    from orchestrator.observe.report_writer import publish

    try:
        done = publish(spec.name, uri=uri, outbox_dir=home / "outbox", out_dir=home / "reports" / spec.name,
                       opts=ReportOptions())
    except Exception as exc:  # noqa: BLE001 (the sweep's results are safe in MLflow or the outbox)
        return f"warning: the report was not written: {type(exc).__name__}: {exc}"
    logged = f" (logged to MLflow run {done.logged_to} under report/)" if done.logged_to else ""
    return f"report written to {done.files.index}{logged}"


def _time_use(timelines: list, sweep: str, uri: str) -> list[str]:
    """This run's share of replica-held time inside windows: logged to the sweep's run, and as lines to print."""
    from orchestrator.observe.windows import between_leases, describe_time_use, share_metrics, unit_shares

    if not timelines:
        return []
    figures = share_metrics(unit_shares(timelines), between_leases(timelines))
    try:
        from mlflow.tracking import MlflowClient

        from orchestrator.observe.tracking import log_sweep_metrics, mlflow_server_ok, parent_run

        client = MlflowClient(uri) if mlflow_server_ok(uri) else None
        parent = parent_run(client, sweep) if client is not None else None
        if parent is not None:
            log_sweep_metrics(client, parent.info.run_id, figures)
    except Exception as exc:  # noqa: BLE001 (a figure about the run must not fail it)
        return [*describe_time_use(figures), f"warning: the time-use figures were not logged: {exc}"]
    return describe_time_use(figures)


def run_sweep(spec: SweepSpec, spec_path: Path, home: Path, *, console: Console, resume: bool = True) -> int:
    """Run every trial; return 0 if all trials completed (or were already done), 1 if one failed,
    2 if the sweep's inputs are wrong (``orchestrator.plan.preflight``: then nothing was started)."""
    from orchestrator.plan.preflight import errors, preflight

    # Before any service: a bad trace line or model folder must not cost a Ray, MLflow and vLLM start.
    problems = preflight(spec, spec_path, for_run=True)
    for problem in problems:
        console.print(str(problem), soft_wrap=True)  # one line each, however long
    if bad := errors(problems):
        console.print(f"{len(bad)} input error(s) in {spec_path}: nothing was started")
        return 2

    from orchestrator.control import survivors
    from orchestrator.control.homelock import HomeBusy, home_lock

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
    from orchestrator.control.ray_executor import RayTrialExecutor
    from orchestrator.control.services import mlflow_server, ray_cluster, ui_command
    from orchestrator.observe.tracking import MlflowTracker

    plan: SweepPlan = expand(spec)
    console.print(f"sweep {spec.name}: {len(plan)} trials; state in {home}")
    with mlflow_server(home / "mlflow", record_in=home) as ml, ray_cluster(record_in=home):
        console.print(f"MLflow tracking at {ml.uri}")
        tracker = MlflowTracker(ml.uri, outbox_dir=home / "outbox", spec_path=spec_path)
        executor = RayTrialExecutor(home, plan=plan)
        controller = SweepController(
            plan, executor, observers=[tracker],
            finished=(lambda: tracker.finished_trial_ids(spec.name)) if resume else set,
            on_progress=_progress(console))
        try:
            results = controller.run()
        finally:
            executor.close()
        states = {tid: t.state for tid, t in controller.trials.items()}
        time_use = _time_use(executor.timelines, spec.name, ml.uri)
        frame = _tracked_frame(ml.uri, plan)
        report_line = write_sweep_report(spec, home, ml.uri)  # while MLflow still runs, to log the report to it
    if frame is None:  # MLflow unreachable: this run's results only (the rest is in the outbox)
        frame = results_frame(plan.trials, results)
    table = print_tables(console, frame, spec.name, spec.protocol.spread_warn)
    csv = home / "reports" / f"{spec.name}.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv, index=False)
    console.print(f"table written to {csv}")
    for line in time_use:
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


__all__ = ["print_tables", "run_sweep", "write_sweep_report"]
