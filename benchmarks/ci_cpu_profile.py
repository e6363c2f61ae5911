"""Where a command's CPU time goes, by kind of process: run it, sample /proc once a second, print a table.

For the test suite (``make test`` on the 2-core CI shape is CPU-bound: the lanes' time is the CPU the
processes they start burn), this says which kind of process to cut: vLLM's API server, its engine core
or worker, the spawn helpers, Ray's raylet/GCS/actors, MLflow's server, the pytest processes, the
``orchestrator run`` drivers. Each process is put under the lane whose temp folder is in its
environment (``tests/lanes.py`` gives each lane its own ``TMPDIR``), else "-".

Only processes that live at least one sample are seen, and a process's last partial second is lost when
it exits between samples: the table's total is a lower bound; it prints the machine's own total
(``/proc/stat``) beside it.

Usage: ``python benchmarks/ci_cpu_profile.py [--every 1.0] [--out cpu.csv] -- make test``
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def kind(comm: str, cmd: str) -> str:
    """The kind of a process from its name and command line (pure)."""
    if comm.startswith("VLLM::") or comm.startswith("VLLM"):
        return "vllm " + comm.split("::")[-1].lower()
    if "vllm.entrypoints" in cmd or "from vllm.entrypoints.cli.main import main" in cmd:
        return "vllm api server"
    if "multiprocessing.resource_tracker" in cmd or "multiprocessing.spawn" in cmd or " -S -c" in cmd \
            or " -B -c" in cmd:
        return "python spawn/tracker"
    if "mlflow" in cmd or "uvicorn" in cmd or "gunicorn" in cmd or "huey" in cmd:
        return "mlflow server"
    if comm in ("raylet", "gcs_server") or "raylet" in cmd.split(" ")[0]:
        return "ray " + comm
    if comm.startswith("ray::"):
        return "ray worker " + ("idle" if "IDLE" in comm else "actor/task")
    if "ray/dashboard" in cmd or "dashboard.py" in cmd or "dashboard/agent" in cmd:
        return "ray dashboard"
    if "ray/_private" in cmd or "log_monitor" in cmd or "monitor.py" in cmd or "runtime_env" in cmd:
        return "ray helpers"
    if "default_worker.py" in cmd:
        return "ray worker starting"
    if "pytest" in cmd:
        return "pytest"
    if "orchestrator.cli" in cmd or "/orchestrator " in cmd or cmd.endswith("/orchestrator"):
        return "orchestrator cli"
    if "chrom" in comm:
        return "browser"
    return "other: " + comm


def lane_of(environ: bytes) -> str:
    for item in environ.split(b"\0"):
        if item.startswith(b"TMPDIR="):
            path = item[7:].decode(errors="replace")
            for part in Path(path).parts:
                if part.startswith("lane-"):
                    return part[5:]
    return "-"


def machine_busy_s() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / TICK


def sample(seen: dict[int, tuple[str, str, float]]) -> dict[int, tuple[str, str, float]]:
    """pid -> (kind, lane, cpu seconds so far) for every process now alive."""
    now = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
            fields = stat[stat.rindex(b")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK
            with open(f"/proc/{pid}/cmdline", "rb") as f:  # read again: vLLM retitles its processes
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if pid in seen:
                lane = seen[pid][1]
            else:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        lane = lane_of(f.read())
                except OSError:
                    lane = "-"
            k = kind(comm, cmd)
            now[pid] = (k, lane, cpu)
        except (OSError, ValueError, IndexError):
            continue
    return now


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command after --")
    before = sample({})  # what already ran is not the command's
    base = {pid: cpu for pid, (_, _, cpu) in before.items()}
    busy0, t0 = machine_busy_s(), time.monotonic()
    proc = subprocess.Popen(cmd)
    seen: dict[int, tuple[str, str, float]] = {}
    used: dict[tuple[str, str], float] = defaultdict(float)
    counted: dict[int, float] = {}
    while True:
        done = proc.poll() is not None
        now = sample(seen)
        for pid, (k, lane, cpu) in now.items():
            if pid in base and pid not in seen:
                counted[pid] = base[pid]
            delta = cpu - counted.get(pid, 0.0)
            if delta > 0:
                used[(k, lane)] += delta
                counted[pid] = cpu
        seen = {**seen, **now}
        if done:
            break
        time.sleep(a.every)
    wall = time.monotonic() - t0
    busy = machine_busy_s() - busy0
    rows = sorted(used.items(), key=lambda kv: -kv[1])
    total = sum(used.values())
    print(f"\n{'kind':<28} {'lane':<10} {'CPU s':>9} {'share':>6}")
    for (k, lane), s in rows:
        if s >= 1:
            print(f"{k:<28} {lane:<10} {s:9.0f} {s / total:6.1%}")
    print(f"seen {total:.0f} CPU-s of the machine's {busy:.0f} busy CPU-s in {wall:.0f} s wall "
          f"({os.cpu_count()} cores); exit {proc.returncode}")
    if a.out:
        with a.out.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kind", "lane", "cpu_s"])
            for (k, lane), s in rows:
                w.writerow([k, lane, round(s, 2)])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
