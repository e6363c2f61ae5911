"""The controller at 8, 64 and 512 nodes: the real controller and node book on simulated nodes, in virtual time.

Each run drives :class:`~orchestrator.control.controller.SweepController` (unchanged) over
:class:`~orchestrator.control.sim_executor.SimExecutor`: N simulated 8-GPU nodes, each trial holding its node
for a duration drawn from the committed H200 trials (``DURATION_FILES``: ``trial_duration_s`` of every
completed H200 trial; a trial that started its replica, ``startup_s`` set, is a *started* duration, 72-304 s;
a later trial on a live replica, re-pinned or a shared start's next window, is a *warm* one, 10-75 s).

Scenarios (the same per node at every N, so the figures compare):
- ``fresh``: 8 fresh trials a node (4 core counts);
- ``repin``: 2 re-pinned groups of 7 core counts (12..1) a node: one start, then 6 re-pins;
- ``mixed``: half H200, half H100 nodes; 12 trials a node (1.5 at 512: ``MIXED_512_REPEATS``), a third of them
  for B200, which no node holds
  (CANNOT_FIT at once), with N/64 nodes lost mid-sweep and N/64 raylets dying (back as new nodes after 60 s);
  the trials on them end NODE_DIED and are retried elsewhere under ``max_failures: 2``;
- ``search``: ``search: knee`` on one configuration a node (re-pinned, 7 core counts, up to 3 windows each),
  each window's requests resampled from a real window of the dense H200 grid (``KNEE_RECORDS``) at its core
  count; the configurations are searched side by side (``controller._run_search``).

Per run: virtual trials per hour and its share of linear (8 nodes' rate per node times N), the share of
node-time held, the controller's real CPU per trial result (process CPU over ``run()`` less the
simulation's own code in the lanes; the real book's share beside it), and the results per second the
driver must write (mean over the sweep; peak over a virtual minute). Checks, every run: each trial ends
exactly once (one final result, every attempt's result written once), CANNOT_FIT trials failed at their
first attempt, lost-node trials were retried.

``--mlflow``: a real MLflow server (sqlite, ``orchestrator.infra.local_servers.mlflow_server``; or
``--mlflow-uri postgresql://...`` for a backend store of that kind) and the real
:class:`~orchestrator.observe.tracking.MlflowTracker`: how many trial results per second it writes, one at a
time as the controller's writer does (each result: a real H200 trial's metrics and params, one real window's
146 request records, 10 telemetry series of 170 samples). With each scenario's results per second, that says
from which node count the outbox would queue. ``--down``: at 512 nodes the fresh scenario paced to real time
with the tracker as the controller's observer; the MLflow server is killed (SIGKILL to its process group) for
``--down-s`` seconds and started again on the same store and port (``--down-payload light``, the default:
the simulated results as they are, so the writes keep up with the fleet; ``real``: a real trial's payload, which
this machine writes at under 1 a second, so the run lasts the 512 writes). Then: every trial has exactly one FINISHED
run, none is missing, and the outbox is empty.

    python benchmarks/scale_sim.py [--nodes 8,64,512] [--scenarios fresh,repin,mixed,search] [--csv out.csv]
                                   [--mlflow] [--down] [--down-s 60]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.control.controller import SweepController
from orchestrator.control.sim_executor import Durations, Fault, SimExecutor, SimNode, fleet
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.callbacks import Callback
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.values.trial import SweepPlan, TrialSpec
from workloads.records import RequestRecord, frame_to_records

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "benchmarks" / "results" / "h200"
# Every committed H200 trials table with trial_duration_s and startup_s (the CPU check is left out).
DURATION_FILES = (
    H200 / "h200-startup-before-trials.csv", H200 / "h200-startup-after-trials.csv",
    H200 / "questions" / "h200-quota-vs-cpuset" / "trials.csv", H200 / "questions" / "h200-api-servers" / "trials.csv",
    H200 / "questions-2" / "h200-structured-output" / "trials.csv",
    H200 / "questions-2" / "h200-serve-vs-vllm" / "trials.csv",
    H200 / "search-2" / "h200-dense-knee" / "trials.csv", H200 / "search-2" / "h200-knee-search" / "trials.csv",
    H200 / "starved" / "agentic-trials.csv", H200 / "starved" / "recorded-trials.csv",
)
KNEE_RECORDS = H200 / "dense" / "records.parquet"
PAYLOAD_TRIAL = H200 / "h200-startup-after-trials.csv"  # a real trial's metrics and params, for the writes
SCENARIOS = ("fresh", "repin", "mixed", "search")
log = logging.getLogger("scale_sim")


def h200_durations(files: tuple[Path, ...] = DURATION_FILES) -> Durations:
    started: list[float] = []
    warm: list[float] = []
    for f in files:
        d = pd.read_csv(f)
        d = d[(d["status"] == "COMPLETED") & d["trial_duration_s"].notna()]
        started += d.loc[d["startup_s"].notna(), "trial_duration_s"].astype(float).tolist()
        warm += d.loc[d["startup_s"].isna(), "trial_duration_s"].astype(float).tolist()
    return Durations(tuple(started), tuple(warm))


class KneeWindows:
    """A window at a core count: one real window of the dense H200 grid at that count, its requests resampled."""

    def __init__(self, path: Path = KNEE_RECORDS) -> None:
        d = pd.read_parquet(path)
        # each window's records, converted once (a draw picks from them: the simulation's own cost stays small)
        self.windows = {int(c): [frame_to_records(g.reset_index(drop=True).drop(columns=["trial_id", "cores", "repeat"]))
                                 for _, g in cg.groupby("trial_id")] for c, cg in d.groupby("cores")}

    def __call__(self, trial: TrialSpec, rng: random.Random) -> tuple[RequestRecord, ...]:
        ws = self.windows[trial.cores]
        w = ws[rng.randrange(len(ws))]
        return tuple(w[rng.randrange(len(w))] for _ in range(len(w)))


# The mixed scenario's repeats: 8 gives 12 trials a node (4 core counts x 3 hardware types x 8 / 8 nodes a workload).
MIXED_REPEATS = 8


def spec(scenario: str, n: int) -> SweepPlan:
    per = max(1, n // 8)
    w = [{"name": f"w{i}", "kind": "agentic", "sessions": 1, "turns": 1} for i in range(per)]
    base: dict[str, Any] = {"name": f"sim-{scenario}-{n}", "models": [{"name": "m", "shape": "tiny-llama"}],
                            "client": {"cores": 2, "isolation": "require"}, "max_failures": 2}
    if scenario == "fresh":
        body = {"workloads": w, "grid": {"cores": [1, 2, 4, 8], "gpus": [1], "hardware": ["H200"], "start": ["fresh"]},
                "repeats": 16}
    elif scenario == "repin":
        groups = [{"name": f"w{i}", "kind": "agentic", "sessions": 1, "turns": 1} for i in range(2 * n)]
        body = {"workloads": groups, "grid": {"cores": [12, 8, 6, 4, 3, 2, 1], "gpus": [1], "hardware": ["H200"],
                                              "start": ["repin"]}, "repeats": 1}
    elif scenario == "mixed":
        body = {"workloads": w, "grid": {"cores": [1, 2, 4, 8], "gpus": [1], "hardware": ["H200", "H100", "B200"],
                                         "start": ["fresh"]}, "repeats": MIXED_REPEATS}
    elif scenario == "search":
        body = {"workloads": [{"name": f"w{i}", "kind": "agentic", "sessions": 1, "turns": 1} for i in range(n)],
                "grid": {"cores": [12, 8, 6, 4, 3, 2, 1], "gpus": [1], "hardware": ["H200"], "start": ["repin"]},
                "repeats": {"min": 1, "max": 3}, "search": "knee"}
    else:
        raise SystemExit(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    return expand(parse_spec({**base, **body}))


def nodes_of(scenario: str, n: int) -> list[SimNode]:
    if scenario == "mixed":
        return fleet({"H200": n // 2, "H100": n - n // 2})
    return fleet({"H200": n})


def faults_of(scenario: str, nodes: list[SimNode], horizon_s: float, seed: int) -> list[Fault]:
    if scenario != "mixed":
        return []
    # On H200 nodes, in the first half of the sweep: the plan lists the H200 trials first, so those nodes are busy.
    rng = random.Random(seed)
    k = max(1, len(nodes) // 64)
    hit = rng.sample([x for x in nodes if x.hardware == "H200"], 2 * k)
    return ([Fault(rng.uniform(0.05, 0.45) * horizon_s, x.node_id, "node_lost") for x in hit[:k]]
            + [Fault(rng.uniform(0.05, 0.45) * horizon_s, x.node_id, "raylet_died", 60.0) for x in hit[k:]])


class Ledger(Callback):
    """Counts what the writer hands the observers: every attempt's result, by trial."""

    def __init__(self) -> None:
        self.results: Counter[str] = Counter()
        self.final: dict[str, TrialResult] = {}
        self.ended = 0

    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None:
        self.results[trial.trial_id] += 1
        self.final[trial.trial_id] = result

    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None:
        self.ended += 1


def run(scenario: str, n: int, durations: Durations, *, seed: int = 0, knee: KneeWindows | None = None,
        observers: tuple[Callback, ...] = (), pace: float | None = None,
        write_rates: list[float] | tuple[float, ...] = ()) -> dict[str, Any]:
    plan = spec(scenario, n)
    nodes = nodes_of(scenario, n)
    horizon = durations.mean_trial_s(0.0) * len(plan.trials) / n
    ex = SimExecutor(nodes, durations, plan=plan, faults=faults_of(scenario, nodes, horizon, seed), seed=seed,
                     records=knee if scenario == "search" else None, pace=pace)
    ledger = Ledger()
    controller = SweepController(plan, ex, observers=(ledger, *observers), max_concurrent=10 ** 6)
    ex.clock.lanes_expected = lambda: controller.lanes_used
    cpu0, wall0 = time.process_time(), time.monotonic()
    results = controller.run()
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - wall0
    ex.close()
    row = figures(scenario, n, plan, ex, controller, ledger, results, cpu, wall)
    ends = sorted(r.ended_at - ex.epoch for r in results)
    for rate in write_rates:
        row[f"outbox_peak_at_{rate:g}_per_s"] = outbox_peak(ends, rate)
    return row


def outbox_peak(ends: list[float], rate: float) -> int:
    """The outbox's deepest point when results arrive at ``ends`` (virtual seconds, sorted) and a tracker uploads
    ``rate`` a second, one after another, oldest first (a queue with a constant service time of 1/rate)."""
    free_at, peak, done = 0.0, 0, []  # when the uploader is next free; the finish time of every queued result
    for t in ends:
        free_at = max(free_at, t) + 1.0 / rate
        done.append(free_at)
    # depth at each arrival: arrived so far less those uploaded by then (both sorted: two pointers)
    j = 0
    for i, t in enumerate(ends):
        while j < len(done) and done[j] <= t:
            j += 1
        peak = max(peak, i + 1 - j)
    return peak


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def busy_share(ex: SimExecutor, lo: float, hi: float, kind: str | None = None) -> tuple[float, float]:
    """(node-seconds held, node-seconds alive) between virtual times ``lo`` and ``hi``, over nodes of ``kind`` (all:
    None). A lost node stops counting when it dies; a restarted raylet counts as a new node once it is back."""
    nodes = {node.node_id: (node, up, down) for node, up, down in ex.lifetimes()}
    mine = {nid for nid, (node, _, _) in nodes.items() if kind is None or node.hardware == kind}
    held = sum(_overlap(t0, t1, lo, hi) for nid, t0, t1 in ex.stats.holds if nid in mine)
    alive = sum(_overlap(up, down, lo, hi) for nid, (_, up, down) in nodes.items() if nid in mine)
    return held, alive


def work_conserving(ex: SimExecutor) -> float:
    """The share of alive node-time held while trials of the node's kind were still waiting to start: from 0 to the
    last time a lane of that kind got a node (until then every chain of the kind was taken in turn, so a free node
    of it had work). 1.0: no free node idled while a pending trial fitted it."""
    held = alive = 0.0
    for kind, last in ex.stats.last_acquire.items():
        h, a = busy_share(ex, 0.0, last, kind)
        held, alive = held + h, alive + a
    return held / alive if alive else 1.0


def figures(scenario: str, n: int, plan: SweepPlan, ex: SimExecutor, controller: SweepController, ledger: Ledger,
            results: list[TrialResult], cpu: float, wall: float) -> dict[str, Any]:
    attempts = sum(ledger.results.values())
    final = {r.trial_id: r for r in results}
    ran = [t for t in plan.trials if t.trial_id in final]
    # Every trial ends exactly once; each attempt's result is written once (the attempts the executor counted).
    assert len(final) == len(results), "a trial has two final results"
    assert attempts == ex.stats.attempts, f"{attempts} results written for {ex.stats.attempts} attempts"
    assert all(controller.trials[t.trial_id].done for t in ran)
    if scenario != "search":
        assert len(final) == len(plan.trials), f"{len(plan.trials) - len(final)} trial(s) without a result"
    kinds = Counter(r.error_kind.value for r in results)
    cannot = [r for r in results if r.error_kind is ErrorKind.CANNOT_FIT]
    assert all(controller.trials[r.trial_id].attempts == 1 for r in cannot), "a CANNOT_FIT trial ran twice"
    retried = [t for t, c in ledger.results.items() if c > 1]
    if ex.stats.node_died:
        assert retried, "a trial on a lost node was not retried"
    ok = [r for r in results if r.ok]
    span = max((r.ended_at for r in results), default=ex.epoch) - ex.epoch
    held = ex.stats.held_s
    per_min = Counter(int((r.ended_at - ex.epoch) // 60) for r in results)
    # The rate between the 25th and the 75th percent of the trials ending: the fleet's, free of the ramp (the
    # first trials of every node end together) and of the tail (the last ones end one by one, and the longest of
    # N nodes' draws grows with N).
    ends = sorted(r.ended_at for r in ok)
    steady, busy_steady, alive = 0.0, 0.0, float(n)
    if len(ends) >= 4:
        lo, hi = ends[len(ends) // 4], ends[3 * len(ends) // 4]
        steady = (3 * len(ends) // 4 - len(ends) // 4) / max(1e-9, (hi - lo) / 3600)
        held_w, alive_w = busy_share(ex, lo - ex.epoch, hi - ex.epoch)
        busy_steady = held_w / alive_w if alive_w else 0.0
        alive = alive_w / max(1e-9, hi - lo)  # nodes alive on average between those ends
    book = ex.book.stats
    controller_cpu = cpu - ex.stats.sim_cpu_s
    return {"scenario": scenario, "nodes": n, "trials": len(ran), "completed": len(ok),
            "cannot_fit": kinds.get("cannot_fit", 0), "node_died_attempts": ex.stats.node_died,
            "retried_trials": len(retried), "results": attempts, "lanes": controller.lanes_used,
            "virtual_h": round(span / 3600, 3), "trials_per_hour": round(steady, 1),
            "sweep_trials_per_hour": round(len(ok) / (span / 3600), 1) if span else 0.0,
            "node_busy_share": round(held / (n * span), 3) if span else 0.0,
            "controller_cpu_ms_per_result": round(1000 * controller_cpu / max(1, attempts), 3),
            "book_cpu_ms_per_result": round(1000 * ex.stats.book_cpu_s / max(1, attempts), 3),
            "sim_cpu_ms_per_result": round(1000 * ex.stats.sim_cpu_s / max(1, attempts), 3),
            "results_per_s_mean": round(attempts / span, 3) if span else 0.0,
            "results_per_s_peak_minute": round(max(per_min.values(), default=0) / 60, 3),
            "mean_hold_s": round(held / max(1, attempts - len(cannot)), 1),
            # the rate against what N nodes give at the durations this run drew (free of the draws' noise)
            "fleet_efficiency": round(steady / (n * 3600 / (held / max(1, attempts - len(cannot)))), 3) if held else 0.0,
            # linear for the nodes there were: the alive nodes between those ends (the mixed scenario loses N/64 for
            # good and has N/64 raylets down for a minute each)
            "alive_nodes": round(alive, 1),
            "of_linear": round(steady / (alive * 3600 / (held / max(1, attempts - len(cannot)))), 3) if held else 0.0,
            # the share of alive node-time held between those ends: free of the duration draws' noise
            "busy_steady": round(busy_steady, 3),
            "work_conserving": round(work_conserving(ex), 4),
            "wakeups_per_release": round(book.wakeups / max(1, book.releases), 3),
            "waits": book.waits,
            "inventory_reads": book.inventory_reads,
            "inventory_reads_per_result": round(book.inventory_reads / max(1, attempts), 4),
            "wall_s": round(wall, 2)}


# ---------------------------------------------------------------------------------------------- MLflow
def payload_result(trial: TrialSpec, rng: random.Random, knee: KneeWindows, row: dict[str, Any],
                   started_at: float, ended_at: float) -> TrialResult:
    """A result shaped like a real H200 trial's: its metrics and params, a real window's records, telemetry."""
    metrics = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and np.isfinite(v)}
    params = {k: str(v) for k, v in row.items() if isinstance(v, str)}
    telemetry = tuple({"t": i / 10, "name": f"cpu{c}_util", "value": rng.uniform(0, 100)}
                      for c in range(10) for i in range(170))
    return TrialResult(trial.trial_id, TrialStatus.COMPLETED, records=knee(trial, rng), metrics=metrics,
                       params=params, telemetry=telemetry, started_at=started_at, ended_at=ended_at)


def real_row() -> dict[str, Any]:
    d = pd.read_csv(PAYLOAD_TRIAL)
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in d.iloc[0].to_dict().items() if pd.notna(v)}


@contextlib.contextmanager
def server(home: Path, uri: str | None, port: int | None = None):
    from orchestrator.infra.local_servers import mlflow_server  # only with --mlflow: keeps a plain run light

    os.environ.pop("MLFLOW_TRACKING_URI", None)  # always a server of this run's own
    # ``uri``: its backend store (a PostgreSQL from mlflow/postgres.sh uri); default sqlite in ``home``
    with mlflow_server(home, port=port or 5000, backend_uri=uri) as s:
        yield s


def tracker_rate(home: Path, uri: str | None, knee: KneeWindows, count: int) -> dict[str, Any]:
    """Results per second the real MlflowTracker writes, one at a time (as the controller's writer calls it)."""
    from orchestrator.observe.tracking import MlflowTracker

    plan = spec("fresh", 8)
    row = real_row()
    rng = random.Random(1)
    with server(home, uri) as s:
        tracker = MlflowTracker(s.uri, outbox_dir=home / "outbox")
        tracker.on_sweep_start(plan)
        times = []
        for t in plan.trials[:count]:
            res = payload_result(t, rng, knee, row, time.time() - 100, time.time())
            t0 = time.monotonic()
            tracker.on_trial_result(t, res)
            times.append(time.monotonic() - t0)
        tracker.on_sweep_end(plan.model_copy(update={"trials": plan.trials[:count]}), [])
        backend = "sqlite" if not uri else uri.split(":", 1)[0]
    return {"backend": backend, "results": count, "write_s_median": round(statistics.median(times), 3),
            "write_s_p90": round(float(np.percentile(times, 90)), 3),
            "results_per_s": round(count / sum(times), 2)}


class Writes(Callback):
    """Wraps the tracker as the controller's observer and gives each result a real trial's payload."""

    def __init__(self, tracker: Any, knee: KneeWindows, real: bool = True) -> None:
        self.tracker, self.knee, self.row, self.real = tracker, knee, real_row(), real
        self.rng = random.Random(2)
        self.write_s: list[float] = []

    def on_sweep_start(self, plan: SweepPlan) -> None:
        self.tracker.on_sweep_start(plan)

    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None:
        if result.ok and self.real:
            result = payload_result(trial, self.rng, self.knee, self.row, result.started_at, result.ended_at)
        t0 = time.monotonic()
        self.tracker.on_trial_result(trial, result)
        self.write_s.append(time.monotonic() - t0)

    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None:
        from orchestrator.observe import outbox

        self.outbox_before_end = len(outbox.pending(self.tracker.outbox_dir))  # what the results left there
        t0 = time.monotonic()
        self.tracker.on_sweep_end(plan, results)
        self.end_s = time.monotonic() - t0


def mlflow_down(home: Path, durations: Durations, knee: KneeWindows, down_s: float, at_s: float,
                trials_per_node: int, real_payload: bool) -> dict[str, Any]:
    """512 nodes, fresh, paced to real time, the tracker observing; MLflow killed at ``at_s`` for ``down_s``."""
    from mlflow import MlflowClient
    from orchestrator.observe import outbox
    from orchestrator.observe.tracking import MlflowTracker, trial_runs

    n = 512
    plan = spec("fresh", n)
    plan = plan.model_copy(update={"trials": plan.trials[:trials_per_node * n]})
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from orchestrator.infra.local_servers import free_port, mlflow_server

    port = free_port()
    box = home / "outbox"
    stack = contextlib.ExitStack()
    first = stack.enter_context(mlflow_server(home, port=port))
    uri = first.uri
    tracker = MlflowTracker(uri, outbox_dir=box)
    writes = Writes(tracker, knee, real_payload)
    ex = SimExecutor(fleet({"H200": n}), durations, plan=plan, seed=3, pace=1.0)
    controller = SweepController(plan, ex, observers=(writes,), max_concurrent=10 ** 6)
    ex.clock.lanes_expected = lambda: controller.lanes_used
    events: dict[str, float] = {}
    queued_at_kill: list[int] = []

    def chaos() -> None:
        time.sleep(at_s)
        assert first.proc is not None
        queued_at_kill.append(len(writes.write_s))
        os.killpg(first.proc.pid, signal.SIGKILL)  # only the server this run started
        first.proc.wait()
        events["killed"] = time.monotonic()
        stack.close()  # its lifeline and records
        time.sleep(down_s)
        again = mlflow_server(home, port=port)
        s2 = again.__enter__()
        assert s2.uri == uri, f"MLflow came back on {s2.uri}, not {uri}"
        events["back"] = time.monotonic()
        events["written_when_back"] = len(writes.write_s)
        events["outbox_when_back"] = len(outbox.pending(box))
        holder.append(again)

    holder: list[Any] = []
    t0 = time.monotonic()
    th = threading.Thread(target=chaos, name="chaos", daemon=True)
    th.start()
    try:
        results = controller.run()
        th.join()
        ended = time.monotonic()
        left_in_outbox = len(outbox.pending(box))
        client = MlflowClient(uri)
        runs = trial_runs(client, plan.spec.name)
        exp = client.get_experiment_by_name(plan.spec.name)
        assert exp is not None
        from orchestrator.observe.tracking import _search_all  # every trial run, superseded ones too

        every = _search_all(client, exp.experiment_id, f"tags.sweep = '{plan.spec.name}'")
    finally:
        for h in holder:
            h.__exit__(None, None, None)
        stack.close()
    finished = Counter(r.data.tags.get("trial_id") for r in every
                       if r.data.tags.get("orchestrator.kind") == "trial" and r.info.status == "FINISHED")
    planned = {t.trial_id for t in plan.trials}
    return {"nodes": n, "trials": len(plan.trials), "results": len(results),
            "virtual_s": round(ex.clock.now, 1), "wall_s": round(ended - t0, 1),
            "killed_after_s": round(events.get("killed", t0) - t0, 1), "down_s": round(events.get("back", 0) - events.get("killed", 0), 1),
            "written_before_kill": queued_at_kill[0] if queued_at_kill else -1,
            "written_when_back": int(events.get("written_when_back", -1)),
            "write_s_median": round(statistics.median(writes.write_s), 3),
            "outbox_when_back": int(events.get("outbox_when_back", -1)),
            "outbox_at_sweep_end": getattr(writes, "outbox_before_end", -1),
            "sweep_end_s": round(getattr(writes, "end_s", -1.0), 1),
            "finished_runs": sum(finished.values()), "trials_with_one_finished_run": sum(1 for c in finished.values() if c == 1),
            "duplicated": sum(1 for c in finished.values() if c > 1), "missing": len(planned - set(finished)),
            "latest_runs": len(runs), "outbox_left": left_in_outbox}


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def main() -> None:
    global MIXED_REPEATS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="8,64,512")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--mixed-repeats", type=int, default=MIXED_REPEATS,
                    help="repeats of the mixed scenario (8: 12 trials a node)")
    ap.add_argument("--write-rates", default="",
                    help="results/s a tracker writes (comma-separated, e.g. the measured rates per backend): the "
                    "outbox's peak depth is modelled for each, from the run's result times")
    ap.add_argument("--mlflow", action="store_true", help="measure the MlflowTracker against a real server")
    ap.add_argument("--mlflow-uri", help="the backend store of the MLflow server this starts (a PostgreSQL: "
                    "`mlflow/postgres.sh uri`) instead of sqlite")
    ap.add_argument("--mlflow-results", type=int, default=40)
    ap.add_argument("--down", action="store_true", help="512 nodes paced to real time, MLflow killed for --down-s")
    ap.add_argument("--down-s", type=float, default=60.0)
    ap.add_argument("--down-at-s", type=float, default=150.0)
    ap.add_argument("--down-trials-per-node", type=int, default=1)
    ap.add_argument("--down-payload", choices=("light", "real"), default="light",
                    help="light: the simulated result as it is (a few params, one metric); real: a real trial's")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    MIXED_REPEATS = args.mixed_repeats
    write_rates = [float(x) for x in args.write_rates.split(",") if x]
    durations = h200_durations()
    print(f"durations: {len(durations.started)} started ({min(durations.started):.0f}-{max(durations.started):.0f} s), "
          f"{len(durations.warm)} warm ({min(durations.warm):.0f}-{max(durations.warm):.0f} s)")
    knee = KneeWindows()
    rows = []
    for scenario in args.scenarios.split(","):
        if not scenario:
            continue
        base: float | None = None
        for n in (int(x) for x in args.nodes.split(",")):
            row = run(scenario, n, durations, seed=args.seed, knee=knee, write_rates=write_rates)
            per_node = row["trials_per_hour"] / n
            base = per_node if base is None else base
            row["pct_of_linear"] = round(100 * per_node / base, 1) if base else 0.0
            rows.append(row)
            print(row, flush=True)
    cols = ["scenario", "nodes", "trials", "completed", "cannot_fit", "node_died_attempts", "retried_trials",
            "results", "virtual_h", "trials_per_hour", "pct_of_linear", "fleet_efficiency", "of_linear", "busy_steady", "work_conserving",
            "sweep_trials_per_hour", "node_busy_share", "controller_cpu_ms_per_result", "book_cpu_ms_per_result",
            "wakeups_per_release", "inventory_reads_per_result", "results_per_s_mean", "results_per_s_peak_minute",
            *[f"outbox_peak_at_{r:g}_per_s" for r in write_rates], "wall_s"]
    if rows:
        print(table(rows, cols))
    if args.csv and rows:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.mlflow or args.down:
        with tempfile.TemporaryDirectory(prefix="scale-sim-") as tmp:
            if args.mlflow:
                rate = tracker_rate(Path(tmp) / "rate", args.mlflow_uri, knee, args.mlflow_results)
                print(rate)
                need: Callable[[dict[str, Any]], float] = lambda r: r["results_per_s_mean"] / r["nodes"]  # noqa: E731
                for r in rows:
                    if r["nodes"] == max(x["nodes"] for x in rows if x["scenario"] == r["scenario"]):
                        print(f"{r['scenario']}: {need(r):.4f} results/s a node; the tracker's "
                              f"{rate['results_per_s']}/s is reached at {rate['results_per_s'] / need(r):.0f} nodes")
            if args.down:
                print(mlflow_down(Path(tmp) / "down", durations, knee, args.down_s, args.down_at_s,
                                  args.down_trials_per_node, args.down_payload == "real"))


if __name__ == "__main__":
    main()
