"""build_vllm_command / server_env are pure: flags pass through untouched; multicast stays off for TP >= 2."""

import pytest

from orchestrator.node.replica import MULTICAST_OFF_ENV, VLLM_SERVE_SHIM, build_vllm_command, scratch_paths, server_env
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
from orchestrator.values.trial import TrialSpec
from workloads.spec import AgenticWorkload


def trial(gpus: int = 0, args: tuple[str, ...] = (), env: dict[str, str] | None = None, api_servers: int = 1,
          **server: object) -> TrialSpec:
    return TrialSpec(sweep="s", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=gpus, cores=2,
                     restriction="affinity", start="fresh", vllm=VllmVariant(name="v", args=args, env=env or {}),
                     workload=AgenticWorkload(name="w", sessions=1, turns=1), server=ServerSpec(**server),
                     client=ClientSpec(), repeat=0, api_servers=api_servers)


def test_cpu_command() -> None:
    t = trial(block_size=32, max_model_len=2048)
    cmd = build_vllm_command(t, "/m", 8123, "/py")
    assert cmd[:5] == ["/py", "-c", VLLM_SERVE_SHIM, "serve", "/m"]
    joined = " ".join(cmd)
    for part in ("--served-model-name tiny", "--host 127.0.0.1", "--port 8123",
                 "--load-format dummy", "--max-model-len 2048", "--block-size 32", "--enable-prefix-caching",
                 "--enable-prompt-tokens-details"):
        assert part in joined
    assert "--tensor-parallel-size" not in cmd and "--compilation-config" not in cmd
    assert build_vllm_command(t, "/m", 8123, "/py") == cmd  # deterministic


def test_api_server_count_only_when_asked() -> None:
    assert "--api-server-count" not in build_vllm_command(trial(), "/m", 1, "/py")
    cmd = build_vllm_command(trial(api_servers=3), "/m", 1, "/py")
    assert cmd[cmd.index("--api-server-count") + 1] == "3"


def test_dev_mode_serves_the_prefix_cache_reset() -> None:
    assert server_env(trial(), frozenset({0}), "/s")["VLLM_SERVER_DEV_MODE"] == "1"


def test_optional_flags() -> None:
    cmd = build_vllm_command(trial(enable_prefix_caching=False), "/m", 1, "/py")
    assert "--no-enable-prefix-caching" in cmd and "--block-size" not in cmd


def test_user_args_last_and_untouched() -> None:
    args = ("--enforce-eager", "--max-num-seqs", "7", "--compilation-config", '{"level": 0}', "--x=a b")
    cmd = build_vllm_command(trial(gpus=4, args=args), "/m", 1, "/py")
    assert tuple(cmd[-len(args):]) == args
    assert cmd.count("--compilation-config") == 1  # the user's own wins; ours is not added


@pytest.mark.parametrize("gpus", [2, 8])
def test_multicast_off_for_tp(gpus: int) -> None:
    t = trial(gpus=gpus)
    cmd = build_vllm_command(t, "/m", 1, "/py")
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == str(gpus)
    assert cmd[cmd.index("--compilation-config") + 1] == '{"pass_config":{"fuse_allreduce_rms":false}}'
    env = server_env(t, frozenset(range(8)), "/s")
    for k, v in MULTICAST_OFF_ENV.items():
        assert env[k] == v
    assert env["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm" and env["NCCL_NVLS_ENABLE"] == "0"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_single_gpu_has_no_multicast_settings() -> None:
    env = server_env(trial(gpus=1), frozenset({2, 3}), "/s")
    assert not set(MULTICAST_OFF_ENV) & set(env)
    assert "--tensor-parallel-size" not in build_vllm_command(trial(gpus=1), "/m", 1, "/py")


def test_cpu_env() -> None:
    t = trial(cpu_kvcache_gib=3, env={"OMP_NUM_THREADS": "99", "FOO": "bar"})
    env = server_env(t, frozenset({1, 2, 3}), "/scratch")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1-3"
    assert env["RAYON_NUM_THREADS"] == "3" and env["TOKENIZERS_PARALLELISM"] == "true"
    assert env["OMP_NUM_THREADS"] == "99" and env["FOO"] == "bar"  # the variant's env wins
    assert env["VLLM_CACHE_ROOT"] == "/scratch/vllm-cache" and env["TMPDIR"] == "/scratch/tmp"
    assert server_env(t, frozenset({1, 2, 3}), "/scratch", "quota")["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert server_env(t, frozenset({1, 2, 3}), "/scratch") == env  # pure
    assert server_env(t, frozenset({1}), "/scratch", cache_root="/shared/vc")["VLLM_CACHE_ROOT"] == "/shared/vc"


def test_long_scratch_gets_short_rpc_path() -> None:
    paths = scratch_paths("/very/" + "long/" * 20)
    assert len(paths["VLLM_RPC_BASE_PATH"]) < 60


def test_a_server_script_replaces_vllm_with_the_same_address_and_the_variants_args() -> None:
    t = trial(args=("--ttft-ms", "30"))
    cmd = build_vllm_command(t, "/m", 8123, "/py", server_script="/b/standin.py")
    assert cmd == ["/py", "/b/standin.py", "--host", "127.0.0.1", "--port", "8123", "--model", "tiny",
                   "--max-model-len", str(t.server.max_model_len), "--ttft-ms", "30"]
    assert VLLM_SERVE_SHIM not in build_vllm_command(t, "/m", 8123, "/py", server_script="/b/standin.py")
    assert build_vllm_command(t, "/m", 8123, "/py", server_script=None) == build_vllm_command(t, "/m", 8123, "/py")


def test_a_sweep_cannot_ask_for_the_stand_in() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="stack"):
        ServerSpec(stack="standin")
