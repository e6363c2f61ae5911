"""Start-up cuts (issue 16), pure parts: the explicit KV-cache size, CUDA-graph sizes matched to the load,
the sized start (start on more cores, pools sized for the trial's, pin before the window), the GPU
profile's flags, and the report's start-mode comparison."""

import math

import pandas as pd
import pytest

from orchestrator.control.placement import group_max_cores
from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.node.replica import build_vllm_command, inherited_env, server_env
from orchestrator.node.serve_replica import host_env
from orchestrator.node.window_figures import profile_delay
from orchestrator.observe.report.comparison import calibration
from orchestrator.plan.expand import chains, expand, match_load_sizes
from orchestrator.plan.load import SpecError, parse_spec
from orchestrator.values.sweep_spec import parse_bytes
from workloads.spec import AgenticWorkload, MooncakeWorkload


def spec(**over):
    base = {"name": "s", "models": [{"name": "m", "shape": "tiny-llama"}],
            "workloads": [{"name": "w", "kind": "agentic", "sessions": 4, "turns": 2, "concurrency": 12}],
            "grid": {"cores": [1, 2, 4], "gpus": [1], "hardware": ["H200"]}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return parse_spec(base)


@pytest.mark.parametrize("text,want", [("16GiB", 16 << 30), ("800MB", 800_000_000), ("1.5g", 1_500_000_000),
                                       ("4096", 4096), (" 2 mib ", 2 << 20)])
def test_parse_bytes(text, want):
    assert parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["", "GiB", "12 parsecs", "-3GB"])
def test_parse_bytes_refuses(bad):
    with pytest.raises(ValueError, match="not a size"):
        parse_bytes(bad)


def test_kv_cache_bytes_in_the_command_on_gpus_and_cpus():
    t = expand(spec(server={"kv_cache_bytes": "16GiB"})).trials[0]
    cmd = build_vllm_command(t, "/m", 1, "/py")
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(16 << 30)
    assert "VLLM_CPU_KVCACHE_SPACE" not in server_env(t, frozenset({1}), "/s")
    cpu = expand(spec(server={"kv_cache_bytes": "64MiB"}, grid={"gpus": [0], "hardware": ["cpu"]})).trials[0]
    cmd = build_vllm_command(cpu, "/m", 1, "/py")
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(64 << 20)
    # vLLM-CPU's own whole-GiB size would override the flag, and an empty one fails vLLM's int() at
    # engine start: it is left out, and one the server would inherit is dropped (also for a Serve host)
    assert "VLLM_CPU_KVCACHE_SPACE" not in server_env(cpu, frozenset({1}), "/s")
    outer = {"VLLM_CPU_KVCACHE_SPACE": "4", "HOME": "/h"}
    assert inherited_env(outer) == {"HOME": "/h"}
    assert "VLLM_CPU_KVCACHE_SPACE" not in host_env(outer, server_env(cpu, frozenset({1}), "/s"))
    assert host_env(outer, server_env(expand(spec(grid={"gpus": [0], "hardware": ["cpu"]})).trials[0],
                                      frozenset({1}), "/s"))["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_cpu_kvcache_gib_stays_the_cpu_default():
    cpu = expand(spec(server={"cpu_kvcache_gib": 2}, grid={"gpus": [0], "hardware": ["cpu"]})).trials[0]
    assert "--kv-cache-memory-bytes" not in build_vllm_command(cpu, "/m", 1, "/py")
    assert server_env(cpu, frozenset({1}), "/s")["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_a_bad_size_names_the_field():
    with pytest.raises(SpecError, match="kv_cache_bytes"):
        spec(server={"kv_cache_bytes": "lots"})


def test_match_load_sizes_follow_vllms_pattern_up_to_the_load():
    assert match_load_sizes([AgenticWorkload(name="a", sessions=1, turns=1, concurrency=12)]) == (1, 2, 4, 8, 16)
    assert match_load_sizes([AgenticWorkload(name="a", sessions=1, turns=1, concurrency=1)]) == (1, 2, 4, 8)
    two = [AgenticWorkload(name="a", sessions=1, turns=1, concurrency=3),
           AgenticWorkload(name="b", sessions=1, turns=1, concurrency=40)]
    assert match_load_sizes(two) == (1, 2, 4, 8, 16, 24, 32, 40)
    trace = MooncakeWorkload(name="m", path="x.jsonl")  # max_in_flight 1024: capped at vLLM's default 512
    assert match_load_sizes([trace])[-1] == 512


def test_match_load_is_resolved_into_the_trial_and_its_command():
    trials = expand(spec(server={"cudagraph_sizes": "match-load"})).trials
    assert {t.server.cudagraph_sizes for t in trials} == {(1, 2, 4, 8, 16)}
    cmd = build_vllm_command(trials[0], "/m", 1, "/py")
    i = cmd.index("--cudagraph-capture-sizes")
    assert cmd[i + 1:i + 6] == ["1", "2", "4", "8", "16"]
    explicit = expand(spec(server={"cudagraph_sizes": [8, 1, 4]})).trials[0]
    assert explicit.server.cudagraph_sizes == (1, 4, 8)


def test_new_server_fields_keep_old_trial_ids():
    plain = expand(spec()).trials
    dumped = plain[0].server.model_dump(mode="json")
    assert "kv_cache_bytes" not in dumped and "cudagraph_sizes" not in dumped
    cut = expand(spec(server={"kv_cache_bytes": 1 << 30})).trials
    assert {t.trial_id for t in plain}.isdisjoint({t.trial_id for t in cut})


def test_sized_start_reserves_the_groups_most_cores_and_sizes_pools_for_the_trial():
    plan = expand(spec(grid={"start": ["fresh", "sized"]}, repeats=1))  # one repeat: one trial per core count
    ex = RayTrialExecutor.__new__(RayTrialExecutor)  # lease_cores needs only the plan's group maxima
    ex.max_cores = group_max_cores(plan.trials)
    sized = [t for t in plan.trials if t.start == "sized"]
    fresh = [t for t in plan.trials if t.start == "fresh"]
    assert [t.cores for t in sized] == [1, 2, 4]
    assert {ex.lease_cores(t) for t in sized} == {4}
    assert [ex.lease_cores(t) for t in fresh] == [1, 2, 4]
    # one start per sized trial: no chain holds two of them
    assert all(len(c) == 1 for c in chains(sized))
    env = server_env(sized[0], frozenset({3}), "/s")  # the cores it will be pinned to
    assert env["OMP_NUM_THREADS"] == "1" and env["RAYON_NUM_THREADS"] == "1"


def test_sized_trials_share_a_start_across_workloads_with_share_start():
    plan = expand(spec(grid={"start": ["sized"]}, protocol={"share_start": True}, repeats=2))
    groups = chains(list(plan.trials))
    assert [len(g) for g in groups] == [2, 2, 2]
    assert all(len({t.cores for t in g}) == 1 for g in groups)


def test_profiler_flags_go_before_the_users_flags(tmp_path):
    from orchestrator.node.replica import VllmReplica

    t = expand(spec(telemetry={"gpu_profile": {"enabled": True}},
                    grid={"vllm": [{"name": "v", "args": ["--enforce-eager"]}]})).trials[0]
    r = VllmReplica(t, "/m", frozenset({0}), 8000, tmp_path / "w", scratch_dir=tmp_path / "s")
    assert r.resolved_args[-1] == "--enforce-eager"
    i = r.resolved_args.index("--profiler-config")
    assert str(tmp_path / "w" / "gpu-profile") in r.resolved_args[i + 1]
    plain = VllmReplica(expand(spec()).trials[0], "/m", frozenset({0}), 8000, tmp_path / "w2",
                        scratch_dir=tmp_path / "s")
    assert "--profiler-config" not in plain.resolved_args and plain.profile_dir is None


def test_the_capture_starts_after_the_ramp_and_ends_inside_the_run():
    assert profile_delay(20.0, 2.0) == 5.0
    assert profile_delay(3.0, 2.0) == 0.0
    assert profile_delay(600.0, 2.0) == 10.0
    assert profile_delay(6.0, 2.0) == 1.5  # a warm-up of 6 s


def _frame(rows):
    base = {"model": "m", "hardware": "H200", "gpus": 1, "vllm_variant": "default", "api_servers": 1,
            "stack": "vllm", "workload": "w", "text_style": "agent-mix", "restriction": "cpuset",
            "status": "COMPLETED"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_start_modes_against_fresh_with_the_repeats_noise():
    df = _frame([
        {"start": "fresh", "cores": 1, "repeat": 0, "ttft_p50_s": 0.50, "ttft_p90_s": 1.0},
        {"start": "fresh", "cores": 1, "repeat": 1, "ttft_p50_s": 0.60, "ttft_p90_s": 1.2},
        {"start": "sized", "cores": 1, "repeat": 0, "ttft_p50_s": 0.57, "ttft_p90_s": 1.1},
        {"start": "sized", "cores": 1, "repeat": 1, "ttft_p50_s": 0.59, "ttft_p90_s": 1.1},
        {"start": "fresh", "cores": 4, "repeat": 0, "ttft_p50_s": 0.20, "ttft_p90_s": 0.4},
        {"start": "sized", "cores": 4, "repeat": 0, "ttft_p50_s": 0.30, "ttft_p90_s": 0.4},
        {"start": "repin", "cores": 1, "repeat": 0, "ttft_p50_s": 0.90, "ttft_p90_s": 2.0},
    ])
    out = calibration(df).set_index(["start", "cores"])
    one = out.loc[("sized", 1)]
    assert math.isclose(one["ttft_p50_s_fresh"], 0.55) and math.isclose(one["p50_ratio"], 0.58 / 0.55)
    assert math.isclose(one["fresh_p50_spread"], 0.10 / 0.55)
    assert bool(one["within_10pct"]) and bool(one["within_noise"])
    four = out.loc[("sized", 4)]
    assert math.isclose(four["p50_ratio"], 1.5) and not four["within_10pct"] and not four["within_noise"]
    assert not out.loc[("repin", 1), "within_10pct"]
    assert calibration(df[df["start"] == "fresh"]).empty
