"""Host facts from a constructed sysfs, and the foreign-CPU accounting from constructed CPU times: pure."""

import math
import os
from collections import namedtuple
from pathlib import Path

from orchestrator.node.accounting import CoreAccounting, busy_seconds
from orchestrator.node.cores import NodeTopology
from orchestrator.node.hostfacts import host_facts

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_host_facts_read_smt_siblings_numa_and_governor(tmp_path: Path) -> None:
    _write(tmp_path, "devices/system/cpu/smt/active", "1\n")
    for cpu, sib in {0: "0,4", 1: "1,5", 4: "0,4", 5: "1,5"}.items():
        _write(tmp_path, f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", sib)
        _write(tmp_path, f"devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "performance\n")
    _write(tmp_path, "devices/system/cpu/cpu5/cpufreq/scaling_governor", "powersave\n")
    topo = NodeTopology(cpus=tuple(range(8)), numa={0: (0, 1, 4, 5), 1: (2, 3, 6, 7)}, gpu_numa={0: 1},
                        cpu_model="Test CPU")
    f = host_facts([0, 4], [1], [0], topo, tmp_path)
    assert f["smt"] == "on" and f["replica_physical_cores"] == "1"  # 0 and 4 are siblings: one core
    assert f["replica_numa_nodes"] == "0" and f["gpu_numa_nodes"] == "1" and f["cpu_model"] == "Test CPU"
    assert f["cpu_governor"] == "performance"
    assert host_facts([1, 5], [0], [], topo, tmp_path)["cpu_governor"] == "performance,powersave"
    bare = host_facts([2], [3], [], topo, tmp_path / "missing")
    assert bare["smt"] == "unknown" and bare["cpu_governor"] == "unknown" and bare["gpu_numa_nodes"] == "none"


def _times(busy: dict[int, float], idle: float = 100.0) -> list[CpuTimes]:
    return [CpuTimes(busy.get(c, 0.0), 0, 0, idle, 0, 0, 0, 0, 0, 0) for c in range(4)]


def test_foreign_cpu_is_the_cores_busy_time_less_the_replica_tree() -> None:
    readings = iter([_times({2: 10.0, 3: 5.0}), _times({2: 13.0, 3: 6.5})])
    clock = iter([0.0, 2.0])
    acct = CoreAccounting((2, 3), pids=lambda: [os.getpid()], percpu=lambda: next(readings),
                          clock=lambda: next(clock))
    acct.start()
    # The test process's own CPU time is the "tree": make it known by measuring it around stop().
    out = acct.stop()
    assert math.isclose(out["replica_cores_busy_s"], 4.5)
    assert math.isclose(out["replica_cores_foreign_cpu_s"], max(0.0, 4.5 - out["replica_tree_cpu_s"]))
    assert math.isclose(out["replica_cores_foreign_frac"], out["replica_cores_foreign_cpu_s"] / 4.0)
    assert busy_seconds(_times({0: 1.0}), [0, 1]) == 1.0  # idle never counts as busy
