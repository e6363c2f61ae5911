"""Streaming OpenAI-compatible client: sends one request and times every token.

This is the *how* of the load generator. It POSTs ``/v1/completions`` (a prompt string) or,
for a request with ``messages`` (recorded sessions), ``/v1/chat/completions``, with
streaming on, stamps each server-sent event with the injected clock, and returns a
``RequestRecord`` plus the answer text (agentic sessions append the real answer to the next
prompt). Both endpoints get the same forced length, sampling and ``stream_options``; only
the prompt field (``prompt`` vs ``messages``) and where chunk text lives (``choices[].text``
vs ``choices[].delta.content``) differ. The server applies the model's chat template, so a
chat request's tokenization cost includes rendering it, as in real agent serving.

Choices, and why:
  * Every limit is explicit. The connection pool equals the workload's concurrency, so
    aiohttp never queues a request internally, where the wait would hide inside TTFT.
    ``trust_env=False`` keeps an inherited ``HTTP_PROXY`` from routing localhost traffic.
  * The request forces the output length (``min_tokens`` = ``max_tokens``, a vLLM
    extension, plus ``ignore_eos``) so a trial's decode work does not depend on what a
    dummy-weight model happens to emit, and ``temperature: 0``. A structured-output turn
    sends its ``response_format`` instead of forcing the length (``structured.length_fields``).
  * ``stream_options.continuous_usage_stats`` makes vLLM put the cumulative completion
    token count on every chunk, so a chunk carrying k tokens is known to carry k. Each of
    those tokens is stamped with the chunk's arrival time: the client cannot see when the
    server produced them. Without per-chunk usage, a chunk with text counts as one token.
  * Cached prompt tokens come from the final usage chunk's
    ``prompt_tokens_details.cached_tokens``; vLLM sends it only when started with
    ``--enable-prompt-tokens-details``. Otherwise ``cached_tokens`` is None.
  * Entering the client opens its connections (``GET /v1/models`` on each), and a request
    body is JSON-encoded only where its session's prompt grew since the previous turn
    (``_BodyEncoder``): both would otherwise run on the event loop between a request's
    schedule and its send, as dispatch lag (ms for the 16 first turns of an agentic window, and
    0.25-0.5 ms for every 50-90 KB body, on the 2-core CPU machine).
  * One deadline per request (``asyncio.timeout``) bounds the whole exchange, so a stalled
    server yields a ``timeout`` record, never a hang. Server failures become records; the
    client raises only for cancellation.
  * Optional client-side tokenization runs in a worker thread while the request is in
    flight, so it costs client CPU, which is what it is measured for, without delaying the
    send. The counter must release the GIL (``text.token_counter`` does; a plain
    ``Tokenizer.encode`` does not, and would stall every stream for the whole encode).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor

import aiohttp

from .protocols import Clock, MonotonicClock, Request
from .records import RequestRecord, Status
from .structured import length_fields
from .text import timed_count
from .trace import Message, ResponseFormat

_READ_BUFSIZE = 1 << 20  # SSE events are small, but a long error body must not overflow readline
_ERROR_BODY_CHARS = 500
# Connections opened on entry at most: enough for a closed loop's sessions; an open loop's
# in-flight cap can be thousands, and its arrivals are spread out anyway.
_WARM_CONNECTIONS = 64
# JSON of sessions' last prompts kept for incremental encoding (_BodyEncoder).
_BODY_CACHE_BYTES = 64 << 20


class StreamingClient:
    """Async client for one OpenAI-compatible server; use as ``async with``.

    ``max_connections`` should equal the most requests the load generator keeps in flight.
    ``count_tokens`` (text -> tokens, e.g. ``text.token_counter(tokenizer)``) enables
    client-side tokenization in ``executor`` (None: the loop's default executor).
    """

    def __init__(self, base_url: str, model: str, *, max_connections: int,
                 clock: Clock | None = None, count_tokens: Callable[[str], int] | None = None,
                 executor: Executor | None = None, connect_timeout_s: float = 10.0,
                 keepalive_s: float = 75.0, continuous_usage: bool = True, warm: bool = True) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._url = base_url.rstrip("/") + "/v1/completions"
        self._chat_url = base_url.rstrip("/") + "/v1/chat/completions"
        self._models_url = base_url.rstrip("/") + "/v1/models"
        self._model = model
        self._max_connections = max_connections
        self._clock = clock or MonotonicClock()
        self._count_tokens = count_tokens
        self._executor = executor
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._warm = warm
        self._bodies = _BodyEncoder(model, continuous_usage=continuous_usage, sessions=max_connections)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamingClient:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=self._max_connections,
            keepalive_timeout=self._keepalive_s, force_close=False, ttl_dns_cache=300)
        # Only connection setup has an aiohttp timeout; the per-request deadline in send()
        # bounds everything else, so there is exactly one place that decides "timeout".
        timeout = aiohttp.ClientTimeout(total=None, connect=None,
                                        sock_connect=self._connect_timeout_s, sock_read=None)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                              read_bufsize=_READ_BUFSIZE, raise_for_status=False)
        if self._warm:
            await self._open_connections(min(self._max_connections, _WARM_CONNECTIONS))
        return self

    async def _open_connections(self, n: int) -> None:
        """Open ``n`` keep-alive connections now, with as many concurrent ``GET /v1/models``.

        Why: a load's first requests are sent together (every session of a closed loop at the
        window's start). On an empty pool each one would open its TCP connection on the event
        loop while the others wait to be sent (0.5-1 ms each on the 2-core CPU machine), which
        is their dispatch lag, and its own connection set-up would land in its TTFT. Best effort:
        answers are ignored and failures are left to the first real request, which records them.
        """
        assert self._session is not None
        session = self._session

        async def one() -> None:
            async with session.get(self._models_url) as resp:
                await resp.read()

        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
        except TimeoutError:
            pass

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def send(self, request: Request) -> tuple[RequestRecord, str]:
        """Send ``request``, stream the answer, and return ``(record, answer_text)``."""
        if self._session is None:
            raise RuntimeError("StreamingClient must be entered (async with) before send()")
        clock = self._clock
        body = self._bodies.encode(request)
        chat = request.messages is not None
        sent_ns = clock.now_ns()
        deadline_ns = sent_ns + int(request.timeout_s * 1e9)
        limit_ns = deadline_ns if request.cut_ns is None else min(deadline_ns, request.cut_ns)
        limit_status: Status = "cut" if request.cut_ns is not None and request.cut_ns < deadline_ns else "timeout"

        tokenize = None
        if self._count_tokens is not None:
            tokenize = asyncio.get_running_loop().run_in_executor(
                self._executor, timed_count, self._count_tokens, request.prompt)

        st = _StreamState(chat)
        status: Status = "ok"
        error: str | None = None
        cm = asyncio.timeout((limit_ns - clock.now_ns()) / 1e9)
        try:
            async with cm:
                await self._exchange(self._chat_url if chat else self._url, body, st)
        except TimeoutError as exc:
            if cm.expired():
                status, error = limit_status, f"no complete answer within {(limit_ns - sent_ns) / 1e9:.3f} s"
            else:  # aiohttp's own connect timeout
                status, error = "error", f"{type(exc).__name__}: {exc}"
        except _ServerError as exc:
            status, error = "error", str(exc)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            status, error = "error", f"{type(exc).__name__}: {exc}"
        end_ns = clock.now_ns()

        client_tokens, tokenize_ns = request.planned_prompt_tokens, 0
        if tokenize is not None:
            client_tokens, tokenize_ns = await tokenize
        record = RequestRecord(
            request_id=request.request_id, session_id=request.session_id, turn=request.turn,
            scheduled_ns=request.scheduled_ns, sent_ns=sent_ns,
            first_token_ns=st.token_ns[0] if st.token_ns else None, token_ns=tuple(st.token_ns),
            end_ns=end_ns,
            prompt_tokens=st.prompt_tokens if st.prompt_tokens is not None else client_tokens,
            completion_tokens=st.completion_tokens if st.completion_tokens is not None else len(st.token_ns),
            cached_tokens=st.cached_tokens, client_prompt_tokens=client_tokens, tokenize_ns=tokenize_ns,
            status=status, error=error, recorded_prompt_tokens=request.recorded_prompt_tokens,
            response_schema=request.response_schema)
        return record, "".join(st.text)

    async def _exchange(self, url: str, body: bytes, st: _StreamState) -> None:
        assert self._session is not None
        async with self._session.post(url, data=body,
                                      headers={"Content-Type": "application/json"}) as resp:
            if resp.status >= 400:
                detail = (await resp.text(errors="replace"))[:_ERROR_BODY_CHARS]
                raise _ServerError(f"HTTP {resp.status}: {detail}")
            buf = b""
            async for data in resp.content.iter_any():
                now = self._clock.now_ns()
                buf += data.replace(b"\r\n", b"\n") if b"\r" in data else data
                # SSE events end with a blank line; one read may hold several events or a part of one.
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    if st.feed(event, now):
                        return
            raise _ServerError("stream ended without [DONE]")


class _BodyEncoder:
    """JSON request bodies, encoding only what a session appended since its previous request.

    Why: a turn's prompt is its session's whole context, 50-90 KB for the agentic loads, and
    ``json.dumps`` of it took 0.25-0.5 ms on the 2-core CPU machine, all of it dispatch lag
    (the body is built between the schedule and the send). A session's prompt (or message
    list) nearly always extends its previous one, and JSON string escaping is per character,
    so the escaped previous prompt plus the escaped new text is the escaped whole: byte for byte
    the body ``json.dumps`` gives. The extension is checked (``startswith``, or the earlier
    messages compared), so any other prompt is encoded whole.

    One entry per session, least recently used dropped first, at most ``sessions`` entries
    (sessions in flight are at most the client's connections) and ``_BODY_CACHE_BYTES`` in all.
    """

    def __init__(self, model: str, *, continuous_usage: bool, sessions: int) -> None:
        self._text_head = b'{"model": ' + json.dumps(model).encode() + b', "prompt": "'
        self._chat_head = b'{"model": ' + json.dumps(model).encode() + b', "messages": ['
        stream_options = {"include_usage": True}
        if continuous_usage:
            stream_options["continuous_usage_stats"] = True
        self._stream_options = stream_options
        self._tails: dict[tuple[int, str | None], bytes] = {}
        self._sessions = max(1, sessions)
        # session id -> (the prompt or messages sent last, their JSON: the escaped prompt
        # without quotes, or the message objects without brackets)
        self._cache: OrderedDict[str, tuple[str | tuple[Message, ...], bytes]] = OrderedDict()
        self._bytes = 0

    def encode(self, request: Request) -> bytes:
        """The body ``json.dumps`` would give for ``request`` (same keys, order and separators)."""
        tail = self._tail(request.max_tokens, request.response_format)
        if request.messages is None:
            return b"".join((self._text_head, self._encoded(request.session_id, request.prompt), b'"', tail))
        return b"".join((self._chat_head, self._encoded(request.session_id, request.messages), b"]", tail))

    def _tail(self, max_tokens: int, fmt: ResponseFormat | None) -> bytes:
        key = (max_tokens, fmt.json if fmt is not None else None)
        if (tail := self._tails.get(key)) is None:
            rest = json.dumps({**length_fields(max_tokens, fmt), "temperature": 0, "stream": True,
                               "stream_options": self._stream_options})
            tail = self._tails[key] = b", " + rest[1:].encode()
        return tail

    def _encoded(self, session_id: str, value: str | tuple[Message, ...]) -> bytes:
        cached = self._cache.pop(session_id, None)
        if cached is not None:
            self._bytes -= len(cached[1])
        encoded = _encode(value, cached)
        self._cache[session_id] = (value, encoded)
        self._bytes += len(encoded)
        while len(self._cache) > self._sessions or (self._bytes > _BODY_CACHE_BYTES and len(self._cache) > 1):
            self._bytes -= len(self._cache.popitem(last=False)[1][1])
        return encoded


def _encode(value: str | tuple[Message, ...],
            cached: tuple[str | tuple[Message, ...], bytes] | None) -> bytes:
    """JSON of ``value`` (an escaped string without quotes, or messages without brackets),
    reusing ``cached`` (an earlier value and its JSON) when ``value`` extends it."""
    if isinstance(value, str):
        if cached is not None and isinstance(cached[0], str) and value.startswith(cached[0]):
            return cached[1] + json.dumps(value[len(cached[0]):])[1:-1].encode()
        return json.dumps(value)[1:-1].encode()
    done, start = b"", 0
    if cached is not None and isinstance(cached[0], tuple) and value[:len(cached[0])] == cached[0]:
        done, start = cached[1], len(cached[0])
    new = b", ".join(json.dumps({"role": m.role, "content": m.content}).encode() for m in value[start:])
    return done + b", " + new if done and new else done or new


class _ServerError(Exception):
    """A failure reported by the server (HTTP status, error event, malformed stream)."""


class _StreamState:
    """Accumulates one stream's facts; ``feed`` returns True at ``[DONE]``.

    ``chat``: chunk text is in ``choices[].delta.content`` (chat completions), else in
    ``choices[].text``. A chat stream's first chunk carries only the role, no text.
    """

    __slots__ = ("chat", "text", "token_ns", "prompt_tokens", "completion_tokens", "cached_tokens", "_cum")

    def __init__(self, chat: bool = False) -> None:
        self.chat = chat
        self.text: list[str] = []
        self.token_ns: list[int] = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._cum = 0  # cumulative completion tokens seen in per-chunk usage

    def feed(self, event: bytes, now_ns: int) -> bool:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments (":"), "event:" and "id:" fields carry nothing we use
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return True
            try:
                # SSE is UTF-8 by definition: decoding first skips json's encoding detection,
                # a quarter of the parse time of a usage-carrying chunk. Bad UTF-8 is a ValueError.
                obj = json.loads(payload.decode())
            except ValueError as exc:
                raise _ServerError(f"malformed SSE data: {payload[:100]!r}") from exc
            if not isinstance(obj, dict):
                raise _ServerError(f"SSE data is not an object: {payload[:100]!r}")
            if "error" in obj and not obj.get("choices"):
                raise _ServerError(f"server error event: {str(obj['error'])[:_ERROR_BODY_CHARS]}")
            try:
                self._take(obj, now_ns)
            except (TypeError, ValueError, AttributeError) as exc:
                raise _ServerError(f"unexpected chunk shape: {exc}: {payload[:100]!r}") from exc
        return False

    def _take(self, obj: dict, now_ns: int) -> None:
        choices = obj.get("choices") or []
        usage = obj.get("usage")
        new_tokens = 0
        for choice in choices:
            text = ((choice.get("delta") or {}).get("content") if self.chat else choice.get("text")) or ""
            if text:
                self.text.append(text)
            if usage is None:
                new_tokens += 1 if text else 0
        if choices and usage is not None:
            # Per-chunk (continuous) usage: tokens in this chunk = growth of the cumulative count.
            cum = int(usage.get("completion_tokens") or 0)
            new_tokens, self._cum = max(0, cum - self._cum), max(cum, self._cum)
        self.token_ns.extend([now_ns] * new_tokens)
        if usage is not None:
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = int(usage["prompt_tokens"])
            if not choices and usage.get("completion_tokens") is not None:
                self.completion_tokens = int(usage["completion_tokens"])  # the final usage chunk
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                self.cached_tokens = int(details["cached_tokens"])


__all__ = ["StreamingClient"]
