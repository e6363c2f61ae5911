"""The catalogue of figures: every metric, param and tag a trial or a sweep writes to MLflow, and the figures the
report derives from them, declared once (pure; imports nothing of the stages).

A :class:`Figure` says what a key is: its unit, its meaning, the module that produces it, how the repeats of a
configuration aggregate it, when it appears at all (``when``: ``always`` on every finished trial, or the condition
that makes it: a GPU, a quota, a cross-check...), and its one type. A key with ``{...}`` is a *family*: one figure
per role, per sampled series, per CPU; the braces name what varies.

What reads it:

- the tracker's payload (``orchestrator.observe.outbox``): a key that is not declared is still logged (nothing is
  lost) but warned about once, naming this module;
- the report: the CSV and comparison columns (``column``: their order), how repeats aggregate, and the evidence
  table's labels and display units (``label``, ``shown``);
- ``mlflow/README.md``'s list of figures, generated from here (:func:`markdown`) and checked by a test;
- the tests: ``tests/unit/orchestrator/test_figures.py`` (every declared figure is produced by the module it names;
  the README list is current) and the smoke sweep's integration test (every key a real sweep logged is declared,
  and every ``always`` figure was logged).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache


class Kind(str, enum.Enum):
    """Where a figure lives."""

    METRIC = "metric"          # a child run's metric (a float)
    PARAM = "param"            # a child run's param (a string in MLflow; ``type`` says what it holds)
    TAG = "tag"                # a child run's tag
    SWEEP_METRIC = "sweep metric"  # the sweep's parent run
    SWEEP_PARAM = "sweep param"
    SWEEP_TAG = "sweep tag"
    REPORT = "report"          # derived by the report or the diagnosis, never logged per trial


class Agg(str, enum.Enum):
    """How the repeats of one configuration and core count aggregate a figure in the comparison."""

    MEDIAN = "median"  # of the completed repeats (the latency percentiles)
    MEAN = "mean"      # of the completed repeats
    SUM = "sum"        # over every repeat (counts of requests)
    NONE = "-"         # not aggregated (params, tags, the report's own columns)


class PrefixCacheReset(str, enum.Enum):
    """The ``prefix_cache_reset`` param: whether the prefix cache was emptied before the window. The values are
    the strings MLflow has always held for it."""

    DONE = "True"
    FAILED = "False"
    OFF = "off"  # neither the protocol nor a re-pin asked for it


_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# What a placeholder may stand for, where that is a closed set (anything else: one or more characters).
DOMAINS = {"unit": "(gpu|core)", "q": "([0-9]+)"}


@dataclass(frozen=True)
class Figure:
    key: str                 # exact, or a family with {placeholders}
    kind: Kind
    unit: str                # "s", "ms", "1" (a fraction), "%" (0-100), "count", "req/s", "CPU-s", "" (text)...
    meaning: str
    producer: str            # the module that writes the key
    agg: Agg = Agg.MEAN
    when: str = "always"     # "always", or the condition under which it appears
    type: type = float
    built: bool = False      # the producer does not spell the key out: it builds it from parts (a loop over
    #                          percentiles, phases, an end), or takes it from here
    column: int | None = None  # its place among the comparison's columns (None: not a column)
    evidence: int | None = None  # its place in the report's evidence table (None: not evidence)
    label: str | None = None     # its label there ({} after a family's prefix: what varies; {lo}, {hi}: core counts)
    shown: str = ""            # the unit the evidence table writes it in
    digits: int | None = None  # digits the evidence table writes (None: the unit's default)

    @property
    def family(self) -> bool:
        return "{" in self.key

    @property
    def stem(self) -> str:
        """The key up to its first placeholder (a family's prefix)."""
        return self.key.split("{", 1)[0]

    @property
    def fixed(self) -> int:
        """Characters of the key outside its placeholders: the more, the more specific a family."""
        return len(_PLACEHOLDER.sub("", self.key))

    def pattern(self) -> re.Pattern[str]:
        return _pattern(self.key)

    def matches(self, key: str) -> bool:
        return key == self.key if not self.family else bool(self.pattern().match(key))


M, P, T = Kind.METRIC, Kind.PARAM, Kind.TAG
MED, SUM, NO = Agg.MEDIAN, Agg.SUM, Agg.NONE
_CLIENT = "workloads.metrics"
_SERVER = "orchestrator.node.telemetry"
_SUMMARY = "orchestrator.observe.summary"
_ATTR = "orchestrator.node.attribution"
_STACKS = "orchestrator.node.stack_categories"
_OUTBOX = "orchestrator.observe.outbox"
_EXEC = "orchestrator.control.ray_executor"
_MEASURE = "orchestrator.control.measure"
_HOST = "orchestrator.node.hostfacts"
_REPLICA = "orchestrator.node.replica"
_ACTOR = "orchestrator.node.replica_actor"
_STARTUP = "orchestrator.node.startup"
_WINDOW = "orchestrator.node.window_figures"
_GPU_PROFILE = "orchestrator.node.gpu_profile"
_SERVE = "orchestrator.node.serve_replica"
_ANALYSIS = "orchestrator.observe.analysis.stage"
_REPORT = "orchestrator.observe.report.comparison"


def _pct(stem: str, qs: Iterable[int], meaning: str, *, producer: str = _CLIENT, when: str = "always",
         first: int | None = None, labels: Mapping[int, str] | None = None) -> list[Figure]:
    out = []
    for i, q in enumerate(qs):
        out.append(Figure(f"{stem}_p{q}_s", M, "s", f"{meaning}, p{q} over the window's requests", producer, MED, when,
                          built=True, column=None if first is None else first + i,
                          evidence=0 if q in (labels or {}) else None, label=(labels or {}).get(q), shown="ms"))
    return out


FIGURES: tuple[Figure, ...] = (
    # -- the client: workloads.metrics.summarize over the window's request records ----------------------------
    Figure("requests", M, "count", "requests sent in the window", _CLIENT, SUM, column=5),
    Figure("ok", M, "count", "requests that completed", _CLIENT, SUM),
    Figure("timeouts", M, "count", "requests that timed out", _CLIENT, SUM, column=6),
    Figure("errors", M, "count", "requests that failed otherwise", _CLIENT, SUM),
    Figure("cut", M, "count", "requests still running when the window closed", _CLIENT, SUM),
    Figure("timeout_rate", M, "1", "timeouts / requests", _CLIENT, column=15, evidence=5, label="requests timed out", shown="%"),
    Figure("ttft_mean_s", M, "s", "time to first token, mean over the window's requests", _CLIENT, built=True),
    *_pct("ttft", (50, 90, 99), "time to first token", first=7, labels={50: "TTFT p50"}),
    Figure("e2e_p50_s", M, "s", "request latency (send to last token), p50", _CLIENT, MED, built=True, column=10),
    *_pct("e2e", (90, 99), "request latency (send to last token)"),
    *_pct("itl", (50, 90, 99), "inter-token latency"),
    *_pct("tpot", (50, 90), "time per output token after the first"),
    *_pct("dispatch_lag", (50, 99), "client lag between a request's scheduled and actual send"),
    *_pct("tokenize", (50,), "client-side tokenization of a request's text", when="client tokenize"),
    Figure("prompt_tokens_mean", M, "tokens", "prompt tokens a request (server's count)", _CLIENT),
    Figure("prompt_tokens_total", M, "tokens", "prompt tokens of the window", _CLIENT),
    Figure("completion_tokens_total", M, "tokens", "completion tokens of the window", _CLIENT),
    Figure("cached_tokens_total", M, "tokens", "prompt tokens the server served from its prefix cache", _CLIENT),
    Figure("prefix_hit_rate", M, "1", "cached / prompt tokens, as the server reported per request", _CLIENT,
           column=16),
    Figure("client_tokenize_ms_per_1k", M, "ms", "what the sent text cost to tokenize on one client core, per 1k "
           "tokens", _CLIENT, column=24),
    Figure("window_first_cached_tokens", M, "tokens", "cached tokens of the window's first request (0: the window "
           "started from an empty prefix cache)", _CLIENT),
    Figure("prompt_tokens_vs_recorded_ratio_mean", M, "x", "prompt tokens sent / the recorded session's, mean",
           _CLIENT, when="recorded workload"),
    Figure("duration_s", M, "s", "first send to last completion", _CLIENT),
    Figure("request_throughput_rps", M, "req/s", "completed requests per second", _CLIENT, column=23),
    Figure("output_throughput_tps", M, "tok/s", "completion tokens per second", _CLIENT),
    Figure("goodput_rps", M, "req/s", "completed requests within every SLO per second", _CLIENT, when="slo",
           column=31),
    # -- the trial's own summary (orchestrator.observe.summary) ------------------------------------------------
    Figure("slo_ttft_s", M, "s", "the sweep's TTFT SLO", _SUMMARY, when="slo"),
    Figure("slo_tpot_s", M, "s", "the sweep's TPOT SLO", _SUMMARY, when="slo"),
    Figure("client_in_flight_mean", M, "count", "requests the client had outstanding, mean (Little's law)", _SUMMARY,
           column=30, evidence=16, label="requests in flight (mean, at the most cores)", digits=1),
    Figure("client_cpu_s", M, "CPU-s", "the client's CPU time in the window", _SUMMARY),
    Figure("window_s", M, "s", "the workload run's wall time", _SUMMARY),
    Figure("{series}_mean", M, "series", "mean of a sampled series over the requests' span (replica_cpu_util, "
           "client_cpu_util, cpu<N>_util, gpu<N>_util, gpu<N>_mem_gib, gpu<N>_sm_clock_mhz, gpu<N>_power_w, "
           "gpu<N>_clock_slowdown, server_<gauge>)", _SUMMARY, built=True),
    Figure("{series}_max", M, "series", "max of a sampled series over the requests' span", _SUMMARY, built=True),
    Figure("ts/{series}", M, "series", "a sampled series, step = ms since the sampler started",
           "orchestrator.observe.tracking", NO),
    Figure("replica_cpu_util_mean", M, "%", "replica cores busy, mean over the span", _SUMMARY, built=True,
           column=20, evidence=6, label="replica CPU busy", shown="%"),
    Figure("client_cpu_util_mean", M, "%", "client cores busy, mean over the span", _SUMMARY, built=True, column=21),
    Figure("gpu0_util_mean", M, "%", "GPU 0 busy (NVML), mean over the span", _SUMMARY, when="gpu", built=True,
           column=22),
    Figure("gpu{n}_sm_clock_mhz_mean", M, "MHz", "a GPU's SM clock (NVML), mean over the span", _SUMMARY,
           when="gpu", built=True),
    Figure("gpu{n}_power_w_mean", M, "W", "a GPU's power draw (NVML), mean over the span", _SUMMARY, when="gpu",
           built=True),
    Figure("gpu{n}_clock_slowdown_mean", M, "1", "share of samples whose clocks a power cap, a thermal limit or a "
           "hardware slowdown held down (NVML clock-event reasons)", _SUMMARY, when="gpu", built=True),
    Figure("server_num_requests_running_mean", M, "count", "vllm:num_requests_running, mean over the span",
           _SUMMARY, when="a /metrics scrape in the span", built=True, column=29, evidence=15, label="requests running in the engine (mean, at the most cores)",
           digits=1),
    Figure("crosscheck_ttft_p50_ratio", M, "x", "harness / bare client TTFT p50, same workload and start state",
           "workloads.bare", when="crosscheck", built=True, column=25),
    Figure("crosscheck_ttft_p90_ratio", M, "x", "harness / bare client TTFT p90", "workloads.bare",
           when="crosscheck", built=True, column=26),
    Figure("crosscheck_ttft_p50_harness_s", M, "s", "the harness's TTFT p50 in the cross-check", _SUMMARY,
           when="crosscheck", built=True),
    Figure("crosscheck_ttft_p50_bare_s", M, "s", "the bare client's TTFT p50", _SUMMARY, when="crosscheck", built=True),
    Figure("crosscheck_ttft_p90_harness_s", M, "s", "the harness's TTFT p90 in the cross-check", _SUMMARY,
           when="crosscheck", built=True),
    Figure("crosscheck_ttft_p90_bare_s", M, "s", "the bare client's TTFT p90", _SUMMARY, when="crosscheck", built=True),
    Figure("crosscheck_harness_count", M, "count", "harness requests in the cross-check", _SUMMARY,
           when="crosscheck", built=True),
    Figure("crosscheck_bare_count", M, "count", "bare-client requests in the cross-check", _SUMMARY,
           when="crosscheck", built=True),
    Figure("crosscheck_vllm_bench_ttft_p{q}_ratio", M, "x", "harness / `vllm bench serve` TTFT p50 or p90",
           _SUMMARY, when="vllm-bench", built=True),
    Figure("crosscheck_vllm_bench_ttft_p{q}_s", M, "s", "`vllm bench serve`'s TTFT p50 or p90", _SUMMARY,
           when="vllm-bench", built=True),
    Figure("crosscheck_vllm_bench_count", M, "count", "`vllm bench serve`'s requests", _SUMMARY, when="vllm-bench",
           built=True),
    Figure("crosscheck_bare_foreign_frac", M, "1", "other work's share of the replica's cores during the bare run",
           _SUMMARY, when="crosscheck"),
    Figure("crosscheck_foreign_gap", M, "1", "|harness - bare| in that share", _SUMMARY, when="crosscheck"),
    Figure("crosscheck_comparable", M, "1", "1 when both runs saw the same quiet neighbours", _SUMMARY,
           when="crosscheck", column=27),
    Figure("ideal_prefix_hit_rate", M, "1", "the prefix-cache hit rate an unbounded cache would get on what was "
           "sent", "workloads.cachesim", when="fidelity", column=17),
    Figure("ideal_prefix_hit_rate_after_prefill", M, "1", "the same, a block counting only once its prefill ended",
           "workloads.cachesim", when="fidelity"),
    Figure("prefix_hit_gap_concurrency", M, "1", "hit rate lost to requests in flight together",
           "workloads.cachesim", when="fidelity"),
    Figure("prefix_hit_gap_eviction", M, "1", "hit rate lost to eviction", "workloads.cachesim", when="fidelity"),
    # -- vLLM's /metrics over the window (orchestrator.node.telemetry.server_deltas) ----------------------------
    Figure("server_{phase}_count", M, "count", "requests vLLM's histogram of the phase (ttft, queue, prefill, "
           "decode, itl, e2e) counted in the window", _SERVER, built=True),
    Figure("server_{phase}_s_mean", M, "s", "the phase's mean by vLLM's histogram", _SERVER, built=True),
    Figure("server_{phase}_s_p{q}", M, "s", "the phase's p50/p90 from vLLM's buckets (as fine as they are)", _SERVER,
           built=True),
    Figure("server_ttft_s_mean", M, "s", "vLLM's TTFT, mean", _SERVER, built=True, column=18,
           evidence=1, label="server TTFT (mean)", shown="ms"),
    Figure("server_frontend_s_mean", M, "s", "server TTFT less queue and prefill: tokenization, request handling, "
           "IPC", _SERVER, column=19, evidence=2, label="of which frontend: tokenization and request handling", shown="ms"),
    *(Figure(f"server_{k}", M, "count", f"{m}: the delta of vLLM's counter over the window", _SERVER, built=True,
             when="kv-cache-metrics" if k == "kv_evicted_blocks_sampled" else "always")
      for k, m in (("prompt_tokens", "prompt tokens"), ("generation_tokens", "generated tokens"),
                   ("prefix_cache_hits", "prefix-cache hits (tokens)"), ("prefix_cache_queries", "prefix-cache "
                    "queries (tokens)"), ("preemptions", "preempted requests"), ("kv_evicted_blocks_sampled",
                    "evicted KV blocks, sampled (--kv-cache-metrics)"))),
    Figure("server_prefix_hit_rate", M, "1", "prefix-cache hits / queries, by vLLM's counters", _SERVER),
    Figure("server_prompt_tokens_per_s", M, "tok/s", "prompt tokens per second of the span", _SERVER, built=True),
    Figure("server_generation_tokens_per_s", M, "tok/s", "generated tokens per second of the span", _SERVER,
           built=True),
    # -- the window's span (orchestrator.node.window_figures) -----------------------------------------------------
    Figure("window_span_s", M, "s", "the requests' span: first send to last completion", _WINDOW),
    Figure("window_drain_s", M, "s", "how long the span ran past the window's end", _WINDOW),
    Figure("telemetry_outside_span_s", M, "s", "sampled time left out of the span's figures", _WINDOW),
    Figure("window_span_start_unix", M, "unix-s", "the span's start", _WINDOW),
    Figure("window_span_end_unix", M, "unix-s", "the span's end", _WINDOW),
    Figure("accounting_s", M, "s", "the span the CPU accounting covered", _WINDOW),
    # -- CPU accounting on the replica's cores (orchestrator.node.accounting) ------------------------------------
    Figure("replica_cores_busy_s", M, "CPU-s", "busy time of the replica's cores", "orchestrator.node.accounting"),
    Figure("replica_tree_cpu_s", M, "CPU-s", "the replica's process tree's CPU time", "orchestrator.node.accounting"),
    Figure("replica_cores_foreign_cpu_s", M, "CPU-s", "CPU time something else used on the replica's cores",
           "orchestrator.node.accounting"),
    Figure("replica_cores_foreign_frac", M, "1", "that time's share of the cores", "orchestrator.node.accounting",
           column=28),
    Figure("cgroup_periods", M, "count", "CFS periods of the replica's group in the span",
           "orchestrator.node.restrict", when="quota"),
    Figure("cgroup_throttled_periods", M, "count", "periods in which it was throttled", "orchestrator.node.restrict",
           when="quota"),
    Figure("cgroup_throttled_frac", M, "1", "throttled / all periods", "orchestrator.node.restrict", when="quota"),
    Figure("cgroup_throttled_s", M, "s", "throttled time, summed over CPUs", "orchestrator.node.restrict",
           when="quota"),
    # -- per process role (orchestrator.node.attribution): api_server, engine_core, gpu_worker, other ----------
    Figure("cpu_s_{role}", M, "CPU-s", "the role's CPU time in the span", _ATTR),
    Figure("cpu_user_s_{role}", M, "CPU-s", "the role's user CPU time", _ATTR),
    Figure("cpu_sys_s_{role}", M, "CPU-s", "the role's system CPU time", _ATTR),
    Figure("ctx_vol_{role}", M, "count", "voluntary context switches", _ATTR),
    Figure("ctx_invol_{role}", M, "count", "involuntary context switches (preempted)", _ATTR),
    Figure("runq_wait_s_{role}", M, "s", "time the role's threads waited for a core (schedstat)", _ATTR,
           when="schedstat", evidence=11, label="waiting for a core: {}", shown="s per window", digits=2),
    Figure("{role}_processes", M, "count", "the role's processes", _ATTR),
    Figure("{role}_threads", M, "count", "the role's threads", _ATTR),
    Figure("cpu_s_per_req_{role}", M, "CPU-s", "the role's CPU time per request (a stack category after a dot)",
           _ATTR, evidence=10, label="CPU time per request: {}", shown="ms", digits=1),
    Figure("replica_roles_cpu_s", M, "CPU-s", "CPU time of every role", _ATTR),
    Figure("replica_exited_processes", M, "count", "processes of the tree that ended in the span", _ATTR),
    Figure("replica_exited_cpu_s", M, "CPU-s", "their CPU time in the span", _ATTR),
    # -- sampled stacks (orchestrator.node.stacks, .stack_categories) ---------------------------------------------
    Figure("stacks_cpu_s_{role}", M, "CPU-s", "CPU time the role's sampled stacks account for (per category after "
           "a dot)", _STACKS, when="stacks"),
    Figure("stacks_active_s_{role}", M, "s", "time a category was on the role's stacks", _STACKS, when="stacks"),
    Figure("stacks_idle_cpu_s_{role}", M, "CPU-s", "sampled time in idle waits", _STACKS, when="stacks"),
    Figure("stacks_coverage_{role}", M, "1", "stacks' CPU time / the role's measured CPU time",
           "orchestrator.node.stacks", when="stacks"),
    Figure("stacks_samples", M, "count", "stack samples taken", "orchestrator.node.stacks", when="stacks"),
    Figure("stacks_errors", M, "count", "failed stack samples", "orchestrator.node.stacks", when="stacks"),
    # -- the GPU profile (orchestrator.node.gpu_profile) ---------------------------------------------------------
    Figure("gpu_profile_busy_frac", M, "1", "union of kernel and copy intervals / span", _GPU_PROFILE,
           when="gpu profile", evidence=8, label="GPU busy (profiler)", shown="%"),
    Figure("gpu_profile_busy_frac_min", M, "1", "the least busy device's share", _GPU_PROFILE, when="gpu profile"),
    Figure("gpu_profile_gap_us_p{q}", M, "µs", "idle gaps between busy stretches", _GPU_PROFILE, when="gpu profile",
           built=True),
    Figure("gpu_profile_gap_us_p99", M, "µs", "idle gaps between busy stretches, p99", _GPU_PROFILE,
           when="gpu profile", built=True, evidence=9, label="GPU kernel gaps p99", shown="µs", digits=0),
    Figure("gpu_profile_launch_us_p{q}", M, "µs", "host-side launch latency", _GPU_PROFILE, when="gpu profile",
           built=True),
    Figure("gpu_profile_kernels", M, "count", "kernels in the capture", _GPU_PROFILE, when="gpu profile"),
    Figure("gpu_profile_steps", M, "count", "engine steps in the capture", _GPU_PROFILE, when="gpu profile"),
    Figure("gpu_profile_span_ms", M, "ms", "the capture's span", _GPU_PROFILE, when="gpu profile"),
    Figure("gpu_profile_bytes", M, "B", "the trace files' size", _GPU_PROFILE, when="gpu profile"),
    Figure("gpu_profile_files", M, "count", "trace files", _GPU_PROFILE, when="gpu profile"),
    Figure("gpu_profile_{step}_s", M, "s", "the capture's start-to-stop, stop and wall times", _GPU_PROFILE,
           when="gpu profile", built=True),
    # -- the replica's start (orchestrator.node.startup) ----------------------------------------------------------
    Figure("startup_s", M, "s", "start to healthy", _STARTUP, column=32),
    Figure("startup_{phase}_s", M, "s", "a start phase by the vLLM log (imports, engine_spawn, workers, weights, "
           "compile, graph_capture, engine_init, api)", _STARTUP, built=True),
    Figure("startup_other_s", M, "s", "the start less the phases found", _STARTUP),
    Figure("repin_s", M, "s", "how long re-pinning a live replica took", _MEASURE, when="repin"),
    # -- what the tracker adds (orchestrator.observe.outbox) ------------------------------------------------------
    Figure("num_records", M, "count", "request records of the trial", _OUTBOX),
    Figure("trial_duration_s", M, "s", "the trial's start to end", _OUTBOX),
    # -- params: the factors, the resolved settings, what the trial learnt ----------------------------------------
    *(Figure(k, P, "", m, "orchestrator.values.trial", NO, type=str) for k, m in (
        ("model", "the model"), ("hardware", "the node type"), ("gpus", "GPUs per replica"),
        ("cores", "cores per replica"), ("restriction", "how the cores are enforced (cpuset, affinity, quota)"),
        ("start", "fresh, repin or sized"), ("vllm_variant", "the vLLM flag variant"),
        ("api_servers", "API server processes"), ("stack", "vllm or ray-serve"), ("workload", "the workload"),
        ("text_style", "the text the workload sends"), ("repeat", "the repeat index"))),
    *(Figure(k, P, "", m, _OUTBOX, NO, type=str) for k, m in (
        ("tp", "tensor-parallel size"), ("model_kind", "shape or hub"), ("model_source", "the shape or hub id"),
        ("load_format", "vLLM's --load-format"), ("max_model_len", "vLLM's --max-model-len"),
        ("block_size", "the KV block size"), ("prefix_caching", "prefix caching on"),
        ("vllm_args", "the variant's extra flags"), ("vllm_env", "the variant's environment"),
        ("client_cores", "cores for the client"), ("client_isolation", "how the client is kept off the replica"),
        ("workload_kind", "the workload's kind"))),
    Figure("protocol_{setting}", P, "", "the measurement protocol's settings", _OUTBOX, NO, type=str, built=True),
    Figure("telemetry_{setting}", P, "", "the telemetry settings", _OUTBOX, NO, type=str, built=True),
    Figure("workload_{setting}", P, "", "the workload's settings", _OUTBOX, NO, type=str, built=True),
    Figure("{param}_actual", P, "", "a learnt value that differs from the factor of the same name", _OUTBOX, NO,
           when="fallback", type=str),
    Figure("{key}_error", P, "", "why a Ray Serve start step failed", "orchestrator.node.serve_host", NO,
           when="serve", type=str),
    *(Figure(k, P, "", m, _HOST, NO, type=str) for k, m in (
        ("cpu_model", "the CPU model"), ("smt", "SMT on or off"), ("replica_physical_cores", "physical cores of the "
         "replica's CPUs"), ("replica_numa_nodes", "NUMA nodes of the replica's cores"),
        ("client_numa_nodes", "NUMA nodes of the client's cores"), ("gpu_numa_nodes", "NUMA nodes of the GPUs"),
        ("cpu_governor", "the CPU frequency governor"))),
    *(Figure(k, P, "", m, _REPLICA, NO, type=str) for k, m in (
        ("replica_cpus", "the verified cores of the replica"), ("restriction_requested", "the restriction asked for"),
        ("restriction_mode", "the restriction that ran"), ("restriction_fallback", "why it differs (empty: it does "
         "not)"), ("server_env", "the server's thread environment"), ("server_stack", "what served"),
        ("port", "the server's port"), ("vllm_command", "the server's command line"),
        ("vllm_version", "vLLM's version"))),
    Figure("server_script", P, "", "a stand-in server that ran instead of vLLM (benchmarks only)", _REPLICA, NO,
           when="stand-in", type=str),
    *(Figure(k, P, "", m, _ACTOR, NO, type=str) for k, m in (
        ("gpu_ids", "the GPUs"), ("gpu_name", "the GPU model"), ("hostname", "the node's host name"),
        ("node_id", "the Ray node"), ("platform", "the node's OS"), ("telemetry_cpus", "the sampler's cores"),
        ("repinned", "the re-pin's cores"))),
    Figure("prefix_cache_reset", P, "", "the prefix cache emptied before the window: True, False (failed) or off",
           _ACTOR, NO, type=PrefixCacheReset),
    Figure("gpu_profile_status", P, "", "how the GPU capture went", _ACTOR, NO, when="gpu profile", type=str),
    Figure("gpu_profile_in", P, "", "which window the GPU capture ran in", _ACTOR, NO, when="gpu profile", type=str),
    Figure("sized_start_cpus", P, "", "the cores a sized start began on", _ACTOR, NO, when="sized", type=str),
    *(Figure(k, P, "", m, _EXEC, NO, type=str) for k, m in (
        ("client_cpus", "the client's cores"), ("client_isolated", "the client is off the replica's cores"),
        ("neighbours", "other trials on the node"), ("window_on_start", "this window's index on its start"),
        ("placement", "exclusive or packed"), ("node_wait_s", "seconds waiting for a node"),
        ("pg_ready_s", "seconds until the placement group was ready"),
        ("replica_actor_s", "seconds until the replica actor answered"))),
    Figure("start_shared_with", P, "", "the trials of one shared start", _EXEC, NO, when="shared start", type=str),
    Figure("crosscheck_why", P, "", "why the references ran (crosscheck: auto)", _EXEC, NO, when="crosscheck auto",
           type=str),
    Figure("crosscheck_order", P, "", "the order of harness and references", _MEASURE, NO, when="crosscheck",
           type=str),
    Figure("replay_fidelity", P, "", "a one-line diagnosis of the replay's prefix reuse", _MEASURE, NO,
           when="fidelity", type=str),
    Figure("warmup_s", P, "", "the unmeasured warm-up's length", _MEASURE, NO, type=str),
    Figure("server_died_in", P, "", "the step that found the server dead", _MEASURE, NO, when="server died",
           type=str),
    *(Figure(k, P, "", m, _STARTUP, NO, type=str) for k, m in (
        ("startup_s", "start to healthy, as the replica measured it"), ("startup_sources", "where each start phase "
         "was read"), ("startup_weights", "dummy or real weights"), ("compile_cache", "the compile cache's state"),
        ("compile_cache_entries", "entries in it before the start"), ("compile_cache_load", "whether the start "
         "loaded it"), ("model_page_cache", "the weights in the page cache before the start"))),
    Figure("runq_wait_status", P, "", "whether schedstat was readable", _ATTR, NO, type=str),
    *(Figure(k, P, "", m, "orchestrator.node.stacks", NO, when="stacks", type=str) for k, m in (
        ("stacks_status", "how the stack sampler went"), ("stacks_rate_hz", "its rate"),
        ("stacks_cpu_basis", "what a sample's CPU time is read from"))),
    *(Figure(k, P, "", m, "orchestrator.control.search", NO, when="search", type=str, built=True) for k, m in (
        ("search_reason", "why the knee search ran this trial"), ("search_step", "its step in the search"),
        ("search_grid_cores", "the search's grid"))),
    *(Figure(k, P, "", m, _SERVE, NO, when="serve", type=str) for k, m in (
        ("serve_deployment", "the Serve deployment"), ("serve_frontend", "the Serve frontend"),
        ("serve_frontend_cpus", "the frontend's cores"), ("serve_llm_config", "the LLM config"),
        ("serve_command", "the serving command"), ("serve_version", "Ray Serve's version"),
        ("serve_pids", "the serving processes"), ("ray_version", "Ray's version"))),
    # -- tags -----------------------------------------------------------------------------------------------------
    *(Figure(k, T, "", m, _OUTBOX, NO, type=str) for k, m in (
        ("sweep", "the sweep's name"), ("trial_id", "the trial"), ("orchestrator.kind", "trial"),
        ("trial_status", "COMPLETED or FAILED"), ("error_kind", "the failure's kind"))),
    Figure("error_message", T, "", "the failure's message", _OUTBOX, NO, when="failed", type=str),
    *(Figure(k, T, "", m, "mlflow", NO, type=str, when="always" if k == "mlflow.runName" else "a table logged")
      for k, m in (
        ("mlflow.runName", "the run's name (like `tiny-llama c2 agentic-short r0`)"),
        ("mlflow.loggedArtifacts", "MLflow's own list of logged tables"))),
    Figure("warnings", T, "", "the trial's warnings", _OUTBOX, NO, when="warnings", type=str),
    Figure("git_commit", T, "", "the checkout's commit", _OUTBOX, NO, when="git", type=str),
    *(Figure(k, T, "", m, "orchestrator.observe.tracking", NO, type=str) for k, m in (
        ("mlflow.parentRunId", "the sweep's run"), ("upload_id", "this upload (a retried sync finds it)"),
        ("superseded", "true once a later attempt replaced this run"), ("attempt", "the attempt's number"))),
    Figure("superseded_by", T, "", "the run that replaced this one", "orchestrator.observe.tracking", NO,
           when="superseded", type=str),
    # -- the sweep's parent run -----------------------------------------------------------------------------------
    *(Figure(k, Kind.SWEEP_PARAM, "", m, _OUTBOX, NO, type=str) for k, m in (
        ("trials_planned", "trials in the plan"), ("max_failures", "failures before the sweep stops"),
        ("repeats", "repeats (or the adaptive setting)"), ("models", "the models"), ("workloads", "the workloads"),
        ("cores", "the grid's cores"), ("gpus", "the grid's GPUs"), ("hardware", "the node types"),
        ("restriction", "the restriction modes"), ("start", "the start modes"), ("vllm_variants", "the variants"))),
    Figure("search", Kind.SWEEP_PARAM, "", "the knee search's settings", _OUTBOX, NO, when="search", type=str),
    *(Figure(k, Kind.SWEEP_TAG, "", m, _OUTBOX, NO, type=str) for k, m in (
        ("sweep", "the sweep's name"), ("orchestrator.kind", "sweep"))),
    Figure("mlflow.runName", Kind.SWEEP_TAG, "", "the sweep's name", "mlflow", NO, type=str),
    Figure("mlflow.loggedArtifacts", Kind.SWEEP_TAG, "", "MLflow's own list of logged tables", "mlflow", NO,
           when="a table logged", type=str),
    Figure("mlflow.source.git.commit", Kind.SWEEP_TAG, "", "the checkout's commit, where MLflow's UI shows it",
           _OUTBOX, NO, when="git", type=str),
    Figure("mlflow.note.content", Kind.SWEEP_TAG, "", "the sweep's description", _OUTBOX, NO, when="description",
           type=str),
    Figure("git_commit", Kind.SWEEP_TAG, "", "the checkout's commit", _OUTBOX, NO, when="git", type=str),
    Figure("resumes", Kind.SWEEP_TAG, "", "how many times the sweep was re-attached", "orchestrator.observe.tracking",
           NO, when="resumed", type=str),
    Figure("search_stop_reason", Kind.SWEEP_TAG, "", "why the knee search stopped", "orchestrator.sweep", NO,
           when="search", type=str),
    Figure("search_knee", Kind.SWEEP_TAG, "", "the knee search's answer", "orchestrator.sweep", NO, when="search",
           type=str),
    Figure("trials_finished", Kind.SWEEP_METRIC, "count", "trials whose latest run finished",
           "orchestrator.observe.tracking", NO),
    Figure("trials_failed", Kind.SWEEP_METRIC, "count", "trials whose latest run failed",
           "orchestrator.observe.tracking", NO),
    Figure("{unit}_held_s", Kind.SWEEP_METRIC, "s", "replica-held seconds (unit: gpu, or core for CPU-only "
           "replicas)", "orchestrator.observe.time_use", NO),
    Figure("{unit}_{phase}_s", Kind.SWEEP_METRIC, "s", "held seconds in a phase (starting, warmup, window, "
           "crosscheck, teardown, idle, idle_in_<step>)", "orchestrator.observe.time_use", NO, built=True),
    Figure("{unit}_between_leases_s", Kind.SWEEP_METRIC, "s", "seconds a node waited between leases",
           "orchestrator.observe.time_use", NO),
    Figure("{unit}_window_share", Kind.SWEEP_METRIC, "1", "share of held time inside windows",
           "orchestrator.observe.time_use", NO),
    Figure("{unit}_node_window_share", Kind.SWEEP_METRIC, "1", "the same, counting the time between leases",
           "orchestrator.observe.time_use", NO),
    # -- the report's own columns and the diagnosis's evidence ------------------------------------------------------
    Figure("cores", Kind.REPORT, "cores", "cores per replica", _REPORT, NO, column=1),
    Figure("repeats", Kind.REPORT, "count", "repeats of the configuration and core count", _REPORT, NO, column=2),
    Figure("trials", Kind.REPORT, "", "their trial ids", _REPORT, NO, type=str, column=3),
    Figure("status", Kind.REPORT, "", "COMPLETED, FAILED or '<ok>/<n> ok'", _REPORT, NO, type=str, column=4),
    Figure("p50_spread", Kind.REPORT, "1", "(max - min) / median of the repeats' TTFT p50", _REPORT, NO, column=11),
    Figure("spread_flag", Kind.REPORT, "", "'!' where the spread exceeds 10%", _REPORT, NO, type=str, column=12),
    Figure("speedup_p50", Kind.REPORT, "x", "TTFT p50 at the fewest cores / here", _REPORT, NO, column=13),
    Figure("knee", Kind.REPORT, "", "'<- knee' at the knee", _REPORT, NO, type=str, column=14),
    Figure("server_rest_s_mean", Kind.REPORT, "s", "server TTFT less its frontend part: queue and prefill",
           _ANALYSIS, NO, evidence=3, label="of which queue and prefill", shown="ms", built=True),
    Figure("frontend_share", Kind.REPORT, "1", "frontend / server TTFT", _ANALYSIS, NO,
           evidence=4, label="frontend share of server TTFT", shown="%", built=True),
    Figure("gpu_util_mean", Kind.REPORT, "%", "the busiest GPU's mean utilisation", _ANALYSIS, NO, evidence=7, label="GPU busy",
           shown="%"),
    Figure("knee_cores", Kind.REPORT, "cores", "the knee", _ANALYSIS, NO, evidence=12, label="knee", shown="cores", digits=0),
    Figure("ttft_growth", Kind.REPORT, "x", "TTFT p50 at the fewest cores / at the most", _ANALYSIS, NO,
           evidence=13, label="TTFT p50 at {lo} / at {hi}", shown="x", digits=2),
    Figure("ttft_p50_top_step", Kind.REPORT, "x", "TTFT p50 one step below the most cores / at the most", _ANALYSIS,
           NO, evidence=14, label="TTFT p50 at the core count below {hi} / at {hi}", shown="x", digits=2),
    Figure("running_share", Kind.REPORT, "1", "requests running in the engine / in flight", _ANALYSIS, NO,
           evidence=17, label="share of those in flight running in the engine", shown="%"),
    Figure("core_counts_failed", Kind.REPORT, "count", "core counts where every trial failed", _ANALYSIS, NO,
           evidence=18, label="core counts where every trial failed", digits=0),
    Figure("core_counts", Kind.REPORT, "count", "core counts tried", _ANALYSIS, NO, evidence=19, label="core counts tried",
           digits=0),
)


@cache
def _pattern(key: str) -> re.Pattern[str]:
    out, at = "^", 0
    for m in _PLACEHOLDER.finditer(key):
        out += re.escape(key[at:m.start()]) + DOMAINS.get(m.group(1), "(.+?)")
        at = m.end()
    return re.compile(out + re.escape(key[at:]) + "$")


@cache
def _exact() -> dict[tuple[Kind, str], Figure]:
    return {(f.kind, f.key): f for f in FIGURES if not f.family}


def find(key: str, kind: Kind = Kind.METRIC) -> Figure | None:
    """The declaration of ``key`` as a ``kind``: its exact figure, else the family with the longest fixed prefix that
    matches it; None when it is not declared."""
    exact = _exact().get((kind, key))
    if exact is not None:
        return exact
    families = [f for f in FIGURES if f.kind is kind and f.family and f.matches(key)]
    return max(families, key=lambda f: f.fixed, default=None)


def undeclared(keys: Iterable[str], kind: Kind = Kind.METRIC) -> list[str]:
    """The keys that no figure of ``kind`` declares, sorted."""
    return sorted(k for k in set(keys) if find(k, kind) is None)


def of_kind(*kinds: Kind) -> Iterator[Figure]:
    return (f for f in FIGURES if f.kind in kinds)


def columns() -> list[str]:
    """The comparison's figure columns after the configuration, in order (``column``)."""
    placed = sorted((f for f in FIGURES if f.column is not None), key=lambda f: f.column or 0)
    return [f.key for f in placed]


def aggregated(agg: Agg) -> list[str]:
    """The comparison columns that repeats aggregate by ``agg``, in column order."""
    by_key = {f.key: f for f in FIGURES if f.column is not None}
    return [k for k in columns() if by_key[k].agg is agg]


def evidence() -> list[Figure]:
    """The figures the report's evidence table knows, in its order (a family: its prefix, the role after it)."""
    return sorted((f for f in FIGURES if f.evidence is not None), key=lambda f: f.evidence or 0)


def markdown(kinds: Iterable[Kind] = (Kind.METRIC, Kind.PARAM, Kind.TAG, Kind.SWEEP_METRIC, Kind.SWEEP_PARAM,
                                      Kind.SWEEP_TAG)) -> str:
    """The catalogue as the Markdown tables of ``mlflow/README.md`` (one per kind)."""
    out: list[str] = []
    for kind in kinds:
        rows = sorted(of_kind(kind), key=lambda f: f.key)
        out += [f"#### {kind.value.capitalize()}s", "", "| Key | Unit | When | In the comparison | Meaning | Written by |",
                "|---|---|---|---|---|---|"]
        for f in rows:
            unit = f.unit or "text"
            compared = f"{f.agg.value} of repeats" if f.column is not None and f.agg is not Agg.NONE else ""
            out.append(f"| `{f.key}` | {unit} | {f.when} | {compared} | {f.meaning.replace('|', '/')} | "
                       f"`{f.producer}` |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


README_BEGIN = "<!-- figures: generated by `python -m orchestrator.values.figures`; do not edit by hand -->"
README_END = "<!-- end of figures -->"


def readme_section(text: str) -> str | None:
    """The generated part of ``mlflow/README.md`` (between the markers), or None without them."""
    if README_BEGIN not in text or README_END not in text:
        return None
    return text.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip("\n") + "\n"


def with_section(text: str) -> str:
    """``text`` with its generated part replaced by :func:`markdown`."""
    head, rest = text.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]
    return f"{head}{README_BEGIN}\n\n{markdown()}\n{README_END}{tail}"


if __name__ == "__main__":  # regenerate mlflow/README.md's list
    import sys
    from pathlib import Path

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "mlflow/README.md")
    path.write_text(with_section(path.read_text()))
    print(f"{path}: {len(FIGURES)} figures")


__all__ = ["FIGURES", "README_BEGIN", "README_END", "Agg", "Figure", "Kind", "PrefixCacheReset", "aggregated",
           "columns", "evidence", "find", "markdown", "of_kind", "readme_section", "undeclared", "with_section"]
