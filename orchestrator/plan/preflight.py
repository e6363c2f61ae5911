"""Preflight: the inputs a sweep reads, checked before Ray, MLflow or vLLM starts.

Why: a malformed trace line or a missing model folder used to pass ``orchestrator plan`` and
fail each trial of ``orchestrator run`` only after Ray, MLflow and a vLLM replica had started
(about 110 s per trial), as the retryable ``server_died`` or as ``internal``. Everything a
trial reads from files is read here first, once, and every problem is reported at once,
one line each, naming the file and line.

What is checked (the spec's own fields were validated by ``orchestrator.values.sweep_spec``):

- every workload's sessions load with the real loaders (``workloads.loaders.load_sessions``,
  once per distinct workload), so a trace file that is missing or has a bad line fails with
  the loader's own ``file:line: problem``;
- a model ``id`` that looks like a local path (starts with ``/``, ``./``, ``../`` or ``~``,
  or names something that exists beside the sweep file) is a folder with ``config.json`` and
  the ``tokenizer.json`` the workload client loads;
- a model shape's tokenizer is installed or cached (as ``orchestrator.plan.models.tokenizer_dir``
  looks for it), without downloading it. Missing, the node would fetch it with pip when the
  trial starts, which an offline node cannot do: a warning for ``plan``, an error for ``run``.

- a local ``run`` (no ``RAY_ADDRESS``) asks for no more cores and GPUs per trial than this machine
  has (:class:`Machine`: the cores this process may run on, the GPUs NVML or ``nvidia-smi`` sees):
  the trial would otherwise start Ray and MLflow only to fail as ``cannot_fit``.

On a remote cluster (``RAY_ADDRESS`` set) model folders and tokenizers are read on the GPU
nodes, not here, so what this machine lacks is only a warning, and whether a trial fits is the
executor's to say, per node (``cannot_fit`` is then a trial's result). Trace files are an error
everywhere: the driver reads them too (replay-fidelity figures).

Pure checks plus file reads (and, for a local run, NVML or ``nvidia-smi -L`` to count the GPUs):
no service is started, nothing is written or downloaded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.values.shapes import SHAPES, Tokenizer
from orchestrator.values.sweep_spec import HubModel, ShapeModel, SweepSpec
from workloads.loaders import TraceError, load_sessions, trace_path

Severity = Literal["error", "warning"]
_PATH_PREFIXES = ("/", "./", "../", "~")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a sweep's inputs; ``message`` is one line that says where and what."""

    message: str
    severity: Severity = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


@dataclass(frozen=True)
class Machine:
    """What this machine can give a local run's trials: usable cores and GPUs."""

    cores: int
    gpus: int

    @classmethod
    def here(cls) -> Machine:
        """The cores this process may run on (its affinity, as the core agent allocates them) and the GPUs
        NVML counts (nvidia-ml-py), else ``nvidia-smi -L`` lists, else none."""
        return cls(len(os.sched_getaffinity(0)), _gpu_count())


def preflight(spec: SweepSpec, spec_path: str | Path, *, for_run: bool = False,
              cluster: bool | None = None, machine: Machine | None = None) -> list[Problem]:
    """Every problem with the files ``spec`` needs, errors and warnings, in spec order.

    ``for_run``: a missing tokenizer is an error (``run``) instead of a warning (``plan``), and so
    is a trial larger than this machine (``machine``, by default :meth:`Machine.here`) on a local run.
    ``cluster``: model folders and tokenizers live on other machines, so their absence here is
    only a warning, and trials are sized against the cluster's nodes instead; by default, whether
    ``RAY_ADDRESS`` is set.
    """
    if cluster is None:
        cluster = bool(os.environ.get("RAY_ADDRESS"))
    base = Path(spec_path).resolve().parent
    problems = _workload_problems(spec)
    for model in spec.models:
        if isinstance(model, HubModel):
            problems += _local_model_problems(model, base, cluster)
        elif isinstance(model, ShapeModel):
            problems += _tokenizer_problems(model, for_run and not cluster)
    if for_run and not cluster:
        problems += _machine_problems(spec, str(spec_path), machine or Machine.here())
    return problems


def errors(problems: list[Problem]) -> list[Problem]:
    """The problems that stop a sweep (warnings are shown and let it go on)."""
    return [p for p in problems if p.is_error]


# ---------------------------------------------------------------- workloads

def _workload_problems(spec: SweepSpec) -> list[Problem]:
    """Load each distinct workload once (two that differ only in name load the same sessions)."""
    groups: dict[str, list[Any]] = {}
    for w in spec.workloads:
        groups.setdefault(w.model_dump_json(exclude={"name"}), []).append(w)
    problems = []
    for same in groups.values():
        w = same[0]
        names = ", ".join(repr(x.name) for x in same)
        try:
            load_sessions(w)
        except TraceError as exc:
            where = f"{exc.path}:{exc.line}" if exc.line else str(exc.path)
            problems.append(Problem(f"{where}: {exc.problem} (workload {names})"))
        except (OSError, ValueError) as exc:  # an unreadable file, bad UTF-8, an impossible agentic spec
            path = trace_path(w)
            where = f"{path}: " if path is not None else ""
            problems.append(Problem(f"{where}{_one_line(exc)} (workload {names})"))
    return problems


# ---------------------------------------------------------------- this machine

_CLUSTER_NOTE = "a cluster run, with RAY_ADDRESS set, checks this per node instead"


def _machine_problems(spec: SweepSpec, where: str, machine: Machine) -> list[Problem]:
    """A local run's trials against this machine, as the node book sizes them (``placement.Need.matches``).

    A trial holds its replica's cores plus, under ``client.isolation: require``, the client's own
    (``prefer`` lets the client share the replica's cores on a small node, ``share`` always does).
    ``grid.calibrate`` adds core counts of its own. One line per field, naming its largest value."""
    client = spec.client
    extra = client.cores if client.isolation == "require" else 0
    problems = []
    for field, counts in (("grid.cores", spec.grid.cores), ("grid.calibrate", spec.grid.calibrate)):
        too_many = sorted(c for c in counts if c + extra > machine.cores)
        if not too_many:
            continue
        asked = ", ".join(str(c) for c in too_many)
        if extra:
            need = f"{asked} cores + {extra} client core{'s' if extra > 1 else ''} need " \
                   f"{'up to ' if len(too_many) > 1 else ''}{too_many[-1] + extra} cores"
        else:
            need = f"{asked} cores, the client sharing them (client.isolation: {client.isolation}), need " \
                   f"{'up to ' if len(too_many) > 1 else ''}{too_many[-1]} cores"
        problems.append(Problem(f"{where}: {field}: {need}; this machine has {machine.cores} ({_CLUSTER_NOTE})"))
    too_many = sorted(g for g in spec.grid.gpus if g > machine.gpus)
    if too_many:
        asked = ", ".join(str(g) for g in too_many)
        problems.append(Problem(f"{where}: grid.gpus: {asked} GPU{'s' if too_many[-1] > 1 else ''} per trial; "
                                f"this machine has {machine.gpus} ({_CLUSTER_NOTE})"))
    return problems


def _gpu_count() -> int:
    """GPUs on this machine: NVML when nvidia-ml-py is installed, else ``nvidia-smi -L``'s lines, else 0."""
    try:
        import pynvml  # optional: nvidia-ml-py, on GPU machines only (ImportError on CPU-only installs)
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                return int(pynvml.nvmlDeviceGetCount())
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - no driver: NVML is installed but finds nothing
            pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


# ---------------------------------------------------------------- models

def looks_like_path(model_id: str, base: Path) -> bool:
    """A local model folder rather than a hub id: an explicit path, or one beside the sweep file."""
    return model_id.startswith(_PATH_PREFIXES) or (base / model_id).exists()


def _local_model_problems(model: HubModel, base: Path, cluster: bool) -> list[Problem]:
    if not looks_like_path(model.id, base):
        return []  # a hub id: checking it needs the hub, which the node reaches, not this check
    severity: Severity = "warning" if cluster else "error"
    note = " (checked on this machine; the GPU nodes may differ)" if cluster else ""
    path = Path(model.id).expanduser()
    if not path.is_absolute() and not path.exists() and (base / path).exists():
        path = base / path
    head = f"model {model.name!r}: {model.id}"
    if not path.is_dir():
        return [Problem(f"{head}: no such model folder{note}", severity)]
    missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).is_file()]
    if missing:
        why = {"config.json": "vLLM reads the model's shape from it",
               "tokenizer.json": "the workload client counts and renders prompt tokens with it"}
        return [Problem(f"{head}: no {f} in the folder ({why[f]}){note}", severity) for f in missing]
    if not Path(model.id).is_absolute():
        # The id reaches vLLM on the node as written (the spec resolves only trace paths), so it is
        # read from the Ray worker's working directory, and a ~ is not expanded.
        return [Problem(f"{head}: the node passes this path to vLLM as written, not resolved against the sweep "
                        f"file; write the absolute path {path.resolve()}", "warning")]
    return []


def tokenizer_location(tok: Tokenizer) -> Path | None:
    """Where ``orchestrator.plan.models.tokenizer_dir`` would find ``tok`` without fetching it, or None.

    The same two places, in the same order: the installed package, then the set-up-time cache
    (``ORCH_TOKENIZER_CACHE``, else ``~/.cache/cpu-starvation-orchestrator/tokenizers``)."""
    try:
        found = importlib.util.find_spec(tok.package)  # locates without importing
    except (ImportError, ValueError):
        found = None
    for loc in (found.submodule_search_locations or []) if found else []:
        if (Path(loc) / tok.subdir / "tokenizer.json").is_file():
            return Path(loc) / tok.subdir
    dest = _tokenizer_cache() / tok.dist.replace("==", "-")
    return dest if (dest / "tokenizer.json").is_file() else None


def _tokenizer_cache() -> Path:
    return Path(os.environ.get("ORCH_TOKENIZER_CACHE")
                or Path.home() / ".cache" / "cpu-starvation-orchestrator" / "tokenizers")


def _tokenizer_problems(model: ShapeModel, fatal: bool) -> list[Problem]:
    tok = SHAPES[model.shape].tokenizer  # the spec validated the shape's name
    if tokenizer_location(tok) is not None:
        return []
    return [Problem(
        f"model {model.name!r} (shape {model.shape}): tokenizer {tok.dist} is neither installed nor cached "
        f"(ORCH_TOKENIZER_CACHE, now {_tokenizer_cache()}), so the node would download it when the trial starts; "
        f"get it first: `pip install {tok.dist}`, or `orchestrator model build {model.shape} DIR` (fills the cache)",
        "error" if fatal else "warning")]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = ["Machine", "Problem", "errors", "looks_like_path", "preflight", "tokenizer_location"]
