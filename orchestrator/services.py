"""Local services for the embedded default: a Ray head and an MLflow tracking server.

Infrastructure settings come from the environment, never from a sweep spec:
``RAY_ADDRESS`` (connect instead of starting Ray) and ``MLFLOW_TRACKING_URI``
(use that server instead of starting one). Whatever this module starts, it
stops: every server runs in its own process group and is killed as a group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from orchestrator.net import free_port, http_ok, port_is_free


class ServiceError(RuntimeError):
    pass


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL it. Idempotent."""
    if proc.poll() is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # reap stragglers of an exited leader
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=grace_s)


@dataclass
class MlflowServer:
    uri: str
    proc: subprocess.Popen | None  # None: an external server we did not start
    log_path: Path | None = None


def _mlflow_cmd(home: Path, host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{(home / 'mlflow.db').resolve()}",
        "--artifacts-destination", str((home / "artifacts").resolve()),
        "--serve-artifacts", "--host", host, "--port", str(port), "--workers", "1",
    ]


@contextmanager
def mlflow_server(home: Path, *, port: int = 5000, timeout_s: float = 90.0) -> Iterator[MlflowServer]:
    """Use ``MLFLOW_TRACKING_URI`` if set; else start a sqlite-backed server on 127.0.0.1 and stop it after."""
    external = os.environ.get("MLFLOW_TRACKING_URI")
    if external:
        yield MlflowServer(uri=external, proc=None)
        return
    home.mkdir(parents=True, exist_ok=True)
    if not port_is_free(port):
        port = free_port()
    log_path = home / "mlflow-server.log"
    with open(log_path, "ab") as log:
        # Job execution starts worker processes a sweep never uses; without them the server starts faster.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        proc = subprocess.Popen(_mlflow_cmd(home, "127.0.0.1", port), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=home, env=env)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while not http_ok(f"{uri}/health"):
            if proc.poll() is not None:
                raise ServiceError(f"MLflow server exited with {proc.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                raise ServiceError(f"MLflow server not healthy after {timeout_s:.0f} s; see {log_path}")
            time.sleep(0.3)
        yield MlflowServer(uri=uri, proc=proc, log_path=log_path)
    finally:
        kill_group(proc)


def ui_command(home: Path, port: int = 5000) -> str:
    """The command a user runs to browse a local sweep's results afterwards."""
    exe = Path(sys.executable).parent / "orchestrator"  # the venv's script, even when it is not on PATH
    cmd = "orchestrator"
    if exe.exists():
        rel = os.path.relpath(exe)
        cmd = str(exe) if rel.startswith("..") else rel
    return f"{cmd} ui --home {home}  (then open http://127.0.0.1:{port})"


@contextmanager
def ray_cluster(num_cpus: int | None = None) -> Iterator[dict]:
    """Connect to ``RAY_ADDRESS`` if set, else start a local Ray; shut it down after."""
    import ray

    address = os.environ.get("RAY_ADDRESS")
    if address:
        ctx = ray.init(address=address, log_to_driver=False)
    else:
        ctx = ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                       configure_logging=False)
    try:
        yield {"address": getattr(ctx, "address_info", {}).get("address", address or "local")}
    finally:
        ray.shutdown()


__all__ = ["MlflowServer", "ServiceError", "free_port", "kill_group", "mlflow_server", "ray_cluster", "ui_command"]
