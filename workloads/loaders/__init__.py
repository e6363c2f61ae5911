"""Loaders: turn a workload spec into ``Session`` objects, one module per trace format.

Loaders only read and validate; they return token *plans* (``trace.Block``), never text, so
loading a 12k-line trace is cheap and needs no tokenizer. Text is rendered by
``TextFactory`` when each request is sent. The one exception is ``recorded``: recorded
sessions bring their own real text (chat messages), which is the point of replaying them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import AgenticWorkload, AzureWorkload, MooncakeWorkload, RecordedWorkload
from ..structured import constrain
from ..text import TextFactory
from ..trace import Session
from ._common import TraceError, WorkloadInputError
from .agentic import generate_agentic
from .azure import load_azure
from .mooncake import load_mooncake
from .recorded import load_recorded


@dataclass(frozen=True)
class WorkloadKind:
    """What the code needs to know of one workload kind, in one place: its spec class, its loader, how
    its sessions are sent (``closed_loop``: each session's turns in order, ``in_flight`` sessions at once;
    else every request at its arrival time, at most ``in_flight`` in flight), the spec field that holds
    that count, whether it reads a file (``path``), and whether its text is synthesised (``text_style``)."""

    spec: type
    load: Callable[[Any], list[Session]]
    closed_loop: bool
    in_flight_field: str
    reads_file: bool
    synthetic_text: bool


KINDS: dict[str, WorkloadKind] = {
    "agentic": WorkloadKind(AgenticWorkload, generate_agentic, closed_loop=True, in_flight_field="concurrency",
                            reads_file=False, synthetic_text=True),
    "mooncake": WorkloadKind(MooncakeWorkload, load_mooncake, closed_loop=False, in_flight_field="max_in_flight",
                             reads_file=True, synthetic_text=True),
    "azure": WorkloadKind(AzureWorkload, load_azure, closed_loop=False, in_flight_field="max_in_flight",
                          reads_file=True, synthetic_text=True),
    "recorded": WorkloadKind(RecordedWorkload, load_recorded, closed_loop=True, in_flight_field="concurrency",
                             reads_file=True, synthetic_text=False),
}


def kind_of(spec: Any) -> WorkloadKind:
    """``spec``'s entry in :data:`KINDS`; an unknown kind is an error, never a default."""
    kind = KINDS.get(getattr(spec, "kind", None))  # type: ignore[arg-type]
    if kind is None or not isinstance(spec, kind.spec):
        raise TypeError(f"unknown workload kind {getattr(spec, 'kind', type(spec).__name__)!r} "
                        f"(known: {', '.join(KINDS)})")
    return kind


def in_flight(spec: Any) -> int:
    """The most sessions (closed loop) or requests (open loop) ``spec`` keeps in flight."""
    return int(getattr(spec, kind_of(spec).in_flight_field))


def trace_path(spec: Any) -> Path | None:
    """The file ``spec`` reads, or None for a kind that generates its sessions."""
    return spec.path if kind_of(spec).reads_file else None


def text_style(spec: Any) -> str:
    """The style of the text rendered for ``spec``'s token plans ('uniform' for a kind that brings its own)."""
    return spec.text_style if kind_of(spec).synthetic_text else "uniform"


def load_sessions(spec: AgenticWorkload | MooncakeWorkload | AzureWorkload | RecordedWorkload,
                  text_factory: TextFactory | None = None) -> list[Session]:
    """Sessions for ``spec``, by its kind's loader.

    Turns chosen for structured output (``spec.structured_output``) carry their tool's response format.
    ``text_factory`` is accepted for loaders that must check text against the model's
    tokenizer; the current ones emit token plans and do not need it.
    """
    del text_factory  # see docstring
    return constrain(kind_of(spec).load(spec), spec.structured_output, spec.seed)


__all__ = ["KINDS", "TraceError", "WorkloadInputError", "WorkloadKind", "generate_agentic", "in_flight", "kind_of",
           "load_azure", "load_mooncake", "load_recorded", "load_sessions", "text_style", "trace_path"]
