"""A server's lifeline to the process that started it: when that process dies, the server dies too.

Every server a run starts (the MLflow server on the driver, each vLLM replica in its Ray actor) is
a session leader (``start_new_session=True``), so no terminal signal and no group kill of its
starter reaches it, and a starter killed with SIGKILL runs no ``finally``. So the server runs as
the child of a small watchdog, the leader of the server's process group, which

* polls ``getppid()``: when its starter dies (or is re-parented away), it SIGTERMs the whole group
  (the server and its workers: vLLM's engine core and GPU workers, MLflow's uvicorn), waits up to
  ``grace_s``, then SIGKILLs the group and itself;
* absorbs SIGTERM while the server runs, so a normal stop (SIGTERM to the group) waits for the
  server to shut down cleanly instead of the leader vanishing at once;
* exits with the server's exit status (128 + N for a signal N).

``PR_SET_PDEATHSIG`` would be the kernel's way, but it fires when the *thread* that forked exits
(Ray runs actor methods on pool threads), and reaches only the direct child, not vLLM's engine
core or MLflow's uvicorn grandchildren. The watchdog is stdlib only and runs under ``python -S``,
so it needs nothing from the server's environment; inside a restricted replica it runs on the
replica's cores and is verified with the rest of the tree (a wake-up every half second).
"""

from __future__ import annotations

import os
import sys

# argv: starter pid, grace seconds, then the server's command.
WATCHDOG = """\
import os, signal, subprocess, sys, time
parent, grace = int(sys.argv[1]), float(sys.argv[2])
child = subprocess.Popen(sys.argv[3:])
signal.signal(signal.SIGTERM, lambda *_: None)
while child.poll() is None:
    if os.getppid() != parent:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(0, signal.SIGKILL)
    time.sleep(0.5)
sys.exit(child.returncode if child.returncode >= 0 else 128 - child.returncode)
"""


def with_watchdog(cmd: list[str], *, python: str | None = None, grace_s: float = 10.0) -> list[str]:
    """``cmd`` run under the watchdog, tied to this process. Start the result with ``start_new_session=True``."""
    return [python or sys.executable, "-S", "-c", WATCHDOG, str(os.getpid()), str(grace_s), *cmd]


__all__ = ["WATCHDOG", "with_watchdog"]
