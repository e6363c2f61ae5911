"""The local MLflow server's command line (``local_servers._mlflow_cmd``): the default sqlite store is named on it;
any other store (a cluster's PostgreSQL URI, which holds a password) is not, since ``mlflow_server`` passes it
in the environment, where other users of the machine cannot read it."""

from __future__ import annotations

from pathlib import Path

from orchestrator.infra.local_servers import _mlflow_cmd


def test_sqlite_store_on_the_command_line(tmp_path: Path) -> None:
    cmd = _mlflow_cmd(tmp_path, "127.0.0.1", 5055)
    i = cmd.index("--backend-store-uri")
    assert cmd[i + 1] == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    assert cmd[cmd.index("--workers") + 1] == "1" and cmd[cmd.index("--port") + 1] == "5055"


def test_another_store_stays_off_the_command_line(tmp_path: Path) -> None:
    cmd = _mlflow_cmd(tmp_path, "127.0.0.1", 5055, sqlite=False, workers=4)
    assert "--backend-store-uri" not in cmd and not any("sqlite" in a for a in cmd)
    assert cmd[cmd.index("--workers") + 1] == "4"
    assert cmd[cmd.index("--artifacts-destination") + 1] == str((tmp_path / "artifacts").resolve())
