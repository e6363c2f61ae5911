"""Shared fixtures: a real MLflow tracking server (sqlite backend) on 127.0.0.1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs two workers), each worker gets a temp folder of its own:
    Ray keeps its sessions, and the file a bare ``ray.init()`` looks for a running cluster in, under
    ``$TMPDIR/ray``, so one worker's Ray can never be joined or reaped by the other's tests."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        import tempfile

        base = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
        own = base / f"xdist-{worker}"
        own.mkdir(parents=True, exist_ok=True)
        os.environ["TMPDIR"] = str(own)
        tempfile.tempdir = None  # gettempdir() caches: read TMPDIR again


@pytest.fixture(scope="session", autouse=True)
def shared_vllm_cache(tmp_path_factory: pytest.TempPathFactory):
    """One vLLM cache root for the whole test session, as a team shares one across trials and nodes
    (``VLLM_CACHE_ROOT``): the tiny shape's torch.compile runs once, not in every test's fresh home."""
    saved = os.environ.get("VLLM_CACHE_ROOT")
    os.environ["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm-cache"))
    yield os.environ["VLLM_CACHE_ROOT"]
    if saved is None:
        os.environ.pop("VLLM_CACHE_ROOT", None)
    else:
        os.environ["VLLM_CACHE_ROOT"] = saved


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory):
    """Start a real ``mlflow server`` for the session and stop its process group afterwards."""
    from orchestrator.infra.local_servers import free_port, mlflow_server

    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        with mlflow_server(tmp_path_factory.mktemp("mlflow"), port=free_port()) as server:
            yield server.uri
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved


@pytest.fixture
def vllm_left():
    """A function listing the vLLM processes (API server, engine core, the lifeline's watchdog) still alive
    under this test process: only what the test started (through its own Ray), never anyone else's."""
    import psutil

    def left() -> list[str]:
        out = []
        for p in psutil.Process().children(recursive=True):
            try:
                cmd = " ".join(p.cmdline()) or p.name()
                if "vllm" in cmd.lower() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {cmd[:80]}")
            except psutil.Error:
                continue
        return out

    return left
