"""The sweep's typed values: the YAML a user writes, as strict pydantic models (``SweepSpec`` and its parts).

A sweep names *factors* (cores, GPUs, model, hardware, workload, vLLM flag
variants, restriction mode, start mode) and how often to repeat each
combination. These models are the ground floor every stage imports: validators
do no I/O, and reading a file into a ``SweepSpec`` (with errors that name the
file, line and field) is :mod:`orchestrator.plan.load`'s job. Infrastructure
settings (Ray address, MLflow URI) come from the environment, never from a sweep.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.values.shapes import SHAPES
from workloads.spec import WorkloadSpec

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """'16GiB', '800 MB', '1.5g', '4096' -> bytes (pure). Binary units are powers of 1024, decimal of 1000."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 16GiB, 800MB, 4096)")
    return int(float(m.group(1)) * _UNITS[unit])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_NAME = r"^[A-Za-z0-9_.-]+$"


class ShapeModel(_Strict):
    """A config-only model shape (built-in name) served with dummy weights and a real tokenizer."""

    kind: Literal["shape"] = "shape"
    name: str = Field(min_length=1, max_length=64, pattern=_NAME, description="Short name for tables.")
    shape: str = Field(description="Built-in shape, see `orchestrator model list`.")

    @field_validator("shape")
    @classmethod
    def _known_shape(cls, v: str) -> str:
        # Checked here, not when the node builds the folder: an unknown name would otherwise
        # surface only after Ray, MLflow and a placement group had started.
        if v not in SHAPES:
            raise ValueError(f"unknown model shape {v!r}; known: {', '.join(sorted(SHAPES))}")
        return v


class HubModel(_Strict):
    """A model by Hugging Face id or local path (needs weights or a hub unless load_format is dummy)."""

    kind: Literal["hf"] = "hf"
    name: str = Field(min_length=1, max_length=64, pattern=_NAME, description="Short name for tables.")
    id: str = Field(min_length=1, description="HF model id or a local model folder.")


def _model_kind(v: Any) -> str:
    if isinstance(v, dict):
        return cast(str, v.get("kind", "shape" if "shape" in v else "hf"))
    return cast(str, getattr(v, "kind", "hf"))


ModelSpec = Annotated[Annotated[ShapeModel, Tag("shape")] | Annotated[HubModel, Tag("hf")],
                      Discriminator(_model_kind)]


class VllmVariant(_Strict):
    """One named set of vLLM flags; flags pass through to `vllm serve` untouched."""

    name: str = Field(min_length=1, max_length=64, pattern=_NAME, description="Variant name for tables.")
    args: tuple[str, ...] = Field(default=(), description="Extra command-line flags, e.g. ['--enforce-eager'].")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server.")


class ServerSpec(_Strict):
    """Settings shared by every replica of the sweep."""

    stack: Literal["vllm", "ray-serve"] = Field(
        default="vllm",
        description="Serving stack. vllm: `vllm serve`. ray-serve: a Ray Serve LLM app (OpenAI ingress and LLMServer "
                    "deployments, orchestrator.node.serve_replica) on a Ray instance of its own on the trial's node, "
                    "under the same restriction.")
    serve_frontend: Literal["inside", "outside"] = Field(
        default="inside",
        description="ray-serve only: where Serve's controller, HTTP proxy and ingress replica (and that Ray's own "
                    "processes) run. inside: on the trial's cores, as when they share the node in production; "
                    "outside: on the node's other cores, so that the trial's cores serve only the LLMServer "
                    "replica and vLLM. Part of a trial's identity only when set to outside.")
    load_format: Literal["auto", "dummy"] = Field(default="dummy", description="dummy = random weights of the real shape.")
    max_model_len: int = Field(default=4096, ge=64, le=2_000_000, description="--max-model-len.")
    block_size: int | None = Field(default=None, description="--block-size; vLLM-CPU needs 32 or 128 (16 fails).")
    startup_timeout_s: float = Field(default=600.0, gt=0, le=7200, description="Deadline for /health to answer.")
    cpu_kvcache_gib: int = Field(default=1, ge=1, le=1024, description="VLLM_CPU_KVCACHE_SPACE on CPU nodes.")
    enable_prefix_caching: bool = Field(default=True, description="Prefix caching (agentic reuse depends on it).")
    kv_cache_bytes: int | None = Field(
        default=None, ge=1 << 20,
        description="The KV cache's size in bytes (or '16GiB', '800MB'), vLLM's --kv-cache-memory-bytes. "
                    "On a GPU the start then skips vLLM's memory measurement (the profiling forward pass still "
                    "runs, it compiles the model), and every trial gets the same cache whatever else the GPU "
                    "holds; unset, vLLM sizes it from --gpu-memory-utilization. On CPU nodes it replaces "
                    "cpu_kvcache_gib (whole GiB): vLLM-CPU zeroes its whole cache at start, 8-9 s of one core "
                    "for 1 GiB of the tiny shape and 0.5 s for 64 MiB (measured on CPU). Part of a trial's "
                    "identity when set.")
    cudagraph_sizes: Literal["match-load"] | tuple[Annotated[int, Field(ge=1, le=65536)], ...] | None = Field(
        default=None,
        description="GPU only: the batch sizes (tokens per step) vLLM captures CUDA graphs for, its "
                    "--cudagraph-capture-sizes. match-load: 1, 2, 4, 8, ... up to the largest number of requests "
                    "the sweep's workloads keep in flight (their concurrency), so the start captures only the "
                    "decode batches the load can make; larger steps run without a graph, as they do past vLLM's "
                    "default largest size (512). Unset: vLLM's default set. Part of a trial's identity when set. "
                    "Measured on an H200 (8B, 16 sessions): 3-4 s less graph capture per start, but TTFT p50 "
                    "15% higher at 12 cores (with kv_cache_bytes also set, so the two were not separated; "
                    "likely the steps that mix prefill and decode losing their graphs); so compare it with a "
                    "fresh default start before trusting it (benchmarks/results/startup.md).")

    @field_validator("block_size")
    @classmethod
    def _block(cls, v: int | None) -> int | None:
        if v is not None and v not in (32, 64, 128, 256):
            raise ValueError("block_size must be one of 32, 64, 128, 256")
        return v

    @model_validator(mode="after")
    def _frontend_needs_serve(self) -> ServerSpec:
        if self.serve_frontend != "inside" and self.stack != "ray-serve":
            raise ValueError(f"serve_frontend: {self.serve_frontend} applies to stack: ray-serve only "
                             f"(stack is {self.stack})")
        return self

    @field_validator("kv_cache_bytes", mode="before")
    @classmethod
    def _bytes(cls, v: Any) -> Any:
        return parse_bytes(v) if isinstance(v, str) else v

    @field_validator("cudagraph_sizes")
    @classmethod
    def _sizes(cls, v: Any) -> Any:
        if isinstance(v, tuple):
            if not v:
                raise ValueError("give at least one size, or match-load, or leave it out")
            return tuple(sorted(set(v)))
        return v

    @model_serializer(mode="wrap")
    def _omit_default_frontend(self, handler: Any) -> dict[str, Any]:
        # Left out at their defaults, so that the trials of every sweep written before them keep their ids.
        out: dict[str, Any] = handler(self)
        if self.serve_frontend == "inside":
            out.pop("serve_frontend", None)
        for name in ("kv_cache_bytes", "cudagraph_sizes"):
            if getattr(self, name) is None:
                out.pop(name, None)
        return out


# The restriction modes, listed once: orchestrator.node.restrict has one class per name (restrict.MODES)
RestrictionMode = Literal["cpuset", "affinity", "quota"]
StartMode = Literal["fresh", "repin", "sized"]


class ProtocolSpec(_Strict):
    """How every measurement window starts and in what order trials run: the controlled protocol.

    Why: windows run one after another on one server leave the replayed prefixes cached, so a
    later window serves a different mix; on one H200 that moved TTFT p50 between 144 and 418 ms
    at the same cores, as much as the cores did. With the prefix cache reset before each window,
    repeats agreed within 4% (DESIGN.md).
    """

    reset_prefix_cache: bool = Field(
        default=True,
        description="POST /reset_prefix_cache before every window (vLLM serves it with VLLM_SERVER_DEV_MODE=1, "
                    "which the replica then gets), so each window starts with an empty prefix cache.")
    warmup_s: float = Field(
        default=0.0, ge=0, le=3600,
        description="Unmeasured warm-up before the window: the same workload with another seed for this many "
                    "seconds, then the prefix-cache reset. 0 = none (the window starts right after start-up).")
    order: Literal["interleaved", "shuffled"] = Field(
        default="interleaved",
        description="Trial order. interleaved: repeat-major, so one repeat of every core count runs before the next "
                    "repeat; shuffled: a seeded random order of the fresh-start trials (repin groups stay together). "
                    "Never all repeats of one configuration in a row.")
    seed: int = Field(default=0, ge=0, description="Seed of the shuffled order.")
    share_start: bool = Field(
        default=False,
        description="Trials that differ only in workload or repeat run as consecutive windows on one replica "
                    "start (fresh, pinned to their cores), each from the prefix-cache reset, instead of a restart "
                    "per trial. Repeats then share a start and alternate with the other workloads.")
    crosscheck: bool | Literal["auto"] | tuple[Annotated[int, Field(ge=1, le=4096)], ...] = Field(
        default=False,
        description="After the window, reset the prefix cache again and replay the same workload with the bare "
                    "client (workloads.bare: one plain process, no Ray actor in the request path, no telemetry); "
                    "record the harness/bare TTFT ratios. true = every trial; a list = trials at those core counts; "
                    "auto = the first window of each configuration at its fewest and at its most cores, and again "
                    "at a core count only while its last reference disagreed by more than crosscheck_tolerance "
                    "(orchestrator.plan.references). Odd repeats run the bare client before the window instead, so "
                    "the order's effect is visible.")
    crosscheck_tolerance: float = Field(
        default=0.10, gt=0, le=10,
        description="crosscheck: auto runs the references again at a core count whose harness/bare TTFT p50 ratio "
                    "was off 1 by more than this.")
    crosscheck_clients: tuple[Literal["bare", "vllm-bench"], ...] = Field(
        default=("bare",), min_length=1,
        description="The reference clients of a cross-check, each from its own prefix-cache reset: 'bare' (the "
                    "bare client, always run) and 'vllm-bench' (vLLM's own `vllm bench serve`, replaying the prompts "
                    "the harness sent, turn-major, at the same concurrency and output lengths; a client nobody here "
                    "wrote). With both, the order rotates over repeats: harness-bare-bench, bare-harness-bench, "
                    "harness-bench-bare. Not part of trial_id: the harness window's place in the order is the same.")

    @field_validator("crosscheck_clients")
    @classmethod
    def _bare_always(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if "bare" not in v:
            raise ValueError("the bare client is always one of the references: list 'bare' too")
        return tuple(dict.fromkeys(v))

    def crosschecks(self, cores: int) -> bool:
        """Whether a trial at ``cores`` runs the references; under ``auto`` the executor decides, window by
        window (orchestrator.plan.references), and this is False."""
        return self.crosscheck is True or (isinstance(self.crosscheck, tuple) and cores in self.crosscheck)
    spread_warn: float = Field(default=0.10, gt=0, le=10,
                               description="Reports flag a configuration whose repeats' TTFT p50 spread "
                                           "((max - min) / median) exceeds this.")


class StacksSpec(_Strict):
    """Sampled Python stacks of the replica's processes (py-spy), named by category per process role."""

    enabled: bool = Field(default=False, description="Sample stacks during the window (costs TTFT: see "
                                                     "benchmarks/results/attribution.md).")
    rate_hz: float = Field(default=49.0, gt=0, le=1000, description="Samples per second of every thread.")
    native: bool = Field(default=False, description="Also C/C++ frames. py-spy then stops the replica at every "
                                                    "sample: for diagnosis, not for measured windows.")


class GpuProfileSpec(_Strict):
    """A short torch-profiler capture through vLLM's /start_profile and /stop_profile, reduced to the GPU's
    busy fraction, kernel gaps and launch latency (orchestrator.node.gpu_profile).

    vLLM writes the trace inside its engine loop at /stop_profile, which stalls every request for
    seconds (4-5 s on an H200), so the capture runs in the unmeasured warm-up when there is one
    (``protocol.warmup_s``), once per start; inside the window only on a GPU trial without a warm-up."""

    enabled: bool = Field(default=False, description="Capture once per start (GPU trials; a CPU-only trial captures "
                                                     "CPU ops only, and only in a warm-up).")
    seconds: float = Field(default=2.0, gt=0, le=60, description="Length of the capture.")


class TelemetrySpec(_Strict):
    """What is sampled during a window, and how often. Each costs something; benchmarks/overhead_bench.py measures it.

    Part of a trial's identity, since it changes what is measured; ``stacks`` and ``gpu_profile`` only when
    they differ from their defaults, so the trials of a sweep that leaves them out keep their ids."""

    host_hz: float = Field(default=10.0, ge=0, le=100,
                           description="Per-core CPU utilisation (psutil) samples per second; 0 = off.")
    metrics_hz: float = Field(default=1.0, ge=0, le=100,
                              description="Scrapes of vLLM's /metrics gauges per second (the API server's event loop "
                                          "serves each one); 0 = off. The before/after scrape is always taken.")
    gpu: bool = Field(default=True, description="GPU utilisation and memory through NVML, with the host samples.")
    stacks: StacksSpec = Field(default_factory=StacksSpec, description="Sampled stacks per process role; off by default.")
    gpu_profile: GpuProfileSpec = Field(default_factory=GpuProfileSpec,
                                        description="A short GPU profile per window (GPU only); off by default.")

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for name, default in (("stacks", StacksSpec()), ("gpu_profile", GpuProfileSpec())):
            if getattr(self, name) == default:
                out.pop(name, None)
        return out


class SloSpec(_Strict):
    """Service-level objectives a request must meet to count as good (goodput); not a factor.

    A sweep-wide yardstick, not part of what a trial measures: changing it does not change any
    ``trial_id``, so a finished trial keeps the goodput of the SLO it ran with (its records hold
    what is needed to recount it).
    """

    ttft_s: float | None = Field(default=None, gt=0, le=3600,
                                 description="Time to first token a good request stays within, in seconds.")
    tpot_s: float | None = Field(default=None, gt=0, le=3600,
                                 description="Time per output token (after the first) a good request stays within, "
                                             "in seconds.")

    @model_validator(mode="after")
    def _some(self) -> SloSpec:
        if self.ttft_s is None and self.tpot_s is None:
            raise ValueError("give ttft_s, tpot_s or both (or leave slo out)")
        return self


class Grid(_Strict):
    """The factors crossed into trials. Every list is one axis of the grid."""

    cores: tuple[Annotated[int, Field(ge=1, le=4096)], ...] = Field(min_length=1, description="Cores per replica.")
    gpus: tuple[Annotated[int, Field(ge=0, le=64)], ...] = Field(default=(0,), min_length=1,
                                                              description="GPUs per replica (tensor parallel size); 0 = CPU.")
    hardware: tuple[str, ...] = Field(default=("cpu",), min_length=1,
                                      description="Hardware type, e.g. cpu, H100, H200 (Ray accelerator_type).")
    restriction: tuple[RestrictionMode, ...] = Field(default=("affinity",), min_length=1,
                                                 description="How cores are enforced: cpuset, affinity or quota.")
    start: tuple[StartMode, ...] = Field(default=("fresh",), min_length=1,
                                         description="fresh = start pinned to the trial's cores; repin = re-pin one "
                                                     "live replica down the core counts (its thread pools keep their "
                                                     "start size); sized = start on the group's largest core count "
                                                     "with every thread pool sized for the trial's cores, then pin "
                                                     "to them before the window (a start per trial, quicker at few "
                                                     "cores).")
    vllm: tuple[VllmVariant, ...] = Field(default=(VllmVariant(name="default"),), min_length=1,
                                          description="Named vLLM flag variants.")
    api_servers: tuple[Annotated[int, Field(ge=1, le=64)], ...] = Field(
        default=(1,), min_length=1,
        description="vLLM --api-server-count values. API servers tokenize and handle HTTP; they run inside the "
                    "replica's cores, so a sweep shows whether more cores or more API servers remove a frontend queue.")
    stack: tuple[Literal["vllm", "ray-serve"], ...] | None = Field(
        default=None, min_length=1,
        description="Serving stacks to compare (vllm: `vllm serve`; ray-serve: a Ray Serve LLM app) under the same "
                    "cores; unset = server.stack for every trial.")
    calibrate: tuple[Annotated[int, Field(ge=1, le=4096)], ...] = Field(
        default=(),
        description="Core counts to run both fresh and re-pinned (a replica started on the most cores, "
        "then re-pinned live), to measure what repin mode costs in fidelity.")

    @field_validator("cores", "gpus", "hardware", "restriction", "start", "api_servers", "stack")
    @classmethod
    def _unique(cls, v: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"values must be unique, got {list(v)}")
        return v


class ClientSpec(_Strict):
    """Where the workload client runs relative to the replica."""

    cores: int = Field(default=1, ge=1, le=64, description="Cores reserved for the workload client.")
    isolation: Literal["require", "prefer", "share"] = Field(
        default="require",
        description="require: refuse a trial whose client cannot get cores disjoint from the replica; "
        "prefer: share cores when the node is too small, and record it; share: always run the client on the "
        "replica's own cores (recorded), so a trial needs only its replica's cores, e.g. to pack trials onto "
        "a small node.")


class RepeatsSpec(_Strict):
    """Windows per core count of a knee search (``search: knee``): at least ``min`` at every core count it
    measures, at most ``max``; ``until_ci`` stops adding windows at a core count whose figure is already
    known that closely. The candidates are the repeats ``0 .. max-1`` of the grid."""

    min: int = Field(default=1, ge=1, le=100, description="Windows every measured core count gets before the "
                                                          "search goes on (1: the search decides them all).")
    max: int = Field(default=3, ge=1, le=100, description="Most windows (repeats) at one core count; the grid "
                                                          "behind the search has this many repeats.")
    until_ci: float = Field(
        default=0.0, ge=0, le=10,
        description="A core count whose windows' figures (the knee's figure, p90 TTFT) have a 90% interval of at most +-this share "
                    "gets no more windows (it needs two). 0: off; windows go on up to max while the knee is not "
                    "settled.")

    @model_validator(mode="after")
    def _order(self) -> RepeatsSpec:
        if self.min > self.max:
            raise ValueError(f"repeats.min ({self.min}) is more than repeats.max ({self.max})")
        return self


class SearchSpec(_Strict):
    """Which trials of the grid run: all of them (``grid``), or the ones a knee search picks (``knee``)."""

    kind: Literal["grid", "knee"] = Field(
        default="grid",
        description="grid: every trial of the grid. knee: per configuration (everything but cores and repeat), "
                    "one trial at a time: the most cores, the fewest, then bisection on the knee the report's "
                    "estimate names, then more windows where its interval is, until the knee is settled and "
                    "bracketed or a budget is spent (orchestrator.plan.knee_search). Its trials have the grid's "
                    "trial ids; the ones not run are not failures.")
    max_trials: int | None = Field(default=None, ge=1, le=100_000,
                                   description="knee only: most trials one configuration's search runs.")
    max_gpu_hours: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="knee only: most GPU-hours one configuration's search spends, counting each trial's held time "
                    "(its end minus its start) times its GPUs (a CPU trial counts its time once).")

    @model_validator(mode="after")
    def _budgets_need_knee(self) -> SearchSpec:
        if self.kind == "grid" and (self.max_trials is not None or self.max_gpu_hours is not None):
            raise ValueError("max_trials and max_gpu_hours apply to kind: knee only")
        return self


def _repeats_kind(v: Any) -> str:
    return "policy" if isinstance(v, (dict, RepeatsSpec)) else "count"


class SweepSpec(_Strict):
    """A whole sweep: models × grid × workloads × repeats."""

    name: str = Field(min_length=1, max_length=64, pattern=_NAME, description="Sweep name (MLflow parent run).")
    description: str = Field(default="", description="Free text shown in MLflow.")
    models: tuple[ModelSpec, ...] = Field(min_length=1, description="Models (one axis of the grid).")
    workloads: tuple[WorkloadSpec, ...] = Field(min_length=1, description="Workloads (one axis of the grid).")
    grid: Grid = Field(description="The remaining factors.")
    server: ServerSpec = Field(default_factory=ServerSpec, description="Settings shared by all replicas.")
    client: ClientSpec = Field(default_factory=ClientSpec, description="Workload client placement.")
    protocol: ProtocolSpec = Field(default_factory=ProtocolSpec, description="How each window starts; trial order.")
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec, description="Sampling during the window.")
    slo: SloSpec | None = Field(
        default=None,
        description="Optional SLOs (ttft_s, tpot_s); each trial then records goodput_rps, the ok requests per second "
                    "that met them. Not part of a trial's identity.")
    repeats: Annotated[Annotated[Annotated[int, Field(ge=1, le=100)], Tag("count")] | Annotated[RepeatsSpec, Tag("policy")],
                       Discriminator(_repeats_kind)] = Field(
        default_factory=lambda data: default_repeats(data["grid"].gpus) if "grid" in data else 1,
        description="Repeats of each combination. Left out: 3 when any trial has GPUs (a grid.gpus value above "
                    "0), so a GPU sweep's tables show how far its repeats agree; 1 for a CPU-only sweep. A value "
                    "given is kept as written (repeats: 1 stays 1). `repeats_given` tells the two apart. With "
                    "search: knee also {min, max, until_ci} (RepeatsSpec); an int n there is {max: n}.")
    search: SearchSpec = Field(
        default_factory=SearchSpec, validate_default=True,
        description="grid (the default: every trial) or knee (a search for the knee, one trial at a time per "
                    "configuration); also {kind: knee, max_trials: N, max_gpu_hours: H}. Not part of a trial's "
                    "identity: a grid and a search of one sweep share the trial ids of the same (cores, repeat).")
    max_failures: int = Field(default=0, ge=0, le=10, description="Retries of a trial after a retryable failure "
                                                                   "(on another node when there is one).")
    max_concurrent_trials: int | None = Field(
        default=None, ge=1, le=100_000,
        description="Most trials in flight at once; unset = as many as the cluster holds (see placement). "
                    "`orchestrator run --max-concurrent` overrides it.")
    placement: Literal["exclusive", "packed"] = Field(
        default="exclusive",
        description="exclusive: one trial per node at a time, the faithful default for the paper's grids. packed: "
                    "several trials share a node on disjoint cores; they share memory bandwidth, PCIe and the "
                    "page cache, which changes results, so each packed trial records its neighbours. Not part "
                    "of a trial's identity: a finished trial is not run again when only this changes.")

    @field_validator("models", "workloads")
    @classmethod
    def _unique_names(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        names = [x.name for x in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"names must be unique, repeated: {dup}")
        return v

    @field_validator("search", mode="before")
    @classmethod
    def _search_word(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v

    @field_validator("search")
    @classmethod
    def _search_fits(cls, v: SearchSpec, info: ValidationInfo) -> SearchSpec:
        grid, repeats = info.data.get("grid"), info.data.get("repeats")
        if v.kind == "knee" and grid is not None and len(grid.cores) < 2:
            raise ValueError(f"search: knee needs at least two core counts in grid.cores, got {list(grid.cores)}")
        if v.kind == "grid" and isinstance(repeats, RepeatsSpec):
            raise ValueError("repeats: {min, max, until_ci} applies to search: knee only; give an int for a grid")
        return v

    @model_validator(mode="after")
    def _bench_sends_free_text(self) -> SweepSpec:
        # vllm bench serve has no per-request fields: it cannot send a structured-output turn's response_format,
        # so it would replay another load. (The bare client sends it, as the harness does.)
        p = self.protocol
        structured = [w.name for w in self.workloads if w.structured_output is not None]
        if structured and p.crosscheck is not False and "vllm-bench" in p.crosscheck_clients:
            raise ValueError(f"protocol.crosscheck_clients: 'vllm-bench' cannot send the response_format of workloads "
                             f"{structured} (structured_output); keep crosscheck_clients: [bare] for them")
        return self

    @property
    def repeat_count(self) -> int:
        """Repeats of each combination in the plan: ``repeats``, or a knee search's ``repeats.max``."""
        return self.repeats.max if isinstance(self.repeats, RepeatsSpec) else self.repeats

    @property
    def repeat_policy(self) -> RepeatsSpec:
        """A knee search's windows per core count; an int ``repeats: n`` is ``{min: 1, max: n}``."""
        return self.repeats if isinstance(self.repeats, RepeatsSpec) else RepeatsSpec(min=1, max=self.repeats)

    @property
    def repeats_given(self) -> bool:
        """Whether the spec set ``repeats``; when not, it is :func:`default_repeats` of the grid."""
        return "repeats" in self.model_fields_set

    @model_serializer(mode="wrap")
    def _omit_default_repeats(self, handler: Any) -> dict[str, Any]:
        # A repeat count the spec left out stays out, so a dumped spec parses back to the same spec, and
        # one copied into a grid with other GPU counts takes that grid's default.
        out: dict[str, Any] = handler(self)
        if not self.repeats_given:
            out.pop("repeats", None)
        if self.search == SearchSpec():  # a grid's dumped spec stays as it was before the field existed
            out.pop("search", None)
        return out


GPU_REPEATS = 3  # a sweep with GPUs, unless it says otherwise: enough to see whether its repeats agree


def default_repeats(gpus: Any) -> int:
    """Repeats of a sweep that does not set ``repeats`` (pure): :data:`GPU_REPEATS` when any of ``gpus``
    (the grid's GPU counts) is above 0, else 1, the default of CPU-only sweeps."""
    return GPU_REPEATS if any(g > 0 for g in gpus) else 1


__all__ = ["ClientSpec", "GPU_REPEATS", "Grid", "GpuProfileSpec", "HubModel", "ModelSpec", "ProtocolSpec",
           "RepeatsSpec", "RestrictionMode", "SearchSpec", "ServerSpec", "ShapeModel", "SloSpec", "StacksSpec", "StartMode",
           "SweepSpec", "TelemetrySpec", "VllmVariant", "default_repeats", "parse_bytes"]
