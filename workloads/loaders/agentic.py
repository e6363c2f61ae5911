"""Synthetic agentic sessions: a shared tool prefix, then turns that grow the context.

The pattern (DESIGN.md, from Mooncake's tool-agent statistics and arXiv 2603.22774): every
session starts with the same system/tool prefix, then its own task; each later turn appends
a tool output (hundreds to thousands of tokens) after the model's real previous answer.
Contexts grow to tens of thousands of tokens while almost all of each prompt was seen
before, so prefix-cache hit rates exceed 90%: prefill (GPU) stays small while tokenization
of the whole prompt (CPU) grows with the context. That is the load that starves CPUs.

Sizes are drawn from a per-session RNG seeded by (seed, session index), so session 7 is the
same whatever the number of sessions. A session ends before the turn whose prompt plus
answer would exceed ``max_context_tokens`` (answers are planned at ``output_tokens`` since
the client forces that length).
"""

from __future__ import annotations

import random

from ..spec import AgenticWorkload, TokenRange
from ..text import stable_id
from ..trace import Block, Session, Turn
from ._common import WorkloadInputError


def _draw(rng: random.Random, r: TokenRange) -> int:
    return rng.randint(r.min, r.max)


def _session(spec: AgenticWorkload, index: int, start_s: float | None) -> Session | None:
    rng = random.Random(stable_id("agentic-session", spec.seed, index))
    head: list[Block] = []
    if spec.system_prompt_tokens:
        # One id for all sessions: byte-identical prefix, so every session hits the cache.
        head.append(Block(stable_id("agentic-system", spec.seed), spec.system_prompt_tokens))
    head.append(Block(stable_id("agentic-task", spec.seed, index), _draw(rng, spec.task_tokens)))
    turns: list[Turn] = []
    context = 0
    for k in range(spec.turns):
        if k == 0:
            append = tuple(head)
        else:
            append = (Block(stable_id("agentic-tool", spec.seed, index, k), _draw(rng, spec.tool_output_tokens)),)
        output = _draw(rng, spec.output_tokens)
        prompt = context + sum(b.tokens for b in append)
        if prompt + output > spec.max_context_tokens:
            break
        turns.append(Turn(append=append, output_tokens=output, think_s=spec.think_time_s if k else 0.0))
        context = prompt + output
    if not turns:
        return None
    return Session(session_id=f"{spec.name}-s{index}", turns=tuple(turns), start_s=start_s)


def generate_agentic(spec: AgenticWorkload) -> list[Session]:
    """``spec.sessions`` sessions; with ``session_rate_per_s``, Poisson arrival offsets."""
    arrivals = random.Random(stable_id("agentic-arrivals", spec.seed))
    sessions: list[Session] = []
    t = 0.0
    for index in range(spec.sessions):
        start_s = None
        if spec.session_rate_per_s is not None:
            start_s = t
            t += arrivals.expovariate(spec.session_rate_per_s)
        session = _session(spec, index, start_s)
        if session is None:
            raise WorkloadInputError(
                f"agentic workload {spec.name!r}: the first turn of session {index} (system prefix "
                f"{spec.system_prompt_tokens} + task + output tokens) exceeds max_context_tokens "
                f"{spec.max_context_tokens}")
        sessions.append(session)
    return sessions


__all__ = ["generate_agentic"]
