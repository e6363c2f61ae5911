"""One vLLM-CPU server for every test of this folder: they need a server, not a start of their own.

A dev-mode replica of the tiny shape (eager; ``/reset_prefix_cache`` served; vLLM's profiler on, into
``replica.profile_dir``, recording only when a test asks), restricted to the last core, started once for the folder (package scope) and stopped after its last test, leaving no process,
port or cgroup behind. A test that reads the prefix cache's state resets it first.
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest
from itest import LAST_CORE, scratch_dir, tiny_trial


@pytest.fixture(scope="package")
def tiny_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Iterator[VllmReplica]:  # noqa: F821
    from orchestrator.infra.net import port_is_free
    from orchestrator.node.gpu_profile import profiler_launch
    from orchestrator.node.replica import VllmReplica, free_port

    work = tmp_path_factory.mktemp("shared-replica")
    args, env = profiler_launch(work / "gpu-profile")  # test_gpu_profile's captures; idle until asked
    replica = VllmReplica(tiny_trial(args=("--enforce-eager", *args), env={"VLLM_SERVER_DEV_MODE": "1", **env}),
                          tiny_model_dir, LAST_CORE, free_port(), work, "affinity",
                          scratch_dir=scratch_dir(tmp_path_factory))
    replica.profile_dir = work / "gpu-profile"
    pids: set[int] = set()
    try:
        replica.start()
        print(f"shared server healthy after {replica.wait_healthy(600):.1f} s")
        pids = {int(k.split("/")[0]) for k in replica.verify(strict=False).allowed}
        yield replica
    finally:
        report = replica.stop()
        assert report["leftover_pids"] == [] and report["port_free"], report
        assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert port_is_free(replica.port)
