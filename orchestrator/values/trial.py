"""The trial's typed values: ``TrialSpec`` (one resolved combination of factors plus a repeat index) and ``SweepPlan``.

A trial's ``trial_id`` is a stable hash of everything that defines it, so re-running a sweep finds
the trials it already finished and never duplicates them. Expanding a ``SweepSpec`` into a plan is
:mod:`orchestrator.plan.expand`'s job; this module only holds the values every stage passes on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from orchestrator.values.sweep_spec import (
    ClientSpec,
    ModelSpec,
    ProtocolSpec,
    RestrictionMode,
    ServerSpec,
    SloSpec,
    StartMode,
    SweepSpec,
    TelemetrySpec,
    VllmVariant,
)
from workloads.spec import WorkloadSpec

IDENTITY_EXCLUDE: dict[str, Any] = {
    "trial_id": True, "slo": True,
    "protocol": {"order", "seed", "spread_warn", "crosscheck_clients", "crosscheck_tolerance"}}


class TrialSpec(BaseModel):
    """Everything one trial needs, resolved. Written as JSON into the trial's artifacts before it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep: str = Field(description="Sweep name.")
    model: ModelSpec
    hardware: str
    gpus: int = Field(ge=0)
    cores: int = Field(ge=1)
    restriction: RestrictionMode
    start: StartMode
    vllm: VllmVariant
    workload: WorkloadSpec
    server: ServerSpec
    client: ClientSpec
    repeat: int = Field(ge=0)
    api_servers: int = Field(default=1, ge=1, description="vLLM --api-server-count.")
    protocol: ProtocolSpec = Field(default_factory=ProtocolSpec)
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
    slo: SloSpec | None = Field(default=None, description="The sweep's SLOs for goodput; not part of the identity.")

    @model_validator(mode="before")
    @classmethod
    def _drop_computed_id(cls, data: Any) -> Any:
        """Accept our own JSON back: ``trial_id`` is derived, so it is checked, never trusted."""
        if isinstance(data, dict) and "trial_id" in data:
            data = dict(data)
            claimed = data.pop("trial_id")
            spec = cls.model_validate(data)
            if spec.trial_id != claimed:
                raise ValueError(f"trial_id {claimed} does not match its fields (they hash to {spec.trial_id})")
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def trial_id(self) -> str:
        """sha256 of the canonical JSON of every defining field, first 12 hex digits.

        The sweep-level parts of the protocol (trial order, its seed, the report's spread threshold)
        and the SLO (a yardstick applied to what was measured) do not change what a trial measures,
        so they are not part of its identity: reordering a sweep, or setting an SLO, resumes it."""
        return trial_hash(self.model_dump(mode="json", exclude=IDENTITY_EXCLUDE))

    @property
    def tensor_parallel(self) -> int:
        return max(self.gpus, 1)

    def factors(self) -> dict[str, Any]:
        """The flat factor view used for tables and MLflow params."""
        return {
            "model": self.model.name,
            "hardware": self.hardware,
            "gpus": self.gpus,
            "cores": self.cores,
            "restriction": self.restriction,
            "start": self.start,
            "vllm_variant": self.vllm.name,
            "api_servers": self.api_servers,
            "stack": self.server.stack,
            "workload": self.workload.name,
            "text_style": getattr(self.workload, "text_style", "recorded"),
            "repeat": self.repeat,
        }


def trial_hash(data: dict[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


class SweepPlan(BaseModel):
    """The ordered trials of a sweep. Order groups trials that can share a warm replica."""

    model_config = ConfigDict(frozen=True)

    spec: SweepSpec
    trials: tuple[TrialSpec, ...]

    def __len__(self) -> int:
        return len(self.trials)


__all__ = ["IDENTITY_EXCLUDE", "SweepPlan", "TrialSpec", "trial_hash"]
