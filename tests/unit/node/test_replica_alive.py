"""A server whose main thread has exited is not alive, although ``Popen.poll()`` still says it runs.

The state a SIGKILL leaves a multi-threaded server in until its last thread has exited: the main thread
is a zombie at once, ``waitpid`` reports the process only later. Made here deterministically: a child
whose main thread calls ``pthread_exit`` while another thread sleeps (no kill, no timing).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.node.replica import VllmReplica
from orchestrator.node.restrict import pid_alive
from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec

LEADER_EXITS = ("import ctypes, sys, threading, time\n"
                "threading.Thread(target=sys.stdin.read).start()\n"  # lives until the test closes stdin
                "ctypes.CDLL(None).pthread_exit(None)\n")


def _trial():
    return expand(parse_spec({
        "name": "alive", "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 1, "turns": 1}], "grid": {"cores": [1]},
    })).trials[0]


def test_a_server_whose_main_thread_exited_is_not_alive(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", LEADER_EXITS], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # the main thread's exit, not a timing
            assert time.monotonic() < deadline, "the child's main thread never exited"
            time.sleep(0.01)
        assert child.poll() is None  # the race: waitpid does not report it while a thread lives
        replica = VllmReplica(_trial(), "/m", frozenset({0}), 8000, tmp_path / "w", scratch_dir=tmp_path / "s")
        replica.proc = child
        assert not pid_alive(child.pid)
        assert not replica.alive()
    finally:
        child.stdin.close()  # the last thread ends; the process is reaped
        child.wait(timeout=30)


def test_a_running_server_is_alive(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        replica = VllmReplica(_trial(), "/m", frozenset({0}), 8000, tmp_path / "w", scratch_dir=tmp_path / "s")
        replica.proc = child
        assert replica.alive() and pid_alive(child.pid)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert not replica.alive()
