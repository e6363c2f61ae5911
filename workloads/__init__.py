"""Workloads: what load a trial offers a vLLM replica, and the raw facts of how it was served.

Pipeline inside this package (each stage a typed value):
``WorkloadSpec --loaders--> [Session] --LoadGenerator(strategy, StreamingClient)--> [RequestRecord]
--metrics.summarize--> {metric: value}``. ``run_workload`` wires it for the orchestrator.

Layers import downward only: records/trace/text/protocols < metrics, client, loaders <
loadgen < run_workload. The load generator (when) and the client (how) never import each other.
"""

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

__all__ = [
    "AgenticWorkload", "AzureWorkload", "Backend", "Block", "Clock", "ClosedLoop", "LoadGenerator",
    "LoadResult", "MonotonicClock", "MooncakeWorkload", "OpenLoop", "Request", "RequestRecord", "Session",
    "StreamingClient", "TextFactory", "TokenRange", "TraceError", "Turn", "WorkloadRun", "WorkloadSpec",
    "bundled_tokenizer_path", "frame_to_records", "load_sessions", "load_tokenizer", "records_to_frame",
    "run_workload", "run_workload_sync", "summarize",
]
