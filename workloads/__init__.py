"""Workloads: what load a trial offers a vLLM replica, and the raw facts of how it was served.

Pipeline inside this package (each stage a typed value):
``WorkloadSpec --loaders--> [Session] --LoadGenerator(strategy, StreamingClient)--> [RequestRecord]
--metrics.summarize--> {metric: value}``. ``run_workload`` wires it for the orchestrator.

Layers import downward only: records/trace/text/protocols < metrics, client, loaders <
loadgen < run_workload. The load generator (when) and the client (how) never import each other.

The names below load on first use (PEP 562): ``workloads.spec`` is what a sweep file's validation
needs, and importing it must not import pandas, aiohttp or tokenizers (``orchestrator plan`` and
``--help`` stay fast; tests/unit/orchestrator/test_preflight.py checks it).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# name -> the submodule that defines it
_LAZY = {
    "StreamingClient": "client",
    "TraceError": "loaders", "load_sessions": "loaders",
    "ClosedLoop": "loadgen", "LoadGenerator": "loadgen", "LoadResult": "loadgen", "OpenLoop": "loadgen",
    "summarize": "metrics",
    "Backend": "protocols", "Clock": "protocols", "MonotonicClock": "protocols", "Request": "protocols",
    "RequestRecord": "records", "frame_to_records": "records", "records_to_frame": "records",
    "WorkloadRun": "run_workload", "run_workload": "run_workload", "run_workload_sync": "run_workload",
    "AgenticWorkload": "spec", "AzureWorkload": "spec", "MooncakeWorkload": "spec", "TokenRange": "spec",
    "WorkloadSpec": "spec",
    "TextFactory": "text", "bundled_tokenizer_path": "text", "load_tokenizer": "text",
    "Block": "trace", "Session": "trace", "Turn": "trace",
}

__all__ = [
    "AgenticWorkload", "AzureWorkload", "Backend", "Block", "Clock", "ClosedLoop", "LoadGenerator",
    "LoadResult", "MonotonicClock", "MooncakeWorkload", "OpenLoop", "Request", "RequestRecord", "Session",
    "StreamingClient", "TextFactory", "TokenRange", "TraceError", "Turn", "WorkloadRun", "WorkloadSpec",
    "bundled_tokenizer_path", "frame_to_records", "load_sessions", "load_tokenizer", "records_to_frame",
    "run_workload", "run_workload_sync", "summarize",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:  # a submodule (``from workloads import metrics``) is imported by the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, eagerly
    from .client import StreamingClient
    from .loaders import TraceError, load_sessions
    from .loadgen import ClosedLoop, LoadGenerator, LoadResult, OpenLoop
    from .metrics import summarize
    from .protocols import Backend, Clock, MonotonicClock, Request
    from .records import RequestRecord, frame_to_records, records_to_frame
    from .run_workload import WorkloadRun, run_workload, run_workload_sync
    from .spec import AgenticWorkload, AzureWorkload, MooncakeWorkload, TokenRange, WorkloadSpec
    from .text import TextFactory, bundled_tokenizer_path, load_tokenizer
    from .trace import Block, Session, Turn
