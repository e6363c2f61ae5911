"""Sessions and turns: the in-memory workload that loaders produce and the load generator consumes.

Terms, defined once:
  * A *session* is one conversation (an agent's task, or one trace line).
  * A *turn* is one request inside it. Its prompt is the session's whole context so far:
    every earlier turn's appended text and the model's *real* answer to it, then this turn's
    appended text. For agentic sessions the answer is only known at run time, so a turn
    describes only what to *append* (system prefix, task, tool output) as a token plan, and
    the load generator appends the answer text it actually received.

Text is kept as a *plan* of ``Block(hash_id, tokens)`` pieces, rendered by
``TextFactory.render`` just before sending: a 12k-line Mooncake trace of 10k-token prompts
would otherwise hold gigabytes of strings, and equal hash ids must render identically anyway.

Recorded sessions (``loaders.recorded``) carry real text instead: a *chat turn* has
``messages`` (the chat messages appended before it, sent to ``/v1/chat/completions``) and no
blocks. Its ``recorded_answer``, when set, is what the history holds after the turn (trace
mode: the prompts are exactly the recorded ones); when None the server's answer goes in
(live mode), as for agentic sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class WorkloadInputError(ValueError):
    """The workload's input cannot make a load (a file, a line or a setting the user must fix): retrying
    the trial would fail the same way, so the executor classifies it as a final ``config`` error. Raised by
    the loaders, and by a turn or session built from input that breaks their rules."""


class Message(NamedTuple):
    """One chat message, ``{"role": role, "content": content}`` on the wire."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """A turn's structured-output constraint: the tool whose arguments the answer must be, and the request's
    ``response_format`` value as JSON text (built once by ``structured.response_format``)."""

    name: str
    json: str


class Block(NamedTuple):
    """``tokens`` tokens of deterministic text for ``hash_id`` (see ``TextFactory.block``)."""

    hash_id: int
    tokens: int


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    ``append``: blocks appended to the context before this turn is sent.
    ``output_tokens``: tokens the server is asked to generate (forced with min_tokens and
    ignore_eos, so the answer has exactly this many tokens unless the request fails).
    ``think_s``: pause between the previous answer's end and this turn's schedule time
    (ignored for the first turn; ``Session.start_s`` schedules that one).

    Chat turns only (``messages`` is not None; ``append`` is then empty):
    ``messages``: chat messages appended to the history before this turn is sent.
    ``recorded_answer``: the assistant text appended after it (None: the server's answer).
    ``recorded_prompt_tokens``: the recording's prompt token count, to compare with the server's.
    ``prompt_tokens_estimate``: the loader's prompt size, the fallback count (see ``planned_prompt_tokens``).

    ``response_format``: set on a turn whose answer is constrained to a tool's arguments (``structured``);
    its length is then not forced: ``output_tokens`` is its ``max_tokens`` only.
    """

    append: tuple[Block, ...]
    output_tokens: int
    think_s: float = 0.0
    messages: tuple[Message, ...] | None = None
    recorded_answer: str | None = None
    recorded_prompt_tokens: int | None = None
    prompt_tokens_estimate: int | None = None
    response_format: ResponseFormat | None = None

    def __post_init__(self) -> None:
        if self.messages is not None and self.append:
            raise WorkloadInputError("a chat turn carries messages, not blocks")
        if self.output_tokens < 1:
            raise WorkloadInputError(f"output_tokens must be >= 1, got {self.output_tokens}")
        if self.think_s < 0:
            raise WorkloadInputError(f"think_s must be >= 0, got {self.think_s}")

    @property
    def append_tokens(self) -> int:
        return sum(b.tokens for b in self.append)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True, slots=True)
class Session:
    """A conversation: an id, its turns, and when it arrives.

    ``start_s``: arrival offset from the start of the run (open loop: trace timestamps or
    Poisson arrivals). None means "as soon as a concurrency slot is free" (closed loop).
    """

    session_id: str
    turns: tuple[Turn, ...]
    start_s: float | None = None

    def __post_init__(self) -> None:
        if not self.turns:
            raise WorkloadInputError(f"session {self.session_id!r} has no turns")
        if self.start_s is not None and self.start_s < 0:
            raise WorkloadInputError(f"start_s must be >= 0, got {self.start_s}")
        if len({t.is_chat for t in self.turns}) > 1:
            raise WorkloadInputError(f"session {self.session_id!r} mixes chat turns and block turns")

    @property
    def is_chat(self) -> bool:
        """True for a session of chat turns (sent to the chat endpoint)."""
        return self.turns[0].is_chat

    def planned_prompt_tokens(self, turn: int) -> int:
        """Prompt tokens of ``turn`` by plan: all appends up to it plus earlier answers.

        Exact for our blocks; the real count can differ by a few tokens where an answer's
        text merges with the text that follows it, and by special tokens (BOS). A chat turn
        returns the loader's ``prompt_tokens_estimate`` (recorded, or estimated from characters).
        """
        estimate = self.turns[turn].prompt_tokens_estimate
        if estimate is not None:
            return estimate
        return sum(t.append_tokens for t in self.turns[: turn + 1]) + \
            sum(t.output_tokens for t in self.turns[:turn])


__all__ = ["Block", "Message", "ResponseFormat", "Session", "Turn", "WorkloadInputError"]
