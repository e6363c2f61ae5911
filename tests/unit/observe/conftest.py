"""A small synthetic sweep for the report tests: trials as ``report.runs_frame`` rows, with per-request records
whose summary metrics come from ``workloads.metrics.summarize`` (so the records and the table agree).

- model ``m``, workloads ``chat`` (GPU-like: server and GPU figures recorded) and ``code`` (CPU-like: none);
- cores 1, 2, 4, 8; two repeats each; TTFT of a request ~ ``base(cores) * lognormal(0, 0.3)``,
  ``base(c) = 0.05 + 0.4 / c`` for chat and ``0.08 + 0.2 / c`` for code;
- chat at 1 core: 60% of its requests time out; code at 1 core: vLLM never got healthy (startup_timeout).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from workloads.metrics import summarize
from workloads.records import RequestRecord, records_to_frame

CORES = (1, 2, 4, 8)
BASE = {"chat": lambda c: 0.05 + 0.4 / c, "code": lambda c: 0.08 + 0.2 / c}
FACTORS = {"model": "m", "hardware": "cpu", "gpus": 0, "vllm_variant": "default", "api_servers": 1, "stack": "vllm",
           "text_style": "agent-mix", "restriction": "affinity", "start": "fresh"}


@dataclass
class Sweep:
    trials: pd.DataFrame
    records: dict[str, pd.DataFrame]


def records_for(rng: np.random.Generator, base: float, n: int, timeout_share: float = 0.0) -> list[RequestRecord]:
    out, t = [], 0
    for i in range(n):
        sent = t + 1_000
        ttft = int(base * float(rng.lognormal(0.0, 0.3)) * 1e9)
        status = "timeout" if rng.random() < timeout_share else "ok"
        first = sent + ttft if status == "ok" else None
        tokens = tuple(first + 20_000_000 * k for k in range(4)) if first is not None else ()
        end = tokens[-1] + 1 if tokens else sent + 30 * 10**9
        out.append(RequestRecord(request_id=f"r{i}", session_id=f"s{i % 4}", turn=i // 4, scheduled_ns=t, sent_ns=sent,
                                 first_token_ns=first, token_ns=tokens, end_ns=end, prompt_tokens=500,
                                 completion_tokens=len(tokens), cached_tokens=400, client_prompt_tokens=500,
                                 tokenize_ns=1000, status=status))
        t += 50_000_000
    return out


def build_sweep(n: int = 80, seed: int = 7) -> Sweep:
    rng = np.random.default_rng(seed)
    rows, records = [], {}
    for workload in ("chat", "code"):
        for cores in CORES:
            for repeat in (0, 1):
                tid = f"{workload}-c{cores}-r{repeat}"
                row = {"trial_id": tid, **FACTORS, "workload": workload, "cores": cores, "repeat": repeat}
                if workload == "code" and cores == 1:
                    rows.append({**row, "status": "FAILED", "error_kind": "startup_timeout"})
                    continue
                recs = records_for(rng, BASE[workload](cores), n, 0.6 if (workload, cores) == ("chat", 1) else 0.0)
                metrics = summarize(recs)
                if workload == "chat":
                    metrics.update(server_ttft_s_mean=BASE[workload](cores), server_frontend_s_mean=0.3 / cores,
                                   gpu0_util_mean=90.0 - 60.0 / cores, replica_cpu_util_mean=95.0)
                rows.append({**row, "status": "COMPLETED", "error_kind": "none", **metrics})
                records[tid] = records_to_frame(recs)
    return Sweep(pd.DataFrame(rows), records)


@pytest.fixture(scope="module")
def sweep() -> Sweep:
    return build_sweep()


@pytest.fixture
def make_records():
    """``make_records(base_s, n, timeout_share=0.0, seed=0)``: records as in :func:`records_for`."""
    return lambda base, n, timeout_share=0.0, seed=0: records_for(np.random.default_rng(seed), base, n, timeout_share)


def outbox_sweep(box, records_for_trial, *, name: str = "box-sweep", cores=(1, 2, 4), slo=None):
    """An outbox holding one sweep as the tracker leaves it when MLflow is down: ``sweep.json`` and one committed
    entry per trial (``outbox.trial_payload`` + ``stage_trial`` + ``commit``); the last core count's trial fails
    with startup_timeout when ``records_for_trial`` returns None for it. Returns the plan."""
    from orchestrator.observe import outbox
    from orchestrator.plan.expand import expand
    from orchestrator.plan.load import parse_spec
    from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
    from workloads.metrics import summarize

    plan = expand(parse_spec({
        "name": name, "models": [{"kind": "shape", "name": "tiny-llama", "shape": "tiny-llama"}],
        "workloads": [{"kind": "agentic", "name": "agentic-short", "sessions": 2, "turns": 2}],
        "grid": {"cores": list(cores)}, "repeats": 2,
    }))
    sweep = outbox.sweep_payload(plan, experiment=name, git_commit=None, spec_yaml=None)
    if slo is not None:
        sweep["spec"]["slo"] = slo
    outbox.write_sweep(box, sweep)
    for t in plan.trials:
        recs = records_for_trial(t)
        if recs is None:
            result = TrialResult.failed(t.trial_id, ErrorKind.STARTUP_TIMEOUT, "not healthy")
        else:
            result = TrialResult(t.trial_id, TrialStatus.COMPLETED, records=tuple(recs), metrics=summarize(recs))
        payload = outbox.trial_payload(t, result)
        outbox.commit(outbox.stage_trial(box, payload, records=outbox.records_frame(result.records)))
    return plan


@pytest.fixture
def make_outbox():
    """:func:`outbox_sweep` as a fixture."""
    return outbox_sweep
