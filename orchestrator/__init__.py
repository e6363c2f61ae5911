"""CPU-starvation sweep orchestrator: how many cores does vLLM serving need, and what does starving it cost?

Pipeline: ``SweepSpec`` (spec) → ``SweepPlan`` of ``TrialSpec`` (plan, pure) → ``SweepController``
(controller: retries, resume) → ``RayTrialExecutor`` (ray_executor: placement, pinned replica, workload)
→ ``TrialResult`` (results) → observers (tracking: MLflow) and tables (report).

Only the pure stages are imported here; Ray, MLflow and vLLM load when their modules are used.
"""

from orchestrator.controller import SweepController
from orchestrator.plan import SweepPlan, TrialSpec, expand
from orchestrator.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.spec import SpecError, SweepSpec, load_spec, parse_spec

__all__ = ["ErrorKind", "SpecError", "SweepController", "SweepPlan", "SweepSpec", "TrialResult", "TrialSpec",
           "TrialStatus", "expand", "load_spec", "parse_spec"]
