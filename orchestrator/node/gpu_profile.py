"""GPU only, off by default: a short torch-profiler capture inside the window, reduced to a few figures.

Why: on a GPU replica CPU starvation shows on the device as gaps. When the host is late to launch,
kernels wait for it: the GPU is busy a smaller fraction of the time, the gaps between kernels
grow, and the time from a launch call to its kernel's start shrinks (the queue ahead of the GPU
runs dry). The capture uses vLLM's own profiler: the server must be started with
:func:`profiler_args` (vLLM >= 0.13's ``--profiler-config``) or, on older vLLM, :func:`profiler_env`
(``VLLM_TORCH_PROFILER_DIR``); :class:`GpuProfileCapture` then ``POST /start_profile``, waits
``seconds``, ``POST /stop_profile`` and reads the Chrome traces the workers wrote.

:func:`reduce_trace` is pure, over one Chrome-trace JSON (``traceEvents``, complete events ``ph: X``):

- ``gpu_profile_busy_frac`` = |union of the device's kernel, memcpy and memset intervals| / span,
  span = first event start to last event end of the trace (the capture), the mean over devices
  (``_min``: the least busy device);
- ``gpu_profile_gap_us_p50/p90/p99``: the idle gaps between consecutive busy stretches of a device;
- ``gpu_profile_launch_us_p50/p90/p99``: host-side launch latency, a ``cudaLaunchKernel``,
  ``cudaGraphLaunch`` (or ``cuLaunchKernel``...) runtime event's start to the start of the first kernel
  with the same ``correlation`` id;
- ``gpu_profile_kernels``, and from the capture ``gpu_profile_bytes`` (the trace files' size).

Nothing here raises into the trial: a capture that cannot run records ``gpu_profile_status``.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.metrics import percentile

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                   "cuGraphLaunch")
QS = (50, 90, 99)


def profiler_args(trace_dir: str | Path) -> list[str]:
    """vLLM flags that make its workers write torch-profiler traces to ``trace_dir`` (absolute)."""
    cfg = {"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve()),
           "torch_profiler_with_stack": False, "torch_profiler_use_gzip": True}
    return ["--profiler-config", json.dumps(cfg, separators=(",", ":"))]


def profiler_env(trace_dir: str | Path) -> dict[str, str]:
    """The same for vLLM releases before ``--profiler-config``."""
    return {"VLLM_TORCH_PROFILER_DIR": str(Path(trace_dir).resolve())}


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _put(out: dict[str, float], stem: str, values: Sequence[float]) -> None:
    for q in QS:
        v = percentile(values, q)
        if v is not None:
            out[f"{stem}_p{q}"] = v


def reduce_trace(trace: Mapping[str, Any]) -> dict[str, float]:
    """GPU busy fraction, kernel gaps and launch latency of one Chrome trace (see the module docstring).

    Times in the trace are microseconds. A trace without GPU activity gives ``gpu_profile_kernels = 0``."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
              and isinstance(e.get("ts"), (int, float))]
    out: dict[str, float] = {}
    if not events:
        return {"gpu_profile_kernels": 0.0}
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in events)
    busy: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    first_kernel: dict[Any, float] = {}
    launches: dict[Any, float] = {}
    kernels = 0
    for e in events:
        cat = str(e.get("cat", "")).lower()
        args = e.get("args") or {}
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        corr = args.get("correlation")
        if cat in GPU_CATS:
            busy[args.get("device", e.get("pid"))].append((ts, ts + dur))
            if cat == "kernel":
                kernels += 1
                if corr is not None:
                    first_kernel[corr] = min(ts, first_kernel.get(corr, ts))
        elif cat in ("cuda_runtime", "cuda_driver") and str(e.get("name", "")).startswith(LAUNCH_PREFIXES):
            if corr is not None:
                launches[corr] = ts
    out["gpu_profile_kernels"] = float(kernels)
    span = t1 - t0
    if busy and span > 0:
        fracs, gaps = [], []
        for spans in busy.values():
            merged = _merge(spans)
            fracs.append(sum(e - s for s, e in merged) / span)
            gaps += [b[0] - a[1] for a, b in zip(merged, merged[1:])]
        out["gpu_profile_busy_frac"] = sum(fracs) / len(fracs)
        out["gpu_profile_busy_frac_min"] = min(fracs)
        _put(out, "gpu_profile_gap_us", gaps)
    _put(out, "gpu_profile_launch_us", [first_kernel[c] - ts for c, ts in launches.items() if c in first_kernel])
    out["gpu_profile_span_ms"] = span / 1e3
    return out


def load_trace(path: Path) -> dict[str, Any]:
    """A Chrome trace file, gzipped (``.gz``) or not."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(data)


def reduce_traces(traces: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Several workers' traces (tensor parallel: one per rank) as one: their events together."""
    return reduce_trace({"traceEvents": [e for t in traces for e in t.get("traceEvents", [])]})


def _post(url: str, timeout_s: float) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (the replica's loopback URL)
        return resp.status


@dataclass
class GpuProfileCapture:
    """``start()`` in the window starts a capture of ``seconds`` after ``delay_s``; ``stop()`` waits for it.

    ``post`` (url, timeout) -> HTTP status and ``sleep`` are injectable for tests."""

    base_url: str
    trace_dir: Path
    seconds: float = 2.0
    delay_s: float = 1.0
    settle_s: float = 30.0  # how long the traces may take to appear after /stop_profile
    post: Callable[[str, float], int] = _post
    sleep: Callable[[float], None] = time.sleep
    _thread: threading.Thread | None = None
    _result: dict[str, float] = field(default_factory=dict)
    _status: str = "off"

    def start(self) -> "GpuProfileCapture":
        self._status = "running"
        self._thread = threading.Thread(target=self._run, name="gpu-profile", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, params): the reduced figures and ``gpu_profile_status``."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._status = "the capture did not finish in time"
        return dict(self._result), {"gpu_profile_status": self._status}

    def _run(self) -> None:
        try:
            before = {p for p in self.trace_dir.glob("**/*.json*")} if self.trace_dir.exists() else set()
            self.sleep(self.delay_s)
            base = self.base_url.rstrip("/")
            self.post(base + "/start_profile", 60.0)
            self.sleep(self.seconds)
            self.post(base + "/stop_profile", 300.0)
            files = self._wait_for(before)
            traces = [t for t in (load_trace(f) for f in files) if any(
                str(e.get("cat", "")).lower() in GPU_CATS for e in t.get("traceEvents", []) if isinstance(e, dict))]
            if not traces:
                self._status = f"no GPU activity in {len(files)} trace file(s)"
                return
            self._result = {**reduce_traces(traces), "gpu_profile_bytes": float(sum(f.stat().st_size for f in files)),
                            "gpu_profile_s": self.seconds}
            self._status = "ok"
        except urllib.error.HTTPError as exc:
            self._status = (f"HTTP {exc.code} from {exc.url}: start vLLM with the profiler "
                            "(orchestrator.node.gpu_profile.profiler_args)")
        except Exception as exc:  # the capture is a measurement: it must never fail the trial
            self._status = f"capture failed: {type(exc).__name__}: {exc}"[:300]

    def _wait_for(self, before: set[Path]) -> list[Path]:
        waited, last = 0.0, -1
        while waited <= self.settle_s:
            files = sorted(p for p in self.trace_dir.glob("**/*.json*") if p not in before and p.is_file())
            size = sum(p.stat().st_size for p in files)
            if files and size == last:  # written and no longer growing
                return files
            last = size
            self.sleep(1.0)
            waited += 1.0
        return []


__all__ = ["GpuProfileCapture", "load_trace", "profiler_args", "profiler_env", "reduce_trace", "reduce_traces"]
