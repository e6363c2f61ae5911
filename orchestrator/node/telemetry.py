"""Telemetry of one trial: server-side /metrics deltas and sampled CPU/GPU time series.

Two kinds of facts, kept apart:

* **Server deltas.** vLLM V1 exposes cumulative counters and histograms on
  ``/metrics``. A trial scrapes once before and once after its measurement
  window; :func:`delta` turns the two :class:`MetricsSnapshot` values into flat,
  MLflow-safe ``server_*`` metrics (means, approximate percentiles, token counts,
  prefix hit rate). Cumulative values are summed across label sets
  (``model_name``, ``engine``), so data-parallel engines add up.
* **Sampled series.** :class:`TelemetrySampler` runs in background threads
  during the window and records rows ``{"t", "name", "value"}``: per-core CPU
  utilisation of the replica's and the client's cores, GPU utilisation, memory
  and clock state (NVML, absent on CPU machines), and the gauges of ``/metrics`` (running,
  waiting, KV usage) at a lower rate. :func:`summarize_series` reduces the rows
  to ``<name>_mean`` / ``<name>_max``.
* **Counter readings.** The same sampler reads cumulative counters (the replica's CPU accounting
  and per-role counters, given as ``counters``) at ``counters_hz``, once at ``start()`` and once at
  ``stop()``, and keeps them with their time (``counter_readings``). A figure over the requests'
  span comes from the two readings :func:`span_readings` picks inside it, scaled to the span's
  length, so what ran before the first send and after the last completion never enters it.

The sampler lives in the workload process (on the client's cores), never in the
replica's cgroup, so it does not steal the cores under test.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# Short output stem -> candidate vLLM histogram names (first present wins; older names later).
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}
# Short output stem -> candidate counter sample names (with the `_total` suffix the text format adds).
COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    # Eviction evidence for the replay-fidelity gap: preempted requests lose their blocks; with
    # vLLM's --kv-cache-metrics, a sample (--kv-cache-metrics-sample, default 1%) of evicted blocks.
    "preemptions": ("vllm:num_preemptions_total",),
    "kv_evicted_blocks_sampled": ("vllm:kv_block_idle_before_evict_seconds_count",),
}
# Short output stem -> candidate gauge names; sampled over time by TelemetrySampler.
GAUGES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
QUANTILES: tuple[float, ...] = (0.5, 0.9)
# Readings per second of the cumulative counters (``TelemetrySampler(counters=...)``): a figure over the
# requests' span extrapolates at most one period at each of its ends (see :func:`span_readings`).
COUNTERS_HZ = 2.0


@dataclass(frozen=True)
class MetricsSnapshot:
    """One parse of ``/metrics``.

    ``values`` maps a sample name (``vllm:prompt_tokens_total``,
    ``vllm:e2e_request_latency_seconds_sum``, a gauge name...) to its value summed
    over every label set. ``buckets`` maps a histogram name to ``{le: cumulative
    count}``, also summed over label sets. ``taken_at`` is a monotonic time.
    """

    values: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)
    taken_at: float = 0.0
    info: dict[str, dict[str, str]] = field(default_factory=dict)  # labels of ``*_info`` gauges

    def block_size(self) -> int | None:
        """The KV-cache block size the server runs with (``vllm:cache_config_info``), or None."""
        try:
            return int(self.info["vllm:cache_config_info"]["block_size"])
        except (KeyError, ValueError):
            return None

    def first(self, names: Iterable[str]) -> float | None:
        """Value of the first name present (metric names differ across vLLM versions)."""
        for n in names:
            if n in self.values:
                return self.values[n]
        return None

    def gauges(self) -> dict[str, float]:
        """Current gauge values as ``server_<stem>`` (missing gauges are left out)."""
        out = {}
        for stem, names in GAUGES.items():
            v = self.first(names)
            if v is not None:
                out[f"server_{stem}"] = v
        return out


def parse_metrics(text: str, taken_at: float | None = None) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a :class:`MetricsSnapshot` (``_created`` samples dropped)."""
    values: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    info: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            if s.name.endswith("_info"):
                info.setdefault(s.name, dict(s.labels))
            if s.name.endswith("_bucket") and "le" in s.labels:
                buckets[s.name[: -len("_bucket")]][float(s.labels["le"])] += s.value
            else:
                values[s.name] += s.value
    return MetricsSnapshot(values=dict(values), buckets={k: dict(v) for k, v in buckets.items()},
                           taken_at=time.monotonic() if taken_at is None else taken_at, info=info)


class HttpSession(Protocol):
    """The part of ``requests.Session`` that :func:`scrape` uses (injectable for tests)."""

    def get(self, url: str, timeout: float) -> Any: ...


def scrape(base_url: str, session: HttpSession | None = None, timeout_s: float = 5.0) -> MetricsSnapshot:
    """GET ``<base_url>/metrics`` and parse it. ``session`` is requests-like; default: urllib."""
    url = base_url.rstrip("/") + "/metrics"
    if session is not None:
        resp = session.get(url, timeout=timeout_s)
        resp.raise_for_status()
        text = resp.text
    else:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (http URL we were given)
            text = resp.read().decode("utf-8")
    return parse_metrics(text)


def histogram_quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus-style quantile from cumulative bucket counts ``{le: count}``.

    rank = q * total; the first bucket whose cumulative count reaches rank holds the
    quantile, interpolated linearly between its lower and upper bound (lower bound of
    the first bucket is 0). A quantile in the +Inf bucket returns the largest finite
    bound, as Prometheus does. Returns None when the window holds no observations.
    """
    les = sorted(cumulative)
    if not les:
        return None
    total = cumulative[les[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in les:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                finite = [x for x in les if not math.isinf(x)]
                return finite[-1] if finite else None
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / in_bucket
        prev_le, prev_count = le, count
    return None


def _counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, names: Iterable[str]) -> float | None:
    for n in names:
        if n in after.values:
            d = after.values[n] - before.values.get(n, 0.0)
            return d if d >= 0 else None  # negative: the server restarted inside the window
    return None


def delta(before: MetricsSnapshot, after: MetricsSnapshot, seconds: float | None = None) -> dict[str, float]:
    """Server metrics over the window between two snapshots, as ``server_*`` floats.

    ``seconds``: what the per-second rates divide by, the requests' span when the caller knows it
    (every token of the window is counted inside it); default: the time between the two scrapes.

    For each histogram stem (ttft, queue, prefill, decode, itl, e2e):
      ``server_<stem>_s_mean`` = Δsum / Δcount, ``server_<stem>_count`` = Δcount,
      ``server_<stem>_s_p50`` / ``_p90`` from the bucket deltas (:func:`histogram_quantile`).
      These are only as fine as vLLM's buckets (request-phase buckets start at 0.3 s, so a
      1 ms queue time reads p50 0.15 s); exact percentiles come from the client's records.
    Counters: ``server_<stem>`` = Δ value; ``server_prefix_hit_rate`` = Δhits / Δqueries;
    ``server_<prompt|generation>_tokens_per_s`` = Δtokens / ``seconds``.
    Derived: ``server_frontend_s_mean`` = ttft_mean − (queue_mean + prefill_mean), the
    frontend (tokenization, detokenization) and IPC share of TTFT — a CPU-attribution metric.
    Metrics absent from this vLLM version, or with no observations, are left out. Gauges
    (running, waiting, KV usage) have no meaningful delta: :class:`TelemetrySampler` samples them.
    """
    out: dict[str, float] = {}
    window = after.taken_at - before.taken_at if seconds is None else seconds
    for stem, names in HISTOGRAMS.items():
        name = next((n for n in names if f"{n}_count" in after.values), None)
        if name is None:
            continue
        d_count = _counter_delta(before, after, [f"{name}_count"])
        d_sum = _counter_delta(before, after, [f"{name}_sum"])
        if d_count is None or d_count <= 0 or d_sum is None:
            continue
        out[f"server_{stem}_count"] = d_count
        out[f"server_{stem}_s_mean"] = d_sum / d_count
        b_after = after.buckets.get(name, {})
        b_before = before.buckets.get(name, {})
        diff = {le: c - b_before.get(le, 0.0) for le, c in b_after.items()}
        if diff and all(v >= 0 for v in diff.values()):
            for q in QUANTILES:
                v = histogram_quantile(q, diff)
                if v is not None:
                    out[f"server_{stem}_s_p{round(q * 100)}"] = v
    for stem, names in COUNTERS.items():
        d = _counter_delta(before, after, names)
        if d is not None:
            out[f"server_{stem}"] = d
    if out.get("server_prefix_cache_queries", 0) > 0 and "server_prefix_cache_hits" in out:
        out["server_prefix_hit_rate"] = out["server_prefix_cache_hits"] / out["server_prefix_cache_queries"]
    if window > 0:
        for stem in ("prompt_tokens", "generation_tokens"):
            if f"server_{stem}" in out:
                out[f"server_{stem}_per_s"] = out[f"server_{stem}"] / window
    if all(f"server_{s}_s_mean" in out for s in ("ttft", "queue", "prefill")):
        out["server_frontend_s_mean"] = (
            out["server_ttft_s_mean"] - (out["server_queue_s_mean"] + out["server_prefill_s_mean"]))
    return out


class GpuReader(Protocol):
    """Reads ``{index: {reading: value}}`` for the GPUs being watched; each reading becomes the series
    ``gpu<index>_<reading>`` (``util`` percent and ``mem_gib`` always; NVML adds the clock readings of
    :data:`GPU_CLOCK_READINGS` where the driver has them)."""

    def read(self) -> dict[int, dict[str, float]]: ...

    def close(self) -> None: ...


# Why a GPU's clocks were held down, from NVML's clock-event reasons: a power cap, a thermal limit or a
# hardware slowdown. Left out: the GPU idling, an application clock setting, sync boost, the display clock.
SLOWDOWN_REASONS = 0x04 | 0x08 | 0x20 | 0x40 | 0x80
# The GPU's clock state, read beside utilisation so a window's figure can be set against the clocks it ran
# at (issue 31's "GPU clocks" candidate): the SM clock (MHz), the board's power draw (W) and whether a
# slowdown reason held the clocks down (1 or 0; its mean is the share of samples slowed).
GPU_CLOCK_READINGS = ("sm_clock_mhz", "power_w", "clock_slowdown")


class NvmlReader:
    """GPU utilisation, memory and clock state through NVML (nvidia-ml-py). Indices are NVML (physical)
    indices. A clock reading the driver does not support is left out from then on; utilisation and memory
    are required."""

    def __init__(self, indices: Sequence[int] | None = None) -> None:
        import pynvml  # optional: nvidia-ml-py, on GPU machines only (ImportError on CPU-only installs)

        self._nvml = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        wanted = range(count) if indices is None else [i for i in indices if 0 <= i < count]
        self._handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in wanted}
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        self._clock_readings: dict[str, Callable[[Any], float]] = {
            "sm_clock_mhz": lambda h: float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
            "power_w": lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }
        if reasons is not None:
            self._clock_readings["clock_slowdown"] = lambda h: float(bool(reasons(h) & SLOWDOWN_REASONS))

    def read(self) -> dict[int, dict[str, float]]:
        out = {}
        for i, h in self._handles.items():
            values = {"util": float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                      "mem_gib": self._nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30}
            for name, get in list(self._clock_readings.items()):
                try:
                    values[name] = get(h)
                except self._nvml.NVMLError as exc:  # e.g. NotSupported on this board or driver
                    log.debug("no GPU %s: %s", name, exc)
                    del self._clock_readings[name]
            out[i] = values
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # shutdown of an absent driver is not our concern
            self._nvml.nvmlShutdown()


def open_gpu_reader(indices: Sequence[int] | None = None) -> GpuReader | None:
    """An NVML reader, or None where there is no NVML (no package, no driver, no GPU)."""
    try:
        reader = NvmlReader(indices)
    except Exception as exc:  # noqa: BLE001 (ImportError, NVMLError_LibraryNotFound, ...)
        log.debug("no GPU telemetry: %s", exc)
        return None
    if not reader._handles:
        reader.close()
        return None
    return reader


class PerCpuUtil:
    """Busy percent per logical CPU since the previous call, from ``psutil.cpu_times(percpu=True)``.

    Keeps its own previous sample, unlike ``psutil.cpu_percent`` whose module-level state is
    shared with (and disturbed by) any other caller in the process.
    """

    def __init__(self) -> None:
        self._last = psutil.cpu_times(percpu=True)

    def __call__(self) -> list[float]:
        now = psutil.cpu_times(percpu=True)
        out = []
        for a, b in zip(self._last, now):
            idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
            # guest time is already counted in user/nice on Linux
            total = (sum(b) - getattr(b, "guest", 0.0) - getattr(b, "guest_nice", 0.0)) - (
                sum(a) - getattr(a, "guest", 0.0) - getattr(a, "guest_nice", 0.0))
            out.append(0.0 if total <= 0 else max(0.0, min(100.0, 100.0 * (1.0 - idle / total))))
        self._last = now
        return out


class TelemetrySampler:
    """Background sampling of CPU, GPU and server gauges during a trial's measurement window.

    Rows are ``{"t": seconds since start(), "name": str, "value": float}``:
    ``replica_cpu_util`` / ``client_cpu_util`` (mean percent over the set), ``cpu<N>_util``
    per core of either set, ``gpu<N>_util`` (percent), ``gpu<N>_mem_gib`` and the clock state
    (``gpu<N>_sm_clock_mhz``, ``gpu<N>_power_w``, ``gpu<N>_clock_slowdown``), and
    ``server_num_requests_running`` / ``_waiting`` / ``server_kv_cache_usage_perc``.
    CPU and GPU are sampled at ``hz`` (0 = not at all); ``/metrics`` at ``metrics_hz`` in its own thread so a
    slow scrape of a starved server never delays the CPU samples. Collaborators (clock, CPU
    reader, scraper, GPU reader) are injectable for tests.

    ``counters`` (a callable returning one reading of cumulative counters, any object) is read at
    ``start()``, every ``1 / counters_hz`` seconds in a thread of its own (``counters_hz`` 0: only at
    start and stop) and at ``stop()``; ``counter_readings`` are ``(t, reading)`` with ``t`` on the rows'
    scale, the middle of the read (a read of the replica's whole tree takes tens of milliseconds).
    """

    def __init__(
        self,
        *,
        replica_cpus: Iterable[int] = (),
        client_cpus: Iterable[int] = (),
        metrics_url: str | None = None,
        hz: float = 10.0,
        metrics_hz: float = 1.0,
        gpu_indices: Sequence[int] | None = None,
        gpu_reader: GpuReader | None | bool = True,
        clock: Callable[[], float] = time.monotonic,
        cpu_percent: Callable[[], list[float]] | None = None,
        scraper: Callable[[str], MetricsSnapshot] = scrape,
        counters: Callable[[], Any] | None = None,
        counters_hz: float = COUNTERS_HZ,
    ) -> None:
        if hz < 0 or metrics_hz <= 0 or counters_hz < 0:
            raise ValueError("sampling rates must be >= 0 (host, counters; 0 = off) and > 0 (metrics; no URL = off)")
        self.replica_cpus = tuple(sorted(set(replica_cpus)))
        self.client_cpus = tuple(sorted(set(client_cpus)))
        self.metrics_url = metrics_url
        self.period = 1.0 / hz if hz > 0 else 0.0
        self.metrics_period = 1.0 / metrics_hz
        self._gpu_arg = gpu_reader
        self._gpu_indices = gpu_indices
        self._gpu: GpuReader | None = None
        self._clock = clock
        self._cpu_percent = cpu_percent if cpu_percent is not None else PerCpuUtil()
        self._scraper = scraper
        self._counters = counters
        self.counters_period = 1.0 / counters_hz if counters_hz > 0 else 0.0
        self._readings: list[tuple[float, Any]] = []
        self._counter_lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0
        self._t_stop: float | None = None
        self._started = False
        self.errors: dict[str, int] = defaultdict(int)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> TelemetrySampler:
        if self._threads:
            raise RuntimeError("sampler already started")
        if self._gpu_arg is True:
            self._gpu = open_gpu_reader(self._gpu_indices)
        elif self._gpu_arg not in (False, None):
            self._gpu = self._gpu_arg  # type: ignore[assignment]
        self._cpu_percent()  # start the first CPU interval now, not at construction
        self._t0 = self._clock()
        self._started = True
        self._stop.clear()
        self._threads = []
        if self._counters is not None:  # the first reading before any thread runs: readings cover start to stop
            self.sample_counters_now()
            if self.counters_period > 0:
                self._threads.append(threading.Thread(target=self._loop, args=(self._sample_counters,
                                                                               self.counters_period),
                                                      name="telemetry-counters", daemon=True))
        if self.period > 0:
            self._threads.append(threading.Thread(target=self._loop, args=(self._sample_host, self.period),
                                                  name="telemetry-host", daemon=True))
        if self.metrics_url:
            self._threads.append(threading.Thread(target=self._loop, args=(self._sample_server, self.metrics_period),
                                                  name="telemetry-metrics", daemon=True))
        for t in self._threads:
            t.start()
        return self

    @property
    def started_at(self) -> float:
        """When sampling started, on the sampler's clock (``time.monotonic`` unless injected): row ``t`` 0."""
        return self._t0

    @property
    def sampled_s(self) -> float:
        """Seconds from start to stop (to now while sampling)."""
        end = self._t_stop if self._t_stop is not None else self._clock()
        return max(0.0, end - self._t0)

    def stop(self) -> list[dict[str, Any]]:
        """Stop sampling (idempotent) and return every row so far, ordered by time; the first call
        takes the last counter reading."""
        if self._t_stop is None and self._started:
            self._t_stop = self._clock()
            if self._counters is not None:
                self.sample_counters_now()
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        if self._gpu is not None and self._gpu_arg is True:
            self._gpu.close()
            self._gpu = None
        with self._lock:
            return sorted(self._rows, key=lambda r: r["t"])

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rows)

    @property
    def counter_readings(self) -> list[tuple[float, Any]]:
        """``(t, reading)`` of every counter reading so far, ordered by ``t`` (seconds since ``start()``)."""
        with self._counter_lock:
            return sorted(self._readings, key=lambda r: r[0])

    # -- sampling ------------------------------------------------------------------------
    def sample_now(self) -> None:
        """Take one CPU/GPU sample now: what the sampling thread does every period (a test with a fake
        clock and ``hz=0`` drives it by hand)."""
        self._sample_host(self._clock() - self._t0)

    def sample_counters_now(self) -> None:
        """Take one counter reading now (as the counters' thread does every period)."""
        self._sample_counters(self._clock() - self._t0)

    def _sample_counters(self, t: float) -> None:
        assert self._counters is not None
        with self._counter_lock:  # the thread and stop() never read at once
            a = self._clock()
            reading = self._counters()
            b = self._clock()
            self._readings.append(((a + b) / 2 - self._t0, reading))

    def _loop(self, sample: Callable[[float], None], period: float) -> None:
        next_at = self._clock() + period  # first sample one period in: CPU busy needs an interval
        while not self._stop.wait(max(0.0, next_at - self._clock())):
            try:
                sample(self._clock() - self._t0)
            except Exception as exc:  # noqa: BLE001 (a bad sample must never end the trial)
                name = sample.__name__
                if self.errors[name] == 0:
                    log.warning("telemetry %s failed (further failures counted only): %s", name, exc)
                self.errors[name] += 1
            next_at += period

    def _add(self, t: float, values: Mapping[str, float]) -> None:
        rows = [{"t": t, "name": k, "value": float(v)} for k, v in values.items()]
        with self._lock:
            self._rows.extend(rows)

    def _sample_host(self, t: float) -> None:
        per_core = self._cpu_percent()
        values: dict[str, float] = {}
        for label, cpus in (("replica", self.replica_cpus), ("client", self.client_cpus)):
            got = [per_core[c] for c in cpus if c < len(per_core)]
            if got:
                values[f"{label}_cpu_util"] = sum(got) / len(got)
        for c in sorted(set(self.replica_cpus) | set(self.client_cpus)):
            if c < len(per_core):
                values[f"cpu{c}_util"] = per_core[c]
        if self._gpu is not None:
            for i, readings in self._gpu.read().items():
                for name, value in readings.items():
                    values[f"gpu{i}_{name}"] = value
        self._add(t, values)

    def _sample_server(self, t: float) -> None:
        assert self.metrics_url is not None
        self._add(t, self._scraper(self.metrics_url).gauges())


def rows_in_span(rows: Iterable[Mapping[str, Any]], t0: float, t1: float) -> list[dict[str, Any]]:
    """The rows that describe time inside ``[t0, t1]`` (``t`` in the sampler's seconds).

    A host sample (CPU, GPU) at ``t`` averages the sampling period that ends at ``t``, so it counts
    when the middle of that period, ``t - period/2``, lies in the span; a ``/metrics`` gauge
    (``server_*``) is a reading at ``t`` and counts when ``t`` does. The period of a series is the
    smallest gap between its timestamps. So the workload's set-up before the span and its
    post-processing after it (idle time for the server) never enter the window's means. A series
    with no row inside (a span shorter than its period) keeps the rows that overlap the span."""
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_name[str(r["name"])].append(dict(r))
    out: list[dict[str, Any]] = []
    for name, series in by_name.items():
        times = sorted(float(r["t"]) for r in series)
        period = min((b - a for a, b in zip(times, times[1:]) if b > a), default=0.0)
        lag = 0.0 if name.startswith("server_") else period / 2
        inside = [r for r in series if t0 <= float(r["t"]) - lag <= t1]
        if not inside:
            inside = [r for r in series if t0 < float(r["t"]) and float(r["t"]) - 2 * lag < t1]
        out.extend(inside)
    return sorted(out, key=lambda r: float(r["t"]))


def span_readings(times: Sequence[float], t0: float, t1: float) -> tuple[int, int] | None:
    """Which two counter readings a figure over the span ``[t0, t1]`` comes from (pure): indices into
    ``times`` (sorted), or None with no two readings apart.

    The first and the last reading inside the span when they are apart: nothing from before or after
    the span enters the figure, and the caller scales the difference by ``(t1 - t0) / (t_b - t_a)``
    to the span's length (the rate inside the span times the span; the parts extrapolated, before
    the first reading and after the last, are each under one reading period). With fewer than two
    readings inside (a span shorter than the period), the last reading at or before ``t0`` and the
    first at or after ``t1``, which hold the span and at most a period either side of it."""
    inside = [i for i, t in enumerate(times) if t0 <= t <= t1]
    if len(inside) >= 2 and times[inside[-1]] > times[inside[0]]:
        return inside[0], inside[-1]
    before = [i for i, t in enumerate(times) if t <= t0]
    after = [i for i, t in enumerate(times) if t >= t1]
    a = before[-1] if before else 0
    b = after[0] if after else len(times) - 1
    return (a, b) if 0 <= a < b < len(times) and times[b] > times[a] else None


__all__ = ["COUNTERS", "COUNTERS_HZ", "GAUGES", "GPU_CLOCK_READINGS", "HISTOGRAMS", "GpuReader", "MetricsSnapshot", "NvmlReader", "PerCpuUtil", "TelemetrySampler",
           "delta", "histogram_quantile", "open_gpu_reader", "parse_metrics", "rows_in_span", "scrape",
           "span_readings"]
