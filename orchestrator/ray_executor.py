"""RayTrialExecutor: runs one TrialSpec on a Ray cluster and returns a TrialResult.

Placement: a placement group with one bundle ``{"CPU": cores, "GPU": gpus}``
(plus the hardware's ``accelerator_type`` resource) reserves the node; the
node's core agent then gives the replica and the client real, disjoint cores.
Every failure becomes data (``TrialResult.failed``); actor and node loss map to
the retryable ``NODE_DIED``. Capacity is released in exactly one place: the
``finally`` of :meth:`RayTrialExecutor.execute`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.node import ReplicaActor, WorkloadActor, core_agent
from orchestrator.plan import TrialSpec
from orchestrator.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.summary import summarize_trial


class TrialFailure(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def bundle_for(trial: TrialSpec) -> dict[str, float]:
    """Ray resources that reserve the trial's node (bookkeeping; enforcement is ours)."""
    bundle: dict[str, float] = {"CPU": float(trial.cores)}
    if trial.gpus:
        bundle["GPU"] = float(trial.gpus)
    if trial.hardware.lower() != "cpu":
        bundle[f"accelerator_type:{trial.hardware}"] = 0.001
    return bundle


def _fits_somewhere(bundle: dict[str, float]) -> str | None:
    """None if some alive node could ever hold ``bundle``; else why not."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for n in nodes:
        res = n.get("Resources", {})
        if all(res.get(k, 0.0) >= v for k, v in bundle.items()):
            return None
    have = "; ".join(
        ", ".join(f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items())
                  if k in ("CPU", "GPU") or k.startswith("accelerator_type")) for n in nodes)
    want = ", ".join(f"{k}={v:g}" for k, v in bundle.items())
    return f"no node can hold {{{want}}}; nodes have: {have or 'none'}"


class RayTrialExecutor:
    """Runs trials one at a time; ``home`` is the driver's folder for trial artifacts."""

    def __init__(self, home: Path, *, placement_timeout_s: float = 300.0) -> None:
        self.home = Path(home).resolve()
        self.placement_timeout_s = placement_timeout_s

    def execute(self, trial: TrialSpec) -> TrialResult:
        started = time.time()
        tdir = self.home / "trials" / trial.trial_id
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "trial_spec.json").write_text(trial.model_dump_json(indent=2))
        pg = agent = replica = None
        facts: dict[str, Any] = {}
        try:
            bundle = bundle_for(trial)
            why = _fits_somewhere(bundle)
            if why:
                raise TrialFailure(ErrorKind.CANNOT_FIT, why)
            pg = placement_group([bundle], strategy="STRICT_PACK", name=f"trial-{trial.trial_id}")
            try:
                ray.get(pg.ready(), timeout=self.placement_timeout_s)
            except GetTimeoutError:
                raise TrialFailure(ErrorKind.CANNOT_FIT,
                                   f"placement group {bundle} not ready after {self.placement_timeout_s:.0f} s")
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0)
            node_dir = str(self.home / "node" / "trials" / trial.trial_id)
            replica = ReplicaActor.options(
                scheduling_strategy=strategy, num_gpus=trial.gpus, name=f"replica-{trial.trial_id}",
            ).remote(trial.model_dump_json(), node_dir)
            facts = ray.get(replica.node_facts.remote())
            agent = core_agent(facts["node_id"])
            gpu_ids = [int(g) for g in facts["gpu_ids"].split(",") if g]
            alloc = ray.get(agent.allocate.remote(trial.trial_id, trial.cores, trial.client.cores,
                                                  trial.client.isolation, gpu_ids))
            if "error" in alloc:
                raise TrialFailure(ErrorKind.CANNOT_FIT, alloc["error"])
            return self._measure(trial, tdir, replica, strategy, alloc, facts, started)
        except TrialFailure as exc:
            return self._failed(trial, tdir, exc.kind, str(exc), facts, started)
        except (RayActorError, ray.exceptions.NodeDiedError) as exc:
            # An exception in an actor's constructor is our bug, not a lost node: never retried.
            creation = "creation task" in str(exc)
            kind = ErrorKind.INTERNAL if creation else ErrorKind.NODE_DIED
            return self._failed(trial, tdir, kind, _last_line(str(exc)), facts, started)
        except RayTaskError as exc:
            return self._failed(trial, tdir, ErrorKind.INTERNAL, _last_line(str(exc.cause or exc)), facts, started)
        finally:
            if replica is not None:
                self._collect(replica, tdir)
                ray.kill(replica)
            if agent is not None:
                agent.release.remote(trial.trial_id)
            if pg is not None:
                remove_placement_group(pg)

    def _measure(self, trial: TrialSpec, tdir: Path, replica: Any, strategy: Any, alloc: dict, facts: dict,
                 started: float) -> TrialResult:
        params: dict[str, Any] = {**facts, "replica_cpus": alloc["replica"], "client_cpus": alloc["client"],
                                  "client_isolated": alloc["client_isolated"]}
        warnings: list[str] = []
        if not alloc["client_isolated"]:
            warnings.append(f"client shares cores with the replica (node too small): client {alloc['client']}, "
                            f"replica {alloc['replica']}")
        up = ray.get(replica.start.remote(alloc["replica"]))
        if "error_kind" in up:
            raise TrialFailure(ErrorKind(up["error_kind"]), up["message"])
        params.update(up["params"])
        checks = {"replica_start": ray.get(replica.verify.remote())}
        workload = WorkloadActor.options(scheduling_strategy=strategy).remote()
        try:
            checks["client"] = ray.get(workload.pin.remote(alloc["client"]))
            ray.get(replica.begin_window.remote(alloc["client"]))
            run = ray.get(workload.run.remote(trial.workload.model_dump_json(), up["base_url"], trial.model.name,
                                              up["tokenizer_path"]))
        finally:
            ray.kill(workload)
        window = ray.get(replica.end_window.remote())
        checks["replica_end"] = ray.get(replica.verify.remote())
        (tdir / "verified_cores.json").write_text(json.dumps(checks, indent=2))
        warnings.extend(run.warnings)
        metrics = summarize_trial(run, window["server"], window["rows"])
        status, kind, message = TrialStatus.COMPLETED, ErrorKind.NONE, ""
        bad = [k for k, v in checks.items() if not v.get("ok", False)]
        if bad:
            status, kind = TrialStatus.FAILED, ErrorKind.RESTRICTION_VIOLATED
            message = "threads outside their core set in: " + ", ".join(
                f"{k} ({'; '.join(checks[k].get('violations', [])[:3])})" for k in bad)
        elif not window["alive"]:
            status, kind, message = TrialStatus.FAILED, ErrorKind.SERVER_DIED, "vLLM exited during the window"
        return TrialResult(trial_id=trial.trial_id, status=status, error_kind=kind, message=message,
                           records=tuple(run.records), metrics=metrics, params=_flat(params),
                           warnings=tuple(warnings), artifacts_dir=str(tdir), telemetry=tuple(window["rows"]),
                           started_at=started, ended_at=time.time())

    def _collect(self, replica: Any, tdir: Path) -> None:
        """Stop the replica (idempotent) and bring its node-side files (vLLM log, ...) to ``tdir``."""
        try:
            files = ray.get(replica.stop.remote(), timeout=120)
        except Exception as exc:  # the actor is gone; its process group died with it
            (tdir / "collect-error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
            return
        for name, data in files.items():
            (tdir / name).write_bytes(data)

    def _failed(self, trial: TrialSpec, tdir: Path, kind: ErrorKind, message: str, facts: dict,
                started: float) -> TrialResult:
        return TrialResult.failed(trial.trial_id, kind, message, params=_flat(facts), artifacts_dir=str(tdir),
                                  started_at=started, ended_at=time.time())


def _last_line(text: str) -> str:
    """The informative end of a Ray traceback (the full text goes to the trial's artifacts)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.strip().startswith("^")]
    return " | ".join(lines[-3:])[:500] if lines else text


def _flat(params: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in params.items():
        if isinstance(v, (list, tuple, set, frozenset)):
            v = ",".join(str(x) for x in sorted(v))
        out[k] = str(v)
    return out


__all__ = ["RayTrialExecutor", "bundle_for"]
