"""The seams between *when*, *how* and *what happened*: a clock, a request, a backend.

The load generator (``loadgen``, decides *when*) and the HTTP client (``client``, decides
*how*) never import each other; both depend on these small types instead. Tests swap the
clock for a virtual one and the client for a fake, so scheduling logic is tested in
milliseconds without a server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from .records import RequestRecord
from .trace import Message, ResponseFormat


class Clock(Protocol):
    """Monotonic time in integer nanoseconds, and a way to wait for a point in it."""

    def now_ns(self) -> int: ...

    async def sleep_until_ns(self, t_ns: int) -> None: ...


class MonotonicClock:
    """The real clock: ``time.monotonic_ns`` and the running event loop's timers.

    asyncio's loop time is ``time.monotonic()``, the same clock. Loop timers have about
    1 ms resolution (epoll and libuv time out in whole milliseconds), so a request can be
    sent up to ~1 ms after its schedule without the client being busy; dispatch-lag
    warnings allow for that. It is never sent early.
    """

    def now_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep_until_ns(self, t_ns: int) -> None:
        # Loop, because uvloop's timers can fire early: libuv rounds delays to whole ms
        # against a cached loop time. The stdlib loop never fires early, so it sleeps once.
        while (delay := (t_ns - time.monotonic_ns()) / 1e9) > 0:
            await asyncio.sleep(delay)


@dataclass(frozen=True, slots=True)
class Request:
    """Everything the backend needs to send and time one turn.

    ``timeout_s``: the request is a *timeout* once this long has passed since it was sent.
    ``cut_ns``: absolute time past which the request is *cut* (end of the drain period after
    the measurement window), or None to let it run to its deadline.
    ``planned_prompt_tokens``: the loader's token count for the prompt, the fallback when
    neither the server nor a client tokenizer reports one.
    ``messages``: set for a chat request (sent to ``/v1/chat/completions``). ``prompt`` then
    holds the messages as a transcript (``chat_transcript``), which is what client-side
    tokenization counts, since there is no single prompt string on the client.
    ``recorded_prompt_tokens``: the recording's prompt count, copied into the record.
    ``response_format``: the turn's structured-output constraint (``max_tokens`` is then a cap, not forced).
    """

    request_id: str
    session_id: str
    turn: int
    prompt: str
    max_tokens: int
    scheduled_ns: int
    timeout_s: float
    cut_ns: int | None
    planned_prompt_tokens: int
    messages: tuple[Message, ...] | None = None
    recorded_prompt_tokens: int | None = None
    response_format: ResponseFormat | None = None

    @property
    def response_schema(self) -> str | None:
        """The tool whose arguments the answer is constrained to (the record's ``response_schema``), or None."""
        return self.response_format.name if self.response_format is not None else None


def chat_transcript(messages: tuple[Message, ...] | list[Message]) -> str:
    """The text of chat messages as the client counts it: ``role\ncontent\n\n`` per message.

    Why this form: it holds every character of content the server's tokenizer sees, so
    client-side counts and tokenization times track the server's, short of the chat
    template's few special tokens per message; and the transcript of a session's turn k is
    a prefix of turn k+1's (the history only grows), which ``LoadResult.prompt`` relies on.
    """
    return "".join(f"{m.role}\n{m.content}\n\n" for m in messages)


class Backend(Protocol):
    """Sends one request and times it. Must never raise for a server failure: a refused
    connection, an HTTP error or a stall become a record with status error/timeout."""

    async def send(self, request: Request) -> tuple[RequestRecord, str]:
        """Return the record and the answer text received (possibly partial)."""
        ...


__all__ = ["Backend", "Clock", "MonotonicClock", "Request", "chat_transcript"]
