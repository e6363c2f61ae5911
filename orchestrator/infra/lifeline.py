"""Lifelines: whatever a run starts dies when the process that started it dies, even by SIGKILL.

A process killed with SIGKILL runs no ``finally``, and the servers a run starts are session
leaders (``start_new_session=True``) that no terminal signal or group kill of the starter
reaches. Two mechanisms, both keyed to a pipe whose only write end the starter holds: the
kernel closes it when the starter dies, however it dies, and the reader sees end-of-file.

* :class:`Lifeline`, for a server whose process group we own (the MLflow server on the
  driver, each vLLM replica in its Ray actor). The server is exec'd in place by a tiny
  ``python -S`` prelude (so ``Popen.pid`` is the server itself), which first forks a watchdog
  into the server's process group, as the server's child. The watchdog ends the whole group
  (the server and its workers: vLLM's engine core and GPU workers, MLflow's uvicorn) when the
  starter dies (end-of-file on the pipe) **or** when the server itself dies: Ray SIGKILLs an
  exiting actor's direct children, which is the server, and vLLM's engine core does not
  follow its API server. SIGTERM, ``grace_s``, then SIGKILL. On a normal stop the group's
  SIGTERM ends the watchdog too. Inside a restricted replica the watchdog runs on the
  replica's cores and is verified with the rest of the tree (a wake-up every half second).
* :class:`Guardian`, for processes whose group is not ours: the local Ray head that
  ``ray.init`` starts in the driver's own process group (GCS and raylet die with the driver,
  but its dashboard and runtime-env agents linger for minutes trying to report to the dead
  GCS). The driver hands it processes (pid and start time, :func:`orchestrator.infra.survivors.entry_of`);
  when the pipe ends it ends those still alive, exactly as the next run's reap would.

``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that forked exits (Ray runs actor
methods on pool threads) and reaches only the direct child.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# argv: read end of the lifeline pipe, grace seconds, then the server's command. Forks the watchdog
# (stays in the group, child of the server), closes the pipe in the server, execs the server in place.
PRELUDE = """\
import os, select, signal, sys, time
fd, grace, cmd = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
server = os.getpid()
if os.getpgid(0) != server:  # never end a group we do not lead (the starter's own)
    os.setpgid(0, 0)
if os.fork() == 0:
    while os.getppid() == server and not select.select([fd], [], [], 0.5)[0]:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    group, me = os.getpgid(0), os.getpid()
    def others():
        for p in os.listdir("/proc"):
            try:
                st = open("/proc/" + p + "/stat").read()
                fields = st[st.rfind(")") + 2:].split()
                if int(p) != me and int(fields[2]) == group and fields[0] != "Z":
                    return True
            except (OSError, ValueError, IndexError):
                pass
        return False
    os.killpg(group, signal.SIGTERM)
    end = time.monotonic() + grace
    while others() and time.monotonic() < end:
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)
    os._exit(0)
os.close(fd)
os.execvp(cmd[0], cmd)
"""


class Lifeline:
    """One server's lifeline: ``wrap`` its command, start it with ``Popen(..., pass_fds=line.pass_fds,
    start_new_session=True)``, then ``started()``. Keep the object while the server runs: dropping or
    ``cut()``-ting it ends the server's group."""

    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self._read, self._write = os.pipe()  # both close-on-exec; the read end is passed on explicitly

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,) if self._read >= 0 else ()

    def wrap(self, cmd: list[str], python: str | None = None) -> list[str]:
        return [python or sys.executable, "-S", "-c", PRELUDE, str(self._read), str(self.grace_s), *cmd]

    def started(self) -> None:
        """Close this process's copy of the read end (the server holds its own)."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def cut(self) -> None:
        """End the lifeline: the watchdog ends the server's group. Idempotent."""
        self.started()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1

    def __del__(self) -> None:  # pragma: no cover (interpreter exit)
        with contextlib.suppress(OSError):
            self.cut()


# argv: the project root (for orchestrator.infra.survivors), grace seconds. Reads JSON entries, one per line,
# from stdin until end-of-file, then ends those still alive with their recorded start time.
GUARDIAN = """\
import json, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.path.insert(0, sys.argv[1])
from orchestrator.infra import survivors
entries = []
for line in sys.stdin:
    entries.append(json.loads(line))
lines = survivors.end(entries, grace_s=float(sys.argv[2]), why="outlived its run")
if lines:
    print("\\n".join(lines), file=sys.stderr, flush=True)
"""


class Guardian:
    """A process that ends the processes handed to it when this process dies or calls ``close()``."""

    def __init__(self, grace_s: float = 5.0, log: Path | None = None) -> None:
        out = open(log, "ab") if log is not None else None  # noqa: SIM115 - closed below, once the child holds it
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", GUARDIAN, str(Path(__file__).resolve().parents[2]),
                                          str(grace_s)], stdin=subprocess.PIPE,
                                         stdout=out if out is not None else subprocess.DEVNULL,
                                         stderr=out if out is not None else subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            if out is not None:
                out.close()
        assert self.proc.stdin is not None  # stdin=PIPE
        self._stdin = self.proc.stdin

    def watch(self, entries: list[dict[str, Any]]) -> None:
        for e in entries:
            self._stdin.write((json.dumps(e) + "\n").encode())
        self._stdin.flush()

    def close(self, timeout_s: float = 30.0) -> None:
        """End what was handed over and is still alive, and wait for the guardian. Idempotent."""
        if not self._stdin.closed:
            self._stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


__all__ = ["GUARDIAN", "PRELUDE", "Guardian", "Lifeline"]
