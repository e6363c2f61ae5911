"""One run per home, survivors of a dead run, services that prove they are ours, and the cli's exit on signals.

Small real processes (``sleep``, a python child) stand in for MLflow and vLLM; no Ray, no MLflow.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.infra import survivors
from orchestrator.infra.homelock import HomeBusy, holder, home_lock
from orchestrator.infra.local_servers import _handlers, _restore, listens_in_tree, tree

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(60)


def _python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def _wait_line(proc: subprocess.Popen, want: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if want in line:
            return line
    raise AssertionError(f"no {want!r} from the child; it said: {''.join(seen)[-2000:]}")


def _gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------- the lock
def test_a_second_run_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken(tmp_path: Path):
    child = _python(f"""
        import time
        from orchestrator.infra.homelock import home_lock
        with home_lock({str(tmp_path)!r}):
            print("locked", flush=True)
            time.sleep(60)
    """)
    try:
        _wait_line(child, "locked")
        with pytest.raises(HomeBusy) as busy, home_lock(tmp_path):
            pass
        assert busy.value.holder["pid"] == child.pid
        assert f"pid {child.pid}" in str(busy.value)
    finally:
        child.kill()  # SIGKILL: no finally runs, run.pid stays behind
        child.wait()
    assert holder(tmp_path)["pid"] == child.pid  # stale, but the kernel dropped the lock
    with home_lock(tmp_path) as me:
        assert me["pid"] == os.getpid() and holder(tmp_path)["pid"] == os.getpid()
    assert holder(tmp_path) is None  # released: run.pid removed, run.lock kept
    assert (tmp_path / "run.lock").exists()


def test_the_lock_is_exclusive_within_one_process_too(tmp_path: Path):
    with home_lock(tmp_path), pytest.raises(HomeBusy), home_lock(tmp_path):
        pass


# ---------------------------------------------------------------- survivors
def test_reap_ends_a_recorded_survivor_and_its_group(tmp_path: Path):
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(tree(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [p.pid for p in tree(leader.pid)]
        assert len(pids) == 2
        assert survivors.record(tmp_path, "vllm", leader.pid)["pgid"] == leader.pid
        lines = survivors.reap(tmp_path, grace_s=5)
        leader.wait(timeout=5)
        assert _gone(pids)
        assert len(lines) == 2 and all(line.startswith("ended vllm pid ") for line in lines)
        assert any(f"pid {leader.pid} " in line for line in lines)
        assert survivors.recorded(tmp_path) == []
    finally:
        if leader.poll() is None:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()


def test_reap_never_touches_a_recycled_pid(tmp_path: Path):
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        survivors.record(tmp_path, "mlflow", other.pid)
        data = json.loads((tmp_path / survivors.FILE).read_text())
        data["processes"][0]["create_time"] -= 5.0  # the recorded process started earlier: not this one
        (tmp_path / survivors.FILE).write_text(json.dumps(data))
        assert survivors.reap(tmp_path, grace_s=1) == []
        assert other.poll() is None
        assert survivors.recorded(tmp_path) == []  # the stale entry is dropped
    finally:
        other.kill()
        other.wait()


def test_forget_and_dead_entries(tmp_path: Path):
    p = subprocess.Popen(["sleep", "60"])
    survivors.record(tmp_path, "vllm", p.pid)
    survivors.record(tmp_path, "vllm", os.getpid())
    survivors.forget(tmp_path, p.pid)
    survivors.forget(tmp_path, p.pid)  # idempotent
    assert [e["pid"] for e in survivors.recorded(tmp_path)] == [os.getpid()]
    assert survivors.reap(tmp_path) == []  # never ourselves
    p.kill()
    p.wait()
    assert survivors.record(tmp_path, "vllm", p.pid) is None  # gone: nothing to record


# ---------------------------------------------------------------- services
def test_the_listener_must_be_in_our_tree(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        stranger = subprocess.Popen(["sleep", "60"])
        try:
            assert listens_in_tree(os.getpid(), port)  # this process holds it
            assert not listens_in_tree(stranger.pid, port)  # someone answering on the port is not enough
        finally:
            stranger.kill()
            stranger.wait()
    assert not listens_in_tree(os.getpid(), port)


_STARTER = """
    import subprocess, time
    from orchestrator.infra.lifeline import Lifeline
    line = Lifeline(grace_s=2)
    p = subprocess.Popen(line.wrap(["sh", "-c", "sleep 60 & wait"]), pass_fds=line.pass_fds, start_new_session=True)
    line.started()
    print("server", p.pid, flush=True)
    time.sleep(60)
"""


def _server_group(starter: subprocess.Popen) -> tuple[int, list[int]]:
    server = int(_wait_line(starter, "server").split()[1])
    deadline = time.monotonic() + 10
    while len(tree(server)) < 3 and time.monotonic() < deadline:  # sh (the server), its sleep, the watchdog
        time.sleep(0.05)
    pids = [p.pid for p in tree(server)]
    assert len(pids) == 3, [p.cmdline() for p in tree(server)]
    assert psutil.Process(server).cmdline()[:2] == ["sh", "-c"]  # exec'd in place: Popen's pid is the server
    assert {os.getpgid(p) for p in pids} == {server}
    return server, pids


def test_the_lifeline_ends_the_group_when_the_starter_is_killed():
    starter = _python(_STARTER)
    try:
        _, pids = _server_group(starter)
    finally:
        starter.kill()  # SIGKILL: the starter runs no cleanup at all
        starter.wait()
    assert _gone(pids, timeout_s=10), [psutil.Process(p).cmdline() for p in pids if psutil.pid_exists(p)]


def test_the_lifeline_ends_the_workers_when_the_server_alone_is_killed():
    # What Ray does to an exiting actor: SIGKILL to its direct children, which is the server only.
    starter = _python(_STARTER)
    try:
        server, pids = _server_group(starter)
        os.kill(server, signal.SIGKILL)
        assert _gone(pids, timeout_s=10), [psutil.Process(p).cmdline() for p in pids if psutil.pid_exists(p)]
        assert starter.poll() is None
    finally:
        starter.kill()
        starter.wait()


def test_the_lifeline_passes_the_exit_code_and_a_cut_ends_the_server():
    from orchestrator.infra.lifeline import Lifeline

    line = Lifeline()
    proc = subprocess.run(line.wrap(["sh", "-c", "exit 3"]), pass_fds=line.pass_fds, timeout=20)
    line.cut()
    assert proc.returncode == 3
    line = Lifeline(grace_s=1)
    proc = subprocess.Popen(line.wrap(["sleep", "60"]), pass_fds=line.pass_fds, start_new_session=True)
    line.started()
    time.sleep(0.5)
    line.cut()
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_the_guardian_ends_what_it_was_handed_when_its_owner_dies():
    owner = _python("""
        import subprocess, time
        from orchestrator.infra import survivors
        from orchestrator.infra.lifeline import Guardian
        g = Guardian(grace_s=1)
        kept = subprocess.Popen(["sleep", "60"])  # in the owner's group: only the process may be ended
        g.watch([survivors.entry_of("ray", kept.pid, group=False)])
        print("kept", kept.pid, g.proc.pid, flush=True)
        time.sleep(60)
    """)
    try:
        _, kept, guardian = _wait_line(owner, "kept").split()
    finally:
        owner.kill()
        owner.wait()
    assert _gone([int(kept), int(guardian)], timeout_s=10)


def test_signal_handlers_replaced_by_ray_init_are_put_back():
    def ours(signum, frame):  # pragma: no cover (never called)
        pass

    before = signal.signal(signal.SIGTERM, ours)
    try:
        saved = _handlers()
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(s))  # what ray.init does
        _restore(saved)
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)


# ---------------------------------------------------------------- the cli on signals
_FAKE_RUN = """
    import signal, sys, time, types
    import orchestrator.cli as cli

    home, sweep_module = sys.argv[1:3]

    def fake_run_sweep(spec, spec_path, home, *, console, resume=True):
        ours = [signal.getsignal(s) is cli._terminate for s in (signal.SIGINT, signal.SIGTERM)]
        try:
            print("running; handlers ours:", ours, flush=True)
            time.sleep(60)
            return 0
        finally:
            print("cleanup", flush=True)
            deadline = time.monotonic() + 20
            while len(cli._signals_seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the second signal lands here: it must not cut the cleanup short
            print("cleaned after", len(cli._signals_seen), "signals", flush=True)

    class Sweep(types.ModuleType):
        def __getattr__(self, name):
            if name != "run_sweep":
                raise AttributeError(name)
            if sweep_module == "real":  # imported where `run` imports it, after main() set the handlers:
                del sys.modules["orchestrator.sweep"]  # the real module, with Ray, MLflow, pandas (seconds)
                import orchestrator.sweep
            return fake_run_sweep

    sys.modules["orchestrator.sweep"] = Sweep("orchestrator.sweep")
    sys.argv = ["orchestrator", "run", "sweeps/smoke.yaml", "--home", home]
    cli.main()
"""


# SIGINT with the real orchestrator.sweep imported where `run` imports it (none of its imports may replace the
# handlers: both are checked); SIGTERM without it, which spares a second child those seconds of imports.
@pytest.mark.parametrize("sig, code, sweep_module", [(signal.SIGINT, 130, "real"), (signal.SIGTERM, 143, "stand-in")])
def test_cli_run_exits_128_plus_the_signal_after_its_cleanup(tmp_path: Path, sig: int, code: int, sweep_module: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_FAKE_RUN), str(tmp_path), sweep_module], cwd=ROOT,
                             env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        running = _wait_line(child, "running")
        assert "handlers ours: [True, True]" in running, running
        child.send_signal(sig)
        _wait_line(child, "cleanup")
        child.send_signal(sig)  # impatient user: ignored while the services stop
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == code, out
    assert "cleaned after 2 signals" in out and f"stopping (signal {int(sig)})" in out, out
    assert f"interrupted by {signal.Signals(sig).name}" in out
