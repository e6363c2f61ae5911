"""The ``orchestrator`` command line (click).

Infrastructure comes from the environment, not from the sweep: ``RAY_ADDRESS``
to join a cluster (``ray job submit`` sets it), ``MLFLOW_TRACKING_URI`` to use a
team's tracking server. Without them, ``run`` starts a local Ray and a local
sqlite-backed MLflow server, and stops both when the sweep ends.

Each command imports what it uses when it runs (the sweep's models, rich, Ray, MLflow, pandas), so
``--help`` and ``plan`` start fast (tests/unit/orchestrator/test_preflight.py checks what ``plan`` imports).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.plan.models import ModelError, build_shape
from orchestrator.values.shapes import SHAPES

if TYPE_CHECKING:
    from rich.console import Console
# Dependencies whose deprecation notices are for their own maintainers, not for a sweep's user (a
# warning they attribute to our code, with stacklevel, is ours and still shows; so is any of our own).
NOISY_DEPENDENCIES = (r"(ray|mlflow|pydantic|google|grpc|urllib3|requests|pkg_resources|setuptools|pyarrow"
                      r"|opentelemetry)(\.|$)")
HOME_HELP = "Folder for local state: MLflow store, outbox, trial artifacts (env ORCH_HOME)."
# The statistics orchestrator.observe.analysis.knee decides on (its STATISTICS; not imported here: numpy and scipy
# stay off --help; tests/unit/test_cli_report_options.py checks the two agree). The default first.
KNEE_STATISTICS = ("p90", "mean", "p50", "trimmed", "geomean")


@functools.cache
def _console() -> Console:
    """The commands' console, made on first use (rich is imported then)."""
    from rich.console import Console  # heavy: rich stays off --help (test_preflight checks)

    return Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 200)


def __getattr__(name: str) -> Any:  # ``orchestrator.cli.console``, as before it was made lazily
    if name == "console":
        return _console()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _home(home: str | None) -> Path:
    return Path(home or os.environ.get("ORCH_HOME") or ".orchestrator").resolve()


class InputError(click.ClickException):
    """A sweep's inputs are wrong (spec, trace, model): nothing was started. Exit 2, like a usage error."""

    exit_code = 2


def _load(path: str):
    from orchestrator.plan.load import SpecError, load_spec  # heavy: pydantic's sweep models stay off --help

    try:
        return load_spec(path)
    except SpecError as exc:
        raise InputError(str(exc)) from None


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """Sweep CPU cores x GPUs x models x workloads on vLLM and measure what starving the CPU costs."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose and not sys.warnoptions:  # -v, -W or PYTHONWARNINGS: every warning, as asked
        _quiet_dependencies()
    # SIGTERM (ray job stop, a CI timeout, `timeout`) must unwind like Ctrl-C, so every
    # context manager stops what it started: MLflow server, Ray, vLLM replicas.
    # (orchestrator.infra.local_servers.ray_cluster puts these back after ray.init replaces them.)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)


def _quiet_dependencies() -> None:
    """Hide the deprecation notices of :data:`NOISY_DEPENDENCIES` (and pydantic's note on their fields named
    ``model_*``); every other warning still shows."""
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=NOISY_DEPENDENCIES)
    warnings.filterwarnings("ignore", message=r"Field \"model_", category=UserWarning, module=NOISY_DEPENDENCIES)


def _with_cap(spec, max_concurrent: int | None):
    return spec if max_concurrent is None else spec.model_copy(update={"max_concurrent_trials": max_concurrent})


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the main thread is, so every ``finally`` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


_signals_seen: list[int] = []


def _terminate(signum: int, _frame: object) -> None:
    """The first signal unwinds; a second one during the cleanup is ignored (the cleanup is what stops
    the services), a third one leaves at once: what is left is reaped by the next run of the home."""
    _signals_seen.append(signum)
    if len(_signals_seen) == 1:
        raise Interrupted(signum)
    if len(_signals_seen) == 2:
        print(f"stopping (signal {signum}): services are being stopped; signal again to leave at once",
              file=sys.stderr, flush=True)
        return
    os._exit(128 + signum)


def _exit_of(code_fn) -> None:
    """Run a sweep and exit with its code; 130 after SIGINT (Ctrl-C), 143 after SIGTERM."""
    try:
        code = code_fn()
    except KeyboardInterrupt:
        # The signal that came first, not the exception's: Ray's ray.get re-raises a bare KeyboardInterrupt.
        signum = _signals_seen[0] if _signals_seen else signal.SIGINT
        name = signal.Signals(signum).name
        _console().print(f"interrupted by {name}: services stopped (the sweep's MLflow run is KILLED); "
                         "run the same command again to resume, finished trials are skipped")
        sys.exit(128 + signum)
    sys.exit(code)


@main.command()
@click.argument("sweep", type=click.Path(dir_okay=False))
def plan(sweep: str) -> None:
    """Print the trials of SWEEP without starting anything (after checking the files it reads)."""
    # heavy: rich and the sweep's pydantic models stay off --help
    from rich.table import Table

    from orchestrator.plan.expand import expand
    from orchestrator.plan.preflight import errors, preflight

    spec = _load(sweep)
    problems = preflight(spec, Path(sweep))
    for problem in problems:  # one line each, on stderr, so the table on stdout stays clean
        click.echo(str(problem), err=True)
    if bad := errors(problems):
        raise InputError(f"{len(bad)} input error(s) in {sweep}; fix them before `orchestrator run`")
    p = expand(spec)
    table = Table(title=f"{p.spec.name}: {len(p)} trials")
    cols = ["trial_id", *p.trials[0].factors().keys()] if p.trials else ["trial_id"]
    for c in cols:
        table.add_column(c)
    for t in p.trials:
        table.add_row(t.trial_id, *(str(v) for v in t.factors().values()))
    _console().print(table)


@main.command()
@click.argument("sweep", type=click.Path(dir_okay=False))
@click.option("--home", default=None, help=HOME_HELP)
@click.option("--fresh-sweep", is_flag=True, help="Run every trial again instead of skipping finished ones.")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=None,
              help="Most trials in flight at once (overrides the sweep's max_concurrent_trials).")
def run(sweep: str, home: str | None, fresh_sweep: bool, max_concurrent: int | None) -> None:
    """Run SWEEP: every trial on Ray, tracked in MLflow, then print the comparison.

    Trials run concurrently, as many as the cluster holds under the sweep's placement policy
    (one per node by default), capped by --max-concurrent. The sweep's files are checked first
    (orchestrator.plan.preflight); with an input error nothing starts and the exit code is 2."""
    from orchestrator.sweep import run_sweep  # heavy: Ray, MLflow, pandas stay off --help and plan

    spec = _with_cap(_load(sweep), max_concurrent)
    _exit_of(lambda: run_sweep(spec, Path(sweep), _home(home), console=_console(), resume=not fresh_sweep))


@main.command()
@click.argument("sweep", type=click.Path(dir_okay=False))
@click.option("--home", default=None, help=HOME_HELP)
@click.option("--max-concurrent", type=click.IntRange(min=1), default=None,
              help="Most trials in flight at once (overrides the sweep's max_concurrent_trials).")
def resume(sweep: str, home: str | None, max_concurrent: int | None) -> None:
    """Run the trials of SWEEP that have not finished yet (same as `run`)."""
    from orchestrator.sweep import run_sweep  # heavy: Ray, MLflow, pandas stay off --help and plan

    spec = _with_cap(_load(sweep), max_concurrent)
    _exit_of(lambda: run_sweep(spec, Path(sweep), _home(home), console=_console(), resume=True))


@main.command()
@click.option("--home", default=None, help=HOME_HELP)
def sync(home: str | None) -> None:
    """Upload results kept in the local outbox while MLflow was unreachable."""
    from orchestrator.observe.tracking import sync_outbox  # heavy: MLflow stays off --help

    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise click.ClickException("set MLFLOW_TRACKING_URI to the tracking server to upload to")
    uploaded, remaining = sync_outbox(uri, _home(home) / "outbox")
    _console().print(f"uploaded {uploaded} trial(s); {remaining} left in the outbox")
    sys.exit(1 if remaining else 0)


@main.command()
@click.argument("sweep_name")
@click.option("--home", default=None, help=HOME_HELP)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the report (default <home>/reports/<sweep>/).")
@click.option("--tolerance", type=click.FloatRange(min=0), default=0.10, show_default=True,
              help="The knee: the fewest cores within this fraction of the best TTFT p50.")
@click.option("--ttft-slo", type=click.FloatRange(min=0, min_open=True), default=None,
              help="TTFT target in seconds for goodput (default: the sweep's slo.ttft_s).")
@click.option("--tpot-slo", type=click.FloatRange(min=0, min_open=True), default=None,
              help="TPOT target in seconds for goodput (default: the sweep's slo.tpot_s).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the aggregated table here.")
@click.option("--core-hour-usd", type=click.FloatRange(min=0), default=None,
              help="Price of one core-hour; with --gpu-hour-usd, adds the cost of cores against GPUs.")
@click.option("--gpu-hour-usd", type=click.FloatRange(min=0), default=None, help="Price of one GPU-hour.")
@click.option("--knee-statistic", type=click.Choice(KNEE_STATISTICS), default="p90", show_default=True,
              help="The TTFT figure the knee with its interval is decided on (every window's requests together); "
                   "mean was the default before 2026-12-05.")
def report(sweep_name: str, home: str | None, out_dir: str | None, tolerance: float, ttft_slo: float | None,
           tpot_slo: float | None, csv_path: str | None, core_hour_usd: float | None,
           gpu_hour_usd: float | None, knee_statistic: str) -> None:
    """Write the report of SWEEP_NAME (index.html, PNG plots, CSVs) and print its comparison table.

    Trials come from MLflow (MLFLOW_TRACKING_URI, or the local store), or from the local outbox when
    MLflow is unreachable or has none; a report built from MLflow is also logged to the sweep's
    parent run (artifacts under report/)."""
    # heavy: pandas, matplotlib (the report) and psutil (local_servers) stay off --help
    from orchestrator.infra.local_servers import ServiceError, free_port, mlflow_server
    from orchestrator.observe.report.comparison import costs
    from orchestrator.observe.report.console import print_tables
    from orchestrator.observe.report.data import ReportInputError
    from orchestrator.observe.report.tables import ReportOptions, Slo
    from orchestrator.observe.report.writer import publish

    if (core_hour_usd is None) != (gpu_hour_usd is None):  # checked before any work is done
        raise click.ClickException("give both --core-hour-usd and --gpu-hour-usd, or neither")
    console = _console()
    root = _home(home)
    out = Path(out_dir) if out_dir else root / "reports" / sweep_name
    opts = ReportOptions(tolerance=tolerance, slo=Slo(ttft_slo, tpot_slo, "the command line"),
                         core_hour_usd=core_hour_usd, gpu_hour_usd=gpu_hour_usd, knee_statistic=knee_statistic)
    store = root / "mlflow"

    def build(uri: str | None, offline: str = f"no MLFLOW_TRACKING_URI and no local MLflow store at {store}"):
        try:
            return publish(sweep_name, uri=uri, outbox_dir=root / "outbox", out_dir=out, opts=opts, offline=offline)
        except ReportInputError as exc:
            raise click.ClickException(str(exc)) from None

    if os.environ.get("MLFLOW_TRACKING_URI") or (store / "mlflow.db").exists():
        try:
            with mlflow_server(store, port=free_port()) as server:
                done = build(server.uri)
        except ServiceError as exc:  # the local store's server did not start: the outbox may still hold results
            console.print(f"warning: {exc}")
            done = build(None, f"the local MLflow store at {store} did not start")
    else:
        done = build(None)
    console.print(f"trials read from {done.data.source}")
    for note in done.data.notes:
        console.print(f"  note: {note}", soft_wrap=True)
    table = print_tables(console, done.data.trials, sweep_name, tolerance=tolerance)
    if core_hour_usd is not None and gpu_hour_usd is not None:  # both or neither (checked above)
        bill = costs(table, core_hour_usd=core_hour_usd, gpu_hour_usd=gpu_hour_usd)
        console.print("cost of cores against GPUs (core_share = the cores' part of the hourly bill):")
        console.print(bill.drop(columns=[c for c in ("restriction", "start", "repeat", "vllm_variant", "hardware")
                                         if c in bill]).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if csv_path:
        done.files.table.to_csv(csv_path, index=False)
        console.print(f"table written to {csv_path}")
    for line in done.files.knee_lines():
        console.print(line, soft_wrap=True)
    console.print(f"report written to {done.files.index}", soft_wrap=True)
    if done.logged_to:
        console.print(f"report logged to MLflow run {done.logged_to} (artifacts under report/)")
    elif done.warning:
        console.print(f"warning: {done.warning}")


@main.command()
@click.option("--home", default=None, help=HOME_HELP)
@click.option("--port", default=5000, show_default=True)
def ui(home: str | None, port: int) -> None:
    """Serve the local MLflow store (the one `run` wrote) at http://127.0.0.1:PORT until Ctrl-C."""
    from orchestrator.infra.local_servers import mlflow_server  # heavy: psutil and the lifeline stay off --help

    h = _home(home) / "mlflow"
    if not (h / "mlflow.db").exists():
        raise click.ClickException(f"no local MLflow store at {h}; run a sweep first")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    with mlflow_server(h, port=port) as server:
        _console().print(f"MLflow UI: {server.uri}  (Ctrl-C to stop)")
        try:
            while server.proc and server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


@main.group()
def model() -> None:
    """Config-only model shapes (real config.json + real tokenizer, served with --load-format dummy)."""


@model.command("list")
def model_list() -> None:
    """List the built-in shapes."""
    for s in SHAPES.values():
        _console().print(f"{s.name:16} {s.description}")


@model.command("build")
@click.argument("shape")
@click.argument("dest", type=click.Path(file_okay=False))
def model_build(shape: str, dest: str) -> None:
    """Write the model folder for SHAPE into DEST."""
    try:
        path = build_shape(shape, dest)
    except ModelError as exc:
        raise click.ClickException(str(exc)) from None
    _console().print(f"wrote {path} (serve with --load-format dummy)")


from orchestrator.observe.provisioning.cli import provisioning  # noqa: E402  (click only; pandas loads in the command)

main.add_command(provisioning)


if __name__ == "__main__":
    main()
