"""CPU-starvation sweep orchestrator: how many cores does vLLM serving need, and what does starving it cost?

Pipeline, one sub-package per stage:
- ``plan``: ``SweepSpec`` (spec) → ``SweepPlan`` of ``TrialSpec`` (expand, pure), preflight;
- ``control``: ``SweepController`` (retries, resume, concurrency; no Ray) → ``RayTrialExecutor``
  (placement groups, the node book) → ``TrialResult``;
- ``node``: on a GPU node, the core agent, the pinned vLLM replica, the workload, telemetry;
- ``observe``: summary metrics, the outbox, MLflow tracking, the report.
``runner`` wires them together for one sweep and ``cli`` is the command line.

Only the pure stages are imported here; Ray, MLflow and vLLM load when their modules are used.
"""

from orchestrator.control.controller import SweepController
from orchestrator.plan.expand import SweepPlan, TrialSpec, expand
from orchestrator.control.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.plan.spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["ErrorKind", "SpecError", "SweepController", "SweepPlan", "SweepSpec", "TrialResult", "TrialSpec",
           "TrialStatus", "expand", "load_spec", "parse_spec"]
