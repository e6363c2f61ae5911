"""What re-pinning a live replica costs and changes, against a warm fresh start, on a tiny vLLM-CPU model.

Two ways to get a replica onto ``--to`` cores (DESIGN.md, "vLLM startup dominates sweeps"):

- ``repin``: start once on ``--from`` cores, then move the live process tree (cpuset write or
  per-thread affinity). Fast, but thread pools keep the size they got at startup.
- ``fresh``: stop and start a new replica restricted to ``--to`` from the beginning, with the
  compile caches warm (shared VLLM_CACHE_ROOT).

Reports the time per live re-pin, the time per warm fresh start, and client TTFT of simple
sequential streaming completions with one fixed prompt on each replica (same cores). The
client runs on cores outside ``--to`` when the node has any (else it shares, and says so).

    python benchmarks/repin_bench.py --from 0-1 --to 1 --requests 30
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.node.cores import NodeTopology, format_cpulist, parse_cpulist  # noqa: E402
from orchestrator.node.hostfacts import vllm_version  # noqa: E402
from orchestrator.node.replica import VllmReplica, free_port
from orchestrator.plan.models import build_shape  # noqa: E402
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant  # noqa: E402
from orchestrator.values.trial import TrialSpec  # noqa: E402
from workloads.spec import AgenticWorkload  # noqa: E402

PROMPT = " ".join(f"tool output line {i}: status ok, value {i * 7919 % 1000}." for i in range(120))


def make_trial(restriction: str, cores: int) -> TrialSpec:
    return TrialSpec(sweep="repin-bench", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=0,
                     cores=cores, restriction=restriction, start="fresh", vllm=VllmVariant(name="default"),
                     workload=AgenticWorkload(name="fixed", sessions=1, turns=1),
                     server=ServerSpec(block_size=32, max_model_len=4096), client=ClientSpec(), repeat=0)


def ttft_once(port: int, max_tokens: int) -> float:
    """Seconds from sending a streaming completion to its first content chunk."""
    body = json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    while line := resp.readline():
        if first is None and line.startswith(b"data: {"):
            first = time.perf_counter() - t0
    conn.close()
    if first is None:
        raise RuntimeError("no streamed token")
    return first


def ttfts(port: int, n: int, max_tokens: int) -> list[float]:
    ttft_once(port, max_tokens)  # warm-up (also fills the prefix cache once)
    return [ttft_once(port, max_tokens) for _ in range(n)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="src", default=None, help="cores the repin replica starts on (default: node)")
    ap.add_argument("--to", dest="dst", default=None, help="cores both replicas end on (default: last core)")
    ap.add_argument("--restriction", default="cpuset", choices=["cpuset", "affinity", "quota"])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--repins", type=int, default=20, help="re-pins timed (alternating from/to)")
    ap.add_argument("--fresh-starts", type=int, default=2)
    ap.add_argument("--scratch", default=os.environ.get("CPUSWEEP_SCRATCH"))
    a = ap.parse_args()

    topo = NodeTopology.detect()
    src = parse_cpulist(a.src) if a.src else frozenset(topo.cpus)
    dst = parse_cpulist(a.dst) if a.dst else frozenset(topo.cpus[-1:])
    client = frozenset(topo.cpus) - dst or frozenset(topo.cpus)
    os.sched_setaffinity(0, client)
    work = Path(tempfile.mkdtemp(prefix="repin-bench-"))
    scratch = Path(a.scratch) if a.scratch else work / "scratch"
    model = str(build_shape("tiny-llama", work / "model"))
    rows: list[tuple[str, ...]] = []

    # -- repin: one start on src, then live moves
    r = VllmReplica(make_trial(a.restriction, len(src)), model, src, free_port(), work / "repin", a.restriction,
                    scratch_dir=scratch)
    mode = r.mode_used
    with r:
        r.start()
        first_start = r.wait_healthy(900)
        times = [r.repin(dst if i % 2 == 0 else src) for i in range(a.repins)]
        if r.cores != dst:
            times.append(r.repin(dst))
        v = r.verify()
        assert v.ok, v.violations
        repin_ttft = ttfts(r.port, a.requests, a.max_tokens)
        repin_threads = v.threads

    # -- fresh: warm starts restricted to dst from the beginning
    starts, fresh_ttft = [], []
    for i in range(a.fresh_starts):
        f = VllmReplica(make_trial(a.restriction, len(dst)), model, dst, free_port(), work / f"fresh{i}",
                        a.restriction, scratch_dir=scratch)
        with f:
            f.start()
            starts.append(f.wait_healthy(900))
            assert f.verify().ok
            if i == a.fresh_starts - 1:
                fresh_ttft = ttfts(f.port, a.requests, a.max_tokens)

    ms = 1000.0
    print(f"\nvLLM {vllm_version()} on {topo.cpu_model}, {len(topo.cpus)} cores; restriction {mode}"
          f"{' (requested ' + a.restriction + ': ' + str(r.fallback_reason) + ')' if r.fallback_reason else ''};"
          f" replica {format_cpulist(src)} -> {format_cpulist(dst)}, client on {format_cpulist(client)}"
          f"{' (shared)' if client & dst else ''}; prompt {len(PROMPT)} chars, {a.max_tokens} output tokens,"
          f" {a.requests} sequential requests\n")
    print(f"first (cold or warm) start on {format_cpulist(src)}: {first_start:.1f} s; threads in the tree: {repin_threads}")
    print(f"{'what':<28}{'n':>4}{'mean':>10}{'p50':>10}{'p90':>10}{'max':>10}")
    for name, xs, unit in (("live re-pin (ms)", times, ms), ("warm fresh start (s)", starts, 1.0),
                           ("TTFT after re-pin (ms)", repin_ttft, ms), ("TTFT fresh (ms)", fresh_ttft, ms)):
        rows.append((name, str(len(xs)), *(f"{x * unit:.1f}" for x in
                     (statistics.mean(xs), pct(xs, 0.5), pct(xs, 0.9), max(xs)))))
        print(f"{rows[-1][0]:<28}{rows[-1][1]:>4}" + "".join(f"{c:>10}" for c in rows[-1][2:]))
    d50 = (pct(repin_ttft, 0.5) - pct(fresh_ttft, 0.5)) * ms
    d90 = (pct(repin_ttft, 0.9) - pct(fresh_ttft, 0.9)) * ms
    print(f"\nTTFT re-pin minus fresh: p50 {d50:+.1f} ms, p90 {d90:+.1f} ms")


if __name__ == "__main__":
    main()
