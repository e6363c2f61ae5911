"""``orchestrator provisioning TRACE...``: cores per GPU in public cluster traces, against a sweep's knee.

Reads each trace (:mod:`orchestrator.observe.provisioning.cluster_traces`), prints per trace and GPU type the
median cores per GPU and the shares of jobs below 2, 4 and 8, and with a knee (given, or the
measured knee of a sweep in MLflow) the share of jobs that would starve. Writes into ``--out``:
``shares.csv``, ``cdf.csv`` (the CDF points), ``cdf.png`` and, with a knee, ``starvation.csv``.
pandas, matplotlib and MLflow are imported inside the command, so the CLI starts fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

WEIGHT_HELP = ("How jobs count: jobs (each once, the paper's view), gpus (by their GPUs; for nodes, the share "
               "of the GPUs), gpu-time (by GPUs x duration; jobs without a duration are left out).")


class TraceInputError(click.ClickException):
    """A trace file is wrong (format, column, row): nothing was written. Exit 2, like a usage error."""

    exit_code = 2


def measured_knees(sweep: str, home: str | None) -> dict[str, float]:
    """Knee cores per GPU of each configuration of ``sweep``, from MLflow as ``orchestrator report`` reads it
    (``MLFLOW_TRACKING_URI``, or the local store under ``home`` / ``ORCH_HOME`` / ``./.orchestrator``)."""
    store = Path(home or os.environ.get("ORCH_HOME") or ".orchestrator").resolve() / "mlflow"
    if not os.environ.get("MLFLOW_TRACKING_URI") and not (store / "mlflow.db").exists():
        raise click.ClickException(f"--sweep {sweep}: no MLFLOW_TRACKING_URI and no local MLflow store at {store}")
    # heavy: MLflow, pandas and psutil stay off `orchestrator --help` (this module is imported for it)
    from mlflow.tracking import MlflowClient

    from orchestrator.infra.local_servers import free_port, mlflow_server
    from orchestrator.observe.provisioning.analysis import sweep_knees
    from orchestrator.observe.report.comparison import comparison, runs_frame
    from orchestrator.observe.tracking import trial_runs

    with mlflow_server(store, port=free_port()) as server:
        runs = trial_runs(MlflowClient(server.uri), sweep)
        uri = server.uri
    if not runs:
        raise click.ClickException(f"--sweep {sweep}: no trials of that sweep at {uri}")
    knees = sweep_knees(comparison(runs_frame(runs)), sweep)
    if not knees:
        raise click.ClickException(f"--sweep {sweep}: no configuration with GPUs has a knee (every trial failed, "
                                   "or the sweep ran without GPUs, where cores per GPU means nothing)")
    return knees


@click.command("provisioning")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--knee-cores-per-gpu", "knee_values", type=click.FloatRange(min=0, min_open=True), multiple=True,
              help="A knee, in cores per GPU: jobs below it would starve. May be given more than once.")
@click.option("--sweep", "sweeps", multiple=True,
              help="Take the knee of every configuration of this sweep from MLflow (as `orchestrator report` does).")
@click.option("--home", default=None, help="Folder for local state, for --sweep's local MLflow store (env ORCH_HOME).")
@click.option("--weight", type=click.Choice(["jobs", "gpus", "gpu-time"]), default="jobs", show_default=True,
              help=WEIGHT_HELP)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="provisioning", show_default=True,
              help="Folder for shares.csv, cdf.csv, cdf.png and starvation.csv.")
def provisioning(traces: tuple[str, ...], knee_values: tuple[float, ...], sweeps: tuple[str, ...], home: str | None,
                 weight: str, out_dir: str) -> None:
    """How many CPU cores per GPU the cluster TRACEs hand out, and which share of jobs a knee would starve.

    Alibaba cluster-trace-gpu-v2023 pods and node lists, v2025 DLRM instances, v2026 spot nodes and jobs,
    AcmeTrace job traces and cluster_summary.csv; the format is told by the header.
    """
    # heavy: rich and pandas stay off `orchestrator --help` (this module is imported for it)
    from rich.console import Console

    from orchestrator.observe.provisioning import analysis as prov
    from orchestrator.observe.provisioning.cluster_traces import ClusterTraceError, combine, load_trace

    console = Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 200)
    try:
        loaded = [load_trace(t) for t in traces]
    except ClusterTraceError as exc:
        raise TraceInputError(str(exc)) from None
    knees = {f"{k:g} cores/GPU": k for k in knee_values}
    for s in sweeps:
        knees.update(measured_knees(s, home))
    frame = combine(loaded)
    for t in loaded:
        console.print(f"{t.path.name}: {t.format.name} ({t.kind}), {t.rows:,} rows, {len(t.frame):,} with a GPU")
        for note in t.notes():
            console.print(f"  - {note}")

    shares = prov.shares_table(frame, weight=weight)
    cdf = prov.cdf_table(frame, weight=weight)
    by = "" if weight == "jobs" else f", weighted by {weight}"
    console.print(prov.render_shares(shares, title=f"CPU cores per GPU{by} (requests: asked by jobs; nodes: hardware)"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shares.to_csv(out / "shares.csv", index=False)
    cdf.to_csv(out / "cdf.csv", index=False)
    prov.cdf_figure(cdf, knees).savefig(out / "cdf.png", dpi=120)
    written = ["shares.csv", "cdf.csv", "cdf.png"]
    if knees:
        starving = prov.starvation_table(frame, knees, weight=weight)
        if len(starving):
            console.print(prov.render_starvation(starving, title=f"Jobs below the knee, would starve{by}"))
        else:
            console.print("no trace of job requests given: no share of jobs below the knee")
        starving.to_csv(out / "starvation.csv", index=False)
        written.append("starvation.csv")
    console.print(f"wrote {', '.join(written)} to {out}")


__all__ = ["TraceInputError", "measured_knees", "provisioning"]
