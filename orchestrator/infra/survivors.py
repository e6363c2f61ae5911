"""Processes a run started, written down, so the next run can end what a dead run left behind.

A driver killed with SIGKILL runs no ``finally``: its MLflow server and vLLM replicas live on
(each is a session leader, ``start_new_session=True``, so nothing takes them down), hold their
ports and GPUs, and the next run starts around them. So every service is recorded in
``ORCH_HOME/services.json`` when it starts (:func:`record`) and dropped when it is stopped
(:func:`forget`). The next run, once it holds the home's lock (so no live run owns anything
recorded there), calls :func:`reap`.

A process is identified by its pid **and** its start time (psutil ``create_time()``): a pid the
kernel has given to some other process since is never touched. A recorded process still alive
with the same start time is ended with its process group when it is still in the group it was
recorded in (SIGTERM, a grace period, then SIGKILL): vLLM's engine workers and MLflow's uvicorn
share their leader's group. A process group id cannot be reused while any member is alive, so a
verified member vouches for its group.

The file is read-modified-written under an ``flock`` of ``services.json.lock``: replicas in
other processes (Ray actors) record their servers concurrently.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil

FILE = "services.json"
_SAME_START_S = 0.01  # create_time has clock-tick (10 ms) resolution; a recycled pid differs by more


def _path(home: Path) -> Path:
    return Path(home) / FILE


@contextmanager
def _locked(home: Path) -> Iterator[list[dict[str, Any]]]:
    """The recorded entries, locked; what the caller leaves in the list is written back."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / (FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            path = _path(home)
            try:
                entries = json.loads(path.read_text()).get("processes", [])
            except (OSError, ValueError):
                entries = []
            before = list(entries)
            yield entries
            if entries != before:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"processes": entries}, indent=2) + "\n")
                os.replace(tmp, path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def recorded(home: Path) -> list[dict[str, Any]]:
    """The entries of ``services.json`` (a copy; [] when there is none)."""
    with _locked(home) as entries:
        return [dict(e) for e in entries]


def record(home: Path, role: str, pid: int, *, group: bool = True) -> dict[str, Any] | None:
    """Write down process ``pid`` (a service of ``role``: "mlflow", "vllm", ...) with its start time,
    process group and command. Returns the entry, or None when the process is already gone.
    ``group=False``: the process group is not ours (Ray's head shares the driver's), end the process only."""
    entry = entry_of(role, pid, group=group)
    if entry is None:
        return None
    with _locked(home) as entries:
        entries[:] = [e for e in entries if e["pid"] != pid] + [entry]
    return entry


def forget(home: Path, pid: int) -> None:
    """Drop the entry of ``pid`` (the service was stopped). Idempotent."""
    with _locked(home) as entries:
        entries[:] = [e for e in entries if e["pid"] != pid]


def _verified(entry: dict[str, Any]) -> psutil.Process | None:
    """The recorded process if it is still alive and is the same process (same start time)."""
    try:
        p = psutil.Process(int(entry["pid"]))
        if abs(p.create_time() - float(entry["create_time"])) > _SAME_START_S or not p.is_running():
            return None
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
        return None


def _group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return out


def _signal(groups: Iterable[int], procs: list[psutil.Process], sig: int) -> None:
    for g in groups:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(g, sig)
    for p in procs:
        with suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)


def reap(home: Path, *, grace_s: float = 10.0) -> list[str]:
    """End every recorded process still alive with its recorded start time; one line per process ended.

    Call it only while holding the home's run lock. Entries of dead (or recycled) pids are dropped
    silently; the file is empty afterwards.
    """
    with _locked(home) as entries:
        lines = end(entries, grace_s=grace_s)
        entries.clear()
    return lines


def end(entries: Iterable[dict[str, Any]], *, grace_s: float = 10.0,
        why: str = "left running by an earlier run") -> list[str]:
    """End the processes of ``entries`` (as :func:`record` writes them) that are still the same processes,
    with the members of their recorded process groups: SIGTERM, ``grace_s``, SIGKILL. One line per process."""
    own = {os.getpid()}
    own_group = os.getpgrp()
    targets: dict[int, tuple[psutil.Process, str]] = {}  # pid -> (process, role)
    groups: dict[int, str] = {}  # pgid -> the role of the recorded process that vouches for it
    for e in entries:
        p = _verified(e)
        if p is None or p.pid in own:
            continue
        targets[p.pid] = (p, e.get("role", "?"))
        try:
            pgid = os.getpgid(p.pid)
        except ProcessLookupError:
            continue
        if pgid == e.get("pgid") and pgid != own_group:
            groups.setdefault(pgid, e.get("role", "?"))
    for g, role in groups.items():  # members started by the recorded ones (vLLM engine cores, uvicorn)
        for m in _group(g):
            if m.pid not in own:
                targets.setdefault(m.pid, (m, role))
    if not targets:
        return []
    lines = [_describe(p, role, why) for p, role in targets.values()]
    procs = [p for p, _ in targets.values()]
    _signal(groups, procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if alive:
        _signal(groups, alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
    return lines


def entry_of(role: str, pid: int, *, group: bool = True) -> dict[str, Any] | None:
    """What :func:`record` writes for ``pid``: role, pid, start time, process group (None with
    ``group=False``: not to be ended as a group), command. None when the process is gone."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return {"role": role, "pid": pid, "create_time": p.create_time(),
                    "pgid": os.getpgid(pid) if group else None,
                    "cmd": " ".join(p.cmdline())[:500], "recorded_by": os.getpid(), "recorded_at": time.time()}
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError):
        return None


def _describe(p: psutil.Process, role: str, why: str) -> str:
    try:
        cmd = " ".join(p.cmdline())[:160]
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(p.create_time()))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmd, started = "?", "?"
    return f"ended {role} pid {p.pid} {why} (started {started}): {cmd}"


__all__ = ["FILE", "end", "entry_of", "forget", "reap", "record", "recorded"]
