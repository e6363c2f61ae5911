"""StackSampler around a stand-in py-spy (a script): start, SIGINT, read, name; failures become a status."""

from __future__ import annotations

import os
import signal
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.node.attribution import RoleUsage, RoleWindow
from orchestrator.node.stack_categories import parse_collapsed
from orchestrator.node.stacks import (
    StackSampler,
    coverage,
    py_spy_command,
    roles_from_labels,
    serve_cpu_metrics,
    serve_roles,
)

RAW = (
    'process 10:"/venv/bin/python -c import x\nserve = 1";thread (10): MainThread;'
    "Runner.run (asyncio/runners.py:118) 40\n"
    'process 10:"/venv/bin/python -c import x\nserve = 1";process 11:"VLLM::EngineCore";thread (11): E;'
    "EngineCore.step (vllm/v1/engine/core.py:668);"
    "MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:864) 90\n"
    'process 10:"/venv/bin/python -c import x\nserve = 1";process 11:"VLLM::EngineCore";thread (11): E;'
    "EngineCore.step (vllm/v1/engine/core.py:668);Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300) 10\n"
)


def fake_py_spy(tmp_path: Path, body: str) -> str:
    """An executable that stands in for py-spy: ``body`` runs with ``out`` (the --output path) and ``argv``."""
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""\
        import signal, sys, time
        argv = sys.argv[1:]
        out = argv[argv.index("--output") + 1]
        open(out + ".argv", "w").write(" ".join(argv))
    """) + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_command_line() -> None:
    cmd = py_spy_command("py-spy", 42, 49, "/o/raw.txt")
    assert cmd[:4] == ["py-spy", "record", "--pid", "42"] and "--nonblocking" in cmd and "--subprocesses" in cmd
    assert "--idle" not in cmd and "--threads" in cmd and cmd[cmd.index("--rate") + 1] == "49"
    native = py_spy_command("py-spy", 42, 49, "/o/raw.txt", native=True)
    assert "--native" in native and "--nonblocking" not in native  # py-spy needs a stopped process for C frames


@pytest.mark.parametrize("blocked", [False, True], ids=["plain", "sigint-blocked-as-in-a-ray-actor"])
def test_stacks_are_read_on_sigint_and_shared_out_by_the_accounting(tmp_path: Path, blocked: bool) -> None:
    exe = fake_py_spy(tmp_path, f"""
        def done(*_):
            open(out, "w").write({RAW!r})
            sys.stderr.write("py-spy> Wrote raw flamegraph data. Samples: 140 Errors: 2\\n")
            sys.exit(0)
        signal.signal(signal.SIGINT, done)
        open(out + ".ready", "w").close()
        time.sleep(60)
    """)
    s = StackSampler(10, rate_hz=50, py_spy=exe, cmdlines=lambda root: {10: "/venv/bin/python -c import x\nserve = 1"})
    # A Ray actor's threads block SIGINT and a child inherits the mask: py-spy must still see the signal.
    old = signal.pthread_sigmask(signal.SIG_BLOCK if blocked else signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        s.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    ready = Path(s._dir or "", "raw.txt.ready")
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:  # the stand-in's SIGINT handler is in place
        time.sleep(0.02)
    acc = RoleWindow(roles={"api_server": RoleUsage(user_s=0.3), "engine_core": RoleUsage(user_s=0.5)},
                     pid_roles={10: "api_server", 11: "engine_core"}, runq_available=True,
                     thread_cpu_s={(10, 10): 0.2, (11, 11): 0.5})
    w = s.stop(acc)
    assert w.status == "ok" and (w.samples, w.errors) == (140, 2) and w.basis == "thread_cpu"
    m = w.metrics(requests=5)
    assert m["stacks_cpu_s_engine_core.shm_broadcast"] == pytest.approx(0.45)
    assert m["cpu_s_per_req_engine_core.scheduling"] == pytest.approx(0.01)
    assert m["stacks_active_s_engine_core.shm_broadcast"] == pytest.approx(90 / 50)
    assert m["stacks_cpu_s_api_server.http"] == pytest.approx(0.2)
    cov = coverage(m, acc.metrics())
    assert cov == {"stacks_coverage_api_server": pytest.approx(0.2 / 0.3), "stacks_coverage_engine_core": pytest.approx(1.0)}
    files = w.files()
    assert sorted(files) == ["stacks-api_server.collapsed", "stacks-engine_core.collapsed"]
    assert sorted(s.samples for s in parse_collapsed(files["stacks-engine_core.collapsed"].decode())) == [10, 90]
    assert w.params()["stacks_status"] == "ok"


def test_without_accounting_roles_come_from_the_labels() -> None:
    stacks = parse_collapsed(RAW.replace("\nserve = 1", ""))
    assert roles_from_labels(stacks, 10) == {10: "api_server", 11: "engine_core"}


def test_py_spy_missing_is_a_status(tmp_path: Path) -> None:
    w = StackSampler(os.getpid(), py_spy=str(tmp_path / "no-such-py-spy")).start().stop()
    assert w.status.startswith("py-spy not found") and w.metrics() == {} and w.files() == {}


def test_py_spy_that_cannot_attach_is_a_status(tmp_path: Path) -> None:
    exe = fake_py_spy(tmp_path, """
        sys.stderr.write("Error: Permission Denied: Try running again with elevated permissions\\n")
        sys.exit(1)
    """)
    s = StackSampler(os.getpid(), py_spy=exe).start()
    s._proc.wait(30)  # type: ignore[union-attr]  # it has given up before the window ends
    w = s.stop()
    assert w.status.startswith("no stacks (py-spy exit 1)") and "Permission Denied" in w.status
    assert w.metrics() == {}


# A Ray Serve LLM tree as the accounting sees it: the serve host (root) as api_server, vLLM's engine core,
# the rest other.
SERVE_TITLES = {10: "python -c import sys", 11: "/site/ray/core/src/ray/gcs/gcs_server --x", 12: "ray::ServeController",
                13: "ray::ProxyActor", 14: "ray::ServeReplica:trial:OpenAiIngress.handle_request",
                15: "ray::ServeReplica:trial:LLMServer:llama-3.1-8b", 16: "VLLM::EngineCore", 17: "ray::IDLE",
                18: "ray::RayWorkerProc.run"}
SERVE_ACCOUNTED = {10: "api_server", 11: "other", 12: "other", 13: "other", 14: "other", 15: "other",
                   16: "engine_core", 17: "other", 18: "other"}
SERVE_CPU = {10: 0.1, 11: 0.2, 12: 0.3, 13: 0.8, 14: 1.2, 15: 2.0, 16: 4.0, 17: 0.0, 18: 3.0}


def test_a_serve_tree_gets_serves_roles_and_a_vllm_tree_keeps_its_own() -> None:
    roles = serve_roles(SERVE_ACCOUNTED, SERVE_TITLES)
    assert roles == {10: "serve_ray", 11: "serve_ray", 12: "serve_controller", 13: "serve_proxy", 14: "serve_ingress",
                     15: "serve_llm_server", 16: "engine_core", 17: "serve_ray", 18: "serve_vllm_worker"}
    vllm = {10: "api_server", 11: "engine_core", 12: "other"}
    assert serve_roles(vllm, {10: "vllm serve /m", 11: "VLLM::EngineCore", 12: "python -m watchdog"}) == vllm
    m = serve_cpu_metrics(roles, SERVE_CPU, requests=4)
    assert m["cpu_s_serve_proxy"] == pytest.approx(0.8) and m["cpu_s_per_req_serve_ingress"] == pytest.approx(0.3)
    assert m["cpu_s_serve_ray"] == pytest.approx(0.3) and m["serve_ray_processes"] == 3
    assert m["cpu_s_serve_llm_server"] == pytest.approx(2.0)
    assert m["cpu_s_per_req_serve_controller"] == pytest.approx(0.075)
    assert m["cpu_s_serve_vllm_worker"] == pytest.approx(3.0) and m["serve_vllm_worker_processes"] == 1
    assert "cpu_s_engine_core" not in m  # the accounting's own figure stands
    assert serve_cpu_metrics(vllm, {10: 1.0}, 4) == {}


def test_a_serve_trees_roles_get_their_cpu_even_without_py_spy(tmp_path: Path) -> None:
    """py-spy missing (or not allowed): no stacks, but the window still splits Serve's CPU time by role."""
    s = StackSampler(os.getpid(), py_spy=str(tmp_path / "no-such-py-spy"), cmdlines=lambda root: SERVE_TITLES).start()
    acc = RoleWindow(roles={}, pid_roles=SERVE_ACCOUNTED, runq_available=True, process_cpu_s=SERVE_CPU)
    w = s.stop(acc)
    assert w.status.startswith("py-spy not found") and w.files() == {}
    m = w.metrics(requests=2)
    assert m["cpu_s_per_req_serve_controller"] == pytest.approx(0.15) and m["cpu_s_serve_llm_server"] == 2.0
    assert not any(k.startswith("stacks_") for k in m)


def test_serve_stacks_are_categorised_under_serves_roles(tmp_path: Path) -> None:
    raw = ('process 10:"python -c import sys";process 13:"ray::ProxyActor";thread (13): M;'
           "Runner.run (asyncio/runners.py:118) 30\n"
           'process 10:"python -c import sys";process 15:"ray::ServeReplica:trial:LLMServer:llama-3.1-8b";'
           "thread (15): M;Runner.run (asyncio/runners.py:118) 10\n")
    exe = fake_py_spy(tmp_path, f"""
        def done(*_):
            open(out, "w").write({raw!r})
            sys.exit(0)
        signal.signal(signal.SIGINT, done)
        open(out + ".ready", "w").close()
        time.sleep(60)
    """)
    s = StackSampler(10, rate_hz=50, py_spy=exe, cmdlines=lambda root: SERVE_TITLES).start()
    ready = Path(s._dir or "", "raw.txt.ready")
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    acc = RoleWindow(roles={}, pid_roles=SERVE_ACCOUNTED, runq_available=True, process_cpu_s=SERVE_CPU)
    m = s.stop(acc).metrics(requests=2)
    assert m["stacks_cpu_s_serve_proxy"] == pytest.approx(0.8)
    assert m["stacks_cpu_s_serve_llm_server"] == pytest.approx(2.0)
    assert m["cpu_s_serve_proxy"] == pytest.approx(0.8)
    assert coverage(m, m)["stacks_coverage_serve_proxy"] == pytest.approx(1.0)
