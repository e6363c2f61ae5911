"""``cluster.yaml``'s node commands, as Ray will run them: each one a complete bash command (``bash -n``), and the
head's tracking server started on the PostgreSQL of ``mlflow/postgres.sh``.

A plain YAML value ends at `` #``: an ``echo '... # marker' >> ~/.bashrc`` written unquoted reaches Ray as half a
command with an unterminated quote, which fails the node's set-up. Nothing runs here but ``bash -n``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("setup_commands", "head_setup_commands", "worker_setup_commands", "head_start_ray_commands",
            "worker_start_ray_commands")


def _commands() -> list[tuple[str, str]]:
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    return [(section, cmd) for section in SECTIONS for cmd in config.get(section) or []]


@pytest.mark.parametrize(("section", "cmd"), _commands())
def test_every_command_parses_in_bash(section: str, cmd: str) -> None:
    assert isinstance(cmd, str), f"{section}: {cmd!r} is not a string"
    checked = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True, timeout=10)
    assert checked.returncode == 0, f"{section}: {cmd!r}: {checked.stderr}"


def test_bashrc_lines_keep_their_marker() -> None:
    """The lines that append to ~/.bashrc carry the marker their guard greps for, or every `ray up` appends again."""
    appends = [cmd for _, cmd in _commands() if ">> ~/.bashrc" in cmd]
    assert len(appends) == 2
    for cmd in appends:
        marker = cmd.split("grep -q '", 1)[1].split("'", 1)[0]
        assert cmd.rstrip().endswith(f"{marker}' >> ~/.bashrc"), cmd


def test_head_serves_mlflow_on_its_postgres() -> None:
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    setup, start = " ; ".join(config["head_setup_commands"]), config["head_start_ray_commands"]
    assert "mlflow/postgres.sh install" in setup and "[cluster]" in setup  # the package and the driver
    [pg] = [c for c in start if "postgres.sh start" in c]
    [server] = [c for c in start if "mlflow/server.sh" in c]
    assert start.index(pg) < start.index(server)
    assert 'MLFLOW_BACKEND_STORE_URI="$(' in server and "postgres.sh uri)" in server
    assert pg.count("MLFLOW_HOME=$HOME/orch-mlflow") == 1 and "MLFLOW_HOME=$HOME/orch-mlflow" in server
