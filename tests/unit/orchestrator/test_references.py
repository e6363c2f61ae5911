"""crosscheck: auto (orchestrator.plan.references): the references run at each configuration's fewest and most
cores once, again only where they disagreed beyond the tolerance, and an end whose references measured
nothing is given back. The executor's wiring is tests/integration/test_knee_search.py's."""

from __future__ import annotations

import pytest

from orchestrator.plan.expand import expand
from orchestrator.plan.load import SpecError, parse_spec
from orchestrator.plan.references import FEWEST, MOST, ReferencePlan, configuration


def _plan(crosscheck="auto", cores=(1, 2, 4, 8), workloads=("a",), repeats=2, **protocol):
    spec = parse_spec({
        "name": "refs", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": w, "kind": "agentic", "sessions": 2, "turns": 1} for w in workloads],
        "grid": {"cores": list(cores)}, "repeats": repeats,
        "protocol": {"crosscheck": crosscheck, **protocol}})
    return expand(spec).trials


def _at(trials, cores, repeat=0, workload="a"):
    return next(t for t in trials if (t.cores, t.repeat, t.workload.name) == (cores, repeat, workload))


def test_the_ends_of_each_configuration_once_and_nothing_between():
    trials = _plan(workloads=("a", "b"))
    refs = ReferencePlan(trials)
    why = {}
    for t in trials:
        why[(t.workload.name, t.cores, t.repeat)] = w = refs.claim(t)
        refs.record(t, w, 1.02)  # agreed
    for w in ("a", "b"):
        assert why[(w, 1, 0)] == FEWEST and why[(w, 8, 0)] == MOST
        assert why[(w, 1, 1)] is None and why[(w, 8, 1)] is None
        assert all(why[(w, c, r)] is None for c in (2, 4) for r in (0, 1))
    assert refs.summary() == ["references (crosscheck: auto), tiny a: 1 cores (fewest cores), 8 cores (most cores)",
                              "references (crosscheck: auto), tiny b: 1 cores (fewest cores), 8 cores (most cores)"]


def test_again_only_while_the_last_reference_at_that_count_disagreed():
    trials = _plan(repeats=4, crosscheck_tolerance=0.10)
    refs = ReferencePlan(trials)
    first = _at(trials, 1, 0)
    assert refs.claim(first) == FEWEST
    refs.record(first, FEWEST, 1.25)  # the harness read 25% slower than the bare client
    second = _at(trials, 1, 1)
    assert refs.claim(second) == "disagreed by +25%"
    refs.record(second, "disagreed by +25%", 0.95)  # within 10%: agreed
    assert refs.claim(_at(trials, 1, 2)) is None
    # a disagreement at one count says nothing of another
    assert refs.claim(_at(trials, 2, 0)) is None
    # the edge: off by exactly the tolerance agrees
    most = _at(trials, 8, 0)
    assert refs.claim(most) == MOST
    refs.record(most, MOST, 1.10)
    assert refs.claim(_at(trials, 8, 1)) is None


def test_an_end_whose_references_measured_nothing_goes_back():
    trials = _plan()
    refs = ReferencePlan(trials)
    failed = _at(trials, 8, 0)
    assert refs.claim(failed) == MOST
    refs.record(failed, MOST, None)  # the trial failed: no ratio
    retry = _at(trials, 8, 1)
    assert refs.claim(retry) == MOST
    refs.record(retry, MOST, float("nan"))
    assert refs.claim(_at(trials, 8, 0)) == MOST
    assert refs.summary() == ["references (crosscheck: auto), tiny a: 8 cores (most cores)"]
    # a re-check after a disagreement that measured nothing gives back no end
    refs = ReferencePlan(trials)
    first = _at(trials, 1, 0)
    refs.record(first, refs.claim(first), 1.5)
    again = _at(trials, 1, 1)
    why = refs.claim(again)
    assert why == "disagreed by +50%"
    refs.record(again, why, None)
    assert refs.claim(_at(trials, 1, 0)) == "disagreed by +50%"  # not "fewest cores" a second time


def test_other_settings_are_not_decided_here():
    for crosscheck in (True, False, [2]):
        trials = _plan(crosscheck=crosscheck)
        refs = ReferencePlan(trials)
        assert all(refs.claim(t) is None for t in trials) and refs.summary() == []
    # a trial the plan did not list: its own cores are its ends until others come
    refs = ReferencePlan()
    t = _plan(cores=(4,))[0]
    assert refs.claim(t) == FEWEST


def test_the_configuration_leaves_out_cores_and_repeat_only():
    trials = _plan(workloads=("a", "b"))
    assert configuration(_at(trials, 1, 0)) == configuration(_at(trials, 8, 1))
    assert configuration(_at(trials, 1, 0)) != configuration(_at(trials, 1, 0, "b"))


def test_auto_and_its_tolerance_in_the_spec():
    trials = _plan(crosscheck_tolerance=0.2)
    assert trials[0].protocol.crosscheck == "auto" and trials[0].protocol.crosscheck_tolerance == 0.2
    assert not trials[0].protocol.crosschecks(1)  # the executor decides under auto
    # the tolerance does not change which trial is which
    assert [t.trial_id for t in _plan(crosscheck_tolerance=0.2)] == [t.trial_id for t in _plan()]
    with pytest.raises(SpecError, match="crosscheck"):
        _plan(crosscheck="sometimes")
    with pytest.raises(SpecError, match="crosscheck_tolerance"):
        _plan(crosscheck_tolerance=0)


def test_a_resumed_sweep_does_not_run_the_references_again_at_an_end_earlier_runs_had():
    trials = _plan(repeats=3, crosscheck_tolerance=0.10)
    refs = ReferencePlan(trials)
    # the interrupted run finished the most cores (agreed) and the fewest (disagreed by 40%), and one window between
    refs.resume([(_at(trials, 8, 0), MOST, 1.02), (_at(trials, 1, 0), FEWEST, 1.40), (_at(trials, 2, 0), None, None)])
    assert refs.claim(_at(trials, 8, 1)) is None                     # the most cores had theirs
    assert refs.claim(_at(trials, 1, 1)) == "disagreed by +40%"      # the fewest disagreed: again
    assert refs.summary() == ["references (crosscheck: auto), tiny a: 1 cores (fewest cores, disagreed by +40%), "
                              "8 cores (most cores)"]
    fresh = ReferencePlan(trials)  # without the earlier runs the most cores would claim its end again
    assert fresh.claim(_at(trials, 8, 1)) == MOST
