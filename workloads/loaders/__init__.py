"""Loaders: turn a workload spec into ``Session`` objects, one module per trace format.

Loaders only read and validate; they return token *plans* (``trace.Block``), never text, so
loading a 12k-line trace is cheap and needs no tokenizer. Text is rendered by
``TextFactory`` when each request is sent. The one exception is ``recorded``: recorded
sessions bring their own real text (chat messages), which is the point of replaying them.
"""

from __future__ import annotations

from ..spec import AgenticWorkload, AzureWorkload, MooncakeWorkload, RecordedWorkload
from ..text import TextFactory
from ..trace import Session
from ._common import TraceError, WorkloadInputError
from .agentic import generate_agentic
from .azure import load_azure
from .mooncake import load_mooncake
from .recorded import load_recorded


def load_sessions(spec: AgenticWorkload | MooncakeWorkload | AzureWorkload | RecordedWorkload,
                  text_factory: TextFactory | None = None) -> list[Session]:
    """Sessions for ``spec``, dispatched on ``spec.kind``.

    ``text_factory`` is accepted for loaders that must check text against the model's
    tokenizer; the current ones emit token plans and do not need it.
    """
    del text_factory  # see docstring
    if isinstance(spec, AgenticWorkload):
        return generate_agentic(spec)
    if isinstance(spec, MooncakeWorkload):
        return load_mooncake(spec)
    if isinstance(spec, AzureWorkload):
        return load_azure(spec)
    if isinstance(spec, RecordedWorkload):
        return load_recorded(spec)
    raise TypeError(f"no loader for workload kind {getattr(spec, 'kind', type(spec).__name__)!r}")


__all__ = ["TraceError", "WorkloadInputError", "generate_agentic", "load_azure", "load_mooncake", "load_recorded", "load_sessions"]
