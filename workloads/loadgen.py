"""Load generation: *when* each turn is sent. The backend decides *how*; records say what happened.

Strategies:
  * ``OpenLoop``: every session arrives at its own ``start_s`` (trace timestamps, or Poisson
    arrivals from a loader), whatever the server's state. ``max_in_flight`` caps sessions at
    once so a collapsing server cannot exhaust sockets; a session held back by the cap keeps
    its planned arrival as its scheduled time, so the wait shows up as dispatch lag and in
    ``LoadResult.slot_waits``, never hidden inside TTFT.
  * ``ClosedLoop``: ``concurrency`` sessions in flight; a session without ``start_s`` starts
    when a slot frees (its scheduled time is then the moment the slot was granted).

Within a session turns are sequential: turn k+1 is scheduled ``think_s`` after turn k's
answer ended, and its prompt is the context so far plus the real answer (see
``workloads.trace``). A turn that did not end ``ok`` ends its session, because the next
prompt would lack a real answer (recorded sessions in trace mode follow the same rule, so
both modes stop at the same point when a server fails).

Chat sessions (recorded ones, ``Turn.messages``) keep their history as chat messages: each
turn appends its recorded messages, and after its answer an assistant message holding the
recorded ``assistant_text`` (trace mode) or the server's answer (live mode). The request's
``prompt`` is then the history's ``chat_transcript``, which is what ``keep_prompts``,
``LoadResult.prompt`` and client-side tokenization see.

The measurement window (decided here, and the only place it is decided):
  * A turn whose scheduled time is at or after ``window_end`` is not sent; it is counted in
    ``turns_unsent``, and sessions that never started in ``sessions_unstarted``.
  * A request already in flight at ``window_end`` runs to completion or to its own deadline
    (``timeout_s`` after it was sent), so tail latencies are not truncated. With ``drain_s``
    set, requests still in flight at ``window_end + drain_s`` end with status ``cut``.
  * Every request that was sent yields exactly one record, even if the backend breaks its
    never-raise contract (the load generator then writes an ``error`` record itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .protocols import Backend, Clock, MonotonicClock, Request, chat_transcript
from .records import RequestRecord
from .trace import Block, Message, Session, Turn

Renderer = Callable[[Iterable[Block]], str]


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Sessions arrive at their ``start_s`` offsets; at most ``max_in_flight`` run at once."""

    max_in_flight: int

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")

    @property
    def slots(self) -> int:
        return self.max_in_flight

    def check(self, sessions: Sequence[Session]) -> None:
        missing = [s.session_id for s in sessions if s.start_s is None]
        if missing:
            raise ValueError(f"open loop needs start_s on every session; missing on {missing[:3]}")


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``concurrency`` sessions at once; sessions start as slots free (not before ``start_s`` if set)."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")

    @property
    def slots(self) -> int:
        return self.concurrency

    def check(self, sessions: Sequence[Session]) -> None:
        return None


Strategy = OpenLoop | ClosedLoop


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Records in schedule order, plus what the window and the slots held back."""

    records: tuple[RequestRecord, ...]
    start_ns: int
    window_end_ns: int
    sessions_started: int
    sessions_unstarted: int
    turns_unsent: int  # not sent: past the window, or after a failed turn of their session
    slot_waits: int  # sessions that found every slot busy at their arrival
    # With keep_prompts: each session's longest sent prompt, and each request's prompt length
    # in characters. Every prompt of a session is a prefix of its later ones, so this holds
    # all prompts at the memory cost of the last one.
    contexts: dict[str, str] = field(default_factory=dict)
    prompt_chars: dict[str, tuple[str, int]] = field(default_factory=dict)

    def prompt(self, request_id: str) -> str:
        """The exact prompt sent for ``request_id`` (needs ``keep_prompts``); for a chat
        request, the transcript of its messages (``protocols.chat_transcript``)."""
        session_id, chars = self.prompt_chars[request_id]
        return self.contexts[session_id][:chars]


class LoadGenerator:
    """Runs sessions against a backend under one strategy, with an injected clock."""

    def __init__(self, backend: Backend, strategy: Strategy, render: Renderer, *,
                 clock: Clock | None = None, keep_prompts: bool = False) -> None:
        self._backend = backend
        self._strategy = strategy
        self._render = render
        self._clock = clock or MonotonicClock()
        self._keep_prompts = keep_prompts

    async def run(self, sessions: Sequence[Session], *, window_s: float, timeout_s: float,
                  drain_s: float | None = None) -> LoadResult:
        """Replay ``sessions`` for ``window_s`` seconds; return once every sent request has a record."""
        self._strategy.check(sessions)
        clock = self._clock
        start_ns = clock.now_ns()
        state = _RunState(
            start_ns=start_ns, window_end_ns=start_ns + int(window_s * 1e9),
            cut_ns=None if drain_s is None else start_ns + int((window_s + drain_s) * 1e9),
            timeout_s=timeout_s, slots=asyncio.Semaphore(self._strategy.slots))
        # Open-loop arrivals must be dispatched in time order; closed-loop sessions keep
        # the loader's order (sorted() is stable, and start_s None sorts as 0).
        ordered = sorted(sessions, key=lambda s: s.start_s or 0.0)
        async with asyncio.TaskGroup() as group:
            for i, session in enumerate(ordered):
                # Render before waiting, so building the prompt does not count as lag.
                history = _ChatHistory() if session.is_chat else _TextHistory(self._render)
                history.extend(session.turns[0])
                planned = None if session.start_s is None else start_ns + int(session.start_s * 1e9)
                if planned is not None:
                    await clock.sleep_until_ns(planned)
                if (planned if planned is not None else clock.now_ns()) >= state.window_end_ns:
                    state.unstarted(ordered[i:])
                    break
                if planned is not None and state.slots.locked():
                    state.slot_waits += 1  # only planned arrivals can be late; closed loop waits by design
                await state.slots.acquire()
                scheduled = planned if planned is not None else clock.now_ns()
                if planned is None and scheduled >= state.window_end_ns:
                    state.slots.release()
                    state.unstarted(ordered[i:])
                    break
                state.sessions_started += 1
                group.create_task(self._run_session(session, history, scheduled, state))
                # Let the session send its first turn now, before the next session's text is
                # rendered: otherwise every session scheduled at the window's start waits for
                # the rendering and sending of all the others, and that queue shows up as their
                # dispatch lag (the 16 first turns of an agentic window: ms each).
                await asyncio.sleep(0)
        records = sorted(state.records, key=lambda r: (r.scheduled_ns, r.request_id))
        return LoadResult(records=tuple(records), start_ns=start_ns, window_end_ns=state.window_end_ns,
                          sessions_started=state.sessions_started,
                          sessions_unstarted=state.sessions_unstarted,
                          turns_unsent=state.turns_unsent, slot_waits=state.slot_waits,
                          contexts=state.contexts, prompt_chars=state.prompt_chars)

    async def _run_session(self, session: Session, history: _TextHistory | _ChatHistory, scheduled_ns: int,
                           state: _RunState) -> None:
        clock = self._clock
        try:
            for k, turn in enumerate(session.turns):
                if k > 0:
                    history.extend(turn)
                # Built before the turn is scheduled: assembling the workload's text is not
                # sending it, so it is no part of the dispatch lag (a 50-90 KB context: 10-20 us).
                prompt, messages = history.prompt()
                planned = session.planned_prompt_tokens(k)
                if k > 0:
                    scheduled_ns = clock.now_ns() + int(turn.think_s * 1e9)
                    if scheduled_ns >= state.window_end_ns:
                        state.turns_unsent += len(session.turns) - k
                        return
                    await clock.sleep_until_ns(scheduled_ns)
                request = Request(
                    request_id=f"{session.session_id}:{k}", session_id=session.session_id, turn=k,
                    prompt=prompt, max_tokens=turn.output_tokens, scheduled_ns=scheduled_ns,
                    timeout_s=state.timeout_s, cut_ns=state.cut_ns, planned_prompt_tokens=planned,
                    messages=messages, recorded_prompt_tokens=turn.recorded_prompt_tokens,
                    response_format=turn.response_format)
                record, answer = await self._send(request)
                state.records.append(record)
                if self._keep_prompts:
                    state.contexts[session.session_id] = prompt
                    state.prompt_chars[request.request_id] = (session.session_id, len(prompt))
                if record.status != "ok":
                    state.turns_unsent += len(session.turns) - k - 1
                    return
                history.answer(turn, answer)
        finally:
            state.slots.release()

    async def _send(self, request: Request) -> tuple[RequestRecord, str]:
        sent_ns = self._clock.now_ns()
        try:
            return await self._backend.send(request)
        except Exception as exc:  # noqa: BLE001 - the backend broke its contract; keep the record
            return RequestRecord(
                request_id=request.request_id, session_id=request.session_id, turn=request.turn,
                scheduled_ns=request.scheduled_ns, sent_ns=sent_ns, first_token_ns=None, token_ns=(),
                end_ns=self._clock.now_ns(), prompt_tokens=request.planned_prompt_tokens,
                completion_tokens=0, cached_tokens=None, client_prompt_tokens=request.planned_prompt_tokens,
                tokenize_ns=0, status="error", error=f"backend raised {type(exc).__name__}: {exc}",
                recorded_prompt_tokens=request.recorded_prompt_tokens,
                response_schema=request.response_schema), ""


class _TextHistory:
    """A block session's context: rendered appends and the server's answers, as one string."""

    __slots__ = ("_render", "_parts")

    def __init__(self, render: Renderer) -> None:
        self._render = render
        self._parts: list[str] = []

    def extend(self, turn: Turn) -> None:
        self._parts.append(self._render(turn.append))

    def prompt(self) -> tuple[str, None]:
        return (self._parts[0] if len(self._parts) == 1 else "".join(self._parts)), None

    def answer(self, turn: Turn, text: str) -> None:
        self._parts.append(text)


class _ChatHistory:
    """A chat session's context: the messages so far, and their transcript for the record."""

    __slots__ = ("_messages", "_parts")

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._parts: list[str] = []

    def extend(self, turn: Turn) -> None:
        assert turn.messages is not None
        self._messages.extend(turn.messages)
        self._parts.append(chat_transcript(turn.messages))

    def prompt(self) -> tuple[str, tuple[Message, ...]]:
        return "".join(self._parts), tuple(self._messages)

    def answer(self, turn: Turn, text: str) -> None:
        # Trace mode: the recorded answer, so every later prompt is the recorded one.
        message = Message("assistant", turn.recorded_answer if turn.recorded_answer is not None else text)
        self._messages.append(message)
        self._parts.append(chat_transcript((message,)))


@dataclass(slots=True)
class _RunState:
    start_ns: int
    window_end_ns: int
    cut_ns: int | None
    timeout_s: float
    slots: asyncio.Semaphore
    records: list[RequestRecord] = field(default_factory=list)
    sessions_started: int = 0
    sessions_unstarted: int = 0
    turns_unsent: int = 0
    slot_waits: int = 0
    contexts: dict[str, str] = field(default_factory=dict)
    prompt_chars: dict[str, tuple[str, int]] = field(default_factory=dict)

    def unstarted(self, sessions: Sequence[Session]) -> None:
        self.sessions_unstarted += len(sessions)
        self.turns_unsent += sum(len(s.turns) for s in sessions)


__all__ = ["ClosedLoop", "LoadGenerator", "LoadResult", "OpenLoop", "Strategy"]
