"""Name what a sampled stack was doing, the paper's CPU paths, and share a thread's CPU time among them (pure).

A *stack* is one record of py-spy's ``raw`` (collapsed) output: ``;``-separated frames from the root
to the leaf, then a space and a sample count. With ``--subprocesses`` the first frames name the
process (``process 123:"VLLM::EngineCore"``), with ``--threads`` the thread (``thread (4567): name``).
A *frame* is ``function (file.py:line)``, the function qualified by its class, the file shortened
to its package path (``GPUModelRunner._prepare_inputs (vllm/v1/worker/gpu_model_runner.py:2136)``);
with ``--native``, frames of C/C++ code carry a library name instead of a ``.py`` file.

Categories (:data:`CATEGORIES`), the paths through which CPU starvation grows TTFT:

- ``tokenization``: tokenizers, the input processor and renderer, detokenization;
- ``structured_output``: structured outputs (vLLM's ``structured_output`` package and the grammar libraries
  under it): checking a request's schema in the API server, compiling its grammar in the engine core's
  pool threads, and filling the token bitmask of every decode step;
- ``http``: uvicorn, starlette, fastapi, the asyncio event loop, aiohttp, the OpenAI front end;
- ``scheduling``: vLLM v1's scheduler and KV-cache manager, and the engine core's loop around them;
- ``input_prep``: the model runner preparing a step's inputs (states, input ids, attention metadata);
- ``ipc``: zmq, msgspec, pickle, vLLM's serialisation and its socket threads between processes;
- ``shm_broadcast``: the shared-memory ``MessageQueue`` between scheduler and workers, its spin-wait;
- ``cuda_launch``: CUDA graph replay, kernel launches, torch op dispatch on a GPU worker, and the
  host's waits on CUDA events (``Event.synchronize`` spins until the GPU is done);
- ``model_forward``: the forward pass and sampling (on CPU vLLM they run on the host);
- ``idle``: a sample caught in a wait (a lock or condition, select/epoll/poll, an idle pool thread);
- ``other``: anything else.

How a stack is named, first rule that applies:

1. ``shm_broadcast`` if any frame is in the message queue: its wait *is* the cost (a spin that yields).
2. ``idle`` if the leaf is a wait.
3. *What the code is for*: the innermost frame matching a purpose rule (:data:`PURPOSE`), so the
   torch ops that prepare inputs are ``input_prep`` and a tokenizer called from a handler is
   ``tokenization``.
4. *Which library*: the innermost frame matching a library rule (:data:`LIBRARY`).
5. ``other``.

On a GPU worker (``gpu=True``) the forward pass's host time is kernel launches: ``model_forward``
reads as ``cuda_launch``.

Seconds. A sample means the thread was running *or runnable* (py-spy reads the kernel's thread
state, which does not tell the two apart), so ``samples / rate`` is the time a thread spent in that
code on a CPU or waiting for one: its *demand* (``active_s``). On a starved replica that is several
times its CPU time (a spinning engine core is runnable nearly always). CPU-seconds therefore come
from the kernel and the stacks only share them out (:func:`apportion`):

    cpu_s(role, c) = sum over the role's threads t of  cpu_s(t) * samples(t, c) / samples(t)

with ``cpu_s(t)`` the thread's on-CPU time in the window (``/proc/<pid>/task/<tid>/schedstat``);
without it, the process's user + system time, and without that, ``samples / rate``. Idle shares
are in no CPU figure. Threads that run no Python (zmq's I/O threads) have no stacks: their CPU is
missing from the categories, so the categories' sum says how much of the role's CPU they explain.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CATEGORIES: tuple[str, ...] = ("tokenization", "structured_output", "http", "scheduling", "input_prep", "ipc",
                               "shm_broadcast", "cuda_launch", "model_forward", "idle", "other")
NOT_CPU: frozenset[str] = frozenset({"idle"})  # categories whose share is in no CPU figure
Q = r"(^|\.)"  # a function name, bare or qualified by its class (``GPUModelRunner._prepare_inputs``)


def _rules(*pairs: tuple[str, str]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((cat, re.compile(p)) for cat, p in pairs)


# What the code is *for*, named by a frame anywhere in the stack (the innermost match wins): preparing
# inputs runs torch ops, scheduling calls into queues, and those frames must not name the stack.
PURPOSE = _rules(
    # First: xgrammar's own tokenizer-info frames would otherwise read as tokenization.
    ("structured_output", r"\(vllm/v1/structured_output/|\(xgrammar/|\(llguidance/|\(outlines_core/"
                          r"|\(outlines/|\(lmformatenforcer/"),
    ("tokenization", r"\(tokenizers/|\(transformers/(models/.*/)?tokenization_|\(vllm/tokenizers/"
                     r"|\(vllm/transformers_utils/tokenizer|\(vllm/v1/engine/detokenizer\.py"
                     r"|\(vllm/v1/engine/input_processor\.py|\(vllm/v1/engine/processor\.py|\(vllm/renderers/"
                     r"|\(vllm/entrypoints/renderer\.py|\(tiktoken/|\(sentencepiece/|[Dd]etokeniz|[Tt]okeniz"),
    ("ipc", Q + r"(process_input_sockets|process_output_sockets) \(vllm/v1/engine/core\.py"),
    ("scheduling", r"\(vllm/v1/core/"),
    ("input_prep", Q + r"(prepare_inputs|_prepare_inputs|_update_states|_prepare_input_ids|_build_attention_metadata"
                   r"|build_attn_metadata|_calc_spec_decode_metadata|_prepare_mm_inputs|_update_states_after_model_execute)"
                   r" |\(vllm/v1/worker/(gpu_)?input_batch\.py|\(vllm/v1/worker/(gpu/)?block_table\.py"
                   r"|\(vllm/v1/worker/gpu/(input_batch|states)\.py"),
    ("cuda_launch", r"\(torch/cuda/graphs\.py|\(vllm/compilation/(cuda_graph|cudagraph\w*|breakable_cudagraph)\.py"
                    r"|\(vllm/v1/worker/gpu/cudagraph_utils\.py|cudaLaunchKernel|cudaGraphLaunch|cuLaunchKernel"
                    r"|\(libcuda|\(libcudart"),
)
# Which library the time is spent in, named by the innermost frame that matches.
LIBRARY = _rules(
    ("ipc", r"\(zmq/|\(msgspec/|\(pickle\.py|\(copyreg\.py|\(cloudpickle/|\(vllm/v1/serial_utils\.py"
            r"|\(multiprocessing/(connection|reduction|queues)\.py|\(vllm/v1/engine/tensor_ipc\.py"
            r"|\(vllm/v1/engine/core_client\.py|" + Q + r"(put|put_nowait) \(queue\.py"),  # handing outputs to a socket thread
    ("model_forward", r"\(vllm/model_executor/|\(vllm/models/|\(vllm/attention/|\(vllm/v1/attention/|\(vllm/v1/sample/"
                      r"|\(vllm/compilation/|\(vllm/forward_context\.py|\(vllm/_custom_ops\.py|\(vllm/ir/|\(torch/"
                      r"|\(triton/|" + Q + r"_?model_forward |\(libtorch|\(libgomp|\(libiomp|\(libomp|\(_C\.abi3"),
    ("scheduling", r"\(vllm/v1/engine/core\.py"),  # the engine core's own loop around the scheduler
    ("http", r"\(uvicorn/|\(starlette/|\(fastapi/|\(aiohttp/|\(asyncio/|\(uvloop/|\(h11/|\(httptools/"
             r"|\(anyio/|\(vllm/entrypoints/|\(prometheus_client/|\(vllm/v1/metrics/|\(vllm/v1/engine/async_llm\.py"
             r"|\(vllm/v1/engine/output_processor\.py"),
)
SHM = re.compile(r"\(vllm/distributed/device_communicators/shm_broadcast\.py|\(vllm/spinloop|MessageQueue")
IDLE_LEAF = re.compile(
    # Python wait points (the C call under them, time.sleep or epoll, is no frame without --native) ...
    Q + r"(wait|_wait_for_tstate_lock|join) \((threading\.py|multiprocessing/|concurrent/futures/)"
    r"|" + Q + r"(select|poll) \((selectors\.py|zmq/sugar/poll\.py|multiprocessing/)"
    r"|" + Q + r"(_poll|accept) \((multiprocessing/connection\.py|socket\.py)"
    r"|" + Q + r"_worker \(concurrent/futures/thread\.py"  # a pool thread waiting for work (a C queue get)
    # ... and with --native, the C library's waits.
    r"|^(epoll_wait|epoll_pwait|poll|ppoll|select|pselect6?|nanosleep|clock_nanosleep|pthread_cond_wait"
    r"|pthread_cond_timedwait|__futex_abstimed_wait_common\w*|futex_wait|syscall|sem_wait|sem_timedwait)"
    r" \((libc|libpthread|ld-linux|libzmq|\?\?)")


ROLE_FRAME = re.compile(r"^thread \((\d+)\)")
PROCESS = re.compile(r'^process (\d+):"?(.*?)"?$')
LABEL = re.compile(r'process (\d+):"([^"]*)"', re.S)


@dataclass(frozen=True)
class Stack:
    """One collapsed stack: frames from root to leaf (labels removed), its samples, where it was taken.

    ``procs`` holds the process labels (``--subprocesses``), outermost first, as ``(pid, title)``; the
    last is the process the stack was sampled in. ``tid`` is the thread's (``--threads``), or None.
    """

    frames: tuple[str, ...]
    samples: int
    procs: tuple[tuple[int, str], ...] = ()
    tid: int | None = None

    @property
    def pid(self) -> int | None:
        return self.procs[-1][0] if self.procs else None


def normalize_labels(text: str, cmdlines: Mapping[int, str] | None = None) -> str:
    """py-spy's process labels as one-line titles. py-spy writes each process's whole command line,
    and ``python -c CODE`` puts newlines and ``;`` in it: known command lines (``cmdlines``: pid ->
    argv joined by spaces) are replaced first, then any quoted label left; a title keeps its first line."""
    for pid, cmd in (cmdlines or {}).items():
        if cmd:
            text = text.replace(f'process {pid}:"{cmd}"', f'process {pid}:"{_title(cmd)}"')
    return LABEL.sub(lambda m: f'process {m.group(1)}:"{_title(m.group(2))}"', text)


def _title(cmd: str) -> str:
    first = cmd.strip().splitlines()[0] if cmd.strip() else ""
    return first.replace(";", ",").replace('"', "'")[:120].rstrip()


def parse_collapsed(text: str) -> list[Stack]:
    """py-spy ``raw`` output (``frame;frame;... count`` per line, labels tidied by :func:`normalize_labels`)
    as :class:`Stack` values; lines that do not parse are dropped."""
    out = []
    for line in text.splitlines():
        body, _, count = line.rstrip().rpartition(" ")
        if not body or not count.isdigit():
            continue
        procs: list[tuple[int, str]] = []
        frames: list[str] = []
        tid = None
        for f in body.split(";"):
            if (m := PROCESS.match(f)) is not None:
                procs.append((int(m.group(1)), m.group(2)))
            elif (t := ROLE_FRAME.match(f)) is not None:
                tid = int(t.group(1))
            else:
                frames.append(f)
        out.append(Stack(tuple(frames), int(count), tuple(procs), tid))
    return out


def categorize(frames: tuple[str, ...] | list[str], gpu: bool = False) -> str:
    """The category of one stack (frames root to leaf); the rules' order is in the module docstring."""
    if not frames:
        return "other"
    if any(SHM.search(f) for f in frames):
        return "shm_broadcast"
    if IDLE_LEAF.search(frames[-1]):
        return "idle"
    for rules in (PURPOSE, LIBRARY):
        for f in reversed(frames):
            for cat, pat in rules:
                if pat.search(f):
                    return "cuda_launch" if gpu and cat == "model_forward" else cat
    return "other"


@dataclass
class RoleCategories:
    """One role's seconds per category: ``cpu_s`` (apportioned CPU) and ``active_s`` (samples / rate)."""

    cpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    active_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    samples: int = 0

    def cpu_total(self) -> float:
        return sum(v for c, v in self.cpu_s.items() if c not in NOT_CPU)


def apportion(stacks: Iterable[Stack], rate_hz: float, roles: Mapping[int, str],
              thread_cpu: Mapping[tuple[int, int], float] | None = None,
              process_cpu: Mapping[int, float] | None = None, gpu: bool = False) -> dict[str, RoleCategories]:
    """Per role, each category's CPU-seconds and active seconds (the formula is in the module docstring).

    ``roles``: pid -> role (unknown pids: ``other``). ``thread_cpu``: (pid, tid) -> on-CPU seconds in the
    window; ``process_cpu``: pid -> CPU seconds. A thread missing from both falls back to samples / rate."""
    per_thread: dict[tuple[int | None, int | None], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in stacks:
        per_thread[(s.pid, s.tid)][categorize(s.frames, gpu=gpu)] += s.samples
    per_proc: dict[int | None, int] = defaultdict(int)
    for (pid, _), cats in per_thread.items():
        per_proc[pid] += sum(cats.values())
    out: dict[str, RoleCategories] = defaultdict(RoleCategories)
    for (pid, tid), cats in per_thread.items():
        n = sum(cats.values())
        rc = out[roles.get(pid, "other") if pid is not None else "other"]
        rc.samples += n
        if thread_cpu is not None and pid is not None and tid is not None and (pid, tid) in thread_cpu:
            per_sample = thread_cpu[(pid, tid)] / n
        elif process_cpu is not None and pid in process_cpu:
            per_sample = process_cpu[pid] / per_proc[pid]  # type: ignore[index]
        else:
            per_sample = 1.0 / rate_hz
        for cat, k in cats.items():
            rc.cpu_s[cat] += k * per_sample
            rc.active_s[cat] += k / rate_hz
    return dict(out)


def category_metrics(role: str, rc: RoleCategories, requests: int | None) -> dict[str, float]:
    """One role's figures: ``stacks_cpu_s_<role>.<c>`` and their sum ``stacks_cpu_s_<role>`` (idle left out),
    ``stacks_active_s_<role>.<c>``, ``stacks_idle_cpu_s_<role>``, and with ``requests`` > 0
    ``cpu_s_per_req_<role>.<c>`` = cpu_s / requests. Categories without samples are left out."""
    out: dict[str, float] = {}
    for cat in CATEGORIES:
        if rc.active_s.get(cat, 0.0) <= 0:
            continue
        out[f"stacks_active_s_{role}.{cat}"] = rc.active_s[cat]
        if cat in NOT_CPU:
            continue
        out[f"stacks_cpu_s_{role}.{cat}"] = rc.cpu_s[cat]
        if requests:
            out[f"cpu_s_per_req_{role}.{cat}"] = rc.cpu_s[cat] / requests
    out[f"stacks_cpu_s_{role}"] = rc.cpu_total()
    out[f"stacks_idle_cpu_s_{role}"] = rc.cpu_s.get("idle", 0.0)
    return out


def render_collapsed(stacks: Iterable[Stack]) -> bytes:
    """Stacks back as collapsed text (``frame;...;frame count``), threads merged, sorted: flame-graph ready."""
    merged: dict[tuple[str, ...], int] = defaultdict(int)
    for s in stacks:
        merged[s.frames] += s.samples
    lines = [f"{';'.join(f) or '<no frames>'} {n}" for f, n in sorted(merged.items())]
    return ("\n".join(lines) + "\n").encode() if lines else b""


def by_role(stacks: Iterable[Stack], roles: Mapping[int, str], default: str = "other") -> dict[str, list[Stack]]:
    """Stacks grouped by the role of their process (``roles``: pid -> role; unknown pids get ``default``)."""
    out: dict[str, list[Stack]] = defaultdict(list)
    for s in stacks:
        out[roles.get(s.pid, default) if s.pid is not None else default].append(s)
    return dict(out)


__all__ = ["CATEGORIES", "LIBRARY", "NOT_CPU", "PURPOSE", "RoleCategories", "Stack", "apportion", "by_role",
           "categorize", "category_metrics", "normalize_labels", "parse_collapsed", "render_collapsed"]
