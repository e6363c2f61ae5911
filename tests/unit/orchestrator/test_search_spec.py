"""`search:` and `repeats: {min, max, until_ci}` in the sweep file: parsing, errors that name the field,
and the candidates of a knee search having the grid's trial ids."""

from __future__ import annotations

import pytest

from orchestrator.plan.expand import expand
from orchestrator.plan.load import SpecError, parse_spec
from orchestrator.values.sweep_spec import RepeatsSpec, SearchSpec


def base(**over):
    return {"name": "s", "models": [{"name": "tiny", "shape": "tiny-llama"}],
            "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}],
            "grid": {"cores": [1, 2, 4]}, **over}


def test_grid_is_the_default_and_stays_out_of_the_dumped_spec():
    spec = parse_spec(base())
    assert spec.search == SearchSpec(kind="grid")
    assert "search" not in spec.model_dump(mode="json")


def test_knee_as_a_word_or_a_mapping_with_budgets():
    assert parse_spec(base(search="knee")).search.kind == "knee"
    spec = parse_spec(base(search={"kind": "knee", "max_trials": 5, "max_gpu_hours": 1.5},
                           repeats={"min": 1, "max": 4, "until_ci": 0.05}))
    assert spec.search == SearchSpec(kind="knee", max_trials=5, max_gpu_hours=1.5)
    assert spec.repeats == RepeatsSpec(min=1, max=4, until_ci=0.05) and spec.repeat_count == 4
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_an_int_repeats_is_the_searchs_max():
    spec = parse_spec(base(search="knee", repeats=2))
    assert spec.repeat_policy == RepeatsSpec(min=1, max=2) and spec.repeat_count == 2


@pytest.mark.parametrize(("over", "field", "says"), [
    ({"search": "knee", "grid": {"cores": [2]}}, "search", "at least two core counts"),
    ({"search": "knee", "repeats": {"min": 3, "max": 2}}, "repeats", "repeats.min (3) is more than repeats.max (2)"),
    ({"repeats": {"max": 2}}, "search", "repeats: {min, max, until_ci} applies to search: knee only"),
    ({"search": {"kind": "grid", "max_trials": 3}}, "search", "apply to kind: knee only"),
    ({"search": "bisect"}, "search.kind", "'grid' or 'knee'"),
    ({"search": {"kind": "knee", "max_gpu_hours": 0}}, "search.max_gpu_hours", "greater than 0"),
    ({"search": "knee", "repeats": {"max": 2, "untill_ci": 0.1}}, "repeats", "untill_ci"),
])
def test_bad_values_name_their_field(over, field, says):
    with pytest.raises(SpecError) as err:
        parse_spec(base(**over))
    line = next(ln for ln in str(err.value).splitlines() if says in ln)
    assert f"<spec>: {field}" in line


def test_the_candidates_are_the_grids_trials_with_the_same_ids():
    grid = expand(parse_spec(base(repeats=3)))
    knee = expand(parse_spec(base(repeats={"max": 3}, search={"kind": "knee", "max_trials": 4})))
    assert [t.trial_id for t in knee.trials] == [t.trial_id for t in grid.trials]
    fewer = expand(parse_spec(base(repeats=2, search="knee")))
    assert {t.trial_id for t in fewer.trials} == {t.trial_id for t in grid.trials if t.repeat < 2}
