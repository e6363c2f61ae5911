#!/usr/bin/env python3
"""Stop exactly the processes one CI run started, and say which ones were still running.

Stdlib only, for the system ``python3`` (works before and without the project's venv). Linux only
(reads ``/proc``). Never kills by name: a process is this run's when

* its initial environment (``/proc/<pid>/environ``) holds the exact entry ``NAME=VALUE`` of the
  run's marker (default ``CPUSWEEP_CI_RUN=$CPUSWEEP_CI_RUN``). Every descendant inherits it, also
  those that leave the process group or session (vLLM, MLflow and Ray are started with
  ``start_new_session=True``); or
* (``run`` mode only) it descends from this script, which makes itself a child subreaper
  (``prctl(PR_SET_CHILD_SUBREAPER)``), so orphans of the command are re-parented to it instead of
  to init. This catches processes whose ``/proc/<pid>/environ`` no longer shows the marker:
  ``setproctitle`` (Ray's workers, ``ray::IDLE``) overwrites the environment area, and a process
  may be started with a cleaned environment.

Usage::

    reap.py run [--marker NAME=VALUE] [--grace S] -- CMD ARGS...   # run CMD, then reap; exits with CMD's status
    reap.py sweep [--marker NAME=VALUE] [--grace S] [--quiet]      # reap marker holders only

Reaping: SIGTERM to every process found, wait up to ``--grace`` seconds, SIGKILL what is left.
It prints ``left running: none`` or the list (pid, why it matched, command line), so leaks are
visible; finding leftovers never changes the exit status. Signals go through pidfds where the
system has them, so a pid recycled between the scan and the signal is never hit.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

DEFAULT_NAME = "CPUSWEEP_CI_RUN"
PR_SET_CHILD_SUBREAPER = 36


def say(msg: str) -> None:
    print(f"reap: {msg}", file=sys.stderr, flush=True)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in clock ticks) from /proc/<pid>/stat; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return rest[0], int(rest[1]), int(rest[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "?"
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    if not text:  # kernel threads, or a title written without NULs
        try:
            with open(f"/proc/{pid}/comm") as f:
                text = f"[{f.read().strip()}]"
        except OSError:
            text = "?"
    return text if len(text) <= 300 else text[:297] + "..."


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:  # another user's process, or gone
        return False


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _ancestors(pid: int) -> set[int]:
    out = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = _stat(pid)
        if st is None:
            break
        pid = st[1]
    return out


def find(marker: bytes, tree_root: int | None) -> dict[int, tuple[int, str]]:
    """{pid: (start time, why)} of live (non-zombie) processes of this run, never this script or its ancestors."""
    stats = {pid: st for pid in _pids() if (st := _stat(pid)) is not None}
    spare = _ancestors(os.getpid())
    found: dict[int, tuple[int, str]] = {}
    if tree_root is not None:
        children: dict[int, list[int]] = {}
        for pid, (_, ppid, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(tree_root, []))
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, []))
            found[pid] = (stats[pid][2], "descendant")
    for pid, (_, _, start) in stats.items():
        if _has_marker(pid, marker):
            why = found[pid][1] + "+marker" if pid in found else "marker"
            found[pid] = (start, why)
    return {pid: v for pid, v in found.items() if pid not in spare and stats[pid][0] not in ("Z", "X")}


class Target:
    """One process to stop, pinned down by a pidfd (or by its start time where there are no pidfds)."""

    def __init__(self, pid: int, start: int, why: str) -> None:
        self.pid, self.start, self.why = pid, start, why
        self.cmd = _cmdline(pid)
        self.fd: int | None = None
        if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
            try:
                self.fd = os.pidfd_open(pid)
            except OSError:
                self.fd = None
        st = _stat(pid)
        self.valid = st is not None and st[2] == start  # opened the process we scanned, not a recycled pid

    def alive(self) -> bool:
        st = _stat(self.pid)
        return self.valid and st is not None and st[2] == self.start and st[0] not in ("Z", "X")

    def signal(self, sig: int) -> None:
        if not self.alive():
            return
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError, OSError):
            pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _reap_zombies() -> None:
    """Collect exited children (as a subreaper, orphans of the command are ours to wait for)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap(marker: bytes, tree_root: int | None, grace_s: float, quiet: bool = False) -> list[Target]:
    """Stop this run's processes; return those that had to be stopped. ``quiet``: say nothing if none."""
    targets = [t for pid, (start, why) in sorted(find(marker, tree_root).items())
               if (t := Target(pid, start, why)).valid]
    label = marker.decode(errors="replace")
    if not targets:
        if not quiet:
            say(f"left running: none ({label})")
        return []
    say(f"!!! left running: {len(targets)} process(es) started by this run ({label}); stopping them:")
    for t in targets:
        say(f"!!!   pid {t.pid} [{t.why}] {t.cmd}")
    for t in targets:
        t.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap_zombies()
        if not any(t.alive() for t in targets):
            break
        time.sleep(0.1)
    stubborn = [t for t in targets if t.alive()]
    if stubborn:
        say(f"!!! still running {grace_s:g} s after SIGTERM, SIGKILL: {' '.join(str(t.pid) for t in stubborn)}")
        for t in stubborn:
            t.signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(t.alive() for t in stubborn):
            _reap_zombies()
            time.sleep(0.1)
    # Anything started meanwhile by a dying process (a shutdown hook, say) gets one more pass.
    late = [pid for pid in find(marker, tree_root) if pid not in {t.pid for t in targets}]
    survivors = [t.pid for t in targets if t.alive()] + late
    for t in targets:
        t.close()
    _reap_zombies()
    if survivors:
        say(f"!!! could not stop: {' '.join(map(str, survivors))}")
    else:
        say("all stopped")
    return targets


def run(cmd: list[str], marker: bytes, grace_s: float) -> int:
    name, _, value = marker.decode().partition("=")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        subreaper = False
    if not subreaper:
        say("cannot become a child subreaper; only processes with the marker will be found")
    child = subprocess.Popen(cmd, env={**os.environ, name: value})

    def forward(sig: int, _frame: object) -> None:
        try:
            child.send_signal(sig)
        except ProcessLookupError:
            pass

    # Ctrl-C already reaches the command through the terminal's process group; stay alive to reap.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    rc: int | None = None
    while rc is None:  # wait for the command, collecting re-parented orphans as they exit
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child.pid:
            rc = os.waitstatus_to_exitcode(status)
            child.returncode = rc
    if rc is None:
        rc = child.wait()
    reap(marker, os.getpid() if subreaper else None, grace_s)
    return 128 - rc if rc < 0 else rc  # killed by signal N: the shell's 128+N


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["run", "sweep"])
    ap.add_argument("--marker", default=None,
                    help=f"NAME=VALUE entry to look for (default {DEFAULT_NAME}=${DEFAULT_NAME})")
    ap.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL (default 5)")
    ap.add_argument("--quiet", action="store_true", help="print nothing when nothing is left running")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])  # run mode: -- CMD ARGS...
    cmd = argv[cut + 1:]
    marker = a.marker
    if marker is None:
        value = os.environ.get(DEFAULT_NAME, "")
        if not value and a.mode == "run":  # a run of its own: a fresh marker
            import uuid
            value = str(uuid.uuid4())
        marker = f"{DEFAULT_NAME}={value}"
    name, sep, value = marker.partition("=")
    if not name or not sep or len(value) < 8:
        ap.error(f"need a marker NAME=VALUE with a unique VALUE (8+ characters), got {marker!r}")
    if a.mode == "run":
        if not cmd:
            ap.error("run needs a command after --")
        return run(cmd, marker.encode(), a.grace)
    if cmd:
        ap.error("sweep takes no command")
    reap(marker.encode(), None, a.grace, quiet=a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
