"""Every MLflow search the docs show a user, run as written against a real MLflow server, finds what they say.

The searches are read from the docs (README's search-box block and mlflow/README's table), never copied
here. A constructed sweep is logged through the product's real ``MlflowTracker``: two models, 1 and 4
cores, 1 and 2 GPUs (tensor parallel), fresh and repin starts; one trial failed at start-up and was
retried, one still fails, one fell back from cpuset to affinity, half have a frontend slower than
100 ms. Each search must find exactly the runs its meaning picks out of what was logged (computed from
the logged attempts, not listed by hand). A search added to the docs needs its meaning here, so no
search reaches a user untried. No vLLM or Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.observe.tracking import MlflowTracker
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.callbacks import CallbackList
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus
from orchestrator.values.trial import TrialSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def doc_searches() -> list[str]:
    """Every MLflow search the docs show a user: README's search-box block and mlflow/README's table."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("Searches that work in the UI's search box:", 1)[1].split("```", 2)[1]
    found = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    table = (ROOT / "mlflow" / "README.md").read_text().split("## Useful searches in the UI", 1)[1]
    found += [row.split("`")[1] for row in table.splitlines() if row.startswith("| `")]
    return sorted({q for q in found if q})


@dataclass
class Attempt:
    """One logged attempt of a trial (one child run), or the sweep's parent run (``trial`` None)."""

    trial: TrialSpec | None
    n: int = 0
    status: TrialStatus = TrialStatus.COMPLETED
    kind: ErrorKind = ErrorKind.NONE
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    latest: bool = True

    @property
    def key(self) -> tuple[str, int]:
        return (self.trial.trial_id, self.n) if self.trial is not None else ("parent", 0)


def _child(check: Callable[[TrialSpec, Attempt], bool]) -> Callable[[Attempt], bool]:
    return lambda a: a.trial is not None and check(a.trial, a)


# What each documented search means, over the logged attempts. '<id>' is the docs' placeholder: the
# retried trial's id is put in its place.
MEANING: dict[str, Callable[[Attempt], bool]] = {
    "params.cores = '4'": _child(lambda t, a: t.cores == 4),
    "params.cores = '4' and params.model = 'llama-3.1-8b'": _child(lambda t, a: t.cores == 4
                                                                   and t.model.name == "llama-3.1-8b"),
    "params.cores = '4' and params.model = 'llama-3.1-8b' and params.tp = '2'":
        _child(lambda t, a: t.cores == 4 and t.model.name == "llama-3.1-8b" and t.tensor_parallel == 2),
    "tags.superseded = 'false'": _child(lambda t, a: a.latest),
    "attributes.status = 'FAILED' and tags.superseded = 'false'":
        _child(lambda t, a: a.latest and a.status is TrialStatus.FAILED),
    "tags.error_kind = 'startup_timeout'": _child(lambda t, a: a.kind is ErrorKind.STARTUP_TIMEOUT),
    "params.restriction_fallback != ''": _child(lambda t, a: bool(a.params.get("restriction_fallback"))),
    "params.start = 'repin'": _child(lambda t, a: t.start == "repin"),
    "metrics.server_frontend_s_mean > 0.1": _child(lambda t, a: a.metrics.get("server_frontend_s_mean", 0) > 0.1),
    "tags.trial_id = '<id>'": _child(lambda t, a: t.trial_id == RETRIED[0]),
    "tags.orchestrator.kind = 'sweep'": lambda a: a.trial is None,
}
RETRIED: list[str] = []  # the trial id '<id>' stands for, set when the sweep is logged


def _log(uri: str, outbox: Path) -> list[Attempt]:
    plan = expand(parse_spec({
        "name": "doc-searches",
        "models": [{"name": "tiny-llama", "shape": "tiny-llama"}, {"name": "llama-3.1-8b", "shape": "llama-3.1-8b"}],
        "workloads": [{"kind": "agentic", "name": "w", "sessions": 2, "turns": 2}],
        "grid": {"cores": [1, 4], "gpus": [1, 2], "hardware": ["H200"], "start": ["fresh", "repin"]}, "repeats": 1,
    }))
    cbs = CallbackList([MlflowTracker(uri, outbox_dir=outbox, health_timeout_s=5)])
    cbs.on_sweep_start(plan)
    attempts, results = [Attempt(None)], []
    retried, failing, fell_back = plan.trials[0], plan.trials[5], plan.trials[2]
    RETRIED[:] = [retried.trial_id]
    for i, trial in enumerate(plan.trials):
        tries = [(TrialStatus.FAILED, ErrorKind.STARTUP_TIMEOUT)] if trial in (retried, failing) else []
        if trial is not failing:
            tries.append((TrialStatus.COMPLETED, ErrorKind.NONE))
        for n, (status, kind) in enumerate(tries, 1):
            params = {"restriction_fallback": "cpuset -> affinity: no writable cgroup"} if trial is fell_back else {}
            metrics: dict[str, Any] = {}
            if status is TrialStatus.COMPLETED:
                metrics = {"requests": 8.0, "ttft_p50_s": 0.1 * (1 + i), "server_frontend_s_mean": 0.05 + 0.1 * (i % 2)}
            result = TrialResult(trial.trial_id, status, error_kind=kind, message="" if n == len(tries) and
                                 status is TrialStatus.COMPLETED else "not healthy after 400 s", metrics=metrics,
                                 params=params, started_at=time.time() - 5, ended_at=time.time())
            cbs.on_trial_start(trial)
            cbs.on_trial_result(trial, result)
            attempts.append(Attempt(trial, n, status, kind, params, metrics, latest=n == len(tries)))
            results.append(result)
    cbs.on_sweep_end(plan, results)
    return attempts


def test_every_search_the_docs_show_runs_as_written_and_finds_what_they_say(mlflow_uri: str, tmp_path: Path) -> None:
    searches = doc_searches()
    assert len(searches) >= 10 and set(searches) == set(MEANING), set(searches) ^ set(MEANING)
    attempts = _log(mlflow_uri, tmp_path / "outbox")
    client = MlflowClient(mlflow_uri)
    exp = client.get_experiment_by_name("doc-searches")
    for doc in searches:
        query = doc.replace("<id>", RETRIED[0])
        runs = client.search_runs([exp.experiment_id], query, max_results=1000)
        found = sorted((r.data.tags["trial_id"], int(r.data.tags["attempt"])) if "trial_id" in r.data.tags
                       else ("parent", 0) for r in runs)
        want = sorted(a.key for a in attempts if MEANING[doc](a))
        assert want, f"{doc!r}: the logged sweep has nothing for it to find, so it proves nothing"
        assert found == want, f"{doc!r} found {found}, its meaning picks {want}"
