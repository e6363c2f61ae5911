"""The typed values that cross the Ray boundary between the driver and a node's actors.

Pickled by Ray: a failure on the node is a :class:`NodeError` (data, never an exception the driver
would have to unpickle), everything else its own frozen dataclass. The node's actors
(:mod:`orchestrator.node.replica_actor`, :mod:`orchestrator.node.workload_actor`) build them; the driver's measurement sequence
(:mod:`orchestrator.control.measure`) reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeError:
    """A failure on the node, as data. ``kind`` is an :class:`~orchestrator.values.results.ErrorKind` value."""

    kind: str
    message: str


@dataclass(frozen=True)
class CoreGrant:
    """The cores the node's core agent gave one trial, and the host facts that go with them."""

    replica: list[int]
    client: list[int]
    client_isolated: bool
    host: dict[str, Any]


@dataclass(frozen=True)
class ReplicaUp:
    """A replica that answers: where, with which tokenizer, what to record; ``repin_s`` after a re-pin."""

    base_url: str
    tokenizer_path: str
    params: dict[str, Any]
    model_dir: str = ""
    repin_s: float | None = None
    startup: dict[str, float] = field(default_factory=dict)  # start-up phases (orchestrator.node.startup)


@dataclass(frozen=True)
class BareRun:
    """A reference client's per-request rows (the bare client, or ``vllm bench serve``)."""

    rows: list[dict[str, Any]]
    client: str = "bare"


@dataclass(frozen=True)
class WindowSpan:
    """Where a window's requests ran, on the host's monotonic clock (ns): first send to last completion,
    and the window's nominal end (what ran after it is the drain)."""

    start_ns: int
    end_ns: int
    window_end_ns: int


@dataclass(frozen=True)
class ServerStatus:
    """Whether the replica's server process still runs, and the end of its log when it does not."""

    alive: bool
    log_tail: str = ""


@dataclass(frozen=True)
class WindowFigures:
    """What the replica actor measured over one window (``end_window``).

    Every figure is over the requests' span (first send to last completion), never over the calls
    around it. ``rows`` are every telemetry sample of the sampler's life (``t`` in seconds since it
    started); ``span_rows`` only those inside the span, which the window's means are taken over, so
    the workload's set-up and its post-processing never dilute them. ``accounting`` (the replica's
    cores: busy, tree and foreign CPU, ``replica_cores_foreign_frac``) and the role figures in
    ``attribution`` (``cpu_s_<role>``, ``runq_wait_s_<role>``...) come from the counter readings inside
    the span, scaled to its length; the foreign share divides by the span's seconds, and so do the
    server's token rates in ``server``. ``span`` records the span's bounds beside the figures:
    ``window_span_s`` (first send to last completion), ``window_drain_s`` (of that, after the window's
    nominal end), ``accounting_s`` (the seconds between the two counter readings the accounting and
    roles come from: at most the span, a little more only for a span shorter than the reading period)
    and ``telemetry_outside_span_s``.
    """

    server: dict[str, float]
    rows: list[dict[str, Any]]
    span_rows: list[dict[str, Any]]
    alive: bool
    block_size: int | None
    accounting: dict[str, float] = field(default_factory=dict)
    attribution: dict[str, float] = field(default_factory=dict)
    attribution_params: dict[str, str] = field(default_factory=dict)
    span: dict[str, float] = field(default_factory=dict)


__all__ = ["BareRun", "CoreGrant", "NodeError", "ReplicaUp", "ServerStatus", "WindowFigures", "WindowSpan"]
