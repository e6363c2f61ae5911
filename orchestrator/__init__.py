"""CPU-starvation sweep orchestrator: how many cores does vLLM serving need, and what does starving it cost?

Floors, bottom up; each imports only from those below it (``tests/unit/test_layers.py``):
- ``values``: the typed values of the pipeline, ``SweepSpec`` → ``SweepPlan`` of ``TrialSpec`` →
  ``TrialResult``, the callback protocol and what crosses Ray;
- ``infra``: the run's own processes and ports (local Ray and MLflow, lifelines, survivors, the home lock);
- ``plan``: loading a sweep file, its pure expansion into trials, model shape folders, preflight;
- ``node``: on a GPU node, the core agent, the pinned vLLM replica, the workload, telemetry;
- ``observe`` (beside ``node``): summary metrics, the outbox, MLflow tracking, the report and its analyses;
- ``control``: ``SweepController`` (retries, resume, concurrency; no Ray) → ``RayTrialExecutor``
  (placement groups, the node book, the measurement sequence) → ``TrialResult``.
``sweep`` wires them together for one sweep, ``progress`` prints its events and ``cli`` is the command line.

Only the pure parts are imported here; Ray, MLflow and vLLM load when their modules are used.
"""

from orchestrator.control.controller import SweepController
from orchestrator.values.trial import SweepPlan, TrialSpec
from orchestrator.plan.expand import expand
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.plan.load import SpecError, load_spec, parse_spec
from orchestrator.values.sweep_spec import SweepSpec

__all__ = ["ErrorKind", "SpecError", "SweepController", "SweepPlan", "SweepSpec", "TrialResult", "TrialSpec",
           "TrialStatus", "expand", "load_spec", "parse_spec"]
