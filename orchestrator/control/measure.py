"""The measurement sequence of one window on a replica that answers: what runs, in which order, and
what a failure at each step means.

The executor (``ray_executor``) owns placement, leases and the replica's life; this module owns what
happens between a replica that answers and a :class:`~orchestrator.values.results.TrialResult`:

1. ``verify_start``: every thread of the replica inside its cores (again at the end: ``verify``);
2. ``warmup``: on the first window of a start, the same load shape with another seed, unmeasured
   (and the GPU profile's capture, whose trace write would stall a measured window);
3. ``prepare``: the window's text and sessions, built *before* its span opens;
4. the harness window and its references (the bare client, ``vllm bench serve``), each from a
   prefix-cache reset (``reset``), in an order that rotates with the repeat (:func:`order_of`);
   the harness window is ``window`` (the requests) then ``scrape`` (``end_window``: the after-scrape
   and every figure, taken over the requests' span: first send to last completion);
5. ``finish``: client-side tokenization of what was sent, after the span closed.

A server that is found dead at any step, whichever step notices it first, is ``SERVER_DIED`` (with
the end of its log), which the controller retries under ``max_failures``; anything else raised is
left to the executor's classification. ``on_step(name)`` is called before each step: the fault
tests kill the server there.

Actors are reached through ``get`` (``ray.get``), so the sequence runs against fakes in unit tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.node.cores import format_cpulist
from orchestrator.node.restrict import Verification
from orchestrator.node.window_figures import profile_delay
from orchestrator.observe.summary import (
    crosscheck_load,
    crosscheck_metrics,
    load_warnings,
    replay_fidelity_of,
    sessions_of,
    summarize_trial,
)
from orchestrator.observe.time_use import STEP
from orchestrator.values.figures import PrefixCacheReset
from orchestrator.values.results import ErrorKind, TrialFailure, TrialResult, TrialStatus
from orchestrator.values.trial import TrialSpec
from orchestrator.values.wire import BareRun, CoreGrant, NodeError, ReplicaUp, WindowFigures, WindowSpan

STEPS = ("verify_start", "warmup", "prepare", "reset", "window", "scrape", "verify_client", "finish", "crosscheck",
         "verify")
HARNESS = "harness"


def order_of(references: list[str], repeat: int) -> list[str]:
    """The order of the harness window and its references for repeat ``repeat`` (pure).

    With one reference (the bare client) the two alternate, so an order effect between runs shows
    up as a difference between repeats instead of hiding in the ratio. ``vllm bench serve`` replays
    the prompts the harness sent, so it always comes after the harness; with both references the
    orders rotate through harness-bare-bench, bare-harness-bench and harness-bench-bare."""
    refs = [r for r in references if r != HARNESS]
    if not refs:
        return [HARNESS]
    if "vllm-bench" not in refs:
        rot = [HARNESS, *refs]
        k = repeat % len(rot)
        return rot[k:] + rot[:k]
    others = [r for r in refs if r != "vllm-bench"]
    if not others:
        return [HARNESS, "vllm-bench"]
    b = others[0]
    orders = ([HARNESS, b, "vllm-bench"], [b, HARNESS, "vllm-bench"], [HARNESS, "vllm-bench", b])
    return orders[repeat % 3] + others[1:]


def order_label(order: list[str]) -> str:
    """``harness-first`` / ``bare-first`` for the two-run cross-check (the names reports know), else the order."""
    if order == [HARNESS, "bare"]:
        return "harness-first"
    if order == ["bare", HARNESS]:
        return "bare-first"
    return ",".join(order)


@dataclass
class Window:
    """What the executor hands over: the trial, its replica that answers and a pinned workload actor."""

    trial: TrialSpec
    tdir: Path
    replica: Any  # ReplicaActor handle
    workload: Any  # WorkloadActor handle, pinned to alloc.client
    up: ReplicaUp
    alloc: CoreGrant
    gpu_ids: list[int]
    trace: Any  # (hash, ObjectRef) of the trace file, or None
    warmup: bool  # the first window of a start: run the unmeasured warm-up
    mark: Callable[[str], None] = lambda event: None  # the lease's timeline events
    references: bool | None = None  # run the reference clients (crosscheck: auto decides); None: as the protocol says


class WindowSequence:
    """Runs one :class:`Window` and returns its TrialResult, or raises TrialFailure(SERVER_DIED, ...)."""

    def __init__(self, window: Window, *, get: Callable[[Any], Any] | None = None,
                 on_step: Callable[[str], None] | None = None) -> None:
        if get is None:
            import ray  # heavy: Ray only for the default get (the unit tests pass their own)

            get = ray.get
        self.w = window
        self.get = get
        self.on_step = on_step
        self.step = ""

    # ------------------------------------------------------------------ plumbing
    def _call(self, step: str, method: Any, *args: Any) -> Any:
        """Call an actor method as step ``step``: a failure there with the server gone is SERVER_DIED."""
        self._enter(step)
        try:
            out = self.get(method.remote(*args))
        except TrialFailure:
            raise
        except Exception:
            self.server_alive_or_raise(step)
            raise
        if isinstance(out, NodeError):
            self.server_alive_or_raise(step)
        return out

    def _enter(self, step: str) -> None:
        if step != self.step:
            self.w.mark(STEP + step)  # the lease's idle time is split by the step it was spent in
        self.step = step
        if self.on_step is not None:
            self.on_step(step)

    def server_alive_or_raise(self, step: str, detail: str = "") -> None:
        """Raise SERVER_DIED (with the log's end) when the replica's server process has exited."""
        try:
            status = self.get(self.w.replica.status.remote())
        except Exception:  # noqa: BLE001 - the actor itself is gone: the executor's NODE_DIED path
            return
        if not status.alive:
            tail = status.log_tail.strip().splitlines()[-15:]
            raise TrialFailure(ErrorKind.SERVER_DIED,
                               f"vLLM exited during the {step}{': ' + detail if detail else ''}"
                               + ("\n--- vllm.log tail ---\n" + "\n".join(tail) if tail else ""))

    # ------------------------------------------------------------------ the sequence
    def run(self, params: dict[str, Any], warnings: list[str], started: float) -> TrialResult:
        w, trial = self.w, self.w.trial
        proto = trial.protocol
        spec_json = trial.workload.model_dump_json()
        checks: dict[str, Verification] = {"replica_start": self._call("verify_start", w.replica.verify)}
        checks["client"] = self._call("verify_start", w.workload.pin, w.alloc.client)
        if proto.warmup_s > 0 and w.warmup:
            self._warmup()
        params["warmup_s"] = proto.warmup_s

        wanted = w.references if w.references is not None else proto.crosschecks(trial.cores)
        refs = ["bare"] if wanted else []
        refs += [r for r in proto.crosscheck_clients if r != "bare" and refs]
        order = order_of(refs, trial.repeat)
        if refs:
            params["crosscheck_order"] = order_label(order)
        references: dict[str, BareRun | NodeError] = {}
        ref_load: dict[str, dict[str, float]] = {}
        run = figures = None
        for who in order:
            if who == HARNESS:
                run, figures = self._harness(spec_json, params, checks)
                if not figures.alive:
                    break  # the server died in the window: nothing more to measure
            else:
                references[who], ref_load[who] = self._reference(who, spec_json, run)
        assert run is not None and figures is not None
        if figures.alive:
            checks["replica_end"] = self._call("verify", w.replica.verify)
            # a killed API server can still pass: its workers live on for the lifeline's grace period
            self.server_alive_or_raise("verify")
        else:  # the window's records are kept: what the server served before it died is data too
            status = self.get(w.replica.status.remote())
            params["server_died_in"] = "window"
            warnings.append("vLLM exited during the window" + (
                ":\n" + "\n".join(status.log_tail.strip().splitlines()[-15:]) if status.log_tail.strip() else ""))
        (w.tdir / "verified_cores.json").write_text(json.dumps({k: v.as_dict() for k, v in checks.items()}, indent=2))
        return self._result(run, figures, checks, references, ref_load, params, warnings, started)

    def _warmup(self) -> None:
        w, trial = self.w, self.w.trial
        proto = trial.protocol
        warm = trial.workload.model_copy(update={"seed": trial.workload.seed + 1, "max_duration_s": proto.warmup_s,
                                                 "client_tokenize": "off"})
        w.mark("warmup")
        # telemetry.gpu_profile: captured here, where the stall of vLLM's trace write costs no window
        profiling = self._call("warmup", w.replica.begin_gpu_profile,
                               profile_delay(proto.warmup_s, trial.telemetry.gpu_profile.seconds))
        self._call("warmup", w.workload.run, warm.model_dump_json(), w.up.base_url, trial.model.name,
                   w.up.tokenizer_path, w.trace)
        if profiling:
            self._call("warmup", w.replica.end_gpu_profile)
        w.mark("warmup_end")

    def _harness(self, spec_json: str, params: dict[str, Any],
                 checks: dict[str, Verification]) -> tuple[Any, WindowFigures]:
        """The measured window: text first, then the requests inside the telemetry's span, then the rest."""
        w, trial = self.w, self.w.trial
        self._call("prepare", w.workload.prepare, spec_json, w.up.tokenizer_path, w.trace)
        params.update(self._call("reset", w.replica.begin_window, w.alloc.client, w.gpu_ids))
        w.mark("window")
        run = self._call("window", w.workload.load, w.up.base_url, trial.model.name)
        w.mark("window_end")
        span = run.span_ns()
        figures: WindowFigures = self._call(
            "scrape", w.replica.end_window, len(run.records),
            WindowSpan(span[0], span[1], run.window_end_ns) if span else None)
        checks["client_end"] = self._call("verify_client", w.workload.verify)
        run = self._call("finish", w.workload.finish)  # client-side only: also for a window the server died in
        return run, figures

    def _reference(self, who: str, spec_json: str, run: Any) -> tuple[BareRun | NodeError, dict[str, float]]:
        """One reference client's run from the window's start state: an empty prefix cache, same server."""
        w = self.w
        if not self._call("reset", w.replica.reset_prefix_cache):
            self.server_alive_or_raise("reset")
            return NodeError("internal", f"the prefix cache could not be reset before the {who} run"), {}
        self._call("crosscheck", w.replica.begin_side_accounting)
        w.mark("crosscheck")
        try:
            if who == "bare":
                out = self._call("crosscheck", w.workload.bare, spec_json, w.up.base_url, w.trial.model.name,
                                 w.up.tokenizer_path, _reference_timeout(w.trial), w.trace)
            else:
                out = self._call("crosscheck", w.workload.bench, w.up.base_url, w.trial.model.name,
                                 w.up.model_dir or w.up.tokenizer_path, _reference_timeout(w.trial) + 300)
        finally:
            w.mark("crosscheck_end")
        load = self._call("crosscheck", w.replica.end_side_accounting)
        self.server_alive_or_raise("crosscheck")  # a reference whose server died reads nothing about the harness
        return out, load

    # ------------------------------------------------------------------ the result
    def _result(self, run: Any, figures: WindowFigures, checks: dict[str, Verification],
                references: dict[str, BareRun | NodeError], ref_load: dict[str, dict[str, float]],
                params: dict[str, Any], warnings: list[str], started: float) -> TrialResult:
        w, trial, up = self.w, self.w.trial, self.w.up
        self._enter("result")
        warnings.extend(run.warnings)
        if params.get("prefix_cache_reset") == PrefixCacheReset.FAILED.value:
            warnings.append("the prefix cache could not be reset before the window: it did not start empty")
        metrics = summarize_trial(run, figures.server, figures.span_rows, slo=trial.slo)
        metrics.update(figures.span)
        metrics.update(figures.accounting)
        metrics.update(figures.attribution)
        params.update(figures.attribution_params)
        fidelity = replay_fidelity_of(sessions_of(trial), run.records, figures.block_size,
                                      metrics.get("prefix_hit_rate"))
        if fidelity is not None:
            metrics.update(fidelity.metrics)
            params["replay_fidelity"] = fidelity.diagnosis
        if up.repin_s is not None and params.get("window_on_start") == 1:
            metrics["repin_s"] = up.repin_s
        if params.get("window_on_start") == 1 and not params.get("repinned"):  # the start this window followed
            metrics.update(up.startup)
        for who, ref in references.items():
            if isinstance(ref, NodeError):
                warnings.append(f"cross-check ({who}) failed: {ref.message}")
                continue
            (w.tdir / f"{who}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ref.rows))
            metrics.update(crosscheck_metrics(run.records, ref.rows, who))
            if who == "bare":
                metrics.update(crosscheck_load(metrics, ref_load.get(who, {})))
        warnings.extend(load_warnings(metrics))
        status, kind, message = TrialStatus.COMPLETED, ErrorKind.NONE, ""
        bad = [k for k, v in checks.items() if not v.ok]
        if not figures.alive:  # the process exited, or runs but stopped answering: it cannot serve either way
            status, kind, message = TrialStatus.FAILED, ErrorKind.SERVER_DIED, "vLLM exited during the window"
        elif bad:
            self.server_alive_or_raise("verify")  # a dead tree has no threads to be inside its cores
            status, kind = TrialStatus.FAILED, ErrorKind.RESTRICTION_VIOLATED
            message = "threads outside their core set in: " + ", ".join(
                f"{k} ({'; '.join(checks[k].violations[:3])})" for k in bad)
        return TrialResult(trial_id=trial.trial_id, status=status, error_kind=kind, message=message,
                           records=tuple(run.records), metrics=metrics, params=flat_params(params),
                           warnings=tuple(warnings), artifacts_dir=str(w.tdir), telemetry=tuple(figures.rows),
                           started_at=started, ended_at=time.time())


def flat_params(params: dict[str, Any]) -> dict[str, str]:
    """MLflow params are strings; core sets use the Linux cpu-list form ("0-3,8") everywhere."""
    out = {}
    for k, v in params.items():
        if isinstance(v, (list, tuple, set, frozenset)):
            v = format_cpulist(v) if k.endswith("_cpus") else ",".join(str(x) for x in sorted(v))
        out[k] = str(v)
    return out


def _reference_timeout(trial: TrialSpec) -> float:
    """A reference run's own deadline: its window, every request's deadline after it, and start-up slack."""
    w = trial.workload
    return w.max_duration_s + w.request_timeout_s + 120.0


__all__ = ["HARNESS", "STEPS", "Window", "WindowSequence", "flat_params", "order_label", "order_of"]
