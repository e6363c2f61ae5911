"""Pure expansion of a SweepSpec into a SweepPlan of TrialSpecs, and the keys that group trials.

A *trial* is one fully resolved combination of factors plus a repeat index (the values themselves,
and how a trial's id is hashed, are in :mod:`orchestrator.values.trial`). Expansion decides the
order: trials that can share a warm replica or one start stay together.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from orchestrator.values.sweep_spec import RestrictionMode, StartMode, SweepSpec
from orchestrator.values.trial import SweepPlan, TrialSpec, trial_hash
from workloads.loaders import in_flight  # the most requests a workload keeps in flight (its kind's field)


def expand(spec: SweepSpec) -> SweepPlan:
    """Cross every axis into trials (pure, deterministic).

    The order is model → hardware → gpus → vllm variant → api servers → stack → start → restriction → workload →
    repeat → cores, so consecutive trials differ only in cores: that is the order in which a `repin` replica
    or a warm compile cache is reused, and repeats are interleaved (one repeat of every core count before
    the next repeat), never all of one configuration in a row. With ``protocol.share_start`` the fresh
    trials go cores → repeat → workload instead, so the windows that share one start are consecutive. ``protocol.order: shuffled`` then permutes
    the fresh-start trials with a seeded RNG (see :func:`shuffled`). ``grid.calibrate`` adds the start mode
    the grid lacks for those core counts.
    """
    g = spec.grid
    starts = list(g.start)
    if g.calibrate:
        starts += [m for m in ("fresh", "repin") if m not in starts]
    trials = []

    server = spec.server
    if server.cudagraph_sizes == "match-load":  # resolved here, so the trial records the sizes it ran with
        server = server.model_copy(update={"cudagraph_sizes": match_load_sizes(spec.workloads)})

    def server_for(stack: str) -> Any:
        if stack == server.stack:
            return server
        return server.model_copy(update={"stack": stack, "serve_frontend": "inside"}
                                 if stack != "ray-serve" else {"stack": stack})

    def trial(model: Any, hw: str, gpus: int, variant: Any, api_servers: int, stack: str, workload: Any,
              start: StartMode, restriction: RestrictionMode, repeat: int, cores: int) -> TrialSpec:
        return TrialSpec(
            sweep=spec.name, model=model, hardware=hw, gpus=gpus, cores=cores, restriction=restriction,
            start=start, vllm=variant, workload=workload, server=server_for(stack), client=spec.client,
            repeat=repeat, api_servers=api_servers, protocol=spec.protocol, telemetry=spec.telemetry,
            slo=spec.slo)

    for model, hw, gpus, variant, api_servers, stack, start, restriction in itertools.product(
        spec.models, g.hardware, g.gpus, g.vllm, g.api_servers, g.stack or (spec.server.stack,), starts,
        g.restriction,
    ):
        base = (model, hw, gpus, variant, api_servers, stack)
        core_counts = _cores_for(start, g.start, g.cores, g.calibrate)
        if spec.protocol.share_start and start != "repin":
            # One start per core count serves its windows: repeat-major, workloads alternating.
            for cores, repeat, workload in itertools.product(core_counts, range(spec.repeat_count), spec.workloads):
                trials.append(trial(*base, workload, start, restriction, repeat, cores))
        else:
            for workload, repeat, cores in itertools.product(spec.workloads, range(spec.repeat_count), core_counts):
                trials.append(trial(*base, workload, start, restriction, repeat, cores))
    if spec.protocol.order == "shuffled":
        trials = shuffled(trials, spec.protocol.seed)
    return SweepPlan(spec=spec, trials=tuple(trials))


def match_load_sizes(workloads: Any, cap: int = 512) -> tuple[int, ...]:
    """CUDA-graph capture sizes for ``server.cudagraph_sizes: match-load`` (pure): vLLM's default pattern
    (1, 2, 4, then every 8) cut at the most requests any workload keeps in flight, rounded up to 8 and at
    most ``cap`` (vLLM's default largest size). A decode step of up to that many requests is padded to
    the same size as under the default set, so it replays the same graph; only the larger (mixed
    prefill) steps the default would also have captured run without one."""
    top = min(cap, -(-max(in_flight(w) for w in workloads) // 8) * 8)
    return tuple(s for s in (1, 2, 4, *range(8, cap + 1, 8)) if s <= top)


def replica_key(trial: TrialSpec) -> str:
    """Trials with the same key can share one live replica: they differ only in cores or repeat."""
    return trial_hash(trial.model_dump(mode="json", exclude={"trial_id", "cores", "repeat"}))


def start_key(trial: TrialSpec) -> str:
    """Trials with the same key can be windows of one start (``protocol.share_start``): they differ only
    in workload or repeat, so the same server pinned to the same cores serves them all."""
    return trial_hash(trial.model_dump(mode="json", exclude={"trial_id", "workload", "repeat"}))


def chain_key(trial: TrialSpec) -> str | None:
    """What a trial shares with its neighbours in the plan: a repin group's replica, a shared start; None."""
    if trial.start == "repin":
        return "repin:" + replica_key(trial)
    if trial.protocol.share_start:
        return "start:" + start_key(trial)
    return None


def chains(trials: list[TrialSpec] | tuple[TrialSpec, ...]) -> list[list[TrialSpec]]:
    """The trials cut into runs that must stay together, in order, on one replica: consecutive trials
    with the same :func:`chain_key` (a repin group, the windows of one shared start); every other
    trial alone. Chains can run concurrently; the trials of one chain cannot."""
    out: list[list[TrialSpec]] = []
    last: str | None = None
    for t in trials:
        key = chain_key(t)
        if out and key is not None and key == last:
            out[-1].append(t)
        else:
            out.append([t])
        last = key
    return out


def shuffled(trials: list[TrialSpec], seed: int) -> list[TrialSpec]:
    """A seeded random order of the fresh-start trials; what shares one server stays together and in
    order: each repin group (one live replica re-pinned down its core counts) in its place, and the
    windows of one shared start (``protocol.share_start``) as one unit of the shuffle."""
    groups = chains(trials)
    movable = [g for g in groups if g[0].start != "repin"]
    random.Random(seed).shuffle(movable)
    it = iter(movable)
    return [t for g in groups for t in (next(it) if g[0].start != "repin" else g)]


def _cores_for(start: str, asked: tuple[str, ...], cores: tuple[int, ...], calibrate: tuple[int, ...]) -> list[int]:
    """Core counts of one start mode, in run order.

    fresh: ascending. repin: descending, so one replica starts on the most cores and is re-pinned down
    (the way a live re-pin was measured). A mode added only for calibration runs the calibrated counts,
    plus (for repin) the largest count as the replica's starting point.
    """
    if start in asked:
        wanted = set(cores) | set(calibrate)
    elif start == "repin":
        wanted = set(calibrate) | {max(cores)}
    else:
        wanted = set(calibrate)
    return sorted(wanted, reverse=(start == "repin"))


__all__ = ["chain_key", "chains", "expand", "match_load_sizes", "replica_key", "shuffled", "start_key"]
