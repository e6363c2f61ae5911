"""Mutation-testing kills for error classification and the retry policy (orchestrator/values/results.py,
orchestrator/control/trial.py, ``SweepController._run_one``); see tests/MUTATION.md."""

from __future__ import annotations

import pickle

import pytest

from orchestrator.control.controller import SweepController
from orchestrator.control.trial import IllegalTransition, Trial, TrialState
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialFailure, TrialResult, TrialStatus


def test_only_infrastructure_failures_are_retryable() -> None:
    retryable = {k for k in ErrorKind if k.retryable}
    assert retryable == {ErrorKind.NODE_DIED, ErrorKind.SERVER_DIED, ErrorKind.STARTUP_TIMEOUT}


def test_a_trial_failure_survives_pickling_with_its_kind_and_message() -> None:
    exc = pickle.loads(pickle.dumps(TrialFailure(ErrorKind.CANNOT_FIT, "needs 9 cores")))
    assert type(exc) is TrialFailure and exc.kind is ErrorKind.CANNOT_FIT and str(exc) == "needs 9 cores"


def test_a_failed_result_keeps_what_else_it_was_given() -> None:
    r = TrialResult.failed("t1", ErrorKind.SERVER_DIED, "gone", artifacts_dir="/a", warnings=("w",))
    assert (r.trial_id, r.status, r.error_kind, r.message) == ("t1", TrialStatus.FAILED, ErrorKind.SERVER_DIED, "gone")
    assert r.artifacts_dir == "/a" and r.warnings == ("w",) and not r.ok


def test_an_illegal_move_names_the_trial_and_both_states() -> None:
    t = Trial("x7")
    t.transition(TrialState.RUNNING)
    t.transition(TrialState.COMPLETED)
    with pytest.raises(IllegalTransition, match="x7: COMPLETED -> RUNNING"):
        t.transition(TrialState.RUNNING)
    assert t.attempts == 1 and t.history == [TrialState.PENDING, TrialState.RUNNING] and t.done


def plan(max_failures: int):
    return expand(parse_spec({
        "name": "t", "max_failures": max_failures,
        "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1]},
    }))


class Scripted:
    """An executor that fails with the given kinds, then completes; an ``INTERNAL`` is a raised bug."""

    def __init__(self, kinds: list[ErrorKind]) -> None:
        self.kinds, self.attempts = list(kinds), []

    def execute(self, trial, *, attempt=1):
        self.attempts.append(attempt)
        if not self.kinds:
            return TrialResult(trial.trial_id, TrialStatus.COMPLETED)
        kind = self.kinds.pop(0)
        if kind is ErrorKind.INTERNAL:
            raise ValueError("bug in the executor")
        return TrialResult.failed(trial.trial_id, kind, kind.value)


@pytest.mark.parametrize("kind", [k for k in ErrorKind if k.retryable])
def test_a_retryable_failure_gets_exactly_max_failures_retries(kind: ErrorKind) -> None:
    p = plan(max_failures=2)
    ex = Scripted([kind] * 5)
    c = SweepController(p, ex)
    results = c.run()
    assert ex.attempts == [1, 2, 3]
    assert results[-1].error_kind is kind and c.trials[p.trials[0].trial_id].state is TrialState.FAILED
    ex = Scripted([kind, kind])  # the last allowed retry completes
    assert SweepController(plan(max_failures=2), ex).run()[-1].ok and ex.attempts == [1, 2, 3]


@pytest.mark.parametrize("kind", [k for k in ErrorKind if not k.retryable and k is not ErrorKind.NONE])
def test_a_non_retryable_failure_is_final_at_once(kind: ErrorKind) -> None:
    p = plan(max_failures=3)
    ex = Scripted([kind])
    c = SweepController(p, ex)
    results = c.run()
    assert ex.attempts == [1] and not results[-1].ok
    assert c.trials[p.trials[0].trial_id].state is TrialState.FAILED


def test_no_retries_with_max_failures_zero() -> None:
    ex = Scripted([ErrorKind.NODE_DIED])
    assert not SweepController(plan(max_failures=0), ex).run()[-1].ok and ex.attempts == [1]


def test_an_executor_bug_is_an_internal_failure_of_that_trial() -> None:
    p = plan(max_failures=3)
    results = SweepController(p, Scripted([ErrorKind.INTERNAL])).run()
    r = results[-1]
    assert r.trial_id == p.trials[0].trial_id and r.error_kind is ErrorKind.INTERNAL
    assert r.message == "ValueError: bug in the executor"


def test_an_executor_bug_is_logged_with_the_trial_and_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    p = plan(max_failures=0)
    with caplog.at_level("ERROR", logger="orchestrator.control.controller"):
        SweepController(p, Scripted([ErrorKind.INTERNAL])).run()
    logged = [r for r in caplog.records if r.name == "orchestrator.control.controller" and r.exc_info]
    assert [r.getMessage() for r in logged] == [f"executor raised for trial {p.trials[0].trial_id}"]
    assert logged[0].exc_info[0] is ValueError
