"""Spec validation and plan expansion: pure, no services."""

from pathlib import Path

import pytest

from orchestrator.plan.expand import expand
from orchestrator.plan.load import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[3]


def base(**over):
    data = {
        "name": "t",
        "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 2, "turns": 2}],
        "grid": {"cores": [1, 2, 4]},
    }
    data.update(over)
    return data


def test_smoke_sweep_is_valid_and_small():
    plan = expand(load_spec(ROOT / "sweeps" / "smoke.yaml"))
    assert [t.cores for t in plan.trials] == [1, 2]
    assert {t.model.name for t in plan.trials} == {"tiny-llama"}
    assert all(t.gpus == 0 and t.hardware == "cpu" for t in plan.trials)


def test_expand_crosses_every_axis():
    spec = parse_spec(base(grid={"cores": [2, 1], "gpus": [1, 2], "vllm": [{"name": "a"}, {"name": "b",
                                                                                             "args": ["--x"]}]},
                           repeats=2))
    plan = expand(spec)
    assert len(plan) == 2 * 2 * 2 * 2
    # cores vary fastest, sorted, so consecutive trials can share a warm replica
    assert [t.cores for t in plan.trials[:2]] == [1, 2]
    assert len({t.trial_id for t in plan.trials}) == len(plan)


def test_trial_id_is_stable_and_sensitive():
    a = expand(parse_spec(base())).trials
    b = expand(parse_spec(base())).trials
    assert [t.trial_id for t in a] == [t.trial_id for t in b]
    c = expand(parse_spec(base(workloads=[{"name": "w", "kind": "agentic", "sessions": 3, "turns": 2}]))).trials
    assert a[0].trial_id != c[0].trial_id
    assert len(a[0].trial_id) == 12


def test_vllm_flags_pass_through_untouched():
    args = ["--enforce-eager", "--compilation-config", '{"level": 0}']
    t = expand(parse_spec(base(grid={"cores": [1], "vllm": [{"name": "eager", "args": args}]}))).trials[0]
    assert list(t.vllm.args) == args


@pytest.mark.parametrize("patch, field", [
    ({"grid": {"cores": [0]}}, "grid.cores.0"),
    ({"grid": {"cores": [1], "restriction": ["pinning"]}}, "grid.restriction.0"),
    ({"grid": {"cores": [1, 1]}}, "grid.cores"),
    ({"bogus": 1}, "bogus"),
    ({"models": []}, "models"),
    ({"workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1, "sesions": 2}]}, "sesions"),
    ({"workloads": [{"name": "w", "kind": "nope"}]}, "workloads.0"),
])
def test_bad_fields_are_named(patch, field):
    with pytest.raises(SpecError) as err:
        parse_spec(base(**patch), "x.yaml")
    assert "x.yaml" in str(err.value) and field in str(err.value)


def test_bad_yaml_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: t\nmodels:\n  - name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml:\d+:\d+: invalid YAML"):
        load_spec(f)


def test_bad_yaml_names_where_the_broken_construct_opened(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: t\nmodels: [{name: m, shape: tiny-llama}]\n"
                 "workloads: [{name: w, kind: agentic, sessions: 1, turns: 1}]\n"
                 "grid: {cores: [1, 2],\n  gpus: [0]\n  restriction: [affinity]}\n")
    with pytest.raises(SpecError) as err:
        load_spec(f)
    assert str(err.value) == (f"{f}:6:3: invalid YAML: while parsing a flow mapping (opened at line 4, column 7): "
                              "expected ',' or '}', but got '<scalar>'")


def test_yaml_error_without_a_context_is_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: t\n  models: x\n")
    with pytest.raises(SpecError) as err:
        load_spec(f)
    assert str(err.value) == f"{f}:2:9: invalid YAML: mapping values are not allowed here"


def test_unknown_shape_is_a_spec_error_with_file_line_and_field(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: t\nmodels:\n  - name: m\n    shape: llama-9000\n"
                 "workloads: [{name: w, kind: agentic, sessions: 1, turns: 1}]\ngrid: {cores: [1]}\n")
    with pytest.raises(SpecError) as err:
        load_spec(f)
    assert f"{f}:4: models.0.shape: Value error, unknown model shape 'llama-9000'; known: llama-3.1-70b, " \
           "llama-3.1-8b, qwen3-30b-a3b, tiny-llama" in str(err.value)


def test_bad_field_error_gives_the_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text((ROOT / "sweeps" / "smoke.yaml").read_text().replace("cores: [1, 2]", "cores: [1, -2]"))
    with pytest.raises(SpecError) as err:
        load_spec(f)
    line = next(i for i, s in enumerate(f.read_text().splitlines(), 1) if "cores: [1, -2]" in s)
    assert f"s.yaml:{line}: grid.cores.1" in str(err.value)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


def test_trace_paths_resolve_against_the_sweep_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: t\nmodels: [{name: m, shape: tiny-llama}]\n"
                 "workloads: [{name: mc, kind: mooncake, path: traces/x.jsonl}]\ngrid: {cores: [1]}\n")
    spec = load_spec(f)
    assert spec.workloads[0].path == (tmp_path / "traces" / "x.jsonl").resolve()


def test_repin_runs_descending_and_calibration_adds_the_missing_mode():
    plan = expand(parse_spec(base(grid={"cores": [1, 2, 4], "start": ["fresh"], "calibrate": [1]})))
    got = [(t.start, t.cores) for t in plan.trials]
    assert got == [("fresh", 1), ("fresh", 2), ("fresh", 4), ("repin", 4), ("repin", 1)]
    plan = expand(parse_spec(base(grid={"cores": [1, 2, 4], "start": ["repin"]})))
    assert [t.cores for t in plan.trials] == [4, 2, 1]


@pytest.mark.parametrize("slo, field", [
    ({"ttft_s": 0}, "slo.ttft_s"),
    ({"tpot_s": -0.1}, "slo.tpot_s"),
    ({"ttft_s": "fast"}, "slo.ttft_s"),
    ({"ttft": 1.0}, "slo.ttft"),
    ({}, "slo: Value error, give ttft_s, tpot_s or both"),
])
def test_bad_slo_fields_are_named(slo, field):
    with pytest.raises(SpecError) as err:
        parse_spec(base(slo=slo), "x.yaml")
    assert "x.yaml" in str(err.value) and field in str(err.value)


def test_slo_error_gives_the_line(tmp_path):
    f = tmp_path / "s.yaml"
    text = (ROOT / "sweeps" / "smoke.yaml").read_text()
    assert "  tpot_s: 0.25" in text
    f.write_text(text.replace("  tpot_s: 0.25", "  tpot_s: -1"))
    with pytest.raises(SpecError) as err:
        load_spec(f)
    line = next(i for i, s in enumerate(f.read_text().splitlines(), 1) if "tpot_s: -1" in s)
    assert f"s.yaml:{line}: slo.tpot_s" in str(err.value)


def test_slo_is_not_part_of_the_trial_id():
    without = expand(parse_spec(base())).trials
    with_slo = expand(parse_spec(base(slo={"ttft_s": 1.5, "tpot_s": 0.1}))).trials
    other = expand(parse_spec(base(slo={"ttft_s": 3.0}))).trials
    assert [t.trial_id for t in without] == [t.trial_id for t in with_slo] == [t.trial_id for t in other]
    assert all(t.slo is not None and t.slo.ttft_s == 1.5 and t.slo.tpot_s == 0.1 for t in with_slo)
    assert all(t.slo is None for t in without)
    # a trial's JSON (with its SLO) reads back, its trial_id checked against the fields
    back = type(with_slo[0]).model_validate_json(with_slo[0].model_dump_json())
    assert back == with_slo[0] and back.trial_id == without[0].trial_id


def test_smoke_sweep_slo_leaves_its_trial_ids():
    spec = load_spec(ROOT / "sweeps" / "smoke.yaml")
    assert spec.slo is not None
    plan = expand(spec)
    bare = expand(spec.model_copy(update={"slo": None}))
    assert [t.trial_id for t in plan.trials] == [t.trial_id for t in bare.trials]


def test_grid_stack_compares_serving_stacks_under_the_same_cores():
    base = {"name": "s", "models": [{"name": "m", "shape": "tiny-llama"}],
            "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}], "grid": {"cores": [1, 2]}}
    plain = expand(parse_spec(base))
    both = expand(parse_spec({**base, "grid": {"cores": [1, 2], "stack": ["vllm", "ray-serve"]}}))
    assert [(t.server.stack, t.cores) for t in both.trials] == [("vllm", 1), ("vllm", 2), ("ray-serve", 1),
                                                                 ("ray-serve", 2)]
    assert [t.trial_id for t in both.trials[:2]] == [t.trial_id for t in plain.trials]  # the default stack's ids
    assert len({t.trial_id for t in both.trials}) == 4 and both.trials[2].factors()["stack"] == "ray-serve"
    with pytest.raises(SpecError, match="grid.stack"):
        parse_spec({**base, "grid": {"cores": [1], "stack": ["vllm", "vllm"]}})


def test_repeats_left_out_is_one_for_a_cpu_only_sweep():
    spec = parse_spec(base())
    assert spec.repeats == 1 and not spec.repeats_given
    assert {t.repeat for t in expand(spec).trials} == {0}


@pytest.mark.parametrize("gpus", [[1], [0, 1], [4, 8]])
def test_repeats_left_out_is_three_when_any_trial_has_gpus(gpus):
    spec = parse_spec(base(grid={"cores": [1, 2], "gpus": gpus}))
    assert spec.repeats == 3 and not spec.repeats_given
    plan = expand(spec)
    assert len(plan) == 2 * len(gpus) * 3
    assert {t.repeat for t in plan.trials} == {0, 1, 2}  # every trial, the CPU ones of a mixed grid too


def test_repeats_given_is_kept_as_written_with_gpus():
    grid = {"cores": [1, 2], "gpus": [1]}
    one = parse_spec(base(grid=grid, repeats=1))
    assert one.repeats == 1 and one.repeats_given
    assert len(expand(one)) == 2
    assert parse_spec(base(grid=grid, repeats=5)).repeats == 5
    assert parse_spec(base(repeats=3)).repeats == 3  # and a CPU-only sweep may ask for more


def test_default_repeats_only_add_trials():
    """The default's repeats are trials added beside the ones an explicit ``repeats: 1`` plans: same ids."""
    grid = {"cores": [1, 2], "gpus": [1]}
    first = [t.trial_id for t in expand(parse_spec(base(grid=grid, repeats=1))).trials]
    default = expand(parse_spec(base(grid=grid))).trials
    assert [t.trial_id for t in default if t.repeat == 0] == first
    assert len({t.trial_id for t in default}) == len(default) == 3 * len(first)


def test_a_dumped_spec_keeps_repeats_left_out():
    spec = parse_spec(base())
    dumped = spec.model_dump(mode="json")
    assert "repeats" not in dumped
    again = parse_spec(dumped)
    assert again == spec and not again.repeats_given
    # copied into a grid with GPUs, it takes that grid's default
    assert parse_spec({**dumped, "grid": {"cores": [1], "gpus": [1]}}).repeats == 3
    assert parse_spec(base(repeats=1)).model_dump(mode="json")["repeats"] == 1


def test_repeats_default_leaves_a_bad_grid_to_its_own_error():
    with pytest.raises(SpecError) as err:
        parse_spec(base(grid={"cores": [1], "gpus": [-1]}), "x.yaml")
    assert "grid.gpus.0" in str(err.value) and "repeats" not in str(err.value)


def test_committed_sweeps_keep_their_repeats():
    """Every committed sweep says how often it repeats, so the GPU default adds no trial to any of them."""
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        spec = load_spec(path)
        assert spec.repeats_given, f"{path.name} leaves repeats out"


def test_structured_output_is_part_of_the_trial_and_refuses_the_bench_reference():
    w = {"name": "w", "kind": "agentic", "sessions": 2, "turns": 2}
    free = expand(parse_spec(base(workloads=[w]))).trials
    both = expand(parse_spec(base(workloads=[w, {**w, "name": "w-json", "structured_output": {}}]))).trials
    assert {t.trial_id for t in free} < {t.trial_id for t in both} and len(both) == 2 * len(free)
    parse_spec(base(workloads=[{**w, "structured_output": {}}], protocol={"crosscheck": True}))  # the bare client
    with pytest.raises(SpecError, match=r"'vllm-bench' cannot send the response_format of workloads \['w'\]"):
        parse_spec(base(workloads=[{**w, "structured_output": {"fraction": 0.5}}],
                        protocol={"crosscheck": "auto", "crosscheck_clients": ["bare", "vllm-bench"]}), "x.yaml")
    with pytest.raises(SpecError, match="workloads.0.structured_output.tools"):
        parse_spec(base(workloads=[{**w, "structured_output": {"tools": "nope"}}]), "x.yaml")
