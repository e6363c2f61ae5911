"""One run per home: an exclusive ``flock`` on ``ORCH_HOME/run.lock`` for the whole run.

Two runs of one home would run every trial twice at once, on one MLflow store and one outbox.
``flock`` is the lock because the kernel drops it when its holder dies, however it dies
(SIGKILL included): a dead run's lock is simply free, with no stale-lock guessing. The fd is
not inherited by the services the run starts (Python opens it close-on-exec), so an orphaned
server never keeps the home locked; ``orchestrator.infra.survivors.reap`` ends those instead.

The companion file ``run.pid`` says who holds the lock (pid, start time, command), so a refused
run can name it. The lock file itself is never deleted: deleting a lock file lets two runs lock
two different files.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

LOCK = "run.lock"
PIDFILE = "run.pid"


class HomeBusy(RuntimeError):
    """Another live run holds the home."""

    def __init__(self, home: Path, holder: dict[str, Any] | None) -> None:
        self.home, self.holder = home, holder or {}
        pid = self.holder.get("pid", "unknown")
        since = self.holder.get("started", "an unknown time")
        cmd = self.holder.get("cmd", "")
        super().__init__(f"another run holds {home} (pid {pid}, running since {since}{': ' + cmd if cmd else ''}); "
                         "wait for it to end, stop it, or give this run another --home")


def holder(home: Path) -> dict[str, Any] | None:
    """What ``run.pid`` says about the lock's holder (None if it says nothing readable)."""
    try:
        return json.loads((Path(home) / PIDFILE).read_text())
    except (OSError, ValueError):
        return None


def _read_holder(home: Path, wait_s: float = 1.0) -> dict[str, Any] | None:
    # The holder writes run.pid just after it locks: give a run that started this instant a moment.
    deadline = time.monotonic() + wait_s
    while (info := holder(home)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return info


@contextmanager
def home_lock(home: Path) -> Iterator[dict[str, Any]]:
    """Hold ``home``'s run lock for the block, or raise :class:`HomeBusy` at once. Yields what ``run.pid`` holds."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HomeBusy(home, _read_holder(home)) from None
        info = _me()
        tmp = home / (PIDFILE + ".tmp")
        tmp.write_text(json.dumps(info) + "\n")
        os.replace(tmp, home / PIDFILE)
        try:
            yield info
        finally:
            if (holder(home) or {}).get("pid") == info["pid"]:
                (home / PIDFILE).unlink(missing_ok=True)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _me() -> dict[str, Any]:
    p = psutil.Process()
    return {"pid": p.pid, "create_time": p.create_time(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(p.create_time())),
            "cmd": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:300]}


__all__ = ["HomeBusy", "LOCK", "PIDFILE", "holder", "home_lock"]
