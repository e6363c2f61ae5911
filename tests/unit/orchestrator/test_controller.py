"""SweepController with a fake executor: retries, resume, failures as data, the state machine."""

import pytest

from orchestrator.control.controller import SweepController
from orchestrator.control.trial import IllegalTransition, Trial, TrialState
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec
from orchestrator.values.results import ErrorKind, TrialResult, TrialStatus


def plan(max_failures=1):
    return expand(parse_spec({
        "name": "t", "max_failures": max_failures,
        "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 3]},
    }))


class FakeExecutor:
    def __init__(self, outcomes):
        self.outcomes = outcomes  # cores -> list of ErrorKind (NONE = success), consumed in order
        self.calls = []
        self.attempts = []  # (cores, attempt) per call

    def execute(self, trial, *, attempt=1):
        self.calls.append(trial.cores)
        self.attempts.append((trial.cores, attempt))
        kind = self.outcomes.get(trial.cores, [ErrorKind.NONE]).pop(0) if self.outcomes.get(trial.cores) \
            else ErrorKind.NONE
        if kind is ErrorKind.NONE:
            return TrialResult(trial.trial_id, TrialStatus.COMPLETED, metrics={"ttft_p50_s": 1.0 / trial.cores})
        if kind is ErrorKind.INTERNAL:
            raise RuntimeError("boom")
        return TrialResult.failed(trial.trial_id, kind, "x")


class Recorder:
    def __init__(self):
        self.events = []

    def on_sweep_start(self, plan):
        self.events.append("start")

    def on_trial_start(self, trial):
        self.events.append(f"trial{trial.cores}")

    def on_trial_result(self, trial, result):
        self.events.append(f"result{trial.cores}:{result.status.value}")

    def on_sweep_end(self, plan, results):
        self.events.append("end")


class Broken(Recorder):
    def on_trial_result(self, trial, result):
        raise ValueError("observer bug")


def test_all_complete_and_observers_see_everything():
    rec = Recorder()
    c = SweepController(plan(), FakeExecutor({}), observers=[Broken(), rec])
    results = c.run()
    assert [r.status for r in results] == [TrialStatus.COMPLETED] * 3
    assert rec.events[0] == "start" and rec.events[-1] == "end"
    assert rec.events.count("result2:COMPLETED") == 1


def test_retryable_failure_is_retried_then_succeeds():
    ex = FakeExecutor({2: [ErrorKind.NODE_DIED, ErrorKind.NONE]})
    c = SweepController(plan(max_failures=1), ex)
    results = c.run()
    assert ex.calls == [1, 2, 2, 3]
    assert ex.attempts == [(1, 1), (2, 1), (2, 2), (3, 1)]  # each attempt is numbered for its own folder
    assert all(r.ok for r in results)
    t2 = c.trials[plan().trials[1].trial_id]
    assert t2.attempts == 2 and TrialState.RETRYING in t2.history


def test_config_error_is_final_without_retry():
    ex = FakeExecutor({1: [ErrorKind.CANNOT_FIT]})
    c = SweepController(plan(max_failures=3), ex)
    results = c.run()
    assert ex.calls == [1, 2, 3]
    assert results[0].error_kind is ErrorKind.CANNOT_FIT
    assert c.trials[plan().trials[0].trial_id].state is TrialState.FAILED


def test_retries_are_bounded():
    ex = FakeExecutor({3: [ErrorKind.SERVER_DIED] * 5})
    SweepController(plan(max_failures=2), ex).run()
    assert ex.calls.count(3) == 3


def test_executor_exception_becomes_internal_failure():
    results = SweepController(plan(), FakeExecutor({1: [ErrorKind.INTERNAL]})).run()
    assert results[0].error_kind is ErrorKind.INTERNAL and "boom" in results[0].message


def test_resume_skips_finished_trials():
    p = plan()
    done = {p.trials[0].trial_id, p.trials[2].trial_id}
    ex = FakeExecutor({})
    c = SweepController(p, ex, finished=lambda: done)
    results = c.run()
    assert ex.calls == [2] and len(results) == 1
    assert c.trials[p.trials[0].trial_id].state is TrialState.SKIPPED


def test_interrupt_still_ends_the_sweep_for_observers_then_unwinds():
    class Interrupting(FakeExecutor):
        def execute(self, trial, *, attempt=1):
            if trial.cores == 2:
                raise KeyboardInterrupt("signal 15")
            return super().execute(trial, attempt=attempt)

    rec = Recorder()
    with pytest.raises(KeyboardInterrupt):
        SweepController(plan(), Interrupting({}), observers=[rec]).run()
    assert rec.events == ["start", "trial1", "result1:COMPLETED", "trial2", "end"]


def test_state_machine_rejects_illegal_moves():
    t = Trial("x")
    with pytest.raises(IllegalTransition):
        t.transition(TrialState.COMPLETED)
    t.transition(TrialState.RUNNING)
    t.transition(TrialState.COMPLETED)
    assert t.done
    with pytest.raises(IllegalTransition):
        t.transition(TrialState.RUNNING)


def test_a_config_error_in_a_repin_chain_fails_its_later_trials_unstarted_and_spares_other_chains():
    p = expand(parse_spec({
        "name": "t", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
        "grid": {"cores": [1, 2, 3], "start": ["repin"], "stack": ["ray-serve", "vllm"]}, "repeats": 2,
    }))

    class Refuses(FakeExecutor):
        def execute(self, trial, *, attempt=1):
            if trial.server.stack == "ray-serve":
                self.calls.append((trial.server.stack, trial.cores))
                return TrialResult.failed(trial.trial_id, ErrorKind.CONFIG, "Ray Serve LLM refused the config")
            return super().execute(trial, attempt=attempt)

    ex = Refuses({})
    results = {r.trial_id: r for r in SweepController(p, ex).run()}
    serve = [t for t in p.trials if t.server.stack == "ray-serve"]
    assert len(serve) == 6 and ex.calls.count(("ray-serve", 3)) == 1 and sum(isinstance(c, tuple) for c in ex.calls) == 1
    first, *rest = serve
    assert results[first.trial_id].message == "Ray Serve LLM refused the config"
    for t in rest:
        r = results[t.trial_id]
        assert r.error_kind is ErrorKind.CONFIG and r.message.startswith(f"not started: trial {first.trial_id} ")
        assert "Ray Serve LLM refused the config" in r.message
    assert all(results[t.trial_id].ok for t in p.trials if t.server.stack == "vllm")
