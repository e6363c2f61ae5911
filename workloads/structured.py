"""Structured output: which turns ask for a tool call's arguments as JSON, and the fields that ask for it.

A workload with ``structured_output`` (``spec.StructuredOutput``) constrains some or all of its turns
to a tool's argument schema, as agent frameworks do for tool calls. :func:`constrain` marks the turns
of loaded sessions (seeded per session and turn, so a rerun and the bare client send the same schemas),
and :func:`length_fields` gives the request fields that set an answer's length and form. Both clients
(``client.StreamingClient`` and ``bare.BareClient``) build their bodies from it, so the rule about
forcing the length lives here once.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

from .spec import StructuredOutput, ToolSchema
from .trace import ResponseFormat, Session, WorkloadInputError

# Tool sets shipped with the product (package data), by the name a sweep gives in ``tools``.
TOOL_SETS = {"coding-agent": "coding-agent.json"}


@cache
def shipped_tools(name: str) -> tuple[ToolSchema, ...]:
    """The tools of the shipped set ``name`` (``workloads/schemas/<file>``), validated like a sweep's own."""
    if name not in TOOL_SETS:
        raise WorkloadInputError(f"unknown tool set {name!r} (known: {', '.join(TOOL_SETS)})")
    text = resources.files("workloads").joinpath("schemas", TOOL_SETS[name]).read_text()
    return tuple(ToolSchema.model_validate(t) for t in json.loads(text)["tools"])


def tools_of(spec: StructuredOutput) -> tuple[ToolSchema, ...]:
    return shipped_tools(spec.tools) if isinstance(spec.tools, str) else spec.tools


def response_format(tool: ToolSchema) -> ResponseFormat:
    """The OpenAI ``response_format`` that constrains an answer to ``tool``'s arguments, encoded once."""
    value = {"type": "json_schema", "json_schema": {"name": tool.name, "schema": tool.parameters, "strict": True}}
    return ResponseFormat(name=tool.name, json=json.dumps(value))


def constrain(sessions: list[Session], spec: StructuredOutput | None, seed: int) -> list[Session]:
    """``sessions`` with each turn chosen for structured output carrying its tool's ``response_format``.

    Per turn, a draw seeded by (``seed``, session id, turn) decides whether it is constrained
    (``spec.fraction``) and by which tool (uniform over the set), so the choice does not depend on how
    many sessions were loaded or in which order they run. ``spec`` None returns ``sessions`` unchanged."""
    if spec is None:
        return sessions
    formats = [response_format(t) for t in tools_of(spec)]
    out = []
    for s in sessions:
        turns = []
        for k, turn in enumerate(s.turns):
            rng = random.Random(f"{seed}:{s.session_id}:{k}")
            constrained = rng.random() < spec.fraction
            turns.append(replace(turn, response_format=rng.choice(formats)) if constrained else turn)
        out.append(replace(s, turns=tuple(turns)))
    return out


def length_fields(max_tokens: int, fmt: ResponseFormat | None) -> dict[str, Any]:
    """The body fields that set an answer's length and form.

    Free text: ``max_tokens = min_tokens`` with ``ignore_eos``, so the decode work is the same whatever a
    dummy-weight model emits. Structured: ``max_tokens`` and the ``response_format`` only. Forcing the
    length there would forbid the end of sequence after the grammar has closed its object, when it is
    the only token the grammar allows."""
    if fmt is None:
        return {"max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True}
    return {"max_tokens": max_tokens, "response_format": json.loads(fmt.json)}


__all__ = ["TOOL_SETS", "constrain", "length_fields", "response_format", "shipped_tools", "tools_of"]
