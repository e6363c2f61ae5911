"""TrialResult: what happened in one trial, with failures as data.

An executor never raises for a trial that went wrong; it returns a result with
``status=FAILED``, an ``error_kind`` and the logs. Only the controller decides
whether a failure is retried (see ``ErrorKind.retryable``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ErrorKind(str, enum.Enum):
    """Why a trial failed. Retryable kinds are infrastructure trouble, not a bad config."""

    NONE = "none"
    CONFIG = "config"                  # bad spec or workload input: never retried
    CANNOT_FIT = "cannot_fit"          # not enough cores/GPUs on any node: never retried
    STARTUP_TIMEOUT = "startup_timeout"  # server never got healthy before its deadline
    SERVER_DIED = "server_died"        # server exited before or during the measurement
    RESTRICTION_VIOLATED = "restriction_violated"  # a thread ran outside its core set
    NODE_DIED = "node_died"            # Ray node or actor lost
    INTERNAL = "internal"              # a bug in the orchestrator

    @property
    def retryable(self) -> bool:
        return self in (ErrorKind.NODE_DIED, ErrorKind.SERVER_DIED, ErrorKind.STARTUP_TIMEOUT)


class TrialFailure(Exception):
    """Raised inside the executor to end a trial as ``FAILED`` with ``kind``; it becomes a TrialResult there."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[type[TrialFailure], tuple[ErrorKind, str]]:
        return type(self), (self.kind, str(self))


class TrialStatus(str, enum.Enum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class TrialResult:
    """The raw outcome of one trial. Metrics are derived from ``records`` afterwards."""

    trial_id: str
    status: TrialStatus
    error_kind: ErrorKind = ErrorKind.NONE
    message: str = ""
    records: tuple[Any, ...] = ()           # workloads.records.RequestRecord
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # facts learnt while running (vllm version, cpu model...)
    warnings: tuple[str, ...] = ()
    artifacts_dir: str | None = None        # folder with server log, spec JSON, verified core sets
    telemetry: tuple[dict[str, Any], ...] = ()  # time series rows (ts, name, value)
    started_at: float = 0.0
    ended_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is TrialStatus.COMPLETED

    @classmethod
    def failed(cls, trial_id: str, kind: ErrorKind, message: str, **kw: Any) -> TrialResult:
        return cls(trial_id=trial_id, status=TrialStatus.FAILED, error_kind=kind, message=message, **kw)


__all__ = ["ErrorKind", "TrialFailure", "TrialResult", "TrialStatus"]
