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

from importlib import import_module
from typing import Any

# Loaded on first use: `orchestrator --help` must not build every pydantic model first.
_NAMES = {"SweepController": "orchestrator.control.controller", "SweepPlan": "orchestrator.values.trial",
          "TrialSpec": "orchestrator.values.trial", "expand": "orchestrator.plan.expand",
          "ErrorKind": "orchestrator.values.results", "TrialResult": "orchestrator.values.results",
          "TrialStatus": "orchestrator.values.results", "SpecError": "orchestrator.plan.load",
          "load_spec": "orchestrator.plan.load", "parse_spec": "orchestrator.plan.load",
          "SweepSpec": "orchestrator.values.sweep_spec"}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(import_module(_NAMES[name]), name)
    globals()[name] = value
    return value


__all__ = ["ErrorKind", "SpecError", "SweepController", "SweepPlan", "SweepSpec", "TrialResult", "TrialSpec",
           "TrialStatus", "expand", "load_spec", "parse_spec"]
