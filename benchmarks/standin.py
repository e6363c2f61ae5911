"""A STAND-IN for a vLLM server (not vLLM): it emulates latency and serves no model.

Why it exists: the orchestrator's scaling benchmark simulates 8-16 nodes on one small
machine, which cannot run that many real vLLM-CPU replicas. This process answers the HTTP
surface the project uses, shaped as vLLM 0.2x-0.3x answers it, so ``workloads.client``,
``workloads.bare``, ``Replica.wait_healthy``, ``node.reset_prefix_cache`` and
``telemetry.scrape`` work against it unchanged. It is used ONLY by that benchmark and is
never a default anywhere; every answer says what it is (the ``x-standin: 1`` header,
``owned_by`` in ``/v1/models``, a ``standin_info`` metric, and its log lines).

What it emulates, and what it does not:
  * Start-up: it sleeps ``--startup-s`` before binding the port (vLLM loads and compiles
    first), then prints ``stand-in server (not vLLM) ready on http://HOST:PORT``.
  * An **unsaturated** server: every request is its own asyncio task, with no scheduler,
    batch or queue, so N requests in flight each see the configured TTFT. Token k
    (0-based) is due at ``arrival + ttft + k * tpot``, on an absolute schedule so delays do
    not accumulate; tokens already due when the loop gets round to a request (an overloaded
    host) go out in one chunk, as vLLM's API server coalesces outputs when it lags, and
    per-chunk usage says how many. Nothing depends on the prompt length or the number of
    cores; measuring that is what real vLLM is for.
  * Output: the fixed word ``" tok"`` per token. No EOS is emitted unless ``--eos-after N``
    is given; then a request without ``ignore_eos`` stops (``finish_reason: "stop"``) after
    ``max(N, min_tokens)`` tokens, if that is below its ``max_tokens``.
  * Prompt tokens: the count of the token ids when the prompt is token ids; otherwise an
    estimate of ``ceil(characters / 4)`` (the usual rule of thumb for English BPE text), plus
    4 template tokens per chat message. No tokenizer is loaded: that CPU cost is not emulated.
  * No prefix cache: ``prompt_tokens_details.cached_tokens`` is always 0, prefix-cache hits
    are 0, and ``POST /reset_prefix_cache`` always answers ``{"success": true}``.

Run: ``python benchmarks/standin.py --host 127.0.0.1 --port PORT --model NAME
[--startup-s S] [--ttft-ms T] [--tpot-ms D] [--max-model-len N] [--eos-after N]``.
SIGTERM or SIGINT stops it with exit status 0 (also during the emulated start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("standin")

WORD = " tok"  # the text of every generated token
CHARS_PER_TOKEN = 4  # prompt-length estimate for text prompts
CHAT_TOKENS_PER_MESSAGE = 4  # chat-template special tokens per message (role header, end of turn)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default; chat defaults to the rest of the context
SHUTDOWN_GRACE_S = 1.0  # in-flight streams get this long at SIGTERM, then they are cancelled
# vLLM's own bucket bounds (vllm/v1/metrics/buckets.py), so quantiles read as coarse as on a real replica.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class StandinConfig:
    """What the stand-in emulates (see the module docstring); times in seconds."""

    model: str
    ttft_s: float = 0.1
    tpot_s: float = 0.02
    max_model_len: int = 32768
    eos_after: int = 0  # 0: never emits EOS


class BadRequest(Exception):
    """A request vLLM would refuse; answered as vLLM's ``{"error": {...}}`` body."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def response(self) -> web.Response:
        body = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}
        return web.json_response(body, status=self.status)


@dataclass(frozen=True)
class Job:
    """One parsed generation request."""

    chat: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_tokens: int
    tokens: int  # how many tokens this request will get
    finish_reason: str


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / CHARS_PER_TOKEN)``: the stand-in's prompt length for text."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """Prompt tokens of a request: token ids are counted, text is estimated (module docstring)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        total = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: count the text ones
                content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
            total += estimate_tokens(content or "") + CHAT_TOKENS_PER_MESSAGE
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return estimate_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    raise BadRequest("the stand-in serves one prompt per request: a string or a list of token ids",
                     param="prompt")


def plan(body: Any, chat: bool, cfg: StandinConfig) -> Job:
    """Validate ``body`` as vLLM would (model, context length) and decide the output length."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("model") not in (None, cfg.model):
        raise BadRequest(f"The model `{body['model']}` does not exist.", 404, "NotFoundError", "model")
    if (body.get("n") or 1) != 1:
        raise BadRequest("the stand-in serves n=1 only", param="n")
    n_prompt = prompt_tokens(body, chat)
    if n_prompt >= cfg.max_model_len:
        raise BadRequest(f"This model's maximum context length is {cfg.max_model_len} tokens. However, your "
                         f"request has {n_prompt} input tokens. Please reduce the length of the input.")
    requested = body.get("max_completion_tokens") if chat else None
    requested = requested if requested is not None else body.get("max_tokens")
    if requested is None:
        requested = COMPLETIONS_DEFAULT_MAX_TOKENS if not chat else cfg.max_model_len - n_prompt
    if not isinstance(requested, int) or requested < 1:
        raise BadRequest(f"max_tokens must be an integer >= 1, got {requested!r}", param="max_tokens")
    if n_prompt + requested > cfg.max_model_len:
        raise BadRequest(f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                         f"requested {n_prompt + requested} tokens ({n_prompt} in the input, {requested} in "
                         "the completion). Please reduce the length of the input or completion.")
    tokens, finish = requested, "length"
    if cfg.eos_after > 0 and not body.get("ignore_eos", False):
        stop_at = max(cfg.eos_after, int(body.get("min_tokens") or 0))
        if stop_at < requested:
            tokens, finish = stop_at, "stop"
    options = body.get("stream_options") or {}
    include_usage = bool(options.get("include_usage"))
    return Job(chat=chat, stream=bool(body.get("stream", False)), include_usage=include_usage,
               continuous_usage=include_usage and bool(options.get("continuous_usage_stats")),
               prompt_tokens=n_prompt, tokens=tokens, finish_reason=finish)


class StandinMetrics:
    """vLLM's metric names, with the stand-in's real counts, in a private registry.

    Labels are vLLM's (``model_name``, ``engine="0"``). Running counts requests between
    arrival and end; waiting is always 0 (nothing queues); prompt tokens and prefix-cache
    queries (in tokens, as vLLM counts them) are added when the first token goes out;
    hits and preemptions stay 0. Histograms: TTFT, inter-token latency, e2e, queue (0),
    prefill (= TTFT) and decode (e2e - TTFT).
    """

    def __init__(self, cfg: StandinConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        names, values = ["model_name", "engine"], [cfg.model, "0"]
        r = self.registry

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, names, registry=r, buckets=buckets).labels(*values)

        info = Gauge("standin_info", "This server is benchmarks/standin.py, a latency stand-in, not vLLM.",
                     ["model_name", "ttft_s", "tpot_s"], registry=r)
        info.labels(cfg.model, str(cfg.ttft_s), str(cfg.tpot_s)).set(1)
        self.running = Gauge("vllm:num_requests_running", "Requests in flight (stand-in).", names,
                             registry=r).labels(*values)
        self.waiting = Gauge("vllm:num_requests_waiting", "Always 0: the stand-in never queues.", names,
                             registry=r).labels(*values)
        self.waiting.set(0)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens (stand-in estimate or id count).")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens (stand-in).")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix-cache queries, in tokens (stand-in).")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Always 0: the stand-in has no prefix cache.")
        self.preemptions = counter("vllm:num_preemptions", "Always 0: the stand-in never preempts.")
        self._success = Counter("vllm:request_success", "Finished requests (stand-in).", names + ["finished_reason"],
                                registry=r)
        self._values = values
        self.ttft = histogram("vllm:time_to_first_token_seconds", "TTFT (stand-in).", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Inter-token latency (stand-in).", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End to end (stand-in).", REQUEST_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds", "Always 0 (stand-in).", REQUEST_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds", "= TTFT (stand-in).", REQUEST_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds", "e2e - TTFT (stand-in).", REQUEST_BUCKETS)

    def first_token(self, job: Job, ttft_s: float) -> None:
        self.prompt_tokens.inc(job.prompt_tokens)
        self.prefix_queries.inc(job.prompt_tokens)
        self.ttft.observe(ttft_s)
        self.queue.observe(0.0)
        self.prefill.observe(ttft_s)

    def finished(self, finish_reason: str, ttft_s: float, e2e_s: float) -> None:
        self._success.labels(*self._values, finish_reason).inc()
        self.e2e.observe(e2e_s)
        self.decode.observe(max(0.0, e2e_s - ttft_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    """Sleep until loop time ``when``; loops so that a timer firing early never shortens a delay."""
    while (delay := when - loop.time()) > 0:
        await asyncio.sleep(delay)


class Standin:
    """The stand-in's handlers and state; :meth:`app` builds the aiohttp application."""

    def __init__(self, cfg: StandinConfig) -> None:
        self.cfg = cfg
        self.metrics = StandinMetrics(cfg)
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)  # long agentic prompts
        app.on_response_prepare.append(_mark_standin)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.cfg.model, "object": "model", "created": self.created,
                "owned_by": "stand-in (benchmarks/standin.py, not vLLM)", "root": self.cfg.model, "parent": None,
                "max_model_len": self.cfg.max_model_len, "permission": []}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_page(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.render())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        log.info("stand-in: reset_prefix_cache (it has no prefix cache)")
        return web.json_response({"success": True})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        try:
            try:
                body = json.loads(await request.read())
            except ValueError as exc:
                raise BadRequest(f"the request body is not JSON: {exc}") from None
            job = plan(body, chat, self.cfg)
        except BadRequest as exc:
            return exc.response()
        prefix = "chatcmpl-" if chat else "cmpl-"
        head = {"id": prefix + uuid.uuid4().hex, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.cfg.model}
        self.metrics.running.inc()
        try:
            if job.stream:
                return await self._stream(request, job, head, arrival)
            return await self._whole(job, head, arrival)
        finally:
            self.metrics.running.dec()

    def _usage(self, job: Job, completion: int, final: bool) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens + completion,
                                 "completion_tokens": completion}
        if final:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    async def _whole(self, job: Job, head: dict[str, Any], arrival: float) -> web.Response:
        loop = asyncio.get_running_loop()
        cfg, m = self.cfg, self.metrics
        await sleep_until(loop, arrival + cfg.ttft_s)
        ttft = loop.time() - arrival
        m.first_token(job, ttft)
        await sleep_until(loop, arrival + cfg.ttft_s + (job.tokens - 1) * cfg.tpot_s)
        m.generation_tokens.inc(job.tokens)
        if job.tokens > 1:
            gap = (loop.time() - arrival - ttft) / (job.tokens - 1)
            for _ in range(job.tokens - 1):
                m.itl.observe(gap)
        text = WORD * job.tokens
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": job.finish_reason,
                                  "stop_reason": None}
        if job.chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        body = {**head, "object": "chat.completion" if job.chat else "text_completion", "choices": [choice],
                "usage": self._usage(job, job.tokens, final=True)}
        m.finished(job.finish_reason, ttft, loop.time() - arrival)
        return web.json_response(body)

    async def _stream(self, request: web.Request, job: Job, head: dict[str, Any],
                      arrival: float) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        cfg, m = self.cfg, self.metrics
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps({**head, **obj}, separators=(",", ":")).encode() + b"\n\n")

        emitted, ttft, last = 0, 0.0, arrival
        try:
            while emitted < job.tokens:
                await sleep_until(loop, arrival + cfg.ttft_s + emitted * cfg.tpot_s)
                now = loop.time()
                due = job.tokens if cfg.tpot_s <= 0 else int((now - arrival - cfg.ttft_s) / cfg.tpot_s) + 1
                k = min(job.tokens, max(emitted + 1, due)) - emitted
                if emitted == 0:
                    ttft = now - arrival
                    m.first_token(job, ttft)
                    if job.chat:  # vLLM's first chat chunk carries the role only, sent with the first output
                        role: dict[str, Any] = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                             "logprobs": None, "finish_reason": None}]}
                        if job.continuous_usage:
                            role["usage"] = self._usage(job, 0, final=False)
                        await send(role)
                else:
                    for _ in range(k):
                        m.itl.observe((now - last) / k)
                last = now
                emitted += k
                m.generation_tokens.inc(k)
                finish = job.finish_reason if emitted == job.tokens else None
                choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                if job.chat:
                    choice["delta"] = {"content": WORD * k}
                else:
                    choice["text"] = WORD * k
                chunk: dict[str, Any] = {"choices": [choice]}
                if job.continuous_usage:
                    chunk["usage"] = self._usage(job, emitted, final=False)
                await send(chunk)
            if job.include_usage:  # vLLM's last chunk: no choices, the request's usage
                await send({"choices": [], "usage": self._usage(job, emitted, final=True)})
            await resp.write(b"data: [DONE]\n\n")
            m.finished(job.finish_reason, ttft, loop.time() - arrival)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            log.debug("stand-in: client went away after %d of %d tokens", emitted, job.tokens)
        return resp


async def _mark_standin(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["x-standin"] = "1"


async def serve(host: str, port: int, cfg: StandinConfig, startup_s: float) -> int:
    """Emulate start-up, serve until SIGTERM or SIGINT, then stop; returns the exit status (0)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("stand-in server (not vLLM) starting: model %s, start-up %.2f s, ttft %.1f ms, tpot %.1f ms",
             cfg.model, startup_s, cfg.ttft_s * 1e3, cfg.tpot_s * 1e3)
    try:
        await asyncio.wait_for(stop.wait(), startup_s)
        log.info("stand-in server (not vLLM) stopped during its emulated start-up")
        return 0
    except TimeoutError:
        pass
    runner = web.AppRunner(Standin(cfg).app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"stand-in server (not vLLM) ready on http://{host}:{port}", flush=True)
        await stop.wait()
        log.info("stand-in server (not vLLM) stopping on a signal")
    finally:
        await runner.cleanup()
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python benchmarks/standin.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True, help="the model id to answer as")
    ap.add_argument("--startup-s", type=float, default=0.0, help="emulated start-up before binding (s)")
    ap.add_argument("--ttft-ms", type=float, default=100.0, help="time to first token (ms)")
    ap.add_argument("--tpot-ms", type=float, default=20.0, help="time per further output token (ms)")
    ap.add_argument("--max-model-len", type=int, default=32768, help="context length (prompt + output tokens)")
    ap.add_argument("--eos-after", type=int, default=0,
                    help="without ignore_eos, stop after max(N, min_tokens) tokens (0: never emit EOS)")
    args = ap.parse_args(argv)
    for name in ("startup_s", "ttft_ms", "tpot_ms", "eos_after"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.max_model_len < 2:
        ap.error("--max-model-len must be >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s stand-in %(levelname)s %(message)s")
    cfg = StandinConfig(model=args.model, ttft_s=args.ttft_ms / 1e3, tpot_s=args.tpot_ms / 1e3,
                        max_model_len=args.max_model_len, eos_after=args.eos_after)
    return asyncio.run(serve(args.host, args.port, cfg, args.startup_s))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BadRequest", "Job", "Standin", "StandinConfig", "StandinMetrics", "estimate_tokens", "main", "plan",
           "prompt_tokens", "serve"]
