"""Public entry point: run one workload spec against one server and return what happened.

The orchestrator's workload actor calls ``run_workload`` (async) or ``run_workload_sync``.
This module only wires the parts: loader (sessions), ``TextFactory`` (text), strategy
(when), ``StreamingClient`` (how) and ``LoadGenerator`` (the window). It returns raw records
plus the client's own cost, because a CPU-starvation study must show the *client* was not
the bottleneck before blaming the server's cores.

Recorded sessions are chat sessions with their own text: the load generator sends them to
the chat endpoint and never calls the factory's renderer for them; the factory's tokenizer
still does the client-side counts, of each request's message transcript
(``protocols.chat_transcript``).

``client_cpu_s`` is ``time.process_time()`` over the load phase: every thread of this
process (event loop, and tokenizer workers in ``inflight`` mode), excluding setup
(tokenizer load, trace parsing) and ``after``-mode tokenization. In a Ray actor it also
includes Ray's own worker threads, which are light.

Client-side tokenization (``spec.client_tokenize``) costs 4-7 ms per 1k tokens on one core
of the 2-core CPU machine (benchmarks/client_bench.py), against ~0.35-0.7 ms of client CPU to
send and stream a whole request: ``inflight`` saturated one client core at 1000 req/s of
200-token prompts, so ``after`` (the default) measures it once the window has closed.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

from . import metrics
from .client import StreamingClient
from .loaders import in_flight, kind_of, load_sessions, text_style
from .loadgen import ClosedLoop, LoadGenerator, LoadResult, OpenLoop, Strategy
from .records import RequestRecord
from .spec import AgenticWorkload, AzureWorkload, MooncakeWorkload, RecordedWorkload
from .text import TextFactory, load_tokenizer, timed_count, token_counter
from .trace import Session

# Dispatch lag matters as a share of what the study measures: above 1% of TTFT p50 (3 ms at a
# 300 ms TTFT) it marks the figures, below it a warning only teaches users to ignore warnings (a
# fixed 2 ms fired on every H200 agentic trial, at 0.2-1.6% of TTFT). Loop timers have ~1 ms
# resolution (see protocols.MonotonicClock), so lag up to that is the timer, not the client,
# however short the TTFT.
DISPATCH_LAG_TTFT_SHARE = 0.01
DISPATCH_LAG_FLOOR_S = 0.001
CLIENT_CPU_WARN_FRACTION = 0.8  # of the cores this process may run on

AnyWorkload = AgenticWorkload | MooncakeWorkload | AzureWorkload | RecordedWorkload


@dataclass(frozen=True, slots=True)
class WorkloadRun:
    """Records of one run plus the client's cost and anything that makes the run suspect."""

    records: tuple[RequestRecord, ...]
    client_cpu_s: float
    wall_s: float
    warnings: tuple[str, ...]
    client_cores: int = 0  # cores this process was allowed to use
    sessions_started: int = 0
    sessions_unstarted: int = 0  # arrived after the window
    turns_unsent: int = 0  # after the window, or after a failed turn of their session
    window_start_ns: int = 0  # the load's start and its window's nominal end (time.monotonic_ns)
    window_end_ns: int = 0

    def span_ns(self) -> tuple[int, int] | None:
        """The span in which the window's requests ran: first send to last completion
        (``time.monotonic_ns``, one clock for every process of a host); None without records."""
        if not self.records:
            return None
        return min(r.sent_ns for r in self.records), max(r.end_ns for r in self.records)


def strategy_for(spec: AnyWorkload) -> Strategy:
    """Closed loop for the kinds that send each session's turns in order (agentic, recorded), at their
    ``concurrency``; open loop for trace replays, at their ``max_in_flight`` (``loaders.KINDS``)."""
    kind = kind_of(spec)
    return ClosedLoop(in_flight(spec)) if kind.closed_loop else OpenLoop(in_flight(spec))


def diagnose(result: LoadResult, sessions: list[Session], *, client_cpu_s: float, wall_s: float,
             client_cores: int) -> tuple[str, ...]:
    """Warnings for a run (pure): client saturation, lost requests, server flags missing.

    Dispatch lag warns when its p99 exceeds both ``DISPATCH_LAG_FLOOR_S`` and
    ``DISPATCH_LAG_TTFT_SHARE`` of the ok requests' TTFT p50 (the floor alone without TTFT).
    """
    out: list[str] = []
    records = result.records
    lag = metrics.percentile(metrics.dispatch_lag_s(records), 99)
    ttft = metrics.percentile(metrics.ttft_s(records), 50)
    if lag is not None and lag > DISPATCH_LAG_FLOOR_S:
        if ttft is None:  # no request got a token: the floor alone decides
            out.append(f"dispatch lag p99 {lag * 1e3:.1f} ms exceeds the timer's {DISPATCH_LAG_FLOOR_S * 1e3:.0f} ms "
                       "and no TTFT to compare it with: the client may be the bottleneck")
        elif lag > DISPATCH_LAG_TTFT_SHARE * ttft:
            out.append(f"dispatch lag p99 {lag * 1e3:.1f} ms is {lag / ttft:.1%} of TTFT p50 {ttft * 1e3:.0f} ms: "
                       "the client may be the bottleneck")
    if wall_s > 0 and client_cores > 0:
        busy = client_cpu_s / wall_s / client_cores
        if busy > CLIENT_CPU_WARN_FRACTION:
            out.append(f"client used {busy:.0%} of its {client_cores} core(s): the client may be the bottleneck")
    if result.slot_waits:
        out.append(f"{result.slot_waits} session(s) arrived with every slot busy and were sent late "
                   "(raise max_in_flight/concurrency, or the server is saturated)")
    n = len(records)
    for status in ("timeout", "error", "cut"):
        bad = [r for r in records if r.status == status]
        if bad:
            example = f"; first: {bad[0].error}" if bad[0].error else ""
            out.append(f"{len(bad)} of {n} requests ended with status {status}{example}")
    ok = metrics.ok_records(records)
    if ok and all(r.cached_tokens is None for r in ok):
        out.append("server reported no cached tokens: start vLLM with --enable-prompt-tokens-details "
                   "to measure prefix-cache hits per request")
    planned = {f"{s.session_id}:{k}": t.output_tokens for s in sessions for k, t in enumerate(s.turns)}
    short = sum(1 for r in ok if planned.get(r.request_id, r.completion_tokens) != r.completion_tokens)
    if short:
        out.append(f"{short} ok request(s) returned a different number of tokens than requested: "
                   "the server may ignore min_tokens/ignore_eos")
    return tuple(out)


@contextmanager
def frozen_setup() -> Iterator[None]:
    """Keep the objects that exist now out of the cyclic garbage collector until exit.

    Why: a full (generation-2) collection traverses every tracked object in the process and
    stops the event loop meanwhile. With the set-up heap (imports, tokenizer word pool,
    sessions; far more in a Ray actor) it took 37-52 ms on the 2-core CPU machine, and in each
    of 3 measured 10 s uvloop windows at 500 req/s one made a TTFT 40-54 ms too long, with p99
    < 1 ms (benchmarks/client_bench.py --ttft-only; max 1.5-3.4 ms with this). ``gc.collect()`` then
    ``gc.freeze()`` moves what survives into the permanent generation, so collections inside
    the window only look at objects allocated in it, and restarts the collector's counters,
    so the next full collection is also further away. GC stays enabled: cycles made during
    the window are still collected. On exit the frozen objects go back to the oldest
    generation, unless something had frozen objects before (then it all stays frozen, as
    unfreezing would undo that caller's freeze too).
    """
    gc.collect()
    was_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not was_frozen:
            gc.unfreeze()


@dataclass(frozen=True, slots=True)
class Prepared:
    """A workload ready to send: its text factory and sessions, built before the window opens.

    Why apart: building the word pool and parsing a trace take seconds of CPU; inside the span that
    a trial's telemetry averages they would dilute every utilisation figure with idle server time.
    """

    spec: AnyWorkload
    factory: TextFactory
    sessions: list[Session]


@dataclass(frozen=True, slots=True)
class Loaded:
    """One load phase: the run (records not yet tokenized client-side) and the raw result it came from."""

    run: WorkloadRun
    result: LoadResult


def prepare(spec: AnyWorkload, tokenizer_path: str) -> Prepared:
    """Text factory and sessions for ``spec`` (seconds of CPU; call it before the measured window)."""
    factory = TextFactory(load_tokenizer(tokenizer_path), style=text_style(spec))
    return Prepared(spec, factory, load_sessions(spec, factory))


async def load(prepared: Prepared, *, base_url: str, model: str) -> Loaded:
    """The load phase alone: send ``prepared``'s sessions for the window and return what happened.

    ``client_tokenize: after`` is left to :func:`tokenize_after` (the records' client counts are the
    loader's plan until then), so a caller can close its measured span as soon as the last request ends.
    """
    spec, factory, sessions = prepared.spec, prepared.factory, prepared.sessions
    strategy = strategy_for(spec)
    cores = len(os.sched_getaffinity(0))
    mode = spec.client_tokenize
    count = token_counter(factory.tokenizer) if mode == "inflight" else None
    executor = (ThreadPoolExecutor(max_workers=cores, thread_name_prefix="client-tokenize")
                if mode == "inflight" else None)
    with frozen_setup():  # entered before cpu0: its collection is set-up, not load
        cpu0, wall0 = time.process_time(), time.monotonic()
        try:
            async with StreamingClient(base_url, model, max_connections=strategy.slots,
                                       count_tokens=count, executor=executor) as client:
                generator = LoadGenerator(client, strategy, factory.render, keep_prompts=mode == "after")
                result = await generator.run(sessions, window_s=spec.max_duration_s,
                                             timeout_s=spec.request_timeout_s, drain_s=spec.drain_s)
        finally:
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    run = WorkloadRun(
        records=result.records, client_cpu_s=cpu_s, wall_s=wall_s,
        warnings=diagnose(result, sessions, client_cpu_s=cpu_s, wall_s=wall_s, client_cores=cores),
        client_cores=cores, sessions_started=result.sessions_started,
        sessions_unstarted=result.sessions_unstarted, turns_unsent=result.turns_unsent,
        window_start_ns=result.start_ns, window_end_ns=result.window_end_ns)
    return Loaded(run, result)


# Prompts tokenized after a window (``client_tokenize: after``). On the H200's re-pinned grid (16 recorded
# agent sessions, 146 prompts of 10-14k tokens a window) tokenizing every prompt took 3.8 s per window, a fifth
# of the GPU-held time, spent between windows. Over those 21 windows, every 5th prompt (32 of 146) gave the
# window's cost per 1k tokens within 4.5% of all of them (sd 2.1%; 16 prompts: within 12%).
TOKENIZE_SAMPLE = 32


def tokenize_after(prepared: Prepared, loaded: Loaded, sample: int = TOKENIZE_SAMPLE) -> WorkloadRun:
    """With ``client_tokenize: after``: the run with the client-side token count and cost of a sample of its
    prompts, at most ``sample`` spread evenly over the window's records (every k-th); the others keep the
    loader's planned count and ``tokenize_ns`` 0, "not measured" (``workloads.metrics`` skips them).

    One prompt at a time on one thread, outside the measured span and its CPU time, so
    ``tokenize_ns`` is the single-core cost of that prompt, as a server frontend pays it."""
    if prepared.spec.client_tokenize != "after":
        return loaded.run
    count = token_counter(prepared.factory.tokenizer)
    return replace(loaded.run, records=_tokenize_after(loaded.result, count, sample))


async def run_workload(spec: AnyWorkload, *, base_url: str, model: str, tokenizer_path: str) -> WorkloadRun:
    """Replay ``spec`` against the OpenAI-compatible server at ``base_url`` serving ``model``:
    :func:`prepare`, :func:`load`, :func:`tokenize_after`, one after the other.

    Server failures are data (records with status timeout/error/cut); this raises only for
    a bad spec or trace (``TraceError``, ``ValueError``) or a missing tokenizer file.
    """
    # Off the event loop, so an async actor stays responsive, and outside the measured window.
    prepared = await asyncio.to_thread(prepare, spec, tokenizer_path)
    loaded = await load(prepared, base_url=base_url, model=model)
    return await asyncio.to_thread(tokenize_after, prepared, loaded)


def _tokenize_after(result: LoadResult, count: Callable[[str], int], sample: int) -> tuple[RequestRecord, ...]:
    step = max(1, math.ceil(len(result.records) / max(1, sample)))
    out = []
    for i, record in enumerate(result.records):
        if i % step == 0:
            n, ns = timed_count(count, result.prompt(record.request_id))
            record = replace(record, client_prompt_tokens=n, tokenize_ns=ns)
        out.append(record)
    return tuple(out)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: less CPU per request."""
    try:
        import uvloop  # optional: used when installed
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_workload_sync(spec: AnyWorkload, *, base_url: str, model: str, tokenizer_path: str) -> WorkloadRun:
    """``run_workload`` in a fresh event loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(run_workload(spec, base_url=base_url, model=model, tokenizer_path=tokenizer_path))


def load_sync(prepared: Prepared, *, base_url: str, model: str) -> Loaded:
    """:func:`load` in a fresh event loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(load(prepared, base_url=base_url, model=model))


__all__ = ["Loaded", "Prepared", "WorkloadRun", "diagnose", "frozen_setup", "load", "load_sync", "prepare", "run_workload",
           "run_workload_sync", "strategy_for", "tokenize_after", "TOKENIZE_SAMPLE"]
